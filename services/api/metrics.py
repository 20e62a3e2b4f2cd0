"""The API's ``/metrics`` (its own port, not the API's): the requests it answered, by route template."""

from __future__ import annotations

from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gangline.telemetry.metrics import counting
from services.common.metrics import ServiceMetrics

SERVICE = "api"
UNMATCHED = "unmatched"
"""The route label of a request no route matched (its path is not a label: any client could invent one)."""


def api_metrics() -> tuple[ServiceMetrics, Counter]:
    """The API's registry and its request counter."""
    metrics = ServiceMetrics(SERVICE, decides=False)
    return metrics, counting(metrics.registry, "gangline_http_requests_total")


class CountRequests:
    """ASGI middleware: counts each answered request by method, route template and status code."""

    def __init__(self, app: ASGIApp, *, requests: Counter) -> None:
        self.app = app
        self.requests = requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        code = 500

        async def sending(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED
            self.requests.labels(scope["method"], template, str(code)).inc()
