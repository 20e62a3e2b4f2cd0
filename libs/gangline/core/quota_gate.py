"""The quota gate: which waiting jobs their queues' quotas let through now, on which GPU model, in which
order, and why the others wait.

One rule for the quota service (its per-job gate in front of placement) and for the core's queue cycle
(:func:`gangline.core.actions.queueing.fair_order`, which the simulator runs): waiting jobs come in fair
order (:class:`~gangline.core.fairshare.FairOrder`: priority, then DRF dominant share over decayed usage,
then admitted time, then job id); each is let through on the first of its flavours (GPU model and
resource vector, like Kueue's flavours) its queue's quota admits now, charged to the ledger and to the
fair share at once; one that fits none is held and skipped, and smaller jobs behind it may go. A held
job is told why (:func:`hold_reason`): its queue's quota position per flavour, whether it is owed its
nominal quota (then quota lent in the cohort is reclaimed for it), or that no GPU model it may use has
nodes that can hold its workers (:func:`held_flavours`, over the core's
:class:`~gangline.core.hardware.Hardware`).

What the charge means differs by caller, not the rule: the quota service charges a job when the gate
lets it through to placement (as Kueue admits a workload: it holds that quota until its allocation is
released, placed or not yet), while the core cycle runs the gate on a copy of its ledger only to order
its jobs and charges a job's quota when it is placed (the ``quota`` plugin). A job charged to a model
whose nodes can no longer hold it and not placed yet moves to the first other flavour that fits
(:func:`stranded_move`).

Pure: the caller hands the facts of its fold (the waiting jobs, a ledger, fair shares, what the nodes
offer); nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gangline.core.fairshare import FairOrder, FairShare, Pending
from gangline.core.framework.status import Reason
from gangline.core.hardware import NAME as HARDWARE
from gangline.core.hardware import Hardware, WorkerAsk
from gangline.core.model import GpuModel, QueueName
from gangline.core.queues import QuotaLedger, QuotaTree, Resource

T = TypeVar("T")

MAX_TEXT = 2000
"""Longest sentence a reason carries."""


@dataclass(frozen=True, slots=True)
class Flavour:
    """One way a job may be charged: the GPU model (None: any, for an unlimited queue) and what it uses."""

    model: str | None
    request: Mapping[Resource, int]


@dataclass(frozen=True, slots=True)
class HoldReason:
    """Why a job waits at the gate, in the shape of a pending reason (``constraint`` names the rule:
    ``quota``, ``reclaim`` when its queue is owed the quota it waits for, or ``hardware``)."""

    code: str
    constraint: str
    message: str
    details: Mapping[str, int | str | bool]
    unblock: str

    @property
    def owed(self) -> bool:
        """Whether its queue is owed what it waits for within its nominal quota (reclaim may free it)."""
        return self.constraint == "reclaim"


@dataclass
class Gate(Generic[T]):
    """What one pass of the gate decided: who goes (with the flavour charged), in fair order, and who
    is held, in fair order, with why (for the first ones asked for; None for the rest)."""

    admitted: list[tuple[T, Flavour]] = field(default_factory=list)
    held: list[tuple[T, HoldReason | None]] = field(default_factory=list)


Options = Callable[[T], tuple[Sequence[Flavour], Sequence[Reason]]]
"""A job's flavours its nodes can hold, in the order to try them, and why the others' nodes cannot."""


def held_flavours(
    hardware: Hardware | None, ask: WorkerAsk, flavours: Iterable[Flavour]
) -> tuple[list[Flavour], list[Reason]]:
    """The flavours whose model's usable nodes can hold ``ask``'s workers, and why each other cannot.

    ``hardware`` None (no node has registered yet: what the nodes hold is unknown) keeps them all, and
    so does a flavour of any model (None).
    """
    fits: list[Flavour] = []
    misfits: list[Reason] = []
    for flavour in flavours:
        if hardware is None or flavour.model is None:
            fits.append(flavour)
            continue
        status = hardware.holds(GpuModel(flavour.model), ask)
        if status.ok:
            fits.append(flavour)
        else:
            misfits.extend(status.reasons)
    return fits, misfits


class _Refusals:
    """Requests the ledger refused within one pass (where room only shrinks): each is refused again,
    and so is a larger one of the same single resource for the same queue."""

    __slots__ = ("_smallest", "_vectors")

    def __init__(self) -> None:
        self._smallest: dict[tuple[QueueName, Resource], int] = {}
        self._vectors: set[tuple[QueueName, frozenset[tuple[Resource, int]]]] = set()

    def known(self, queue: QueueName, request: Mapping[Resource, int]) -> bool:
        if len(request) == 1:
            ((r, n),) = request.items()
            smallest = self._smallest.get((queue, r))
            return smallest is not None and n >= smallest
        return (queue, frozenset(request.items())) in self._vectors

    def add(self, queue: QueueName, request: Mapping[Resource, int]) -> None:
        if len(request) == 1:
            ((r, n),) = request.items()
            self._smallest[(queue, r)] = min(n, self._smallest.get((queue, r), n))
        else:
            self._vectors.add((queue, frozenset(request.items())))


def first_fit(
    ledger: QuotaLedger, queue: QueueName, flavours: Sequence[Flavour], refusals: _Refusals | None = None
) -> Flavour | None:
    """The first of ``flavours`` the queue's quota admits now (None: none); one that charges nothing
    (an unlimited queue's) always fits."""
    for flavour in flavours:
        request = flavour.request
        if not request:
            return flavour
        if refusals is not None and refusals.known(queue, request):
            continue
        if ledger.fits(queue, request):
            return flavour
        if refusals is not None:
            refusals.add(queue, request)
    return None


def fair_admission(
    waiting: Iterable[Pending[T]],
    ledger: QuotaLedger,
    fair: FairShare,
    flavours: Callable[[T], Sequence[Flavour]],
) -> Iterator[tuple[T, Flavour | None]]:
    """Every waiting job in fair order, with the flavour its queue's quota lets it through on (None: held).

    Each one let through is charged to ``ledger`` and ``fair`` before the next is looked at (pass copies
    to keep the caller's). A held job is skipped: its queue's share does not grow, and the jobs behind
    it may go. ``flavours`` gives a job's flavours in the order to try them (those its nodes can hold).
    """
    for p, fit in _admission(waiting, ledger, fair, flavours):
        yield p.item, fit


def _admission(
    waiting: Iterable[Pending[T]],
    ledger: QuotaLedger,
    fair: FairShare,
    flavours: Callable[[T], Sequence[Flavour]],
) -> Iterator[tuple[Pending[T], Flavour | None]]:
    order = FairOrder(waiting, fair)
    refusals = _Refusals()
    while (p := order.next()) is not None:
        fit = first_fit(ledger, p.queue, flavours(p.item), refusals)
        if fit is None:
            order.skipped()
            yield p, None
            continue
        if fit.request:
            ledger.admit(p.queue, fit.request)
        order.admitted(fit.request)
        yield p, fit


def let_through(
    waiting: Iterable[Pending[T]],
    ledger: QuotaLedger,
    fair: FairShare,
    tree: QuotaTree,
    options: Options[T],
    *,
    explain: int | None = None,
) -> Gate[T]:
    """The gate's decisions over ``waiting``: :func:`fair_admission` (``ledger`` and ``fair`` are charged
    with the jobs let through), then, for the first ``explain`` held jobs (all: None), why they wait
    (:func:`hold_reason`, against what is charged once every job let through is)."""
    gate: Gate[T] = Gate()
    held: list[Pending[T]] = []
    for p, fit in _admission(waiting, ledger, fair, lambda job: options(job)[0]):
        if fit is None:
            held.append(p)
        else:
            gate.admitted.append((p.item, fit))
    reasons: dict[_ReasonKey, HoldReason] = {}
    for k, p in enumerate(held):
        if explain is not None and k >= explain:
            gate.held.append((p.item, None))
            continue
        flavours, misfits = options(p.item)
        # Nothing is charged any more in this pass: the reason is a function of what it is asked about.
        key = reason_key(p.queue, flavours, misfits)
        why = reasons.get(key)
        if why is None:
            why = reasons[key] = hold_reason(p.queue, flavours, misfits, ledger, tree, fair)
        gate.held.append((p.item, why))
    return gate


_ReasonKey = tuple[
    QueueName,
    tuple[tuple[str | None, tuple[tuple[Resource, int], ...]], ...],
    tuple[tuple[str, str, str, tuple[tuple[str, int | str], ...]], ...],
]


def reason_key(queue: QueueName, flavours: Sequence[Flavour], misfits: Sequence[Reason]) -> _ReasonKey:
    """Everything :func:`hold_reason` reads of a job (with the ledger, tree and fair shares fixed): two
    jobs with the same key are held for the same reason, word for word (orders kept: they show)."""
    return (
        queue,
        tuple((f.model, tuple(f.request.items())) for f in flavours),
        tuple((r.code.value, r.plugin, r.message, tuple(r.details.items())) for r in misfits),
    )


def hold_reason(
    queue: QueueName,
    flavours: Sequence[Flavour],
    misfits: Sequence[Reason],
    ledger: QuotaLedger,
    tree: QuotaTree,
    fair: FairShare,
) -> HoldReason:
    """Why a job of ``queue`` waits: per flavour its nodes can hold (``flavours``), why the queue's quota
    cannot take it now, with the figures of the first; why the others' nodes cannot (``misfits``); and
    whether its queue is owed it within its nominal quota (constraint ``reclaim``: the cohort lent it).
    With no flavour its nodes can hold, :func:`hardware_reason`."""
    if not flavours:
        return hardware_reason(queue, misfits)
    checks = [(f.model, ledger.check(queue, f.request)) for f in flavours]
    if len(checks) == 1 and not misfits:
        message = checks[0][1].reason
    else:
        message = "; ".join(
            [f"on {model}: {check.reason}" for model, check in checks]
            + [f"{r.details['gpu_type']} cannot hold it: {r.message}" for r in misfits]
        )
    first = flavours[0]
    request = first.request
    if not request:  # charges nothing: not quota's to hold (a queue the configuration does not limit)
        message = f"queue {queue} is not limited by the queue configuration"
        return HoldReason("quota", "quota", message, {"queue": queue, "gpu_type": "any"}, message)
    short = next(
        (r for r in sorted(request) if request[r] > ledger.available(queue, r)), next(iter(sorted(request)))
    )
    needed = request[short]
    missing = needed - max(0, ledger.available(queue, short))
    limited = tree.has_queue(queue)
    details: dict[str, int | str | bool] = {
        "queue": queue,
        "gpu_type": first.model or "any",
        "resource": short,
        "needed": needed,
        "used": ledger.usage(queue, short) if limited else 0,
        "nominal": tree.nominal(queue, short) if limited else 0,
        "cohort_can_lend": ledger.cohort_lendable(queue, short) if limited else 0,
        "fair_share": sentence(fair.describe(queue)),
    }
    message = message or f"queue {queue} cannot hold this job now"
    owed = (
        next((f.model for f in flavours if ledger.within_nominal(queue, f.request)), None)
        if limited
        else None
    )
    details["within_nominal"] = owed is not None
    if owed is None:
        return HoldReason(
            code="quota",
            constraint="quota",
            message=sentence(message),
            details=details,
            unblock=sentence(
                f"wait until {missing} more {short} is free to queue {queue} or its cohort, or "
                "lower-priority preemptible work of the queue gives it back (the preemption service asks)"
            ),
        )
    details["gpu_type"] = owed
    on = f" on {owed}" if owed != first.model else ""
    return HoldReason(
        code="quota",
        constraint="reclaim",
        message=sentence(
            f"{message}; queue {queue} is owed this within its nominal quota{on}: the cohort lent it "
            "to other queues, and the preemption service reclaims it from their preemptible jobs"
        ),
        details=details,
        unblock=sentence("jobs borrowing the cohort's quota checkpoint and release their GPUs"),
    )


def hardware_reason(queue: QueueName, misfits: Sequence[Reason]) -> HoldReason:
    """Why no GPU model a job may be charged to has nodes that can hold its workers: it waits, not
    charged, until nodes that can register or recover (the figures are the first model's)."""
    first = misfits[0]
    if len(misfits) == 1:
        message = first.message
    else:
        message = "; ".join(f"on {r.details['gpu_type']}: {r.message}" for r in misfits)
    models = ", ".join(str(r.details["gpu_type"]) for r in misfits)
    details: dict[str, int | str | bool] = {"queue": queue}
    details.update({k: v for k, v in first.details.items() if isinstance(v, int | str | bool)})
    return HoldReason(
        code=first.code.value,
        constraint=HARDWARE,
        message=sentence(message),
        details=details,
        unblock=sentence(
            f"a {models} node that can hold its workers registers, or its GPUs recover; "
            "or ask for fewer GPUs per worker"
        ),
    )


def stranded_move(
    queue: QueueName,
    charged: Flavour,
    flavours: Sequence[Flavour],
    ledger: QuotaLedger,
) -> Flavour | None:
    """Where to move a job charged to ``charged`` and not placed yet, whose model's nodes can no
    longer hold it (drained, failed or gone): the first other flavour its nodes can hold
    (``flavours``) that its queue's quota admits once its current charge is given back; None when
    none does (it stays charged where it is, and is looked at again when quota or the nodes change)."""
    trial = ledger.copy()
    if charged.request:
        trial.release(queue, charged.request)
    others = [f for f in flavours if f.model != charged.model]
    return first_fit(trial, queue, others)


def sentence(text: str) -> str:
    """``text`` cut to what an event carries."""
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"
