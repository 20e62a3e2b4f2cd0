"""The explicit registry of the core's plugins and actions, and the default profile.

Nothing registers itself: a plugin or action is available to profiles because it is listed here.
"""

from __future__ import annotations

from pathlib import Path

from gangline.core.actions import allocate
from gangline.core.framework.profile import Profile, load_profile
from gangline.core.framework.registry import Registry
from gangline.core.plugins import binpack, gang, gpu_fit, health, mig_packing, topology

DEFAULT_PROFILE_YAML = """\
name: default
actions: [allocate]
plugins:
  - name: health
  - name: gpu-fit
  - name: mig-packing
  - name: gang
    weight: 4
  - name: topology
    weight: 2
  - name: binpack
    weight: 1
settings:
  max_candidates: 4
"""
"""The built-in default profile (the same as deploy/profiles/default.yaml)."""


def placement_registry() -> Registry:
    """Part-1 plugins and actions: placement."""
    return Registry(
        plugins={
            health.NAME: health.Health,
            gpu_fit.NAME: gpu_fit.GpuFit,
            mig_packing.NAME: mig_packing.MigPacking,
            gang.NAME: gang.Gang,
            topology.NAME: topology.Topology,
            binpack.NAME: binpack.Binpack,
        },
        actions={allocate.NAME: allocate.Allocate},
    )


def default_profile(registry: Registry | None = None) -> Profile:
    """The default profile, built from `registry` (placement_registry() when None)."""
    return load_profile(DEFAULT_PROFILE_YAML, registry or placement_registry())


def profile_path() -> Path:
    """Where the deployable default profile lives in a source checkout."""
    return Path(__file__).resolve().parents[3] / "deploy" / "profiles" / "default.yaml"
