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

from dataclasses import dataclass
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
"""Known MIG layouts by GPU model name (the `model` a node reports)."""


def mig_geometry(model: str) -> MigGeometry | None:
    """The MIG layout for a GPU model, or None when the model has no MIG support here."""
    return MIG_GEOMETRIES.get(model)
