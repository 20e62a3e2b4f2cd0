"""What the demo shows while it runs: a compact table a person can read at a glance (pure: no I/O, no clock).

:class:`DemoView` reads the envelopes the demo consumes (jobs.events, allocations.log, nodes.inventory,
nodes.health, nodes.operator, queues.status) and :func:`render` draws, from it:

- per queue: jobs waiting (admitted, not holding GPUs) and running (holding a live grant, or asked to give
  it back), read off the project's lifecycle fold (:func:`gangline.fold.figures.jobs_by_state`); jobs of
  the demo that ended since it started (done); GPUs its live grants hold; and, from quota's
  ``queue.status``, what quota charges it against its nominal quota and its fair-share position;
- GPUs by state per model (free / allocated / cordoned / degraded:
  :func:`gangline.fold.figures.gpus_by_state`);
- the last few events since the demo started (time, type, subject, one line of detail);
- the demo's counters (what it sent, what was admitted, granted, preempted, ...) in one row.

Events written before the demo started are folded (the cluster as it is) but neither counted nor listed.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from gangline.client.operator import CLEAR, gpus_of
from gangline.client.tables import table
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import (
    JobAdmitted,
    JobFailed,
    JobPreempting,
    JobQueued,
    JobRejected,
    JobRequested,
    JobRequeued,
)
from gangline.events.nodes import GpuHealthChanged, NodeCordoned, NodeFailed, NodeRegistered, NodeUncordoned
from gangline.events.queues import QueueStatus
from gangline.fold.cluster import ClusterFold
from gangline.fold.figures import GPU_STATES, gpus_by_state, jobs_by_state

FINAL = frozenset({"job.completed", "job.rejected", "job.failed"})
COUNTERS = (
    "requested",
    "job.admitted",
    "job.rejected",
    "allocation.granted",
    "job.preempting",
    "job.requeued",
    "allocation.released",
    "job.completed",
)
"""The demo's counters, in the order its row shows them (each named by its last word)."""
QUIET = frozenset({"job.pending", "node.heartbeat", "queue.status", "gpu.error_reported", "worker.exited"})
"""Types not listed among the last events: too frequent to read, or shown elsewhere in the table."""
LAST_EVENTS = 6
REDRAW_S = 2.0
"""How often the view is redrawn in place on a terminal."""
PLAIN_EVERY_S = 10.0
"""How often the plain table is printed when stdout is not a terminal (CI, logs)."""


def short_type(envelope_type: str) -> str:
    """``gangline.job.admitted.v1`` → ``job.admitted``."""
    parts = envelope_type.split(".")
    return ".".join(parts[1:3]) if len(parts) >= 4 else envelope_type


def detail(envelope: Envelope) -> str:
    """One line about what an event says, beyond its type and subject."""
    data = envelope.data
    if isinstance(data, JobRequested):
        return f"{gpus_of(data.model_dump())} queue {data.queue} priority {data.priority}"
    if isinstance(data, JobAdmitted):
        return f"queue {data.spec.queue}"
    if isinstance(data, JobQueued):
        return f"queue {data.queue}" + (f" on {data.gpu_type}" if data.gpu_type else "")
    if isinstance(data, JobRejected | JobFailed):
        return f"{data.code}: {data.reason}"
    if isinstance(data, AllocationGranted):
        nodes = sorted({p.node for p in data.placements})
        gpus = sum(len(p.gpus) for p in data.placements)
        return f"{gpus} GPUs on {','.join(nodes)}"
    if isinstance(data, AllocationReleased):
        return str(data.reason)
    if isinstance(data, JobPreempting):
        return f"for {data.preemptor_job_id}" if data.preemptor_job_id else data.reason
    if isinstance(data, JobRequeued):
        return f"attempt {data.attempt} ({data.reason})"
    if isinstance(data, NodeFailed):
        return f"{data.code}: {data.reason}"
    if isinstance(data, GpuHealthChanged):
        return f"GPU {data.gpu} {data.previous} -> {data.state} ({data.cause.kind})"
    if isinstance(data, NodeCordoned):
        return data.mode + (f": {data.reason}" if data.reason else "")
    if isinstance(data, NodeUncordoned):
        return data.reason or ""
    if isinstance(data, NodeRegistered):
        return f"{len(data.gpus)} GPUs"
    return ""


@dataclass
class DemoView:
    """What the demo has read so far (module docstring). ``sent``: the demo's job ids and their queues;
    ``fold``: the lifecycle fold, told the unlimited queues as placement is (their jobs wait for no quota)."""

    started: datetime
    sent: dict[str, str]
    fold: ClusterFold = field(default_factory=ClusterFold)
    queues: dict[str, QueueStatus] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    finished: set[str] = field(default_factory=set)
    last: deque[tuple[datetime, str, str, str]] = field(default_factory=lambda: deque(maxlen=LAST_EVENTS))

    def requested(self, envelope: Envelope) -> None:
        """The demo published a job."""
        self.counts["requested"] += 1
        self._note(envelope)

    def read(self, envelope: Envelope) -> None:
        """One event the demo consumed."""
        if isinstance(envelope.data, QueueStatus):
            known = self.queues.get(envelope.data.queue)
            if known is None or known.as_of <= envelope.data.as_of:
                self.queues[envelope.data.queue] = envelope.data
            return
        self.fold.fold(envelope)
        if envelope.time < self.started:
            return
        kind = short_type(envelope.type)
        if envelope.subject in self.sent:
            self.counts[kind] += 1
            if kind in FINAL:
                self.finished.add(envelope.subject)
        if kind not in QUIET:
            self._note(envelope)

    def _note(self, envelope: Envelope) -> None:
        self.last.append((envelope.time, short_type(envelope.type), envelope.subject, detail(envelope)))

    @property
    def all_finished(self) -> bool:
        return self.finished >= set(self.sent)

    def done_by_queue(self) -> Counter[str]:
        return Counter(self.sent[j] for j in self.finished)

    def gpus_held_by_queue(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for record in self.fold.jobs.values():
            live = record.live()
            if live is not None:
                out[live.queue] += len({(p.node, g) for p in live.placements for g in p.gpus})
        return out


def counters_row(view: DemoView, elapsed_s: float) -> str:
    """Today's progress line: ``[ 76.8s] requested=124 admitted=124 ... finished 97/124``."""
    shown = " ".join(f"{k.split('.')[-1]}={view.counts[k]}" for k in COUNTERS)
    return f"[{elapsed_s:6.1f}s] {shown}  finished {len(view.finished)}/{len(view.sent)}"


def _quota(status: QueueStatus | None) -> tuple[str | None, str | None]:
    if status is None:
        return None, None
    charged = sum(r.used for r in status.resources.values())
    nominal = sum(r.nominal for r in status.resources.values())
    return f"{charged}/{nominal}", f"{status.position}/{status.of}"


def queue_table(view: DemoView) -> str:
    states = jobs_by_state(view.fold)
    done = view.done_by_queue()
    held = view.gpus_held_by_queue()
    names: Iterable[str] = sorted(
        {q for q, _ in states} | set(view.queues) | set(view.sent.values()) | set(held)
    )
    rows = []
    for q in names:
        charged, position = _quota(view.queues.get(q))
        if charged is None and q in view.fold.unlimited_queues:
            charged = "unlimited"  # outside quota's tree: quota reports no figures for it
        rows.append(
            [
                q,
                states[(q, "waiting")] + states[(q, "pending")],
                states[(q, "running")] + states[(q, "preempting")],
                done[q],
                held[q],
                charged,
                position,
            ]
        )
    return table(["QUEUE", "WAITING", "RUNNING", "DONE", "GPUS USED", "QUOTA USED/NOMINAL", "FAIR"], rows)


def gpu_table(view: DemoView) -> str:
    by_state = gpus_by_state(view.fold)
    models = sorted({m for m, _ in by_state})
    rows: list[list[object]] = [
        [m, *(by_state[(m, s)] for s in GPU_STATES), sum(by_state[(m, s)] for s in GPU_STATES)]
        for m in models
    ]
    if len(models) > 1:
        rows.append(
            ["all", *(sum(by_state[(m, s)] for m in models) for s in GPU_STATES), sum(by_state.values())]
        )
    return table(["GPU MODEL", *(s.upper() for s in GPU_STATES), "TOTAL"], rows)


def events_table(view: DemoView, *, width: int = 60) -> str:
    rows = []
    for at, kind, subject, said in view.last:
        shown = said if len(said) <= width else said[: width - 3] + "..."
        rows.append([at.strftime("%H:%M:%S"), kind, subject, shown or None])
    return table(["TIME", "EVENT", "SUBJECT", "DETAIL"], rows)


def render(view: DemoView, elapsed_s: float, *, links: str = "") -> str:
    """The whole view: queues, GPUs by state, the last events and the counters (module docstring);
    ``links`` (where to look: the API, the metrics) under the title, so a redraw keeps them on screen."""
    title = f"gangline demo  {elapsed_s:.0f}s  jobs finished {len(view.finished)}/{len(view.sent)}"
    return "\n\n".join(
        [
            title + (f"\n{links}" if links else ""),
            queue_table(view),
            gpu_table(view),
            events_table(view) if view.last else "no events yet",
            counters_row(view, elapsed_s),
        ]
    )


def every_s(*, tty: bool) -> float:
    """Seconds between two views: redrawn in place on a terminal, a plain table less often in a log."""
    return REDRAW_S if tty else PLAIN_EVERY_S


def frame(text: str, *, tty: bool) -> str:
    """A view as printed: on a terminal it clears the screen and draws from the top (as ``gangline top``);
    in a log it is the plain table, followed by a blank line."""
    return CLEAR + text if tty else text + "\n"
