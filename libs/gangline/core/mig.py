"""MIG geometry as data: which profiles a GPU model offers and where each may start.

NVIDIA's MIG user guide ("Supported MIG Profiles", and `nvidia-smi mig -lgipp`) gives every GPU
instance profile as placements `{start,...}:size` counted in *memory slices* (8 per A100/H100/H200).
A profile may start only at the listed positions and occupies `size` memory slices from there;
two instances conflict when their memory-slice ranges overlap. Compute slices (7 per GPU) are
implied by the profile name (`3g` = 3) and are checked as a second budget.

The A100 and H100 (80 GB, NVL 94 GB) tables are checked row by row against printed `-lgipp`
output in the tests; H200 uses the same GH100 layout under its own profile names.

Occupancy of one GPU is an 8-bit mask over memory slices, so every check here is a few integer
operations.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NewType

MigProfileName = NewType("MigProfileName", str)
"""A MIG profile as NVIDIA names it, e.g. `3g.20gb`."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile: `compute` slices, `memory_slices` wide, allowed `starts`."""

    name: MigProfileName
    compute: int
    memory_slices: int
    memory_mib: int
    starts: tuple[int, ...]

    def mask_at(self, start: int) -> int:
        """Bit mask of the memory slices an instance starting at `start` occupies."""
        return ((1 << self.memory_slices) - 1) << start


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """The MIG layout of one GPU model: its memory/compute slices and its profiles."""

    model: str
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        """The profile called `name`, or None when this GPU does not offer it."""
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    def carved(self, instances: Iterable[tuple[str, int]]) -> MigGeometry:
        """This layout narrowed to the instances already carved on a GPU: `(profile, start)` pairs.

        A GPU whose instances exist already (created by the operator, as NVML lists them) can only
        hand out those: each profile keeps just the starts an instance of it sits at. Check the
        pairs with `layout_problem` first.
        """
        starts: dict[str, list[int]] = {}
        for name, start in instances:
            starts.setdefault(name, []).append(start)
        return replace(
            self,
            profiles=tuple(
                replace(p, starts=tuple(sorted(starts[p.name]))) for p in self.profiles if p.name in starts
            ),
        )

    def layout_problem(self, instances: Iterable[tuple[str, int]]) -> str | None:
        """Why these carved `(profile, start)` instances cannot be on one GPU of this model, or None."""
        mask = compute = 0
        for name, start in instances:
            prof = self.profile(name)
            if prof is None:
                return f"{self.model} has no MIG profile {name}"
            if start not in prof.starts:
                return f"MIG profile {name} cannot start at memory slice {start} on {self.model}"
            if prof.mask_at(start) & mask:
                return f"MIG instance {name}@{start} overlaps another instance"
            mask |= prof.mask_at(start)
            compute += prof.compute
        if compute > self.compute_slices:
            return f"MIG instances use {compute} compute slices; {self.model} has {self.compute_slices}"
        return None

    def free_starts(self, profile: MigProfile, used_mask: int, used_compute: int) -> tuple[int, ...]:
        """Starts at which `profile` fits next to instances already occupying `used_mask`."""
        if used_compute + profile.compute > self.compute_slices:
            return ()
        return tuple(s for s in profile.starts if not (profile.mask_at(s) & used_mask))

    def placeable_count(self, used_mask: int, used_compute: int) -> int:
        """Weighted count of placements still possible; bigger profiles weigh more.

        Used to keep big profiles placeable: a slot choice that lowers this number least is
        the least damaging one.
        """
        total = 0
        for p in self.profiles:
            if used_compute + p.compute > self.compute_slices:
                continue
            for s in p.starts:
                if not (p.mask_at(s) & used_mask):
                    total += p.memory_slices * p.memory_slices
        return total


def _geometry(model: str, names: dict[str, str]) -> MigGeometry:
    """Build the A100/H100/H200 family layout (8 memory slices, 7 compute slices).

    `names` maps the generic shape (`1g.1m`, `1g.2m`, `2g.2m`, `3g.4m`, `4g.4m`, `7g.8m`, where `m`
    counts memory slices) to the model's profile name.
    """
    shapes: dict[str, tuple[int, int, tuple[int, ...]]] = {
        # shape: (compute slices, memory slices, starts) from nvidia-smi mig -lgipp
        "1g.1m": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
        "1g.2m": (1, 2, (0, 2, 4, 6)),
        "2g.2m": (2, 2, (0, 2, 4)),
        "3g.4m": (3, 4, (0, 4)),
        "4g.4m": (4, 4, (0,)),
        "7g.8m": (7, 8, (0,)),
    }
    profiles = tuple(
        MigProfile(
            name=MigProfileName(names[shape]),
            compute=c,
            memory_slices=m,
            memory_mib=int(names[shape].split(".")[1].removesuffix("gb")) * 1024,
            starts=starts,
        )
        for shape, (c, m, starts) in shapes.items()
        if shape in names
    )
    return MigGeometry(model=model, memory_slices=8, compute_slices=7, profiles=profiles)


MIG_GEOMETRIES: dict[str, MigGeometry] = {
    g.model: g
    for g in (
        _geometry(
            "A100-40GB",
            {
                "1g.1m": "1g.5gb",
                "1g.2m": "1g.10gb",
                "2g.2m": "2g.10gb",
                "3g.4m": "3g.20gb",
                "4g.4m": "4g.20gb",
                "7g.8m": "7g.40gb",
            },
        ),
        _geometry(
            "A100-80GB",
            {
                "1g.1m": "1g.10gb",
                "1g.2m": "1g.20gb",
                "2g.2m": "2g.20gb",
                "3g.4m": "3g.40gb",
                "4g.4m": "4g.40gb",
                "7g.8m": "7g.80gb",
            },
        ),
        _geometry(
            "H100-80GB",
            {
                "1g.1m": "1g.10gb",
                "1g.2m": "1g.20gb",
                "2g.2m": "2g.20gb",
                "3g.4m": "3g.40gb",
                "4g.4m": "4g.40gb",
                "7g.8m": "7g.80gb",
            },
        ),
        _geometry(
            "H100-94GB",
            {
                "1g.1m": "1g.12gb",
                "1g.2m": "1g.24gb",
                "2g.2m": "2g.24gb",
                "3g.4m": "3g.47gb",
                "4g.4m": "4g.47gb",
                "7g.8m": "7g.94gb",
            },
        ),
        _geometry(
            "H200-141GB",
            {
                "1g.1m": "1g.18gb",
                "1g.2m": "1g.35gb",
                "2g.2m": "2g.35gb",
                "3g.4m": "3g.71gb",
                "4g.4m": "4g.71gb",
                "7g.8m": "7g.141gb",
            },
        ),
    )
}
"""Known MIG layouts by canonical GPU model name (`mig_model` maps what NVML reports onto these)."""

_FAMILIES: dict[str, dict[int, str]] = {}
for _name in MIG_GEOMETRIES:
    _family, _gb = _name.split("-")
    _FAMILIES.setdefault(_family, {})[int(_gb.removesuffix("GB"))] = _name
_IGNORED_WORDS = frozenset({"NVIDIA", "TESLA"})
_MEMORY_WORD = re.compile(r"^([0-9]+)GB?$")
_NAMELESS_SIZE_GB: dict[tuple[str, bool], int] = {("H100", False): 80, ("H100", True): 94}
"""Sizes of names that carry none: `NVIDIA H100 PCIe` has 80 GB, `NVIDIA H100 NVL` 94 GB."""


@lru_cache(maxsize=1024)  # a cluster has a handful of names; placement asks about them every cycle
def mig_model(name: str, memory_mib: int | None = None) -> str | None:
    """The canonical MIG table entry for a GPU model name as NVML reports it, or None when unknown.

    Accepts NVML's product names (`NVIDIA A100-SXM4-80GB`, `NVIDIA H100 80GB HBM3`, `NVIDIA H100 NVL`,
    `NVIDIA H200`), the agent's labels of them (`A100-SXM4-80GB`, `H100-80GB-HBM3`) and the canonical
    names themselves (`A100-80GB`). The family is the first word naming a known one (A100, H100,
    H200: `GH200` is not `H200`); the size comes from a `<n>GB` word in the name, else from
    `memory_mib` (the nearest size within 15%), else from the family when that leaves one choice.
    """
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w and w not in _IGNORED_WORDS]
    family = next((w for w in words if w in _FAMILIES), None)
    if family is None:
        return None
    sizes = _FAMILIES[family]
    for w in words:
        m = _MEMORY_WORD.match(w)
        if m is not None:
            return sizes.get(int(m.group(1)))
    if memory_mib is not None and memory_mib > 0:
        gb = memory_mib / 1024
        nearest = min(sizes, key=lambda size: (abs(size - gb), size))
        return sizes[nearest] if abs(nearest - gb) <= 0.15 * nearest else None
    if len(sizes) == 1:
        return next(iter(sizes.values()))
    size = _NAMELESS_SIZE_GB.get((family, "NVL" in words))
    return sizes.get(size) if size is not None else None


def mig_geometry(model: str, memory_mib: int | None = None) -> MigGeometry | None:
    """The MIG layout for a GPU model (any name `mig_model` reads), or None when it has none here."""
    canonical = mig_model(model, memory_mib)
    return MIG_GEOMETRIES[canonical] if canonical is not None else None
