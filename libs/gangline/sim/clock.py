"""The simulator's virtual clock: seconds from the start of the trace, only moving forward (pure)."""

from __future__ import annotations


class VirtualClock:
    """Virtual time in seconds; `advance_to` refuses to go back."""

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def advance_to(self, t: float) -> None:
        """Move to `t` (>= now)."""
        if t < self.now:
            raise ValueError(f"virtual time cannot go back from {self.now} to {t}")
        self.now = t
