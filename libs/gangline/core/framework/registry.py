"""Explicit registration: names → factories for plugins and actions. Nothing self-registers.

A factory takes the profile's `args` mapping for that entry and returns the plugin/action.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

Args = Mapping[str, object]
PluginFactory = Callable[[Args], object]
ActionFactory = Callable[[Args], object]


class Registry:
    """Name → factory maps; `merged` combines registries (later entries must not clash)."""

    def __init__(
        self,
        plugins: Mapping[str, PluginFactory],
        actions: Mapping[str, ActionFactory] | None = None,
    ) -> None:
        self.plugins: Mapping[str, PluginFactory] = MappingProxyType(dict(plugins))
        self.actions: Mapping[str, ActionFactory] = MappingProxyType(dict(actions or {}))

    def merged(self, other: Registry) -> Registry:
        """A registry with both sets of entries; a name registered twice is a programming error."""
        clash = (set(self.plugins) & set(other.plugins)) | (set(self.actions) & set(other.actions))
        if clash:
            raise ValueError(f"registered twice: {sorted(clash)}")
        return Registry({**self.plugins, **other.plugins}, {**self.actions, **other.actions})

    def plugin(self, name: str, args: Args) -> object:
        """A new plugin instance; KeyError names unknown plugins."""
        if name not in self.plugins:
            raise KeyError(f"unknown plugin {name!r}; registered: {sorted(self.plugins)}")
        return self.plugins[name](args)

    def action(self, name: str, args: Args) -> object:
        """A new action instance; KeyError names unknown actions."""
        if name not in self.actions:
            raise KeyError(f"unknown action {name!r}; registered: {sorted(self.actions)}")
        return self.actions[name](args)
