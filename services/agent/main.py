"""``gangline fake-nodes --spec cluster.yaml``: run a simulated cluster until Ctrl-C / SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence

from gangline.bus import run_service
from gangline.cluster_spec import load_cluster_spec, uniform_cluster
from gangline.telemetry import setup_logging
from gangline.telemetry.metrics import METRICS_PORTS
from services.agent import standin
from services.agent.fake import FakeCluster
from services.agent.metrics import serving_agents
from services.common.env import ServiceSettings, topic_names

HELP = "run a simulated GPU cluster: inventory, heartbeats, placed jobs run for their duration hint"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", help="cluster YAML (deploy/clusters/default.yaml)")
    p.add_argument("--nodes", type=int, help="instead of --spec: this many uniform 8-GPU nodes")
    p.add_argument("--time-scale", type=float, default=1.0, help="real seconds per simulated second")
    p.add_argument("--heartbeat-s", type=float, default=2.0)
    p.add_argument("--default-duration-s", type=int, default=None)
    p.add_argument(
        "--fail", action="append", default=[], metavar="NODE@SECONDS", help="silence NODE after SECONDS"
    )
    standin.configure(p)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM / Ctrl-C; broker and topic prefix from GANGLINE_* (see ServiceSettings)."""
    settings = ServiceSettings.from_env()
    setup_logging("fake-nodes", level=settings.log_level)
    status: int = run_service(simulate(args, settings))
    return status


async def simulate(args: argparse.Namespace, settings: ServiceSettings) -> None:
    if args.spec:
        spec = load_cluster_spec(args.spec)
    elif args.nodes:
        spec = uniform_cluster(args.nodes)
    else:
        raise SystemExit("give --spec cluster.yaml or --nodes N")
    if args.nvml == "standin":
        return await standin.simulate(spec, args, settings)
    cluster = FakeCluster(
        spec=spec,
        bootstrap=settings.kafka_bootstrap,
        topics=topic_names(settings),
        group_id=f"{settings.group_prefix}.fake-nodes.{spec.name}",
        time_scale=args.time_scale,
        heartbeat_s=args.heartbeat_s,
        default_duration_s=args.default_duration_s,
    )
    logging.getLogger(__name__).info(
        "simulated cluster up",
        extra={"cluster": spec.name, "nodes": len(cluster.nodes), "gpus": spec.total_gpus},
    )
    failures = []
    for item in args.fail:
        node, _, seconds = item.partition("@")
        failures.append(asyncio.create_task(_fail_later(cluster, node, float(seconds or 0))))
    # The lightweight fake reads no NVML: its /metrics has the process's families and no GPU series.
    port = settings.metrics_port if settings.metrics_port is not None else METRICS_PORTS["agent"]
    async with serving_agents(list, host=settings.metrics_host, port=port):
        await cluster.run()


async def _fail_later(cluster: FakeCluster, node: str, seconds: float) -> None:
    await cluster.ready.wait()
    await asyncio.sleep(seconds)
    await cluster.fail_node(next(n for n in cluster.nodes if n == node), xid=79)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gangline fake-nodes", description=HELP)
    configure(p)
    return run(p.parse_args(argv))
