"""`make chaos-brokers`, short: a replicated broker of its own (three KRaft nodes on private ports, their
data under .cache/kafka/<port>/), the decision services and the simulated nodes under load, and the node
leading the most partitions killed with SIGKILL; every acknowledged request is readable where the broker
acknowledged it, the services go on deciding (jobs sent after the kill finish), nothing is lost or
granted twice, and the log replays identical. The services are not killed here (make chaos does that)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from e2e.harness import ROOT

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(
        os.environ.get("GANGLINE_TEST_BROKERS") != "1",
        reason="three more JVMs for 2-5 minutes, too long for make test on 2 cores: "
        "make test-brokers runs it (make chaos-brokers is the full run)",
    ),
]

NODES = 3


def free_ports(count: int, start: int = 39092) -> int:
    """A base port p with p .. p+count-1 all free on loopback (far from 9092, CI's 19092 and chaos' 19192)."""
    for base in range(start, start + 2000, 10):
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} free consecutive ports on 127.0.0.1 from {start}")


def test_a_broker_killed_under_load_loses_nothing_acknowledged() -> None:
    port = free_ports(2 * NODES)  # each node: a client port and a controller port
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'libs'}:{ROOT}"}
    command = [sys.executable, "-m", "services.bench.chaos", "--short", "--kills", "0"]
    try:
        done = subprocess.run(
            [*command, "--kafka-nodes", str(NODES), "--port", str(port)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=540,  # a bound on the run, not a timed assertion
        )
    finally:  # the run stops its brokers itself; this is for a run cut short
        subprocess.run(
            [str(ROOT / "deploy" / "local" / "kafka.sh"), "down"],
            env={**env, "GANGLINE_KAFKA_PORT": str(port)},
            capture_output=True,
            timeout=120,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary (status {done.returncode}):\n{done.stderr[-4000:]}"
    summary = json.loads(lines[-1])
    print(json.dumps({k: v for k, v in summary.items() if k not in ("faults",)}))

    # The catalogue's topics were made with three replicas of which two must hold each write.
    assert summary["replication"] == {"replicas": [3], "min_insync_replicas": ["2"]}
    # One broker node was killed, and the partitions it led were led by the others afterwards.
    assert summary["broker_killed_node"] in range(1, NODES + 1)
    (broker,) = [r for r in summary["recovery"] if r["killed"] == "broker"]
    assert broker["ready_s"] is not None, broker
    # Every request acknowledged (acks=all, min.insync.replicas=2) is in the log where it was acknowledged.
    assert summary["acknowledged"] == summary["offered_by_load"] > 0
    assert summary["acknowledged_missing"] == 0, summary["acknowledged_missing_first"]
    # The services kept deciding: requests sent after the kill were answered, every job came to an end.
    assert summary["offered_after_broker_kill"] > 0
    assert broker["first_output_s"] is not None
    for invariant in ("lost", "duplicated_grants", "gpus_double_held", "partial_gangs", "stuck"):
        assert summary[invariant] == 0, (invariant, summary["problems"])
    finished = summary["completed"] + summary["failed"] + summary["rejected"] + summary["waiting"]
    assert finished == summary["offered"]
    assert summary["nodes_failed_unexpectedly"] == 0
    replay = summary["replay"]
    assert (replay["status"], replay["differences"], replay["chain"]) == (0, 0, "OK"), replay
    assert done.returncode == 0 and summary["passed"]
