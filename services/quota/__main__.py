"""``python -m services.quota``: settings from GANGLINE_* environment variables."""

from services.common.process import run_main
from services.quota.settings import QuotaSettings
from services.quota.wiring import SERVICE, main

if __name__ == "__main__":
    raise SystemExit(run_main(SERVICE, QuotaSettings.from_env(), main))
