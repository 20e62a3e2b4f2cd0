"""The API's pure parts: tokens, queue config, "why", cursors, and the CLI's tables."""

from __future__ import annotations

import hashlib
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError

from gangline.client.tables import table
from gangline.core.queues import QueueName, QuotaConfigError, Resource
from services.api.app import JobSubmission, why
from services.api.auth import Authenticator, Tenant, TokenConfig, hash_token, load_tokens
from services.api.hash_token import main as hash_token_main
from services.api.queries import BadCursor, cursor_pattern, decode_cursor, encode_cursor
from services.common.queues import QueuesFile, load_queues, queues_of


def test_tokens_from_a_file_and_the_environment_map_to_tenants_and_their_queues(tmp_path: Path) -> None:
    file = tmp_path / "tokens.yaml"
    file.write_text(
        "tenants:\n"
        f"  - {{name: research, token_sha256: {hash_token('research-secret-1')}, queues: [research]}}\n"
    )
    entry = {"name": "ops", "token_sha256": hash_token("ops-secret-token-1"), "admin": True}
    inline = SecretStr(json.dumps({"tenants": [entry]}))
    auth = Authenticator(load_tokens(file=file, inline=inline))
    research = auth.principal("research-secret-1")
    assert research is not None and research.tenant == "research"
    assert (
        research.may_act_on("research")
        and research.may_act_on("default")
        and not research.may_act_on("vision")
    )
    assert research.visible_queues() == ["default", "research"]
    # In default, the queue every tenant may use, a tenant sees only the jobs it submitted.
    assert research.may_see("default", "research") and not research.may_see("default", "vision")
    assert not research.may_see("default", None) and research.may_see("research", "vision")
    ops = auth.principal("ops-secret-token-1")
    assert ops is not None and ops.may_act_on("vision") and ops.visible_queues() is None
    assert ops.may_see("default", "vision")
    assert auth.principal("research-secret-2") is None and auth.principal("") is None
    # The hash itself is not a token.
    assert auth.principal(hash_token("research-secret-1")) is None


def test_the_token_document_holds_hashes_only_never_the_tokens() -> None:
    digest = hash_token("long-enough-token-1")
    assert digest == hashlib.sha256(b"long-enough-token-1").hexdigest()
    config = TokenConfig.model_validate({"tenants": [{"name": "a", "token_sha256": digest}]})
    assert digest not in repr(config)
    with pytest.raises(ValidationError, match="holds tokens hashed"):
        TokenConfig.model_validate({"tenants": [{"name": "a", "token": "long-enough-token-1"}]})
    for bad in ("long-enough-token-1", digest.upper(), digest[:-1]):
        with pytest.raises(ValidationError, match="64 lower-case hex digits"):
            TokenConfig.model_validate({"tenants": [{"name": "a", "token_sha256": bad}]})
    with pytest.raises(ValidationError, match="share a token"):
        TokenConfig.model_validate(
            {"tenants": [{"name": "a", "token_sha256": digest}, {"name": "b", "token_sha256": digest}]}
        )
    with pytest.raises(ValueError, match="at least 16 characters"):
        Tenant.with_token("a", "short-token")


def test_the_hash_helper_prints_a_tokens_hash_and_makes_new_tokens(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("dev-ops-admin-token\n"))
    assert hash_token_main([]) == 0
    assert capsys.readouterr().out == hash_token("dev-ops-admin-token") + "\n"
    assert hash_token_main(["--new", "--tenant", "research"]) == 0
    out, err = capsys.readouterr()
    token = err.rsplit(" ", 1)[1].strip()
    entry = yaml.safe_load(out)
    assert entry == [{"name": "research", "token_sha256": hash_token(token)}] and len(token) >= 40
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert hash_token_main([]) == 2


def test_the_development_tokens_file_holds_the_hashes_of_the_documented_tokens() -> None:
    dev = Path(__file__).resolve().parents[3] / "deploy" / "docker" / "api-tokens.dev.yaml"
    auth = Authenticator(load_tokens(file=dev, inline=None))
    for token, tenant in (
        ("dev-team-a-token", "team-a"),
        ("dev-team-b-token", "team-b"),
        ("dev-ops-admin-token", "ops"),
    ):
        found = auth.principal(token)
        assert found is not None and found.tenant == tenant
    assert "dev-ops-admin-token" not in dev.read_text().split("tenants:")[1]


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
    for bad in ("garbage", "0", encode_cursor("x"), encode_cursor("not-a-time", "a"), "1~a\n", "-1~a"):
        with pytest.raises(BadCursor):
            decode_cursor(bad, (datetime, str))


@given(st.from_regex(cursor_pattern((datetime, str, int), id_chars=160), fullmatch=True))
def test_every_string_of_a_cursors_pattern_is_a_cursor_of_its_list(cursor: str) -> None:
    """The OpenAPI gives the pattern: whatever matches it is a position in the list, never a 400."""
    kinds = (datetime, str, int)
    key = decode_cursor(cursor, kinds)
    assert [type(k) for k in key] == list(kinds) and key[0].tzinfo is UTC
    assert decode_cursor(encode_cursor(*key), kinds) == key


def test_tables_align_columns_and_show_missing_values_as_dashes() -> None:
    assert table(["NODE", "STATE"], [["n0", "ready"], ["node-10", None]]) == (
        "NODE     STATE\nn0       ready\nnode-10  -"
    )


def test_the_bodys_json_schema_states_the_slice_rule_the_model_checks() -> None:
    schema = JobSubmission.model_json_schema()
    for gpus in (0, 1, 2):
        for mig in (None, "1g.10gb"):
            for fraction in (None, 250):
                body: dict[str, object] = {"queue": "q", "workers": 1, "gpus_per_worker": gpus}
                if mig is not None:
                    body["mig_profile"] = mig
                if fraction is not None:
                    body["gpu_fraction_milli"] = fraction
                try:
                    JobSubmission.model_validate_json(json.dumps(body))
                    valid = True
                except ValidationError:
                    valid = False
                assert jsonschema.Draft202012Validator(schema).is_valid(body) == valid, body
    with pytest.raises(ValidationError, match="Input should be a valid integer"):
        JobSubmission.model_validate_json('{"queue": "q", "workers": "1", "gpus_per_worker": 1}')


def test_an_integral_number_is_an_integer_as_json_schema_says_and_a_string_is_not() -> None:
    # Found by schemathesis (positive data): "workers": 35922.0 is an integer to JSON Schema.
    from services.api.app import JobSubmission, integral_numbers_as_integers

    raw = b'{"queue": "q", "workers": 2.0, "gpus_per_worker": 1e0, "gpu_memory_mib": 1.5e3}'
    job = JobSubmission.model_validate_json(integral_numbers_as_integers(raw))
    assert (job.workers, job.gpus_per_worker, job.gpu_memory_mib) == (2, 1, 1500)
    with pytest.raises(ValidationError, match="workers"):
        JobSubmission.model_validate_json(integral_numbers_as_integers(b'{"queue": "q", "workers": 2.5}'))
    with pytest.raises(ValidationError, match="workers"):
        JobSubmission.model_validate_json(
            integral_numbers_as_integers(b'{"queue": "q", "workers": "2", "gpus_per_worker": 1}')
        )
    for untouched in (b'{"workers": 2}', b"{not json", b'{"a": "\\ud800", "b": 1}', b"[" * 5000):
        assert integral_numbers_as_integers(untouched) == untouched
    assert json.loads(integral_numbers_as_integers(b'{"a": "\\ud800", "b": 1.0}')) == {"a": "\ud800", "b": 1}


def test_a_jobs_size_history_is_one_entry_per_allocation_with_its_workers() -> None:
    from services.api.queries import size_history

    t0, t1 = datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 1, 0, 5, tzinfo=UTC)

    def row(
        allocation: str,
        rank: int,
        granted: datetime,
        released: datetime | None,
        why: str | None,
        of: str | None,
    ) -> dict[str, object]:
        return {
            "allocation_id": allocation,
            "rank": rank,
            "granted_at": granted,
            "released_at": released,
            "release_reason": why,
            "resizes": of,
        }

    rows = [row("el.1", 0, t0, t1, "resized", None)] + [
        row("el.2", r, t1, None, None, "el.1") for r in range(4)
    ]
    assert size_history(rows) == [
        {
            "allocation_id": "el.1",
            "workers": 1,
            "granted_at": t0,
            "released_at": t1,
            "release_reason": "resized",
            "resizes": None,
        },
        {
            "allocation_id": "el.2",
            "workers": 4,
            "granted_at": t1,
            "released_at": None,
            "release_reason": None,
            "resizes": "el.1",
        },
    ]
