"""The client subcommands: for each, a help line, a ``configure_*`` that adds its arguments and a
runner (``submit``, ``status``, ...) that returns the exit status; ``gangline.cli`` lists them.

Handlers print plain-text tables to stdout and errors to stderr (exit 1). The operators' commands
(``jobs``, ``history``, ``share``, ``cordon``, ``uncordon``, ``drain``, ``top``, each with
``-o table|wide|json``) are :mod:`gangline.client.operator`'s, registered here the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import yaml

from gangline.client import operator
from gangline.client.api_client import ApiClient, ApiError
from gangline.client.tables import table

Run = Callable[[ApiClient, argparse.Namespace, TextIO], None]


def _handler(run: Run) -> Callable[[argparse.Namespace], int]:
    def handle(args: argparse.Namespace) -> int:
        try:
            with ApiClient.from_env() as client:
                run(client, args, sys.stdout)
        except ApiError as error:
            print(
                f"error: {error.detail}" if error.status == 0 else f"error ({error.status}): {error.detail}",
                file=sys.stderr,
            )
            return 1
        except (OSError, yaml.YAMLError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        return 0

    return handle


# -- submit -----------------------------------------------------------------------------------


def load_job_file(path: Path) -> dict[str, Any]:
    """A job file: YAML (or JSON) with the fields of job.requested; ``job_id`` optional."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a job file is a mapping of job.requested fields")
    return doc


def run_submit(client: ApiClient, args: argparse.Namespace, out: TextIO) -> None:
    spec = load_job_file(Path(args.file))
    if args.queue:
        spec["queue"] = args.queue
    result = client.submit(spec)
    print(f"submitted {result['job_id']} to queue {result['queue']} (event {result['event_id']})", file=out)


# -- status, why, cancel ----------------------------------------------------------------------


def _gpus(job: dict[str, Any]) -> str:
    """``workers x per-worker [model]``; an elastic job's current size and its range (``2(1..4)x1``)."""
    spec = job.get("spec") or {}
    each = spec.get("mig_profile") or (
        f"{spec['gpu_fraction_milli']}m" if spec.get("gpu_fraction_milli") else job.get("gpus_per_worker")
    )
    kind = f" {job['gpu_type']}" if job.get("gpu_type") else ""
    workers = job.get("workers", "?")
    if spec.get("min_workers") is not None or spec.get("max_workers") is not None:
        now = job.get("workers_now")
        least = spec.get("min_workers") or workers
        most = spec.get("max_workers") or workers
        workers = f"{now if now is not None else '-'}({least}..{most})"
    return f"{workers}x{each}{kind}"


def run_status(client: ApiClient, args: argparse.Namespace, out: TextIO) -> None:
    body = client.job(args.job)
    job = body["job"]
    print(
        table(
            ["JOB", "QUEUE", "STATE", "PRIORITY", "GPUS", "ATTEMPT", "SUBMITTED", "REASON"],
            [
                [
                    job["job_id"],
                    job["queue"],
                    job["state"],
                    job.get("priority"),
                    _gpus(job),
                    job.get("attempt"),
                    job.get("submitted_at"),
                    job.get("reason"),
                ]
            ],
        ),
        file=out,
    )
    sizes = body.get("sizes") or []
    if any(s.get("resizes") for s in sizes):
        print(
            "\n"
            + table(
                ["ALLOCATION", "WORKERS", "GRANTED", "RELEASED", "WHY", "RESIZES"],
                [
                    [
                        s["allocation_id"],
                        s["workers"],
                        s["granted_at"],
                        s["released_at"],
                        s["release_reason"],
                        s.get("resizes"),
                    ]
                    for s in sizes
                ],
            ),
            file=out,
        )
    if body["allocations"]:
        print(
            "\n"
            + table(
                ["RANK", "NODE", "GPUS", "GRANTED", "RELEASED"],
                [
                    [a["rank"], a["node"], ",".join(a["gpus"]), a["granted_at"], a["released_at"]]
                    for a in body["allocations"]
                ],
            ),
            file=out,
        )
    if body["events"]:
        print(
            "\n"
            + table(
                ["TIME", "EVENT", "SOURCE"],
                [
                    [e["time"], e["type"].removeprefix("gangline.").rsplit(".v", 1)[0], e["source"]]
                    for e in body["events"]
                ],
            ),
            file=out,
        )


def run_why(client: ApiClient, args: argparse.Namespace, out: TextIO) -> None:
    why = client.job(args.job)["why"]
    print(f"{args.job}: {why['summary']}", file=out)
    if why["reasons"]:
        print(
            "\n"
            + table(
                ["CODE", "CONSTRAINT", "WHY", "WHAT WOULD UNBLOCK IT"],
                [[r["code"], r["constraint"], r["message"], r.get("unblock")] for r in why["reasons"]],
            ),
            file=out,
        )


def run_cancel(client: ApiClient, args: argparse.Namespace, out: TextIO) -> None:
    result = client.cancel(args.job, args.reason)
    print(f"cancel requested for {result['job_id']} (event {result['event_id']})", file=out)


# -- queues, nodes ----------------------------------------------------------------------------


def _quota(quota: dict[str, Any] | str) -> str:
    """A limited queue's nominal quotas, or "unlimited"."""
    return _resources({r: v["nominal"] for r, v in quota.items()}) if isinstance(quota, dict) else quota


def _resources(values: dict[str, Any] | None) -> str:
    return ",".join(f"{r}={v}" for r, v in sorted((values or {}).items())) or "-"


NOT_REPORTED = {"not_reported_yet": "not-reported", "unlimited": "unlimited"}
"""What the fair-share columns say when quota has no figure for a queue."""


def run_queues(client: ApiClient, args: argparse.Namespace, out: TextIO) -> None:
    """The queues with the quota service's fair-share figures (the figure it orders waiting work by)."""
    body = client.queues()
    if args.output == "json":
        print(json.dumps(body, indent=2, sort_keys=True, default=str), file=out)
        return
    rows = []
    for q in body["items"]:
        jobs = q["jobs"]
        waiting = sum(jobs.get(s, 0) for s in ("requested", "admitted", "queued", "pending", "requeued"))
        reported = q.get("reported") == "quota"
        rows.append(
            [
                q["queue"],
                q["cohort"],
                q["weight"],
                _quota(q["quota"]),
                _resources(q["usage"]),
                _resources(q["borrowed"]) if reported else "-",
                _resources(q["lendable"]) if reported else "-",
                f"{q['dominant_share']:.3f}" if reported else "-",
                f"{q['position']}/{q['of']}" if reported else NOT_REPORTED.get(q.get("reported", ""), "-"),
                waiting,
                jobs.get("running", 0) + jobs.get("placed", 0),
                q["as_of"] if reported else "-",
            ]
        )
    print(
        table(
            [
                "QUEUE",
                "COHORT",
                "WEIGHT",
                "QUOTA",
                "USED",
                "BORROWED",
                "LENDABLE",
                "DRF SHARE",
                "FAIR POSITION",
                "WAITING",
                "RUNNING",
                "AS OF",
            ],
            rows,
        ),
        file=out,
    )
    print(
        "\nfair-share figures: the quota service's (DRF over decayed usage), as of the time shown", file=out
    )


def run_nodes(client: ApiClient, args: argparse.Namespace, out: TextIO) -> None:
    body = client.nodes()
    if args.output == "json":
        print(json.dumps(body, indent=2, sort_keys=True, default=str), file=out)
        return
    rows = [
        [
            n["node"],
            n["state"] if not n.get("cordon") else f"{n['state']},{n['cordon']['mode']}ed",
            n["gpu_model"],
            f"{n['gpus_held']}/{n['gpu_count']}",
            ",".join(n["cordoned_gpus"]) or None,
            f"{n['nvlink_domain']}/{n['leaf']}/{n['spine']}",
            n["last_heartbeat_at"],
            n["health_reason"],
        ]
        for n in body["items"]
    ]
    print(
        table(
            ["NODE", "STATE", "MODEL", "HELD", "CORDONED", "NVLINK/LEAF/SPINE", "LAST HEARTBEAT", "HEALTH"],
            rows,
        ),
        file=out,
    )


# -- registration: (name, help, configure, run) for services.tools.cli's COMMANDS ---------------------

SUBMIT_HELP = "submit a job described in a YAML file"
STATUS_HELP = "a job's state, placement and history"
WHY_HELP = "why a job is pending, and what would unblock it"
CANCEL_HELP = "ask to stop a job, queued or running"
QUEUES_HELP = "queues: quota, usage, and the quota service's borrowing and fair-share figures"
NODES_HELP = "nodes: GPUs, health, what is held"


def configure_submit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="job.yaml: queue, workers, gpus_per_worker, ...")
    parser.add_argument("--queue", help="override the file's queue")


def configure_job(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="the job id")


def configure_cancel(parser: argparse.ArgumentParser) -> None:
    configure_job(parser)
    parser.add_argument("--reason", help="a sentence for the job's history")


def configure_listing(parser: argparse.ArgumentParser) -> None:
    """``queues`` and ``nodes``: ``-o json`` prints what the API returned (``wide`` is the table)."""
    operator.add_output(parser)


submit = _handler(run_submit)
status = _handler(run_status)
why = _handler(run_why)
cancel = _handler(run_cancel)
queues = _handler(run_queues)
nodes = _handler(run_nodes)
jobs = _handler(operator.handler(operator.RUNS["jobs"]))
history = _handler(operator.handler(operator.RUNS["history"]))
share = _handler(operator.handler(operator.RUNS["share"]))
cordon = _handler(operator.handler(operator.RUNS["cordon"]))
uncordon = _handler(operator.handler(operator.RUNS["uncordon"]))
drain = _handler(operator.handler(operator.RUNS["drain"]))
top = _handler(operator.handler(operator.RUNS["top"]))

COMMANDS: tuple[
    tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]], ...
] = (
    ("submit", SUBMIT_HELP, configure_submit, submit),
    ("status", STATUS_HELP, configure_job, status),
    ("why", WHY_HELP, configure_job, why),
    ("cancel", CANCEL_HELP, configure_cancel, cancel),
    ("queues", QUEUES_HELP, configure_listing, queues),
    ("nodes", NODES_HELP, configure_listing, nodes),
    ("jobs", operator.JOBS_HELP, operator.configure_jobs, jobs),
    ("history", operator.HISTORY_HELP, operator.configure_history, history),
    ("share", operator.SHARE_HELP, operator.configure_share, share),
    ("cordon", operator.CORDON_HELP, operator.configure_node_action(drain=False), cordon),
    ("uncordon", operator.UNCORDON_HELP, operator.configure_node_action(drain=False), uncordon),
    ("drain", operator.DRAIN_HELP, operator.configure_node_action(drain=True), drain),
    ("top", operator.TOP_HELP, operator.configure_top, top),
)
"""The client subcommands as (name, help, configure, run), in the order ``gangline --help`` lists them."""


def main(argv: list[str] | None = None) -> int:
    """``python -m gangline.client``: the client subcommands on their own (``gangline`` has them too)."""
    parser = argparse.ArgumentParser(prog="gangline", description="Talk to the Gangline API.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text, configure, run in COMMANDS:
        command = sub.add_parser(name, help=help_text, description=help_text)
        configure(command)
        command.set_defaults(run=run)
    args = parser.parse_args(argv)
    code: int = args.run(args)
    return code
