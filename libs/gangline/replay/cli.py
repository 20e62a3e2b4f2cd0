"""`gangline replay` and `gangline export`: verify or re-run the recorded log, and write it to JSONL.

    gangline replay --from log.jsonl --verify            # hash chain + every decision re-run
    gangline replay --from log.jsonl --profile fair.yaml # what-if: per-queue differences
    gangline export --from log.jsonl --out clean.jsonl --topics allocations.log

    gangline replay --from kafka --verify                # the log on the broker, as it stands now
    gangline export --from kafka --bootstrap 127.0.0.1:9092 --out log.jsonl

`--from kafka` reads every committed record of the topics from the beginning up to the end
offsets found when reading starts (`gangline.replay.kafka.KafkaSource`); `--bootstrap` defaults to
`GANGLINE_KAFKA_BOOTSTRAP` or 127.0.0.1:9092, the topics to the decision topics.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gangline.core.framework.profile import load_profile_file
from gangline.replay.chain import verify_chain
from gangline.replay.decide import replay_decisions
from gangline.replay.log import FileSource, LogFormatError, LogRecord, LogSource, write_jsonl
from gangline.sim.report import queue_diff

REPLAY_HELP = "verify the recorded log (hash chain, every decision) or re-run it under another profile"
EXPORT_HELP = "write the recorded log to JSONL for offline analysis"
KAFKA = "kafka"


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
        help="with --from kafka: brokers' host:port (default $GANGLINE_KAFKA_BOOTSTRAP or 127.0.0.1:9092)",
    )


def configure_replay(p: argparse.ArgumentParser) -> None:
    """Arguments of `gangline replay`."""
    _add_source(p, "a JSONL file from `gangline export`")
    p.add_argument("--verify", action="store_true", help="check the hash chain and re-run every decision")
    p.add_argument("--profile", type=Path, help="what-if: re-run history under this profile YAML")
    p.add_argument("--max-problems", type=int, default=20, help="problems to print")


def run_replay(args: argparse.Namespace) -> int:
    """0: verified (or what-if printed); 1: the log fails verification; 2: unusable input."""
    if not args.verify and args.profile is None:
        print("gangline replay: say --verify, --profile PROFILE, or both", file=sys.stderr)
        return 2
    try:
        records = _load(args.source, bootstrap=args.bootstrap)
    except (OSError, LogFormatError, LookupError, TimeoutError) as e:
        print(f"gangline replay: {e}", file=sys.stderr)
        return 2
    status = 0
    if args.verify:
        chain = verify_chain(records)
        decisions = replay_decisions(records)
        print(
            f"hash chain: {chain.records} chained records in {len(chain.heads)} chain(s): "
            f"{'OK' if chain.ok else f'{len(chain.problems)} problem(s)'}"
        )
        for prob in chain.problems[: args.max_problems]:
            print(f"  {prob.kind}: {prob.message}")
        print(
            f"decisions: {decisions.inputs} inputs replayed, {decisions.decisions} decisions, "
            f"{decisions.compared} compared with the log: "
            f"{'identical' if decisions.ok else f'{len(decisions.mismatches)} mismatch(es)'}"
        )
        for m in decisions.mismatches[: args.max_problems]:
            print(f"  mismatch: {m.message}")
        for cid, (seq, h) in chain.heads.items():
            print(f"  head {cid}: seq {seq} {h}")
        if not (chain.ok and decisions.ok):
            status = 1
    if args.profile is not None:
        from gangline.replay.whatif import what_if
        from gangline.sim.run import sim_registry

        try:
            other = load_profile_file(args.profile, sim_registry())
            base, alt = what_if(records, other)
        except (OSError, ValueError, KeyError) as e:
            print(f"gangline replay: {e}", file=sys.stderr)
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
