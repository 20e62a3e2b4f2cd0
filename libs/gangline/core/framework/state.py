"""Per-job cycle state and the whole-gang candidates plugins score.

`CycleState` is the scratch space one job's trip through the extension points shares (as in
kube-scheduler): the snapshot, the cycle number, the facts pre-filters establish (eligible GPU
models, topology scope) and typed slots plugins use among themselves. It lives for one job in
one cycle; cycle-wide facts go in `Session.shared`, which every job's state can read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from gangline.core.model import TopologyLevel
from gangline.core.snapshot import Slot, Snapshot

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StateKey(Generic[T]):
    """A typed key for `CycleState.read/write`; create one per fact, at module level."""

    name: str


@dataclass(frozen=True, slots=True)
class Candidate:
    """One proposal for a whole gang: a slot per rank, all of GPU model `model`.

    `level`/`domain` name the topology domain the search kept the ranks in (None: no domain
    was imposed). A candidate is never partial: it has between the job's fewest and most workers.
    """

    model: int
    slots: tuple[Slot, ...]
    level: TopologyLevel | None = None
    domain: int | None = None

    @property
    def nodes(self) -> tuple[int, ...]:
        """Distinct node indexes, in rank order."""
        return tuple(dict.fromkeys(s.node for s in self.slots))


class CycleState:
    """Scratch state for one job in one cycle (see module docstring)."""

    __slots__ = ("_data", "cycle", "filter_cache", "models", "scope", "shared", "snapshot")

    def __init__(
        self, snapshot: Snapshot, cycle: int, shared: dict[StateKey[Any], Any] | None = None
    ) -> None:
        self.snapshot = snapshot
        self.cycle = cycle
        self.shared: dict[StateKey[Any], Any] = shared if shared is not None else {}
        self.models: tuple[int, ...] = tuple(range(len(snapshot.models)))
        """Indexes of GPU models the job may use; pre-filters narrow it."""
        self.scope: TopologyLevel | None = None
        """The level whose single domain must hold every rank (a required topology)."""
        self.filter_cache: dict[int, bool] = {}
        self._data: dict[StateKey[Any], Any] = {}

    def write(self, key: StateKey[T], value: T) -> None:
        """Store a per-job fact."""
        self._data[key] = value

    def read(self, key: StateKey[T]) -> T | None:
        """A per-job fact, or None when no plugin wrote it."""
        return cast("T | None", self._data.get(key))

    def read_shared(self, key: StateKey[T]) -> T | None:
        """A cycle-wide fact, or None."""
        return cast("T | None", self.shared.get(key))

    def write_shared(self, key: StateKey[T], value: T) -> None:
        """Store a cycle-wide fact (seen by every later job of this cycle)."""
        self.shared[key] = value


__all__ = ["Candidate", "CycleState", "StateKey"]
