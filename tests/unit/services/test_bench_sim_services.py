"""The services' simulation bench: runs in their own processes, the same decisions each run, one JSON line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.bench.sim_services import main

TRACE = """submit_time_s,duration_s,workers,gpus_per_worker,queue
0,600,1,8,team-a
10,300,2,8,team-a
20,900,1,4,team-b
30,120,4,8,team-b
40,60,1,1,team-a
"""


def test_two_runs_decide_the_same_and_end_with_one_json_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    report = tmp_path / "report.json"
    code = main(
        [
            "--trace",
            str(trace),
            "--cluster",
            "deploy/clusters/small.yaml",
            "--queues",
            "deploy/queues/small.yaml",
            "--runs",
            "2",
            "--every-event",
            "--report",
            str(report),
        ]
    )
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["runs"] == 2 and summary["jobs"] == 5
    assert summary["same_decisions_every_run"] is True
    assert len(summary["sim_cpu_s"]) == 2 and summary["sim_cpu_s_median"] > 0
    assert summary["events_sha256"] is not None
    written = json.loads(report.read_text())
    assert written["runs"][0]["completed"] == 5
