"""`make chaos`, short: every decision service killed with SIGKILL once under load, the broker restarted on
the data it kept and frozen for less than node_health's silence, a node silent and another with an XID
79; nothing lost, granted twice or stuck, no node failed but the silent one, and every decision replays
identical (services.bench.chaos, on a broker of its own on a free port, never the shared one)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from e2e.harness import ROOT
from services.bench.chaos import SERVICES

pytestmark = pytest.mark.kafka


def free_port_pair() -> int:
    """A port p with p and p + 1 (the broker's controller) both free on loopback."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two free consecutive ports on 127.0.0.1")


def test_chaos_short_loses_nothing_and_replays_identical() -> None:
    port = free_port_pair()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'libs'}:{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-m", "services.bench.chaos", "--short", "--port", str(port)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,  # a bound on the run, not a timed assertion
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary (status {done.returncode}):\n{done.stderr[-4000:]}"
    summary = json.loads(lines[-1])
    print(json.dumps({k: v for k, v in summary.items() if k not in ("recovery", "faults")}))

    for invariant in ("lost", "duplicated_grants", "gpus_double_held", "partial_gangs", "stuck"):
        assert summary[invariant] == 0, (invariant, summary["problems"])
    assert summary["offered"] == summary["offered_by_load"] > 0
    finished = summary["completed"] + summary["failed"] + summary["rejected"] + summary["waiting"]
    assert finished == summary["offered"]
    assert summary["rejected"] > 0  # the requests admission refuses are in the log the replay reads
    # Every service was killed and came back; the broker was restarted; both nodes failed as planned.
    killed = [k["killed"] for k in summary["recovery"]]
    assert sorted(set(killed)) == sorted([*SERVICES, "broker", "broker-pause"])
    # The pause is an outage shorter than node_health's silence (the case that once failed nodes heard
    # late after it): no node but the silenced one is failed.
    assert summary["broker_paused_s"] < summary["silence_s"]
    assert all(k["ready_s"] is not None for k in summary["recovery"]), summary["recovery"]
    assert {f["kind"] for f in summary["faults"]} == {"silent", "xid"}
    silent = next(f["node"] for f in summary["faults"] if f["kind"] == "silent")
    assert summary["nodes_failed"] == [silent] and summary["nodes_failed_unexpectedly"] == 0
    replay = summary["replay"]
    assert (replay["status"], replay["differences"], replay["chain"]) == (0, 0, "OK"), replay
    assert replay["outputs_compared"] > 0
    assert done.returncode == 0 and summary["passed"]
