"""What the API takes before any handler runs: bounded bodies, clean paths, and a rate per tenant.

:class:`RequestGuard` is plain ASGI around the whole app, so no route can forget it: a request whose
``Content-Length`` is over the limit is answered 413 before one byte of its body is read; a body that
says nothing of its length (chunked) is counted as it streams and refused the moment it passes the
limit, so at most the limit plus one chunk is ever held. A NUL byte in the path or the query (which
PostgreSQL cannot take in text) is answered 400 here, before any query is made.

:class:`RateLimiter` is a token bucket per tenant: ``burst`` requests at once, refilled at ``rate``
per second; the clock is given, so tests step it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.problems import ApiProblem, problem

BODY_TOO_LARGE = "body-too-large"


class BodyTooLarge(ApiProblem):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is over the limit of {limit} bytes",
            kind=BODY_TOO_LARGE,
            title="Request body too large",
        )


class RequestGuard:
    """ASGI middleware: 413 for a body over ``max_body_bytes``, 400 for NUL in the path or query."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        started = False
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except BodyTooLarge as error:
            if started:
                raise
            response = problem(413, str(error.detail), kind=BODY_TOO_LARGE, title=error.title)
            await response(scope, receive, send)

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        path: str = scope.get("path", "")
        query: bytes = scope.get("query_string", b"")
        if "\x00" in path or b"\x00" in unquote_to_bytes(query):
            return problem(400, "the path or query holds a NUL byte", kind="nul-byte", title="NUL byte")
        lengths = {v for k, v in scope.get("headers", ()) if k == b"content-length"}
        if not lengths:
            return None
        declared = int(next(iter(lengths))) if len(lengths) == 1 and next(iter(lengths)).isdigit() else -1
        if declared < 0:
            return problem(400, "Content-Length is not one non-negative number", kind="bad-length")
        if declared > self.limit:
            return problem(
                413,
                f"the request body ({declared} bytes) is over the limit of {self.limit} bytes",
                kind=BODY_TOO_LARGE,
                title="Request body too large",
            )
        return None


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """A token bucket per key (the tenant): ``burst`` at once, ``rate`` more per second."""

    def __init__(self, *, rate: float, burst: int, clock: Callable[[], float]) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs rate > 0 and burst >= 1 (got {rate}, {burst})")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str) -> float | None:
        """Take one request's token: None when there was one, else the seconds until there will be."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + max(0.0, now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / self.rate


def retry_after(wait_s: float) -> str:
    """The ``Retry-After`` header: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(wait_s)))
