"""``python -m services.bench.gctrace OUT.json MODULE [ARGS...]``: run MODULE, timing each garbage collection.

The bench runs the services it is asked to trace (``GANGLINE_BENCH_GCTRACE=placement,quota``) this way.
For experiments, ``GANGLINE_GCTRACE_YOUNG=5000`` replaces the young-generation threshold the service
shell sets after its restore (:data:`services.common.shell.GC_YOUNG_THRESHOLD`).
At exit OUT.json holds, per generation, how many collections ran, their total and longest pause, and
every pause of :data:`LONG_MS` or more with its wall-clock time (to line up with latency spikes) and
the CPU time it took (a pause much longer than its CPU time was the process waiting for a core).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

LONG_MS = 20.0
"""Pauses at least this long are listed one by one."""


class GcTimer:
    def __init__(self) -> None:
        self.started = 0.0
        self.started_cpu = 0.0
        self.count = [0, 0, 0]
        self.total_ms = [0.0, 0.0, 0.0]
        self.cpu_ms = [0.0, 0.0, 0.0]
        self.max_ms = [0.0, 0.0, 0.0]
        self.long: list[tuple[float, int, float, float, int]] = []
        """(unix time, generation, pause ms, CPU ms, objects collected) of every long pause."""

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            self.started_cpu = time.process_time()
            return
        ms = (time.perf_counter() - self.started) * 1000
        cpu_ms = (time.process_time() - self.started_cpu) * 1000
        generation = int(info["generation"])
        self.count[generation] += 1
        self.total_ms[generation] += ms
        self.cpu_ms[generation] += cpu_ms
        self.max_ms[generation] = max(self.max_ms[generation], ms)
        if ms >= LONG_MS:
            self.long.append(
                (time.time(), generation, round(ms, 1), round(cpu_ms, 1), int(info.get("collected", 0)))
            )

    def report(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "total_ms": [round(t, 1) for t in self.total_ms],
            "cpu_ms": [round(t, 1) for t in self.cpu_ms],
            "max_ms": [round(m, 1) for m in self.max_ms],
            "long": self.long,
            "threshold": list(gc.get_threshold()),
            "frozen": gc.get_freeze_count(),
        }


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out, module = Path(sys.argv[1]), sys.argv[2]
    young = os.environ.get("GANGLINE_GCTRACE_YOUNG")
    if young:
        from services.common import shell

        shell.GC_YOUNG_THRESHOLD = int(young)
    timer = GcTimer()
    gc.callbacks.append(timer)
    atexit.register(lambda: out.write_text(json.dumps(timer.report())))
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
