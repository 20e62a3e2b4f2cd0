"""schemathesis against the API's own OpenAPI, on a real API process (``python -m services.api``).

The API runs against the real database and broker under topics of its own; schemathesis reads
``/openapi.json`` and sends what it generates (examples, boundary values, random and invalid data,
sequences of calls) with an admin token. Used by test_fuzz.py (a bounded, seeded slice) and by
``make fuzz-api`` (the long run: ``python tests/integration/api/fuzz_api.py --max-examples 500``),
which prints the figures of schemathesis' JSON report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "libs"), str(ROOT)]

from gangline.bus.admin import delete_topics, ensure_topics  # noqa: E402
from services.api.auth import hash_token  # noqa: E402
from services.common.topics import TopicNames  # noqa: E402

CONFIG = Path(__file__).with_name("schemathesis.toml")
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
"""The rules of a submission JSON Schema cannot say, kept by the valid cases generated (see there)."""
CONFORMANCE = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
)
"""What the API promises: no server error, and every answer as its OpenAPI says (status, type, body)."""


@dataclass(frozen=True)
class RunningApi:
    url: str
    token: str
    prefix: str
    process: asyncio.subprocess.Process | None = None

    def alive(self) -> bool:
        """Whether the API process still runs (it never restarts by itself)."""
        return self.process is not None and self.process.returncode is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def running_api(bootstrap: str, dsn: str, workdir: Path) -> AsyncIterator[RunningApi]:
    """An API process on a free port, topics of its own, an admin and a team token; stopped after."""
    run = uuid.uuid4().hex[:8]
    prefix = f"t-fuzz-{run}."
    specs = TopicNames(prefix=prefix).specs()
    await ensure_topics(bootstrap, specs)
    token = f"fuzz-admin-{uuid.uuid4().hex}"
    (workdir / "tokens.yaml").write_text(
        yaml.safe_dump(
            {
                "tenants": [
                    {"name": "ops", "token_sha256": hash_token(token), "admin": True},
                    {"name": "team", "token_sha256": hash_token(f"team-{token}"), "queues": ["team"]},
                ]
            }
        )
    )
    (workdir / "queues.yaml").write_text(
        yaml.safe_dump(
            {
                "queues": [
                    {"name": "default", "unlimited": True},
                    {"name": "team", "quotas": {"H100": {"nominal": 8}}},
                ]
            }
        )
    )
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'libs'}{os.pathsep}{ROOT}",
        "GANGLINE_KAFKA_BOOTSTRAP": bootstrap,
        "GANGLINE_PG_DSN": dsn,
        "GANGLINE_TOPIC_PREFIX": prefix,
        "GANGLINE_PORT": str(port),
        "GANGLINE_TOKENS_FILE": str(workdir / "tokens.yaml"),
        "GANGLINE_QUEUES_FILE": str(workdir / "queues.yaml"),
        "GANGLINE_LOG_LEVEL": "WARNING",
        # The fuzzer is one tenant sending as fast as it can: the limit is tested elsewhere (test_limits).
        "GANGLINE_RATE_LIMIT_PER_S": "100000",
        "GANGLINE_RATE_LIMIT_BURST": "100000",
    }
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "services.api", cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(300):
                try:
                    if (await client.get(f"{url}/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.returncode is not None:
                    raise RuntimeError(f"the API exited during start-up ({proc.returncode})")
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("the API did not become healthy in 30 s")
        yield RunningApi(url, token, prefix, proc)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
        await delete_topics(bootstrap, [s.name for s in specs])


async def schemathesis(
    api: RunningApi,
    report: Path,
    *,
    max_examples: int,
    seed: int,
    checks: Sequence[str] = CONFORMANCE,
    exclude: Sequence[str] = (),
    phases: Sequence[str] = ("examples", "coverage", "fuzzing", "stateful"),
    max_time_s: int | None = None,
) -> tuple[int, str, dict[str, Any]]:
    """Run ``st run`` against the API: its exit code, its output, and its JSON report."""
    st = Path(sys.executable).with_name("st")
    argv = [
        str(st),
        "--config-file",
        str(CONFIG),
        "run",
        f"{api.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {api.token}",
        "--checks",
        ",".join(checks),
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        "--phases",
        ",".join(phases),
        "--workers",
        "1",
        "--no-color",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        "--output-sanitize",
        "true",
    ]
    if exclude:
        argv += ["--exclude-checks", ",".join(exclude)]
    if max_time_s is not None:
        argv += ["--max-time", str(max_time_s)]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=report.parent,
        env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    return proc.returncode or 0, text, _read_report(report)


def _read_report(report: Path) -> dict[str, Any]:
    return json.loads(report.read_text()) if report.exists() else {}


async def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-examples", type=int, default=500)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--checks", default="all", help="comma-separated, or 'all' (default)")
    parser.add_argument(
        "--exclude-checks",
        default="",
        help="comma-separated checks to skip",
    )
    parser.add_argument("--max-time", type=int, default=None)
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("GANGLINE_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    dsn = os.environ.get("GANGLINE_PG_DSN", "postgresql://postgres@127.0.0.1:55432/gangline")
    with tempfile.TemporaryDirectory() as tmp:
        async with running_api(bootstrap, dsn, Path(tmp)) as api:
            code, text, report = await schemathesis(
                api,
                Path(tmp) / "report.json",
                max_examples=args.max_examples,
                seed=args.seed,
                checks=args.checks.split(","),
                exclude=[c for c in args.exclude_checks.split(",") if c],
                max_time_s=args.max_time,
            )
    print(text)
    print(json.dumps(figures(report), indent=2))
    return code


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """The summary of a schemathesis JSON report: cases sent, failures by check."""
    return {k: report[k] for k in ("summary", "statistic", "stats", "results") if k in report} or report


if __name__ == "__main__":
    raise SystemExit(asyncio.run(_main(sys.argv[1:])))
