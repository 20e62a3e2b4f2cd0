"""Start a gang's local ranks as processes, watch them, stop them, restart the gang per policy.

:class:`GangLauncher` is one attempt on one node. :class:`GangSupervisor` runs attempts under a
:class:`~gangline.agent.restart.RestartPolicy` and is what the agent shell drives::

    sup = GangSupervisor(spec, policy, listener=publish)      # publish(event) -> jobs.events
    task = asyncio.create_task(sup.run())
    ...  await sup.peer_failed(attempt)                        # another node reported GangFailed
    ...  result = await sup.preempt(signal.SIGTERM, grace_s)   # job.preempting

Every rank runs in its own session (process group), so signals reach the processes it forks too.
Its stdout and stderr go to ``<log_dir>/<job>-a<attempt>-r<rank>.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gangline.agent.env import RankSpec, Rendezvous, ack_file, rank_env
from gangline.agent.events import (
    FINAL_EVENTS,
    AgentEvent,
    CheckpointResult,
    GangCompleted,
    GangFailed,
    GangGaveUp,
    GangRestarting,
    GangStarted,
    GangStopped,
    RankExited,
    RankStarted,
)
from gangline.agent.restart import GiveUp, RestartPolicy


@dataclass(frozen=True)
class LaunchSpec:
    job_id: str
    command: tuple[str, ...]
    ranks: tuple[RankSpec, ...]
    rendezvous: Rendezvous
    log_dir: Path
    checkpoint_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    """The base environment of every rank (the shell passes the job's ``env`` over a clean base)."""
    cwd: Path | None = None
    teardown_grace_s: float = 5.0
    """When the gang fails: how long survivors get after SIGTERM before SIGKILL."""


@dataclass(frozen=True)
class Completed:
    pass


@dataclass(frozen=True)
class Failed:
    reason: str
    rank: int | None = None
    returncode: int | None = None


@dataclass(frozen=True)
class Stopped:
    checkpoint: CheckpointResult


Outcome = Completed | Failed | Stopped
Emit = Callable[[AgentEvent], None]


class GangLauncher:
    """One attempt of this node's ranks. A rank that exits non-zero stops the others."""

    def __init__(self, spec: LaunchSpec, attempt: int, emit: Emit) -> None:
        self.spec = spec
        self.attempt = attempt
        self._emit = emit
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._watchers: list[asyncio.Task[None]] = []
        self._ending: Outcome | None = None
        self._stop_lock = asyncio.Lock()
        self._started = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()
        self._teardown: asyncio.Task[tuple[tuple[int, ...], tuple[int, ...]]] | None = None

    @property
    def pids(self) -> dict[int, int]:
        return {rank: p.pid for rank, p in self._procs.items()}

    @property
    def ending(self) -> bool:
        """Failed, stopping or stopped: no longer a running gang."""
        return self._ending is not None or self._stopping

    @property
    def failed(self) -> bool:
        return isinstance(self._ending, Failed)

    async def start(self) -> None:
        spec = self.spec
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        try:
            for r in spec.ranks:
                ack = ack_file(spec.checkpoint_dir, r.rank)
                ack.unlink(missing_ok=True)
                # there before the rank runs: acknowledging is creating one file (a shell's `: > "$ACK"`)
                ack.parent.mkdir(parents=True, exist_ok=True)
                env = rank_env(
                    job_id=spec.job_id,
                    rank=r,
                    rendezvous=spec.rendezvous,
                    local_world_size=len(spec.ranks),
                    attempt=self.attempt,
                    checkpoint_dir=spec.checkpoint_dir,
                    base=spec.env,
                )
                log_path = spec.log_dir / f"{_safe(spec.job_id)}-a{self.attempt}-r{r.rank}.log"
                with log_path.open("ab") as log:
                    proc = await asyncio.create_subprocess_exec(
                        *spec.command,
                        env=env,
                        cwd=spec.cwd,
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=log,
                        stderr=asyncio.subprocess.STDOUT,
                        start_new_session=True,
                    )
                self._procs[r.rank] = proc
                self._emit(RankStarted(spec.job_id, self.attempt, r.rank, proc.pid, log_path))
                self._watchers.append(asyncio.create_task(self._watch(r.rank, proc)))
        except OSError as err:
            self._ending = Failed(reason="launch_failed")
            self._emit_launch_error(err)
            self._teardown = asyncio.create_task(self._signal_all(spec.teardown_grace_s))
        else:
            self._emit(GangStarted(spec.job_id, self.attempt, tuple(r.rank for r in spec.ranks)))
        finally:
            self._started.set()

    async def wait(self) -> Outcome:
        """Until every local rank has exited; then how the attempt ended."""
        await self._started.wait()
        await asyncio.gather(*self._watchers)
        if self._stopping:
            await self._stopped.wait()
        if self._teardown is not None:
            await self._teardown
        return self._ending or Completed()

    async def fail_from_peer(self) -> None:
        """Another node's ranks failed: tear this node's down (the gang restarts as a whole)."""
        await self._started.wait()
        if self._ending is None and not self._stopping:
            self._ending = Failed(reason="peer_failed")
            self._teardown = asyncio.create_task(self._signal_all(self.spec.teardown_grace_s))
            await self._teardown

    async def stop(self, sig: int, grace_s: float) -> CheckpointResult:
        """Preemption: send ``sig``, wait up to ``grace_s``, SIGKILL the rest, collect acknowledgements."""
        self._stopping = True  # before any await: exits from here on are not failures
        await self._started.wait()
        spec = self.spec
        ranks = tuple(r.rank for r in spec.ranks)
        async with self._stop_lock:
            if isinstance(self._ending, Stopped):
                return self._ending.checkpoint
            for rank in ranks:
                ack_file(spec.checkpoint_dir, rank).unlink(missing_ok=True)
            if self._teardown is None:
                self._teardown = asyncio.create_task(self._signal_all(grace_s, sig))
            exited, killed = await self._teardown
            acked = tuple(r for r in ranks if ack_file(spec.checkpoint_dir, r).exists())
            result = CheckpointResult(spec.checkpoint_dir, sig, grace_s, exited, killed, acked, ranks)
            self._ending = Stopped(result)
            self._stopped.set()
            return result

    # ---- internals --------------------------------------------------------------------------

    async def _watch(self, rank: int, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        self._emit(RankExited(self.spec.job_id, self.attempt, rank, rc))
        if rc != 0 and self._ending is None and not self._stopping:
            self._ending = Failed(reason="rank_failed", rank=rank, returncode=rc)
            self._teardown = asyncio.create_task(self._signal_all(self.spec.teardown_grace_s))

    async def _signal_all(
        self, grace_s: float, sig: int = signal.SIGTERM
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Signal every live rank's process group; SIGKILL what is left at the deadline."""
        alive = {rank: p for rank, p in self._procs.items() if p.returncode is None}
        for p in alive.values():
            _killpg(p.pid, sig)
        waits = {rank: asyncio.create_task(p.wait()) for rank, p in alive.items()}
        if waits:
            await asyncio.wait(waits.values(), timeout=grace_s)
        killed = tuple(sorted(rank for rank, t in waits.items() if not t.done()))
        for rank in killed:
            _killpg(alive[rank].pid, signal.SIGKILL)
        if waits:
            await asyncio.gather(*waits.values())
        exited = tuple(sorted(rank for rank in alive if rank not in killed))
        return exited, killed

    def _emit_launch_error(self, err: OSError) -> None:
        # the rank that could not start has no process; report it as exited with 127 like a shell
        started = set(self._procs)
        for r in self.spec.ranks:
            if r.rank not in started:
                self._emit(RankExited(self.spec.job_id, self.attempt, r.rank, 127))
                break


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


@dataclass(frozen=True)
class SupervisorOutcome:
    final: GangCompleted | GangGaveUp | GangStopped
    attempts: int
    failures: int


class GangSupervisor:
    """Runs a job's local ranks through attempts until completion, give-up or preemption.

    Failures are counted per attempt, so all nodes of a gang, seeing the same attempts fail,
    take the same restart decisions. ``peer_failed`` for an attempt that already ended is a no-op.
    """

    def __init__(
        self,
        spec: LaunchSpec,
        policy: RestartPolicy,
        *,
        listener: Emit | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.spec = spec
        self.policy = policy
        self._listener = listener
        self._sleep = sleep
        self._queue: asyncio.Queue[AgentEvent] = asyncio.Queue()
        self._attempt = 0
        self._launcher: GangLauncher | None = None
        self._preempt: tuple[int, float] | None = None
        self._preempted = asyncio.Event()
        self._stop_result: asyncio.Future[CheckpointResult] | None = None

    @property
    def attempt(self) -> int:
        return self._attempt

    @property
    def launcher(self) -> GangLauncher | None:
        return self._launcher

    async def events(self) -> AsyncIterator[AgentEvent]:
        """Every event, in order, ending after the final one (completed, gave up, stopped)."""
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, FINAL_EVENTS):
                return

    async def run(self) -> SupervisorOutcome:
        failures = 0
        while True:
            if self._preempt is not None:  # preempted between attempts: nothing runs, nothing to save
                return self._finish(self._stopped_idle(), failures)
            launcher = GangLauncher(self.spec, self._attempt, self._emit)
            self._launcher = launcher
            await launcher.start()
            outcome = await launcher.wait()
            if isinstance(outcome, Completed):
                return self._finish(GangCompleted(self.spec.job_id, self._attempt), failures)
            if isinstance(outcome, Stopped):
                return self._finish(
                    GangStopped(self.spec.job_id, self._attempt, outcome.checkpoint), failures
                )
            failures += 1
            self._emit(
                GangFailed(self.spec.job_id, self._attempt, outcome.reason, outcome.rank, outcome.returncode)
            )
            decision = self.policy.decide(failures)
            if isinstance(decision, GiveUp):
                return self._finish(
                    GangGaveUp(self.spec.job_id, self._attempt, failures, decision.reason), failures
                )
            self._emit(GangRestarting(self.spec.job_id, decision.attempt, failures, decision.delay_s))
            await self._backoff(decision.delay_s)
            self._attempt = decision.attempt

    async def peer_failed(self, attempt: int) -> None:
        launcher = self._launcher
        if launcher is not None and launcher.attempt == attempt and not launcher.ending:
            await launcher.fail_from_peer()

    async def preempt(self, sig: int = signal.SIGTERM, grace_s: float = 30.0) -> CheckpointResult:
        """Signal the workers to checkpoint and stop; returns once they are gone."""
        if self._preempt is None:
            self._preempt = (sig, grace_s)
            self._preempted.set()
        launcher = self._launcher
        if launcher is not None and not launcher.failed:
            return await launcher.stop(sig, grace_s)
        return self._idle_result()

    # ---- internals --------------------------------------------------------------------------

    def _emit(self, event: AgentEvent) -> None:
        self._queue.put_nowait(event)
        if self._listener is not None:
            self._listener(event)

    def _finish(self, final: GangCompleted | GangGaveUp | GangStopped, failures: int) -> SupervisorOutcome:
        self._emit(final)
        return SupervisorOutcome(final=final, attempts=self._attempt + 1, failures=failures)

    async def _backoff(self, delay_s: float) -> None:
        sleeper = asyncio.ensure_future(self._sleep(delay_s))
        preempted = asyncio.create_task(self._preempted.wait())
        await asyncio.wait({sleeper, preempted}, return_when=asyncio.FIRST_COMPLETED)
        for t in (sleeper, preempted):
            t.cancel()

    def _idle_result(self) -> CheckpointResult:
        sig, grace = self._preempt or (signal.SIGTERM, 0.0)
        return CheckpointResult(self.spec.checkpoint_dir, sig, grace, (), (), (), ())

    def _stopped_idle(self) -> GangStopped:
        return GangStopped(self.spec.job_id, self._attempt, self._idle_result())
