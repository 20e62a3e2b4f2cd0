"""The MIG table read by the model names NVML reports, and layouts already carved on a GPU (pure)."""

from __future__ import annotations

import pytest

from gangline.core.mig import MIG_GEOMETRIES, mig_geometry, mig_model


@pytest.mark.parametrize(
    ("name", "memory_mib", "expected"),
    [
        # what nvmlDeviceGetName returns
        ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", None, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", None, "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", None, "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", None, "H100-80GB"),
        ("NVIDIA H100 PCIe", None, "H100-80GB"),
        ("NVIDIA H100 NVL", None, "H100-94GB"),
        ("NVIDIA H200", None, "H200-141GB"),
        ("NVIDIA H200 NVL", None, "H200-141GB"),
        # the agent's labels of those names (gangline.agent.node.model_label)
        ("A100-SXM4-80GB", None, "A100-80GB"),
        ("H100-80GB-HBM3", None, "H100-80GB"),
        ("H100-NVL", None, "H100-94GB"),
        ("H100-SXM5-80GB", None, "H100-80GB"),
        # the table's own names keep working
        ("A100-40GB", None, "A100-40GB"),
        ("H100-94GB", None, "H100-94GB"),
        ("H200-141GB", None, "H200-141GB"),
        # no size in the name: the memory NVML reports decides
        ("A100", 40_960, "A100-40GB"),
        ("A100", 81_920, "A100-80GB"),
        ("NVIDIA H100 PCIe", 95_830, "H100-94GB"),
    ],
)
def test_nvml_names_find_their_mig_table_entry(name: str, memory_mib: int | None, expected: str) -> None:
    assert mig_model(name, memory_mib) == expected
    geo = mig_geometry(name, memory_mib)
    assert geo is not None and geo is MIG_GEOMETRIES[expected]


@pytest.mark.parametrize(
    ("name", "memory_mib"),
    [
        ("NVIDIA A30", 24_576),  # MIG-capable, but a 4-slice layout the table does not hold
        ("NVIDIA GH200 480GB", None),  # not an H200
        ("NVIDIA H100 64GB", None),  # a size the family does not come in
        ("A100", None),  # two sizes and nothing to tell them apart
        ("A100", 24_576),  # memory far from every A100 size
        ("NVIDIA L40S", 46_068),
    ],
)
def test_models_outside_the_table_have_no_geometry(name: str, memory_mib: int | None) -> None:
    assert mig_model(name, memory_mib) is None
    assert mig_geometry(name, memory_mib) is None


def test_a_carved_layout_offers_only_its_instances() -> None:
    geo = MIG_GEOMETRIES["A100-80GB"]
    carved = geo.carved([("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2)])
    assert {p.name: p.starts for p in carved.profiles} == {"1g.10gb": (2,), "2g.20gb": (0,), "3g.40gb": (4,)}
    one = carved.profile("1g.10gb")
    assert one is not None and carved.free_starts(one, 0, 0) == (2,)
    # the uncarved slices (3) are not handed out, and a taken instance is not offered again
    assert carved.free_starts(one, one.mask_at(2), 1) == ()
    assert carved.profile("7g.80gb") is None


@pytest.mark.parametrize(
    ("instances", "why"),
    [
        ([("1g.5gb", 0)], "has no MIG profile 1g.5gb"),
        ([("3g.40gb", 2)], "cannot start at memory slice 2"),
        ([("3g.40gb", 4), ("2g.20gb", 4)], "overlaps"),
        ([("1g.10gb", 3), ("1g.10gb", 3)], "overlaps"),
    ],
)
def test_impossible_layouts_say_why(instances: list[tuple[str, int]], why: str) -> None:
    problem = MIG_GEOMETRIES["A100-80GB"].layout_problem(instances)
    assert problem is not None and why in problem


@pytest.mark.parametrize(
    "instances",
    [[("1g.10gb", s) for s in range(7)], [("4g.40gb", 0), ("3g.40gb", 4)], [("7g.80gb", 0)]],
)
def test_full_layouts_are_possible(instances: list[tuple[str, int]]) -> None:
    assert MIG_GEOMETRIES["H100-80GB"].layout_problem(instances) is None
