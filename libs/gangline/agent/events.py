"""What the agent library reports. The shell maps these to ``jobs.events`` (job.started, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RankStarted:
    job_id: str
    attempt: int
    rank: int
    pid: int
    log_path: Path


@dataclass(frozen=True)
class RankExited:
    job_id: str
    attempt: int
    rank: int
    returncode: int
    """Negative: killed by that signal (``-9`` SIGKILL), as asyncio reports it."""


@dataclass(frozen=True)
class GangStarted:
    """All local ranks are running: the shell reports ``job.started`` for this node."""

    job_id: str
    attempt: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class GangCompleted:
    job_id: str
    attempt: int


@dataclass(frozen=True)
class GangFailed:
    """This node's part of the gang ended in failure; every other node must stop theirs (``peer_failed``)."""

    job_id: str
    attempt: int
    reason: str
    """``rank_failed``, ``peer_failed`` or ``launch_failed``."""
    rank: int | None = None
    returncode: int | None = None


@dataclass(frozen=True)
class GangRestarting:
    job_id: str
    attempt: int
    """The attempt about to start."""
    failures: int
    delay_s: float


@dataclass(frozen=True)
class GangGaveUp:
    job_id: str
    attempt: int
    failures: int
    reason: str


@dataclass(frozen=True)
class CheckpointResult:
    """How a preemption stop went, rank by rank."""

    checkpoint_dir: Path
    signal: int
    grace_s: float
    exited_in_grace: tuple[int, ...]
    killed: tuple[int, ...]
    """Ranks still alive at the deadline, SIGKILLed."""
    acked: tuple[int, ...]
    """Ranks that created their ``GANGLINE_CHECKPOINT_ACK`` file."""
    ranks: tuple[int, ...]

    @property
    def acknowledged(self) -> bool:
        return bool(self.ranks) and not self.killed and set(self.acked) == set(self.ranks)


@dataclass(frozen=True)
class GangStopped:
    """Stopped for preemption; the shell reports the checkpoint acknowledgement from ``checkpoint``."""

    job_id: str
    attempt: int
    checkpoint: CheckpointResult


AgentEvent = (
    RankStarted
    | RankExited
    | GangStarted
    | GangCompleted
    | GangFailed
    | GangRestarting
    | GangGaveUp
    | GangStopped
)
FINAL_EVENTS = (GangCompleted, GangGaveUp, GangStopped)
