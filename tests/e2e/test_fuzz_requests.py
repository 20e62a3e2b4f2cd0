"""A bounded slice of the jobs.requests fuzz (the full run, with the API's, is ``make fuzz``): a few hundred
schema-derived and mutated records sent to the services running as processes over the real broker; every
one is answered, no service exits, and valid jobs sent after them are granted."""

from __future__ import annotations

from pathlib import Path

from e2e.fuzz_requests import fuzz_requests

INPUTS = 300
SEED = 20261202


async def test_every_fuzzed_request_is_answered_and_valid_jobs_are_granted_after(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    figures = await fuzz_requests(kafka_bootstrap, inputs=INPUTS, seed=SEED, workdir=tmp_path, bases=20)
    summary = figures.summary()
    assert figures.inputs == INPUTS, summary
    assert figures.unanswered == 0, summary
    assert figures.decoder_crashes == {}, summary
    assert figures.service_restarts == 0, summary
    assert figures.valid_after_granted == figures.valid_after_sent > 0, summary
    # Each way of answering was seen: dead letters (undecodable), rejections (decodable, refused), and
    # admissions (the schema-derived requests pinned to what the cluster can run).
    assert {"dead_letter", "rejected", "admitted"} <= set(figures.answered), summary
    assert sum(figures.answered.values()) == INPUTS, summary


def test_inputs_sharing_an_event_id_each_need_an_answer_of_their_own() -> None:
    """Two records a mutation left with one id, and one answer naming it: one of them is unanswered."""
    from types import SimpleNamespace

    from e2e.fuzz_requests import Sent, _Answers

    sent = [Sent("a", 0, 1, "same"), Sent("b", 0, 2, "same"), Sent("c", 1, 3, None), Sent("d", 1, 4, "x")]
    reader = SimpleNamespace(
        letters={(1, 3): ("undecodable", "not JSON")}, by_cause={"same": [("admitted", "", "")]}
    )
    answers = _Answers.answers(reader, sent)  # type: ignore[arg-type]
    assert answers == [("admitted", "", ""), None, ("dead_letter", "undecodable", "not JSON"), None]
    reader.by_cause["same"].append(("rejected", "duplicate_event_id", "seen before"))
    assert _Answers.answers(reader, sent)[1] == ("rejected", "duplicate_event_id", "seen before")  # type: ignore[arg-type]
