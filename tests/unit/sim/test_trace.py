"""Trace adapters: Philly, Alibaba 2023 and the generic CSV."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangline.core.model import GpuMode
from gangline.sim.trace import TraceError, detect_format, load_trace, philly_shape


def test_philly_shapes() -> None:
    assert philly_shape(1) == (1, 1)
    assert philly_shape(8) == (1, 8)
    assert philly_shape(16) == (2, 8)
    assert philly_shape(12) == (3, 4)
    assert philly_shape(128) == (16, 8)


def test_philly_rows_become_jobs_in_submit_order(tmp_path: Path) -> None:
    p = tmp_path / "philly.csv"
    p.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,16,1056.0,11cb48\n"
        "2017-10-09 07:00:00,10.0,1,10.0,6214e9\n",
        encoding="utf-8",
    )
    assert detect_format(p) == "philly"
    jobs = load_trace(p)
    assert [(j.submit_s, j.queue, j.workers, j.gpus_per_worker) for j in jobs] == [
        (0.0, "6214e9", 1, 1),
        (115.0, "11cb48", 2, 8),
    ]
    assert load_trace(p, time_scale=5.0)[1].submit_s == pytest.approx(23.0)
    assert [j.queue for j in load_trace(p, limit=1)] == ["6214e9"]


def test_alibaba_pods_fractional_whole_and_cpu_only(tmp_path: Path) -> None:
    p = tmp_path / "pods.csv"
    p.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "pod-a,1000,1024,1,460,,LS,Running,100,1100,100\n"
        "pod-b,1000,1024,2,1000,V100M16|V100M32,BE,Running,200,700,250\n"
        "pod-c,1000,1024,0,0,,BE,Running,300,400,300\n"
        "pod-d,1000,1024,1,1000,,BE,Pending,400,460,\n",
        encoding="utf-8",
    )
    jobs = {str(j.id): j for j in load_trace(p)}
    assert set(jobs) == {"pod-a", "pod-b", "pod-d"}
    a, b, d = jobs["pod-a"], jobs["pod-b"], jobs["pod-d"]
    assert (a.submit_s, a.duration_s, a.gpu_milli, a.queue) == (0.0, 1000.0, 460, "LS")
    assert a.to_job().kind is GpuMode.SHARED
    assert (b.workers, b.gpu_milli, b.pod_workers, b.same_node, b.gpu_type) == (2, 1000, 2, True, "V100M16")
    assert b.duration_s == 450.0
    assert d.duration_s == 60.0  # never scheduled: its lifetime


def test_generic_csv_with_optional_columns(tmp_path: Path) -> None:
    p = tmp_path / "mine.csv"
    p.write_text(
        "submit_time_s,duration_s,workers,gpus_per_worker,queue,gpu_type,priority,preemptible\n"
        "5,60,2,4,research,H100,3,yes\n"
        "0,30,1,0.25,infer,,,\n",
        encoding="utf-8",
    )
    jobs = load_trace(p)
    assert [j.id for j in jobs] == ["job-000002", "job-000001"]
    inf, res = jobs
    assert inf.gpu_milli == 250 and inf.gpus == pytest.approx(0.25)
    assert (res.workers, res.gpus_per_worker, res.gpu_type, res.priority, res.preemptible) == (
        2,
        4,
        "H100",
        3,
        True,
    )


@pytest.mark.parametrize(
    ("row", "problem"),
    [("0,10,1,1.5,q", "must be whole"), ("0,10,0,1,q", "workers"), ("x,10,1,1,q", "could not convert")],
)
def test_generic_csv_errors_name_the_line(tmp_path: Path, row: str, problem: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("submit_time_s,duration_s,workers,gpus_per_worker,queue\n" + row + "\n", encoding="utf-8")
    with pytest.raises(TraceError, match=rf"bad.csv:2: .*{problem}"):
        load_trace(p)


def test_unknown_header_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(TraceError, match="not a Philly, Alibaba or generic trace"):
        load_trace(p)
