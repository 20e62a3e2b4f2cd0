"""A processor in its own process: SIGTERM stops it cleanly; SIGKILL before commit loses nothing."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from pathlib import Path

import pytest
from bus_kafka_helpers import Pong, envelopes, produce_pings, read_all

pytestmark = pytest.mark.kafka

APP = Path(__file__).with_name("bus_processor_app.py")


async def _start(*args: str) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(APP),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=APP.parent,
    )
    assert process.stdout is not None
    seen: list[bytes] = []
    while not seen or seen[-1].strip() != b"ready":
        line = await asyncio.wait_for(process.stdout.readline(), timeout=30)
        assert line, b"".join(seen)  # it exited before it was ready
        seen.append(line)
    return process


async def test_sigterm_stops_the_processor_cleanly_with_its_work_committed(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, topic_factory
) -> None:
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    process = await _start(kafka_bootstrap, source.name, sink.name, group)
    await produce_pings(kafka_bootstrap, source.name, range(8))
    committed = await read_all(kafka_bootstrap, sink.name, at_least=8)
    process.send_signal(signal.SIGTERM)
    output, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0, output
    assert b"stopped:" in output
    assert sorted(env.data.n for env in envelopes(committed) if isinstance(env.data, Pong)) == list(range(8))
    # Nothing more appears after the stop: the work it committed is all the work there is.
    assert len(await read_all(kafka_bootstrap, sink.name)) == 8


async def test_a_crash_between_produce_and_commit_loses_and_duplicates_nothing(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, topic_factory
) -> None:
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    await produce_pings(kafka_bootstrap, source.name, range(12))
    crashing = await _start(kafka_bootstrap, source.name, sink.name, group, "--crash-before-commit")
    output, _ = await asyncio.wait_for(crashing.communicate(), timeout=30)
    assert crashing.returncode == -signal.SIGKILL, output
    assert b"crashing with 5 outputs" in output

    # Same instance id: the restart fences the dead incarnation and aborts its open transaction.
    restarted = await _start(kafka_bootstrap, source.name, sink.name, group)
    try:
        committed = await read_all(kafka_bootstrap, sink.name, at_least=12)
    finally:
        restarted.send_signal(signal.SIGTERM)
        await asyncio.wait_for(restarted.communicate(), timeout=30)
    assert restarted.returncode == 0
    numbers = [env.data.n for env in envelopes(committed) if isinstance(env.data, Pong)]
    assert sorted(numbers) == list(range(12))
    everything = await read_all(kafka_bootstrap, sink.name, isolation="read_uncommitted", at_least=17)
    assert len(everything) >= 17  # the crashed attempt's 5 outputs are in the log, aborted
