"""What NVML says about a GPU right now: the node agent's reading of XIDs, ECC events and counters.

Pure and synchronous: time comes in as arguments, nothing here reads a clock or talks to NVML. The
node agent feeds :class:`GpuHealthMonitor` from its event watcher and its periodic sample, and
publishes what changes.

The rules are the core's (:mod:`gangline.core.health`): each single event and each level condition
is classified here at once (an XID 79 cordons, a pending row remap drains, an XID 13 fails only the
job); repeated errors are *not* judged here. The monitor hands each countable error (job-fault and
warning XIDs, correctable ECC errors, counter jumps included) to the agent through
:meth:`GpuHealthMonitor.take_errors`; the agent reports them and node_health applies the core's
rate rule over the reports of every agent.

Actions, most severe first (:class:`~gangline.core.health.Action`):

- ``cordon``   the GPU is broken now: take it out, fail the job on it, reset or RMA.
- ``drain``    the GPU still works but needs a reset (pending row remap, uncorrectable error seen):
               place nothing new, let the running job finish.
- ``fail_job`` the job failed (its own fault, usually); the GPU is fine.
- ``watch``    record and trend (throttling, heat, warning XIDs).
- ``ignore``   expected noise (XID 45 after a kill).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from gangline.core.health import (
    SEVERITY,
    XID_RULES,
    Action,
    GpuError,
    RollingCounter,
    XidRule,
    classify_xid,
    xid_error_kind,
)
from gangline.nvml.types import GpuEvent, GpuEventKind, GpuHealthSample, GpuState, GpuUuid

__all__ = [
    "SEVERITY",
    "XID_RULES",
    "Action",
    "GpuHealthMonitor",
    "HealthFinding",
    "HealthPolicy",
    "RollingCounter",
    "XidRule",
    "classify_xid",
    "worst",
]

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


class HealthFinding(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: GpuUuid
    action: Action
    code: str
    """Stable and machine-readable: ``xid.79``, ``ecc.dbe``, ``remap.pending``, ``ecc.uncorrected``..."""
    reason: str
    fails_job: bool
    at: datetime


def worst(findings: Iterable[HealthFinding]) -> Action | None:
    ranked = sorted(findings, key=lambda f: SEVERITY[f.action], reverse=True)
    return ranked[0].action if ranked else None


class HealthPolicy(BaseModel):
    """Thresholds of the level conditions the agent reads from one sample; tune per GPU model.

    The drain thresholds for repeated errors are not here: they are the core's
    (:class:`gangline.core.health.DrainPolicy`), applied by node_health.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature_watch_c: int = 85
    retired_pages_limit: int = 60
    """Volta-era GPUs retire at most 64 pages; near the limit the GPU is due for RMA."""


class GpuHealthMonitor:
    """Folds samples and events of many GPUs into findings; edge-triggered per (GPU, code).

    ``observe_*`` return only findings that are new since the condition was last seen clear,
    so a publisher can emit each as one ``nodes.health`` event. ``active`` gives the current set.
    Countable errors (for node_health's rates) collect until :meth:`take_errors`.
    """

    def __init__(self, policy: HealthPolicy | None = None) -> None:
        self.policy = policy or HealthPolicy()
        self._last_sbe: dict[GpuUuid, int] = {}
        self._sbe_events: dict[GpuUuid, int] = {}
        """Correctable ECC events seen since the GPU's last sample: its counter already holds them."""
        self._errors: list[tuple[GpuUuid, GpuError]] = []
        self._active: dict[tuple[GpuUuid, str], HealthFinding] = {}
        self._sample_codes: dict[GpuUuid, set[str]] = {}

    def active(self, gpu: GpuUuid | None = None) -> list[HealthFinding]:
        return [f for (g, _), f in sorted(self._active.items()) if gpu is None or g == gpu]

    def verdict(self, gpu: GpuUuid) -> Action | None:
        return worst(self.active(gpu))

    def degraded(self) -> list[GpuUuid]:
        """GPUs to keep new work off (drain or cordon), in id order."""
        return sorted({g for (g, _), f in self._active.items() if f.action in (Action.DRAIN, Action.CORDON)})

    def take_errors(self) -> list[tuple[GpuUuid, GpuError]]:
        """The countable errors observed since the last call, in the order seen (then forgotten)."""
        errors, self._errors = self._errors, []
        return errors

    def clear(self, gpu: GpuUuid) -> None:
        """After a reset or an RMA swap: forget the GPU's findings and counter baseline."""
        for key in [k for k in self._active if k[0] == gpu]:
            del self._active[key]
        self._sample_codes.pop(gpu, None)
        self._last_sbe.pop(gpu, None)
        self._sbe_events.pop(gpu, None)

    # ---- events -----------------------------------------------------------------------------

    def observe_event(self, event: GpuEvent, now: datetime) -> list[HealthFinding]:
        if event.uuid is None:
            return []
        gpu = event.uuid
        if event.kind is GpuEventKind.DOUBLE_BIT_ECC:
            return self._raise(gpu, "ecc.dbe", Action.CORDON, "double-bit ECC error event", True, now)
        if event.kind is GpuEventKind.SINGLE_BIT_ECC:
            self._sbe_events[gpu] = self._sbe_events.get(gpu, 0) + 1
            self._errors.append((gpu, GpuError("correctable_ecc", now)))
            return []
        if event.kind is not GpuEventKind.XID or event.xid is None:
            return []
        rule = classify_xid(event.xid)
        kind = xid_error_kind(rule.xid)
        if kind is not None:
            self._errors.append((gpu, GpuError(kind, now, xid=rule.xid)))
        if rule.action is Action.IGNORE:
            return []
        return self._raise(gpu, f"xid.{rule.xid}", rule.action, rule.meaning, rule.fails_job, now)

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

        if ecc is not None:
            self._count_correctable(gpu, ecc.corrected_volatile, now)
        return out

    # ---- internals --------------------------------------------------------------------------

    def _count_correctable(self, gpu: GpuUuid, counter: int, now: datetime) -> None:
        """Correctable errors the counter grew by and no event announced: one error of that count."""
        last = self._last_sbe.get(gpu)
        self._last_sbe[gpu] = counter
        seen = self._sbe_events.pop(gpu, 0)
        if last is None:
            return  # the first sample is a baseline, not a burst
        delta = counter if counter < last else counter - last  # a reset restarts the counter from 0
        unannounced = delta - seen
        if unannounced > 0:
            self._errors.append((gpu, GpuError("correctable_ecc", now, count=unannounced)))

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
