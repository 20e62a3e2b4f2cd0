"""``python -m services.agent``: the simulated cluster (same as ``gangline fake-nodes``)."""

from services.agent.main import main

if __name__ == "__main__":
    raise SystemExit(main())
