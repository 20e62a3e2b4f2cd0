"""Ledger settings (environment: GANGLINE_*)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from gangline.events import topics
from gangline.store.pool import DEFAULT_DSN
from gangline.telemetry.metrics import METRICS_PORTS
from services.common.env import ServiceSettings


class LedgerSettings(ServiceSettings):
    """``pg_dsn`` (GANGLINE_PG_DSN) is a secret: it may carry a password."""

    metrics_port: int | None = Field(default=METRICS_PORTS["ledger"], ge=0, le=65535)

    pg_dsn: SecretStr = SecretStr(DEFAULT_DSN)
    poll_timeout_ms: int = Field(default=500, ge=1)
    record_heartbeats: bool = False
    """Keep every node.heartbeat in the events table too (off: they only update the node's row)."""

    @property
    def group_id(self) -> str:
        return f"{self.group_prefix}.ledger"

    @property
    def input_topics(self) -> tuple[str, ...]:
        """Every public topic (under the prefix); dead-letter topics are not events and stay out."""
        return tuple(f"{self.topic_prefix}{topic}" for topic in topics.PUBLIC_TOPICS)
