"""One world, simulated and live: the services' simulator decides what the services decide over Kafka.

The world (:mod:`e2e.sim_world`: gangs, three queues with quotas and borrowing, a node failure, a
reclaim and a priority preemption) is run through :mod:`services.tools.simulate` and through the five
decision services with fake-nodes on the real broker, each input sent once the previous one's
consequences are in the log (so each is handled in a batch of its own). Both give the same grants
(job, allocation, ranks, nodes, GPUs), the same releases (allocation, reason) and the same pending
reasons (source and codes, in the order sent). The live run's log is then replayed (what
`gangline replay --verify` does per service): the decisions are reproduced (node_health aside, see below).

What is not compared, and why: event ids and times (the live clock; derived ids of heartbeat-caused
events name the heartbeat's sequence number), and the sentences and figures of pending reasons
(fair-share usage and GPU-hours lost are measured on the clock: they differ by how long each step
took live; a reason re-sent only because such a figure changed collapses into one).
"""

from __future__ import annotations

from pathlib import Path

from e2e.harness import (
    LogReader,
    Tasks,
    fake_cluster,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
    start_pipeline,
)
from e2e.sim_world import (
    CLUSTER,
    HEARTBEAT_S,
    QUEUES_YAML,
    SILENCE_S,
    TRACE_SLICE,
    failing_node,
    outcome,
    simulate_world,
)
from gangline.events.allocations import AllocationGranted
from gangline.events.base import Envelope
from gangline.events.jobs import JobPending
from gangline.events.types import NodeId
from gangline.replay.kafka import KafkaSource
from services.admission.replay import replay_admission
from services.admission.settings import AdmissionSettings
from services.common.replay import decider_topics
from services.common.topics import TopicNames
from services.placement.replay import replay_placement
from services.preemption.replay import replay_preemption
from services.preemption.settings import PreemptionSettings
from services.quota.replay import replay_quota
from services.quota.settings import QuotaSettings
from services.tools.simulate import request_of


async def test_the_simulator_decides_what_the_live_services_decide(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    simulated = simulate_world()
    expected = outcome(simulated.envelopes())
    assert {g[1] for g in expected.grants} >= {"b-1.2", "a-1.1", "c-2.1"}  # the world went as told
    assert {reason for _, reason in expected.releases} == {"node_failed", "preempted"}

    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(QUEUES_YAML, encoding="utf-8")
    jobs = {j.id: j for j in TRACE_SLICE}
    async with private_topics(kafka_bootstrap, "simlive") as topics:
        env = service_env(kafka_bootstrap, topics, queues_file=str(queues_file), silence_s=str(SILENCE_S))
        cluster = fake_cluster(kafka_bootstrap, topics, CLUSTER, heartbeat_s=HEARTBEAT_S)
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            watched = [topics.events, topics.allocations, topics.health]
            async with LogReader(kafka_bootstrap, watched) as log:

                def envelopes() -> list[Envelope]:
                    return [e for t in watched for e in log.events[t]]

                def granted(allocation: str) -> bool:
                    return any(
                        g.allocation_id == allocation for g in log.of(topics.allocations, AllocationGranted)
                    )

                def pending(job: str) -> bool:
                    return any(p.job_id == job for p in log.of(topics.events, JobPending))

                async def send(job_id: str) -> None:
                    data = request_of(jobs[job_id]).model_dump(mode="json", exclude_none=True)
                    del data["job_id"]
                    await send_raw(
                        kafka_bootstrap, topics.requests, [(job_id, request_bytes(job_id, **data))]
                    )

                async def until(done: object) -> None:
                    await log.until(done, timeout_s=90, check=tasks.check)  # type: ignore[arg-type]

                await send("c-1")
                await until(lambda: granted("c-1.1"))
                await send("b-1")
                await until(lambda: granted("b-1.1"))
                await cluster.fail_node(NodeId(failing_node(envelopes())))
                await until(lambda: granted("b-1.2"))
                await send("b-2")
                await until(lambda: granted("b-2.1"))
                await send("a-1")
                await until(lambda: granted("a-1.1") and pending("b-2"))
                await send("c-2")
                await until(lambda: granted("c-2.1") and pending("c-1"))
                await send("u-1")
                await until(lambda: pending("u-1"))
                quiet = 0
                while quiet < 3:  # read what the last step still caused: until three polls bring nothing
                    quiet = quiet + 1 if await log.poll() == 0 else 0
                live = outcome(envelopes())
        finally:
            await tasks.stop()
        records = await KafkaSource(kafka_bootstrap).fetch(decider_topics(topics.prefix))
    assert live.grants == expected.grants
    assert live.releases == expected.releases
    assert live.pending == expected.pending

    # And the replay of the live run's log reproduces every decision of admission, quota, placement and
    # preemption. node_health is left out: the live service folds the registrations again when its
    # consumer re-reads them after the restore, and a registration re-read after a node's heartbeats
    # sets the node's last heartbeat back (NodeHealthState.fold), so live it may declare a silent node
    # failed sooner than the replay (which folds those records in record-time order) finds it silent.
    prefix = topics.prefix
    settings = {"topic_prefix": prefix, "queues_file": queues_file}
    reports = [
        replay_admission(records, AdmissionSettings(**settings)),
        replay_quota(records, QuotaSettings(**settings)),
        replay_placement(records, topics=TopicNames(prefix=prefix), unlimited_queues=frozenset({"default"})),
        replay_preemption(records, PreemptionSettings(**settings)),
    ]
    for report in reports:
        assert report.ok, [d.message for d in report.differences[:10]]
        assert report.compared > 0, report.service
