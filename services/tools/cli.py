"""The `gangline` command: subcommands registered explicitly, each implemented in its own module.

Adding a subcommand is one `Command(...)` line in `COMMANDS`: its name, one-line help, a function
that adds its arguments to an argparse parser, and a function that runs it and returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

from gangline.client import commands as client
from gangline.client import operator
from gangline.cluster_spec import ClusterSpec
from gangline.replay import cli as replay_cli
from gangline.replay.log import LogRecord
from gangline.sim import cli as sim_cli
from gangline.sim.metrics import RunResult
from gangline.sim.trace import TraceJob
from services.agent import main as fake_nodes


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _decider(module: str) -> Callable[[], replay_cli.Decider]:
    def load() -> replay_cli.Decider:
        return cast(replay_cli.Decider, importlib.import_module(module))

    return load


DECIDERS: replay_cli.Deciders = {
    "all": _decider("services.common.replay"),
    "admission": _decider("services.admission.replay"),
    "quota": _decider("services.quota.replay"),
    "placement-service": _decider("services.placement.replay"),
    "placement": _decider("services.placement.replay"),
    "preemption": _decider("services.preemption.replay"),
    "node-health": _decider("services.node_health.replay"),
}
"""``gangline replay --decider``: each service's own decisions re-run (imported only when chosen)."""


def _what_if(
    records: Sequence[LogRecord], profile: Path, queues: Path | None
) -> tuple[dict[str, object], dict[str, object]]:
    """What-if through the services' own handlers (``services.tools.simulate.whatif``)."""
    from services.tools.simulate.whatif import what_if_services

    return what_if_services(records, profile, queues)


def _configure_simulate(p: argparse.ArgumentParser) -> None:
    sim_cli.configure(p)
    p.add_argument(
        "--services",
        action="store_true",
        help="also run the trace through the services' own handlers (admission, quota, placement, "
        "preemption, node_health on an in-memory bus, virtual clock) under the first profile",
    )


def _simulate(args: argparse.Namespace) -> int:
    if not args.services:
        return sim_cli.run(args)
    from services.tools.simulate.trace_run import SimulateOptions, simulate_services

    profile = args.profile[0] if args.profile else None

    def through_services(jobs: Sequence[TraceJob], spec: ClusterSpec) -> RunResult:
        options = SimulateOptions(sample_s=args.sample_s)
        return simulate_services(jobs, spec, queues=args.queues, profile_path=profile, options=options).result

    return sim_cli.run(args, extra=[through_services])


COMMANDS: tuple[Command, ...] = (
    Command("simulate", sim_cli.HELP, _configure_simulate, _simulate),
    Command(
        "replay",
        replay_cli.REPLAY_HELP,
        partial(replay_cli.configure_replay, deciders=DECIDERS),
        partial(replay_cli.run_replay, deciders=DECIDERS, what_if_engine=_what_if),
    ),
    Command("export", replay_cli.EXPORT_HELP, replay_cli.configure_export, replay_cli.run_export),
    Command("fake-nodes", fake_nodes.HELP, fake_nodes.configure, fake_nodes.run),
    Command("submit", client.SUBMIT_HELP, client.configure_submit, client.submit),
    Command("status", client.STATUS_HELP, client.configure_job, client.status),
    Command("why", client.WHY_HELP, client.configure_job, client.why),
    Command("cancel", client.CANCEL_HELP, client.configure_cancel, client.cancel),
    Command("queues", client.QUEUES_HELP, client.configure_listing, client.queues),
    Command("nodes", client.NODES_HELP, client.configure_listing, client.nodes),
    Command("jobs", operator.JOBS_HELP, operator.configure_jobs, client.jobs),
    Command("history", operator.HISTORY_HELP, operator.configure_history, client.history),
    Command("share", operator.SHARE_HELP, operator.configure_share, client.share),
    Command("cordon", operator.CORDON_HELP, operator.configure_node_action(drain=False), client.cordon),
    Command("uncordon", operator.UNCORDON_HELP, operator.configure_node_action(drain=False), client.uncordon),
    Command("drain", operator.DRAIN_HELP, operator.configure_node_action(drain=True), client.drain),
    Command("top", operator.TOP_HELP, operator.configure_top, client.top),
)


def parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    """The argument parser with one subparser per command."""
    p = argparse.ArgumentParser(
        prog="gangline", description="Gangline: gang scheduling for shared GPU clusters"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for c in commands:
        sp = sub.add_parser(c.name, help=c.help, description=c.help)
        c.configure(sp)
        sp.set_defaults(_run=c.run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gangline` console script."""
    args = parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args._run
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
