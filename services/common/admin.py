"""``python -m services.common.admin create-topics``: the catalogue's topics under GANGLINE_TOPIC_PREFIX."""

from __future__ import annotations

import asyncio
import sys

from gangline.bus.admin import ensure_topics, wait_until_ready
from services.common.env import ServiceSettings, topic_names


async def create_topics(settings: ServiceSettings) -> list[str]:
    await wait_until_ready(settings.kafka_bootstrap, timeout_s=60)
    created: list[str] = await ensure_topics(settings.kafka_bootstrap, topic_names(settings).specs())
    return created


def main(argv: list[str]) -> int:
    if argv != ["create-topics"]:
        print("usage: python -m services.common.admin create-topics", file=sys.stderr)
        return 2
    created = asyncio.run(create_topics(ServiceSettings.from_env()))
    print(f"topics created: {len(created)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
