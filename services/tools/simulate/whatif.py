"""What-if through the services' own decisions: the recorded inputs re-run under another profile.

    gangline replay --from log.jsonl --profile deploy/profiles/fair.yaml [--queues queues.yaml]

The inputs come from the log: the nodes as their agents registered them (``node.registered``, the
latest of each node), and every ``job.requested`` at its recorded time, running as long as its
recorded allocation did (:func:`gangline.replay.whatif.workload_from_log`). Both runs, the services'
default profile (what the services ran) and the other one, go through the same handlers on the same
in-memory bus and virtual clock (:func:`~services.tools.simulate.trace_run.simulate_on`), with the
queues of the queues file (the one the services read, ``GANGLINE_QUEUES_FILE``) or, without one,
every queue the log names unlimited. The result is each run's report entry, compared per queue by
the caller (``gangline.sim.report.queue_diff``): waits, GPU-hours, preemptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gangline.events.nodes import NodeRegistered
from gangline.queues_file import QueuesFile, load_queues_file, queues_of
from gangline.replay.decide import REGISTERED
from gangline.replay.log import LogRecord
from gangline.replay.whatif import workload_from_log
from gangline.sim.metrics import summarize
from services.tools.simulate.trace_run import profile_name, simulate_on


def registrations_in(records: Sequence[LogRecord]) -> list[NodeRegistered]:
    """The latest registration of each node in the log, in the order the nodes first registered."""
    latest: dict[str, NodeRegistered] = {}
    for r in records:
        data = r.envelope.get("data")
        if r.type == REGISTERED and isinstance(data, dict):
            registered = NodeRegistered.model_validate(data)
            latest[registered.node] = registered
    return list(latest.values())


def what_if_services(
    records: Sequence[LogRecord], profile: Path, queues: Path | None = None
) -> tuple[dict[str, object], dict[str, object]]:
    """Report entries of the recorded inputs under the services' default profile and under ``profile``."""
    nodes = registrations_in(records)
    _, jobs = workload_from_log(records)
    if not nodes or not jobs:
        raise ValueError("the log has no registered nodes or no requested jobs")
    doc = load_queues_file(queues) if queues is not None else QueuesFile(queues=())
    # Queues the log names that the file does not: unlimited, as the services would not admit them
    # otherwise and the recorded run did.
    named = {q.name for q in doc.queues}
    extra = [{"name": q, "unlimited": True} for q in sorted({j.queue for j in jobs} - named)]
    configured = queues_of(
        QueuesFile.model_validate(
            {
                "cohorts": [c.model_dump() for c in doc.cohorts],
                "queues": [*(q.model_dump() for q in doc.queues), *extra],
            }
        )
    )
    runs = []
    for path in (None, profile):
        run = simulate_on(jobs, nodes, configured, cluster_name="recorded", profile_path=path)
        runs.append(summarize(run.result))
    base, other = runs
    # Named as the core's what-if names them: the other profile, and what the services ran.
    base["policy"] = f"recorded ({profile_name(None)})"
    other["policy"] = profile_name(profile)
    return base, other
