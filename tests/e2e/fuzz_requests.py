"""Fuzz ``jobs.requests`` over the real (secured) broker, against the services as real processes.

Inputs are schema-derived (hypothesis-jsonschema over ``schemas/events/job.requested`` and
``job.cancel_requested``: valid envelopes, given fresh ids so each one must be answered on its own) and
then mutated: wrong types, huge strings, deep nesting, NaN, invalid UTF-8, wrong CloudEvents spec
versions and types, missing fields, truncation, byte flips, non-objects, tombstones and wrong Kafka
headers. Every input must be answered: a ``job.rejected`` naming the problem (code and reason), a
``job.admitted`` (it was valid), or a dead letter from admission with its code and reason. No service
may exit, and valid jobs sent afterwards must be granted.

The services (admission, quota, placement, preemption, node_health) run as subprocesses on topics of
their own (``e2e-fuzz-<run>.``), with fake nodes in this process. Used by test_fuzz_requests.py (a
bounded slice) and by ``make fuzz`` (``python tests/e2e/fuzz_requests.py --inputs 100000``), which runs
the API's schemathesis fuzz (tests/integration/api/fuzz_api.py) beside it and ends with one JSON line:
``inputs_sent`` (records the broker acknowledged plus the API's cases) and ``inputs_answered`` (each
record matched to an answer of its own, each API case that got a response) must be equal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
import types
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT / "libs", ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402

from e2e.harness import Proc, fake_cluster, private_topics, request_bytes, service_env  # noqa: E402
from gangline.bus import (  # noqa: E402
    DLQ_CODE,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_REASON,
    DLQ_SOURCE_SERVICE,
    DLQ_TOPIC,
    header,
)
from gangline.bus.security import client_options  # noqa: E402
from gangline.bus.trust import default_signer  # noqa: E402
from gangline.cluster_spec import ClusterSpec, NodeGroup  # noqa: E402
from gangline.events.codec import DecodeError, decode  # noqa: E402
from gangline.events.jobs import JobAdmitted, JobRejected  # noqa: E402
from services.common.topics import TopicNames  # noqa: E402

SCHEMAS = ROOT / "schemas" / "events"
SERVICES = ("admission", "quota", "placement", "preemption", "node_health")
CLUSTER = ClusterSpec(
    name="fuzz",
    groups=(
        NodeGroup(name="n", count=2, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920, leaf="l"),
    ),
)
MAX_INPUT_BYTES = 1_000_000
"""What the broker takes in one record (1 MiB) less room for the key, the headers and the framing."""


# -- schema-derived inputs (hypothesis-jsonschema) ----------------------------------------------


def _hypothesis_jsonschema() -> Any:
    """hypothesis_jsonschema, made to run on this Hypothesis.

    Its object strategy drives ``conjecture.utils.many`` through ``more()``, which Hypothesis replaced by
    iteration (``with many(...) as elements: for _ in elements``); this adapter gives it ``more()`` back.
    """
    import hypothesis_jsonschema._from_schema as impl
    from hypothesis.internal.conjecture import utils as cu

    class _Many:
        def __init__(self, data: Any, min_size: int, max_size: float, average_size: float) -> None:
            self._many = cu.many(
                data, min_size=min_size, max_size=max_size, average_size=average_size, observe=False
            )
            self._many.__enter__()
            self._elements = iter(self._many)

        def more(self) -> bool:
            try:
                next(self._elements)
            except StopIteration:
                self._many.__exit__(None)
                return False
            return True

        def reject(self, why: str | None = None) -> None:
            self._many.reject(why)

    if not isinstance(impl.cu, types.SimpleNamespace):
        impl.cu = types.SimpleNamespace(**{k: getattr(cu, k) for k in dir(cu) if not k.startswith("__")})
        impl.cu.many = _Many
    import hypothesis_jsonschema

    return hypothesis_jsonschema


def schema_derived(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` envelopes drawn from the committed JSON Schemas of the two request events (valid by them)."""
    from hypothesis.control import BuildContext
    from hypothesis.errors import StopTest
    from hypothesis.internal.conjecture.data import ConjectureData

    hj = _hypothesis_jsonschema()
    strategies = [
        hj.from_schema(json.loads((SCHEMAS / kind / "v1.json").read_text()))
        for kind in ("job.requested", "job.requested", "job.requested", "job.cancel_requested")
    ]
    rnd = random.Random(seed)
    out: list[dict[str, Any]] = []
    while len(out) < count:
        data = ConjectureData(random=random.Random(rnd.getrandbits(64)), max_choices=20_000)
        try:
            with BuildContext(data, is_final=False, wrapped_test=lambda: None):
                out.append(data.draw(rnd.choice(strategies)))
        except StopTest:
            continue  # the draw ran out of choices: draw again
    return out


# -- mutations -----------------------------------------------------------------------------------

Headers = list[tuple[str, bytes]]


@dataclass
class Input:
    kind: str
    value: bytes | None
    key: bytes | None
    headers: Headers = field(default_factory=list)
    event_id: str | None = None
    """The id the decoder reads when the record decodes, when the mutation left it as made; else None (the
    record is decoded here to learn it)."""
    decodable: bool = True
    """False for inputs that cannot be a CloudEvent at all (no decoding here)."""
    signed: bool = True
    """Whether it carries its writer's signature when readers check writers (else a forged one)."""


WRONG_TYPES: list[Any] = [None, True, 0, -1, 2**70, 1.5, "", "x", [], [1], {}, {"a": 1}, "1", "NaN"]
SPEC_VERSIONS: list[Any] = ["0.3", "2.0", "1.0.0", "1", 1.0, "", None, "1.0\n"]
TYPES: list[Any] = [
    "gangline.job.requested.v2",
    "gangline.job.requested.v0",
    "gangline.job.requested.v99999999999999999999",
    "gangline.job.requested",
    "gangline.job.admitted.v1",
    "gangline.node.registered.v1",
    "gangline.allocation.released.v1",
    "job.requested",
    "gangline.nothing.v1",
    "GANGLINE.JOB.REQUESTED.V1",
    "",
    None,
    7,
]
BAD_HEADERS: list[Headers] = [
    [("ce_specversion", b"0.3"), ("ce_type", b"gangline.job.admitted.v1")],
    [("content-type", b"application/xml")],
    [("content-type", b"\xff\xfe\xfa")],
    [("traceparent", b"garbage")],
    [("traceparent", b"\xff" * 55)],
    [("traceparent", b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01")],
    [("tracestate", b"\x00\x01" * 1000)],
    [("gangline-chain-seq", b"not-a-number"), ("gangline-chain-prev", b"\xff")],
    [("gangline-writer", b"\xff\xfe"), ("gangline-writer-sig", b"00")],
    [("gangline-dlq-code", b"forged"), ("gangline-dlq-reason", b"\xff" * 10)],
    [("ce_id", b"x")] * 50,
    [("", b"")],
    [("\udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"), b"v")],
    [("x-big", b"h" * 100_000)],
]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((*prefix, i))
            out += _paths(v, (*prefix, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        doc = doc[step]
    doc[path[-1]] = value


def _delete(doc: Any, path: tuple[Any, ...]) -> None:
    for step in path[:-1]:
        doc = doc[step]
    del doc[path[-1]]


DEEP_MARK = "@@deep@@"


def doc_text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _deep(depth: int) -> Any:
    value: Any = 0
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


class Mutator:
    """Turns schema-derived envelopes into inputs; each input gets a fresh event id and job id first."""

    def __init__(self, bases: list[dict[str, Any]], seed: int, run: str) -> None:
        self.bases = bases
        self.rnd = random.Random(seed)
        self.run = run
        self.n = 0
        self._deep_depth = 0
        self.structured: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
            ("wrong_type", self._wrong_type),
            ("huge_string", self._huge_string),
            ("deep_nesting", self._deep_nesting),
            ("nan", self._nan),
            ("lone_surrogate", self._lone_surrogate),
            ("spec_version", self._spec_version),
            ("event_type", self._event_type),
            ("missing_field", self._missing_field),
            ("extra_field", self._extra_field),
            ("many_entries", self._many_entries),
            ("long_id", self._long_id),
            ("control_chars", self._control_chars),
        ]
        self.raw: list[tuple[str, Callable[[bytes], bytes | None]]] = [
            ("truncated", lambda b: b[: self.rnd.randrange(len(b))]),
            ("byte_flip", self._byte_flip),
            ("invalid_utf8", self._invalid_utf8),
            ("duplicate_keys", lambda b: b[:-1] + b', "id": "dup", "data": {}}'),
            ("not_an_object", lambda b: self.rnd.choice([b"[]", b"null", b"1", b'"x"', b"true", b"", b" "])),
            ("garbage", lambda b: self.rnd.randbytes(self.rnd.choice([1, 10, 1000, 100_000]))),
            ("deep_raw", lambda b: b"[" * 10_000 + b"]" * 10_000),
            ("tombstone", lambda b: None),
        ]

    def fresh(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(json.dumps(self.rnd.choice(self.bases)))
        self.n += 1
        doc["id"] = f"fz-{self.run}-{self.n}"
        data = doc.get("data")
        if isinstance(data, dict) and self.rnd.random() < 0.9:
            job_id = f"fz-{self.run}-{self.n}"
            data["job_id"] = job_id
            if self.rnd.random() < 0.95:
                doc["subject"] = job_id
        return doc

    def admissible(self) -> dict[str, Any]:
        """A schema-derived request pinned to what this cluster can run (it must be admitted)."""
        doc = self.fresh()
        while doc["type"] != "gangline.job.requested.v1":
            doc = self.fresh()
        job_id = f"fz-{self.run}-{self.n}"
        doc["subject"] = job_id
        doc["data"].update(
            job_id=job_id,
            queue="default",
            workers=1,
            gpus_per_worker=self.rnd.choice([1, 2, 4]),
            gpu_type=None,
            gpu_memory_mib=None,
            mig_profile=None,
            gpu_fraction_milli=None,
            min_workers=None,
            max_workers=None,
            duration_hint_s=1,
        )
        return doc

    def next(self) -> Input:
        made = self._next()
        room = MAX_INPUT_BYTES - sum(len(k) + len(v) for k, v in made.headers) - len(made.key or b"")
        if made.value is not None and len(made.value) > room:
            made.value = made.value[: max(room, 0)]  # the broker takes no record over 1 MiB in all
            made.kind += "+truncated"
            made.event_id = None
        if self.rnd.random() < 0.03:  # a forged writer: the writer check must refuse it, with its reason
            made.signed = False
            made.headers = [*made.headers, ("gangline-writer", b"admin"), ("gangline-writer-sig", b"0" * 64)]
            made.kind += "+forged_writer"
        return made

    def _next(self) -> Input:
        r = self.rnd.random()
        headers: Headers = []
        if self.rnd.random() < 0.05:
            headers = list(self.rnd.choice(BAD_HEADERS))
        if r < 0.02:
            doc, kind = self.admissible(), "admissible"
        elif r < 0.25:
            doc, kind = self.fresh(), "schema_valid"
            if doc["type"] == "gangline.job.requested.v1" and self.rnd.random() < 0.4:
                doc["data"]["queue"] = "default"  # past the queue check, into the cluster's and the limits'
                kind = "schema_valid_default_queue"
        elif r < 0.75:
            doc = self.fresh()
            kind, mutate = self.rnd.choice(self.structured)
            mutate(doc)
        else:
            doc = self.fresh()
            kind, mutate_raw = self.rnd.choice(self.raw)
            value = mutate_raw(json.dumps(doc).encode())
            key = self._key(doc) if value is not None else self._key(doc) or b"tombstone"
            decodable = kind in ("truncated", "byte_flip", "invalid_utf8", "duplicate_keys")
            value = value if value is None else value[:MAX_INPUT_BYTES]
            return Input(kind, value, key, headers, decodable=decodable)
        value = json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
        if DEEP_MARK in doc_text(value):
            value = value.replace(
                f'"{DEEP_MARK}"'.encode(), b"[" * self._deep_depth + b"]" * self._deep_depth
            )
        known = doc.get("id") if doc.get("id") == f"fz-{self.run}-{self.n}" else None
        if len(value) > MAX_INPUT_BYTES:
            value = value[:MAX_INPUT_BYTES]
            kind += "+truncated"
        return Input(kind, value, self._key(doc), headers, event_id=known)

    def _key(self, doc: dict[str, Any]) -> bytes | None:
        r = self.rnd.random()
        if r < 0.02:
            return None
        if r < 0.04:
            return self.rnd.randbytes(8)
        subject = doc.get("subject")
        return subject.encode("utf-8", "surrogatepass")[:1000] if isinstance(subject, str) else b"?"

    def _pick(self, doc: dict[str, Any]) -> tuple[Any, ...]:
        return self.rnd.choice(_paths(doc))

    def _wrong_type(self, doc: dict[str, Any]) -> None:
        _set(doc, self._pick(doc), self.rnd.choice(WRONG_TYPES))

    def _huge_string(self, doc: dict[str, Any]) -> None:
        size = self.rnd.choice([1_000, 10_000, 10_000, 100_000, 100_000, 300_000, 900_000])
        _set(doc, self._pick(doc), self.rnd.choice("xé\n\x00") * size)

    def _deep_nesting(self, doc: dict[str, Any]) -> None:
        depth = self.rnd.choice([65, 200, 900, 5000, 50_000])
        _set(doc, self._pick(doc), DEEP_MARK if depth > 900 else _deep(depth))
        self._deep_depth = depth

    def _nan(self, doc: dict[str, Any]) -> None:
        _set(doc, self._pick(doc), self.rnd.choice([float("nan"), float("inf"), float("-inf"), 1e308 * 10]))

    def _lone_surrogate(self, doc: dict[str, Any]) -> None:
        _set(doc, self._pick(doc), self.rnd.choice(["\ud800", "a\udfff", "\udcff\udcfe"]))

    def _spec_version(self, doc: dict[str, Any]) -> None:
        doc["specversion"] = self.rnd.choice(SPEC_VERSIONS)

    def _event_type(self, doc: dict[str, Any]) -> None:
        doc["type"] = self.rnd.choice(TYPES)

    def _missing_field(self, doc: dict[str, Any]) -> None:
        _delete(doc, self._pick(doc))

    def _extra_field(self, doc: dict[str, Any]) -> None:
        target = self.rnd.choice([doc, doc.get("data")])
        if isinstance(target, dict):
            target[self.rnd.choice(["extra", "__proto__", "", "data", "\x00"])] = self.rnd.choice(WRONG_TYPES)

    def _many_entries(self, doc: dict[str, Any]) -> None:
        data = doc.get("data")
        if isinstance(data, dict):
            count = self.rnd.choice([257, 257, 1025, 1025, 20_000])
            field_name = self.rnd.choice(["env", "command"])
            data[field_name] = {f"V{i}": "v" for i in range(count)} if field_name == "env" else ["a"] * count

    def _long_id(self, doc: dict[str, Any]) -> None:
        data = doc.get("data")
        long = "j" * self.rnd.choice([129, 513, 100_000])
        if isinstance(data, dict):
            data["job_id"] = long
        doc[self.rnd.choice(["subject", "id", "source"])] = long

    def _control_chars(self, doc: dict[str, Any]) -> None:
        data = doc.get("data")
        target = "job_id" if isinstance(data, dict) and "job_id" in data else None
        bad = self.rnd.choice(["\n", "\r\n", "\x00", "\u2028", " ", "\t", "/../"])
        if target is not None:
            data[target] = f"{data[target]}{bad}"  # type: ignore[index]
            doc["subject"] = data[target]  # type: ignore[index]
        else:
            doc["id"] = f"{doc.get('id')}{bad}"

    def _byte_flip(self, raw: bytes) -> bytes:
        out = bytearray(raw)
        for _ in range(self.rnd.randint(1, 8)):
            out[self.rnd.randrange(len(out))] = self.rnd.randrange(256)
        return bytes(out)

    def _invalid_utf8(self, raw: bytes) -> bytes:
        at = self.rnd.randrange(len(raw))
        return (
            raw[:at]
            + self.rnd.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
            + raw[at:]
        )


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Sent:
    kind: str
    partition: int
    offset: int
    event_id: str | None
    """The id admission will read, when the record decodes at all (None: it must be dead-lettered)."""


@dataclass
class Figures:
    inputs: int = 0
    by_input_kind: Counter[str] = field(default_factory=Counter)
    answered: Counter[str] = field(default_factory=Counter)
    rejection_codes: Counter[str] = field(default_factory=Counter)
    dead_letter_codes: Counter[str] = field(default_factory=Counter)
    by_kind_and_answer: Counter[str] = field(default_factory=Counter)
    unanswered: int = 0
    sharing_an_id: int = 0
    """Inputs whose event id another input has too (each was still answered on its own)."""
    decoder_crashes: Counter[str] = field(default_factory=Counter)
    """Inputs on which this process's decoder raised something other than a DecodeError (bugs)."""
    unanswered_examples: list[str] = field(default_factory=list)
    service_restarts: int = 0
    valid_after_sent: int = 0
    valid_after_granted: int = 0
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "inputs_sent": self.inputs,
            "inputs_answered": sum(self.answered.values()),
            "answered": dict(self.answered),
            "unanswered": self.unanswered,
            "sharing_an_id": self.sharing_an_id,
            "service_restarts": self.service_restarts,
            "valid_after_sent": self.valid_after_sent,
            "valid_after_granted": self.valid_after_granted,
            "rejection_codes": dict(self.rejection_codes.most_common()),
            "dead_letter_codes": dict(self.dead_letter_codes.most_common()),
            "input_kinds": dict(self.by_input_kind.most_common()),
            "answers_by_input_kind": dict(sorted(self.by_kind_and_answer.items())),
            "unanswered_examples": self.unanswered_examples,
            "decoder_crashes": dict(self.decoder_crashes),
            "seconds": round(self.seconds, 1),
        }


def _expected_id(value: bytes | None, crashes: Counter[str]) -> str | None:
    """The event id the decoder reads from ``value``; None when it is a DecodeError (a dead letter is due).
    Any other exception is a decoder bug: counted, and the input is still expected to be answered."""
    if value is None:
        return None
    try:
        return decode(value).id
    except DecodeError:
        return None
    except Exception as error:
        crashes[f"{type(error).__name__}: {str(error)[:120]}"] += 1
        return None


async def _wait_granted(
    reader: _Answers, jobs: set[str], *, timeout_s: float, alive: Callable[[], None]
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not jobs <= reader.granted and loop.time() < deadline:
        alive()
        await reader.poll()


class _Answers:
    """Reads jobs.events, the requests' dead letters and allocations.log, keeping what answers inputs."""

    def __init__(self, bootstrap: str, topics: TopicNames) -> None:
        self.topics = topics
        self.dlq = topics.requests + ".dlq"
        self.consumer = AIOKafkaConsumer(
            topics.events,
            self.dlq,
            topics.allocations,
            bootstrap_servers=bootstrap,
            **client_options(),
            group_id=None,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            enable_auto_commit=False,
            max_partition_fetch_bytes=4 * 2**20,
            fetch_max_bytes=16 * 2**20,
        )
        self.by_cause: dict[str, list[tuple[str, str, str]]] = {}
        """causationid → (answer kind, code, reason) of each of admission's answers naming it, in order."""
        self.letters: dict[tuple[int, int], tuple[str, str]] = {}
        """(partition, offset) of a request → (code, reason) of admission's dead letter of it."""
        self.granted: set[str] = set()
        self.admitted: set[str] = set()
        self.seen = 0

    async def poll(self) -> int:
        batch = await self.consumer.getmany(timeout_ms=300, max_records=10_000)
        n = 0
        for tp, records in batch.items():
            for record in records:
                n += 1
                if tp.topic == self.dlq:
                    if header(record.headers, DLQ_SOURCE_SERVICE) != b"admission":
                        continue
                    if header(record.headers, DLQ_TOPIC) != self.topics.requests.encode():
                        continue
                    where = (
                        int(header(record.headers, DLQ_PARTITION) or -1),
                        int(header(record.headers, DLQ_OFFSET) or -1),
                    )
                    code = (header(record.headers, DLQ_CODE) or b"").decode(errors="replace")
                    reason = (header(record.headers, DLQ_REASON) or b"").decode(errors="replace")
                    self.letters[where] = (code, reason)
                    continue
                with contextlib.suppress(DecodeError):
                    envelope = decode(record.value or b"")
                    data = envelope.data
                    if tp.topic == self.topics.allocations:
                        if type(data).TYPE == "allocation.granted":
                            self.granted.add(str(data.job_id))  # type: ignore[attr-defined]
                    elif envelope.causationid is not None and isinstance(data, JobRejected | JobAdmitted):
                        if isinstance(data, JobRejected):
                            answer = ("rejected", data.code, data.reason)
                        else:
                            answer = ("admitted", "", "")
                            self.admitted.add(str(data.job_id))
                        self.by_cause.setdefault(envelope.causationid, []).append(answer)
        self.seen += n
        return n

    def answers(self, sent: Sequence[Sent]) -> list[tuple[str, str, str] | None]:
        """Each input's own answer (None: none yet): its dead letter, found by its position, else one of
        the answers naming its event id as their cause. Inputs may share an id (a mutation can make two
        alike): each answer answers one input only, so every one of them needs its own."""
        used: Counter[str] = Counter()
        out: list[tuple[str, str, str] | None] = []
        for s in sent:
            letter = self.letters.get((s.partition, s.offset))
            if letter is not None:
                out.append(("dead_letter", *letter))
                continue
            found = self.by_cause.get(s.event_id, []) if s.event_id is not None else []
            k = used[s.event_id] if s.event_id is not None else 0
            if k < len(found) and s.event_id is not None:
                used[s.event_id] += 1
                out.append(found[k])
            else:
                out.append(None)
        return out


async def fuzz_requests(
    bootstrap: str,
    *,
    inputs: int,
    seed: int,
    workdir: Path,
    bases: int | None = None,
    valid_after: int = 5,
    answer_timeout_s: float = 120,
    progress: Callable[[str], None] = lambda _: None,
) -> Figures:
    """Send ``inputs`` fuzzed records to ``jobs.requests`` of a fresh pipeline; the figures of the run."""
    started = time.monotonic()
    figures = Figures()
    run = uuid.uuid4().hex[:6]
    base_count = bases if bases is not None else max(50, min(80, inputs // 100))
    progress(f"drawing {base_count} schema-derived envelopes")
    mutator = Mutator(schema_derived(base_count, seed), seed, run)
    progress(f"envelopes drawn ({time.monotonic() - started:.0f} s); inputs are made as they are sent")
    async with private_topics(bootstrap, "fuzz") as topics:
        env = service_env(bootstrap, topics, log_level="WARNING")
        procs = [Proc(f"services.{s}", env, workdir / f"{s}.log") for s in SERVICES]
        cluster = fake_cluster(bootstrap, topics, CLUSTER, heartbeat_s=5.0)
        nodes = asyncio.create_task(cluster.run(), name="fake-nodes")
        reader = _Answers(bootstrap, topics)
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            **client_options(),
            max_request_size=2**20,
            linger_ms=20,
            acks="all",
            enable_idempotence=True,
        )
        signer = default_signer()

        def alive() -> None:
            if nodes.done() and not nodes.cancelled() and nodes.exception() is not None:
                raise AssertionError("the fake nodes died") from nodes.exception()

        try:
            await cluster.ready.wait()
            for proc in procs:
                proc.start()
            await reader.consumer.start()
            await producer.start()
            # The pipeline is up when a first valid job is granted.
            warm = f"fz-{run}-warm"
            first = request_bytes(warm, queue="default", workers=1, gpus_per_worker=1, duration_hint_s=1)
            await producer.send_and_wait(
                topics.requests,
                first,
                key=warm.encode(),
                headers=_signed(signer, topics.requests, warm.encode(), first),
            )
            await _wait_granted(reader, {warm}, timeout_s=120, alive=alive)
            if warm not in reader.granted:
                raise AssertionError(f"the pipeline did not grant a first job; logs in {workdir}")
            progress(f"pipeline up ({time.monotonic() - started:.0f} s); sending")
            sent: list[Sent] = []
            chunk = 500
            for at in range(0, inputs, chunk):
                part = [mutator.next() for _ in range(min(chunk, inputs - at))]  # not all 1 MiB ones at once
                futures = [
                    await producer.send(
                        topics.requests,
                        value=item.value,
                        key=item.key,
                        headers=[
                            *item.headers,
                            *(_signed(signer, topics.requests, item.key, item.value) if item.signed else []),
                        ],
                    )
                    for item in part
                ]
                for item, future in zip(part, futures, strict=True):
                    meta = await future
                    event_id = item.event_id
                    if event_id is None and item.decodable:
                        event_id = _expected_id(item.value, figures.decoder_crashes)
                    sent.append(Sent(item.kind, meta.partition, meta.offset, event_id))
                    figures.by_input_kind[item.kind] += 1
                await reader.poll()
                alive()
                if (at // chunk) % 20 == 0:
                    progress(f"sent {len(sent)}; read {reader.seen}")
            figures.inputs = len(sent)
            progress(f"all {len(sent)} sent ({time.monotonic() - started:.0f} s); reading answers")
            loop = asyncio.get_running_loop()
            quiet_since = loop.time()
            figures.sharing_an_id = sum(
                n for n in Counter(s.event_id for s in sent if s.event_id is not None).values() if n > 1
            )
            found_all = reader.answers(sent)
            while None in found_all and loop.time() - quiet_since < answer_timeout_s:
                if await reader.poll():
                    quiet_since = loop.time()
                    found_all = reader.answers(sent)
                alive()
            for s, found in zip(sent, found_all, strict=True):
                if found is None:
                    figures.unanswered += 1
                    if len(figures.unanswered_examples) < 10:
                        figures.unanswered_examples.append(
                            f"{s.kind} at {s.partition}/{s.offset} id {s.event_id}"
                        )
                    continue
                kind, code, reason = found
                if kind != "admitted" and not (code and reason):
                    figures.unanswered += 1  # an answer must name the problem
                    figures.unanswered_examples.append(f"{s.kind}: {kind} without code or reason")
                    continue
                figures.answered[kind] += 1
                figures.by_kind_and_answer[f"{s.kind} -> {kind} {code}".rstrip()] += 1
                if kind == "rejected":
                    figures.rejection_codes[code] += 1
                elif kind == "dead_letter":
                    figures.dead_letter_codes[code] += 1
            # The admitted fuzz jobs may hold the cluster for days (their duration hints): cancel them all
            # (placement's cancel path), then the valid jobs must find room.
            progress(f"answers read ({time.monotonic() - started:.0f} s); cancelling {len(reader.admitted)}")
            for job in sorted(reader.admitted):
                cancel = _cancel_bytes(job)
                await producer.send(
                    topics.requests,
                    cancel,
                    key=job.encode(),
                    headers=_signed(signer, topics.requests, job.encode(), cancel),
                )
            await producer.flush()
            progress("valid jobs after")
            after = {f"fz-{run}-after-{i}" for i in range(valid_after)}
            for job in sorted(after):
                valid = request_bytes(job, queue="default", workers=1, gpus_per_worker=8, duration_hint_s=1)
                await producer.send_and_wait(
                    topics.requests,
                    valid,
                    key=job.encode(),
                    headers=_signed(signer, topics.requests, job.encode(), valid),
                )
            figures.valid_after_sent = len(after)
            await _wait_granted(reader, after, timeout_s=180, alive=alive)
            figures.valid_after_granted = len(after & reader.granted)
            figures.service_restarts = sum(1 for p in procs if not p.alive())
        finally:
            figures.service_restarts = sum(1 for p in procs if p.proc is not None and not p.alive())
            for proc in procs:
                proc.terminate()
            nodes.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await nodes
            with contextlib.suppress(Exception):
                await producer.stop()
            with contextlib.suppress(Exception):
                await reader.consumer.stop()
    figures.seconds = time.monotonic() - started
    return figures


def _cancel_bytes(job_id: str) -> bytes:
    body = json.loads(request_bytes(job_id))
    body["type"] = "gangline.job.cancel_requested.v1"
    body["data"] = {"job_id": job_id, "reason": "the fuzz is over"}
    return json.dumps(body).encode()


def _signed(signer: Any, topic: str, key: bytes | None, value: bytes | None) -> Headers:
    """The writer signature (gangline.bus.trust) when the environment configures one; a bad record is
    signed too, so it reaches the decoder rather than the writer check."""
    if signer is None or value is None:
        return []
    headers: Headers = signer.headers(topic, key, value)
    return headers


# -- make fuzz ------------------------------------------------------------------------------------


async def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", type=int, default=100_000, help="records sent to jobs.requests")
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument(
        "--api-examples", type=int, default=0, help="schemathesis examples per operation (0: no API fuzz)"
    )
    parser.add_argument("--api-max-time", type=int, default=None)
    parser.add_argument("--api-exclude-checks", default="")
    args = parser.parse_args(argv)
    # As the test session does: the super user's credentials, and readers checking writers (a fresh key).
    from conftest import _authenticate_as_admin, _trust_on

    _authenticate_as_admin()
    trust_dir = Path(tempfile.mkdtemp(prefix="gangline-fuzz-trust-"))
    _trust_on(trust_dir)
    bootstrap = os.environ.setdefault("GANGLINE_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    dsn = os.environ.get("GANGLINE_PG_DSN", "postgresql://postgres@127.0.0.1:55432/gangline")

    def progress(line: str) -> None:
        print(f"fuzz: {line}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="gangline-fuzz-") as tmp:
        work = Path(tmp)
        tasks: list[asyncio.Task[Any]] = [
            asyncio.create_task(
                fuzz_requests(bootstrap, inputs=args.inputs, seed=args.seed, workdir=work, progress=progress)
            )
        ]
        if args.api_examples:
            tasks.append(asyncio.create_task(_fuzz_api(bootstrap, dsn, work, args)))
        results = await asyncio.gather(*tasks)
        figures: Figures = results[0]
        summary: dict[str, Any] = {"jobs_requests": figures.summary()}
        api: dict[str, Any] = results[1] if args.api_examples else {}
        if api:
            summary["api"] = api
        print(json.dumps(summary, indent=2))
        api_cases = int(api.get("cases", 0))
        api_answered = api_cases - int(api.get("errored", 0))
        api_failures = int(api.get("failures", 0))
        line = {
            # What was sent: records the broker acknowledged on jobs.requests, and the API's test cases.
            "inputs_sent": figures.inputs + api_cases,
            # What was answered: each record by its own answer (figures.answered), each API case with a
            # response (schemathesis' cases less those that errored before one came).
            "inputs_answered": sum(figures.answered.values()) + api_answered,
            "jobs_requests_inputs": figures.inputs,
            "api_cases": api_cases,
            # An API case is answered as its OpenAPI promises (schemathesis' checks: no 5xx, a documented
            # status and body; what the schema refuses, a 4xx); a failed check counts under api_failures.
            "answered": {**dict(figures.answered), "api_as_documented": api_answered - api_failures},
            "unanswered": figures.unanswered + api_cases - api_answered,
            "api_failures": api_failures,
            "service_restarts": figures.service_restarts + api.get("restarts", 0),
            "valid_after_granted": f"{figures.valid_after_granted}/{figures.valid_after_sent}",
        }
        print(json.dumps(line))
        ok = (
            figures.unanswered == 0
            and line["unanswered"] == 0
            and line["inputs_answered"] == line["inputs_sent"]
            and line["service_restarts"] == 0
            and figures.valid_after_granted == figures.valid_after_sent
            and api_failures == 0
        )
        if not ok:
            for s in SERVICES:
                log = work / f"{s}.log"
                if log.exists():
                    print(f"--- {s}.log (tail)\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        return 0 if ok else 1


async def _fuzz_api(bootstrap: str, dsn: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests" / "integration" / "api"))
    from fuzz_api import running_api, schemathesis

    api_dir = work / "api"
    api_dir.mkdir()
    async with running_api(bootstrap, dsn, api_dir) as api:
        code, text, report = await schemathesis(
            api,
            api_dir / "report.json",
            max_examples=args.api_examples,
            seed=args.seed,
            checks=("all",),
            exclude=[c for c in args.api_exclude_checks.split(",") if c],
            max_time_s=args.api_max_time,
        )
        restarts = 0 if api.alive() else 1
    if code != 0 and not report:
        raise RuntimeError(f"schemathesis did not run:\n{text[-3000:]}")
    print(text[-6000:], file=sys.stderr)
    return api_figures(report, code) | {"restarts": restarts}


def api_figures(report: dict[str, Any], code: int) -> dict[str, Any]:
    """The figures of a schemathesis JSON report: cases sent, and the failures by check."""
    cases = report.get("test_cases", {})
    failures = {f"{f.get('code')} {f.get('title')}": f.get("count", 1) for f in report.get("failures", [])}
    return {
        "cases": int(cases.get("generated", 0)) if isinstance(cases, dict) else 0,
        "errored": int(cases.get("errored", 0)) if isinstance(cases, dict) else 0,
        "failures": sum(failures.values()) + len(report.get("errors", [])),
        "failures_by_check": failures,
        "errors": report.get("errors", []),
        "exit_code": code,
    }


if __name__ == "__main__":
    raise SystemExit(asyncio.run(_main(sys.argv[1:])))
