"""``python -m services.placement``: settings from GANGLINE_* environment variables."""

import gc

if __name__ == "__main__":
    # The imports make next to no garbage (a few hundred objects): no collection until run_main freezes them.
    gc.disable()

from services.common.process import run_main
from services.placement.settings import PlacementSettings
from services.placement.wiring import SERVICE, main

if __name__ == "__main__":
    raise SystemExit(run_main(SERVICE, PlacementSettings.from_env(), main))
