"""Bearer tokens: each maps to a tenant and the queues it may act on; an admin token may do anything.

Tokens are stored hashed: the token document holds each token's SHA-256, never the token itself,
so a leaked file or environment lets nobody in. ``python -m services.api.hash_token`` prints the
hash of a token (read from stdin) or makes a new random token and its hash. The document (YAML in
a file, or JSON in GANGLINE_TOKENS)::

    tenants:
      - name: research
        token_sha256: "<64 hex digits>"
        queues: [research, research-urgent]
      - name: ops
        token_sha256: "<64 hex digits>"
        admin: true

SHA-256 suffices because the tokens are long random secrets, not passwords people choose (a slow
hash protects guessable secrets; it would only slow every request here). A presented token is
hashed once and compared with every stored hash in constant time.

The ``default`` queue is open to every authenticated tenant, for its own jobs: a tenant sees and
cancels in ``default`` only the jobs it submitted (the ``submitted_by`` the API records in each
request), an admin every job.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

DEFAULT_QUEUE = "default"
MIN_TOKEN_CHARS = 16


def hash_token(token: str) -> str:
    """The SHA-256 of a token, in lower-case hex: what the token document stores."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A new random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


class Tenant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=256)
    token_sha256: SecretStr = Field(description="the SHA-256 of the tenant's token, lower-case hex")
    queues: tuple[str, ...] = ()
    admin: bool = False

    @model_validator(mode="before")
    @classmethod
    def _no_plain_token(cls, data: object) -> object:
        if isinstance(data, dict) and "token" in data:
            raise ValueError(
                f"tenant {data.get('name')!r}: the token document holds tokens hashed (token_sha256), "
                "never the token itself; hash it with `python -m services.api.hash_token`"
            )
        return data

    @model_validator(mode="after")
    def _a_hash(self) -> Tenant:
        digest = self.token_sha256.get_secret_value()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"tenant {self.name!r}: token_sha256 must be 64 lower-case hex digits")
        return self

    @classmethod
    def with_token(cls, name: str, token: str, *, queues: Sequence[str] = (), admin: bool = False) -> Tenant:
        """A tenant whose token is ``token`` (hashed here; the token is not kept)."""
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(f"tenant {name!r}: a token needs at least {MIN_TOKEN_CHARS} characters")
        return cls(name=name, token_sha256=SecretStr(hash_token(token)), queues=tuple(queues), admin=admin)


class TokenConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tenants: tuple[Tenant, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> TokenConfig:
        digests = [t.token_sha256.get_secret_value() for t in self.tenants]
        if len(set(digests)) != len(digests):
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
        """May submit to ``queue`` (in ``default``: jobs of its own)."""
        return self.admin or queue == DEFAULT_QUEUE or queue in self.queues

    def may_see(self, queue: str, submitted_by: str | None) -> bool:
        """May read and cancel a job of ``queue`` submitted by ``submitted_by``."""
        if self.admin or queue in self.queues:
            return True
        return queue == DEFAULT_QUEUE and submitted_by == self.tenant

    def visible_queues(self) -> list[str] | None:
        """The queues this caller may read (in ``default`` only its own jobs); None means all of them."""
        return None if self.admin else sorted(self.queues | {DEFAULT_QUEUE})

    def own_queues(self) -> list[str] | None:
        """The queues whose every job this caller may read; None means all of them."""
        return None if self.admin else sorted(self.queues)


class Authenticator:
    """Finds the principal of a bearer token: its hash compared with every stored one in constant time."""

    def __init__(self, config: TokenConfig) -> None:
        self._tenants: Sequence[tuple[bytes, Tenant]] = [
            (bytes.fromhex(t.token_sha256.get_secret_value()), t) for t in config.tenants
        ]

    def principal(self, token: str) -> Principal | None:
        presented = hashlib.sha256(token.encode()).digest()
        found: Tenant | None = None
        for digest, tenant in self._tenants:
            # Every hash is compared, so the time taken does not tell which one matched.
            if hmac.compare_digest(digest, presented):
                found = tenant
        if found is None:
            return None
        return Principal(tenant=found.name, queues=frozenset(found.queues), admin=found.admin)

    def tenant(self, name: str) -> Principal | None:
        """The principal of the tenant named ``name``; None when the token document has none."""
        for _, tenant in self._tenants:
            if tenant.name == name:
                return Principal(tenant=tenant.name, queues=frozenset(tenant.queues), admin=tenant.admin)
        return None


def load_tokens(*, file: Path | None, inline: SecretStr | None) -> TokenConfig:
    """The token document from ``file`` (YAML) and ``inline`` (JSON), tenants of both; empty when neither."""
    tenants: list[Tenant] = []
    if file is not None:
        tenants += TokenConfig.model_validate(yaml.safe_load(file.read_text(encoding="utf-8")) or {}).tenants
    if inline is not None and inline.get_secret_value().strip():
        tenants += TokenConfig.model_validate(json.loads(inline.get_secret_value())).tenants
    return TokenConfig(tenants=tuple(tenants))


class StreamTokens:
    """Short-lived signed tokens for what cannot send an ``Authorization`` header (a browser's
    EventSource): ``<payload>.<HMAC-SHA256>``, the payload naming the tenant and the expiry (Unix
    seconds). The key is ``key`` (GANGLINE_STREAM_TOKEN_KEY, shared by the replicas behind one address),
    else random per process: a token then works only on the replica that made it, which is all one
    EventSource needs (it asks again when refused).
    """

    def __init__(self, authenticator: Authenticator, *, key: bytes | None, ttl_s: int) -> None:
        self._auth = authenticator
        self._key = key if key is not None else secrets.token_bytes(32)
        self.ttl_s = ttl_s

    def _sign(self, payload: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.digest(self._key, payload, "sha256")).decode().rstrip("=")

    def issue(self, caller: Principal, *, now_s: float) -> str:
        payload = json.dumps({"tenant": caller.tenant, "exp": int(now_s) + self.ttl_s}).encode()
        return base64.urlsafe_b64encode(payload).decode().rstrip("=") + "." + self._sign(payload)

    def principal(self, token: str, *, now_s: float) -> Principal | None:
        """The token's tenant as it stands in the token document now; None when forged, expired or gone."""
        encoded, _, signature = token.partition(".")
        try:
            payload = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            claims = json.loads(payload)
        except (ValueError, TypeError):
            return None
        if not hmac.compare_digest(self._sign(payload), signature) or not isinstance(claims, dict):
            return None
        expiry, tenant = claims.get("exp"), claims.get("tenant")
        if not isinstance(expiry, int) or expiry < now_s or not isinstance(tenant, str):
            return None
        return self._auth.tenant(tenant)
