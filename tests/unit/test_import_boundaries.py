"""The pure packages never import I/O clients: core, events and sim stay free of them."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gangline

PURE = ("core", "events", "sim")
FORBIDDEN = ("aiokafka", "asyncpg", "opentelemetry", "prometheus_client", "pynvml", "faust", "fastapi")
ROOT = Path(gangline.__file__).parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", PURE)
def test_pure_package_sources_import_no_io_client(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    bad = [
        f"{f.relative_to(ROOT)} imports {name}"
        for f in files
        for name in sorted(_imports(f))
        if name.split(".")[0] in FORBIDDEN
    ]
    assert not bad, bad


def test_importing_pure_packages_loads_no_io_client() -> None:
    mods = [f"gangline.{p}" for p in PURE] + [
        "gangline." + ".".join(f.relative_to(ROOT).with_suffix("").parts)
        for p in PURE
        for f in sorted((ROOT / p).rglob("*.py"))
        if f.name != "__init__.py"
    ]
    code = (
        "import importlib, json, sys\n"
        "errors = {}\n"
        f"for m in {mods!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception as exc:\n"
        "        errors[m] = repr(exc)\n"
        "print(json.dumps({'loaded': sorted({k.split('.')[0] for k in sys.modules}), 'errors': errors}))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    result = json.loads(out.stdout)
    loaded = set(result["loaded"])
    assert not loaded & set(FORBIDDEN), sorted(loaded & set(FORBIDDEN))
    assert not result["errors"], f"pure modules that do not import: {result['errors']}"


def test_the_check_would_catch_a_forbidden_import(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("import aiokafka.structs\nfrom asyncpg import pool\n", encoding="utf-8")
    assert {n.split(".")[0] for n in _imports(f)} & set(FORBIDDEN) == {"aiokafka", "asyncpg"}
