"""When a node counts as silent: its silence is measured over the time the bus was heard, not wall time.

Pure and synchronous: every time is a heartbeat's own (or the caller's); nothing here reads a clock.

A heartbeat heard at ``t`` (from any node) shows the bus carried heartbeats then, and is taken to speak
for the next ``gap`` too: the cluster is *heard* over the union of ``[t, t + gap]`` across every beat.
Where no node's beat was heard for longer than ``gap`` (the broker was down or unreachable, every
agent was cut off from it, nothing got into the log), the time past ``gap`` is *not heard*, and it
counts toward no node's silence. So after an outage, of any length, a node that was beating before it
is failed only once the bus has been heard for ``silence`` since its last beat, ``gap`` before the
outage included: ``silence - gap`` after the bus is back, at the least.

A node's silence is judged at an instant of the heartbeat stream itself (the newest beat heard), so
the decision is a function of the log: a replay that reads the same beats decides the same, and a
service reading the log late judges the same beats as one reading it at once.

``gap`` must be longer than the longest pause of a healthy heartbeat stream (the agents' heartbeat
interval, for a cluster with one live node); a shorter one only makes silence count more slowly.

The union is a function of the set of beats, not of the order they were heard in: beats folded in
another order (a replay merging partitions by time) give the same answers.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class Hearing:
    """The time the bus was heard: the union of ``[t, t + gap]`` over every heartbeat time ``t``."""

    gap: timedelta
    _starts: list[datetime] = field(default_factory=list, init=False, repr=False)
    _ends: list[datetime] = field(default_factory=list, init=False, repr=False)
    latest: datetime | None = field(default=None, init=False)
    """The newest beat heard (the instant silence is judged at)."""

    def __post_init__(self) -> None:
        if self.gap <= timedelta(0):
            raise ValueError("gap must be positive")

    def hear(self, at: datetime) -> None:
        """A heartbeat (of any node) was heard at ``at``."""
        if self.latest is None or at > self.latest:
            self.latest = at
        lo, hi = at, at + self.gap
        first = bisect.bisect_left(self._ends, lo)  # the first interval that does not end before ``at``
        last = first
        while last < len(self._starts) and self._starts[last] <= hi:
            lo = min(lo, self._starts[last])
            hi = max(hi, self._ends[last])
            last += 1
        self._starts[first:last] = [lo]
        self._ends[first:last] = [hi]

    def heard_within(self, since: datetime, until: datetime) -> timedelta:
        """How long the bus was heard in ``(since, until]``."""
        total = timedelta(0)
        for k in range(bisect.bisect_left(self._ends, since), len(self._starts)):
            start, end = self._starts[k], self._ends[k]
            if start >= until:
                break
            total += max(timedelta(0), min(end, until) - max(start, since))
        return total

    def forget_before(self, at: datetime) -> None:
        """Drop what ended before ``at``: no query that starts at ``at`` or later changes."""
        cut = bisect.bisect_left(self._ends, at)
        del self._starts[:cut], self._ends[:cut]

    @property
    def intervals(self) -> list[tuple[datetime, datetime]]:
        """The heard intervals, in order (disjoint)."""
        return list(zip(self._starts, self._ends, strict=True))


def silent(
    last_heard: Mapping[K, datetime], hearing: Hearing, *, silence: timedelta
) -> list[tuple[K, timedelta]]:
    """The nodes silent for longer than ``silence`` at the newest beat heard, each with its silence.

    ``last_heard``: each node's last sign of life (its last beat, its registration, or since when it is
    watched). A node's silence is the time the bus was heard since then (:class:`Hearing`). Nothing is
    silent before any beat was heard. In the mapping's key order.
    """
    at = hearing.latest
    if at is None:
        return []
    out: list[tuple[K, timedelta]] = []
    for node, since in last_heard.items():
        if at - since <= silence:
            continue  # not even silent in wall time: the common case, without a look at the outages
        heard = hearing.heard_within(since, at)
        if heard > silence:
            out.append((node, heard))
    return out
