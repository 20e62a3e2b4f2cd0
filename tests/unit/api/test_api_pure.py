"""The API's pure parts: tokens, queue config, "why", cursors, and the CLI's tables."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from gangline.client.tables import table
from gangline.core.queues import QueueName, QuotaConfigError, Resource
from services.api.app import why
from services.api.auth import Authenticator, TokenConfig, load_tokens
from services.api.queries import BadCursor, decode_cursor, encode_cursor
from services.common.queues import QueuesFile, load_queues, queues_of


def test_tokens_from_a_file_and_the_environment_map_to_tenants_and_their_queues(tmp_path: Path) -> None:
    file = tmp_path / "tokens.yaml"
    file.write_text("tenants:\n  - {name: research, token: research-secret, queues: [research]}\n")
    inline = SecretStr(json.dumps({"tenants": [{"name": "ops", "token": "ops-secret-1", "admin": True}]}))
    auth = Authenticator(load_tokens(file=file, inline=inline))
    research = auth.principal("research-secret")
    assert research is not None and research.tenant == "research"
    assert (
        research.may_act_on("research")
        and research.may_act_on("default")
        and not research.may_act_on("vision")
    )
    assert research.visible_queues() == ["default", "research"]
    ops = auth.principal("ops-secret-1")
    assert ops is not None and ops.may_act_on("vision") and ops.visible_queues() is None
    assert auth.principal("research-secreT") is None and auth.principal("") is None


def test_a_token_is_a_secret_that_never_shows_in_reprs_and_must_be_long_and_unique() -> None:
    config = TokenConfig.model_validate({"tenants": [{"name": "a", "token": "long-enough-1"}]})
    assert "long-enough-1" not in repr(config)
    with pytest.raises(ValidationError, match="at least 8 characters"):
        TokenConfig.model_validate({"tenants": [{"name": "a", "token": "short"}]})
    with pytest.raises(ValidationError, match="share a token"):
        TokenConfig.model_validate(
            {"tenants": [{"name": "a", "token": "same-token"}, {"name": "b", "token": "same-token"}]}
        )


def test_the_queue_file_the_api_reads_builds_the_cores_quota_tree(tmp_path: Path) -> None:
    file = tmp_path / "queues.yaml"
    file.write_text(
        "cohorts: [{name: lab}]\n"
        "queues:\n"
        "  - {name: default, unlimited: true}\n"
        "  - {name: research, cohort: lab, weight: 2, quotas: {H100: {nominal: 16, borrowing_limit: 8}}}\n"
    )
    queues = load_queues(file)
    assert queues.names() == ["default", "research"]
    assert queues.tree.queue_names() == ["research"] and queues.unlimited == {"default"}
    assert queues.tree.nominal(QueueName("research"), Resource("H100")) == 16
    assert queues.tree.borrowing_limit(QueueName("research"), Resource("H100")) == 8
    assert queues.weight(QueueName("research")) == 2
    assert load_queues(None).names() == ["default"] and load_queues(None).unlimited == {"default"}
    file.write_text("queues: [{name: research}]\n")  # a file is authoritative: no default unless listed
    assert load_queues(file).names() == ["research"]
    with pytest.raises(ValueError, match="defined twice"):
        queues_of(QueuesFile.model_validate({"queues": [{"name": "x"}, {"name": "x"}]}))
    with pytest.raises(QuotaConfigError, match="parent cohort"):
        queues_of(QueuesFile.model_validate({"cohorts": [{"name": "a", "parent": "nowhere"}]}))
    with pytest.raises(ValidationError, match="unlimited queue has no quotas"):
        QueuesFile.model_validate(
            {"queues": [{"name": "x", "unlimited": True, "quotas": {"H100": {"nominal": 1}}}]}
        )


def test_why_answers_from_the_state_and_the_pending_reasons() -> None:
    reasons = [
        {"code": "quota", "constraint": "quota", "message": "queue research is at its quota of 16 H100"}
    ]
    pending = why(
        {"state": "pending", "queue": "research", "reason": reasons[0]["message"], "pending_reasons": reasons}
    )
    assert pending == {
        "state": "pending",
        "pending": True,
        "summary": reasons[0]["message"],
        "reasons": reasons,
    }
    queued = why({"state": "queued", "queue": "research", "reason": None, "pending_reasons": []})
    assert (
        queued["summary"] == "waiting in queue 'research' for the next scheduling cycle"
        and not queued["pending"]
    )
    failed = why({"state": "failed", "queue": "q", "reason": "rank 1 exited 3", "pending_reasons": reasons})
    assert (failed["summary"], failed["reasons"]) == ("failed: rank 1 exited 3", [])
    assert why({"state": "running", "queue": "q"})["summary"] == "not pending (running)"


def test_cursors_round_trip_and_foreign_ones_are_refused() -> None:
    at = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert decode_cursor(encode_cursor(at, "a-1", 3), (datetime, str, int)) == [at, "a-1", 3]
    for bad in ("garbage", encode_cursor("x"), encode_cursor("not-a-time", "a")):
        with pytest.raises(BadCursor):
            decode_cursor(bad, (datetime, str))


def test_tables_align_columns_and_show_missing_values_as_dashes() -> None:
    assert table(["NODE", "STATE"], [["n0", "ready"], ["node-10", None]]) == (
        "NODE     STATE\nn0       ready\nnode-10  -"
    )
