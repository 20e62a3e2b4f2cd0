"""The agent's pure parts: inventory to node.registered, health findings to gpu.health_changed,
exit codes, MASTER_PORT, and the settings."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from gangline.agent.node import (
    derived_id,
    exit_fields,
    health_cause,
    health_state,
    master_port,
    model_label,
    registration,
)
from gangline.agent.settings import AgentTopics, NodeAgentSettings
from gangline.nvml.health import Action, HealthFinding
from gangline.nvml.reader import NvmlReader
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn
from gangline.nvml.types import GpuUuid

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def settings(**over: object) -> NodeAgentSettings:
    values: dict[str, object] = {
        "node": "n0",
        "leaf": "leaf-3",
        "spine": "spine-1",
        "checkpoint_root": Path("/ckpt"),
        "log_dir": Path("/logs"),
    }
    values.update(over)
    return NodeAgentSettings.model_validate(values)


def inventory(spec: str, node: str = "n0"):  # type: ignore[no-untyped-def]
    return NvmlReader(NvmlStandIn(load_builtin_spec(spec, node=node)), node=node).inventory()


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
        ("NVIDIA L40S", "L40S"),
        (None, "unknown"),
    ],
)
def test_model_label_is_a_safe_label(name: str | None, label: str) -> None:
    assert model_label(name) == label


def test_registration_of_a_two_gpu_box_with_an_nvlink_bridge() -> None:
    reg = registration(inventory("sim-2gpu"), settings(labels={"zone": "a"}))
    assert [(g.id, g.index, g.model, g.memory_mib, g.nvlink_peers) for g in reg.gpus] == [
        ("gpu0", 0, "A100-PCIE-40GB", 40960, ("gpu1",)),
        ("gpu1", 1, "A100-PCIE-40GB", 40960, ("gpu0",)),
    ]
    assert all(g.uuid.startswith("GPU-") and not g.mig_enabled for g in reg.gpus)
    assert (reg.nvlink_domain, reg.leaf, reg.spine, reg.address) == ("n0", "leaf-3", "spine-1", "127.0.0.1")
    assert reg.labels == {"zone": "a"}


def test_registration_carries_mig_instances_and_nvswitch_peers() -> None:
    reg = registration(inventory("dgx-a100-mig"), settings(nvlink_domain="rack-7"))
    gpu0, gpu1 = reg.gpus[0], reg.gpus[1]
    assert gpu0.mig_enabled and [m.profile for m in gpu0.mig_instances] == ["1g.10gb"] * 7
    assert [
        (m.profile, m.instance_id, m.compute_instance_id, m.placement_start, m.memory_mib)
        for m in gpu1.mig_instances
    ] == [
        ("3g.40gb", 2, 0, 4, 40192),
        ("2g.20gb", 5, 0, 0, 19968),
        ("1g.10gb", 13, 0, 2, 9856),
    ]
    assert [(m.instance_id, m.placement_start) for m in gpu0.mig_instances][:4] == [
        (7, 4),
        (8, 5),
        (9, 6),
        (10, 0),
    ]
    assert gpu0.model == "A100-SXM4-80GB"  # NVML's name as a label, which the MIG table reads
    assert all(m.uuid.startswith("MIG-") for m in gpu0.mig_instances)
    assert len(reg.gpus) == 8 and all(len(g.nvlink_peers) == 7 for g in reg.gpus)
    assert reg.nvlink_domain == "rack-7"


def test_a_lost_gpu_is_left_out_of_the_registration() -> None:
    nvml = NvmlStandIn(load_builtin_spec("sim-2gpu", node="n0"))
    nvml.fall_off_bus(1)
    reg = registration(NvmlReader(nvml, node="n0").inventory(), settings())
    assert [(g.id, g.nvlink_peers) for g in reg.gpus] == [("gpu0", ())]


def finding(code: str, action: Action) -> HealthFinding:
    return HealthFinding(gpu=GpuUuid("GPU-x"), action=action, code=code, reason="r", fails_job=False, at=T0)


@pytest.mark.parametrize(
    ("code", "kind", "xid"),
    [
        ("xid.79", "xid", 79),
        ("xid.repeated_job_faults", "xid", None),
        ("gpu.lost", "lost", None),
        ("ecc.dbe", "ecc", None),
        ("remap.pending", "ecc", None),
        ("temperature.high", "thermal", None),
        ("throttle.hw_slowdown", "thermal", None),
    ],
)
def test_health_cause_kinds(code: str, kind: str, xid: int | None) -> None:
    cause = health_cause(finding(code, Action.CORDON))
    assert (cause.kind, cause.xid) == (kind, xid)
    assert cause.message.startswith(code)


def test_health_states_and_recovery() -> None:
    assert [health_state(a) for a in (Action.CORDON, Action.DRAIN, Action.FAIL_JOB, Action.WATCH, None)] == [
        "failed",
        "degraded",
        "healthy",
        "healthy",
        "healthy",
    ]
    assert health_cause(None).kind == "recovered"


def test_exit_fields_split_signals_from_codes() -> None:
    assert exit_fields(0) == (0, None)
    assert exit_fields(3) == (3, None)
    assert exit_fields(-9) == (None, 9)
    assert exit_fields(127) == (127, None)


def test_master_port_is_stable_per_allocation_and_in_range() -> None:
    s = settings(master_port_base=30000, master_port_span=100)
    ports = {master_port(f"alloc-{i}", s) for i in range(50)}
    assert all(30000 <= p < 30100 for p in ports) and len(ports) > 1
    assert master_port("alloc-1", s) == master_port(
        "alloc-1", settings(master_port_base=30000, master_port_span=100)
    )


def test_derived_ids_are_stable_and_distinct() -> None:
    assert derived_id("a1", "n0", "started") == derived_id("a1", "n0", "started")
    assert derived_id("a1", "n0", "started") != derived_id("a1", "n1", "started")


def test_settings_defaults_and_validation() -> None:
    s = settings()
    assert (s.domain, s.consumer_group, s.source) == ("n0", "gangline.agent.n0", "gangline/agent/n0")
    assert s.address_of("n0") == "127.0.0.1" and s.address_of("n7") == "n7"
    assert settings(peer_address="10.1.1.1").address_of("n7") == "10.1.1.1"
    assert s.topics.allocations == "allocations.log"
    with pytest.raises(ValidationError, match="absolute"):
        settings(checkpoint_root=Path("relative"))
    with pytest.raises(ValidationError):
        settings(node="bad name")
    with pytest.raises(ValidationError):
        NodeAgentSettings.model_validate({"node": "n0", "checkpoint_root": "/c", "log_dir": "/l"})


def test_settings_from_env() -> None:
    s = NodeAgentSettings.from_env(
        {
            "GANGLINE_NODE": "gpu-017",
            "GANGLINE_LEAF": "leaf-2",
            "GANGLINE_SPINE": "spine-0",
            "GANGLINE_CHECKPOINT_ROOT": "/var/lib/gangline/ckpt",
            "GANGLINE_LOG_DIR": "/var/log/gangline",
            "GANGLINE_HEARTBEAT_INTERVAL_S": "2.5",
            "GANGLINE_TOPIC_PREFIX": "t1.",
            "GANGLINE_DEFAULT_COMMAND": "python -m train",
            "GANGLINE_PG_DSN": "ignored",
        },
        leaf="leaf-9",
    )
    assert (s.node, s.leaf, s.heartbeat_interval_s) == ("gpu-017", "leaf-9", 2.5)
    assert s.topics == AgentTopics.prefixed("t1.") and s.topics.events == "t1.jobs.events"
    assert s.default_command == ("python", "-m", "train")
