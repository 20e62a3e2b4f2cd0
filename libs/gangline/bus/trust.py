"""Trust at the edges of the log: a reader checks who wrote a record, and whether that writer may say it.

Kafka authenticates the client and its ACLs decide which topics a principal may write, but it puts no
principal in the record: ``jobs.requests`` is written by the API, a generic producer and every
tenant; ``nodes.*`` and ``jobs.events`` by the agents as well as by services. So each writer signs what
it writes, and the shared reader gate (:func:`check`, called by
:func:`gangline.bus.consumer.decode_or_dead_letter`, hence by every live reader, every restore and
replay alike) dead-letters what is unsigned, signed by someone else, or signed by a principal that may
not say it.

The signature: headers ``gangline-writer`` (the principal) and ``gangline-writer-sig``, the hex
HMAC-SHA256 of ``topic \\0 key \\0 value`` under the principal's key. A principal's key is
``HMAC-SHA256(master, "gangline-writer:" + principal)``: the services that read (and so verify) hold
the master key (GANGLINE_TRUST_KEY_FILE); an edge writer (a tenant's producer, an agent) is given only
its own derived key (GANGLINE_WRITER_KEY_FILE, made by ``python -m gangline.bus.trust derive-key``).

What it proves: the record was written by a holder of that principal's key (that principal, or a
trusted service holding the master key), for this topic and key, unaltered. What it does not prove:
freshness (a principal allowed to write the topic can copy a record byte for byte; the event id makes
that a duplicate, which readers already ignore), or anything about a job's state that the record does
not carry: a cancel names only a job id, so tenants cancel through the API (which checks the job's
queue against the token's tenant) and the policy does not let tenant principals write cancels.

The policy: per principal of deploy/kafka/access.yaml, ``events`` (the event types it may write on
the checked topics), ``queues`` or ``tenant`` (the tenant's queues in the API's token file, the same
file the API reads, plus ``default``), and ``node`` (the one node an agent may report on).
Configured by GANGLINE_TRUST_ACCESS (the access file), GANGLINE_TRUST_KEY_FILE and GANGLINE_TRUST_TOKENS_FILE;
without GANGLINE_TRUST_ACCESS no check is made (a deployment that has not turned it on).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import hmac
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from gangline.events.base import Envelope

WRITER_HEADER = "gangline-writer"
SIGNATURE_HEADER = "gangline-writer-sig"
DEFAULT_QUEUE = "default"
CHECKED_TOPICS = (
    "jobs.requests",
    "jobs.events",
    "nodes.inventory",
    "nodes.heartbeats",
    "nodes.health",
    "nodes.operator",
)
"""Catalogue topics written by principals outside the decision services (under any topic prefix)."""
UNTRUSTED_WRITER = "untrusted_writer"


def derive_key(master: bytes, principal: str) -> bytes:
    return hmac.new(master, f"gangline-writer:{principal}".encode(), hashlib.sha256).digest()


def _mac(key: bytes, topic: str, record_key: bytes | None, value: bytes) -> str:
    return hmac.new(key, b"\0".join((topic.encode(), record_key or b"", value)), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class WriterSigner:
    """Signs records as ``principal`` (its derived key, never printed)."""

    principal: str
    key: bytes

    def __repr__(self) -> str:
        return f"WriterSigner(principal={self.principal!r})"

    def headers(self, topic: str, record_key: bytes | None, value: bytes) -> list[tuple[str, bytes]]:
        return [
            (WRITER_HEADER, self.principal.encode()),
            (SIGNATURE_HEADER, _mac(self.key, topic, record_key, value).encode()),
        ]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WriterSigner | None:
        """GANGLINE_KAFKA_USERNAME signing with GANGLINE_WRITER_KEY_FILE (hex), or with the key derived
        from GANGLINE_TRUST_KEY_FILE (a service holding the master key); None when neither is set.
        GANGLINE_WRITER_PRINCIPAL signs as that access-file principal instead of the Kafka user name
        (on Kubernetes, where ``node_health`` authenticates as the KafkaUser ``node-health``)."""
        env = os.environ if environ is None else environ
        principal = env.get("GANGLINE_WRITER_PRINCIPAL") or env.get("GANGLINE_KAFKA_USERNAME")
        if not principal:
            return None
        if env.get("GANGLINE_WRITER_KEY_FILE"):
            return cls(principal, bytes.fromhex(Path(env["GANGLINE_WRITER_KEY_FILE"]).read_text().strip()))
        if env.get("GANGLINE_TRUST_KEY_FILE"):
            return cls(principal, derive_key(_read_master(Path(env["GANGLINE_TRUST_KEY_FILE"])), principal))
        return None


@lru_cache(maxsize=8)
def _signer_of(principal: str, writer_key_file: str, master_file: str) -> WriterSigner | None:
    env = {"GANGLINE_KAFKA_USERNAME": principal, "GANGLINE_WRITER_KEY_FILE": writer_key_file}
    return WriterSigner.from_env({**env, "GANGLINE_TRUST_KEY_FILE": master_file})


def default_signer() -> WriterSigner | None:
    """The signer the process environment configures (see :meth:`WriterSigner.from_env`), or None."""
    env = os.environ
    return _signer_of(
        env.get("GANGLINE_WRITER_PRINCIPAL") or env.get("GANGLINE_KAFKA_USERNAME", ""),
        env.get("GANGLINE_WRITER_KEY_FILE", ""),
        env.get("GANGLINE_TRUST_KEY_FILE", ""),
    )


def _read_master(path: Path) -> bytes:
    return path.read_bytes().strip()


@dataclass(frozen=True, slots=True)
class WriterRule:
    events: tuple[str, ...]
    """Event types (``job.requested``, ``node.*``; ``*``: any) this principal may write on checked topics."""
    queues: frozenset[str] | None
    """The queues its job requests may name (None: any)."""
    node: str | None
    """The only node its node reports may be about (None: any)."""


@dataclass(frozen=True, slots=True)
class TrustPolicy:
    master: bytes
    rules: Mapping[str, WriterRule]

    def __repr__(self) -> str:
        return f"TrustPolicy(principals={sorted(self.rules)})"

    def check(
        self,
        topic: str,
        record_key: bytes | None,
        value: bytes,
        headers: Iterable[tuple[str, bytes]],
        envelope: Envelope,
    ) -> str | None:
        """None when the record's writer may say it, else the reason it is dead-lettered."""
        if not topic.endswith(CHECKED_TOPICS):
            return None
        found = dict(headers)
        writer_raw, signature = found.get(WRITER_HEADER), found.get(SIGNATURE_HEADER)
        if writer_raw is None or signature is None:
            return "the record carries no writer signature"
        writer = writer_raw.decode("utf-8", "replace")[:64]
        rule = self.rules.get(writer)
        if rule is None:
            return f"writer {writer!r} is no principal of the access file"
        expected = _mac(derive_key(self.master, writer), topic, record_key, value)
        if not hmac.compare_digest(expected.encode(), signature):
            return f"the signature of writer {writer!r} does not match the record"
        kind = type(envelope.data).TYPE
        if not any(fnmatch.fnmatchcase(kind, pattern) for pattern in rule.events):
            return f"{writer} may not write {kind}"
        queue = getattr(envelope.data, "queue", None)
        if kind == "job.requested" and rule.queues is not None and queue not in rule.queues:
            return f"{writer} may not submit to queue {queue!r}"
        node = getattr(envelope.data, "node", None)
        if rule.node is not None and node is not None and node != rule.node:
            return f"{writer} reports for node {rule.node!r} only, not {node!r}"
        return None


def tenant_queues(tokens_file: Path | None) -> dict[str, frozenset[str] | None]:
    """Each tenant of the API's token file → the queues it may use (None for an admin: any)."""
    if tokens_file is None:
        return {}
    doc = yaml.safe_load(tokens_file.read_text(encoding="utf-8")) or {}
    out: dict[str, frozenset[str] | None] = {}
    for tenant in doc.get("tenants", ()):
        queues = None if tenant.get("admin") else frozenset({*tenant.get("queues", ()), DEFAULT_QUEUE})
        out[str(tenant["name"])] = queues
    return out


def load_policy(access_file: Path, master_file: Path, tokens_file: Path | None) -> TrustPolicy:
    doc = yaml.safe_load(access_file.read_text(encoding="utf-8"))
    tenants = tenant_queues(tokens_file)
    rules: dict[str, WriterRule] = {}
    for name, grant in (doc.get("principals") or {}).items():
        queues: frozenset[str] | None = None
        if grant.get("tenant") is not None:
            tenant = str(grant["tenant"])
            if tenant not in tenants:
                raise ValueError(f"principal {name!r}: tenant {tenant!r} is not in {tokens_file}")
            queues = tenants[tenant]
        elif grant.get("queues") is not None:
            queues = frozenset(grant["queues"])
        rules[str(name)] = WriterRule(tuple(grant.get("events", ())), queues, grant.get("node"))
    # The super user (the project's own tooling) may say anything, like the services.
    rules.setdefault(str(doc["super_user"]), WriterRule(("*",), None, None))
    return TrustPolicy(_read_master(master_file), rules)


@lru_cache(maxsize=4)
def _cached_policy(access: str, key: str, tokens: str, _stamp: tuple[float, ...]) -> TrustPolicy:
    return load_policy(Path(access), Path(key), Path(tokens) if tokens else None)


def active_policy() -> TrustPolicy | None:
    """The policy the ``GANGLINE_TRUST_*`` environment configures, or None (no writer check)."""
    access = os.environ.get("GANGLINE_TRUST_ACCESS")
    if not access:
        return None
    key = os.environ.get("GANGLINE_TRUST_KEY_FILE", "")
    if not key:
        raise RuntimeError("GANGLINE_TRUST_ACCESS is set but GANGLINE_TRUST_KEY_FILE is not")
    tokens = os.environ.get("GANGLINE_TRUST_TOKENS_FILE", "")
    stamp = tuple(os.stat(p).st_mtime for p in (access, key, tokens) if p)
    return _cached_policy(access, key, tokens, stamp)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gangline.bus.trust", description="Writer keys.")
    sub = parser.add_subparsers(dest="command", required=True)
    derive = sub.add_parser("derive-key", help="print a principal's signing key (hex), from the master key")
    derive.add_argument("--master-file", required=True, type=Path)
    derive.add_argument("--principal", required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    print(derive_key(_read_master(args.master_file), args.principal).hex())
    return 0


if __name__ == "__main__":
    sys.exit(main())
