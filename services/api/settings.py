"""API settings (environment: GANGLINE_*)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from gangline.store.pool import DEFAULT_DSN
from services.common.env import ServiceSettings


class ApiSettings(ServiceSettings):
    """Where the API listens and what it reads.

    Tokens come from ``tokens_file`` (GANGLINE_TOKENS_FILE, YAML) or ``tokens`` (GANGLINE_TOKENS,
    the same document as JSON); see :mod:`services.api.auth`. Queues and their quotas come from
    ``queues_file`` (GANGLINE_QUEUES_FILE, the file admission and quota read); see
    :mod:`services.common.queues`.
    """

    pg_dsn: SecretStr = SecretStr(DEFAULT_DSN)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    tokens_file: Path | None = None
    tokens: SecretStr | None = None
