"""``python -m services.analytics``: the faust analytics worker (settings: GANGLINE_*)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import faust

from services.analytics.settings import AnalyticsSettings
from services.analytics.wiring import Analytics


def main() -> int:
    settings = AnalyticsSettings.from_env()
    data_dir = settings.analytics_data_dir or Path(tempfile.mkdtemp(prefix="gangline-analytics-"))
    analytics = Analytics(settings, data_dir=data_dir)
    asyncio.run(analytics.prepare())
    worker = faust.Worker(analytics.app, loglevel=settings.log_level.lower(), quiet=True)
    worker.execute_from_commandline()  # runs until SIGTERM / SIGINT, then exits the process
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
