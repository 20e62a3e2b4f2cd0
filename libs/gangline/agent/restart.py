"""Restart policy: never, or on failure up to a maximum count with exponential back-off. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class Restart:
    attempt: int
    """The attempt number the gang restarts as."""
    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    reason: str


class RestartPolicy(BaseModel):
    """A failed rank restarts the whole gang; every node applies the same policy to the same count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["never", "on_failure"] = "on_failure"
    max_restarts: int = Field(default=3, ge=0)
    backoff_initial_s: float = Field(default=1.0, ge=0)
    backoff_factor: float = Field(default=2.0, ge=1)
    backoff_max_s: float = Field(default=60.0, ge=0)

    def decide(self, failures: int) -> Restart | GiveUp:
        """After the ``failures``-th failure (1 for the first): restart, or give up with a reason."""
        if failures < 1:
            raise ValueError("decide() is asked after a failure")
        if self.mode == "never":
            return GiveUp("restart policy is never")
        if failures > self.max_restarts:
            return GiveUp(f"failed {failures} times; at most {self.max_restarts} restarts allowed")
        delay = self.backoff_initial_s * self.backoff_factor ** (failures - 1)
        return Restart(attempt=failures, delay_s=min(delay, self.backoff_max_s))
