"""The profile preemption plans with (`planning_profile`): allocate, then the profile's own preempt and
reclaim (or the core's), over the profile's plugins with quota's among them."""

from __future__ import annotations

from gangline.core.actions.preempt import Preempt
from gangline.core.defaults import default_profile, placement_registry, planning_profile
from gangline.core.framework.profile import load_profile

WITH_PREEMPT = """\
name: urgent
actions:
  - allocate
  - name: preempt
    args: {max_preemptors: 2}
plugins: [health, gpu-fit, gang, quota]
"""


def test_the_default_profile_plans_with_allocate_preempt_reclaim_and_quota() -> None:
    planner = planning_profile(default_profile())
    assert planner.name == "default/preemption"
    assert [a.name for a in planner.actions] == ["allocate", "preempt", "reclaim"]
    names = [p.name for p in planner.plugins]
    assert names[:-1] == [p.name for p in default_profile().plugins]
    assert names[-1] == "quota"


def test_a_profiles_own_preempt_is_kept_and_quota_not_added_twice() -> None:
    profile = load_profile(WITH_PREEMPT, placement_registry())
    planner = planning_profile(profile)
    listed = next(a for a in profile.actions if a.name == "preempt")
    assert isinstance(listed, Preempt) and listed.max_preemptors == 2
    assert planner.actions[1] is listed
    assert [p.name for p in planner.plugins].count("quota") == 1
