"""The hash chain's hash of a record is the same whether given the envelope or the codec's bytes of it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from gangline.events.allocations import AllocationGranted, Placement
from gangline.events.base import make_envelope
from gangline.events.chain import GENESIS, ChainWriter, chain_hash
from gangline.events.codec import encode


def test_the_codecs_bytes_hash_as_the_envelope_they_encode() -> None:
    granted = AllocationGranted(
        job_id="j1",
        allocation_id="j1-a1",
        queue="default",
        placements=(Placement(rank=0, node="n0", gpus=("gpu0",)),),
    )
    value = encode(
        make_envelope(
            granted, event_id="e1", source="gangline/placement", time=datetime(2026, 1, 1, tzinfo=UTC)
        )
    )
    body = json.loads(value)
    assert chain_hash(GENESIS, 3, value) == chain_hash(GENESIS, 3, body)
    by_bytes, by_object = ChainWriter(), ChainWriter()
    assert [by_bytes.headers_for(value) for _ in range(2)] == [by_object.headers_for(body) for _ in range(2)]
