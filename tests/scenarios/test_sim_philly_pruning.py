"""The first 3,000 Philly jobs on the contended cluster under the default profile: the pruned
cycles (`CorePolicy(prune=True)`, what `gangline simulate` runs) decide exactly what cycles over
every waiting job decide, and every figure of the report is the same.

At this size the queue is deep enough for backfill to start short jobs on reserved GPUs that a
window over the front of the line would not see, so only exact pruning passes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gangline.cluster_spec import load_cluster_spec
from gangline.core.defaults import default_profile
from gangline.queues_file import load_queues_file
from gangline.sim.metrics import RunResult, summarize
from gangline.sim.policies import CorePolicy
from gangline.sim.run import queue_setup
from gangline.sim.simulator import Simulator
from gangline.sim.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
PHILLY = ROOT.parent / "shared" / "traces" / "pollux-philly" / "philly.csv"


def _run(prune: bool) -> RunResult:
    jobs = load_trace(PHILLY, limit=3000)
    spec = load_cluster_spec(ROOT / "deploy" / "clusters" / "philly-contended.yaml")
    nodes = spec.build_nodes()
    queues = load_queues_file(ROOT / "deploy" / "queues" / "philly-contended.yaml")
    policy = CorePolicy(
        "default", default_profile(), nodes, queue_setup(queues, spec, nodes, jobs), prune=prune
    )
    return Simulator(jobs, policy, float(spec.total_gpus)).run()


@pytest.mark.skipif(not PHILLY.exists(), reason="the shared Philly trace is not present")
def test_philly_contended_default_profile_pruned_equals_full() -> None:
    full, pruned = _run(False), _run(True)
    assert max(j.wait or 0.0 for j in full.jobs) > 86400  # it really queues
    assert {j.id: (j.start, j.end) for j in pruned.jobs} == {j.id: (j.start, j.end) for j in full.jobs}
    sp, sf = summarize(pruned), summarize(full)
    sp.pop("sim_wall_s")
    sf.pop("sim_wall_s")
    assert sp == sf
