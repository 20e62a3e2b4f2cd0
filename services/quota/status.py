"""Quota's fair-share figure per queue, published as ``queue.status`` on queues.status.

Quota orders waiting work by the core's :class:`~gangline.core.fairshare.FairShare` over usage decayed
with ``GANGLINE_FAIR_SHARE_HALF_LIFE_S`` (:meth:`QuotaState.fair_share`); this module publishes that
figure, with what the core's :class:`~gangline.core.queues.QuotaLedger` holds per resource (used,
nominal, borrowed, lendable), so the API and everyone else report quota's figure, never their own.

When. After quota handles an event (:func:`queue_statuses`, called at the end of ``decide``), a quota
tree whose charged usage differs from what its queues' last statuses say, or with a queue that has no
status yet, is published: every queue of the tree whose figures (``as_of`` aside) changed since its last
status. So every configured queue is reported from the first event quota handles (its nodes' inventory,
or a tick when it reads nothing: ``held_back``), jobs or none. At most once per
``interval_s`` of **event time** per tree: a change read sooner waits for the first event quota handles
after the interval, whatever it is about. Only what quota's select hands it counts (a record keyed by
a job already retired is skipped undecoded: no event a status goes with; ``wiring.quota_select``). The
clock plays no part, so the same events in the same order give the same statuses (quota's replay
compares them like its other outputs, selecting each record with the live select).

Restart. "Usage differs from the last status" is a fact of the state, not a flag: a restarted quota
reads its own latest statuses (:meth:`StatusBoard.restore`; the topic is compacted, keyed by queue)
and, once its ledger is rebuilt, publishes exactly when the uninterrupted one would have, neither
repeating a status nor skipping a change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from gangline.bus import Outgoing
from gangline.core.fairshare import FairShare
from gangline.core.queues import QueueName as Queue
from gangline.core.queues import Resource
from gangline.events.base import Envelope, make_envelope
from gangline.events.ids import derived_id
from gangline.events.queues import QueueResource, QueueStatus, QuotaTicked
from gangline.events.types import QueueName

if TYPE_CHECKING:
    from services.quota.handlers import QuotaState

SOURCE = "gangline/quota"
STATUS_INTERVAL_S = 5.0
"""Default least event time between two publications of one tree's statuses."""
SHARE_DIGITS = 6
"""Shares are published rounded: a figure that moved less is not news."""


@dataclass
class StatusBoard:
    """What quota last published per queue, and when (event time) per quota tree: the throttle's state.

    ``interval_s`` None publishes nothing: a state built bare (a test of its decisions, a what-if that
    wants only them) is quiet; the service's state (``wiring.new_state``) is given the setting.
    """

    interval_s: float | None = None
    published: dict[QueueName, QueueStatus] = field(default_factory=dict)
    """Each queue's latest status (sent, or read back from queues.status at start)."""
    published_at: dict[str, datetime] = field(default_factory=dict)
    """Root cohort → the ``as_of`` of the tree's latest publication."""
    trees: dict[str, list[Queue]] | None = field(default=None, repr=False)
    """Root cohort → its limited queues, sorted (the order statuses are published in); worked out once."""
    _figures: dict[QueueName, tuple[QueueStatus, Figures]] = field(default_factory=dict, repr=False)
    """Each published status's figures (:func:`figures_of`), worked out once per status."""
    _used: dict[QueueName, tuple[QueueStatus, dict[Resource, int]]] = field(default_factory=dict, repr=False)
    """Each published status's ``used`` per resource it uses, worked out once per status (:meth:`used`)."""

    def used(self, queue: QueueName) -> dict[Resource, int]:
        """What the queue's latest status says it uses, per resource it uses (no status: nothing)."""
        status = self.published.get(queue)
        if status is None:
            return {}
        known = self._used.get(queue)
        if known is None or known[0] is not status:
            used = {Resource(r): v.used for r, v in status.resources.items() if v.used}
            known = self._used[queue] = (status, used)
        return known[1]

    def figures(self, queue: QueueName) -> Figures | None:
        """The figures of the queue's latest status (None: none)."""
        status = self.published.get(queue)
        if status is None:
            return None
        known = self._figures.get(queue)
        if known is None or known[0] is not status:
            known = self._figures[queue] = (status, figures_of(status))
        return known[1]

    def restore(self, envelope: Envelope) -> bool:
        """Fold one of quota's own ``queue.status`` records read at start; False for anything else."""
        status = envelope.data
        if not isinstance(status, QueueStatus):
            return False
        if envelope.source != SOURCE:
            return True  # not ours: nothing to restore, nothing for the rest of the state either
        known = self.published.get(status.queue)
        if known is None or status.as_of >= known.as_of:
            self.published[status.queue] = status
        latest = self.published_at.get(status.cohort)
        if latest is None or status.as_of > latest:
            self.published_at[status.cohort] = status.as_of
        return True

    def due(self, cohort: str, at: datetime) -> bool:
        """Whether the tree may be published at event time ``at``."""
        latest = self.published_at.get(cohort)
        if self.interval_s is None:
            return False
        return latest is None or (at - latest).total_seconds() >= self.interval_s


Figures = tuple[object, ...]
"""What a status says, ``as_of`` aside, as plain values: (queue, cohort, weight, share, dominant
resource, position, of, ((resource, used, nominal, borrowed, lendable), ... sorted by resource))."""


def figures_of(status: QueueStatus) -> Figures:
    resources = tuple(
        (r, v.used, v.nominal, v.borrowed, v.lendable) for r, v in sorted(status.resources.items())
    )
    return (
        status.queue,
        status.cohort,
        status.weight,
        status.dominant_share,
        status.dominant_resource,
        status.position,
        status.of,
        resources,
    )


def trees(state: QuotaState) -> dict[str, list[Queue]]:
    """Root cohort → its limited queues, sorted (the order statuses are published in)."""
    if state.status.trees is None:
        tree = state.queues.tree
        out: dict[str, list[Queue]] = {}
        for q in tree.queue_names():
            out.setdefault(tree.root_cohort_of(q), []).append(q)
        state.status.trees = dict(sorted(out.items()))
    return state.status.trees


def queue_statuses(state: QuotaState, cause: Envelope, now: datetime) -> list[Outgoing]:
    """The statuses ``cause`` makes due (module docstring), recorded on the board as sent."""
    board = state.status
    if board.interval_s is None:
        return []
    out: list[Outgoing] = []
    for cohort, queues in trees(state).items():
        if not board.due(cohort, cause.time) or not _usage_moved(state, board, queues):
            continue
        fair = state.fair_share((True, cohort), cause.time)
        for queue in queues:
            if board.figures(QueueName(queue)) == figures_now(state, fair, queue, cohort):
                continue  # the status would say what the last one says (``same_figures``), built or not
            status = status_of(state, fair, queue, cohort, cause.time)
            if same_figures(board.published.get(QueueName(queue)), status):
                continue
            board.published[status.queue] = status
            board.published_at[cohort] = cause.time
            event_id = derived_id(cause.id, "status", queue)
            envelope = make_envelope(status, event_id=event_id, source=SOURCE, time=now)
            out.append((state.topics.queue_status, envelope))
    return out


def held_back(state: QuotaState) -> list[str]:
    """The trees (root cohorts) whose charged usage differs from what their queues' statuses say, or with a
    queue not reported yet: a publication the throttle holds back, due at the next event after the interval
    (none when quiet)."""
    board = state.status
    if board.interval_s is None:
        return []
    return [cohort for cohort, queues in trees(state).items() if _usage_moved(state, board, queues)]


def tick(cohort: str, *, at: datetime, event_id: str) -> Envelope:
    """Quota's ``quota.ticked`` for a held-back tree, stamped with the clock ``at`` (:func:`held_back`)."""
    return make_envelope(QuotaTicked(cohort=cohort), event_id=event_id, source=SOURCE, time=at)


def status_of(state: QuotaState, fair: FairShare, queue: Queue, cohort: str, at: datetime) -> QueueStatus:
    """The queue's figures now: its fair-share rank and decayed DRF share, and its ledger per resource."""
    tree = state.queues.tree
    ledger = state.ledger
    names: set[Resource] = set(tree.spec(queue).quotas) | set(ledger.usage_vector(queue))
    rank, of = fair.position(queue)
    return QueueStatus(
        queue=QueueName(queue),
        cohort=cohort,
        weight=tree.weight(queue),
        dominant_share=round(fair.share(queue), SHARE_DIGITS),
        dominant_resource=fair.dominant_resource(queue),
        position=rank,
        of=of,
        resources={
            r: QueueResource(
                used=ledger.usage(queue, r),
                nominal=tree.nominal(queue, r),
                borrowed=ledger.borrowed(queue, r),
                lendable=ledger.cohort_lendable(queue, r),
            )
            for r in sorted(names)
        },
        as_of=at,
    )


def figures_now(state: QuotaState, fair: FairShare, queue: Queue, cohort: str) -> Figures:
    """What :func:`status_of` would say now, as :func:`figures_of` reads a status (without building it)."""
    tree = state.queues.tree
    ledger = state.ledger
    names: set[Resource] = set(tree.spec(queue).quotas) | set(ledger.usage_vector(queue))
    rank, of = fair.position(queue)
    resources = tuple(
        (
            r,
            ledger.usage(queue, r),
            tree.nominal(queue, r),
            ledger.borrowed(queue, r),
            ledger.cohort_lendable(queue, r),
        )
        for r in sorted(names)
    )
    return (
        queue,
        cohort,
        tree.weight(queue),
        round(fair.share(queue), SHARE_DIGITS),
        fair.dominant_resource(queue),
        rank,
        of,
        resources,
    )


def same_figures(before: QueueStatus | None, after: QueueStatus) -> bool:
    """Whether two statuses say the same, whatever their ``as_of``."""
    return before is not None and before.model_copy(update={"as_of": after.as_of}) == after


def _usage_moved(state: QuotaState, board: StatusBoard, queues: list[Queue]) -> bool:
    """Whether some queue has no status yet (its first is news, even charged nothing) or its charged usage
    differs from what its latest status says it used."""
    charged = state.charged()
    published = board.published
    return any(
        QueueName(queue) not in published or charged.get(queue, {}) != board.used(QueueName(queue))
        for queue in queues
    )
