"""What the node agent runs a gang's local ranks with: real processes, or a simulation.

A :class:`Runner` turns a :class:`GangLaunch` (this node's part of one allocation) into a
:class:`Gang`, which reports :mod:`gangline.agent.events` to the listener it was given and
ends with exactly one final event (``GangCompleted``, ``GangGaveUp`` or ``GangStopped``).
:class:`ProcessRunner` is the real one (a :class:`~gangline.agent.launcher.GangSupervisor`
per gang); :class:`gangline.agent.simulated.SimulatedRunner` is for fake clusters and tests.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gangline.agent.env import RankSpec, Rendezvous
from gangline.agent.events import CheckpointResult
from gangline.agent.launcher import Emit, GangSupervisor, LaunchSpec
from gangline.agent.restart import RestartPolicy

BASE_ENV_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "PYTHONPATH", "VIRTUAL_ENV")
"""What ranks inherit from the agent's own environment; the job's ``env`` goes over it."""


@dataclass(frozen=True)
class GangLaunch:
    """This node's share of one allocation, ready to run."""

    job_id: str
    allocation_id: str
    ranks: tuple[RankSpec, ...]
    """This node's ranks; ``gpus`` are what CUDA_VISIBLE_DEVICES takes (UUIDs)."""
    rendezvous: Rendezvous
    checkpoint_dir: Path
    log_dir: Path
    policy: RestartPolicy
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    duration_hint_s: float | None = None
    """The producer's estimate of the run time; the simulated runner runs for it (scaled)."""
    teardown_grace_s: float = 5.0


class Gang(Protocol):
    """One gang's local ranks under a restart policy (``GangSupervisor``'s surface)."""

    async def run(self) -> object:
        """Until the final event has been emitted."""
        ...

    async def peer_failed(self, attempt: int) -> None:
        """Another node's ranks of this gang failed in ``attempt``: tear this node's down too."""
        ...

    async def preempt(self, sig: int = signal.SIGTERM, grace_s: float = 30.0) -> CheckpointResult:
        """Ask the ranks to checkpoint and stop; returns once they are gone. Idempotent."""
        ...


class Runner(Protocol):
    def gang(self, launch: GangLaunch, listener: Emit) -> Gang:
        """A gang ready to ``run()``; raises ``ValueError`` when the launch cannot run here at all."""
        ...


class ProcessRunner:
    """Real worker processes: one :class:`GangSupervisor` per gang, the torch.distributed env per rank."""

    def __init__(self, *, base_env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self._base = (
            dict(base_env)
            if base_env is not None
            else {k: v for k, v in os.environ.items() if k in BASE_ENV_NAMES}
        )
        self._cwd = cwd

    def gang(self, launch: GangLaunch, listener: Emit) -> Gang:
        if not launch.command:
            raise ValueError(f"job {launch.job_id} gives no command and the agent has no default command")
        spec = LaunchSpec(
            job_id=launch.job_id,
            command=launch.command,
            ranks=launch.ranks,
            rendezvous=launch.rendezvous,
            log_dir=launch.log_dir,
            checkpoint_dir=launch.checkpoint_dir,
            env={**self._base, **launch.env},
            cwd=self._cwd,
            teardown_grace_s=launch.teardown_grace_s,
        )
        return GangSupervisor(spec, launch.policy, listener=listener)
