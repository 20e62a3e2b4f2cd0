"""The simulator that runs the services' own decisions: an in-memory bus on a virtual clock.

    python -m services.tools.simulate --trace T --cluster C [--queues Q.yaml] [--profile P.yaml]

:mod:`.engine` runs admission, quota, placement, preemption and node_health handlers with simulated
nodes; :mod:`.trace_run` feeds it a trace and measures what `gangline simulate` reports.
"""

from services.tools.simulate.engine import (
    EPOCH,
    NodeOptions,
    ServiceOptions,
    ServiceSimulation,
    Transaction,
)
from services.tools.simulate.trace_run import (
    ServiceRun,
    SimulateOptions,
    registrations,
    request_of,
    simulate_services,
    unlimited_queues,
)

__all__ = [
    "EPOCH",
    "NodeOptions",
    "ServiceOptions",
    "ServiceRun",
    "ServiceSimulation",
    "SimulateOptions",
    "Transaction",
    "registrations",
    "request_of",
    "simulate_services",
    "unlimited_queues",
]
