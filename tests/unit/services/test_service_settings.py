"""Batch waits: short on the request-to-grant path, longer where a service mostly folds events; the
preemption service's minimum runtime."""

from __future__ import annotations

import pytest

from services.admission.settings import AdmissionSettings
from services.common.env import LAZY_LINGER_MS, ServiceSettings, processor_settings
from services.node_health.settings import NodeHealthSettings
from services.placement.settings import PlacementSettings
from services.preemption.settings import PreemptionSettings
from services.quota.settings import QuotaSettings


@pytest.mark.parametrize("cls", [AdmissionSettings, QuotaSettings, PlacementSettings])
def test_services_on_the_grant_path_wait_briefly(cls: type[ServiceSettings]) -> None:
    settings = cls.from_env({})
    assert settings.linger_ms == 10
    assert processor_settings(settings, "s", ["t"]).linger_ms == 10


@pytest.mark.parametrize("cls", [PreemptionSettings, NodeHealthSettings])
def test_services_that_mostly_fold_wait_longer_unless_told(cls: type[ServiceSettings]) -> None:
    assert LAZY_LINGER_MS > 10
    assert processor_settings(cls.from_env({}), "s", ["t"]).linger_ms == LAZY_LINGER_MS
    assert cls.from_env({"GANGLINE_LINGER_MS": "5"}).linger_ms == 5


def test_preemption_reads_the_minimum_runtime_of_a_victim_and_hands_it_to_the_core() -> None:
    from services.preemption.wiring import new_state

    settings = PreemptionSettings.from_env({"GANGLINE_MIN_RUNTIME_S": "90"})
    assert settings.min_runtime_s == 90 and PreemptionSettings.from_env({}).min_runtime_s == 0
    assert new_state(settings).policy.min_runtime_s == 90
    with pytest.raises(ValueError):
        PreemptionSettings.from_env({"GANGLINE_MIN_RUNTIME_S": "-1"})


@pytest.mark.parametrize("cls", [AdmissionSettings, QuotaSettings, PlacementSettings, PreemptionSettings])
def test_the_bounded_retries_of_a_failing_batch_and_handler_come_from_the_environment(
    cls: type[ServiceSettings],
) -> None:
    told = cls.from_env({"GANGLINE_MAX_BATCH_ATTEMPTS": "7", "GANGLINE_MAX_HANDLER_ATTEMPTS": "2"})
    processor = processor_settings(told, "s", ["t"])
    assert (processor.max_batch_attempts, processor.max_handler_attempts) == (7, 2)
    default = processor_settings(cls.from_env({}), "s", ["t"])
    assert (default.max_batch_attempts, default.max_handler_attempts) == (3, 3)
    with pytest.raises(ValueError):
        cls.from_env({"GANGLINE_MAX_BATCH_ATTEMPTS": "0"})
