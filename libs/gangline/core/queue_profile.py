"""The registry of the queueing plugins and actions (part 2), and the fair-share profile.

Nothing registers itself: `queue_registry()` lists part 2's plugins and actions explicitly, merged
with part 1's `placement_registry()`. `fair_profile()` builds the profile in
`deploy/profiles/fair.yaml`; run it with `run_queue_cycle` (re-exported here), which supplies the
`QueueContext` every part-2 step reads.
"""

from __future__ import annotations

from pathlib import Path

from gangline.core.actions import backfill, elastic, preempt, reclaim
from gangline.core.actions.queueing import run_queue_cycle
from gangline.core.defaults import placement_registry
from gangline.core.framework.profile import Profile, load_profile_file
from gangline.core.framework.registry import Registry
from gangline.core.plugins import priority, quota

FAIR_PROFILE_PATH = Path(__file__).resolve().parents[3] / "deploy" / "profiles" / "fair.yaml"


def queue_registry() -> Registry:
    """Part-1 placement + part-2 queueing: quota, priority, reserve, backfill, preempt, reclaim, elastic."""
    return placement_registry().merged(
        Registry(
            plugins={quota.NAME: quota.Quota, priority.NAME: priority.Priority},
            actions={
                backfill.RESERVE: backfill.Reserve,
                backfill.BACKFILL: backfill.Backfill,
                preempt.NAME: preempt.Preempt,
                reclaim.NAME: reclaim.Reclaim,
                elastic.NAME: elastic.Elastic,
            },
        )
    )


def fair_profile(path: Path = FAIR_PROFILE_PATH) -> Profile:
    """The fair-share profile (deploy/profiles/fair.yaml)."""
    return load_profile_file(path, queue_registry())


__all__ = ["FAIR_PROFILE_PATH", "fair_profile", "queue_registry", "run_queue_cycle"]
