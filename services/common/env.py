"""Reading service settings from environment variables (``GANGLINE_<NAME>``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from gangline.bus import ProcessorSettings
from gangline.bus.security import KafkaSecurity, SaslMechanism, SecurityProtocol
from gangline.core.pools import PoolLayout
from services.common.topics import TopicNames

PREFIX = "GANGLINE_"


def env_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every ``GANGLINE_*`` variable, lower-cased, prefix dropped: GANGLINE_TOPIC_PREFIX → topic_prefix."""
    source = os.environ if environ is None else environ
    return {k[len(PREFIX) :].lower(): v for k, v in source.items() if k.startswith(PREFIX) and v != ""}


LAZY_LINGER_MS = 100
"""The batch wait of services off the request-to-grant path (preemption, node_health). A consumer that
takes records as soon as they come makes one fetch, one pass of the loop and one (local) transaction
per handful of records; those fixed costs, not the records, were most of these services' CPU on a
busy cluster. Waiting 100 ms between batches cut it by about half (make bench-e2e), at up to 100 ms
on decisions whose own deadlines are seconds (checkpoints, silences)."""


class ServiceSettings(BaseModel):
    """What every decision service needs: the broker, its topics, and who this replica is."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_security_protocol: SecurityProtocol | None = None
    """GANGLINE_KAFKA_SECURITY_PROTOCOL; unset: SASL_PLAINTEXT with a user name (gangline.bus.security)."""
    kafka_sasl_mechanism: SaslMechanism = "SCRAM-SHA-512"
    kafka_username: str | None = None
    """This service's principal on the broker (GANGLINE_KAFKA_USERNAME), e.g. ``placement``."""
    kafka_password: SecretStr | None = None
    kafka_password_file: Path | None = None
    """A mounted secret holding the password (GANGLINE_KAFKA_PASSWORD_FILE); preferred to the variable."""
    kafka_ssl_cafile: Path | None = None
    topic_prefix: str = ""
    instance_id: str = Field(default_factory=socket.gethostname, min_length=1)
    group_prefix: str = "gangline"
    """Consumer groups are ``<group_prefix>.<service>``; tests give each run its own."""
    max_batch_records: int = Field(default=500, ge=1)
    log_level: str = "INFO"
    session_timeout_ms: int = Field(default=10_000, ge=1000)
    """How long a silent replica keeps its partitions before the group gives them to another."""
    lock_session_timeout_ms: int = Field(default=1_500, ge=1000)
    """GANGLINE_LOCK_SESSION_TIMEOUT_MS: how long a silent leader (quota, placement, preemption,
    node_health) keeps its lock before a standby takes over (services.common.leader); its heartbeats run
    on a thread of their own, so only a stop of the whole process lets it lapse."""
    linger_ms: int = Field(default=10, ge=0)
    """How long a processor waits to fill a batch (one transaction) after the first record arrives."""
    idle_commit_ms: int = Field(default=1_000, ge=0)
    """How long offsets of batches that published nothing may wait for a commit (see ProcessorSettings)."""
    producer_retry_backoff_ms: int = Field(default=5, ge=1)
    """How soon a refused transactional request is retried (see ProcessorSettings); latency, mostly."""
    max_batch_attempts: int = Field(default=3, ge=1)
    """How often a batch (then a record alone) that fails outside the handler is tried before the record
    is dead-lettered and skipped (GANGLINE_MAX_BATCH_ATTEMPTS; see ProcessorSettings)."""
    max_handler_attempts: int = Field(default=3, ge=1)
    """How often a record whose handler raises is tried before it is dead-lettered
    (GANGLINE_MAX_HANDLER_ATTEMPTS)."""
    static_membership: bool = True
    """A restarted replica (same instance id) takes its partitions back at once, without a rebalance."""
    queues_file: Path | None = None
    """The queue configuration (GANGLINE_QUEUES_FILE), read by admission, quota and the API (placement and
    preemption read which queues are unlimited); see
    :mod:`services.common.queues`. Unset: one unlimited ``default`` queue."""
    trust_access: Path | None = None
    """GANGLINE_TRUST_ACCESS: readers check who wrote each record on jobs.requests, jobs.events and nodes.*
    against this access file, and sign what they write (:mod:`gangline.bus.trust`, which reads these four
    from the process environment); unset: no check (make up, compose and the tests set it)."""
    trust_key_file: Path | None = None
    """GANGLINE_TRUST_KEY_FILE: the master key (a mounted secret) the checking services hold."""
    trust_tokens_file: Path | None = None
    """GANGLINE_TRUST_TOKENS_FILE: the API's token file, which names each tenant's queues."""
    writer_key_file: Path | None = None
    """GANGLINE_WRITER_KEY_FILE: an edge writer's own derived key (an agent), instead of the master key."""
    writer_principal: str | None = None
    """GANGLINE_WRITER_PRINCIPAL: the access-file principal to sign as when the Kafka user name differs
    (deploy/k8s: ``node_health`` authenticates as ``node-health``); unset: the Kafka user name."""
    pools: str | None = None
    """GANGLINE_POOLS: the cluster's pools, ``label=pool,pool,...`` (e.g. ``spine=spine-a,spine-b``; the
    cluster spec's ``pools``): a pool's index is its partition of every pooled topic (gangline.core.pools).
    Unset: one pool, the whole cluster, as before pools existed."""
    pool_group: str | None = None
    """GANGLINE_POOL_GROUP: the pools this replica of a pool-owned service leads first, comma-separated
    (unset: by ``pool_replicas`` and its ordinal, else all); it stands by for the others
    (services.common.pools)."""
    pool_replicas: int | None = Field(default=None, ge=1)
    """GANGLINE_POOL_REPLICAS: with no ``pool_group``, the replicas the pools are dealt over by ordinal
    (a StatefulSet's replica count: pod ``-N`` leads the pools whose index is N modulo it)."""
    pool_standby_delay_s: float = Field(default=5.0, ge=0)
    """GANGLINE_POOL_STANDBY_DELAY_S: how long a replica waits before standing by for other groups' pools."""
    otlp_endpoint: str | None = None
    """OTLP/HTTP collector; traces are exported only when set (or OTEL_EXPORTER_OTLP_* is)."""
    metrics_host: str = "127.0.0.1"
    """GANGLINE_METRICS_HOST: where ``/metrics`` listens (loopback unless a scraper elsewhere needs it)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """GANGLINE_METRICS_PORT: the ``/metrics`` port (``METRICS_PORTS`` per service; ``off``: none)."""

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _metrics_off(cls, value: object) -> object:
        return None if isinstance(value, str) and value.strip().lower() in ("off", "none") else value

    @field_validator("pools")
    @classmethod
    def _pools_parse(cls, value: str | None) -> str | None:
        if value is not None:
            PoolLayout.parse(value)
        return value

    @property
    def pool_group_names(self) -> list[str] | None:
        """``pool_group`` as a list (None: unset)."""
        if not self.pool_group:
            return None
        return [p.strip() for p in self.pool_group.split(",") if p.strip()]

    @property
    def pool_layout(self) -> PoolLayout | None:
        """The pools (None: one pool, the whole cluster)."""
        return PoolLayout.parse(self.pools) if self.pools else None

    @model_validator(mode="after")
    def _trust_has_its_key(self) -> Self:
        if self.trust_access is not None and self.trust_key_file is None:
            raise ValueError("GANGLINE_TRUST_ACCESS is set but GANGLINE_TRUST_KEY_FILE is not")
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Self:
        return cls.model_validate({**env_values(environ), **overrides})

    @property
    def kafka_security(self) -> KafkaSecurity:
        """The credentials every Kafka client of this service uses; none set here: the process's
        ``GANGLINE_KAFKA_*`` environment (settings read from another mapping, as tests do)."""
        if self.kafka_username is None and self.kafka_security_protocol is None:
            return KafkaSecurity.from_env()
        return KafkaSecurity(
            security_protocol=self.kafka_security_protocol,
            sasl_mechanism=self.kafka_sasl_mechanism,
            username=self.kafka_username,
            password=self.kafka_password,
            password_file=self.kafka_password_file,
            ssl_cafile=self.kafka_ssl_cafile,
        )


def processor_settings(settings: ServiceSettings, service: str, input_topics: list[str]) -> ProcessorSettings:
    """The bus processor's settings for ``service`` under this replica's identity."""
    return ProcessorSettings(
        bootstrap_servers=settings.kafka_bootstrap,
        security=settings.kafka_security,
        service=service,
        instance_id=settings.instance_id,
        group_id=f"{settings.group_prefix}.{service}",
        input_topics=tuple(input_topics),
        max_batch_records=settings.max_batch_records,
        poll_timeout_ms=50,
        linger_ms=settings.linger_ms,
        idle_commit_ms=settings.idle_commit_ms,
        retry_backoff_s=0.05,
        max_batch_attempts=settings.max_batch_attempts,
        max_handler_attempts=settings.max_handler_attempts,
        producer_retry_backoff_ms=settings.producer_retry_backoff_ms,
        static_membership=settings.static_membership,
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=max(300, settings.session_timeout_ms // 5),
        lock_session_timeout_ms=settings.lock_session_timeout_ms,
        chained_topics=(topic_names(settings).allocations,),
    )


def topic_names(settings: ServiceSettings) -> TopicNames:
    return TopicNames(prefix=settings.topic_prefix)
