"""Kafka credentials come from settings or the environment, and the password never shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from gangline.bus import ProcessorSettings
from gangline.bus.security import KafkaSecurity, client_options
from services.common.env import ServiceSettings, processor_settings


def test_no_credentials_is_plaintext_and_a_user_name_means_sasl_scram() -> None:
    assert KafkaSecurity().client_options() == {"security_protocol": "PLAINTEXT"}
    options = KafkaSecurity(username="placement", password=SecretStr("s3cret-pw")).client_options()
    assert options == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "placement",
        "sasl_plain_password": "s3cret-pw",
    }


def test_the_password_is_read_from_its_file_and_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("from-a-file-pw\n")
    security = KafkaSecurity.from_env(
        {"GANGLINE_KAFKA_USERNAME": "quota", "GANGLINE_KAFKA_PASSWORD_FILE": str(secret)}
    )
    assert security.client_options()["sasl_plain_password"] == "from-a-file-pw"
    shown = KafkaSecurity(username="quota", password=SecretStr("hidden-pw"))
    assert "hidden-pw" not in repr(shown) and "hidden-pw" not in str(shown.model_dump())


def test_sasl_without_a_password_or_with_two_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="needs a password"):
        KafkaSecurity(username="admission")
    with pytest.raises(ValidationError, match="needs a user name"):
        KafkaSecurity(security_protocol="SASL_SSL")
    with pytest.raises(ValidationError, match="not both"):
        KafkaSecurity(username="a", password=SecretStr("x" * 8), password_file=tmp_path / "p")


def test_without_settings_the_clients_read_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANGLINE_KAFKA_USERNAME", "ledger")
    monkeypatch.setenv("GANGLINE_KAFKA_PASSWORD", "ledger-pw")
    assert client_options()["sasl_plain_username"] == "ledger"
    settings = ProcessorSettings(
        bootstrap_servers="b:9092", service="s", instance_id="i", group_id="g", input_topics=("t",)
    )
    assert settings.security.username == "ledger"


def test_a_service_gets_its_own_principal_from_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANGLINE_KAFKA_USERNAME", "someone-else")
    monkeypatch.setenv("GANGLINE_KAFKA_PASSWORD", "other-pw")
    settings = ServiceSettings.from_env(
        {"GANGLINE_KAFKA_USERNAME": "placement", "GANGLINE_KAFKA_PASSWORD": "placement-pw"}
    )
    assert "placement-pw" not in repr(settings)
    security = processor_settings(settings, "placement", ["t"]).security
    assert (security.username, security.secret()) == ("placement", "placement-pw")
