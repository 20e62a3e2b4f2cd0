"""Operators' cordons in the core: when a drain sends work away, and the run bound backfill plans with."""

from __future__ import annotations

from gangline.core.cordon import Cordon
from gangline.core.model import Job, JobId, QueueName, Seconds


def test_a_drain_evicts_once_its_grace_has_passed_and_a_cordon_never_does() -> None:
    drain = Cordon(mode="drain", since=100.0, drain_grace_s=60.0)
    assert drain.evicts_at == 160.0
    assert not drain.evicts(159.9)
    assert drain.evicts(160.0) and drain.evicts(1e9)
    cordon = Cordon(mode="cordon", since=100.0)
    assert cordon.evicts_at is None and not cordon.evicts(1e9)
    assert Cordon(mode="drain", since=5.0, drain_grace_s=0.0).evicts(5.0)


def job(hint: int | None, limit: int | None) -> Job:
    return Job(
        id=JobId("j"),
        queue=QueueName("q"),
        workers=1,
        duration_hint_s=Seconds(hint) if hint is not None else None,
        time_limit_s=Seconds(limit) if limit is not None else None,
    )


def test_the_run_bound_is_the_smaller_of_the_limit_and_the_hint() -> None:
    assert job(None, None).run_bound_s is None
    assert job(300, None).run_bound_s == 300  # only an estimate
    assert job(None, 600).run_bound_s == 600  # the limit: the job is stopped there
    assert job(300, 600).run_bound_s == 300  # ends earlier than its limit, as its submitter expects
    assert job(900, 600).run_bound_s == 600  # cannot run past the limit, whatever the hint says
