"""Two placement replicas, one pool each, deciding at once; kill -9 one and the other takes its pool over;
start it again and it gets its pool back.

The cluster (deploy/clusters/pools.yaml) has two pools, one per spine. Quota routes each job to one pool
(its ``job.routed`` names the pool; every later record of the job is on the pool's partition). Replica
p0 leads pool spine-a (partition 0) and stands by for spine-b, p1 the other way round. Before the kill
both pools are granted by their own replicas in the same stretch of time; after it p1's standby seat
takes spine-a's lock, restores spine-a from its partitions and grants the rest. Every job is granted
exactly once, on nodes of the pool it was routed to, on that pool's partition, no GPU is ever held
twice, and every decision replays identical per pool. Then p0 is started again: its seat claims spine-a's
lock as the pool's home, p1's seat hands it over and stands by again, and p0 grants the last jobs of
spine-a, each once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from e2e.harness import (
    ROOT,
    LogReader,
    Proc,
    Tasks,
    audit_allocations,
    fake_cluster,
    placement_replica,
    placement_requests,
    private_topics,
    send_raw,
    service_env,
    start_cluster,
)
from gangline.bus.positions import INCARNATION_HEADER
from gangline.cluster_spec import load_cluster_spec
from gangline.core.pools import PoolLayout
from gangline.events.allocations import AllocationGranted
from gangline.events.jobs import JobRouted
from gangline.replay.kafka import KafkaSource
from gangline.replay.log import write_jsonl
from services.common.replay import decider_topics
from services.common.topics import TopicNames
from services.placement.replay import replay_placement
from services.quota.replay import replay_quota
from services.quota.settings import QuotaSettings
from services.tools.cli import main as gangline_main

JOBS = 120
BACK_JOBS = 40
"""Sent once the killed replica is back and has its pool again."""
POOLS = "spine=spine-a,spine-b"
STANDBY_DELAY_S = "10"
"""Each replica stands by for the other's pool only this long after its start, so that the other, started
at the same time but slower to import on a loaded machine, takes its own pool first (else it would be
handed back to it a moment later: the test counts each pool's owners)."""


def logged_at(proc: Proc, message: str, contains: str) -> list[float]:
    """The times (epoch seconds) of ``proc``'s JSON log lines with ``message`` whose text has ``contains``."""
    times = []
    for line in proc.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and contains in line:
            entry = json.loads(line)
            if entry.get("message") == message:
                times.append(datetime.fromisoformat(entry["time"]).timestamp())
    return times


async def standing_by(proc: Proc, pool: str, *, timeout_s: float = 60) -> None:
    """Wait until ``proc``'s seat of ``pool`` (not its own) waits for the pool's lock: a standby in place."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not logged_at(proc, "pool seat waiting for its lock", f'"pool": "{pool}"'):
        assert loop.time() < deadline, f"{proc.log_path.name}: no standby seat for {pool}"
        assert proc.alive()
        await asyncio.sleep(0.2)


def processor_started(proc: Proc, pool: str) -> bool:
    """Whether ``proc``'s log says its seat of ``pool`` started deciding (its transactional id names it)."""
    return f"placement.pool-{pool}.leader" in "".join(
        line for line in proc.log_path.read_text(errors="replace").splitlines() if "processor started" in line
    )


async def test_two_pools_decide_at_once_and_a_killed_pools_owner_is_replaced(
    kafka_bootstrap: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    jobs = placement_requests("pl", JOBS + BACK_JOBS, seed=11, workers=(1, 2), gpus_per_worker=(1, 2, 4, 8))
    spec = load_cluster_spec(ROOT / "deploy" / "clusters" / "pools.yaml")
    pool_of_node = {r.node: r.spine for r in spec.registrations()}
    async with private_topics(kafka_bootstrap, "pools") as topics:
        # Snapshots every few events: the new owner of spine-a loads the pool's latest and reads the tail.
        env = service_env(
            kafka_bootstrap,
            topics,
            pools=POOLS,
            pool_standby_delay_s=STANDBY_DELAY_S,
            snapshot_every_events="5",
        )
        replicas = [
            placement_replica(env, f"p{k}", tmp_path / f"placement-{k}.log", pool=pool)
            for k, pool in enumerate(("spine-a", "spine-b"))
        ]
        cluster = fake_cluster(kafka_bootstrap, topics, spec, time_scale=0.2, heartbeat_s=0.5)
        tasks = Tasks()
        try:
            await start_cluster(tasks, cluster, env, only=("admission", "quota"))
            for proc in replicas:
                proc.start()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            while not all(
                processor_started(p, pool) for p, pool in zip(replicas, ("spine-a", "spine-b"), strict=True)
            ):
                assert loop.time() < deadline, "the replicas did not both start deciding their pools"
                assert all(p.alive() for p in replicas)
                await asyncio.sleep(0.2)
            # A steady stream for a few seconds, so each pool has work all along, not one burst.
            for k in range(0, JOBS // 2, 10):
                await send_raw(kafka_bootstrap, topics.requests, jobs[k : k + 10])
                await asyncio.sleep(0.7)
            async with LogReader(kafka_bootstrap, [topics.allocations, topics.events]) as log:

                def grants() -> list[tuple[int, int, AllocationGranted, bytes | None]]:
                    """(partition, record time ms, grant, the writer's incarnation) per grant read."""
                    out = []
                    for partition, (ms, env_), headers in zip(
                        log.partitions[topics.allocations],
                        log.stamped[topics.allocations],
                        log.headers[topics.allocations],
                        strict=True,
                    ):
                        if isinstance(env_.data, AllocationGranted):
                            out.append((partition, ms, env_.data, dict(headers).get(INCARNATION_HEADER)))
                    return out

                def granted() -> set[str]:
                    return {g.job_id for _, _, g, _ in grants()}

                def per_pool(rows: list[tuple[int, int, AllocationGranted, bytes | None]]) -> dict[int, int]:
                    return {p: sum(1 for q, *_ in rows if q == p) for p in (0, 1)}

                await log.until(
                    lambda: min(per_pool(grants()).values()) >= JOBS // 8, timeout_s=120, check=tasks.check
                )
                before = grants()
                # Each replica decides its own pool, and only it: its seat of the other waits for the lock.
                assert processor_started(replicas[0], "spine-a") and not processor_started(
                    replicas[0], "spine-b"
                )
                assert processor_started(replicas[1], "spine-b") and not processor_started(
                    replicas[1], "spine-a"
                )
                spans = {
                    p: (min(ms for q, ms, *_ in before if q == p), max(ms for q, ms, *_ in before if q == p))
                    for p in (0, 1)
                }
                overlap_ms = min(spans[0][1], spans[1][1]) - max(spans[0][0], spans[1][0])
                assert overlap_ms > 0, f"the two pools were not decided at once: {spans}"

                await standing_by(replicas[1], "spine-a")
                killed_at = time.time()
                replicas[0].kill9()
                await send_raw(kafka_bootstrap, topics.requests, jobs[JOBS // 2 : JOBS])
                await log.until(
                    lambda: any(q == 0 and ms / 1000 > killed_at for q, ms, *_ in grants()),
                    timeout_s=120,
                    check=tasks.check,
                )
                first_after = min(ms for q, ms, *_ in grants() if q == 0 and ms / 1000 > killed_at) / 1000
                await log.until(lambda: len(granted()) == JOBS, timeout_s=180, check=tasks.check)
                assert processor_started(replicas[1], "spine-a"), "p1 did not take spine-a over"
                # p1 loaded one snapshot: spine-a's, written by p0, at the takeover (spine-b had none).
                loaded = replicas[1].log_path.read_text().count("state loaded from a snapshot")
                assert loaded == 1, loaded
                [took_over] = logged_at(replicas[1], "processor started", "placement.pool-spine-a.leader")

                # p0 back: spine-a's lock goes home, p1's seat of it stands by again.
                back_at = time.time()
                back = placement_replica(env, "p0", tmp_path / "placement-0-back.log", pool="spine-a")
                replicas.append(back)
                back.start()
                deadline = loop.time() + 120
                while not (
                    processor_started(back, "spine-a")
                    and logged_at(replicas[1], "pool seat gave its lock up", '"pool": "spine-a"')
                ):
                    assert loop.time() < deadline, "spine-a was not handed back to p0"
                    assert back.alive() and replicas[1].alive()
                    await asyncio.sleep(0.2)
                [handed_back] = logged_at(back, "processor started", "placement.pool-spine-a.leader")
                # The pool is undecided from its holder giving it up until its home decides: the home restored
                # before it claimed the lock, so that is the fence and the short tail, not the restore.
                [lock_moved] = logged_at(replicas[1], "leadership lost", '"member": "p1"')
                [home_locked] = logged_at(back, "leadership acquired", '"member": "p0"')
                [home_restored] = logged_at(back, "state restored from the log", '"warm": true')
                # Its seat of spine-b waits out the standby delay: the first snapshot loaded is spine-a's.
                assert min(logged_at(back, "state loaded from a snapshot", "")) < home_locked
                assert replicas[1].alive() and processor_started(replicas[1], "spine-b")
                await send_raw(kafka_bootstrap, topics.requests, jobs[JOBS:])
                await log.until(lambda: len(granted()) == JOBS + BACK_JOBS, timeout_s=180, check=tasks.check)
                for _ in range(10):
                    await log.poll()
                # p1 stands by for spine-a again, and decides nothing there any more.
                assert (
                    logged_at(replicas[1], "pool seat waiting for its lock", '"pool": "spine-a"')[-1]
                    > back_at
                )

            every = grants()
            per_job: dict[str, int] = {}
            for _, _, g, _ in every:
                per_job[g.job_id] = per_job.get(g.job_id, 0) + 1
            assert [j for j, n in per_job.items() if n != 1] == []
            assert set(per_job) == {job for job, _ in jobs}
            # spine-a's grants after the hand-back are p0's again (its new incarnation's), none p1's.
            after_back = [inc for q, ms, _, inc in every if q == 0 and ms / 1000 > handed_back]
            assert after_back and len(set(after_back)) == 1, after_back
            assert set(after_back) != {
                inc for q, ms, _, inc in every if q == 0 and took_over < ms / 1000 < back_at
            }
            assert audit_allocations(log.stamped[topics.allocations]) == []
            # Each grant is on its pool's partition, on nodes of the pool quota routed the job to.
            routed = {
                e.data.job_id: e.data.pool for e in log.events[topics.events] if isinstance(e.data, JobRouted)
            }
            pools = ("spine-a", "spine-b")
            for partition, _, g, _ in every:
                assert {pool_of_node[p.node] for p in g.placements} == {pools[partition]}, g
                assert routed[g.job_id] == pools[partition]
            writers = {p: {inc for q, _, _, inc in every if q == p} for p in (0, 1)}
            assert len(writers[0]) == 3, writers  # p0's seat, p1's after the kill, p0's again
            assert len(writers[1]) == 1, writers
            figures = {
                "jobs": JOBS,
                "granted_before_kill": per_pool(before),
                "granted_total": per_pool(every),
                "both_pools_deciding_overlap_s": round(overlap_ms / 1000, 2),
                "kill_to_new_owner_processing_s": round(took_over - killed_at, 2),
                "kill_to_first_pool_a_grant_s": round(first_after - killed_at, 2),
                "restart_to_handed_back_processing_s": round(handed_back - back_at, 2),
                "hand_back_undecided_s": round(handed_back - lock_moved, 2),
                "home_lock_to_processing_s": round(handed_back - home_locked, 2),
                "home_restored_to_processing_s": round(handed_back - home_restored, 2),
                "granted_after_hand_back": len(after_back),
                "duplicated": 0,
                "lost": JOBS + BACK_JOBS - len(per_job),
            }
        finally:
            for proc in replicas:
                proc.terminate()
            await tasks.stop()
        records = await KafkaSource(kafka_bootstrap).fetch(decider_topics(topics.prefix))

    # Every decision replays identical per pool: each pool's two owners are two runs of one pool's log.
    layout = PoolLayout.parse(POOLS)
    names = TopicNames(prefix=topics.prefix)
    placement = replay_placement(records, topics=names, pools=layout)
    assert placement.ok, [d.message for d in placement.differences[:10]]
    written = [r for r in records if r.envelope.get("source") == "gangline/placement"]
    assert placement.compared == len(written) > 0
    assert placement.incarnations == 4  # spine-a: p0, then p1, then p0 again; spine-b: p1
    quota = replay_quota(records, QuotaSettings(topic_prefix=topics.prefix, pools=POOLS))
    assert quota.ok, [d.message for d in quota.differences[:10]]
    assert quota.compared > 0
    # A pool's log replayed as one placement reading every partition is not what was decided.
    assert not replay_placement(records, topics=names).ok
    # And `gangline replay --verify --decider all`, the pools from the environment.
    path = tmp_path / "log.jsonl"
    write_jsonl(records, path)
    monkeypatch.setenv("GANGLINE_POOLS", POOLS)
    capsys.readouterr()
    argv = ["replay", "--from", str(path), "--verify", "--decider", "all", "--prefix", topics.prefix]
    assert gangline_main(argv) == 0
    figures["replayed_placement_outputs"] = placement.compared
    figures["replayed_quota_outputs"] = quota.compared
    print(capsys.readouterr().out)
    print("pool failover:", json.dumps(figures))


async def test_a_pools_owner_frozen_past_its_lock_is_replaced_for_that_pool_and_fenced_when_it_resumes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A false failover of one pool (its owner frozen past the lock's session, as by a long GC pause):
    the other replica takes the pool over; the frozen one resumes, learns it lost, and exits, having
    committed nothing meanwhile (the pool's transactional id is the new owner's now)."""
    jobs = placement_requests("pz", JOBS, seed=13, workers=1, gpus_per_worker=(1, 2, 4, 8))
    spec = load_cluster_spec(ROOT / "deploy" / "clusters" / "pools.yaml")
    async with private_topics(kafka_bootstrap, "poolz") as topics:
        env = service_env(kafka_bootstrap, topics, pools=POOLS, pool_standby_delay_s=STANDBY_DELAY_S)
        old, new = (
            placement_replica(env, f"z{k}", tmp_path / f"z{k}.log", pool=pool)
            for k, pool in enumerate(("spine-a", "spine-b"))
        )
        cluster = fake_cluster(kafka_bootstrap, topics, spec, time_scale=0.2, heartbeat_s=0.5)
        tasks = Tasks()
        try:
            await start_cluster(tasks, cluster, env, only=("admission", "quota"))
            old.start()
            new.start()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            while not (processor_started(old, "spine-a") and processor_started(new, "spine-b")):
                assert loop.time() < deadline and old.alive() and new.alive()
                await asyncio.sleep(0.2)
            await send_raw(kafka_bootstrap, topics.requests, jobs[: JOBS // 2])
            async with LogReader(kafka_bootstrap, [topics.allocations]) as log:

                def granted() -> list[str]:
                    return [g.job_id for g in log.of(topics.allocations, AllocationGranted)]

                await log.until(lambda: len(granted()) >= JOBS // 4, timeout_s=90, check=tasks.check)
                await standing_by(new, "spine-a")
                assert old.proc is not None
                old.proc.send_signal(signal.SIGSTOP)  # frozen mid-work, its pool's lock and transaction open
                try:
                    deadline = loop.time() + 60
                    while not processor_started(new, "spine-a"):
                        assert loop.time() < deadline, "the other replica did not take spine-a over"
                        await log.poll()
                    await send_raw(kafka_bootstrap, topics.requests, jobs[JOBS // 2 : JOBS])
                    await log.until(lambda: len(granted()) > JOBS // 2, timeout_s=90, check=tasks.check)
                finally:
                    old.proc.send_signal(signal.SIGCONT)
                await log.until(lambda: len(set(granted())) == JOBS, timeout_s=120, check=tasks.check)
                deadline = loop.time() + 60
                while old.alive() and loop.time() < deadline:
                    await log.poll()
                for _ in range(10):
                    await log.poll()
            assert not old.alive(), "the resumed old owner of spine-a did not stop"
            assert new.alive()
            assert sorted(granted()) == sorted(job for job, _ in jobs)  # each exactly once
            assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            for proc in (old, new):
                if proc.proc is not None and proc.alive():
                    proc.proc.send_signal(signal.SIGCONT)
                proc.terminate()
            await tasks.stop()
