"""priority: higher-priority jobs go first (the first key of every queue order).

`run_queue_cycle` already hands the session its jobs in fair order (priority, fair share, submit
time); this order plugin keeps priority first for cycles run without it, and is stable, so it
never disturbs the fair order within one priority.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangline.core.framework.plugin import SortKey
from gangline.core.model import Job

NAME = "priority"


class Priority:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        del args

    def job_order_key(self, job: Job) -> SortKey:
        """Higher priority first."""
        return (-job.priority,)
