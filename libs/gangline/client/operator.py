"""The operators' commands, as Slurm's tools are to a Slurm cluster, each with ``-o table|wide|json``:

- ``gangline jobs [--queue Q] [--state S] [--all]`` (``squeue``): id, queue, state, GPUs, nodes, age,
  reason, of the jobs not over yet (``--all``: finished ones too);
- ``gangline history [--since T] [--queue Q]`` (``sacct``): jobs from the ledger, runs, elapsed, GPU-hours;
- ``gangline share`` (``sshare`` / ``sprio``): per queue nominal, used, quota's decayed fair share and
  the queue's fair-share position (the figures the quota service orders waiting work by);
- ``gangline cordon|uncordon|drain NODE [--reason R] [--grace S]`` (``scontrol update node``):
  an operator event on nodes.operator (admin tokens only);
- ``gangline top [--once] [-n N]``: the cluster map (nodes by spine and leaf, a cell per GPU) and the
  queues, redrawn every ``--interval`` seconds (``-n``: N views, then exit).

``table`` is the narrow view, ``wide`` adds columns, ``json`` prints what the API returned. Times shown
are the API's (UTC); ages are counted from the caller's clock.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from gangline.client.api_client import ApiClient
from gangline.client.tables import table
from gangline.events.jobs import JOB_STATES

FORMATS = ("table", "wide", "json")
MOST_ROWS = 10_000
"""How many rows ``jobs`` and ``history`` fetch at most (pages of 500)."""


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its header, its cell from an item, and whether only ``-o wide`` shows it."""

    header: str
    cell: Callable[[Mapping[str, Any]], object]
    wide: bool = False


def render(items: Sequence[Mapping[str, Any]], columns: Sequence[Column], output: str) -> str:
    """``items`` as the chosen output: a table (wide: every column) or the JSON the API gave."""
    if output == "json":
        return json.dumps({"items": list(items)}, indent=2, sort_keys=True, default=str)
    shown = [c for c in columns if output == "wide" or not c.wide]
    return table([c.header for c in shown], [[c.cell(item) for c in shown] for item in items])


def age(since: str | datetime | None, now: datetime) -> str | None:
    """How long ago, as kubectl and squeue print it: ``45s``, ``12m``, ``3h05m``, ``2d4h``."""
    if since is None:
        return None
    at = datetime.fromisoformat(since) if isinstance(since, str) else since
    return duration(max(0.0, (now - at).total_seconds()))


def duration(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86_400}d{s % 86_400 // 3600}h"


_RELATIVE = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_since(text: str, now: datetime) -> datetime:
    """``--since``: an RFC 3339 time (UTC when it names no zone) or an age such as ``30m``, ``2h``, ``7d``."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        return now - timedelta(seconds=int(relative.group(1)) * _UNIT_S[relative.group(2)])
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--since {text!r}: give a time (2026-01-31T08:00:00Z) or an age (30m, 2h, 7d)"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def gpus_of(job: Mapping[str, Any]) -> str:
    """A job's GPUs as ``workers x per-worker [model]``."""
    per = job.get("gpus_per_worker")
    each = job.get("mig_profile") or (per if per else "slice")
    model = f" {job['gpu_type']}" if job.get("gpu_type") else ""
    return f"{job.get('workers', '?')}x{each}{model}"


def _nodes(item: Mapping[str, Any]) -> str | None:
    return ",".join(item.get("nodes") or []) or None


def _when(value: object) -> str | None:
    if value is None:
        return None
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return text.replace("+00:00", "Z")


# -- jobs (squeue) ---------------------------------------------------------------------------------


def job_columns(now: datetime) -> list[Column]:
    return [
        Column("JOB", lambda j: j["job_id"]),
        Column("QUEUE", lambda j: j["queue"]),
        Column("STATE", lambda j: j["state"]),
        Column("GPUS", gpus_of),
        Column("NODES", _nodes),
        Column("AGE", lambda j: age(j.get("submitted_at"), now)),
        Column("REASON", lambda j: j.get("reason_code") if j.get("state") == "pending" else j.get("reason")),
        Column("PRIORITY", lambda j: j.get("priority"), wide=True),
        Column("ATTEMPT", lambda j: j.get("attempt"), wide=True),
        Column("USER", lambda j: j.get("submitted_by"), wide=True),
        Column("SUBMITTED", lambda j: _when(j.get("submitted_at")), wide=True),
        Column("ALLOCATION", lambda j: j.get("allocation_id"), wide=True),
        Column("WHY", lambda j: j.get("reason"), wide=True),
    ]


def run_jobs(client: ApiClient, args: argparse.Namespace, out: TextIO, now: datetime) -> None:
    params: dict[str, str | int] = {}
    if args.queue:
        params["queue"] = args.queue
    if args.state:
        params["state"] = args.state
    elif not args.all:
        params["active"] = "true"  # as squeue: what is not over yet; finished jobs are history's
    items = client.pages("/v1/jobs", most=args.max, **params)
    print(render(items, job_columns(now), args.output), file=out)


# -- history (sacct) ----------------------------------------------------------------------------


def history_columns() -> list[Column]:
    return [
        Column("JOB", lambda j: j["job_id"]),
        Column("QUEUE", lambda j: j["queue"]),
        Column("STATE", lambda j: j["state"]),
        Column("CODE", lambda j: j.get("reason_code")),
        Column("GPUS", gpus_of),
        Column("RUNS", lambda j: j.get("runs")),
        Column("START", lambda j: _when(j.get("started_at"))),
        Column("END", lambda j: _when(j.get("finished_at"))),
        Column("ELAPSED", lambda j: duration(j.get("elapsed_s"))),
        Column("GPU-HOURS", lambda j: f"{float(j.get('gpu_hours') or 0.0):.3f}"),
        Column("NODES", _nodes, wide=True),
        Column("USER", lambda j: j.get("submitted_by"), wide=True),
        Column("SUBMITTED", lambda j: _when(j.get("submitted_at")), wide=True),
        Column("TIME LIMIT", lambda j: duration(j.get("time_limit_s")), wide=True),
        Column("REASON", lambda j: j.get("reason"), wide=True),
    ]


def run_history(client: ApiClient, args: argparse.Namespace, out: TextIO, now: datetime) -> None:
    params: dict[str, str | int] = {}
    if args.since:
        params["since"] = parse_since(args.since, now).isoformat()
    if args.queue:
        params["queue"] = args.queue
    items = client.pages("/v1/history", most=args.max, **params)
    print(render(items, history_columns(), args.output), file=out)
    if args.output != "json":
        total = sum(float(j.get("gpu_hours") or 0.0) for j in items)
        print(f"\n{len(items)} jobs, {total:.3f} GPU-hours", file=out)


# -- share (sshare / sprio) ------------------------------------------------------------------------


def _per_resource(values: Mapping[str, Any] | None) -> str | None:
    return ",".join(f"{r}={v}" for r, v in sorted((values or {}).items())) or None


def _nominal(queue: Mapping[str, Any]) -> str | None:
    quota = queue.get("quota")
    if not isinstance(quota, dict):
        return str(quota) if quota else None
    return _per_resource({r: v["nominal"] for r, v in quota.items()})


def _quota_said(queue: Mapping[str, Any], figure: Callable[[Mapping[str, Any]], object]) -> object:
    """A fair-share figure, or what quota has not said: ``unlimited`` / ``not-reported``."""
    said = queue.get("reported")
    if said == "quota":
        return figure(queue)
    return "unlimited" if said == "unlimited" else "not-reported"


def share_columns() -> list[Column]:
    return [
        Column("QUEUE", lambda q: q["queue"]),
        Column("NOMINAL", _nominal),
        Column("USED", lambda q: _per_resource(q.get("usage"))),
        Column("DECAYED SHARE", lambda q: _quota_said(q, lambda f: f"{f['dominant_share']:.4f}")),
        Column("FAIR POSITION", lambda q: _quota_said(q, lambda f: f"{f['position']}/{f['of']}")),
        Column("COHORT", lambda q: q.get("cohort"), wide=True),
        Column("WEIGHT", lambda q: q.get("weight"), wide=True),
        Column("DOMINANT", lambda q: q.get("dominant_resource"), wide=True),
        Column("CHARGED", lambda q: _per_resource(q.get("charged")), wide=True),
        Column("BORROWED", lambda q: _per_resource(q.get("borrowed")), wide=True),
        Column("LENDABLE", lambda q: _per_resource(q.get("lendable")), wide=True),
        Column("AS OF", lambda q: _when(q.get("as_of")), wide=True),
    ]


def run_share(client: ApiClient, args: argparse.Namespace, out: TextIO, now: datetime) -> None:
    items = client.queues()["items"]
    print(render(items, share_columns(), args.output), file=out)
    if args.output != "json":
        print(
            "\nDECAYED SHARE: quota's DRF share over usage decayed by its half-life, over the weight; "
            "FAIR POSITION: 1 is served first at equal priority",
            file=out,
        )


# -- cordon, uncordon, drain (scontrol update node) ---------------------------------------------


def operate(action: str) -> Callable[[ApiClient, argparse.Namespace, TextIO, datetime], None]:
    def run(client: ApiClient, args: argparse.Namespace, out: TextIO, now: datetime) -> None:
        body: dict[str, Any] = {"reason": args.reason} if args.reason else {}
        if action == "drain" and args.grace is not None:
            body["grace_s"] = args.grace
        result = client.operate(args.node, action, body)
        if args.output == "json":
            print(json.dumps(result, indent=2, sort_keys=True), file=out)
            return
        done = {"cordon": "cordoned", "drain": "draining", "uncordon": "uncordoned"}[action]
        grace = (
            f"; running work is asked to checkpoint and leave in {result['drain_grace_s']} s"
            if action == "drain"
            else ""
        )
        reason = f"; reason: {args.reason}" if args.output == "wide" and args.reason else ""
        print(f"node {result['node']} {done}{grace} (event {result['event_id']}){reason}", file=out)

    return run


# -- top -----------------------------------------------------------------------------------------

FREE, FAILED, DEGRADED, CORDONED = ".", "X", "d", "#"
SYMBOLS = "ABCDEFGHIJKLMNOPQRSTUVWYZabcefghijklmnopqrstuvwxyz0123456789"


@dataclass(frozen=True)
class Frame:
    """What one view of ``top`` shows, as the API reported it."""

    nodes: list[dict[str, Any]]
    queues: list[dict[str, Any]]
    held: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "queues": self.queues, "allocations": self.held}


def fetch_frame(client: ApiClient) -> Frame:
    return Frame(
        nodes=client.nodes()["items"],
        queues=client.queues()["items"],
        held=client.pages("/v1/allocations", most=MOST_ROWS, held="true"),
    )


def cluster_map(frame: Frame, *, wide: bool) -> str:
    """Nodes grouped by spine and leaf, one cell per GPU: a queue's letter, or free / failed / cordoned."""
    names = sorted({str(a.get("queue") or "?") for a in frame.held})
    symbol = {q: SYMBOLS[i % len(SYMBOLS)] for i, q in enumerate(names)}
    owner: dict[tuple[str, str], str] = {}
    for a in frame.held:
        for gpu in a["gpus"]:
            owner[(a["node"], gpu)] = symbol[str(a.get("queue") or "?")]
    lines: list[str] = []
    by_place: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for n in frame.nodes:
        by_place.setdefault((str(n.get("spine") or "-"), str(n.get("leaf") or "-")), []).append(n)
    width = max((len(n["node"]) for n in frame.nodes), default=4)
    for (spine, leaf), members in sorted(by_place.items()):
        lines.append(f"spine {spine} / leaf {leaf}")
        for n in sorted(members, key=lambda m: m["node"]):
            cells = []
            health = n.get("gpu_health") or {}
            out_of_service = n.get("cordon") is not None or n.get("state") == "lost"
            for g in n.get("gpus") or []:
                gid = g["id"]
                held = owner.get((n["node"], gid))
                if held is not None:
                    cells.append(held)
                elif health.get(gid) == "failed":
                    cells.append(FAILED)
                elif health.get(gid) == "degraded":
                    cells.append(DEGRADED)
                else:
                    cells.append(CORDONED if out_of_service else FREE)
            cordon = n.get("cordon")
            note = n["state"] if cordon is None else f"{n['state']}, {out_of_service_word(cordon, cells)}"
            if wide and cordon is not None and cordon.get("reason"):
                note += f": {cordon['reason']}"
            if wide and n.get("health_reason"):
                note += f" ({n['health_reason']})"
            lines.append(f"  {n['node'].ljust(width)}  [{''.join(cells)}]  {note}")
    legend = "  ".join(f"{s}={q}" for q, s in symbol.items())
    lines.append(
        f"\n{FREE} free  {CORDONED} cordoned/drained/lost  {DEGRADED} degraded  {FAILED} failed"
        + (f"  {legend}" if legend else "")
    )
    return "\n".join(lines)


def out_of_service_word(cordon: Mapping[str, Any], cells: Sequence[str]) -> str:
    """``cordoned``; a drain is ``draining`` while work still holds GPUs there, then ``drained``."""
    if cordon.get("mode") != "drain":
        return "cordoned"
    busy = any(c not in (FREE, FAILED, DEGRADED, CORDONED) for c in cells)
    return "draining" if busy else "drained"


def draw(frame: Frame, *, output: str, now: datetime) -> str:
    if output == "json":
        return json.dumps(frame.as_json(), indent=2, sort_keys=True, default=str)
    wide = output == "wide"
    gpus = sum(len(n.get("gpus") or []) for n in frame.nodes)
    held = len({(a["node"], g) for a in frame.held for g in a["gpus"]})
    head = (
        f"gangline top  {now.strftime('%Y-%m-%d %H:%M:%S')}Z  nodes {len(frame.nodes)}  "
        f"GPUs {held}/{gpus} held  allocations {len({a['allocation_id'] for a in frame.held})}"
    )
    queues = table(
        ["QUEUE", "WAITING", "RUNNING", "USED", "NOMINAL", "FAIR POSITION"],
        [
            [
                q["queue"],
                sum(q["jobs"].get(s, 0) for s in ("requested", "admitted", "queued", "pending", "requeued")),
                sum(q["jobs"].get(s, 0) for s in ("placed", "running", "preempting")),
                _per_resource(q.get("usage")),
                _nominal(q),
                _quota_said(q, lambda f: f"{f['position']}/{f['of']}"),
            ]
            for q in frame.queues
        ],
    )
    return f"{head}\n\n{cluster_map(frame, wide=wide)}\n\n{queues}"


CLEAR = "\x1b[H\x1b[2J"


def run_top(
    client: ApiClient,
    args: argparse.Namespace,
    out: TextIO,
    now: datetime,
    *,
    pause: Callable[[float], None] = time.sleep,
) -> None:
    """One frame with ``--once`` (or ``-o json``), else redraw every ``--interval`` s (``pause``) until
    ``--iterations`` frames are shown (as ``top -n``) or Ctrl-C."""
    once = args.once or args.output == "json"
    most: int | None = 1 if once else args.iterations
    frames = 0
    try:
        while True:
            frame = fetch_frame(client)
            text = draw(frame, output=args.output, now=datetime.now(UTC) if frames else now)
            print(text if once else CLEAR + text, file=out, flush=True)
            frames += 1
            if most is not None and frames >= most:
                return
            pause(args.interval)
    except KeyboardInterrupt:
        return


# -- registration --------------------------------------------------------------------------------

JOBS_HELP = "jobs, as squeue lists them: id, queue, state, GPUs, nodes, age, reason"
HISTORY_HELP = "job accounting from the ledger, as sacct: runs, start, end, elapsed, GPU-hours"
SHARE_HELP = "fair share per queue, as sshare/sprio: nominal, used, decayed share, fair-share position"
CORDON_HELP = "admin: no new work on a node; what runs there runs on"
UNCORDON_HELP = "admin: a cordoned or draining node takes new work again"
DRAIN_HELP = "admin: no new work on a node, and its running work leaves after a grace (default 600 s)"
TOP_HELP = "a live view of the cluster map (a cell per GPU) and the queues"


def add_output(parser: argparse.ArgumentParser) -> None:
    """``-o table|wide|json``."""
    parser.add_argument(
        "-o", "--output", choices=FORMATS, default="table", help="table (default), wide or json"
    )


def configure_jobs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", help="only this queue's jobs")
    parser.add_argument("--state", choices=JOB_STATES, help="only jobs in this state")
    parser.add_argument("--all", action="store_true", help="finished jobs too (by default: jobs not over)")
    parser.add_argument("--max", type=int, default=MOST_ROWS, help="at most this many rows (newest first)")
    add_output(parser)


def configure_history(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", help="jobs submitted or ended since: a time (RFC 3339) or an age (2h, 7d)")
    parser.add_argument("--queue", help="only this queue's jobs")
    parser.add_argument("--max", type=int, default=MOST_ROWS, help="at most this many rows (newest first)")
    add_output(parser)


def configure_share(parser: argparse.ArgumentParser) -> None:
    add_output(parser)


def configure_node_action(*, drain: bool) -> Callable[[argparse.ArgumentParser], None]:
    def configure(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("node", help="the node id")
        parser.add_argument("--reason", help="why, for the node's history")
        if drain:
            parser.add_argument(
                "--grace",
                type=int,
                help="seconds running work may still run before it is asked to checkpoint (default 600)",
            )
        add_output(parser)

    return configure


def configure_top(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--once", action="store_true", help="print one view and exit")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between views (default 2)")
    parser.add_argument(
        "-n",
        "--iterations",
        type=_positive,
        help="stop after this many views (as top -n; default: until Ctrl-C)",
    )
    add_output(parser)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {n}")
    return n


Run = Callable[[ApiClient, argparse.Namespace, TextIO, datetime], None]


def handler(run: Run) -> Callable[[ApiClient, argparse.Namespace, TextIO], None]:
    """A runner of :mod:`gangline.client.commands`' shape: the caller's clock read once, here."""

    def with_clock(client: ApiClient, args: argparse.Namespace, out: TextIO) -> None:
        run(client, args, out, datetime.now(UTC))

    return with_clock


RUNS: dict[str, Run] = {
    "jobs": run_jobs,
    "history": run_history,
    "share": run_share,
    "cordon": operate("cordon"),
    "uncordon": operate("uncordon"),
    "drain": operate("drain"),
    "top": run_top,
}

__all__ = ["RUNS", "Frame", "cluster_map", "draw", "parse_since", "render"]
