"""The pure parts of ``make bench-vs-slurm``: workload, figures, table and the Slurm peer's configuration."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from gangline.agent.runner import ProcessRunner
from gangline.agent.simulated import SimulatedRunner
from gangline.cluster_spec import cluster_spec_from_mapping, load_cluster_spec
from services.agent.standin import StandInCluster
from services.bench.slurm_peer import gres_conf, slurm_conf, topology_conf
from services.bench.vs_slurm import (
    SPEC,
    MixedJob,
    Row,
    goals,
    latency_figures,
    line_command,
    lower_bound_s,
    mixed_figures,
    mixed_jobs,
    percentile,
    read_starts,
    render_table,
    rows_of,
)
from services.common.topics import TopicNames

PEER = Path(__file__).resolve().parents[4] / "shared" / "slurm-peer" / "bench" / "mixed.py"


def test_the_mixed_workload_is_the_peers_seeded_draw() -> None:
    jobs = mixed_jobs(400, 1)
    assert jobs == mixed_jobs(400, 1) != mixed_jobs(400, 2)
    assert {j.shape for j in jobs} == {"1x1", "1x2", "1x4", "1x8", "2x8", "4x8"}
    assert {j.account for j in jobs} == {"a1", "a2", "a3", "a4"}
    assert min(j.duration_s for j in jobs) == 2 and max(j.duration_s for j in jobs) == 12
    # RESULTS.md of the peer: "Lower bound from GPU-seconds is 126.4 s" for mixed.py 400 1 on 128 GPUs.
    assert round(lower_bound_s(jobs, 128), 1) == 126.4
    shares = Counter(j.shape for j in jobs)
    assert shares["1x1"] > shares["1x2"] > shares["4x8"]


@pytest.mark.skipif(not PEER.exists(), reason="the slurm-peer recipe is not beside this checkout")
def test_the_draw_matches_mixed_py_line_for_line() -> None:
    """mixed.py's own generator code (its lines up to the first sbatch), run on a copy of its source."""
    source = PEER.read_text().split("open(STARTS")[0]
    source = source.replace(
        'P = os.environ["SLURM_PEER"]; os.environ["SLURM_CONF"] = f"{P}/etc/slurm.conf"', "P = ''"
    )
    source = source.replace(
        'int(subprocess.check_output("sinfo -h -p low -o %D", shell=True, text=True))', "16"
    )
    scope: dict[str, object] = {}
    argv = sys.argv
    sys.argv = ["mixed.py", "400", "1"]
    try:
        exec(compile(source, str(PEER), "exec"), scope)
    finally:
        sys.argv = argv
    theirs = [MixedJob(n, g, d, a) for n, g, d, a in scope["jobs"]]  # type: ignore[attr-defined]
    assert theirs == mixed_jobs(400, 1)


def test_mixed_figures_of_a_small_schedule() -> None:
    jobs = {"a": MixedJob(1, 8, 10, "a1"), "b": MixedJob(1, 8, 10, "a2"), "c": MixedJob(2, 8, 5, "a3")}
    submitted = {"a": 0.0, "b": 0.1, "c": 0.2}
    started = {"a": 1.0, "b": 1.0, "c": 11.0}  # c waits for both nodes of a 2-node cluster
    f = mixed_figures(jobs, submitted, started, t0=0.0, total_gpus=16)
    assert f["makespan_s"] == 16.0
    assert f["lower_bound_s"] == 15.0
    assert f["makespan_over_bound"] == round(16 / 15, 3)
    assert f["gpu_utilisation"] == round(240 / (16 * 16), 3)
    assert f["wait_by_shape"]["1x8"] == {"n": 2, "mean_s": 0.95, "max_s": 1.0}
    assert f["wait_by_shape"]["2x8"] == {"n": 1, "mean_s": 10.8, "max_s": 10.8}
    assert list(f["wait_by_shape"]) == ["1x8", "2x8"]
    assert f["mean_wait_s"] == round((1.0 + 0.9 + 10.8) / 3, 2)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(k) for k in range(1, 11)]
    # bench.py's index round(q * (n - 1)): Python rounds 4.5 to 4, so the p50 of 1..10 is the 5th value
    assert percentile(values, 0.5) == 5.0
    assert percentile(values, 0.9) == 9.0
    assert latency_figures([3.0, 1.0, 2.0]) == {"p50_s": 2.0, "p90_s": 3.0, "max_s": 3.0}


def test_ratios_and_which_side_is_better() -> None:
    assert Row("latency", "s", 0.5, 0.05).ratio == pytest.approx(0.1)
    assert Row("rate", "jobs/s", 0.0, 10.0, lower=False).ratio is None
    assert Row("x", "s", None, 1.0).ratio is None
    table = render_table(
        [Row("idle latency p50", "s", 0.5, 0.05), Row("submit", "jobs/s", 300.0, 150.0, lower=False)]
    )
    lines = table.splitlines()
    assert lines[0].split() == ["figure", "unit", "Slurm", "Gangline", "Gangline/Slurm", "better"]
    assert lines[2].split()[-2:] == ["0.100", "Gangline"]
    assert lines[3].split()[-2:] == ["0.500", "Slurm"]


FIGURES = {
    "slurm": {
        "latency": {"p50_s": 0.5, "p90_s": 0.9, "max_s": 1.0},
        "mixed": {
            "makespan_s": 150.0,
            "lower_bound_s": 126.4,
            "makespan_over_bound": 1.187,
            "gpu_utilisation": 0.84,
            "mean_wait_s": 70.0,
            "max_wait_s": 120.0,
            "wait_by_shape": {
                "1x1": {"n": 2, "mean_s": 66.0, "max_s": 90.0},
                "4x8": {"n": 1, "mean_s": 78.0, "max_s": 78.0},
            },
        },
        "preemption": {"submit_to_running_s": 4.1},
        "throughput": {"sbatch_1": 287.0, "sbatch_8": 540.0},
    },
    "gangline": {
        "latency": {"p50_s": 0.04, "p90_s": 0.06, "max_s": 0.1},
        "mixed": {
            "makespan_s": 130.0,
            "lower_bound_s": 126.4,
            "makespan_over_bound": 1.028,
            "gpu_utilisation": 0.97,
            "mean_wait_s": 30.0,
            "max_wait_s": 100.0,
            "wait_by_shape": {
                "1x1": {"n": 2, "mean_s": 20.0, "max_s": 40.0},
                "4x8": {"n": 1, "mean_s": 90.0, "max_s": 90.0},
            },
        },
        "preemption": {"submit_to_running_s": 0.9},
        "throughput": {"kafka_1": 574.0, "kafka_8": 1080.0, "api_1": 143.5, "api_8": 270.0},
    },
}


def test_rows_pair_each_figure_and_sbatch_stands_against_both_ways_in() -> None:
    rows = {r.name.strip(): r for r in rows_of(FIGURES)}
    assert rows["idle latency p50"].ratio == pytest.approx(0.08)
    assert rows["wait 4x8 mean"].slurm == 78.0 and rows["wait 4x8 mean"].gangline == 90.0
    assert rows["submit, 1 submitter: sbatch vs Kafka producer"].ratio == pytest.approx(2.0)
    assert rows["submit, 8 submitters: sbatch vs API"].ratio == pytest.approx(0.5)
    assert rows_of({"slurm": FIGURES["slurm"]})[0].gangline is None


def test_goals_say_which_were_missed() -> None:
    met = goals(FIGURES)
    assert (
        met["latency_p50_10x_lower"] and met["makespan_within_1.03x_bound"] and met["mean_wait_at_most_half"]
    )
    assert met["preemption_4x_faster"]
    assert met["no_shape_waits_longer"] is False  # the 4x8 gangs wait longer than under Slurm
    assert goals({"slurm": FIGURES["slurm"]}) == {}


def test_start_lines_keep_each_jobs_first(tmp_path: Path) -> None:
    starts = tmp_path / "starts.txt"
    starts.write_text("j1 10.5\nj2 11.0\nj1 30.0\ngarbage\n")
    assert read_starts(starts) == {"j1": 10.5, "j2": 11.0}
    assert (
        line_command(starts, "SLURM_JOB_ID", 2) == f"echo $SLURM_JOB_ID $(date +%s.%N) >> {starts}; sleep 2"
    )
    assert line_command(starts, "GANGLINE_JOB_ID", 1, rank_var="RANK").startswith('[ "$RANK" != 0 ] || echo')


def test_slurm_config_is_the_cluster_spec() -> None:
    spec = load_cluster_spec(SPEC)
    root = Path("/scratch/peer")
    conf = slurm_conf(spec, root, "vm")
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert len(nodes) == 16 == spec.node_count
    assert nodes[0].startswith("NodeName=n-00 NodeHostname=vm NodeAddr=127.0.0.1 Port=17001 ")
    assert nodes[-1].startswith("NodeName=n-15 ") and "Port=17016" in nodes[-1]
    assert all("Gres=gpu:8" in n for n in nodes)
    assert "SlurmctldHost=vm(127.0.0.1)" in conf and "batch_sched_delay=0" in conf
    assert "TopologyPlugin=topology/tree" in conf and "PreemptType=preempt/partition_prio" in conf
    assert f"StateSaveLocation={root}/var/ctld" in conf
    assert gres_conf(spec, root) == (
        "AutoDetect=off\nNodeName="
        + ",".join(f"n-{k:02d}" for k in range(16))
        + f" Name=gpu File={root}/dev/nvidia[0-7]\n"
    )
    topo = topology_conf(spec).splitlines()
    assert topo[:4] == [
        f"SwitchName=leaf-00{k} Nodes=" + ",".join(f"n-{4 * k + i:02d}" for i in range(4)) for k in range(4)
    ]
    assert topo[4:] == ["SwitchName=spine-00 Switches=leaf-000,leaf-001,leaf-002,leaf-003"]


def test_slurm_config_refuses_what_its_gres_cannot_say() -> None:
    mixed = cluster_spec_from_mapping(
        {
            "groups": [
                {"name": "a", "count": 2, "gpu_model": "H100", "gpus_per_node": 8, "memory_mib": 1},
                {"name": "b", "count": 2, "gpu_model": "L4", "gpus_per_node": 4, "memory_mib": 1},
            ]
        }
    )
    with pytest.raises(ValueError, match="same GPU count"):
        slurm_conf(mixed, Path("/x"), "vm")


def test_two_spines_get_a_root_switch() -> None:
    spec = cluster_spec_from_mapping(
        {
            "topology": {"nodes_per_leaf": 2, "leaves_per_spine": 1},
            "groups": [{"name": "n", "count": 4, "gpu_model": "H100", "gpus_per_node": 8, "memory_mib": 1}],
        }
    )
    assert topology_conf(spec).splitlines()[-1] == "SwitchName=root Switches=spine-00,spine-01"


def test_stand_in_nodes_run_real_processes_when_asked(tmp_path: Path) -> None:
    spec = load_cluster_spec(SPEC)
    topics = TopicNames(prefix="t.")
    real = StandInCluster(spec=spec, bootstrap="x", topics=topics, group_id="g", runner="process")
    assert isinstance(real.make_runner(tmp_path / "n-00"), ProcessRunner)
    assert (tmp_path / "n-00").is_dir()
    fake = StandInCluster(spec=spec, bootstrap="x", topics=topics, group_id="g")
    assert isinstance(fake.make_runner(tmp_path / "n-01"), SimulatedRunner)
