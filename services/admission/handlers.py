"""Admission's decisions (pure): a request in, ``job.admitted`` or ``job.rejected`` out.

The state is a fold over ``nodes.inventory`` (what the cluster has, to tell whether a request can
ever fit) and ``jobs.events`` (which job ids were admitted, to deduplicate), plus the queue
configuration (:mod:`services.common.queues`): the queues requests may name, and the quotas a job
must fit even with its whole cohort idle. A request whose job id
was admitted before with the same spec is a producer's retry and is dropped; the same id with a
different spec is rejected.

Deduplication by job id is part of the contract and lasts forever, finished jobs included, so the
state keeps every admitted id; per id only a 16-byte digest of the spec's canonical JSON, not the
spec itself (a few hundred bytes), so the state stays small however long the log grows.

Request event ids are deduplicated too: an id that comes again with the same body is a retry (decided
as before, which publishes nothing new), but an id seen before with a different body is rejected
(``duplicate_event_id``), never answered with the first request's outputs. The state keeps a digest
per request id: those decided by this run, and those of every admitted job (their ``job.admitted``
names the request as its cause and carries its body); a rejected request's body is not in the log,
so after a restart its id may be used again.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from gangline.bus import (
    DLQ_CODE,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_REASON,
    DLQ_TOPIC,
    DeadLetter,
    Outgoing,
    header,
)
from gangline.bus.trust import UNTRUSTED_WRITER
from gangline.events.base import Envelope, make_envelope
from gangline.events.codec import dumps, too_deep
from gangline.events.ids import derived_id
from gangline.events.jobs import (
    UNKNOWN_JOB,
    JobAdmitted,
    JobCancelRequested,
    JobRejected,
    JobRequested,
    JobSpec,
)
from gangline.events.nodes import NodeRegistered
from gangline.events.types import LIMIT_EXCEEDED, SAFE_ID_PATTERN, JobId
from services.common.queues import Queues
from services.common.topics import TopicNames

SOURCE = "gangline/admission"
MAX_GRANT_BYTES = 768 * 1024
"""The largest ``allocation.granted`` a request may cause once placed (one placement per worker): room is
left under the broker's 1 MiB record limit for the envelope and the headers."""
MAX_REASON = 2000
"""A rejection's reason is a sentence of at most this many characters (a long queue list is cut)."""
_SAFE_ID = re.compile(SAFE_ID_PATTERN)
"""Used with ``fullmatch``: the pattern's ``$`` alone would let a trailing newline through, which the
model (whose pattern is matched in full) refuses."""


@dataclass
class GpuTypeCapacity:
    """What the cluster has of one GPU model."""

    total: int = 0
    most_on_one_node: int = 0
    largest_memory_mib: int = 0
    mig_enabled: int = 0


@dataclass
class AdmissionState:
    topics: TopicNames
    queues: Queues
    nodes: dict[str, NodeRegistered] = field(default_factory=dict)
    admitted: dict[JobId, bytes] = field(default_factory=dict)
    """Job id → digest of its spec's canonical JSON (:func:`spec_digest`)."""
    requests: dict[str, bytes] = field(default_factory=dict)
    """Request event id → digest of its body (:func:`request_digest`)."""
    _capacity: dict[str, GpuTypeCapacity] | None = None
    _longest_ids: tuple[int, int] | None = None

    # -- folding the log ---------------------------------------------------------------------

    def restore(self, envelope: Envelope) -> None:
        data = envelope.data
        if isinstance(data, NodeRegistered):
            self.nodes[data.node] = data
            self._capacity = self._longest_ids = None
        elif isinstance(data, JobAdmitted):
            digest = self.admitted.setdefault(data.job_id, spec_digest(data.spec))
            if envelope.causationid is not None:
                self.requests.setdefault(envelope.causationid, _job_request_digest(data.job_id, digest))

    def longest_ids(self) -> tuple[int, int]:
        """The longest node id and the longest GPU id registered, in characters (what a grant repeats)."""
        if self._longest_ids is None:
            nodes = self.nodes.values()
            self._longest_ids = (
                max((len(node.node) for node in nodes), default=0),
                max((len(gpu.id) for node in nodes for gpu in node.gpus), default=0),
            )
        return self._longest_ids

    def capacity(self) -> dict[str, GpuTypeCapacity]:
        if self._capacity is None:
            capacity: dict[str, GpuTypeCapacity] = {}
            for node in self.nodes.values():
                per_model: dict[str, int] = {}
                for gpu in node.gpus:
                    cap = capacity.setdefault(gpu.model, GpuTypeCapacity())
                    cap.largest_memory_mib = max(cap.largest_memory_mib, gpu.memory_mib)
                    if gpu.mig_enabled:
                        cap.mig_enabled += 1
                    else:
                        cap.total += 1
                        per_model[gpu.model] = per_model.get(gpu.model, 0) + 1
                for model, count in per_model.items():
                    capacity[model].most_on_one_node = max(capacity[model].most_on_one_node, count)
            self._capacity = capacity
        return self._capacity


def spec_digest(spec: JobSpec) -> bytes:
    """What tells two specs apart: a 16-byte BLAKE2b digest of the spec's canonical JSON."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=16).digest()


def request_digest(envelope: Envelope) -> bytes:
    """What tells two requests with one event id apart: a 16-byte digest of the type and the data."""
    data = envelope.data
    if isinstance(data, JobRequested):
        return _job_request_digest(data.job_id, spec_digest(data.spec()))
    canonical = envelope.type.encode() + b"\0" + dumps(data.model_dump(mode="json"))
    return hashlib.blake2b(canonical, digest_size=16).digest()


def _job_request_digest(job_id: str, spec: bytes) -> bytes:
    # Computable from a job.admitted too (it carries the job id and the spec of the request it admits).
    return hashlib.blake2b(b"job.requested\0" + job_id.encode() + b"\0" + spec, digest_size=16).digest()


def policy_problem(spec: JobSpec, state: AdmissionState) -> tuple[str, str] | None:
    """``(code, reason)`` when the request can never run here, None when it may be admitted."""
    if not state.queues.known(spec.queue):
        known = ", ".join(state.queues.names())
        return "unknown_queue", f"queue {spec.queue!r} does not exist; the queues are: {known}"
    problem = cluster_problem(spec, state.capacity())
    if problem is not None:
        return problem
    size = grant_bytes_bound(spec, *state.longest_ids())
    if size > MAX_GRANT_BYTES:
        return LIMIT_EXCEEDED, (
            f"a gang of {spec.workers} workers would make an allocation record of up to {size} bytes; "
            f"at most {MAX_GRANT_BYTES} fit in one Kafka record: ask for fewer workers with more GPUs each"
        )
    never = state.queues.can_ever_fit(spec)
    if never is not None:
        return "exceeds_queue_quota", never
    return None


def grant_bytes_bound(spec: JobSpec, longest_node: int, longest_gpu: int) -> int:
    """An upper bound of the size of the ``allocation.granted`` that places ``spec`` (its JSON ``data``
    and the envelope around it), given the longest node and GPU ids of the cluster."""
    gpus = spec.gpus_per_worker or 1  # a slice or shared slot lives on one GPU
    gpu = "g" * max(longest_gpu, 1)
    mig = None
    if spec.mig_profile is not None:
        mig = {"gpu": gpu, "instance_id": 10**6, "profile": spec.mig_profile}
    rank = {
        "gpu_fraction_milli": spec.gpu_fraction_milli,
        "gpus": [gpu] * gpus,
        "mig": mig,
        "node": "n" * max(longest_node, 1),
        "rank": max(spec.workers - 1, 0),
    }
    return spec.workers * (len(dumps(rank)) + 1) + _GRANT_OVERHEAD_BYTES


_GRANT_OVERHEAD_BYTES = 4096
"""The envelope and the grant's other fields: ids, queue, GPU type, trace context (each bounded)."""


def cluster_problem(spec: JobSpec, capacity: dict[str, GpuTypeCapacity]) -> tuple[str, str] | None:
    """``(code, reason)`` when the cluster as registered could never hold ``spec``, however idle."""
    if not capacity:
        return "no_capacity", "the cluster has no GPU nodes registered, so no job can run yet"
    if spec.gpu_type is not None and spec.gpu_type not in capacity:
        known = ", ".join(sorted(capacity))
        return "unknown_gpu_type", (
            f"GPU type {spec.gpu_type!r} does not exist in this cluster; it has: {known}"
        )
    models = [spec.gpu_type] if spec.gpu_type is not None else sorted(capacity)
    caps = [capacity[m] for m in models]
    what = spec.gpu_type or "GPUs"
    if spec.gpu_memory_mib is not None and all(c.largest_memory_mib < spec.gpu_memory_mib for c in caps):
        largest = max(c.largest_memory_mib for c in caps)
        return (
            "too_large",
            f"asks for {spec.gpu_memory_mib} MiB per GPU; the largest {what} here has {largest} MiB",
        )
    if spec.mig_profile is not None:
        if all(c.mig_enabled == 0 for c in caps):
            return "unknown_gpu_type", f"asks for MIG profile {spec.mig_profile}; no {what} here has MIG on"
        return None
    if spec.gpu_fraction_milli is not None:
        return None
    most_per_node = max(c.most_on_one_node for c in caps)
    if spec.gpus_per_worker > most_per_node:
        return (
            "too_large",
            f"asks for {spec.gpus_per_worker} GPUs per worker; the largest node has {most_per_node} {what}",
        )
    # The largest total of any one model the job could use (a worker never mixes models).
    total = max(c.total for c in caps)
    if spec.total_gpus > total:
        return (
            "too_large",
            f"asks for {spec.total_gpus} GPUs ({spec.workers} workers x {spec.gpus_per_worker}); "
            f"the cluster has {total} {what} in all",
        )
    return None


def on_request(envelope: Envelope, state: AdmissionState, *, now: datetime) -> list[Outgoing]:
    """Decide one event read from ``jobs.requests`` or ``nodes.inventory``."""
    data = envelope.data
    if isinstance(data, NodeRegistered):
        state.restore(envelope)
        return []
    digest = request_digest(envelope)
    earlier_body = state.requests.setdefault(envelope.id, digest)
    if earlier_body != digest:
        job_id = data.job_id if isinstance(data, JobRequested | JobCancelRequested) else None
        return [
            _reject(
                state,
                envelope,
                job_id,
                "duplicate_event_id",
                f"event id {envelope.id!r} was already used by a different request; give every request "
                "a new id (only a retry of the same request may reuse one)",
                now,
                event_id=derived_id(envelope.id, "rejected", digest.hex()),
            )
        ]
    if isinstance(data, JobCancelRequested):
        if data.job_id in state.admitted:
            return []  # cancelling an admitted job is placement's business
        never = f"job {data.job_id!r} was never admitted"
        return [_reject(state, envelope, data.job_id, "unknown_job", never, now)]
    if not isinstance(data, JobRequested):
        return [
            _reject(
                state,
                envelope,
                None,
                "unexpected_event",
                f"{envelope.type} does not belong on the requests topic; send job.requested",
                now,
            )
        ]
    spec = data.spec()
    earlier = state.admitted.get(data.job_id)
    if earlier is not None:
        if earlier == spec_digest(spec):
            return []  # a retry of the same request
        return [
            _reject(
                state,
                envelope,
                data.job_id,
                "duplicate_job",
                f"job id {data.job_id!r} was already admitted with a different spec; use a new id",
                now,
            )
        ]
    problem = policy_problem(spec, state)
    if problem is not None:
        return [_reject(state, envelope, data.job_id, *problem, now)]
    state.admitted[data.job_id] = spec_digest(spec)
    admitted = JobAdmitted(job_id=data.job_id, spec=spec)
    return [
        (
            state.topics.events,
            make_envelope(admitted, event_id=derived_id(envelope.id, "admitted"), source=SOURCE, time=now),
        )
    ]


def _reject(
    state: AdmissionState,
    cause: Envelope,
    job_id: JobId | None,
    code: str,
    reason: str,
    now: datetime,
    *,
    event_id: str | None = None,
) -> Outgoing:
    rejected = JobRejected(job_id=job_id, code=code, reason=reason[:MAX_REASON])
    event_id = event_id if event_id is not None else derived_id(cause.id, "rejected")
    return (state.topics.events, make_envelope(rejected, event_id=event_id, source=SOURCE, time=now))


def rejection_of_dead_letter(letter: DeadLetter, state: AdmissionState, *, now: datetime) -> list[Outgoing]:
    """The ``job.rejected`` a producer reads when its request could not even be decoded."""
    origin = (header(letter.headers, DLQ_TOPIC) or b"").decode()
    if origin != state.topics.requests:
        return []
    where = "/".join(
        (header(letter.headers, h) or b"?").decode() for h in (DLQ_TOPIC, DLQ_PARTITION, DLQ_OFFSET)
    )
    code = (header(letter.headers, DLQ_CODE) or b"malformed_message").decode()
    reason = (header(letter.headers, DLQ_REASON) or b"the message could not be read").decode()
    # A record whose writer may not have written it names no job: it must not answer for someone else's.
    job_id = None if code == UNTRUSTED_WRITER else _job_id_in(letter.original_value)
    rejected = JobRejected(
        job_id=job_id,
        code=code,
        reason=f"the request could not be read: {reason}"[:MAX_REASON],
    )
    envelope = make_envelope(
        rejected, event_id=derived_id(f"dead-letter:{where}", "rejected"), source=SOURCE, time=now
    )
    return [(state.topics.events, envelope)]


def _job_id_in(value: bytes | None) -> JobId | None:
    """The job id of a broken request when one can be read from it, so its producer finds the answer."""
    if not value or too_deep(value):
        return None
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    candidates: Iterable[object] = ()
    if isinstance(doc, dict):
        data = doc.get("data")
        candidates = (data.get("job_id") if isinstance(data, dict) else None, doc.get("subject"))
    for candidate in candidates:
        if isinstance(candidate, str) and len(candidate) <= 128 and _SAFE_ID.fullmatch(candidate):
            if candidate == UNKNOWN_JOB:
                return None
            return JobId(candidate)
    return None
