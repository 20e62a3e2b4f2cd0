"""Unit tests are pure: they never read the writer check from the process environment.

The broker's session fixture (tests/conftest.py) turns the writer check on for the whole session by
setting ``GANGLINE_TRUST_*`` in ``os.environ``; a unit test that runs after it would otherwise check and
sign as if it were a service. A unit test that wants the check sets the variables itself (monkeypatch).
"""

from __future__ import annotations

import pytest

TRUST_VARIABLES = (
    "GANGLINE_TRUST_ACCESS",
    "GANGLINE_TRUST_KEY_FILE",
    "GANGLINE_TRUST_TOKENS_FILE",
    "GANGLINE_WRITER_KEY_FILE",
    "GANGLINE_WRITER_PRINCIPAL",
)


@pytest.fixture(autouse=True)
def _no_writer_check_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TRUST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
