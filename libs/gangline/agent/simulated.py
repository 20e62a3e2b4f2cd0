"""A simulated workload: gangs that "run" for their job's duration, fail on demand, and checkpoint.

For fake clusters (``gangline fake-nodes``) and tests: no processes, the same events and the same
restart/preemption protocol as :class:`~gangline.agent.launcher.GangSupervisor`::

    runner = SimulatedRunner(time_scale=0.01, checkpoint_delay_s=0.1)   # 1 h of job = 36 s
    runner.plan_failure("job-7", PlannedFailure(after_s=0.5, exit_code=1))  # its attempt 0 fails
    runner.fail("job-8", rank=3)                                          # fail a running rank now

Progress survives preemption: an acknowledged checkpoint writes ``sim-progress.json`` into the job's
checkpoint directory, and a requeued launch with the same directory only runs what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gangline.agent.events import (
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
from gangline.agent.launcher import Emit
from gangline.agent.restart import GiveUp
from gangline.agent.runner import GangLaunch

PROGRESS_FILE = "sim-progress.json"
SIM_PID = 0
"""Simulated ranks have no process; RankStarted carries pid 0."""


@dataclass(frozen=True)
class PlannedFailure:
    """A rank of a job's gang exits with ``exit_code`` ``after_s`` (wall seconds) into the listed attempts."""

    after_s: float = 0.0
    rank: int | None = None
    """None: this node's lowest rank (a node without that rank ignores a rank it does not host)."""
    exit_code: int = 1
    attempts: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class _Fail:
    rank: int
    returncode: int


@dataclass(frozen=True)
class _PeerFailed:
    pass


@dataclass(frozen=True)
class _Preempt:
    sig: int
    grace_s: float


_Interrupt = _Fail | _PeerFailed | _Preempt


def read_progress(checkpoint_dir: Path) -> float:
    """Job-seconds of work saved by the last acknowledged simulated checkpoint (0 when none)."""
    try:
        return float(json.loads((checkpoint_dir / PROGRESS_FILE).read_text())["progress_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


class SimulatedGang:
    """One simulated gang on one node; the :class:`~gangline.agent.runner.Gang` protocol."""

    def __init__(
        self,
        launch: GangLaunch,
        listener: Emit,
        *,
        duration_s: float,
        time_scale: float,
        checkpoint_delay_s: float,
        failure: PlannedFailure | None,
        now: Callable[[], float],
    ) -> None:
        self.launch = launch
        self._listener = listener
        self._duration_s = duration_s
        self._scale = time_scale
        self._checkpoint_delay_s = checkpoint_delay_s
        self._failure = failure
        self._now = now
        self._attempt = 0
        self._running = False
        self._interrupt: asyncio.Future[_Interrupt] | None = None
        self._preempt_req: _Preempt | None = None
        self._preempt_wake = asyncio.Event()
        self._result: asyncio.Future[CheckpointResult] = asyncio.get_running_loop().create_future()
        self._done = False

    @property
    def attempt(self) -> int:
        return self._attempt

    @property
    def running(self) -> bool:
        """An attempt's ranks are up (not between attempts, not finished)."""
        return self._running

    @property
    def done(self) -> bool:
        return self._done

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(r.rank for r in self.launch.ranks)

    # ---- the Gang protocol ------------------------------------------------------------------

    async def run(self) -> GangCompleted | GangGaveUp | GangStopped:
        failures = 0
        launch = self.launch
        launch.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        while True:
            if self._preempt_req is not None:
                return self._finish(GangStopped(launch.job_id, self._attempt, self._idle_result()))
            progress = read_progress(launch.checkpoint_dir)
            started = self._now()
            self._start_attempt()
            interrupt = await self._wait_attempt(max(0.0, self._duration_s - progress) * self._scale)
            self._running = False
            if interrupt is None:
                self._exit_all(0)
                return self._finish(GangCompleted(launch.job_id, self._attempt))
            if isinstance(interrupt, _Preempt):
                result = await self._checkpoint(interrupt, progress, started)
                return self._finish(GangStopped(launch.job_id, self._attempt, result))
            failures += 1
            if isinstance(interrupt, _Fail):
                self._emit(RankExited(launch.job_id, self._attempt, interrupt.rank, interrupt.returncode))
                self._exit_all(-signal.SIGTERM, skip=interrupt.rank)
                failed = GangFailed(
                    launch.job_id, self._attempt, "rank_failed", interrupt.rank, interrupt.returncode
                )
            else:
                self._exit_all(-signal.SIGTERM)
                failed = GangFailed(launch.job_id, self._attempt, "peer_failed")
            self._emit(failed)
            decision = launch.policy.decide(failures)
            if isinstance(decision, GiveUp):
                return self._finish(GangGaveUp(launch.job_id, self._attempt, failures, decision.reason))
            self._emit(GangRestarting(launch.job_id, decision.attempt, failures, decision.delay_s))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._preempt_wake.wait(), timeout=decision.delay_s)
            self._attempt = decision.attempt

    async def peer_failed(self, attempt: int) -> None:
        if attempt == self._attempt:
            self._interrupt_with(_PeerFailed())

    async def preempt(self, sig: int = signal.SIGTERM, grace_s: float = 30.0) -> CheckpointResult:
        if self._preempt_req is None:
            self._preempt_req = _Preempt(sig, grace_s)
            self._preempt_wake.set()
            self._interrupt_with(self._preempt_req)
        return await asyncio.shield(self._result)

    # ---- failure injection ------------------------------------------------------------------

    def fail(self, rank: int | None = None, exit_code: int = 1) -> bool:
        """Make ``rank`` (default: the lowest here) exit with ``exit_code`` now; False when not running."""
        target = self.ranks[0] if rank is None else rank
        if target not in self.ranks or exit_code == 0:
            return False
        return self._interrupt_with(_Fail(target, exit_code))

    # ---- internals --------------------------------------------------------------------------

    def _start_attempt(self) -> None:
        launch = self.launch
        self._interrupt = asyncio.get_running_loop().create_future()
        self._running = True
        for r in launch.ranks:
            log = launch.log_dir / f"{launch.job_id}-a{self._attempt}-r{r.rank}.log"
            self._emit(RankStarted(launch.job_id, self._attempt, r.rank, SIM_PID, log))
        self._emit(GangStarted(launch.job_id, self._attempt, self.ranks))

    async def _wait_attempt(self, wall_s: float) -> _Interrupt | None:
        assert self._interrupt is not None
        planned = self._failure
        timers: list[asyncio.TimerHandle] = []
        loop = asyncio.get_running_loop()
        if planned is not None and self._attempt in planned.attempts:
            target = self.ranks[0] if planned.rank is None else planned.rank
            if target in self.ranks and planned.after_s < wall_s:
                timers.append(
                    loop.call_later(planned.after_s, self._interrupt_with, _Fail(target, planned.exit_code))
                )
        try:
            return await asyncio.wait_for(asyncio.shield(self._interrupt), timeout=wall_s)
        except TimeoutError:
            return None
        finally:
            for t in timers:
                t.cancel()

    def _interrupt_with(self, interrupt: _Interrupt) -> bool:
        fut = self._interrupt
        if not self._running or fut is None or fut.done():
            return False
        fut.set_result(interrupt)
        return True

    async def _checkpoint(self, req: _Preempt, progress: float, started: float) -> CheckpointResult:
        launch = self.launch
        if self._checkpoint_delay_s <= req.grace_s:
            await asyncio.sleep(self._checkpoint_delay_s)
            done = progress + (self._now() - started) / self._scale if self._scale > 0 else progress
            (launch.checkpoint_dir / PROGRESS_FILE).write_text(json.dumps({"progress_s": done}))
            self._exit_all(0)
            return CheckpointResult(
                launch.checkpoint_dir, req.sig, req.grace_s, self.ranks, (), self.ranks, self.ranks
            )
        await asyncio.sleep(req.grace_s)
        self._exit_all(-signal.SIGKILL)
        return CheckpointResult(launch.checkpoint_dir, req.sig, req.grace_s, (), self.ranks, (), self.ranks)

    def _exit_all(self, returncode: int, *, skip: int | None = None) -> None:
        for rank in self.ranks:
            if rank != skip:
                self._emit(RankExited(self.launch.job_id, self._attempt, rank, returncode))

    def _idle_result(self) -> CheckpointResult:
        sig, grace = (self._preempt_req.sig, self._preempt_req.grace_s) if self._preempt_req else (15, 0.0)
        return CheckpointResult(self.launch.checkpoint_dir, sig, grace, (), (), (), ())

    def _finish(
        self, final: GangCompleted | GangGaveUp | GangStopped
    ) -> GangCompleted | GangGaveUp | GangStopped:
        self._done = True
        self._running = False
        if not self._result.done():
            self._result.set_result(
                final.checkpoint if isinstance(final, GangStopped) else self._idle_result()
            )
        self._emit(final)
        return final

    def _emit(self, event: AgentEvent) -> None:
        self._listener(event)


class SimulatedRunner:
    """Runs gangs as timers: ``duration_hint_s`` (or ``default_duration_s``) x ``time_scale`` wall seconds.

    ``checkpoint_delay_s`` is how long a simulated checkpoint takes: within the grace it is
    acknowledged, beyond it the ranks are killed at the deadline without one.
    """

    def __init__(
        self,
        *,
        time_scale: float = 1.0,
        default_duration_s: float = 60.0,
        checkpoint_delay_s: float = 0.1,
        now: Callable[[], float] | None = None,
    ) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        self.time_scale = time_scale
        self.default_duration_s = default_duration_s
        self.checkpoint_delay_s = checkpoint_delay_s
        self._now = now
        self._plans: dict[str, PlannedFailure] = {}
        self._gangs: dict[str, SimulatedGang] = {}
        self.launches: list[GangLaunch] = []
        """Every launch this runner was given, in order (tests and fake clusters read it)."""

    def gang(self, launch: GangLaunch, listener: Emit) -> SimulatedGang:
        duration = launch.duration_hint_s if launch.duration_hint_s is not None else self.default_duration_s
        now = self._now or asyncio.get_running_loop().time
        gang = SimulatedGang(
            launch,
            listener,
            duration_s=duration,
            time_scale=self.time_scale,
            checkpoint_delay_s=self.checkpoint_delay_s,
            failure=self._plans.get(launch.job_id),
            now=now,
        )
        self._gangs[launch.job_id] = gang
        self.launches.append(launch)
        return gang

    def plan_failure(self, job_id: str, failure: PlannedFailure) -> None:
        """Gangs of ``job_id`` launched from now on fail as planned."""
        self._plans[job_id] = failure

    def fail(self, job_id: str, *, rank: int | None = None, exit_code: int = 1) -> bool:
        """Fail a rank of ``job_id``'s running gang now; False when none runs here."""
        gang = self._gangs.get(job_id)
        return gang is not None and gang.fail(rank, exit_code)

    def running(self) -> dict[str, SimulatedGang]:
        """The gangs not yet finished, by job id."""
        return {job: g for job, g in self._gangs.items() if not g.done}
