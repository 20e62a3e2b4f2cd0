"""How a replay orders a service's recorded transactions: run after run, each run by its positions."""

from __future__ import annotations

from gangline.bus.positions import INCARNATION_HEADER, INPUTS_HEADER
from gangline.replay.log import LogRecord
from services.common.replay import group_transactions


def output(offset: int, run: str, inputs: str, at_ms: int) -> LogRecord:
    envelope = {"id": f"o{offset}", "source": "gangline/placement", "type": "gangline.job.pending.v1"}
    headers = {INCARNATION_HEADER: run, INPUTS_HEADER: inputs}
    return LogRecord("jobs.events", 0, offset, "j", envelope, headers, at_ms)


def test_a_later_run_that_has_not_read_every_topic_yet_comes_after_the_run_before_it() -> None:
    # Run a read the requests (their positions are in its sums); run b, after a restart, has read none
    # yet: its first positions add up to less than a's last ones.
    records = [
        output(0, "a", "jobs.events:0:10,jobs.requests:0:50", 1_000),
        output(1, "a", "jobs.events:0:20,jobs.requests:0:60", 2_000),
        output(2, "b", "jobs.events:0:30", 3_000),
        output(3, "b", "jobs.events:0:40,jobs.requests:0:61", 4_000),
        output(4, "b", "jobs.events:0:45", 3_500),  # a transaction of b's written in between: by position
    ]
    transactions, unstamped = group_transactions(
        records, source="gangline/placement", output_topics=["jobs.events"]
    )
    assert unstamped == []
    assert [(t.incarnation, [r.offset for r in t.outputs]) for t in transactions] == [
        ("a", [0]),
        ("a", [1]),
        ("b", [2]),
        ("b", [4]),
        ("b", [3]),
    ]
