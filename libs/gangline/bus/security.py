"""Who a Kafka client is and how it proves it: SASL/SCRAM credentials and TLS, from settings only.

Every aiokafka client of the project (producer, consumer, admin, the processor, the chain reader) is
built with :func:`client_options`. Credentials come from a :class:`KafkaSecurity` the caller was
given, or, when none was given, from the process environment::

    GANGLINE_KAFKA_SECURITY_PROTOCOL   PLAINTEXT | SASL_PLAINTEXT | SASL_SSL | SSL
                                       (unset: SASL_PLAINTEXT when a user name is set, else PLAINTEXT)
    GANGLINE_KAFKA_SASL_MECHANISM      SCRAM-SHA-512 (default) | SCRAM-SHA-256 | PLAIN
    GANGLINE_KAFKA_USERNAME            the principal (User:<name> on the broker)
    GANGLINE_KAFKA_PASSWORD            its password, or
    GANGLINE_KAFKA_PASSWORD_FILE       a file holding it (a mounted secret; trailing newline dropped)
    GANGLINE_KAFKA_SSL_CAFILE          the CA bundle that signed the broker's certificate (TLS only)

The password is a ``SecretStr``: it never appears in a repr, a log line or an exception message.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from aiokafka.helpers import create_ssl_context
from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

SecurityProtocol = Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"]
SaslMechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]

ENV_PREFIX = "GANGLINE_KAFKA_"
_FIELDS = ("security_protocol", "sasl_mechanism", "username", "password", "password_file", "ssl_cafile")


class KafkaSecurity(BaseModel):
    """The credentials and transport of one Kafka client (frozen; the password is never shown)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    security_protocol: SecurityProtocol | None = None
    sasl_mechanism: SaslMechanism = "SCRAM-SHA-512"
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None
    ssl_cafile: Path | None = None
    ssl_check_hostname: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.password is not None and self.password_file is not None:
            raise ValueError("give the Kafka password or a password file, not both")
        if self.sasl and self.username is None:
            raise ValueError(f"{self.protocol} needs a user name (GANGLINE_KAFKA_USERNAME)")
        if self.sasl and self.password is None and self.password_file is None:
            raise ValueError(
                "SASL needs a password (GANGLINE_KAFKA_PASSWORD or GANGLINE_KAFKA_PASSWORD_FILE)"
            )
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The ``GANGLINE_KAFKA_*`` variables of ``environ`` (default: the process environment)."""
        source = os.environ if environ is None else environ
        values = {f: source[ENV_PREFIX + f.upper()] for f in _FIELDS if source.get(ENV_PREFIX + f.upper())}
        return cls.model_validate(values)

    @property
    def protocol(self) -> SecurityProtocol:
        if self.security_protocol is not None:
            return self.security_protocol
        return "SASL_PLAINTEXT" if self.username is not None else "PLAINTEXT"

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SASL_SSL", "SSL")

    @property
    def principal(self) -> str:
        """The broker's name for this client: ``User:<name>``, or ``User:ANONYMOUS`` without SASL."""
        return f"User:{self.username}" if self.sasl and self.username else "User:ANONYMOUS"

    def secret(self) -> str:
        """The password (read from its file each time, so a rotated secret is picked up on reconnect)."""
        if self.password is not None:
            return self.password.get_secret_value()
        if self.password_file is not None:
            return self.password_file.read_text(encoding="utf-8").rstrip("\r\n")
        raise ValueError("no Kafka password configured")

    def ssl_context(self) -> ssl.SSLContext:
        context: ssl.SSLContext = create_ssl_context(cafile=str(self.ssl_cafile) if self.ssl_cafile else None)
        context.check_hostname = self.ssl_check_hostname
        return context

    def client_options(self) -> dict[str, Any]:
        """The keyword arguments that make an aiokafka client (producer, consumer, admin) use these."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self.sasl:
            options |= {
                "sasl_mechanism": self.sasl_mechanism,
                "sasl_plain_username": self.username,
                "sasl_plain_password": self.secret(),
            }
        if self.tls:
            options["ssl_context"] = self.ssl_context()
        return options


def client_options(security: KafkaSecurity | None = None) -> dict[str, Any]:
    """aiokafka keyword arguments for ``security``, or for the ``GANGLINE_KAFKA_*`` environment when None."""
    return (security if security is not None else KafkaSecurity.from_env()).client_options()
