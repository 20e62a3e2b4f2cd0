"""`gangline replay --verify --decider all` (and each service by name) over a log two services wrote:
admission admits or rejects requests, quota gates what admission admitted. Each present service is
replayed and reported; the absent ones are named; settings come from the environment, as the services'."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from replay_recorder import TOPICS, Log, ServiceRun, outputs_of, tampered
from svc_helpers import T0, cluster, env
from test_admission_replay import request
from test_admission_replay import wiring as admission_wiring
from test_quota_replay import QUEUES_FILE, STATUS_EVERY_S, admit
from test_quota_replay import wiring as quota_wiring

import gangline.replay.kafka
from gangline.replay.log import LogRecord, write_jsonl
from services.admission.settings import AdmissionSettings
from services.common.replay import SERVICES, decider_topics, load, present
from services.quota.handlers import SOURCE as QUOTA
from services.quota.status import tick
from services.tools.cli import main as gangline_main


@pytest.fixture(autouse=True)
def service_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the services ran with (the replay reads the same variables)."""
    monkeypatch.setenv("GANGLINE_QUEUES_FILE", str(QUEUES_FILE))


def pipeline_log() -> list[LogRecord]:
    log = Log()
    for node in cluster(("a", 2, 8)).registrations():
        log.produce(TOPICS.inventory, env(node))
    admission = ServiceRun(log, admission_wiring(AdmissionSettings(queues_file=QUEUES_FILE)))
    quota = ServiceRun(log, quota_wiring())
    for k in range(5):
        request(log, f"t{k}", queue="team", gpus_per_worker=4)
    request(log, "bad", queue="nowhere")
    admission.drain(max_per_partition=2)
    quota.drain()
    quota.start()
    request(log, "t5", queue="team", gpus_per_worker=4)
    admission.drain()
    quota.drain()
    return log.records


def test_every_service_in_the_log_is_replayed_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = pipeline_log()
    assert present(records) == ["admission", "quota"]
    path = tmp_path / "log.jsonl"
    write_jsonl(records, path)

    assert gangline_main(["replay", "--from", str(path), "--verify", "--decider", "all"]) == 0

    out = capsys.readouterr().out
    assert "admission decisions: " in out and "quota decisions: " in out and "in 2 run(s)" in out
    assert (
        "all services: 2 replayed (admission, quota)" in out
        and "not in the log: placement, preemption, node_health" in out
    )
    assert "identical" in out


def test_a_tampered_output_fails_all_and_its_own_service_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = pipeline_log()
    target = next(r for r in outputs_of(records, QUOTA) if r.type == "gangline.job.pending.v1")

    def forge(envelope: dict[str, Any]) -> None:
        envelope["data"]["job_id"] = "t9"

    path = tmp_path / "bad.jsonl"
    write_jsonl(tampered(records, target, forge), path)
    argv = ["replay", "--from", str(path), "--verify", "--decider"]

    assert gangline_main([*argv, "all"]) == 1
    out = capsys.readouterr().out
    assert f"difference: {target.where} job t9: data.job_id: recorded " in out
    assert "all services: 2 replayed (admission, quota), " in out and "1 difference(s)" in out
    assert gangline_main([*argv, "admission"]) == 0
    assert gangline_main([*argv, "quota"]) == 1


def test_verify_without_a_decider_re_runs_the_services_own_decisions_when_they_wrote_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    services_log, headerless = tmp_path / "services.jsonl", tmp_path / "headerless.jsonl"
    records = pipeline_log()
    write_jsonl(records, services_log)
    write_jsonl([replace(r, headers={}) for r in records], headerless)

    assert gangline_main(["replay", "--from", str(services_log), "--verify"]) == 0
    assert "all services: 2 replayed (admission, quota)" in capsys.readouterr().out
    # A log without the services' input headers can only be checked by the simplified model.
    gangline_main(["replay", "--from", str(headerless), "--verify"])
    out = capsys.readouterr().out
    assert "all services" not in out and "decisions: " in out


class RecordedBroker:
    """``--from kafka`` over recorded records: what a fetch of ``topics`` returns (only those topics)."""

    def __init__(self, records: Sequence[LogRecord]) -> None:
        self._records = records

    def __call__(self, bootstrap: str | None = None) -> RecordedBroker:
        return self

    def records(self, topics: Sequence[str] | None = None) -> list[LogRecord]:
        return [r for r in self._records if topics is None or r.topic in topics]


def test_all_reads_from_kafka_every_topic_some_services_replay_reads() -> None:
    for prefix in ("", "p."):
        wanted = set(decider_topics(prefix))
        for service in SERVICES:
            assert set(load(service).decider_topics(prefix)) <= wanted, service


def test_a_status_quotas_tick_made_due_replays_identical_from_kafka_under_all(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The chaos run's case: the cluster went quiet (the broker away) with a status held back, quota's tick
    on quota.ticks made it due; `--decider all` read from the broker must fetch the tick to re-decide it."""
    monkeypatch.setenv("GANGLINE_STATUS_INTERVAL_S", str(STATUS_EVERY_S.status_interval_s))
    monkeypatch.setenv("GANGLINE_FAIR_SHARE_HALF_LIFE_S", str(STATUS_EVERY_S.fair_share_half_life_s))
    log = Log()
    run = ServiceRun(log, quota_wiring(STATUS_EVERY_S))
    admit(log, "j0", 4, at=0)  # the first status
    run.drain()
    admit(log, "j1", 2, at=0.5)  # held back: inside the interval, and nothing follows
    run.drain()
    log.produce(TOPICS.quota_ticks, tick("team", at=T0 + timedelta(seconds=30), event_id="tick-1"))
    run.drain()
    statuses = [r for r in outputs_of(log.records, QUOTA) if r.type == "gangline.queue.status.v1"]
    assert statuses[-1].envelope["causationid"] == "tick-1"
    monkeypatch.setattr(gangline.replay.kafka, "KafkaSource", RecordedBroker(log.records))

    assert gangline_main(["replay", "--from", "kafka", "--verify", "--decider", "all"]) == 0, (
        capsys.readouterr().out
    )
    out = capsys.readouterr().out
    assert "quota decisions: " in out and "identical" in out
