"""Each injected failure, read through the event watcher and the sampler, and what health makes of it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pynvml
import pytest

from gangline.core.health import GpuErrorWindows
from gangline.nvml.health import Action, GpuHealthMonitor, HealthFinding
from gangline.nvml.reader import NvmlEventWatcher, NvmlReader
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn
from gangline.nvml.types import GpuEventKind, GpuUuid, NodeInventory

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class Node:
    """A stand-in node with the agent's read loop: events, then a sample, into one monitor; the
    countable errors it hands on go into the core's drain windows, as node_health folds them."""

    def __init__(self, spec: str = "dgx-h100") -> None:
        self.nvml = NvmlStandIn(load_builtin_spec(spec))
        self.reader = NvmlReader(self.nvml, node=spec)
        self.inv: NodeInventory = self.reader.inventory()
        self.watcher: NvmlEventWatcher = self.reader.event_watcher()
        assert self.watcher.start() == ()
        self.monitor = GpuHealthMonitor()
        self.rates = GpuErrorWindows()

    def uuid(self, index: int) -> GpuUuid:
        return self.inv.gpus[index].uuid

    def tick(self, now: datetime = T0) -> list[HealthFinding]:
        found: list[HealthFinding] = []
        for event in self.watcher.poll(timeout_ms=0).events:
            found += self.monitor.observe_event(event, now)
        samples, _ = self.reader.sample()
        for sample in samples:
            found += self.monitor.observe_sample(sample, now)
        for gpu, error in self.monitor.take_errors():
            self.rates.record(gpu, error)
        return found


def codes(found: list[HealthFinding]) -> set[tuple[str, Action]]:
    return {(f.code, f.action) for f in found}


def test_a_quiet_node_has_no_findings() -> None:
    node = Node()
    assert node.tick() == [] and node.monitor.degraded() == []


def test_xid_79_fallen_off_the_bus_cordons_the_gpu() -> None:
    node = Node()
    node.nvml.fall_off_bus(2)

    found = node.tick()

    assert {f.gpu for f in found} == {node.uuid(2)}
    assert codes(found) == {("xid.79", Action.CORDON), ("gpu.lost", Action.CORDON)}
    assert all(f.fails_job for f in found)
    assert node.monitor.degraded() == [node.uuid(2)]


def test_xid_48_double_bit_ecc_cordons_and_leaves_a_pending_remap() -> None:
    node = Node()
    node.nvml.double_bit_ecc(1)

    found = node.tick()

    assert codes(found) == {
        ("ecc.dbe", Action.CORDON),
        ("xid.48", Action.CORDON),
        ("remap.pending", Action.DRAIN),
        ("ecc.uncorrected", Action.DRAIN),
    }
    assert node.monitor.verdict(node.uuid(1)) is Action.CORDON


def test_double_bit_ecc_on_volta_retires_a_page() -> None:
    node = Node("dgx1-v100")
    node.nvml.double_bit_ecc(0)
    found = node.tick()
    assert ("retired_pages.pending", Action.DRAIN) in codes(found)
    assert ("remap.pending", Action.DRAIN) not in codes(found)


def test_xid_63_pending_remap_drains_and_a_reset_clears_it() -> None:
    node = Node()
    node.nvml.row_remap_pending(4)

    assert codes(node.tick()) == {("xid.63", Action.DRAIN), ("remap.pending", Action.DRAIN)}
    assert node.tick(T0 + timedelta(minutes=1)) == []  # level condition: not repeated

    node.nvml.reset_gpu(4)
    node.tick(T0 + timedelta(minutes=2))
    assert [f.code for f in node.monitor.active(node.uuid(4))] == ["xid.63"]
    node.monitor.clear(node.uuid(4))
    assert node.monitor.degraded() == []


def test_xid_64_remap_failure_cordons() -> None:
    node = Node()
    node.nvml.row_remap_failure(6)
    assert codes(node.tick()) == {("xid.64", Action.CORDON), ("remap.failure", Action.CORDON)}


@pytest.mark.parametrize("xid", [13, 31, 43])
def test_application_xids_fail_only_the_job(xid: int) -> None:
    node = Node()
    node.nvml.app_fault(0, xid)

    found = node.tick()

    assert codes(found) == {(f"xid.{xid}", Action.FAIL_JOB)}
    assert found[0].fails_job and node.monitor.degraded() == []


def test_xid_45_after_a_kill_is_ignored() -> None:
    node = Node()
    node.nvml.app_fault(0, 45)
    assert node.tick() == []


def test_repeated_job_faults_on_one_gpu_are_drained_by_the_rate_rule_not_the_agent() -> None:
    node = Node()
    for minute in range(3):
        assert node.rates.verdict(node.uuid(3), T0 + timedelta(minutes=minute)) is None
        node.nvml.app_fault(3, 31)
        found = node.tick(T0 + timedelta(minutes=minute))
        assert codes(found) == {("xid.31", Action.FAIL_JOB)}  # each one only fails the job
    verdict = node.rates.verdict(node.uuid(3), T0 + timedelta(minutes=2))
    assert verdict is not None and (verdict.kind, verdict.count, verdict.last_xid) == ("job_fault", 3, 31)
    assert node.monitor.degraded() == []  # the agent applies no rate: node_health drains it


def test_rising_correctable_ecc_rate_drains_before_failure() -> None:
    node = Node()
    node.tick(T0)
    node.nvml.correctable_ecc(5, 30)
    assert node.tick(T0 + timedelta(minutes=10)) == []  # counted, not a finding
    assert node.rates.count("correctable_ecc", node.uuid(5), T0 + timedelta(minutes=10)) == 30
    node.nvml.correctable_ecc(5, 80)

    node.tick(T0 + timedelta(minutes=20))

    verdict = node.rates.verdict(node.uuid(5), T0 + timedelta(minutes=20))
    assert verdict is not None and (verdict.kind, verdict.count) == ("correctable_ecc", 110)
    assert node.monitor.degraded() == []


def test_hot_and_throttled_gpu_is_watched_not_drained() -> None:
    node = Node()
    node.nvml.set_temperature(7, 92, throttle_reasons=pynvml.nvmlClocksThrottleReasonHwThermalSlowdown)

    found = node.tick()

    assert codes(found) == {
        ("temperature.high", Action.WATCH),
        ("throttle.hw_thermal_slowdown", Action.WATCH),
    }
    node.nvml.set_temperature(7, 50, throttle_reasons=0)
    node.tick(T0 + timedelta(minutes=1))
    assert node.monitor.active(node.uuid(7)) == []


def test_gpu_that_disappears_is_cordoned_from_samples() -> None:
    node = Node()
    node.nvml.disappear(5)
    found = node.tick()
    assert codes(found) == {("gpu.lost", Action.CORDON)} and found[0].gpu == node.uuid(5)


def test_events_on_mig_node_carry_the_parent_gpu() -> None:
    node = Node("dgx-a100-mig")
    node.nvml.app_fault(1, 43)
    events = node.watcher.poll(timeout_ms=0).events
    assert [(e.uuid, e.kind, e.xid) for e in events] == [(node.uuid(1), GpuEventKind.XID, 43)]
    assert events[0].gpu_instance_id is None


def test_watcher_registers_only_supported_event_types() -> None:
    node = Node("pcie-l40s")
    masks = set(node.watcher.registered.values())
    assert masks == {pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError}
    node.nvml.correctable_ecc(0, 3)  # no single-bit events on this GPU: only the counters show them
    assert node.watcher.poll(timeout_ms=0).events == ()


def test_watcher_survives_nvml_errors_while_waiting() -> None:
    node = Node()
    node.nvml.inject_error("nvmlEventSetWait_v2", pynvml.NVMLError_GpuIsLost)
    result = node.watcher.poll(timeout_ms=10)
    assert result.events == () and [i.error for i in result.issues] == ["NVMLError_GpuIsLost"]
    node.nvml.app_fault(0, 13)
    assert [e.xid for e in node.watcher.poll(timeout_ms=10).events] == [13]
    node.watcher.close()
    assert node.watcher.poll(timeout_ms=0).issues[0].error == "not started"


def test_registration_failure_is_reported_not_raised() -> None:
    nvml = NvmlStandIn(load_builtin_spec("sim-2gpu"))
    reader = NvmlReader(nvml, node="sim-2gpu")
    reader.inventory()
    nvml.inject_error("nvmlDeviceRegisterEvents", pynvml.NVMLError_NotSupported, gpu=0)
    watcher = reader.event_watcher()
    issues = watcher.start()
    assert len(issues) == 1 and issues[0].error.startswith("NVMLError_NotSupported")
    assert len(watcher.registered) == 1
