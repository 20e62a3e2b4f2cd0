"""The queue configuration file the services read (``GANGLINE_QUEUES_FILE``).

Its loader is pure and lives in the library, :mod:`gangline.queues_file`, so that what-if
(`gangline replay --queues`) reads a file exactly as the services do; this module names it for them.
"""

from __future__ import annotations

from gangline.queues_file import (
    DEFAULT_QUEUE,
    SHARED_SUFFIX,
    Queues,
    QueuesFile,
    load_queues,
    queues_of,
    request_on,
    unlimited_queues,
)

__all__ = [
    "DEFAULT_QUEUE",
    "SHARED_SUFFIX",
    "Queues",
    "QueuesFile",
    "load_queues",
    "queues_of",
    "request_on",
    "unlimited_queues",
]
