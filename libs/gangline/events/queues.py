"""Queue events on queues.status (compacted, keyed by queue). Subject: the queue name.

The quota service is the one that decides by fair share; ``queue.status`` is its figure, published so
that nobody (the API, the CLI, a dashboard) computes another. ``quota.ticked`` (on quota.ticks, quota's
own) brings the clock into the log when quota has gone quiet with a status held back by its throttle.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from gangline.events.base import MODEL_CONFIG, Event, UtcDatetime
from gangline.events.types import QueueNameField

ResourceName = Annotated[str, Field(min_length=1, max_length=253)]
"""A quota resource: a GPU model ("H100-SXM5-80GB") or a MIG profile on one ("A100-SXM4-80GB/1g.10gb")."""
Count = Annotated[int, Field(ge=0)]
MAX_RESOURCES = 256


class QueueResource(BaseModel):
    """One resource of a queue, as quota's ledger counts it (whole GPUs or MIG slices)."""

    model_config = MODEL_CONFIG

    used: Count
    """Charged to the queue now (its queued and running jobs)."""
    nominal: Count
    """The queue's nominal quota."""
    borrowed: Count
    """Held beyond the nominal quota, lent by its cohort."""
    lendable: Count
    """What its cohort could still lend it beyond its own nominal quota."""


class QueueStatus(Event):
    """Where a queue of a quota tree stands in quota's fair order, and what it holds, as of an event time.

    ``dominant_share`` is quota's DRF share (usage decayed with ``GANGLINE_FAIR_SHARE_HALF_LIFE_S``,
    over the tree's nominal capacity, divided by the weight): the figure quota orders waiting work by.
    """

    TYPE = "queue.status"
    VERSION = 1

    queue: QueueNameField
    cohort: Annotated[str, Field(min_length=1, max_length=253)]
    """The root cohort of the queue's quota tree."""
    weight: Annotated[float, Field(gt=0)]
    dominant_share: Annotated[float, Field(ge=0)]
    dominant_resource: ResourceName | None = None
    """The resource the share is of; None while the queue has used nothing."""
    position: Annotated[int, Field(ge=1)]
    """Rank by share in its tree, 1 = lowest share (served first at equal priority)."""
    of: Annotated[int, Field(ge=1)]
    """How many queues the rank is among."""
    resources: Annotated[dict[ResourceName, QueueResource], Field(max_length=MAX_RESOURCES)]
    """Per resource of its quota (and any it uses): used, nominal, borrowed, lendable."""
    as_of: UtcDatetime
    """The time of the event after which these figures hold (event time, not the clock)."""

    def subject(self) -> str:
        return self.queue


class QuotaTicked(Event):
    """Quota read nothing for a throttle interval while a quota tree's status was held back by it.

    Quota's throttle (services/quota/status.py) moves on event time, so with no later event a change read
    inside the interval would never be published. Quota writes this to itself (quota.ticks) and handles it
    like any input: its time, the clock when it was written, makes the held status due. Being in the log,
    the publication it causes is replayed like every other decision. Subject: the tree's root cohort.
    """

    TYPE = "quota.ticked"
    VERSION = 1

    cohort: Annotated[str, Field(min_length=1, max_length=253)]
    """The root cohort of the tree whose status was held back."""

    def subject(self) -> str:
        return self.cohort


EVENTS: list[type[Event]] = [QueueStatus, QuotaTicked]
