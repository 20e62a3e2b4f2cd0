"""Fixtures of the API tests (defined in api_helpers, next to the helpers they share)."""

from api_helpers import api_prefix, world

__all__ = ["api_prefix", "world"]
