"""The dashboard's stream tokens and who hears of what on the live feed (services/api/auth.py, live.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from gangline.events.base import make_envelope
from gangline.events.jobs import JobPending, PendingReason
from services.api.auth import Authenticator, Principal, StreamTokens, Tenant, TokenConfig
from services.api.live import RESYNC, SUBSCRIBER_BUFFER, Notice, Subscription, short_type, summary_of

NOW = 1_800_000_000.0


def authenticator() -> Authenticator:
    return Authenticator(
        TokenConfig(
            tenants=(
                Tenant.with_token("ops", "admin-token-0123456789", admin=True),
                Tenant.with_token("team-a", "team-a-token-0123456789", queues=["a"]),
            )
        )
    )


def tokens(key: bytes | None = b"k" * 32, ttl_s: int = 60) -> StreamTokens:
    return StreamTokens(authenticator(), key=key, ttl_s=ttl_s)


def caller(name: str) -> Principal:
    found = authenticator().tenant(name)
    assert found is not None
    return found


def test_a_stream_token_names_its_tenant_until_it_expires() -> None:
    issued = tokens().issue(caller("team-a"), now_s=NOW)
    assert tokens().principal(issued, now_s=NOW + 60) == caller("team-a")
    assert tokens().principal(issued, now_s=NOW + 61) is None  # expired


def test_a_stream_token_is_refused_when_forged_or_signed_with_another_key() -> None:
    issued = tokens().issue(caller("team-a"), now_s=NOW)
    payload, _, signature = issued.partition(".")
    admin_payload = tokens().issue(caller("ops"), now_s=NOW).partition(".")[0]
    assert tokens().principal(f"{admin_payload}.{signature}", now_s=NOW) is None  # another tenant's claim
    assert tokens(key=b"x" * 32).principal(issued, now_s=NOW) is None
    assert tokens().principal(payload, now_s=NOW) is None
    assert tokens().principal("not a token", now_s=NOW) is None
    # Without a configured key each process draws its own: one's token is not another's.
    assert tokens(key=None).principal(tokens(key=None).issue(caller("ops"), now_s=NOW), now_s=NOW) is None


def test_a_stream_token_of_a_tenant_no_longer_in_the_token_document_is_refused() -> None:
    issued = tokens().issue(Principal(tenant="gone", queues=frozenset()), now_s=NOW)
    assert tokens().principal(issued, now_s=NOW) is None


def notice(**fields: object) -> Notice:
    base: dict[str, object] = {
        "id": "e1",
        "type": "job.started",
        "time": "2026-12-02T00:00:00+00:00",
        "subject": "j1",
        "topic": "job",
        "job_id": "j1",
        "node": None,
        "queue": "a",
        "submitted_by": "team-a",
        "state": "running",
        "summary": "",
        "recorded": True,
    }
    return Notice(**{**base, **fields})  # type: ignore[arg-type]


def test_a_tenant_hears_of_its_own_jobs_and_queues_the_admin_of_all() -> None:
    team, admin = caller("team-a"), caller("ops")
    assert notice().visible_to(team) and notice().visible_to(admin)
    theirs = notice(queue="b", submitted_by="team-b")
    assert not theirs.visible_to(team) and theirs.visible_to(admin)
    # In default, open to every tenant: only the jobs it submitted.
    assert notice(queue="default", submitted_by="team-a").visible_to(team)
    assert not notice(queue="default", submitted_by="team-b").visible_to(team)
    # A job the ledger has not recorded (queue unknown): admins only.
    unknown = notice(queue=None, submitted_by=None, recorded=False)
    assert not unknown.visible_to(team) and unknown.visible_to(admin)
    # Queues: its own (and default); nodes: everyone.
    assert notice(topic="queue", job_id=None, queue="a").visible_to(team)
    assert not notice(topic="queue", job_id=None, queue="b").visible_to(team)
    assert notice(topic="node", job_id=None, queue=None, node="n1").visible_to(team)


def test_a_subscriber_that_falls_behind_is_told_to_resync() -> None:
    subscription = Subscription(caller("team-a"))
    for k in range(SUBSCRIBER_BUFFER + 1):
        subscription.offer(notice(id=f"e{k}"))
    subscription.offer(notice(id="hidden", queue="b", submitted_by="team-b"))  # not its: not queued
    queued = [subscription.queue.get_nowait() for _ in range(subscription.queue.qsize())]
    assert queued == [RESYNC]


def test_a_notice_says_what_happened_in_the_events_own_words() -> None:
    pending = JobPending(
        job_id="j1",
        reasons=[PendingReason(code="quota", constraint="quota", message="team-a uses 8 of its 8 H100")],
    )
    envelope = make_envelope(pending, event_id="e1", source="test", time=datetime(2026, 12, 2, tzinfo=UTC))
    assert short_type(envelope.type) == "job.pending"
    assert summary_of(envelope) == "quota: team-a uses 8 of its 8 H100"
