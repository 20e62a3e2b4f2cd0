"""Event models: frozen, and refusing values that make no sense on a GPU cluster, with clear messages."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from gangline.events.allocations import AllocationGranted, MigSlice, Placement
from gangline.events.base import Envelope, make_envelope
from gangline.events.examples import EPOCH, example_envelopes
from gangline.events.jobs import JobPending, JobRequested, JobSpec
from gangline.events.nodes import GpuInfo, NodeHeartbeat, NodeRegistered
from gangline.events.registry import default_registry


def request(**overrides: Any) -> JobRequested:
    fields: dict[str, Any] = {"job_id": "j-1", "queue": "team-a", "workers": 2, "gpus_per_worker": 4}
    return JobRequested(**(fields | overrides))


def grant(*placements: Placement) -> AllocationGranted:
    return AllocationGranted(job_id="j-1", allocation_id="a-1", queue="team-a", placements=placements)


def gpu(i: int, **overrides: Any) -> GpuInfo:
    fields: dict[str, Any] = {
        "id": f"gpu{i}",
        "index": i,
        "uuid": f"GPU-{i}",
        "model": "H100",
        "memory_mib": 81_559,
    }
    return GpuInfo(**(fields | overrides))


def node(*gpus: GpuInfo) -> NodeRegistered:
    return NodeRegistered(node="n0", address="10.0.0.1", gpus=gpus, nvlink_domain="n0", leaf="l0", spine="s0")


def test_events_are_frozen() -> None:
    job = request()
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        job.workers = 3


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="extra"):
        request(gpus=8)


def test_request_defaults_are_conservative() -> None:
    job = request()
    assert (job.priority, job.preemptible, job.topology, job.command, job.env) == (0, False, None, (), {})
    assert job.total_gpus == 8
    assert not job.elastic


def test_spec_is_the_request_without_its_id() -> None:
    job = request(priority=7, env={"A": "1"})
    spec = job.spec()
    assert type(spec) is JobSpec
    assert spec.model_dump() == job.model_dump(exclude={"job_id"})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"workers": 0}, "greater than or equal to 1"),
        ({"gpus_per_worker": 0}, "gpus_per_worker must be >= 1 unless mig_profile or gpu_fraction_milli"),
        ({"gpus_per_worker": 1, "mig_profile": "1g.10gb"}, "gpus_per_worker must be 0 when a MIG profile"),
        ({"gpus_per_worker": 0, "mig_profile": "1g.10gb", "gpu_fraction_milli": 500}, "not both"),
        ({"gpus_per_worker": 0, "gpu_fraction_milli": 1001}, "less than or equal to 1000"),
        ({"mig_profile": "big"}, "pattern"),
        ({"min_workers": 3}, "min_workers (3) must be <= workers (2)"),
        ({"max_workers": 1}, "max_workers (1) must be >= workers (2)"),
        ({"env": {"1BAD": "x"}}, "pattern"),
        ({"job_id": "has space"}, "pattern"),
        ({"queue": "q/evil"}, "pattern"),
        ({"priority": 10**9}, "less than or equal to 1000000"),
        ({"topology": {"level": "nvlink", "mode": "maybe"}}, "'required' or 'preferred'"),
    ],
)
def test_nonsense_requests_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        request(**overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        {"gpus_per_worker": 0, "mig_profile": "3g.40gb"},
        {"gpus_per_worker": 0, "gpu_fraction_milli": 250, "gpu_memory_mib": 10_000},
        {"workers": 4, "min_workers": 2, "max_workers": 8},
        {"topology": {"level": "spine", "mode": "preferred"}, "preemptible": True, "checkpoint_grace_s": 0},
    ],
)
def test_sensible_variants_are_accepted(overrides: dict[str, Any]) -> None:
    assert request(**overrides).job_id == "j-1"


def test_pending_needs_at_least_one_reason() -> None:
    with pytest.raises(pydantic.ValidationError, match="at least 1 item"):
        JobPending(job_id="j-1", reasons=())


def test_grant_ranks_must_be_zero_to_w_minus_one_each_once() -> None:
    ok = grant(Placement(rank=1, node="n1", gpus=("g0",)), Placement(rank=0, node="n0", gpus=("g0",)))
    assert ok.workers == 2 and ok.whole_gpus == 2
    with pytest.raises(pydantic.ValidationError, match=r"ranks 0..1, each once \(got \[0, 0\]\)"):
        grant(Placement(rank=0, node="n0", gpus=("g0",)), Placement(rank=0, node="n1", gpus=("g0",)))
    with pytest.raises(pydantic.ValidationError, match=r"ranks 0..1, each once \(got \[0, 2\]\)"):
        grant(Placement(rank=0, node="n0", gpus=("g0",)), Placement(rank=2, node="n1", gpus=("g0",)))


def test_a_whole_gpu_is_never_granted_to_two_ranks() -> None:
    with pytest.raises(
        pydantic.ValidationError, match="GPU 'g1' on node 'n0' is granted to both rank 0 and rank 1"
    ):
        grant(
            Placement(rank=0, node="n0", gpus=("g0", "g1")), Placement(rank=1, node="n0", gpus=("g1", "g2"))
        )
    with pytest.raises(pydantic.ValidationError, match="lists a GPU twice"):
        grant(Placement(rank=0, node="n0", gpus=("g0", "g0")))


def test_slices_and_shared_slots_may_share_a_gpu() -> None:
    shared = grant(
        Placement(rank=0, node="n0", gpus=("g0",), gpu_fraction_milli=500),
        Placement(rank=1, node="n0", gpus=("g0",), gpu_fraction_milli=500),
    )
    assert shared.whole_gpus == 0
    mig = Placement(rank=0, node="n0", gpus=("g0",), mig=MigSlice(gpu="g0", profile="1g.10gb", instance_id=3))
    assert mig.shared
    with pytest.raises(pydantic.ValidationError, match="MIG slice is on 'g1', not on 'g0'"):
        Placement(rank=0, node="n0", gpus=("g0",), mig=MigSlice(gpu="g1", profile="1g.10gb"))
    with pytest.raises(pydantic.ValidationError, match="exactly one GPU"):
        Placement(rank=0, node="n0", gpus=("g0", "g1"), gpu_fraction_milli=500)


def test_registration_checks_gpu_ids_and_nvlink_peers() -> None:
    assert len(node(gpu(0, nvlink_peers=("gpu1",)), gpu(1, nvlink_peers=("gpu0",))).gpus) == 2
    with pytest.raises(pydantic.ValidationError, match="GPU ids must be unique"):
        node(gpu(0), gpu(1, id="gpu0"))
    with pytest.raises(pydantic.ValidationError, match="GPU indexes must be unique"):
        node(gpu(0), gpu(1, index=0))
    with pytest.raises(pydantic.ValidationError, match=r"not other GPUs of this node: \['gpu9'\]"):
        node(gpu(0, nvlink_peers=("gpu9",)))
    with pytest.raises(pydantic.ValidationError, match="not other GPUs of this node"):
        node(gpu(0, nvlink_peers=("gpu0",)))


def test_heartbeat_reports_each_gpu_once() -> None:
    with pytest.raises(pydantic.ValidationError, match="each GPU reports once"):
        NodeHeartbeat(node="n0", seq=1, gpus=[{"id": "g0", "healthy": True, "busy": False}] * 2)


def test_envelope_type_and_subject_must_agree_with_data() -> None:
    env = make_envelope(request(), event_id="e", source="s", time=EPOCH)
    with pytest.raises(pydantic.ValidationError, match="does not match data of type"):
        Envelope(**(env.model_dump(exclude={"data"}) | {"type": "gangline.job.placed.v1", "data": env.data}))
    with pytest.raises(pydantic.ValidationError, match="does not match the data's subject"):
        Envelope(**(env.model_dump(exclude={"data"}) | {"subject": "j-2", "data": env.data}))


def test_every_registered_event_has_a_subject_and_an_example() -> None:
    examples = example_envelopes()
    for cls in default_registry().event_classes():
        env = examples[cls.wire_type()]
        assert type(env.data) is cls
        assert env.subject == env.data.subject() != ""
