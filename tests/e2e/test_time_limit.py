"""A job's time limit end to end: a real worker process on a node agent (NVML stand-in, real processes)
under the whole pipeline, stopped at its ``time_limit_s`` with the checkpoint signal first; it ends as
``job.failed`` code ``time_limit`` and placement releases its GPUs (``failed``)."""

from __future__ import annotations

import sys
from pathlib import Path

from e2e.harness import LogReader, Tasks, private_topics, request_bytes, send_raw, service_env, start_pipeline
from gangline.agent.node import NodeAgent
from gangline.agent.runner import ProcessRunner
from gangline.agent.settings import AgentTopics, NodeAgentSettings
from gangline.bus.producer import EventProducer
from gangline.events.allocations import AllocationReleased
from gangline.events.jobs import JobCheckpointed, JobCompleted, JobFailed, JobStarted, WorkerExited
from gangline.events.nodes import NodeRegistered
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn

WORKER = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def checkpoint(signum, frame):
    (out / "signalled").write_text(str(signum))
    ack = pathlib.Path(os.environ["GANGLINE_CHECKPOINT_ACK"])
    ack.parent.mkdir(parents=True, exist_ok=True)
    ack.touch()
    sys.exit(0)
signal.signal(signal.SIGTERM, checkpoint)
(out / "running").write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


async def test_a_job_at_its_time_limit_is_signalled_stopped_and_fails_with_time_limit(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    async with private_topics(kafka_bootstrap, "limit") as topics:
        env = service_env(kafka_bootstrap, topics)
        tasks = Tasks()
        agent: NodeAgent | None = None
        try:
            async with EventProducer(kafka_bootstrap, client_id="limit-node") as producer:
                settings = NodeAgentSettings(
                    node="lim-0",
                    leaf="leaf-a",
                    spine="spine-0",
                    checkpoint_root=tmp_path / "ckpt",
                    log_dir=tmp_path / "logs",
                    kafka_bootstrap=kafka_bootstrap,
                    topics=AgentTopics.prefixed(topics.prefix),
                    heartbeat_interval_s=0.5,
                    peer_address="127.0.0.1",
                )
                agent = NodeAgent(
                    settings,
                    nvml_api=NvmlStandIn(load_builtin_spec("dgx-h100", node="lim-0")),
                    runner=ProcessRunner(),
                    producer=producer,
                )
                await agent.start()
                # The node's registration on the log before the services start: each restores the
                # inventory before it reads a request (admission would refuse one for a cluster with no
                # node; the agent's registration is sent by its publish loop, after start() returns).
                async with LogReader(kafka_bootstrap, [topics.inventory]) as inventory:
                    await inventory.until(
                        lambda: bool(inventory.of(topics.inventory, NodeRegistered)), timeout_s=60
                    )
                start_pipeline(tasks, env)
                request = request_bytes(
                    "limited",
                    queue="default",
                    workers=1,
                    gpus_per_worker=1,
                    command=[sys.executable, str(script), str(out)],
                    duration_hint_s=3600,
                    time_limit_s=2,
                    checkpoint_grace_s=30,
                )
                await send_raw(kafka_bootstrap, topics.requests, [("limited", request)])
                async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:

                    def released() -> list[AllocationReleased]:
                        return [
                            r for r in log.of(topics.allocations, AllocationReleased) if r.job_id == "limited"
                        ]

                    await log.until(lambda: bool(released()), timeout_s=90, check=tasks.check)
                    [failed] = [f for f in log.of(topics.events, JobFailed) if f.job_id == "limited"]
                    assert failed.code == "time_limit" and "time limit of 2 s on lim-0" in failed.reason
                    assert [r.reason for r in released()] == ["failed"]
                    assert [s.job_id for s in log.of(topics.events, JobStarted)] == ["limited"]
                    assert [c.job_id for c in log.of(topics.events, JobCheckpointed)] == ["limited"]
                    assert log.of(topics.events, JobCompleted) == []
                    [exited] = log.of(topics.events, WorkerExited)
                    assert (exited.exit_code, exited.signal) == (0, None)  # it exited on the signal
                    kinds = [type(e.data) for e in log.events[topics.events] if e.subject == "limited"]
                    assert kinds.index(JobCheckpointed) < kinds.index(JobFailed)
                # The real process ran and got the checkpoint signal (SIGTERM) before it was stopped.
                assert (out / "running").exists() and (out / "signalled").read_text() == "15"
        finally:
            if agent is not None:
                await agent.stop()
            await tasks.stop()
