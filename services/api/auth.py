"""Bearer tokens: each maps to a tenant and the queues it may act on; an admin token may do anything.

The token document (YAML in a file, or JSON in GANGLINE_TOKENS)::

    tenants:
      - name: research
        token: "<secret>"
        queues: [research, research-urgent]
      - name: ops
        token: "<secret>"
        admin: true

The ``default`` queue is open to every authenticated tenant.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

DEFAULT_QUEUE = "default"


class Tenant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    token: SecretStr
    queues: tuple[str, ...] = ()
    admin: bool = False

    @model_validator(mode="after")
    def _long_enough(self) -> Tenant:
        if len(self.token.get_secret_value()) < 8:
            raise ValueError(f"tenant {self.name!r}: a token needs at least 8 characters")
        return self


class TokenConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tenants: tuple[Tenant, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> TokenConfig:
        tokens = [t.token.get_secret_value() for t in self.tenants]
        if len(set(tokens)) != len(tokens):
            raise ValueError("two tenants share a token")
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("two tenants share a name")
        return self


class Principal(BaseModel):
    """Who is calling: a tenant, the queues it may act on, and whether it is an admin."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    queues: frozenset[str]
    admin: bool = False

    def may_act_on(self, queue: str) -> bool:
        return self.admin or queue == DEFAULT_QUEUE or queue in self.queues

    def visible_queues(self) -> list[str] | None:
        """The queues this caller may read; None means all of them."""
        return None if self.admin else sorted(self.queues | {DEFAULT_QUEUE})


class Authenticator:
    """Finds the principal of a bearer token, comparing in constant time."""

    def __init__(self, config: TokenConfig) -> None:
        self._tenants: Sequence[Tenant] = config.tenants

    def principal(self, token: str) -> Principal | None:
        found: Tenant | None = None
        for tenant in self._tenants:
            # Every token is compared, so the time taken does not tell which one matched.
            if hmac.compare_digest(tenant.token.get_secret_value().encode(), token.encode()):
                found = tenant
        if found is None:
            return None
        return Principal(tenant=found.name, queues=frozenset(found.queues), admin=found.admin)


def load_tokens(*, file: Path | None, inline: SecretStr | None) -> TokenConfig:
    """The token document from ``file`` (YAML) and ``inline`` (JSON), tenants of both; empty when neither."""
    tenants: list[Tenant] = []
    if file is not None:
        tenants += TokenConfig.model_validate(yaml.safe_load(file.read_text(encoding="utf-8")) or {}).tenants
    if inline is not None and inline.get_secret_value().strip():
        tenants += TokenConfig.model_validate(json.loads(inline.get_secret_value())).tenants
    return TokenConfig(tenants=tuple(tenants))
