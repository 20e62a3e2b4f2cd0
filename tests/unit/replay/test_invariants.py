"""The invariant checker over hand-made logs: a clean history passes; each violation is counted and named."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gangline.replay.invariants import Fault, Kill, causal_order, check_log
from gangline.replay.log import LogRecord


class Log:
    """A log written by hand: each record gets the next offset of its partition and the next millisecond."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []
        self.offsets: dict[tuple[str, int], int] = {}
        self.now = 1_000

    def add(
        self,
        topic: str,
        kind: str,
        data: dict[str, Any],
        *,
        partition: int = 0,
        source: str = "gangline/test",
        at: int | None = None,
    ) -> LogRecord:
        self.now = at if at is not None else self.now + 1
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = offset + 1
        envelope = {
            "id": f"e{len(self.records)}",
            "type": f"gangline.{kind}.v1",
            "source": source,
            "data": data,
        }
        record = LogRecord(topic, partition, offset, data.get("job_id"), envelope, {}, self.now)
        self.records.append(record)
        return record

    def request(self, job: str, workers: int = 1, **more: Any) -> None:
        self.add("jobs.requests", "job.requested", {"job_id": job, "workers": workers, **more})

    def event(self, job: str, kind: str, **more: Any) -> None:
        self.add("jobs.events", f"job.{kind}", {"job_id": job, **more})

    def grant(
        self, job: str, alloc: str, *ranks: tuple[str, list[str]], partition: int = 0, **how: Any
    ) -> None:
        placements = [{"rank": k, "node": node, "gpus": gpus, **how} for k, (node, gpus) in enumerate(ranks)]
        self.add(
            "allocations.log",
            "allocation.granted",
            {"job_id": job, "allocation_id": alloc, "placements": placements},
            partition=partition,
            source="gangline/placement",
        )

    def release(self, job: str, alloc: str, reason: str = "completed", partition: int = 0) -> None:
        self.add(
            "allocations.log",
            "allocation.released",
            {"job_id": job, "allocation_id": alloc, "reason": reason},
            partition=partition,
            source="gangline/placement",
        )

    def run(self, job: str, alloc: str, *ranks: tuple[str, list[str]], workers: int = 1) -> None:
        """A whole clean life: requested, admitted, placed, started, completed, released."""
        self.request(job, workers)
        self.event(job, "admitted")
        self.grant(job, alloc, *ranks)
        self.event(job, "started", allocation_id=alloc)
        self.event(job, "completed", allocation_id=alloc)
        self.release(job, alloc)


def test_a_clean_history_has_no_violation_and_counts_what_happened() -> None:
    log = Log()
    log.run("a", "a.1", ("n0", ["g0", "g1"]))
    log.run("b", "b.1", ("n0", ["g0"]), ("n1", ["g0"]), workers=2)  # g0 of n0 again: a was released
    log.request("c")
    log.event("c", "rejected", code="unknown_queue", reason="no such queue")
    log.request("d")
    log.event("d", "admitted")
    log.event("d", "pending", reasons=[{"code": "fragmentation"}])
    summary = check_log(log.records)
    assert summary.ok, summary.problems
    assert summary.violations == dict.fromkeys(
        ("lost", "duplicated_grants", "gpus_double_held", "partial_gangs", "stuck"), 0
    )
    figures = summary.to_json()
    assert (figures["offered"], figures["admitted"], figures["rejected"]) == (4, 3, 1)
    assert (figures["granted"], figures["completed"], figures["waiting"]) == (2, 2, 1)


def test_a_request_never_answered_is_lost() -> None:
    log = Log()
    log.run("a", "a.1", ("n0", ["g0"]))
    log.request("gone")
    summary = check_log(log.records)
    assert summary.violations["lost"] == 1
    assert "gone" in summary.problems[0].message


def test_an_allocation_granted_twice_and_a_job_granted_while_it_holds_gpus_are_duplicates() -> None:
    log = Log()
    log.request("a")
    log.event("a", "admitted")
    log.grant("a", "a.1", ("n0", ["g0"]))
    log.grant("a", "a.1", ("n0", ["g0"]))  # the same allocation again
    log.grant("a", "a.2", ("n1", ["g0"]))  # another allocation while a.1 is live
    log.event("a", "completed")
    summary = check_log(log.records)
    assert summary.violations["duplicated_grants"] == 2
    # A requeued job granted again after its release is no duplicate.
    log = Log()
    log.request("a")
    log.event("a", "admitted")
    log.grant("a", "a.1", ("n0", ["g0"]))
    log.release("a", "a.1", "node_failed")
    log.event("a", "requeued", attempt=2)
    log.grant("a", "a.2", ("n1", ["g0"]))
    log.event("a", "completed")
    log.release("a", "a.2")
    summary = check_log(log.records)
    assert summary.ok, summary.problems
    assert summary.requeued == 1


def test_a_gpu_granted_while_another_allocation_holds_it_is_double_held() -> None:
    log = Log()
    log.run("a", "a.1", ("n0", ["g0"]))
    log.request("b")
    log.event("b", "admitted")
    log.grant("b", "b.1", ("n0", ["g1", "g2"]))
    log.request("c")
    log.event("c", "admitted")
    log.grant("c", "c.1", ("n0", ["g2"]))  # g2 is b's
    log.event("b", "completed")
    log.event("c", "completed")
    summary = check_log(log.records)
    assert summary.violations == {
        "lost": 0,
        "duplicated_grants": 0,
        "gpus_double_held": 1,
        "partial_gangs": 0,
        "stuck": 0,
    }
    assert "n0/g2" in summary.problems[0].message


def test_shared_slots_may_share_a_gpu_up_to_a_whole_one() -> None:
    log = Log()
    for job, milli in (("a", 500), ("b", 500), ("c", 250)):
        log.request(job)
        log.event(job, "admitted")
        log.grant(job, f"{job}.1", ("n0", ["g0"]), gpu_fraction_milli=milli)
        log.event(job, "completed")
    summary = check_log(log.records)
    assert summary.violations["gpus_double_held"] == 1  # c: 1,250 milli on g0
    assert "c.1" in summary.problems[0].message


def test_a_gang_short_of_its_workers_or_with_bad_ranks_is_partial() -> None:
    log = Log()
    log.request("a", workers=4)
    log.event("a", "admitted")
    log.grant("a", "a.1", ("n0", ["g0"]), ("n0", ["g1"]))  # 2 of 4 workers
    log.event("a", "completed")
    log.request("b", workers=2)
    log.event("b", "admitted")
    log.add(
        "allocations.log",
        "allocation.granted",
        {
            "job_id": "b",
            "allocation_id": "b.1",
            "placements": [{"rank": 0, "node": "n1", "gpus": ["g0"]}] * 2,
        },
    )
    log.event("b", "completed")
    log.request("e", workers=4, min_workers=2)  # elastic: 2 of 4 is a whole gang
    log.event("e", "admitted")
    log.grant("e", "e.1", ("n2", ["g0"]), ("n2", ["g1"]))
    log.event("e", "completed")
    summary = check_log(log.records)
    assert summary.violations["partial_gangs"] == 2
    assert [p.message.split()[0] for p in summary.problems] == ["a.1", "b.1"]


def test_a_job_neither_finished_nor_waiting_with_a_reason_is_stuck() -> None:
    log = Log()
    log.request("queued")
    log.event("queued", "admitted")
    log.event("queued", "queued", queue="team")
    log.request("running")
    log.event("running", "admitted")
    log.grant("running", "r.1", ("n0", ["g0"]))
    log.event("running", "started", allocation_id="r.1")
    log.request("waits")
    log.event("waits", "admitted")
    log.event("waits", "pending", reasons=[{"code": "quota"}])
    summary = check_log(log.records)
    assert summary.violations["stuck"] == 2
    assert sorted(p.message.split()[0] for p in summary.problems) == ["queued", "running"]
    assert "holding ['r.1']" in next(p.message for p in summary.problems if p.message.startswith("running"))


def test_partitions_merge_by_time_and_a_release_goes_before_a_grant_at_the_same_instant() -> None:
    log = Log()
    log.request("a")
    log.event("a", "admitted")
    log.grant("a", "a.1", ("n0", ["g0"]), partition=0)
    log.request("b")
    log.event("b", "admitted")
    # b's grant (partition 1) and a's release (partition 0) in the same millisecond: the release first.
    log.grant("b", "b.1", ("n0", ["g0"]), partition=1)
    log.release("a", "a.1", partition=0)
    release, grant = log.records[-1], log.records[-2]
    log.records[-1] = replace(release, timestamp_ms=grant.timestamp_ms)
    log.event("a", "completed")
    log.event("b", "completed")
    ordered = list(causal_order(log.records))
    assert ordered.index(log.records[-3]) < ordered.index(grant)
    assert check_log(log.records).ok
    # A second later instead, the grant takes a GPU still held.
    log.records[-3] = replace(release, timestamp_ms=(grant.timestamp_ms or 0) + 1000)
    assert check_log(log.records).violations["gpus_double_held"] == 1


def test_recovery_per_kill_and_per_node_fault() -> None:
    log = Log()
    log.request("a")
    log.event("a", "admitted")
    log.grant("a", "a.1", ("n0", ["g0"]))  # at 1003
    log.release("a", "a.1", "node_failed")
    log.records[-1] = replace(log.records[-1], timestamp_ms=4_000)
    log.add("jobs.events", "job.requeued", {"job_id": "a", "attempt": 2}, at=4_001)
    log.add(
        "allocations.log",
        "allocation.granted",
        {"job_id": "a", "allocation_id": "a.2", "placements": [{"rank": 0, "node": "n1", "gpus": ["g0"]}]},
        source="gangline/placement",
        at=5_500,
    )
    log.add("jobs.events", "job.completed", {"job_id": "a"}, at=6_000)
    kills = [
        Kill("placement", at_ms=3_000, sources=("gangline/placement",), ready_ms=4_500),
        Kill("broker", at_ms=3_500),
    ]
    summary = check_log(log.records, kills=kills, faults=[Fault("n0", "silent", at_ms=2_000)])
    assert summary.ok, summary.problems
    assert summary.recovery == [
        {"killed": "placement", "at_ms": 3_000, "ready_s": 1.5, "first_output_s": 1.0},
        {"killed": "broker", "at_ms": 3_500, "ready_s": None, "first_output_s": 0.5},
    ]
    assert summary.faults == [
        {
            "node": "n0",
            "kind": "silent",
            "at_ms": 2_000,
            "allocations": 1,
            "released": 1,
            "released_after_s": 2.0,
            "granted_again": 1,
            "granted_again_after_s": 3.5,
        }
    ]


def test_topics_under_a_prefix() -> None:
    log = Log()
    log.request("a")
    prefixed = [replace(r, topic=f"p.{r.topic}") for r in log.records]
    assert check_log(prefixed, prefix="p.").violations["lost"] == 1
    assert check_log(prefixed).offered == 0


def test_a_job_that_ended_stays_ended_and_a_grant_after_its_end_is_a_duplicate() -> None:
    log = Log()
    log.run("a", "a.1", ("n0", ["g0"]))
    # A preemption that raced the completion still writes about the job: it is not stuck for that.
    log.event("a", "preempted", allocation_id="a.1")
    log.event("a", "requeued", attempt=2)
    log.release("a", "a.1", "preempted")
    summary = check_log(log.records)
    assert summary.ok, summary.problems
    assert (summary.after_final, summary.released_again, summary.completed) == (2, 1, 1)
    # Run again after its end: a duplicate.
    log.grant("a", "a.2", ("n1", ["g0"]))
    log.release("a", "a.2")
    summary = check_log(log.records)
    assert summary.violations["duplicated_grants"] == 1
    assert "after it completed" in summary.problems[0].message


def test_an_xid_counts_only_the_allocations_on_its_gpu() -> None:
    log = Log()
    for job, gpu in (("a", "g0"), ("b", "g1")):
        log.request(job)
        log.event(job, "admitted")
        log.grant(job, f"{job}.1", ("n0", [gpu]))
    log.release("a", "a.1", "node_failed")
    log.event("a", "requeued", attempt=2)
    log.grant("a", "a.2", ("n1", ["g0"]))
    for job in ("a", "b"):
        log.event(job, "completed")
    at = log.records[5].timestamp_ms or 0  # b's grant: both run on n0 then
    [fault] = check_log(log.records, faults=[Fault("n0", "xid", at_ms=at, gpu="g0")]).faults
    assert (fault["gpu"], fault["allocations"], fault["released"], fault["granted_again"]) == ("g0", 1, 1, 1)
