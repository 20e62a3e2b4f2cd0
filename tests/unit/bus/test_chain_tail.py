"""Reading the chain's tail at start: only a record that continues its chain is its head; a forged one is
skipped, never a crash nor a fork."""

from __future__ import annotations

import json

from aiokafka import TopicPartition

from gangline.bus.chain import ChainKey, _note
from gangline.events.chain import GENESIS, HASH_HEADER, PREV_HEADER, SEQ_HEADER, ChainWriter
from gangline.replay.chain import verify_chain
from gangline.replay.log import LogRecord

TP = TopicPartition("allocations.log", 0)
KEY: ChainKey = ("allocations.log", 0, "gangline/placement")


def envelope(n: int) -> dict[str, object]:
    return {"id": f"e{n}", "source": "gangline/placement", "type": "gangline.allocation.released.v1"}


def chained(count: int) -> list[tuple[list[tuple[str, bytes]], bytes]]:
    """``count`` records of one writer's chain: (headers, value)."""
    writer = ChainWriter()
    out = []
    for n in range(count):
        body = envelope(n)
        headers = writer.headers_for(body)
        out.append(([(k, v.encode()) for k, v in headers.items()], json.dumps(body).encode()))
    return out


def heads(records: list[tuple[list[tuple[str, bytes]], bytes]]) -> dict[ChainKey, dict[str, str]]:
    last: dict[ChainKey, dict[str, str]] = {}
    for headers, value in records:
        _note(last, TP, headers, value)
    return last


def test_the_last_record_of_a_chain_is_its_head() -> None:
    records = chained(3)
    assert heads(records) == {KEY: {k: v.decode() for k, v in records[-1][0]}}
    # Reading on from a head noted before: the next record continues it.
    last: dict[ChainKey, dict[str, str]] = {}
    head = heads(records[:2])[KEY]
    _note(last, TP, *records[2], known={KEY: (2, head[HASH_HEADER])})
    assert last[KEY][SEQ_HEADER] == "2"
    stale: dict[ChainKey, dict[str, str]] = {}
    _note(stale, TP, *records[2], known={KEY: (5, GENESIS)})
    assert stale == {}


def test_a_forged_record_at_the_tail_is_not_the_head_and_the_chain_goes_on_unforked() -> None:
    records = chained(2)
    good = {k: v.decode() for k, v in records[-1][0]}
    body = envelope(9)
    forgeries = [
        {**good, SEQ_HEADER: "not-a-number"},
        {**good, SEQ_HEADER: "2", PREV_HEADER: good[HASH_HEADER], HASH_HEADER: "00" * 32},  # hash wrong
        {**good, SEQ_HEADER: "7"},  # does not follow
        {**good, SEQ_HEADER: "2", PREV_HEADER: "zz"},
    ]
    for forged in forgeries:
        tail = [*records, ([(k, v.encode()) for k, v in forged.items()], json.dumps(body).encode())]
        assert heads(tail) == {KEY: good}, forged
    # The writer resumes from the real head: its next record links to it, and the chain verifies but
    # for the forgery itself.
    writer = ChainWriter.resume(heads([*records, tail[-1]])[KEY])
    after = writer.headers_for(envelope(2))
    log = [
        LogRecord("allocations.log", 0, n, None, envelope(n), {k: v.decode() for k, v in h}, None)
        for n, (h, _) in enumerate(records)
    ]
    log.append(LogRecord("allocations.log", 0, 2, None, body, forgeries[0], None))
    log.append(LogRecord("allocations.log", 0, 3, None, envelope(2), after, None))
    report = verify_chain(log)
    assert [p.kind for p in report.problems] == ["tampered"]
    assert report.heads["allocations.log[0]/gangline/placement"] == (2, after[HASH_HEADER])


def test_json_nested_10000_deep_is_skipped_not_a_recursion_error() -> None:
    headers = chained(1)[0][0]
    last: dict[ChainKey, dict[str, str]] = {}
    for value in (b"[" * 10_000 + b"]" * 10_000, b"not json", b"[1]"):
        _note(last, TP, headers, value)
    assert last == {}
