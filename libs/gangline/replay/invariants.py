"""What must hold of a recorded log whatever crashed meanwhile: nothing lost, nothing granted twice (pure).

`check_log` reads the records of ``jobs.requests``, ``jobs.events`` and ``allocations.log`` (as
`gangline.replay.kafka.KafkaSource` reads them from the beginning, read_committed) and counts:

* **offered**: jobs requested; **admitted**, **rejected**, **granted** (jobs with a grant),
  **completed**, **failed**; **waiting**: jobs whose last word is a ``job.pending`` (it names its
  reasons);
* **lost**: a requested job never answered (neither admitted nor rejected);
* **duplicated_grants**: an allocation granted twice, a job granted while another of its
  allocations still holds GPUs, or a job granted after it completed or failed;
* **gpus_double_held**: a grant of a GPU another live allocation holds (whole GPUs alone; MIG slices
  by GPU instance; shared slots up to 1,000 milli per GPU);
* **partial_gangs**: a grant whose ranks are not 0..W-1 for the W workers the job asked for (an
  elastic job: between its ``min_workers`` and its ``max_workers``, each bound W when not given);
* **stuck**: an admitted job that is neither finished (completed, failed) nor waiting with a reason
  (a job that ended stays ended: what is written about it later is counted in **after_final**);
* **recovery** per kill (`Kill`): how long the killed service took to be processing again (measured
  by whoever killed it) and to write its first output after the kill; and per node fault (`Fault`):
  how long until the allocations on that node were released, and their jobs granted again.

The violations (`Summary.violations`) must all be 0; the rest are counts and times.

Causal order: each partition in offset order, partitions merged by record timestamp, and on equal
timestamps a release before a grant (a release is always written before the grant it made
possible). The lifecycle of one job is on one partition of ``jobs.events`` (the job id is the key),
so its order is exact.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gangline.events.topics import ALLOCATIONS_LOG, JOBS_EVENTS, JOBS_REQUESTS
from gangline.replay.log import LogRecord

FINAL = frozenset({"job.completed", "job.failed"})
"""Lifecycle events after which a job never runs again."""
VIOLATIONS = ("lost", "duplicated_grants", "gpus_double_held", "partial_gangs", "stuck")
"""The figures that must be 0."""
WHOLE_GPU_MILLI = 1000


@dataclass(frozen=True, slots=True)
class Kill:
    """A service killed (``service``: its envelope source, e.g. ``gangline/placement``; or ``broker``)."""

    name: str
    """What was killed, as the summary names it (``placement``, ``broker``)."""
    at_ms: int
    sources: tuple[str, ...] = ()
    """The envelope sources of what it writes (none for the broker: any service's output counts)."""
    ready_ms: int | None = None
    """When the restarted process was processing again, as the one who restarted it saw it."""


@dataclass(frozen=True, slots=True)
class Fault:
    """A node made to fail: ``kind`` is ``silent`` (no more heartbeats) or ``xid`` (a GPU error)."""

    node: str
    kind: str
    at_ms: int
    gpu: str | None = None
    """The GPU that failed (an XID): only the allocations holding it are affected."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One violation: which invariant, where in the log, and what."""

    invariant: str
    where: str
    message: str


@dataclass(slots=True)
class Summary:
    """The figures of one log (see module docstring)."""

    offered: int = 0
    admitted: int = 0
    rejected: int = 0
    granted: int = 0
    grants: int = 0
    released: int = 0
    completed: int = 0
    failed: int = 0
    requeued: int = 0
    waiting: int = 0
    after_final: int = 0
    """Lifecycle events written about a job after it completed or failed: a preemption decided before its
    decider read the end (``job.preempting``; ``job.preempted`` and ``job.requeued`` of a victim whose
    checkpoint was read in a batch before its completion)."""
    released_again: int = 0
    """Releases of an allocation already released: two writers racing one end (placement's for the
    victim's completion, preemption's for its checkpoint; node_health's for a failure)."""
    problems: list[Problem] = field(default_factory=list)
    recovery: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)

    def count(self, invariant: str) -> int:
        return sum(1 for p in self.problems if p.invariant == invariant)

    @property
    def violations(self) -> dict[str, int]:
        return {name: self.count(name) for name in VIOLATIONS}

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self, max_problems: int = 20) -> dict[str, Any]:
        return {
            "offered": self.offered,
            "admitted": self.admitted,
            "rejected": self.rejected,
            "granted": self.granted,
            "grants": self.grants,
            "released": self.released,
            "completed": self.completed,
            "failed": self.failed,
            "requeued": self.requeued,
            "waiting": self.waiting,
            "after_final": self.after_final,
            "released_again": self.released_again,
            **self.violations,
            "ok": self.ok,
            "recovery": self.recovery,
            "faults": self.faults,
            "problems": [f"{p.invariant}: {p.where}: {p.message}" for p in self.problems[:max_problems]],
        }


def kind_of(record: LogRecord) -> str:
    """``gangline.job.admitted.v1`` → ``job.admitted`` ('' when not a Gangline type)."""
    parts = record.type.split(".")
    return ".".join(parts[1:-1]) if len(parts) > 2 and parts[0] == "gangline" else ""


def data_of(record: LogRecord) -> Mapping[str, Any]:
    data = record.envelope.get("data")
    return data if isinstance(data, dict) else {}


def causal_order(records: Iterable[LogRecord]) -> Iterator[LogRecord]:
    """Each partition in offset order, partitions merged by timestamp, releases first on a tie."""
    partitions: dict[tuple[str, int], list[LogRecord]] = {}
    for r in records:
        partitions.setdefault((r.topic, r.partition), []).append(r)
    for rs in partitions.values():
        rs.sort(key=lambda r: r.offset)

    def key(r: LogRecord) -> tuple[int, int]:
        return (r.timestamp_ms or 0, 0 if kind_of(r) == "allocation.released" else 1)

    return heapq.merge(*partitions.values(), key=key)


@dataclass(slots=True)
class _Holding:
    allocation_id: str
    job_id: str
    held: list[tuple[tuple[str, str], str, int]]
    """((node, gpu), how: whole | mig:<instance> | milli, milli)."""


class _Checker:
    def __init__(self, prefix: str) -> None:
        self.requests = f"{prefix}{JOBS_REQUESTS}"
        self.events = f"{prefix}{JOBS_EVENTS}"
        self.allocations = f"{prefix}{ALLOCATIONS_LOG}"
        self.summary = Summary()
        self.offered: dict[str, Mapping[str, Any]] = {}
        self.answered: set[str] = set()
        self.state: dict[str, str] = {}
        self.live: dict[str, _Holding] = {}
        self.ever_granted: set[str] = set()
        self.released_ever: set[str] = set()
        self.gpus: dict[tuple[str, str], dict[str, tuple[str, int]]] = {}
        """(node, gpu) → allocation → (how, milli)."""
        self.grants_at: dict[str, list[int]] = {}
        self.releases_at: dict[str, int] = {}

    def problem(self, invariant: str, record: LogRecord | None, message: str) -> None:
        where = record.where if record is not None else "end of log"
        self.summary.problems.append(Problem(invariant, where, message))

    # -- one record ------------------------------------------------------------------------

    def feed(self, r: LogRecord) -> None:
        kind = kind_of(r)
        data = data_of(r)
        job = data.get("job_id")
        if not isinstance(job, str):
            return
        if r.topic == self.requests and kind == "job.requested":
            self.offered.setdefault(job, data)
        elif r.topic == self.events:
            self.lifecycle(r, kind, job)
        elif r.topic == self.allocations and kind == "allocation.granted":
            self.grant(r, job, data)
        elif r.topic == self.allocations and kind == "allocation.released":
            self.release(r, data)

    def lifecycle(self, r: LogRecord, kind: str, job: str) -> None:
        known = self.state.get(job)
        if kind == "job.rejected" and known not in (None, "job.rejected"):
            return  # another request for a known job refused (duplicate_job): the job goes on
        if known in FINAL:
            # A job that ended stays ended: a preemption racing its completion may still write
            # job.preempted and job.requeued for it (counted; a grant after its end is a violation).
            self.summary.after_final += 1
            return
        if kind in ("job.admitted", "job.rejected"):
            self.answered.add(job)
        self.state[job] = kind
        if kind == "job.requeued":
            self.summary.requeued += 1

    def grant(self, r: LogRecord, job: str, data: Mapping[str, Any]) -> None:
        alloc = str(data.get("allocation_id"))
        self.summary.grants += 1
        self.ever_granted.add(job)
        self.grants_at.setdefault(job, []).append(r.timestamp_ms or 0)
        if alloc in self.live or alloc in self.released_ever:
            self.problem("duplicated_grants", r, f"allocation {alloc} of {job} granted again")
            return
        if self.state.get(job) in FINAL:
            self.problem("duplicated_grants", r, f"{job} granted {alloc} after it {self.state[job][4:]}")
        others = [h.allocation_id for h in self.live.values() if h.job_id == job]
        if others:
            self.problem("duplicated_grants", r, f"{job} granted {alloc} while it holds {others}")
        placements = data.get("placements")
        placements = placements if isinstance(placements, list) else []
        self.gang(r, job, alloc, placements)
        held: list[tuple[tuple[str, str], str, int]] = []
        for p in placements:
            if not isinstance(p, dict):
                continue
            node = str(p.get("node"))
            mig = p.get("mig")
            milli = p.get("gpu_fraction_milli")
            for gpu in p.get("gpus") or ():
                if isinstance(mig, dict):
                    how, share = f"mig:{mig.get('instance_id')}", 0
                elif isinstance(milli, int):
                    how, share = "milli", milli
                else:
                    how, share = "whole", WHOLE_GPU_MILLI
                held.append(((node, str(gpu)), how, share))
        for where, how, share in held:
            holders = self.gpus.setdefault(where, {})
            clash = [
                a
                for a, (other_how, _) in holders.items()
                if a != alloc and (how == "whole" or other_how == "whole" or (how == other_how != "milli"))
            ]
            shared = share + sum(m for a, (h, m) in holders.items() if h == "milli" and a != alloc)
            if clash or (how == "milli" and shared > WHOLE_GPU_MILLI):
                self.problem(
                    "gpus_double_held",
                    r,
                    f"GPU {where[0]}/{where[1]} granted to {alloc} while {sorted(holders)} hold it",
                )
            holders[alloc] = (how, share)
        self.live[alloc] = _Holding(alloc, job, held)

    def gang(self, r: LogRecord, job: str, alloc: str, placements: Sequence[Any]) -> None:
        ranks: list[int] = sorted(
            p["rank"] for p in placements if isinstance(p, dict) and isinstance(p.get("rank"), int)
        )
        asked = self.offered.get(job, {})
        workers = asked.get("max_workers") or asked.get("workers")
        least = asked.get("min_workers") or asked.get("workers")
        if ranks != list(range(len(placements))):
            self.problem("partial_gangs", r, f"{alloc} of {job} has ranks {ranks}")
        elif isinstance(workers, int) and isinstance(least, int) and not least <= len(ranks) <= workers:
            self.problem("partial_gangs", r, f"{alloc} of {job} places {len(ranks)} of {workers} workers")

    def release(self, r: LogRecord, data: Mapping[str, Any]) -> None:
        alloc = str(data.get("allocation_id"))
        holding = self.live.pop(alloc, None)
        if holding is None:
            if alloc in self.released_ever:
                self.summary.released_again += 1
            return  # released again (two writers raced: see released_again), or never granted
        self.summary.released += 1
        self.released_ever.add(alloc)
        self.releases_at[alloc] = r.timestamp_ms or 0
        for where, _, _ in holding.held:
            holders = self.gpus.get(where, {})
            holders.pop(alloc, None)
            if not holders:
                self.gpus.pop(where, None)

    # -- the end ---------------------------------------------------------------------------

    def finish(self) -> None:
        s = self.summary
        s.offered = len(self.offered)
        states = self.state
        s.admitted = sum(1 for j in self.offered if j in self.answered and states.get(j) != "job.rejected")
        s.rejected = sum(1 for j in self.offered if states.get(j) == "job.rejected")
        s.granted = len(self.ever_granted)
        s.completed = sum(1 for state in states.values() if state == "job.completed")
        s.failed = sum(1 for state in states.values() if state == "job.failed")
        s.waiting = sum(1 for state in states.values() if state == "job.pending")
        for job in sorted(self.offered):
            if job not in self.answered:
                self.problem("lost", None, f"{job} was requested and never admitted nor rejected")
            elif states.get(job) not in (*FINAL, "job.rejected", "job.pending"):
                holding = [h.allocation_id for h in self.live.values() if h.job_id == job]
                held = f", holding {holding}" if holding else ""
                self.problem("stuck", None, f"{job} last {states.get(job)}{held}: not finished, no reason")


def check_log(
    records: Iterable[LogRecord],
    *,
    prefix: str = "",
    kills: Sequence[Kill] = (),
    faults: Sequence[Fault] = (),
) -> Summary:
    """The figures and violations of the log (see module docstring); ``prefix``: the topics' prefix."""
    checker = _Checker(prefix)
    ordered = list(causal_order(records))
    for record in ordered:
        checker.feed(record)
    checker.finish()
    summary = checker.summary
    summary.recovery = [_recovery(kill, ordered) for kill in kills]
    summary.faults = [_fault(fault, ordered, checker) for fault in faults]
    return summary


def _seconds(later: int | None, earlier: int) -> float | None:
    return None if later is None else round((later - earlier) / 1000, 3)


def _recovery(kill: Kill, ordered: Sequence[LogRecord]) -> dict[str, Any]:
    """Seconds from the kill to processing again, and to the first output of what was killed."""

    def counts(r: LogRecord) -> bool:
        source = r.envelope.get("source")
        if not isinstance(source, str) or (r.timestamp_ms or 0) <= kill.at_ms:
            return False
        if kill.sources:
            return source in kill.sources
        return source.startswith("gangline/") and not source.startswith("gangline/agent")

    first = next((r.timestamp_ms for r in ordered if counts(r)), None)
    return {
        "killed": kill.name,
        "at_ms": kill.at_ms,
        "ready_s": _seconds(kill.ready_ms, kill.at_ms),
        "first_output_s": _seconds(first, kill.at_ms),
    }


def _fault(fault: Fault, ordered: Sequence[LogRecord], checker: _Checker) -> dict[str, Any]:
    """The allocations on the node (its GPU) when it failed; how long until released, and granted again."""
    live: dict[str, str] = {}
    for r in ordered:
        if (r.timestamp_ms or 0) > fault.at_ms:
            break
        data = data_of(r)
        kind = kind_of(r)
        if r.topic != checker.allocations:
            continue
        held = {
            (p.get("node"), gpu)
            for p in data.get("placements") or ()
            if isinstance(p, dict)
            for gpu in p.get("gpus") or ()
        }
        hit = any(n == fault.node and (fault.gpu is None or g == fault.gpu) for n, g in held)
        if kind == "allocation.granted" and hit:
            live[str(data.get("allocation_id"))] = str(data.get("job_id"))
        elif kind == "allocation.released":
            live.pop(str(data.get("allocation_id")), None)
    released = [checker.releases_at.get(a) for a in live]
    regranted = [
        next((t for t in checker.grants_at.get(j, ()) if t > fault.at_ms), None) for j in live.values()
    ]
    done_released = [t for t in released if t is not None]
    done_regranted = [t for t in regranted if t is not None]
    return {
        "node": fault.node,
        **({"gpu": fault.gpu} if fault.gpu is not None else {}),
        "kind": fault.kind,
        "at_ms": fault.at_ms,
        "allocations": len(live),
        "released": len(done_released),
        "released_after_s": _seconds(max(done_released), fault.at_ms) if done_released else None,
        "granted_again": len(done_regranted),
        "granted_again_after_s": _seconds(max(done_regranted), fault.at_ms) if done_regranted else None,
    }
