"""`gangline replay` and `gangline export`: verify or re-run the recorded log, and write it to JSONL.

    gangline replay --from log.jsonl --verify            # hash chain + every decision re-run
    gangline replay --from log.jsonl --profile fair.yaml # what-if: per-queue differences
    gangline replay --from log.jsonl --profile fair.yaml --queues queues.yaml  # ... under these quotas
    gangline export --from log.jsonl --out clean.jsonl --topics allocations.log

    gangline replay --from kafka --verify                # the log on the broker, as it stands now
    gangline replay --from kafka --verify --decider placement-service [--prefix P]
    gangline replay --from kafka --verify --decider all  # every service's own decisions
    gangline export --from kafka --bootstrap 127.0.0.1:9092 --out log.jsonl

`--from kafka` reads every committed record of the topics from the beginning up to the end
offsets found when reading starts (`gangline.replay.kafka.KafkaSource`); `--bootstrap` defaults to
`GANGLINE_KAFKA_BOOTSTRAP` or 127.0.0.1:9092, the topics to the decision topics (a decider's input
topics with `--decider`). Records that are not JSON (dead-lettered garbage) are skipped and counted.

`--decider` picks what re-runs the decisions: `auto` (default: `all` when the records carry the
services' input headers, as every log the services wrote does, else `headerless-model`), the
library's simplified `PlacementModel` (`headerless-model`: only for logs without those headers),
or a service's own handlers fed from the headers its outputs carry (`admission`, `quota`,
`placement-service`, `preemption`, `node-health`: `services.<name>.replay`), or `all` of those
present in the log (`services.common.replay`), each reported on its own. Those live in the services,
which the library does not import: the `gangline` command (`services.tools.cli`) passes them in.
Settings a service reads that the log does not hold (queues, quota limits, silence) come from the
same `GANGLINE_*` environment variables the service reads.

What-if (`--profile`) re-runs the log's workload in the simulator under the recorded default
profile and under the given one (`gangline.replay.whatif`), with the queues of `--queues` (a
queues file as the services read it, `gangline.queues_file`; without one every queue is
unlimited), and prints per queue the waits, GPU-hours and preemptions of the other minus the
recorded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from gangline.bus.positions import INPUTS_HEADER
from gangline.core.framework.profile import load_profile_file
from gangline.events.chain import CHAINED_TOPICS
from gangline.replay.chain import verify_chain
from gangline.replay.decide import replay_decisions
from gangline.replay.log import FileSource, LogFormatError, LogRecord, LogSource, write_jsonl
from gangline.sim.report import queue_diff

REPLAY_HELP = "verify the recorded log (hash chain, every decision) or re-run it under another profile"
EXPORT_HELP = "write the recorded log to JSONL for offline analysis"
KAFKA = "kafka"
MODEL = "headerless-model"
"""The simplified placement model (:class:`~gangline.replay.decide.PlacementModel`): only for logs
whose records carry no service input headers (written by something else than the services)."""
AUTO = "auto"
"""Each service's own decisions (``all``) when the log carries the services' input headers, else
the headerless model."""


class Decider(Protocol):
    """A module that replays a service's own decisions (see module docstring)."""

    def decider_topics(self, prefix: str) -> list[str]:
        """The topics to read from Kafka: the service's inputs and outputs under ``prefix``."""

    def verify_decisions(
        self, records: Sequence[LogRecord], *, prefix: str, gated: bool, max_problems: int
    ) -> bool:
        """Re-run every recorded decision, print what was compared and each difference; True if identical."""


Deciders = Mapping[str, Callable[[], Decider]]
"""Decider name → what loads it. The services' deciders live where the services are visible
(``services.tools.cli`` passes them in); this library knows only its own model."""


def _source(where: str, bootstrap: str | None = None) -> LogSource:
    if where == KAFKA:
        from gangline.replay.kafka import KafkaSource  # aiokafka only when the log is on Kafka

        return KafkaSource(bootstrap)
    return FileSource(where)


def _load(where: str, topics: list[str] | None = None, bootstrap: str | None = None) -> list[LogRecord]:
    return _source(where, bootstrap).records(topics)


def _add_source(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--from", dest="source", required=True, help=f"{what}, or kafka")
    p.add_argument(
        "--bootstrap",
        help="with --from kafka: brokers' host:port (default $GANGLINE_KAFKA_BOOTSTRAP or 127.0.0.1:9092); "
        "credentials from GANGLINE_KAFKA_USERNAME and GANGLINE_KAFKA_PASSWORD_FILE (gangline.bus.security)",
    )


def configure_replay(p: argparse.ArgumentParser, deciders: Deciders) -> None:
    """Arguments of `gangline replay`; ``deciders``: the services' own, by name."""
    _add_source(p, "a JSONL file from `gangline export`")
    p.add_argument("--verify", action="store_true", help="check the hash chain and re-run every decision")
    p.add_argument("--profile", type=Path, help="what-if: re-run history under this profile YAML")
    p.add_argument(
        "--queues",
        type=Path,
        help="what-if: the queues file (quotas, cohorts) to run under (default: every queue unlimited)",
    )
    p.add_argument("--max-problems", type=int, default=20, help="problems to print")
    p.add_argument(
        "--decider",
        choices=[AUTO, MODEL, *sorted(deciders)],
        default=AUTO,
        help="with --verify: what re-runs the decisions (default auto: every service's own when the log "
        "carries their input headers, else the headerless placement model)",
    )
    p.add_argument("--prefix", default="", help="the topic name prefix the services ran with")
    p.add_argument(
        "--ungated", action="store_true", help="with --decider: placement and preemption ran ungated"
    )


WhatIf = Callable[[Sequence[LogRecord], Path, Path | None], tuple[dict[str, object], dict[str, object]]]
"""(records, profile, queues file) → the report entries of the recorded run and of the other profile.
The ``gangline`` command passes the services' own (``services.tools.simulate.whatif``); without one
the core's simulator runs (:func:`gangline.replay.whatif.what_if`)."""


def run_replay(args: argparse.Namespace, deciders: Deciders, what_if_engine: WhatIf | None = None) -> int:
    """0: verified (or what-if printed); 1: the log fails verification; 2: unusable input."""
    if not args.verify and args.profile is None:
        print("gangline replay: say --verify, --profile PROFILE, or both", file=sys.stderr)
        return 2
    if args.queues is not None and args.profile is None:
        print("gangline replay: --queues goes with --profile (what-if)", file=sys.stderr)
        return 2
    name = args.decider
    if name == AUTO and args.source == KAFKA:
        name = "all"  # the services write the log on the broker: their own decisions re-run
    decider = deciders[name]() if args.verify and name not in (MODEL, AUTO) else None
    topics = decider.decider_topics(args.prefix) if decider is not None and args.source == KAFKA else None
    source = _source(args.source, args.bootstrap)
    try:
        records = source.records(topics)
    except (OSError, LogFormatError, LookupError, TimeoutError) as e:
        print(f"gangline replay: {e}", file=sys.stderr)
        return 2
    if (
        args.verify
        and name == AUTO
        and "all" in deciders
        and any(INPUTS_HEADER in r.headers for r in records)
    ):
        decider = deciders["all"]()
    skipped: dict[str, int] = getattr(source, "skipped", {})
    for topic, n in sorted(skipped.items()):
        print(f"skipped {n} record(s) of {topic} that are not JSON (dead-lettered input)")
    status = 0
    if args.verify:
        chain = verify_chain(records, [f"{args.prefix}{topic}" for topic in CHAINED_TOPICS])
        print(
            f"hash chain: {chain.records} chained records in {len(chain.heads)} chain(s): "
            f"{'OK' if chain.ok else f'{len(chain.problems)} problem(s)'}"
        )
        for prob in chain.problems[: args.max_problems]:
            print(f"  {prob.kind}: {prob.message}")
        if decider is not None:
            same = decider.verify_decisions(
                records, prefix=args.prefix, gated=not args.ungated, max_problems=args.max_problems
            )
        else:
            decisions = replay_decisions(records)
            print(
                f"decisions: {decisions.inputs} inputs replayed, {decisions.decisions} decisions, "
                f"{decisions.compared} compared with the log: "
                f"{'identical' if decisions.ok else f'{len(decisions.mismatches)} mismatch(es)'}"
            )
            for m in decisions.mismatches[: args.max_problems]:
                print(f"  mismatch: {m.message}")
            same = decisions.ok
        for cid, (seq, h) in chain.heads.items():
            print(f"  head {cid}: seq {seq} {h}")
        if not (chain.ok and same):
            status = 1
    if args.profile is not None:
        from gangline.core.defaults import placement_registry
        from gangline.queues_file import load_queues_file
        from gangline.replay.whatif import what_if

        try:
            other = load_profile_file(args.profile, placement_registry())
            if what_if_engine is not None:
                base, alt = what_if_engine(records, args.profile, args.queues)
            else:
                queues = load_queues_file(args.queues) if args.queues is not None else None
                base, alt = what_if(records, other, queues=queues)
        except (OSError, ValueError, KeyError) as e:
            one_line = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
            print(f"gangline replay: {one_line}", file=sys.stderr)
            return 2
        print(queue_diff(base, alt))
    return status


def configure_export(p: argparse.ArgumentParser) -> None:
    """Arguments of `gangline export`."""
    _add_source(p, "a JSONL log file")
    p.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    p.add_argument("--topics", nargs="*", help="only these topics (default: all)")


def run_export(args: argparse.Namespace) -> int:
    """Write the records (in file / delivery order) as JSONL; 2 on unusable input."""
    try:
        records = _load(args.source, args.topics or None, args.bootstrap)
    except (OSError, LogFormatError, LookupError, TimeoutError) as e:
        print(f"gangline export: {e}", file=sys.stderr)
        return 2
    n = write_jsonl(records, args.out)
    print(f"exported {n} records to {args.out}")
    return 0
