"""``python -m services.admission``: settings from GANGLINE_* environment variables."""

from services.admission.settings import AdmissionSettings
from services.admission.wiring import SERVICE, main
from services.common.process import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(SERVICE, AdmissionSettings.from_env(), main))
