"""MIG end to end on the real broker: node agents on NVML stand-ins registering under NVML's own model
names and MIG instance ids, the whole pipeline deciding, and a real worker process.

A DGX A100 whose GPUs are carved by MIG (NVML names it ``NVIDIA A100-SXM4-80GB``; its GPU-instance
ids are not the memory slices the instances sit on), a DGX H100 (``NVIDIA H100 80GB HBM3``) and an
A30 box in MIG mode (a layout the scheduler cannot model). A ``1g.10gb`` job runs as a process whose
``CUDA_VISIBLE_DEVICES`` is the MIG device UUID of the instance its grant names; the A30 node is
refused (``node.rejected``, its registration dead-lettered) and the other nodes keep taking work.
"""

from __future__ import annotations

import sys
from pathlib import Path

from e2e.harness import LogReader, Tasks, private_topics, request_bytes, send_raw, service_env, start_pipeline
from gangline.agent.node import NodeAgent
from gangline.agent.runner import ProcessRunner, Runner
from gangline.agent.settings import AgentTopics, NodeAgentSettings
from gangline.agent.simulated import SimulatedRunner
from gangline.bus.producer import EventProducer
from gangline.bus.records import DLQ_CODE, DLQ_REASON, DLQ_SOURCE_SERVICE, header
from gangline.events.allocations import AllocationGranted
from gangline.events.jobs import JobCompleted, JobStarted
from gangline.events.nodes import NodeRegistered, NodeRejected
from gangline.events.topics import dead_letter_topic
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn

PRINT_DEVICES = (sys.executable, "-c", "import os; print('devices', os.environ['CUDA_VISIBLE_DEVICES'])")


async def test_a_1g_job_launches_on_its_mig_uuid_and_a_node_of_an_unknown_mig_model_is_refused(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    async with private_topics(kafka_bootstrap, "mig") as topics:
        env = service_env(kafka_bootstrap, topics)
        inventory_dlq = dead_letter_topic(topics.inventory)
        tasks = Tasks()
        agents: list[NodeAgent] = []
        try:
            start_pipeline(tasks, env)
            async with EventProducer(kafka_bootstrap, client_id="mig-nodes") as producer:
                nodes: tuple[tuple[str, str, Runner], ...] = (
                    ("mig-0", "dgx-a100-mig", ProcessRunner()),
                    ("h100-0", "dgx-h100", SimulatedRunner(time_scale=0.01)),
                    ("a30-0", "pcie-a30-mig", SimulatedRunner(time_scale=0.01)),
                )
                for node, spec, runner in nodes:
                    settings = NodeAgentSettings(
                        node=node,
                        leaf="leaf-a",
                        spine="spine-0",
                        checkpoint_root=tmp_path / node / "ckpt",
                        log_dir=tmp_path / node / "logs",
                        kafka_bootstrap=kafka_bootstrap,
                        topics=AgentTopics.prefixed(topics.prefix),
                        heartbeat_interval_s=0.5,
                        peer_address="127.0.0.1",
                    )
                    agent = NodeAgent(
                        settings,
                        nvml_api=NvmlStandIn(load_builtin_spec(spec, node=node)),
                        runner=runner,
                        producer=producer,
                    )
                    await agent.start()
                    agents.append(agent)
                read = [topics.events, topics.allocations, topics.health, topics.inventory, inventory_dlq]
                async with LogReader(kafka_bootstrap, read) as log:
                    # 1. Registered under NVML's names; the A30 node refused and dead-lettered.
                    await log.until(
                        lambda: bool(log.of(topics.health, NodeRejected)) and bool(log.raw[inventory_dlq]),
                        timeout_s=60,
                        check=tasks.check,
                    )
                    registered = {r.node: r for r in log.of(topics.inventory, NodeRegistered)}
                    assert {g.model for g in registered["mig-0"].gpus} == {"A100-SXM4-80GB"}
                    assert {g.model for g in registered["h100-0"].gpus} == {"H100-80GB-HBM3"}
                    [rejected] = log.of(topics.health, NodeRejected)
                    assert rejected.node == "a30-0" and rejected.code == "unsupported_hardware"
                    assert "'A30'" in rejected.reason and "no known MIG geometry" in rejected.reason
                    [letter_headers] = log.headers[inventory_dlq]
                    assert header(letter_headers, DLQ_CODE) == b"unsupported_hardware"
                    assert b"A30" in (header(letter_headers, DLQ_REASON) or b"")
                    assert header(letter_headers, DLQ_SOURCE_SERVICE) == b"placement"
                    [letter] = log.events[inventory_dlq]
                    assert letter.id == rejected.registration_id  # the registration, byte for byte

                    # 2. A 1g.10gb job runs as a process on the MIG device its grant names; whole GPUs
                    #    on the H100 node are granted as before.
                    mig_job = request_bytes(
                        "slice",
                        queue="default",
                        workers=1,
                        gpus_per_worker=0,
                        mig_profile="1g.10gb",
                        gpu_type="A100-SXM4-80GB",
                        command=list(PRINT_DEVICES),
                    )
                    whole_job = request_bytes(
                        "whole",
                        queue="default",
                        workers=1,
                        gpus_per_worker=8,
                        gpu_type="H100-80GB-HBM3",
                        duration_hint_s=10,
                    )
                    await send_raw(
                        kafka_bootstrap, topics.requests, [("slice", mig_job), ("whole", whole_job)]
                    )

                    def completed(job: str) -> bool:
                        return any(c.job_id == job for c in log.of(topics.events, JobCompleted))

                    await log.until(
                        lambda: completed("slice") and completed("whole"), timeout_s=90, check=tasks.check
                    )
                    grants = {g.job_id: g for g in log.of(topics.allocations, AllocationGranted)}
                    [slot] = grants["slice"].placements
                    assert slot.node == "mig-0" and slot.mig is not None
                    carved = {
                        (g.id, m.instance_id, m.compute_instance_id): m
                        for g in registered["mig-0"].gpus
                        for m in g.mig_instances
                    }
                    instance = carved[(slot.mig.gpu, slot.mig.instance_id, slot.mig.compute_instance_id)]
                    assert (instance.profile, instance.placement_start) == ("1g.10gb", slot.mig.start)
                    assert instance.uuid.startswith("MIG-")
                    [started] = [s for s in log.of(topics.events, JobStarted) if s.job_id == "slice"]
                    assert started.allocation_id == grants["slice"].allocation_id
                    [rank_log] = sorted((tmp_path / "mig-0" / "logs").glob("slice-a*-r0.log"))
                    assert f"devices {instance.uuid}" in rank_log.read_text()

                    assert {p.node for p in grants["whole"].placements} == {"h100-0"}
                    assert "a30-0" not in {p.node for g in grants.values() for p in g.placements}
        finally:
            for agent in agents:
                await agent.stop()
            await tasks.stop()
