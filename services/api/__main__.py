"""``python -m services.api``: the HTTP API under uvicorn (settings: GANGLINE_*)."""

from __future__ import annotations

import uvicorn

from gangline.telemetry import setup_logging, setup_tracing
from services.api.app import create_app
from services.api.settings import ApiSettings


def main() -> int:
    settings = ApiSettings.from_env()
    setup_logging("api", level=settings.log_level)
    setup_tracing("api", otlp_endpoint=settings.otlp_endpoint, instance_id=settings.instance_id)
    app = create_app(settings)
    # uvicorn handles SIGTERM itself: it stops accepting, drains, then runs the lifespan's shutdown.
    # A dashboard's event stream never ends by itself: after 5 s of shutdown, open streams are cut.
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
