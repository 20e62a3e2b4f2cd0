"""The hash chain of `allocations.log`: tampered, reordered or missing records are found and named.

Where the chain lives: in three Kafka headers of every `allocations.log` message, written by the
producer (placement, preemption, node_health) in the same transaction as the message:

* `gangline-chain-seq`  — the record's position in its chain, from 0, in decimal;
* `gangline-chain-prev` — the previous record's hash in the chain, hex (64 zeros for seq 0);
* `gangline-chain-hash` — hex SHA-256 of `prev_hash (32 bytes) || seq (8 bytes, big-endian) ||
  canonical(envelope)`, where canonical(envelope) is the CloudEvent as JSON with sorted keys, no
  spaces, UTF-8 (`gangline.events.codec.dumps`; the bytes `encode` puts on the wire).

A chain is one writer on one partition: `(topic, partition, envelope source)`. One writer per
decision domain (DESIGN.md §2 rule 4) keeps each chain linear without coordination; a writer
resumes after a restart from the last record of its chain (read the partition tail). Headers keep
the envelope contract unchanged, and the export keeps them, so offline verification is the same.

`ChainWriter` (`gangline.events.chain`) is what a producer uses; `verify_chain` what replay uses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gangline.events.chain import (
    CHAINED_TOPICS,
    GENESIS,
    HASH_HEADER,
    PREV_HEADER,
    SEQ_HEADER,
    chain_hash,
)
from gangline.replay.log import LogRecord


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """One break in a chain, with the record it was found at."""

    kind: str
    """`tampered` (hash mismatch), `missing` (a gap in seq), `broken` (prev does not link), `unchained`."""
    where: str
    event_id: str
    message: str


@dataclass
class ChainReport:
    """The verdict on every chain: problems in log order, and each chain's head."""

    records: int = 0
    problems: list[ChainProblem] = field(default_factory=list)
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)
    """chain id → (last seq, last hash): publish these to anchor the log elsewhere."""

    @property
    def ok(self) -> bool:
        return not self.problems


def chain_id(r: LogRecord) -> str:
    """`topic[partition]/source`."""
    src = r.envelope.get("source")
    return f"{r.topic}[{r.partition}]/{src if isinstance(src, str) else '?'}"


def verify_chain(records: Iterable[LogRecord], topics: Iterable[str] = CHAINED_TOPICS) -> ChainReport:
    """Check each chained record in (topic, partition, offset) order; name the first bad one of a break."""
    chained = set(topics)
    rep = ChainReport()
    state: dict[str, tuple[int, str]] = {}
    for r in sorted(
        (r for r in records if r.topic in chained), key=lambda r: (r.topic, r.partition, r.offset)
    ):
        rep.records += 1
        cid = chain_id(r)
        h = r.headers
        if SEQ_HEADER not in h or HASH_HEADER not in h or PREV_HEADER not in h:
            rep.problems.append(
                ChainProblem(
                    "unchained", r.where, r.event_id, f"record {r.where} ({r.event_id}) has no chain headers"
                )
            )
            continue
        try:
            seq = int(h[SEQ_HEADER])
            bytes.fromhex(h[PREV_HEADER])
        except ValueError:
            rep.problems.append(
                ChainProblem(
                    "tampered", r.where, r.event_id, f"record {r.where} ({r.event_id}): bad chain headers"
                )
            )
            continue
        last_seq, last_hash = state.get(cid, (-1, GENESIS))
        if seq > last_seq + 1:
            first, last = last_seq + 1, seq - 1
            gap = f"seq {first}" if first == last else f"seq {first}..{last}"
            rep.problems.append(
                ChainProblem(
                    "missing",
                    r.where,
                    r.event_id,
                    f"chain {cid}: record(s) {gap} missing before {r.where} ({r.event_id})",
                )
            )
        elif seq <= last_seq:
            rep.problems.append(
                ChainProblem(
                    "broken",
                    r.where,
                    r.event_id,
                    f"chain {cid}: record {r.where} ({r.event_id}) repeats seq {seq} (last was {last_seq})",
                )
            )
        elif h[PREV_HEADER] != last_hash:
            rep.problems.append(
                ChainProblem(
                    "broken",
                    r.where,
                    r.event_id,
                    f"chain {cid}: record {r.where} ({r.event_id}) does not link to the record before it",
                )
            )
        want = chain_hash(h[PREV_HEADER], seq, r.envelope)
        if want != h[HASH_HEADER]:
            rep.problems.append(
                ChainProblem(
                    "tampered",
                    r.where,
                    r.event_id,
                    f"record {r.where} ({r.event_id}, {r.type}) was altered: content does not match its hash",
                )
            )
        state[cid] = (seq, h[HASH_HEADER])
    rep.heads = dict(sorted(state.items()))
    return rep
