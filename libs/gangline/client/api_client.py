"""A small synchronous client of the Gangline HTTP API."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "GANGLINE_API_URL"
TOKEN_ENV = "GANGLINE_TOKEN"


class ApiError(Exception):
    """The API said no: ``status`` is the HTTP status, ``detail`` its explanation for people."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text or response.reason_phrase
    detail = body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, list):
        return "; ".join(str(d.get("message", d)) if isinstance(d, dict) else str(d) for d in detail)
    return str(detail)


class ApiClient:
    """One method per endpoint; raises :class:`ApiError` on a 4xx/5xx answer."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, transport=transport, timeout=timeout_s)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApiClient:
        env = os.environ if environ is None else environ
        return cls(env.get(URL_ENV) or DEFAULT_URL, env.get(TOKEN_ENV) or None)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise ApiError(0, f"cannot reach the API at {self._http.base_url}: {error}") from error
        if response.status_code >= 400:
            raise ApiError(response.status_code, _detail(response))
        return response.json()

    def submit(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/v1/jobs", json=dict(spec))
        return result

    def cancel(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/jobs/{job_id}/cancel", json={"reason": reason})
        return result

    def job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}")
        return result

    def jobs(self, **params: str | int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/jobs", params=params)
        return result

    def pages(self, path: str, *, most: int, **params: str | int) -> list[dict[str, Any]]:
        """Every item of a paged list (following ``next_cursor``), at most ``most``."""
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while len(items) < most:
            query: dict[str, str | int] = {**params, "limit": min(500, most - len(items))}
            if cursor is not None:
                query["cursor"] = cursor
            page: dict[str, Any] = self._call("GET", path, params=query)
            items += page["items"]
            cursor = page.get("next_cursor")
            if cursor is None:
                break
        return items

    def operate(self, node: str, action: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``cordon``, ``drain`` or ``uncordon`` a node (admin tokens only)."""
        result: dict[str, Any] = self._call("POST", f"/v1/nodes/{node}/{action}", json=dict(body))
        return result

    def queues(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/queues")
        return result

    def nodes(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/nodes")
        return result
