"""The first 3,000 Philly jobs, twice as fast, through `gangline simulate`: report shape and gang safety."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
PHILLY = ROOT.parent / "shared" / "traces" / "pollux-philly" / "philly.csv"
REQUIRED = (
    "policy",
    "jobs",
    "mean_wait_s",
    "p99_wait_s",
    "mean_jct_s",
    "utilization",
    "jain",
    "partial_gangs",
    "sim_wall_s",
)


@pytest.mark.skipif(not PHILLY.exists(), reason="the shared Philly trace is not present")
def test_philly_sample_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    rc = main(
        [
            "simulate",
            "--trace", str(PHILLY),
            "--cluster", str(ROOT / "deploy" / "clusters" / "philly.yaml"),
            "--queues", str(ROOT / "deploy" / "queues" / "philly.yaml"),
            "--limit", "3000",
            "--time-scale", "2",
            "--no-progress",
            "--report", str(report),
        ]
    )  # fmt: skip
    assert rc == 0
    doc = json.loads(report.read_text(encoding="utf-8"))
    runs = {r["policy"]: r for r in doc["runs"]}
    assert list(runs) == ["k8s-first-fit", "fifo-gang-best-fit", "easy-backfill", "default"]
    for r in runs.values():
        assert all(k in r for k in REQUIRED)
        assert r["jobs"] == 3000
        assert r["completed"] + r["unfinished"] == 3000
        assert 0 < r["utilization"] <= 1
        assert 0 < r["jain"] <= 1
    assert runs["fifo-gang-best-fit"]["partial_gangs"] == 0
    assert runs["easy-backfill"]["partial_gangs"] == 0
    assert runs["easy-backfill"]["preemptions"] == 0
    assert runs["default"]["partial_gangs"] == 0
    assert "| default" in capsys.readouterr().out
