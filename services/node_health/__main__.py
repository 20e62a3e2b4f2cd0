"""``python -m services.node_health``: settings from GANGLINE_* environment variables."""

import gc

if __name__ == "__main__":
    # The imports make next to no garbage (a few hundred objects): no collection until run_main freezes them.
    gc.disable()

from services.common.process import run_main
from services.node_health.settings import NodeHealthSettings
from services.node_health.wiring import SERVICE, main

if __name__ == "__main__":
    raise SystemExit(run_main(SERVICE, NodeHealthSettings.from_env(), main))
