"""The fair-share profile (deploy/profiles/fair.yaml) and the registry it is built from.

`fair_profile()` builds it from every plugin and action of the core (`defaults.placement_registry`);
run it with `run_queue_cycle` (re-exported here), which supplies the `QueueContext` its queue-aware
actions read.
"""

from __future__ import annotations

from pathlib import Path

from gangline.core.actions.queueing import run_queue_cycle
from gangline.core.defaults import placement_registry
from gangline.core.framework.profile import Profile, load_profile_file

FAIR_PROFILE_PATH = Path(__file__).resolve().parents[3] / "deploy" / "profiles" / "fair.yaml"


def fair_profile(path: Path = FAIR_PROFILE_PATH) -> Profile:
    """The fair-share profile (deploy/profiles/fair.yaml)."""
    return load_profile_file(path, placement_registry())


__all__ = ["FAIR_PROFILE_PATH", "fair_profile", "run_queue_cycle"]
