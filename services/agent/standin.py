"""Simulated nodes through the NVML stand-in: one real :class:`NodeAgent` per node of a cluster YAML.

``gangline fake-nodes --spec cluster.yaml --nvml standin`` runs this instead of the lightweight
:class:`~services.agent.fake.FakeCluster`: every node reads its inventory from an
:class:`~gangline.nvml.standin.NvmlStandIn` built from its group (:func:`node_spec_for`), so
registration, heartbeats and ``gpu.health_changed`` go through the same code as on a real GPU node,
and XIDs can be injected (``--xid NODE:GPU:CODE@SECONDS``). Ranks run in a ``SimulatedRunner`` per
node, or, with ``--runner process``, as real processes (:class:`~gangline.agent.runner.ProcessRunner`:
each job's ``command`` runs with CUDA_VISIBLE_DEVICES and the torch.distributed environment). All
agents share one producer and one consumer (``consume=False``): each event is handed to every agent,
which keeps what concerns its node.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gangline.agent.node import NodeAgent
from gangline.agent.runner import ProcessRunner, Runner
from gangline.agent.settings import AgentTopics, NodeAgentSettings
from gangline.agent.simulated import SimulatedRunner
from gangline.bus.consumer import EventConsumer
from gangline.bus.producer import EventProducer
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.nodes import NodeRegistered
from gangline.events.types import NodeId
from gangline.nvml.spec import GpuSpec, NodeSpec
from gangline.nvml.standin import NvmlStandIn
from gangline.telemetry.metrics import METRICS_PORTS
from services.agent.metrics import serving_agents
from services.common.env import ServiceSettings, topic_names
from services.common.topics import TopicNames

log = logging.getLogger(__name__)

DRIVER_VERSION = "550.90.07"
_NVSWITCH_BUS = "0000:F0:00.0"
_NVLINKS_PER_GPU = 4


def node_spec_for(group: NodeGroup, node: str) -> NodeSpec:
    """The stand-in's view of one node of ``group``: its GPU model, count, memory and NVLink wiring.

    NVML names the product "NVIDIA <model>", which the agent's ``model_label`` turns back into the
    group's ``gpu_model``, so placement and admission see the same model names as with the
    lightweight fake. ``nvlink: node`` joins the node's GPUs through one NVSwitch (one domain).
    """
    switched = group.nvlink == "node" and group.gpus_per_node > 1
    gpus = tuple(
        GpuSpec(
            name=f"NVIDIA {group.gpu_model}",
            memory_mib=group.memory_mib,
            pci_bus_id=f"0000:{0x10 + k:02X}:00.0",
            numa_node=0 if k < max(1, group.gpus_per_node // 2) else 1,
            nvlink_to="nvswitch" if switched else "none",
            nvlinks=_NVLINKS_PER_GPU if switched else 0,
            row_remapping=True,
        )
        for k in range(group.gpus_per_node)
    )
    return NodeSpec(
        node=node,
        driver_version=DRIVER_VERSION,
        nvswitches=(_NVSWITCH_BUS,) if switched else (),
        gpus=gpus,
    )


@dataclass(frozen=True)
class XidInjection:
    """``NODE:GPU:CODE@SECONDS``: XID ``code`` on ``gpu`` of ``node``, ``seconds`` after the agents start."""

    node: NodeId
    gpu: str
    code: int
    after_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> XidInjection:
        what, _, seconds = text.partition("@")
        parts = what.split(":")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"expected NODE:GPU:CODE[@SECONDS], got {text!r}")
        node, gpu, code = parts
        return cls(NodeId(node), gpu, int(code), float(seconds or 0))


@dataclass
class StandInCluster:
    """Every node of ``spec`` as a :class:`NodeAgent` on an NVML stand-in; :meth:`run` until cancelled."""

    spec: ClusterSpec
    bootstrap: str
    topics: TopicNames
    group_id: str
    time_scale: float = 1.0
    """Real seconds per simulated second of a job (0.01 runs a one-hour job in 36 s)."""
    heartbeat_s: float = 2.0
    default_duration_s: float = 3600.0
    """Simulated run time of jobs without a duration hint."""
    checkpoint_delay_s: float = 0.2
    work_dir: Path | None = None
    """Checkpoint and log directories of the agents; None: a temporary directory."""
    runner: Literal["simulated", "process"] = "simulated"
    """How ranks run: simulated for their duration hint, or as real processes of the job's command."""
    agents: dict[NodeId, NodeAgent] = field(init=False, default_factory=dict)
    nvml: dict[NodeId, NvmlStandIn] = field(init=False, default_factory=dict)
    ready: asyncio.Event = field(init=False, default_factory=asyncio.Event)

    def settings_for(self, registered: NodeRegistered, root: Path) -> NodeAgentSettings:
        return NodeAgentSettings(
            node=registered.node,
            leaf=registered.leaf,
            spine=registered.spine,
            nvlink_domain=registered.nvlink_domain,
            address=registered.address,
            peer_address="127.0.0.1",
            labels={**registered.labels, "gangline/nvml": "standin"},
            checkpoint_root=root / "ckpt",
            log_dir=root / "logs",
            kafka_bootstrap=self.bootstrap,
            topics=AgentTopics.prefixed(self.topics.prefix),
            heartbeat_interval_s=self.heartbeat_s,
            report_repeated_errors=True,
        )

    def make_runner(self, node_dir: Path) -> Runner:
        if self.runner == "process":
            node_dir.mkdir(parents=True, exist_ok=True)
            return ProcessRunner(cwd=node_dir)
        return SimulatedRunner(
            time_scale=self.time_scale,
            default_duration_s=self.default_duration_s,
            checkpoint_delay_s=self.checkpoint_delay_s,
        )

    async def inject_xid(self, injection: XidInjection) -> None:
        """Raise the XID on the node's stand-in now (79: off the bus, 48: double-bit ECC)."""
        agent = self.agents.get(injection.node)
        if agent is None:
            raise KeyError(f"no node {injection.node!r} in cluster {self.spec.name!r}")
        log.warning("injecting XID %d on %s/%s", injection.code, injection.node, injection.gpu)
        agent.inject_xid(injection.gpu, injection.code)

    async def inject_later(self, injection: XidInjection) -> None:
        await self.ready.wait()
        await asyncio.sleep(injection.after_s)
        await self.inject_xid(injection)

    async def run(self) -> None:
        with contextlib.ExitStack() as stack:
            root = self.work_dir
            if root is None:
                root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gangline-standin-")))
            await self._run(root.resolve())

    async def _run(self, root: Path) -> None:
        async with EventProducer(
            self.bootstrap, client_id=f"standin-nodes-{self.spec.name}", linger_ms=5
        ) as producer:
            consumer = EventConsumer(
                self.bootstrap,
                [self.topics.allocations, self.topics.events],
                service=f"standin-nodes-{self.spec.name}",
                group_id=self.group_id,
                auto_offset_reset="latest",
            )
            await consumer.start()
            try:
                # Positions are pinned before any node registers, so no grant can slip past.
                await consumer.wait_for_assignment()
                for group, registered in self.spec.grouped_registrations():
                    api = NvmlStandIn(node_spec_for(group, registered.node))
                    agent = NodeAgent(
                        self.settings_for(registered, root / registered.node),
                        nvml_api=api,
                        runner=self.make_runner(root / registered.node),
                        producer=producer,
                        consume=False,
                    )
                    self.nvml[registered.node] = api
                    self.agents[registered.node] = agent
                await asyncio.gather(*(agent.start() for agent in self.agents.values()))
                self.ready.set()
                await self._dispatch(consumer)
            finally:
                await asyncio.gather(*(a.stop() for a in self.agents.values()), return_exceptions=True)
                await consumer.stop()

    async def _dispatch(self, consumer: EventConsumer) -> None:
        agents = list(self.agents.values())
        while True:
            deliveries = await consumer.getmany(timeout_ms=200)
            for delivery in deliveries:
                for agent in agents:
                    try:
                        await agent.handle(delivery.envelope)
                    except Exception:  # bad input never stops the cluster
                        log.exception("agent %s: handling %s failed", agent.node, delivery.envelope.type)
            if deliveries:
                await consumer.commit()


# ---- gangline fake-nodes --nvml standin ----------------------------------------------------------


def configure(p: argparse.ArgumentParser) -> None:
    """The stand-in's flags on ``gangline fake-nodes``."""
    p.add_argument(
        "--nvml",
        choices=("none", "standin"),
        default="none",
        help="standin: one NodeAgent per node on an NVML stand-in (default: the lightweight fake)",
    )
    p.add_argument(
        "--xid",
        action="append",
        default=[],
        type=XidInjection.parse,
        metavar="NODE:GPU:CODE@SECONDS",
        help="with --nvml standin: raise XID CODE on GPU (gpu0 ...) of NODE after SECONDS",
    )
    p.add_argument(
        "--runner",
        choices=("simulated", "process"),
        default="simulated",
        help="with --nvml standin: process runs each job's command as real processes (default: simulated)",
    )


async def simulate(spec: ClusterSpec, args: argparse.Namespace, settings: ServiceSettings) -> None:
    cluster = StandInCluster(
        spec=spec,
        bootstrap=settings.kafka_bootstrap,
        topics=topic_names(settings),
        group_id=f"{settings.group_prefix}.standin-nodes.{spec.name}",
        time_scale=args.time_scale,
        heartbeat_s=args.heartbeat_s,
        default_duration_s=float(args.default_duration_s or 3600),
        runner=args.runner,
    )
    log.info(
        "stand-in cluster starting",
        extra={"cluster": spec.name, "nodes": spec.node_count, "gpus": spec.total_gpus},
    )
    injections = [asyncio.create_task(cluster.inject_later(x)) for x in args.xid]
    port = settings.metrics_port if settings.metrics_port is not None else METRICS_PORTS["agent"]
    try:
        async with serving_agents(lambda: cluster.agents.values(), host=settings.metrics_host, port=port):
            await cluster.run()
    finally:
        for task in injections:
            task.cancel()
