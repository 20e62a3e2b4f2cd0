"""gangline.events stays pure: no I/O clients, no clock, no randomness (DESIGN.md, rules of the shape)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import gangline.events

FORBIDDEN_IMPORTS = ("aiokafka", "asyncpg", "opentelemetry", "pynvml", "faust", "fastapi")
EVENTS_DIR = Path(gangline.events.__file__).parent
# schemagen is the one tool here that writes files; it still draws no ids or times.
AMBIENT = re.compile(r"\b(datetime\.now|datetime\.utcnow|time\.time|uuid[14]|random\.|os\.urandom|secrets\.)")


def test_importing_every_events_module_pulls_in_no_io_client() -> None:
    modules = sorted(p.stem for p in EVENTS_DIR.glob("*.py") if p.stem != "__init__")
    code = (
        "import sys\n"
        + "".join(f"import gangline.events.{m}\n" for m in modules)
        + f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN_IMPORTS!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_no_events_module_reads_the_clock_or_a_random_source() -> None:
    offenders = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(EVENTS_DIR.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if AMBIENT.search(line)
    ]
    assert offenders == []
