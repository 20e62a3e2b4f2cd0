"""TLS is one setting away: deploy/local/kafka.sh with GANGLINE_KAFKA_LISTENER_PROTOCOL=SASL_SSL, and a
client that trusts the CA (GANGLINE_KAFKA_SSL_CAFILE). The test makes its own CA and broker certificate
with openssl and starts its own broker on a free port, so it needs neither the shared one nor secrets."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError

from gangline.bus.admin import TopicSpec, ensure_topics
from gangline.bus.security import KafkaSecurity

ROOT = Path(__file__).resolve().parents[3]
ADMIN_PASSWORD = str(
    yaml.safe_load((ROOT / "deploy" / "kafka" / "credentials.dev.yaml").read_text(encoding="utf-8"))["admin"]
)

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make certificates"),
]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(where: Path) -> tuple[Path, Path]:
    """(CA bundle, broker keystore: key + certificate for 127.0.0.1, PEM) signed by a fresh CA."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=gangline test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        cwd=where,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "broker.key",
        "-out",
        "broker.csr",
        cwd=where,
    )
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "broker.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "broker.pem",
        cwd=where,
    )
    _openssl("pkcs8", "-topk8", "-nocrypt", "-in", "broker.key", "-out", "broker.pk8", cwd=where)
    keystore = where / "broker-keystore.pem"
    keystore.write_text((where / "broker.pk8").read_text() + (where / "broker.pem").read_text())
    return where / "ca.pem", keystore


def _free_port_pair() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    where = tmp_path_factory.mktemp("tls")
    ca, keystore = _certificates(where)
    port = _free_port_pair()
    env = {
        **os.environ,
        "GANGLINE_KAFKA_PORT": str(port),
        "GANGLINE_KAFKA_LISTENER_PROTOCOL": "SASL_SSL",
        "GANGLINE_KAFKA_TLS_KEYSTORE": str(keystore),
        "GANGLINE_KAFKA_SSL_CAFILE": str(ca),
    }
    script = str(ROOT / "deploy" / "local" / "kafka.sh")
    try:
        subprocess.run([script, "up"], cwd=ROOT, env=env, check=True)
        yield f"127.0.0.1:{port}", ca
    finally:
        subprocess.run([script, "down"], cwd=ROOT, env=env, check=True)


async def test_a_client_talks_to_the_broker_over_sasl_ssl(tls_broker: tuple[str, Path]) -> None:
    bootstrap, ca = tls_broker
    security = KafkaSecurity(
        security_protocol="SASL_SSL", username="admin", password=ADMIN_PASSWORD, ssl_cafile=ca
    )
    await ensure_topics(bootstrap, [TopicSpec(name="tls-check", key="k", partitions=1)], security=security)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **security.client_options())
    await producer.start()
    try:
        await producer.send_and_wait("tls-check", b"over tls", key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, **security.client_options())
    await consumer.start()
    try:
        tp = TopicPartition("tls-check", 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        batch = await consumer.getmany(tp, timeout_ms=10_000)
        assert [r.value for r in batch.get(tp, [])] == [b"over tls"]
    finally:
        await consumer.stop()


async def test_a_client_that_does_not_trust_the_ca_or_speaks_plain_sasl_is_refused(
    tls_broker: tuple[str, Path],
) -> None:
    bootstrap, _ = tls_broker
    untrusting = KafkaSecurity(security_protocol="SASL_SSL", username="admin", password=ADMIN_PASSWORD)
    plain = KafkaSecurity(security_protocol="SASL_PLAINTEXT", username="admin", password=ADMIN_PASSWORD)
    for security in (untrusting, plain):
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, request_timeout_ms=5_000, **security.client_options()
        )
        with pytest.raises(KafkaConnectionError):
            await producer.start()
        await producer.stop()
