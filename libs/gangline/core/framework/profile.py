"""A profile composes actions and plugins (with score weights and args), from YAML.

```yaml
name: default
actions: [allocate]            # run in this order each cycle; entries may be {name, args}
plugins:                       # each is filed under every extension point it implements
  - name: health
  - name: binpack
    weight: 2                  # multiplies its 0..100 score (default 1)
    args: {}                   # passed to the factory
settings:
  max_candidates: 4            # whole-gang candidates scored per job
  gate_credit_s: 86400         # the quota gate's backfill window (gangline.core.gate_credit); absent: off
  starvation_s: 172800         # waited longer: served before fair share, oldest first; absent: never
  line_order: shortest-run     # the gate's line: submit (default), shortest-run, shortest-work
  gate_reserve: true           # the quota gate reserves quota for the oldest starving job it holds
  short_first_weight: 1.0      # placement's line: submit time + weight x run bound; absent: submit time
```

Plugins run at each extension point in the order listed. A bad profile is a configuration
error and raises `ValueError` at load time, never during a cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from gangline.core.fairshare import LINE_ORDERS
from gangline.core.framework.plugin import (
    Action,
    FilterPlugin,
    JobOrderPlugin,
    PermitPlugin,
    Plugin,
    PreFilterPlugin,
    ReservePlugin,
    ScorePlugin,
)
from gangline.core.framework.registry import Registry


@dataclass(frozen=True, slots=True)
class Settings:
    """Knobs of the search, shared by every action."""

    max_candidates: int = 4
    """Whole-gang candidates built and scored per job (more: better choices, slower)."""
    gate_credit_s: float | None = None
    """The quota gate lends what is charged to jobs placement cannot place yet to held jobs whose run
    bound is at most this many seconds (:mod:`gangline.core.gate_credit`); None: it lends nothing."""
    starvation_s: float | None = None
    """A job that has waited longer than this is served before fair share's order, oldest first, at the
    quota gate and in placement's order (:func:`gangline.core.fairshare.serving_share`); None: never."""
    line_order: str = "submit"
    """How each queue's line at the quota gate orders its jobs at one priority, after those past
    ``starvation_s``: by submit time, or the shortest run bound / least expected work first
    (:func:`gangline.core.fairshare.line_work`). Placement keeps its own order (priority, fair share,
    admitted time) over the jobs the gate let through."""
    gate_reserve: bool = False
    """The quota gate reserves quota for the oldest job past ``starvation_s`` it holds, EASY backfill on
    quota (:class:`gangline.core.quota_gate.GateReservation`): later jobs go only if they end before its
    expected start or leave it enough then. Needs ``starvation_s``."""
    short_first_weight: float | None = None
    """Shortest first among jobs submitted together: in placement's line and order a job stands as if
    submitted this many times its run bound later (:func:`gangline.core.waiting.line_time`; 1: by its
    earliest possible end); None: by submit time alone. Fair share, priority and the starvation bound
    are read as before."""


@dataclass(frozen=True)
class Profile:
    """Actions and plugins, ready to run; see module docstring."""

    name: str
    actions: tuple[Action, ...]
    plugins: tuple[Plugin, ...]
    weights: Mapping[str, int]
    settings: Settings = field(default_factory=Settings)
    pre_filters: tuple[PreFilterPlugin, ...] = ()
    filters: tuple[FilterPlugin, ...] = ()
    scorers: tuple[tuple[ScorePlugin, int, str], ...] = ()
    """(plugin, weight, name) in profile order."""
    reservers: tuple[ReservePlugin, ...] = ()
    permits: tuple[PermitPlugin, ...] = ()
    orderers: tuple[JobOrderPlugin, ...] = ()

    @staticmethod
    def compose(
        name: str,
        actions: tuple[Action, ...],
        plugins: tuple[Plugin, ...],
        weights: Mapping[str, int] | None = None,
        settings: Settings | None = None,
    ) -> Profile:
        """File each plugin under the extension points it implements."""
        w = {p.name: (weights or {}).get(p.name, 1) for p in plugins}
        return Profile(
            name=name,
            actions=actions,
            plugins=plugins,
            weights=w,
            settings=settings or Settings(),
            pre_filters=tuple(p for p in plugins if isinstance(p, PreFilterPlugin)),
            filters=tuple(p for p in plugins if isinstance(p, FilterPlugin)),
            scorers=tuple((p, w[p.name], p.name) for p in plugins if isinstance(p, ScorePlugin)),
            reservers=tuple(p for p in plugins if isinstance(p, ReservePlugin)),
            permits=tuple(p for p in plugins if isinstance(p, PermitPlugin)),
            orderers=tuple(p for p in plugins if isinstance(p, JobOrderPlugin)),
        )


def _entry(raw: object, what: str) -> tuple[str, Mapping[str, object], int]:
    if isinstance(raw, str):
        return raw, {}, 1
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        raise ValueError(f"each {what} needs a name: {raw!r}")
    args = raw.get("args") or {}
    weight = raw.get("weight", 1)
    if not isinstance(args, Mapping):
        raise ValueError(f"{what} {raw['name']}: args must be a mapping")
    if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
        raise ValueError(f"{what} {raw['name']}: weight must be a non-negative integer")
    return cast(str, raw["name"]), cast(Mapping[str, object], args), weight


def profile_from_mapping(doc: Mapping[str, Any], registry: Registry) -> Profile:
    """Build a profile from an already-parsed document."""
    name = doc.get("name")
    if not isinstance(name, str):
        raise ValueError("profile needs a name")
    actions: list[Action] = []
    for raw in doc.get("actions") or []:
        a_name, a_args, _ = _entry(raw, "action")
        action = registry.action(a_name, a_args)
        if not isinstance(action, Action):
            raise ValueError(f"{a_name} is not an action")
        actions.append(action)
    if not actions:
        raise ValueError("profile needs at least one action")
    plugins: list[Plugin] = []
    weights: dict[str, int] = {}
    for raw in doc.get("plugins") or []:
        p_name, p_args, weight = _entry(raw, "plugin")
        plugin = registry.plugin(p_name, p_args)
        if not isinstance(plugin, Plugin) or plugin.name != p_name:
            raise ValueError(f"plugin {p_name} must expose name == {p_name!r}")
        if p_name in weights:
            raise ValueError(f"plugin {p_name} listed twice")
        plugins.append(plugin)
        weights[p_name] = weight
    raw_settings = doc.get("settings") or {}
    if not isinstance(raw_settings, Mapping):
        raise ValueError("settings must be a mapping")
    known = {
        "max_candidates",
        "gate_credit_s",
        "starvation_s",
        "line_order",
        "gate_reserve",
        "short_first_weight",
    }
    unknown = set(raw_settings) - known
    if unknown:
        raise ValueError(f"unknown settings: {sorted(unknown)}")
    max_candidates = raw_settings.get("max_candidates", Settings().max_candidates)
    if not isinstance(max_candidates, int) or max_candidates < 1:
        raise ValueError("settings.max_candidates must be a positive integer")
    credit, starvation = (_seconds(raw_settings, k) for k in ("gate_credit_s", "starvation_s"))
    line_order = raw_settings.get("line_order", Settings().line_order)
    if not isinstance(line_order, str) or line_order not in LINE_ORDERS:
        raise ValueError(f"settings.line_order must be one of {', '.join(LINE_ORDERS)}")
    gate_reserve = raw_settings.get("gate_reserve", Settings().gate_reserve)
    if not isinstance(gate_reserve, bool):
        raise ValueError("settings.gate_reserve must be true or false")
    if gate_reserve and starvation is None:
        raise ValueError("settings.gate_reserve needs settings.starvation_s (only a starving job reserves)")
    short_first = raw_settings.get("short_first_weight")
    if short_first is not None and (
        isinstance(short_first, bool) or not isinstance(short_first, int | float) or short_first < 0
    ):
        raise ValueError("settings.short_first_weight must be a non-negative number")
    short_first_weight = None if short_first is None else float(short_first)
    settings = Settings(
        max_candidates=max_candidates,
        gate_credit_s=credit,
        starvation_s=starvation,
        line_order=line_order,
        gate_reserve=gate_reserve,
        short_first_weight=short_first_weight,
    )
    return Profile.compose(name, tuple(actions), tuple(plugins), weights, settings)


def load_profile(text: str, registry: Registry) -> Profile:
    """Parse a YAML profile document."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, Mapping):
        raise ValueError("a profile is a YAML mapping")
    return profile_from_mapping(doc, registry)


def load_profile_file(path: str | Path, registry: Registry) -> Profile:
    """Parse a YAML profile file."""
    return load_profile(Path(path).read_text(encoding="utf-8"), registry)


def _seconds(raw: Mapping[str, object], key: str) -> float | None:
    """An optional setting in seconds (absent: None)."""
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"settings.{key} must be a non-negative number of seconds")
    return float(value)
