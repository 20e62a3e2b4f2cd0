"""What-if: the recorded workload re-run under another profile, with the queues of a queues file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from scenarios.dsl import gpus

from gangline.core.defaults import default_profile
from gangline.core.model import GpuModel, JobId, Node, QueueName
from gangline.core.queue_profile import fair_profile
from gangline.core.queues import gpu_resource
from gangline.queues_file import load_queues_file, queues_of
from gangline.replay.log import LogRecord, write_jsonl
from gangline.replay.record import record_log
from gangline.replay.whatif import what_if, workload_from_log
from gangline.sim.gated import GatedPolicy
from gangline.sim.trace import TraceJob
from services.tools.cli import main

ROOT = Path(__file__).resolve().parents[3]
A100 = GpuModel("A100")


def _nodes() -> list[Node]:
    # Core nodes with wire-safe GPU ids: record_log writes each core GPU id on the wire as it is.
    return [
        gpus(8, model="A100", memory_mib=81920, leaf=f"leaf-{i // 2}").build(f"n-{i:04d}") for i in range(3)
    ]


def _mixed() -> list[LogRecord]:
    shapes = [(1, 8), (2, 8), (1, 4), (1, 2), (3, 4), (1, 1), (2, 2), (1, 8)]
    jobs = [
        TraceJob(JobId(f"j{k}"), 10.0 * k, 25.0 + 7 * k, QueueName(f"q{k % 2}"), w, g)
        for k, (w, g) in enumerate(shapes)
    ]
    return record_log(_nodes(), jobs)


def _four_gpu_job_behind_a_stream() -> list[LogRecord]:
    """24 one-GPU q1 jobs fill the cluster, ending one a second from t=100; a 1x4 q0 job comes at
    t=30; from t=40 a new one-GPU q1 job every 2 s (100 s each) keeps a small job ready."""
    jobs = [TraceJob(JobId(f"fill{k}"), float(k), 100.0, QueueName("q1"), 1, 1) for k in range(24)]
    jobs.append(TraceJob(JobId("four"), 30.0, 50.0, QueueName("q0"), 1, 4))
    jobs += [TraceJob(JobId(f"s{k}"), 40.0 + 2 * k, 100.0, QueueName("q1"), 1, 1) for k in range(60)]
    return record_log(_nodes(), jobs)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_readme_what_if_runs_the_fair_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.jsonl"
    write_jsonl(_four_gpu_job_behind_a_stream(), log)
    fair = ROOT / "deploy" / "profiles" / "fair.yaml"
    assert main(["replay", "--from", str(log), "--profile", str(fair)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "what-if: fair vs recorded (default)"
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in out[3:]}
    # Both runs go through the services' own handlers. The default profile reserves GPUs for the
    # first blocked job of 2+ GPUs, so the 1x4 job starts as soon as four GPUs of a node free up;
    # fair.yaml reserves only for gangs of 8+, so the stream of small jobs takes every GPU that
    # frees and the 1x4 job waits until the stream ends (columns: jobs, wait, Δ wait, ...).
    jobs, fair_wait, delta = rows["q0"][:3]
    assert jobs == "1" and fair_wait != "0s" and delta.startswith("+") and delta != "+0s", rows["q0"]


def test_what_if_under_a_queues_file_holds_a_queue_to_its_quota(tmp_path: Path) -> None:
    records = _mixed()
    queues = _write(
        tmp_path,
        "queues.yaml",
        "queues:\n"
        "  - {name: q0, quotas: {A100: {nominal: 12}}}\n"
        "  - {name: q1, quotas: {A100: {nominal: 24}}}\n",
    )
    free_base, free_fair = what_if(records, fair_profile())
    base, fair = what_if(records, fair_profile(), queues=load_queues_file(queues))
    q = "per_queue"
    # Unlimited queues: fair changes nothing here. With q0 held to 12 GPUs its jobs wait longer, under
    # either profile: the quota gate holds them, whatever plugins the profile lists (as the services).
    assert free_fair[q]["q0"]["mean_wait_s"] == free_base[q]["q0"]["mean_wait_s"]  # type: ignore[index]
    assert base[q]["q0"]["mean_wait_s"] > free_base[q]["q0"]["mean_wait_s"]  # type: ignore[index]
    assert fair[q]["q0"]["mean_wait_s"] > free_fair[q]["q0"]["mean_wait_s"]  # type: ignore[index]
    assert fair["completed"] == base["completed"] == 8


def test_queues_of_the_file_keep_their_quotas_and_the_others_are_unlimited(tmp_path: Path) -> None:
    nodes, jobs = workload_from_log(_mixed())
    doc = load_queues_file(
        _write(
            tmp_path,
            "queues.yaml",
            "cohorts: [{name: lab}]\nqueues:\n"
            "  - {name: q0, cohort: lab, weight: 2, quotas: {A100: {nominal: 12, borrowing_limit: 4}}}\n"
            "  - {name: default, unlimited: true}\n",
        )
    )
    queues = queues_of(doc)
    a100 = gpu_resource(A100)
    tree = queues.tree
    assert tree.nominal(QueueName("q0"), a100) == 12 and tree.borrowing_limit(QueueName("q0"), a100) == 4
    assert tree.weight(QueueName("q0")) == 2.0 and tree.cohort_of(QueueName("q0")) == "lab"
    # What-if runs each profile as `gangline simulate` does: only q0's jobs are charged at the gate;
    # q1 (named by the log only) and default (unlimited in the file) go straight to placement.
    policy = GatedPolicy("p", default_profile(), nodes, queues)
    assert policy.limits("q0")
    assert not policy.limits("q1") and not policy.limits("default")
    assert {j.queue for j in jobs} == {"q0", "q1"}


def test_unusable_queues_say_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.jsonl"
    write_jsonl(_mixed(), log)
    fair = str(ROOT / "deploy" / "profiles" / "fair.yaml")
    typo = _write(tmp_path, "typo.yaml", "queues:\n  - {name: q0, quota: {A100: {nominal: 8}}}\n")
    assert main(["replay", "--from", str(log), "--profile", fair, "--queues", str(typo)]) == 2
    assert main(["replay", "--from", str(log), "--profile", fair, "--queues", str(tmp_path / "none")]) == 2
    assert main(["replay", "--from", str(log), "--verify", "--queues", str(typo)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("gangline replay: ") for line in err)
    assert "quota" in err[0] and "--queues goes with --profile" in err[2]


def _readme_what_ifs() -> list[list[str]]:
    """The README's `gangline replay ... --profile` command lines, continuations joined, comments cut."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [line.split("#", 1)[0].split() for line in text.splitlines()]
    return [w[1:] for w in lines if w[:2] == [".venv/bin/gangline", "replay"] and "--profile" in w]


def test_the_readme_what_if_commands_work_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = _readme_what_ifs()
    assert len(commands) == 2 and any("--queues" in c for c in commands)
    write_jsonl(_mixed(), tmp_path / "log.jsonl")
    monkeypatch.chdir(ROOT)
    for argv in commands:
        argv = [str(tmp_path / "log.jsonl") if a == "log.jsonl" else a for a in argv]
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        assert "what-if: fair vs recorded (default)" in out and "| q0 |" in out and "| q1 |" in out


def test_the_workload_is_the_requests_as_the_services_read_them() -> None:
    log = _mixed()
    request = next(r for r in log if r.topic == "jobs.requests")
    # A request admission rejected (workers 0) never ran; an elastic one runs from 1 to its 3 workers.
    rejected = json.loads(json.dumps(request.envelope))
    rejected["data"].update(job_id="zero", workers=0)
    elastic = json.loads(json.dumps(request.envelope))
    elastic["data"].update(job_id="elastic", workers=2, min_workers=1, max_workers=3)
    extra = [replace(request, offset=10_000 + k, envelope=env) for k, env in enumerate((rejected, elastic))]
    _, jobs = workload_from_log([*extra, *log])
    by_id = {j.id: j for j in jobs}
    assert "zero" not in by_id
    assert (by_id[JobId("elastic")].workers, by_id[JobId("elastic")].min_workers) == (3, 1)
    assert len(jobs) == 1 + len([r for r in log if r.topic == "jobs.requests"])
