"""The explicit registry of the core's plugins and actions, and the default profile.

Nothing registers itself: a plugin or action is available to profiles because it is listed here.
"""

from __future__ import annotations

from pathlib import Path

from gangline.core.actions import allocate, backfill, elastic, preempt, reclaim
from gangline.core.framework.profile import Profile, load_profile
from gangline.core.framework.registry import Registry
from gangline.core.plugins import binpack, gang, gpu_fit, health, mig_packing, priority, quota, topology

DEFAULT_PROFILE_YAML = """\
name: default
actions:
  - name: reserve
    args: {max_reservations: 1, min_gpus: 2, horizon_s: 3600}
  - allocate
  - backfill
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
  starvation_s: 259200
  short_first_weight: 1.0
"""
"""The built-in default profile (the same as deploy/profiles/default.yaml): the first blocked gang
of two GPUs or more holds the GPUs it will start on, and only work that ends before then (or is
preemptible) is backfilled onto them, so a stream of small jobs cannot starve it."""


def placement_registry() -> Registry:
    """Every plugin and action of the core, the one registry profiles are built from.

    Placement (health, gpu-fit, mig-packing, gang, topology, binpack; allocate), and quota, priority,
    reserve, backfill, preempt, reclaim and elastic, which read the cycle's queue facts
    (:func:`~gangline.core.actions.queueing.run_queue_cycle` supplies them; a plain cycle gets
    neutral ones). Any profile `gangline simulate` accepts, the services accept.
    """
    return Registry(
        plugins={
            health.NAME: health.Health,
            gpu_fit.NAME: gpu_fit.GpuFit,
            mig_packing.NAME: mig_packing.MigPacking,
            gang.NAME: gang.Gang,
            topology.NAME: topology.Topology,
            binpack.NAME: binpack.Binpack,
            quota.NAME: quota.Quota,
            priority.NAME: priority.Priority,
        },
        actions={
            allocate.NAME: allocate.Allocate,
            backfill.RESERVE: backfill.Reserve,
            backfill.BACKFILL: backfill.Backfill,
            preempt.NAME: preempt.Preempt,
            reclaim.NAME: reclaim.Reclaim,
            elastic.NAME: elastic.Elastic,
        },
    )


def default_profile(registry: Registry | None = None) -> Profile:
    """The default profile, built from `registry` (every action and plugin when None)."""
    return load_profile(DEFAULT_PROFILE_YAML, registry or placement_registry())


def planning_profile(profile: Profile) -> Profile:
    """The profile preemption plans with: the core's allocate, preempt and reclaim over ``profile``'s
    plugins (quota's among them), and the profile's elastic action when it lists one (its shrinks,
    before anyone is stopped entirely; the planner never grows: ``PreemptionPolicy.grow_in_cycle``).

    Allocate first: a job that fits now needs no victims. The profile's own preempt and reclaim
    (their arguments) when it lists them; the quota plugin is added when it does not, so a job quota
    holds waits for quota in the cycle and the core's preempt or reclaim frees it some.
    """
    listed = {a.name: a for a in profile.actions}
    shrink = (listed[elastic.NAME],) if elastic.NAME in listed else ()
    actions = (
        allocate.Allocate(),
        *shrink,
        listed.get(preempt.NAME) or preempt.Preempt(),
        listed.get(reclaim.NAME) or reclaim.Reclaim(),
    )
    plugins = profile.plugins
    if not any(p.name == quota.NAME for p in plugins):
        plugins = (*plugins, quota.Quota())
    return Profile.compose(f"{profile.name}/preemption", actions, plugins, profile.weights, profile.settings)


def profile_path() -> Path:
    """Where the deployable default profile lives in a source checkout."""
    return Path(__file__).resolve().parents[3] / "deploy" / "profiles" / "default.yaml"
