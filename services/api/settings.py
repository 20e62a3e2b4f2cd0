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
