"""``python -m services.node_health``: settings from GANGLINE_* environment variables."""

from services.common.process import run_main
from services.node_health.settings import NodeHealthSettings
from services.node_health.wiring import SERVICE, main

if __name__ == "__main__":
    raise SystemExit(run_main(SERVICE, NodeHealthSettings.from_env(), main))
