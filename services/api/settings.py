"""API settings (environment: GANGLINE_*)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from gangline.store.pool import DEFAULT_DSN
from gangline.telemetry.metrics import METRICS_PORTS
from services.common.env import ServiceSettings


class ApiSettings(ServiceSettings):
    """Where the API listens, what it reads, and what it takes.

    Tokens come from ``tokens_file`` (GANGLINE_TOKENS_FILE, YAML) or ``tokens`` (GANGLINE_TOKENS,
    the same document as JSON), stored hashed; see :mod:`services.api.auth`. Queues and their quotas
    come from ``queues_file`` (GANGLINE_QUEUES_FILE, the file admission and quota read); see
    :mod:`services.common.queues`.
    """

    metrics_port: int | None = Field(default=METRICS_PORTS["api"], ge=0, le=65535)

    pg_dsn: SecretStr = SecretStr(DEFAULT_DSN)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    tokens_file: Path | None = None
    tokens: SecretStr | None = None
    max_body_bytes: int = Field(default=1_048_576, ge=1024, le=16 * 1_048_576)
    """GANGLINE_MAX_BODY_BYTES: a larger request body is refused (413) before it is read whole."""
    rate_limit_per_s: float = Field(default=20.0, gt=0)
    """GANGLINE_RATE_LIMIT_PER_S: requests per second each tenant may make, on average."""
    rate_limit_burst: int = Field(default=40, ge=1)
    """GANGLINE_RATE_LIMIT_BURST: requests a tenant may make at once before the rate applies (429)."""
    analytics_url: str | None = "http://127.0.0.1:8091"
    """GANGLINE_ANALYTICS_URL: the analytics app (services/analytics) the dashboard's charts read through
    ``/v1/analytics/...``; unset or unreachable: the charts say so, the rest of the dashboard works."""
    stream_token_key: SecretStr | None = None
    """GANGLINE_STREAM_TOKEN_KEY: signs the dashboard's short-lived stream tokens; set the same on every
    replica behind one address (unset: a random key per process)."""
    stream_token_ttl_s: int = Field(default=60, ge=5, le=3600)
    """GANGLINE_STREAM_TOKEN_TTL_S: how long a stream token may open a stream (an open one stays open)."""
    live_settle_s: float = Field(default=10.0, gt=0)
    """GANGLINE_LIVE_SETTLE_S: how long the live feed waits for the ledger to record an event."""
