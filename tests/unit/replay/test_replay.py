"""Replay: the hash chain, decisions re-run from the log, JSONL export, and the CLI verdicts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from scenarios.dsl import gpus

from gangline.core.model import JobId, Node, QueueName
from gangline.events.chain import HASH_HEADER, ChainWriter
from gangline.replay.chain import verify_chain
from gangline.replay.decide import GRANTED, replay_decisions
from gangline.replay.log import LogRecord, read_jsonl, write_jsonl
from gangline.replay.record import record_log
from gangline.sim.trace import TraceJob
from services.tools.cli import main


def _cluster() -> list[Node]:
    # Core nodes with wire-safe GPU ids: record_log writes each core GPU id on the wire as it is.
    return [
        gpus(8, model="A100", memory_mib=81920, leaf=f"leaf-{i // 2}").build(f"n-{i:04d}") for i in range(3)
    ]


def _jobs() -> list[TraceJob]:
    shapes = [(1, 8), (2, 8), (1, 4), (1, 2), (3, 4), (1, 1), (2, 2), (1, 8)]
    return [
        TraceJob(
            JobId(f"j{k}"),
            submit_s=10.0 * k,
            duration_s=25.0 + 7 * k,
            queue=QueueName(f"q{k % 2}"),
            workers=w,
            gpus_per_worker=g,
        )
        for k, (w, g) in enumerate(shapes)
    ]


@pytest.fixture
def log() -> list[LogRecord]:
    return record_log(_cluster(), _jobs())


def _granted(log: list[LogRecord]) -> list[int]:
    return [k for k, r in enumerate(log) if r.type == GRANTED]


def test_a_recorded_log_verifies_identical(log: list[LogRecord]) -> None:
    grants = _granted(log)
    assert len(grants) == len(_jobs())  # every job ran
    chain = verify_chain(log)
    assert chain.ok, chain.problems
    assert chain.records == len([r for r in log if r.topic == "allocations.log"])
    rep = replay_decisions(log)
    assert rep.ok, rep.mismatches
    assert rep.compared == len(grants)


def test_a_tampered_grant_is_named_by_the_chain_and_by_the_replay(log: list[LogRecord]) -> None:
    k = _granted(log)[3]
    rec = log[k]
    env = json.loads(json.dumps(rec.envelope))
    env["data"]["placements"][0]["node"] = (
        "n-0002" if env["data"]["placements"][0]["node"] != "n-0002" else "n-0000"
    )
    bad = [*log[:k], replace(rec, envelope=env), *log[k + 1 :]]
    chain = verify_chain(bad)
    assert [(p.kind, p.where, p.event_id) for p in chain.problems] == [("tampered", rec.where, rec.event_id)]
    assert rec.where in chain.problems[0].message
    rep = replay_decisions(bad)
    assert [m.where for m in rep.mismatches] == [rec.where]
    assert "placements" in rep.mismatches[0].message


def test_a_rejected_request_in_the_log_is_passed_over_not_a_crash(log: list[LogRecord]) -> None:
    # What admission rejects still sits on jobs.requests: workers 0, no queue, a job id of the wrong type.
    request = next(r for r in log if r.topic == "jobs.requests")
    bad = []
    for k, data in enumerate(({"workers": 0}, {"queue": None}, {"job_id": 7})):
        env = json.loads(json.dumps(request.envelope))
        env["data"].update(data)
        if data.get("queue", "") is None:
            del env["data"]["queue"]
        bad.append(replace(request, offset=10_000 + k, envelope=env))
    rep = replay_decisions([*bad, *log])
    assert rep.ok, rep.mismatches
    assert rep.compared == len(_granted(log))


def test_a_missing_record_is_named(log: list[LogRecord]) -> None:
    chained = [k for k, r in enumerate(log) if r.topic == "allocations.log"]
    gone = log[chained[2]]
    bad = [r for k, r in enumerate(log) if k != chained[2]]
    chain = verify_chain(bad)
    assert chain.problems and chain.problems[0].kind == "missing"
    seq = gone.headers["gangline-chain-seq"]
    assert f"seq {seq}" in chain.problems[0].message


def test_a_rewritten_hash_breaks_the_link_to_the_next_record(log: list[LogRecord]) -> None:
    k = _granted(log)[1]
    rec = log[k]
    env = json.loads(json.dumps(rec.envelope))
    env["data"]["queue"] = "q9"
    part = [r for r in log if r.topic == rec.topic and r.partition == rec.partition]
    pos = part.index(rec)
    prev = part[pos - 1].headers[HASH_HEADER] if pos else "0" * 64
    forged = ChainWriter(seq=int(rec.headers["gangline-chain-seq"]), prev=prev).headers_for(env)
    bad = [replace(r, envelope=env, headers=forged) if r is rec else r for r in log]
    problems = verify_chain(bad).problems
    if pos + 1 < len(part):
        assert [p.kind for p in problems] == ["broken"]
        assert problems[0].where == part[pos + 1].where
    assert not replay_decisions(bad).ok


def test_jsonl_round_trip(tmp_path: Path, log: list[LogRecord]) -> None:
    path = tmp_path / "log.jsonl"
    assert write_jsonl(log, path) == len(log)
    assert list(read_jsonl(path)) == log


def test_cli_verify_passes_then_fails_on_tampering(
    tmp_path: Path, log: list[LogRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log.jsonl"
    write_jsonl(log, path)
    assert main(["replay", "--from", str(path), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "identical" in out and "OK" in out
    lines = path.read_text(encoding="utf-8").splitlines()
    k = _granted(log)[0]
    lines[k] = lines[k].replace('"A100"', '"H100"', 1)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["replay", "--from", str(path), "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"tampered: record {log[k].where}" in out


def test_cli_export_filters_topics(tmp_path: Path, log: list[LogRecord]) -> None:
    src, out = tmp_path / "log.jsonl", tmp_path / "alloc.jsonl"
    write_jsonl(log, src)
    assert main(["export", "--from", str(src), "--out", str(out), "--topics", "allocations.log"]) == 0
    got = list(read_jsonl(out))
    assert got == [r for r in log if r.topic == "allocations.log"]
    # Kafka that cannot be reached is unusable input, said in one line, not a traceback.
    assert main(["export", "--from", "kafka", "--bootstrap", "127.0.0.1:1", "--out", str(out)]) == 2


def test_what_if_prints_per_queue_differences(
    tmp_path: Path, log: list[LogRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log.jsonl"
    write_jsonl(log, path)
    profile = tmp_path / "bare.yaml"
    profile.write_text("name: bare\nactions: [allocate]\nplugins: [gpu-fit, gang]\n", encoding="utf-8")
    assert main(["replay", "--from", str(path), "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    assert "what-if: bare vs recorded (default)" in out
    assert "| q0 |" in out and "| q1 |" in out


def _gpus_numbered_per_node(log: list[LogRecord]) -> list[LogRecord]:
    """The log as real agents write it: each node numbers its GPUs from 0 (ids unique only in their node)."""
    out = []
    for r in log:
        env = json.loads(json.dumps(r.envelope))
        data = env["data"]
        if r.topic == "nodes.inventory":
            for g in data["gpus"]:
                g["id"] = g["id"].rsplit("-", 1)[1]
        elif r.type == GRANTED:
            for p in data["placements"]:
                p["gpus"] = [g.rsplit("-", 1)[1] for g in p["gpus"]]
        out.append(replace(r, envelope=env))
    return out


def test_a_log_whose_nodes_number_their_gpus_alike_replays_identical(log: list[LogRecord]) -> None:
    # GPU ids are unique inside a node on the wire: the replay tells node n-0000's g0 from n-0001's.
    alike = _gpus_numbered_per_node(log)
    rep = replay_decisions(alike)
    assert rep.ok, rep.mismatches
    assert rep.compared == len(_granted(log))
