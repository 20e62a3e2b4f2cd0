"""`gangline status` of an elastic job: its size now and its range, and its size history."""

from __future__ import annotations

import argparse
import io
from typing import Any

from gangline.client.commands import run_status


class _Client:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def job(self, job_id: str) -> dict[str, Any]:
        return self.body


def test_an_elastic_jobs_status_shows_its_size_now_its_range_and_its_resizes() -> None:
    job = {
        "job_id": "el",
        "queue": "default",
        "state": "running",
        "priority": 0,
        "workers": 1,
        "gpus_per_worker": 1,
        "gpu_type": None,
        "attempt": 1,
        "submitted_at": "t0",
        "reason": None,
        "workers_now": 4,
        "spec": {"min_workers": 1, "max_workers": 4},
    }
    sizes = [
        {
            "allocation_id": "el.1",
            "workers": 1,
            "granted_at": "t1",
            "released_at": "t2",
            "release_reason": "resized",
            "resizes": None,
        },
        {
            "allocation_id": "el.2",
            "workers": 4,
            "granted_at": "t2",
            "released_at": None,
            "release_reason": None,
            "resizes": "el.1",
        },
    ]
    out = io.StringIO()
    run_status(
        _Client({"job": job, "allocations": [], "events": [], "sizes": sizes}),
        argparse.Namespace(job="el"),
        out,
    )  # type: ignore[arg-type]
    text = out.getvalue()
    assert "4(1..4)x1" in text
    assert "ALLOCATION" in text and "el.2" in text and "resized" in text
