"""The reader against the stand-in: inventories of real-looking nodes, and NVML errors handled as values."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gangline.nvml.reader import NvmlReader
from gangline.nvml.spec import builtin_spec_names, load_builtin_spec, load_spec, parse_spec
from gangline.nvml.standin import NvmlStandIn
from gangline.nvml.types import GpuState, NvlinkRemoteKind, TopologyLevel

FIXTURES = Path(__file__).parents[2] / "fixtures" / "nvml"


def read(name: str) -> tuple[NvmlStandIn, NvmlReader]:
    nvml = NvmlStandIn(load_builtin_spec(name))
    return nvml, NvmlReader(nvml, node=name)


def test_dgx_h100_is_eight_gpus_in_one_nvswitch_domain() -> None:
    _, reader = read("dgx-h100")
    inv = reader.inventory()

    assert inv.nvml_available and inv.driver_version == "550.90.07" and inv.issues == ()
    assert [g.index for g in inv.gpus] == list(range(8))
    assert {g.name for g in inv.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.memory_mib for g in inv.gpus} == {81559}
    assert len({g.uuid for g in inv.gpus}) == 8 and all(g.uuid.startswith("GPU-") for g in inv.gpus)
    assert inv.gpus[0].pci_bus_id == "00000000:1B:00.0"
    for g in inv.gpus:
        assert g.mig_enabled is None  # H100 spec here is not MIG-capable: NOT_SUPPORTED reads as None
        assert len(g.nvlinks) == 18 and all(link.active for link in g.nvlinks)
        assert {link.remote_kind for link in g.nvlinks} == {NvlinkRemoteKind.SWITCH}
        assert len({link.remote_pci_bus_id for link in g.nvlinks}) == 4
    assert len(inv.nvlink_domains) == 1
    assert inv.nvlink_domains[0].id == "dgx-h100/nvl0"
    assert inv.nvlink_domains[0].gpus == tuple(g.uuid for g in inv.gpus)


def test_topology_levels_follow_pcie_switches_and_numa() -> None:
    _, reader = read("dgx-h100")
    inv = reader.inventory()
    u = [g.uuid for g in inv.gpus]
    levels = {(p.a, p.b): p.level for p in inv.topology}

    assert len(inv.topology) == 8 * 7 // 2
    assert levels[(u[0], u[1])] is TopologyLevel.SINGLE
    assert levels[(u[0], u[2])] is TopologyLevel.MULTIPLE
    assert levels[(u[0], u[4])] is TopologyLevel.SYSTEM


def test_mig_node_lists_instances_with_profiles() -> None:
    _, reader = read("dgx-a100-mig")
    inv = reader.inventory()

    g0, g1, g2 = inv.gpus[0], inv.gpus[1], inv.gpus[2]
    assert g0.mig_enabled and len(g0.mig_devices) == 7
    assert {m.profile for m in g0.mig_devices} == {"1g.10gb"}
    assert [m.gpu_instance_id for m in g0.mig_devices] == list(range(7, 14))
    assert all(m.uuid.startswith("MIG-") for m in g0.mig_devices)
    assert [(m.profile, m.memory_mib) for m in g1.mig_devices] == [
        ("3g.40gb", 40192),
        ("2g.20gb", 19968),
        ("1g.10gb", 9856),
    ]
    assert g2.mig_enabled is False and g2.mig_devices == ()
    assert inv.issues == ()
    assert len(inv.nvlink_domains) == 1 and len(inv.nvlink_domains[0].gpus) == 8


def test_mig_instances_say_where_they_sit_which_their_ids_do_not() -> None:
    _, reader = read("dgx-a100-mig")
    g0, g1 = reader.inventory().gpus[:2]
    # nvmlGpuInstanceGetInfo's placement.start, per GPU-instance id: not the id, not the listing order
    assert [(m.gpu_instance_id, m.placement_start) for m in g0.mig_devices] == [
        (7, 4),
        (8, 5),
        (9, 6),
        (10, 0),
        (11, 1),
        (12, 2),
        (13, 3),
    ]
    assert [
        (m.profile, m.gpu_instance_id, m.compute_instance_id, m.placement_start) for m in g1.mig_devices
    ] == [
        ("3g.40gb", 2, 0, 4),
        ("2g.20gb", 5, 0, 0),
        ("1g.10gb", 13, 0, 2),
    ]


def test_an_unreadable_gpu_instance_leaves_its_start_unknown_and_says_so() -> None:
    nvml, reader = read("dgx-a100-mig")
    nvml.inject_error("nvmlDeviceGetGpuInstanceById", pynvml.NVMLError_NoPermission, gpu=1)
    inv = reader.inventory()
    g1 = inv.gpus[1]
    assert [m.placement_start for m in g1.mig_devices] == [None, 0, 2]
    assert [(i.call, i.error, i.gpu_index) for i in inv.issues] == [
        ("nvmlDeviceGetGpuInstanceById", "NVMLError_NoPermission", 1)
    ]


def test_volta_mesh_groups_by_direct_peers_and_reports_page_retirement() -> None:
    _, reader = read("dgx1-v100")
    inv = reader.inventory()

    assert len(inv.nvlink_domains) == 1 and len(inv.nvlink_domains[0].gpus) == 8
    g0 = inv.gpus[0]
    assert len(g0.nvlinks) == 6 and {link.remote_kind for link in g0.nvlinks} == {NvlinkRemoteKind.GPU}
    peers = [link.remote_pci_bus_id for link in g0.nvlinks]
    assert peers.count(inv.gpus[3].pci_bus_id) == 2  # NV2 to GPU 3
    assert g0.health.remapped_rows is None and g0.health.retired_pages is not None


def test_pcie_node_without_nvlink_has_one_domain_per_gpu() -> None:
    _, reader = read("pcie-l40s")
    inv = reader.inventory()

    assert [len(d.gpus) for d in inv.nvlink_domains] == [1, 1, 1, 1]
    assert all(g.nvlinks == () for g in inv.gpus)
    assert inv.issues == ()


def test_spec_from_file_with_explicit_uuids_makes_two_domains() -> None:
    spec = load_spec(FIXTURES / "mixed-4gpu.yaml")
    inv = NvmlReader(NvmlStandIn(spec), node=spec.node).inventory()

    assert [d.gpus for d in inv.nvlink_domains] == [
        ("GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"),
        ("GPU-22222222-2222-2222-2222-222222222222", "GPU-33333333-3333-3333-3333-333333333333"),
    ]
    assert inv.gpus[3].health.ecc is None and inv.gpus[2].health.ecc is not None


def test_every_builtin_spec_reads_cleanly() -> None:
    names = builtin_spec_names()
    assert {"dgx-h100", "dgx-a100-mig", "dgx1-v100", "pcie-l40s", "sim-2gpu"} <= set(names)
    for name in names:
        _, reader = read(name)
        inv = reader.inventory()
        assert inv.issues == () and inv.gpus and all(g.state is GpuState.OK for g in inv.gpus), name


def test_spec_rejects_links_to_missing_gpus() -> None:
    with pytest.raises(ValueError, match="NVLink peer 5"):
        parse_spec(
            "node: n\ndriver_version: '1'\ngpus:\n"
            "  - {name: g, memory_mib: 1, pci_bus_id: '0000:01:00.0', nvlink_to: peers, nvlink_peers: [5]}\n"
        )


def test_renaming_a_spec_gives_other_uuids() -> None:
    a = NvmlReader(NvmlStandIn(load_builtin_spec("sim-2gpu", node="a")), node="a").inventory()
    b = NvmlReader(NvmlStandIn(load_builtin_spec("sim-2gpu", node="b")), node="b").inventory()
    assert not {g.uuid for g in a.gpus} & {g.uuid for g in b.gpus}


# ---- errors are values ---------------------------------------------------------------------------


def test_no_driver_gives_an_unavailable_inventory() -> None:
    nvml, reader = read("sim-2gpu")
    nvml.inject_error("nvmlInit", pynvml.NVMLError_DriverNotLoaded)

    inv = reader.inventory()

    assert not inv.nvml_available and inv.gpus == ()
    assert [(i.call, i.error) for i in inv.issues] == [("nvmlInit", "NVMLError_DriverNotLoaded")]
    assert reader.inventory().nvml_available  # the next read retries the init


def test_a_single_timeout_is_retried_silently() -> None:
    nvml, reader = read("sim-2gpu")
    nvml.inject_error("nvmlDeviceGetTemperature", pynvml.NVMLError_Timeout, gpu=1)

    inv = reader.inventory()

    assert inv.issues == () and inv.gpus[1].health.temperature_c == 35


def test_a_persistent_timeout_is_recorded_and_the_read_goes_on() -> None:
    nvml, reader = read("sim-2gpu")
    nvml.inject_error("nvmlDeviceGetTemperature", pynvml.NVMLError_Timeout, gpu=1, times=2)

    inv = reader.inventory()

    assert [(i.call, i.error, i.gpu_index) for i in inv.issues] == [
        ("nvmlDeviceGetTemperature", "NVMLError_Timeout", 1)
    ]
    assert inv.gpus[1].health.temperature_c is None and inv.gpus[1].state is GpuState.OK
    assert inv.gpus[1].health.ecc is not None


def test_no_permission_and_unknown_errors_are_recorded() -> None:
    nvml, reader = read("sim-2gpu")
    nvml.inject_error("nvmlDeviceGetRemappedRows", pynvml.NVMLError_NoPermission, gpu=0)
    nvml.inject_error("nvmlDeviceGetName", pynvml.NVMLError_Unknown, gpu=1)

    inv = reader.inventory()

    assert {(i.call, i.error) for i in inv.issues} == {
        ("nvmlDeviceGetRemappedRows", "NVMLError_NoPermission"),
        ("nvmlDeviceGetName", "NVMLError_Unknown"),
    }
    assert inv.gpus[0].health.remapped_rows is None and inv.gpus[1].name is None


def test_gpu_fallen_off_the_bus_is_reported_lost_under_its_known_uuid() -> None:
    nvml, reader = read("dgx-h100")
    before = reader.inventory()
    nvml.fall_off_bus(3)

    after = reader.inventory()

    lost = after.gpus[3]
    assert lost.state is GpuState.LOST and lost.uuid == before.gpus[3].uuid
    assert [g.state for g in after.gpus].count(GpuState.OK) == 7
    assert all(lost.uuid not in d.gpus for d in after.nvlink_domains)
    assert any(i.error == "NVMLError_GpuIsLost" for i in after.issues)
    assert all(lost.uuid not in (p.a, p.b) for p in after.topology)


def test_gpu_lost_on_first_read_gets_a_placeholder_uuid() -> None:
    nvml, reader = read("sim-2gpu")
    nvml.fall_off_bus(0)
    inv = reader.inventory()
    assert inv.gpus[0].state is GpuState.LOST and inv.gpus[0].uuid == "GPU-unknown-index-0"


def test_gpu_that_disappears_is_reported_lost_and_indices_shift() -> None:
    nvml, reader = read("dgx-h100")
    before = reader.inventory()
    nvml.disappear(2)

    after = reader.inventory()

    ok = [g for g in after.gpus if g.state is GpuState.OK]
    lost = [g for g in after.gpus if g.state is GpuState.LOST]
    assert len(ok) == 7 and [g.uuid for g in lost] == [before.gpus[2].uuid]
    assert lost[0].index == 2
    assert ok[2].uuid == before.gpus[3].uuid  # the GPU behind it moved up one index
    samples, _ = reader.sample()
    assert [s.uuid for s in samples if s.state is GpuState.LOST] == [before.gpus[2].uuid]


def test_reset_required_marks_the_gpu() -> None:
    nvml, reader = read("sim-2gpu")
    nvml.inject_error("nvmlDeviceGetMemoryInfo", pynvml.NVMLError_ResetRequired, gpu=1)
    inv = reader.inventory()
    assert inv.gpus[1].state is GpuState.RESET_REQUIRED and inv.gpus[0].state is GpuState.OK


def test_sample_reads_counters_after_injected_errors() -> None:
    nvml, reader = read("dgx-h100")
    reader.inventory()
    nvml.double_bit_ecc(5)
    nvml.correctable_ecc(6, 4)
    nvml.set_temperature(7, 91, throttle_reasons=pynvml.nvmlClocksThrottleReasonHwThermalSlowdown)

    samples, issues = reader.sample()

    assert issues == ()
    s5, s6, s7 = samples[5], samples[6], samples[7]
    assert s5.ecc is not None and s5.ecc.uncorrected_volatile == 1
    assert s5.remapped_rows is not None and s5.remapped_rows.pending
    assert s6.ecc is not None and s6.ecc.corrected_aggregate == 4
    assert s7.temperature_c == 91 and s7.throttle_reasons == pynvml.nvmlClocksThrottleReasonHwThermalSlowdown


def test_throttle_reasons_fall_back_to_the_old_call_on_old_drivers() -> None:
    nvml, reader = read("sim-2gpu")
    nvml.set_temperature(0, 40, throttle_reasons=0x20)
    nvml.inject_error("nvmlDeviceGetCurrentClocksEventReasons", pynvml.NVMLError_FunctionNotFound, gpu=0)
    samples, issues = reader.sample()
    assert samples[0].throttle_reasons == 0x20 and issues == ()


def test_uninitialised_stand_in_raises_like_nvml() -> None:
    nvml = NvmlStandIn(load_builtin_spec("sim-2gpu"))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError) as caught:
        nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(0))
    assert caught.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
