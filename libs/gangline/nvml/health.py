"""GPU health classification: what an XID or a counter means for the GPU and for the job on it.

Pure and synchronous: time comes in as arguments, nothing here reads a clock or talks to NVML.
``node_health`` wraps :class:`GpuHealthMonitor` (one per node or per partition) and publishes its
findings; the same monitor runs inside the simulator.

Actions, most severe first:

- ``cordon``   the GPU is broken now: take it out, fail the job on it, reset or RMA.
- ``drain``    the GPU still works but needs a reset (pending row remap, uncorrectable error seen,
               degrading error rate): place nothing new, let the running job finish.
- ``fail_job`` the job failed (its own fault, usually); the GPU is fine.
- ``watch``    record and trend (correctable ECC, throttling, heat).
- ``ignore``   expected noise (XID 45 after a kill).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from gangline.nvml.types import GpuEvent, GpuEventKind, GpuHealthSample, GpuState, GpuUuid

# Clock-event reason bits, as nvmlClocksEventReason* / nvmlClocksThrottleReason* define them.
THROTTLE_HW_SLOWDOWN = 0x08
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
_THROTTLE_NAMES = {
    THROTTLE_HW_SLOWDOWN: "hw_slowdown",
    THROTTLE_SW_THERMAL: "sw_thermal_slowdown",
    THROTTLE_HW_THERMAL: "hw_thermal_slowdown",
    THROTTLE_HW_POWER_BRAKE: "hw_power_brake",
}


class Action(StrEnum):
    CORDON = "cordon"
    DRAIN = "drain"
    FAIL_JOB = "fail_job"
    WATCH = "watch"
    IGNORE = "ignore"


SEVERITY: dict[Action, int] = {
    Action.CORDON: 4,
    Action.DRAIN: 3,
    Action.FAIL_JOB: 2,
    Action.WATCH: 1,
    Action.IGNORE: 0,
}


@dataclass(frozen=True)
class XidRule:
    xid: int
    meaning: str
    action: Action
    fails_job: bool
    """Whether the job running on the GPU is lost with it."""


def _rules(*rules: XidRule) -> dict[int, XidRule]:
    return {r.xid: r for r in rules}


# After NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors) and common fleet practice;
# 63/64 read as row remapping, which is what Ampere and later report (Volta: page retirement).
XID_RULES: dict[int, XidRule] = _rules(
    XidRule(8, "GPU stopped processing (channel idle timeout)", Action.FAIL_JOB, True),
    XidRule(13, "graphics engine exception (application fault)", Action.FAIL_JOB, True),
    XidRule(31, "GPU memory page fault (application illegal address)", Action.FAIL_JOB, True),
    XidRule(32, "invalid or corrupted push buffer / PCIe DMA fault", Action.WATCH, True),
    XidRule(38, "driver firmware error", Action.DRAIN, True),
    XidRule(43, "GPU stopped processing (application fault, GPU healthy)", Action.FAIL_JOB, True),
    XidRule(45, "preemptive cleanup after a kill or earlier error", Action.IGNORE, False),
    XidRule(48, "double-bit (uncorrectable) ECC error", Action.CORDON, True),
    XidRule(61, "internal micro-controller breakpoint/warning", Action.CORDON, True),
    XidRule(62, "internal micro-controller halt", Action.CORDON, True),
    XidRule(
        63, "row remapping pending (ECC page retirement recorded); reset to activate", Action.DRAIN, False
    ),
    XidRule(64, "row remapping / page retirement failure", Action.CORDON, True),
    XidRule(68, "video decoder exception", Action.FAIL_JOB, True),
    XidRule(69, "graphics engine class error", Action.FAIL_JOB, True),
    XidRule(74, "NVLink error", Action.CORDON, True),
    XidRule(79, "GPU has fallen off the bus", Action.CORDON, True),
    XidRule(92, "high single-bit ECC error rate", Action.WATCH, False),
    XidRule(94, "contained uncorrectable ECC error; reset to remap", Action.DRAIN, True),
    XidRule(95, "uncontained uncorrectable ECC error", Action.CORDON, True),
    XidRule(109, "context switch timeout", Action.FAIL_JOB, True),
    XidRule(119, "GSP RPC timeout", Action.CORDON, True),
    XidRule(120, "GSP error", Action.CORDON, True),
    XidRule(121, "C2C link error", Action.CORDON, True),
    XidRule(140, "unrecovered ECC error in GPU memory", Action.CORDON, True),
    XidRule(143, "GPU initialisation failure", Action.CORDON, True),
    XidRule(145, "NVLink RLW error", Action.CORDON, True),
    XidRule(149, "NVLink NETIR error", Action.CORDON, True),
    XidRule(154, "GPU recovery action changed (reset or reboot required)", Action.DRAIN, False),
)


def classify_xid(xid: int) -> XidRule:
    """The rule for ``xid``; unknown codes are watched, never acted on blindly."""
    return XID_RULES.get(xid, XidRule(xid, f"XID {xid} not in the catalogue", Action.WATCH, False))


class HealthFinding(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: GpuUuid
    action: Action
    code: str
    """Stable and machine-readable: ``xid.79``, ``ecc.dbe``, ``remap.pending``, ``ecc.sbe_rate``..."""
    reason: str
    fails_job: bool
    at: datetime


def worst(findings: Iterable[HealthFinding]) -> Action | None:
    ranked = sorted(findings, key=lambda f: SEVERITY[f.action], reverse=True)
    return ranked[0].action if ranked else None


class HealthPolicy(BaseModel):
    """Thresholds; the defaults are conservative fleet defaults, tune per GPU model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    short_window: timedelta = timedelta(hours=1)
    long_window: timedelta = timedelta(hours=24)
    sbe_per_short_window: int = 100
    """Correctable ECC errors in ``short_window`` that mark a GPU degraded (drain)."""
    sbe_per_long_window: int = 1000
    job_fault_xids_per_long_window: int = 5
    """Application-class XIDs on one GPU across jobs: beyond this the GPU, not the code, is suspect."""
    watch_xids_per_short_window: int = 3
    temperature_watch_c: int = 85
    retired_pages_limit: int = 60
    """Volta-era GPUs retire at most 64 pages; near the limit the GPU is due for RMA."""


class RollingCounter:
    """Event counts per key over a sliding time window. Timestamps are given, never read.

    Out-of-order timestamps are accepted; counts older than ``now - window`` are dropped when queried.
    """

    def __init__(self, window: timedelta) -> None:
        if window <= timedelta(0):
            raise ValueError("window must be positive")
        self.window = window
        self._times: dict[Hashable, list[datetime]] = {}
        self._counts: dict[Hashable, list[int]] = {}

    def add(self, key: Hashable, at: datetime, count: int = 1) -> None:
        if count <= 0:
            return
        times = self._times.setdefault(key, [])
        counts = self._counts.setdefault(key, [])
        i = bisect.bisect_right(times, at)
        times.insert(i, at)
        counts.insert(i, count)

    def count(self, key: Hashable, now: datetime) -> int:
        times = self._times.get(key)
        if not times:
            return 0
        counts = self._counts[key]
        start = bisect.bisect_right(times, now - self.window)
        del times[:start], counts[:start]
        end = bisect.bisect_right(times, now)
        return sum(counts[:end])

    def rate_per_hour(self, key: Hashable, now: datetime) -> float:
        return self.count(key, now) / (self.window / timedelta(hours=1))

    def keys(self) -> list[Hashable]:
        return list(self._times)


class GpuHealthMonitor:
    """Folds samples and events of many GPUs into findings; edge-triggered per (GPU, code).

    ``observe_*`` return only findings that are new since the condition was last seen clear,
    so a publisher can emit each as one ``nodes.health`` event. ``active`` gives the current set.
    """

    def __init__(self, policy: HealthPolicy | None = None) -> None:
        self.policy = policy or HealthPolicy()
        p = self.policy
        self._sbe_short = RollingCounter(p.short_window)
        self._sbe_long = RollingCounter(p.long_window)
        self._job_xids = RollingCounter(p.long_window)
        self._watch_xids = RollingCounter(p.short_window)
        self._last_sbe: dict[GpuUuid, int] = {}
        self._active: dict[tuple[GpuUuid, str], HealthFinding] = {}
        self._sample_codes: dict[GpuUuid, set[str]] = {}

    def active(self, gpu: GpuUuid | None = None) -> list[HealthFinding]:
        return [f for (g, _), f in sorted(self._active.items()) if gpu is None or g == gpu]

    def verdict(self, gpu: GpuUuid) -> Action | None:
        return worst(self.active(gpu))

    def degraded(self) -> list[GpuUuid]:
        """GPUs to keep new work off (drain or cordon), in id order."""
        return sorted({g for (g, _), f in self._active.items() if f.action in (Action.DRAIN, Action.CORDON)})

    def clear(self, gpu: GpuUuid) -> None:
        """After a reset or an RMA swap: forget the GPU's findings and error history."""
        for key in [k for k in self._active if k[0] == gpu]:
            del self._active[key]
        self._sample_codes.pop(gpu, None)
        self._last_sbe.pop(gpu, None)

    # ---- events -----------------------------------------------------------------------------

    def observe_event(self, event: GpuEvent, now: datetime) -> list[HealthFinding]:
        if event.uuid is None:
            return []
        gpu = event.uuid
        if event.kind is GpuEventKind.DOUBLE_BIT_ECC:
            return self._raise(gpu, "ecc.dbe", Action.CORDON, "double-bit ECC error event", True, now)
        if event.kind is GpuEventKind.SINGLE_BIT_ECC:
            self._sbe_short.add(gpu, now)
            self._sbe_long.add(gpu, now)
            return self._sbe_rate(gpu, now)
        if event.kind is not GpuEventKind.XID or event.xid is None:
            return []
        rule = classify_xid(event.xid)
        out = []
        if rule.action is not Action.IGNORE:
            out += self._raise(gpu, f"xid.{rule.xid}", rule.action, rule.meaning, rule.fails_job, now)
        if rule.action is Action.FAIL_JOB:
            self._job_xids.add(gpu, now)
            n = self._job_xids.count(gpu, now)
            if n >= self.policy.job_fault_xids_per_long_window:
                out += self._raise(
                    gpu, "xid.repeated_job_faults", Action.DRAIN,
                    f"{n} job-fault XIDs within {self.policy.long_window}", False, now,
                )  # fmt: skip
        elif rule.action is Action.WATCH:
            self._watch_xids.add(gpu, now)
            n = self._watch_xids.count(gpu, now)
            if n >= self.policy.watch_xids_per_short_window:
                out += self._raise(
                    gpu, "xid.repeated_warnings", Action.DRAIN,
                    f"{n} warning XIDs within {self.policy.short_window}", False, now,
                )  # fmt: skip
        return out

    # ---- samples ----------------------------------------------------------------------------

    def observe_sample(self, sample: GpuHealthSample, now: datetime) -> list[HealthFinding]:
        """Level conditions from counters; conditions no longer present are cleared."""
        gpu = sample.uuid
        present: list[tuple[str, Action, str, bool]] = []
        if sample.state is GpuState.LOST:
            present.append(
                ("gpu.lost", Action.CORDON, "GPU does not answer (lost / fallen off the bus)", True)
            )
        elif sample.state is GpuState.RESET_REQUIRED:
            present.append(("gpu.reset_required", Action.CORDON, "NVML reports the GPU needs a reset", True))
        rows = sample.remapped_rows
        if rows is not None and rows.failure_occurred:
            present.append(("remap.failure", Action.CORDON, "row remapping failed: no spare rows", True))
        if rows is not None and rows.pending:
            present.append(
                ("remap.pending", Action.DRAIN, "row remap pending; reset the GPU to activate", False)
            )
        pages = sample.retired_pages
        if pages is not None and pages.pending:
            present.append(("retired_pages.pending", Action.DRAIN, "page retirement pending; reset", False))
        if (
            pages is not None
            and pages.single_bit_ecc + pages.double_bit_ecc >= self.policy.retired_pages_limit
        ):
            n = pages.single_bit_ecc + pages.double_bit_ecc
            present.append(("retired_pages.limit", Action.CORDON, f"{n} retired pages: due for RMA", False))
        ecc = sample.ecc
        if ecc is not None and ecc.uncorrected_volatile > 0:
            reason = f"{ecc.uncorrected_volatile} uncorrectable ECC errors since the last reset"
            present.append(("ecc.uncorrected", Action.DRAIN, reason, False))
        if sample.temperature_c is not None and sample.temperature_c >= self.policy.temperature_watch_c:
            present.append(("temperature.high", Action.WATCH, f"{sample.temperature_c} C", False))
        for bit, name in _THROTTLE_NAMES.items():
            if sample.throttle_reasons is not None and sample.throttle_reasons & bit:
                present.append((f"throttle.{name}", Action.WATCH, f"clocks reduced: {name}", False))

        out: list[HealthFinding] = []
        codes = {code for code, *_ in present}
        for code in self._sample_codes.get(gpu, set()) - codes:
            self._active.pop((gpu, code), None)
        self._sample_codes[gpu] = codes
        for code, action, reason, fails_job in present:
            out += self._raise(gpu, code, action, reason, fails_job, now)

        if ecc is not None:  # correctable errors feed the rate windows as deltas of the counter
            last = self._last_sbe.get(gpu)
            delta = (
                ecc.corrected_volatile
                if last is None or ecc.corrected_volatile < last
                else (ecc.corrected_volatile - last)
            )
            self._last_sbe[gpu] = ecc.corrected_volatile
            if last is not None and delta:
                self._sbe_short.add(gpu, now, delta)
                self._sbe_long.add(gpu, now, delta)
            out += self._sbe_rate(gpu, now)
        return out

    # ---- internals --------------------------------------------------------------------------

    def _sbe_rate(self, gpu: GpuUuid, now: datetime) -> list[HealthFinding]:
        p = self.policy
        short, long = self._sbe_short.count(gpu, now), self._sbe_long.count(gpu, now)
        if short >= p.sbe_per_short_window or long >= p.sbe_per_long_window:
            reason = f"{short} correctable ECC errors in {p.short_window}, {long} in {p.long_window}"
            return self._raise(gpu, "ecc.sbe_rate", Action.DRAIN, reason, False, now)
        self._active.pop((gpu, "ecc.sbe_rate"), None)
        if short or long:
            return self._raise(
                gpu,
                "ecc.sbe",
                Action.WATCH,
                f"{short} correctable ECC errors in {p.short_window}",
                False,
                now,
            )
        self._active.pop((gpu, "ecc.sbe"), None)
        return []

    def _raise(
        self, gpu: GpuUuid, code: str, action: Action, reason: str, fails_job: bool, now: datetime
    ) -> list[HealthFinding]:
        key = (gpu, code)
        discrete = code == "ecc.dbe" or code.removeprefix("xid.").isdigit()
        if key in self._active and not discrete:
            return []  # a level condition already reported; discrete events are reported each time
        finding = HealthFinding(gpu=gpu, action=action, code=code, reason=reason, fails_job=fails_job, at=now)
        self._active[key] = finding
        return [finding]
