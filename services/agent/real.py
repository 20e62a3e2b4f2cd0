"""``python -m services.agent.real``: the agent of a real GPU node.

A thin shell over :class:`gangline.agent.node.NodeAgent`: NVML through ``pynvml``, workers as real
processes (:class:`gangline.agent.runner.ProcessRunner`), settings from ``GANGLINE_*`` variables
(``GANGLINE_NODE``, ``GANGLINE_LEAF``, ``GANGLINE_SPINE``, ``GANGLINE_CHECKPOINT_ROOT``,
``GANGLINE_LOG_DIR`` are required; see :class:`gangline.agent.settings.NodeAgentSettings`).
Runs until SIGTERM, then stops its ranks cleanly.
"""

from __future__ import annotations

import asyncio

import pynvml

from gangline.agent.node import NodeAgent
from gangline.agent.runner import ProcessRunner
from gangline.agent.settings import NodeAgentSettings
from gangline.bus import run_service
from gangline.telemetry import setup_logging
from services.agent.metrics import serving_agents


async def serve_node(settings: NodeAgentSettings) -> None:
    agent = NodeAgent(settings, nvml_api=pynvml, runner=ProcessRunner())
    host, port = settings.metrics_host, settings.metrics_port
    async with agent, serving_agents(lambda: [agent], host=host, port=port):
        await asyncio.Event().wait()


def main() -> int:
    settings = NodeAgentSettings.from_env()
    setup_logging(f"agent-{settings.node}")
    status: int = run_service(serve_node(settings))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
