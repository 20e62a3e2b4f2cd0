"""A processor process for the shutdown and crash tests: pings in, pongs out.

    python bus_processor_app.py BOOTSTRAP SOURCE SINK GROUP [--crash-before-commit]

Prints "ready" once it has its partitions. With --crash-before-commit it SIGKILLs itself after
the first batch's outputs and offsets are in the transaction, before the commit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from bus_kafka_helpers import REGISTRY, pong_handler

from gangline.bus import BatchInfo, Processor, ProcessorSettings, run_service


async def main(args: argparse.Namespace) -> None:
    async def crash(batch: BatchInfo) -> None:
        print(f"crashing with {batch.outputs} outputs in the open transaction", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    settings = ProcessorSettings(
        bootstrap_servers=args.bootstrap,
        service="pong",
        instance_id="pong-0",
        group_id=args.group,
        input_topics=(args.source,),
        max_batch_records=5,
        poll_timeout_ms=100,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=1_000,
        static_membership=True,
    )
    processor = Processor(
        settings,
        pong_handler(args.sink),
        registry=REGISTRY,
        before_commit=crash if args.crash_before_commit else None,
    )

    async def announce() -> None:
        await processor.started.wait()
        print("ready", flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await processor.run()
    finally:
        announcer.cancel()
        print(f"stopped: {processor.stats.batches_committed} batches committed", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "source", "sink", "group"):
        parser.add_argument(name)
    parser.add_argument("--crash-before-commit", action="store_true")
    sys.exit(run_service(main(parser.parse_args())))
