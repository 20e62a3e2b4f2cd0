"""The hash chain of ``allocations.log``, as its writers stamp it: three headers per record.

* ``gangline-chain-seq``  — the record's position in its chain, from 0, in decimal;
* ``gangline-chain-prev`` — the previous record's hash in the chain, hex (64 zeros for seq 0);
* ``gangline-chain-hash`` — hex SHA-256 of ``prev_hash (32 bytes) || seq (8 bytes, big-endian) ||
  canonical(envelope)`` (``gangline.events.codec.dumps``: the bytes ``encode`` puts on the wire).

A chain is one writer on one partition: ``(topic, partition, envelope source)``. :class:`ChainWriter`
is what a producer uses (``gangline.bus.chain`` stamps with it); ``gangline.replay.chain`` verifies.
It is part of the log's format, so it lives with the events, below both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from gangline.events.base import JsonObject
from gangline.events.codec import dumps

SEQ_HEADER = "gangline-chain-seq"
PREV_HEADER = "gangline-chain-prev"
HASH_HEADER = "gangline-chain-hash"
GENESIS = "0" * 64
CHAINED_TOPICS = ("allocations.log",)


def chain_hash(prev_hex: str, seq: int, envelope: JsonObject | bytes) -> str:
    """The hash of a record at `seq` after `prev_hex` (see module docstring); ``envelope`` as an object or
    as its canonical bytes already (``dumps`` of it: what the codec writes, hashed as it is)."""
    h = hashlib.sha256()
    h.update(bytes.fromhex(prev_hex))
    h.update(seq.to_bytes(8, "big"))
    h.update(envelope if isinstance(envelope, bytes) else dumps(envelope))
    return h.hexdigest()


class ChainWriter:
    """A producer's side: the headers for each next record of one chain."""

    def __init__(self, *, seq: int = 0, prev: str = GENESIS) -> None:
        self.seq = seq
        self.prev = prev

    @classmethod
    def resume(cls, last_headers: Mapping[str, str] | None) -> ChainWriter:
        """Continue after the chain's last record (None: a new chain)."""
        if not last_headers:
            return cls()
        return cls(seq=int(last_headers[SEQ_HEADER]) + 1, prev=last_headers[HASH_HEADER])

    def headers_for(self, envelope: JsonObject | bytes) -> dict[str, str]:
        """The chain headers of the next record, and advance."""
        h = chain_hash(self.prev, self.seq, envelope)
        out = {SEQ_HEADER: str(self.seq), PREV_HEADER: self.prev, HASH_HEADER: h}
        self.seq += 1
        self.prev = h
        return out
