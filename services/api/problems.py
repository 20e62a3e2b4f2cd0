"""Every error the API answers is a problem document (RFC 9457, ``application/problem+json``).

``type`` names the kind of problem (a ``urn:gangline:problem:*`` URN, or ``about:blank`` for a plain
HTTP status), ``title`` says it in a few words, ``detail`` says what happened this time; a refused
request body also lists ``errors``, one per field. Every route documents the problems it can answer
with :func:`problems`, so the OpenAPI promises no status the API does not send, and sends none it
does not promise.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

MEDIA_TYPE = "application/problem+json"
PREFIX = "urn:gangline:problem:"

DESCRIPTIONS: dict[int, str] = {
    400: "the request is malformed: a NUL byte in its path or query, a bad cursor, a bad Content-Length",
    401: "no valid bearer token",
    403: "the caller's tenant may not act on this queue or job",
    404: "no such job (or route)",
    409: "a job with this id already exists",
    413: "the request body (or the event it would make) is over the limit",
    415: "the request body is not JSON",
    422: "the request does not validate; ``errors`` names each field",
    429: "the tenant is over its rate limit; retry after ``Retry-After`` seconds",
    503: "a dependency (the event log, the database) is not available now",
}

HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "required": True, "schema": {"type": "string"}}},
    429: {
        "Retry-After": {
            "description": "seconds until the tenant may call again",
            "required": True,
            "schema": {"type": "string", "pattern": "^[1-9][0-9]*$"},
        }
    },
}


class FieldError(BaseModel):
    model_config = ConfigDict(frozen=True)

    field: str = Field(description="dotted path of the field in the request ('body' for the body itself)")
    message: str
    type: str = Field(description="the validation error's type, e.g. 'missing', 'int_type'")


class Problem(BaseModel):
    """An error, as RFC 9457 describes it."""

    model_config = ConfigDict(frozen=True)

    type: str = Field(description="a URI naming the kind of problem; 'about:blank' for a plain HTTP status")
    title: str
    status: int = Field(ge=400, le=599)
    detail: str
    errors: list[FieldError] | None = Field(default=None, description="on 422: each field that failed")


class ApiProblem(HTTPException):
    """An HTTP error with the problem's type and title; raised by handlers, rendered by :func:`render`."""

    def __init__(
        self,
        status_code: int,
        detail: str,
        *,
        kind: str | None = None,
        title: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(status_code, detail, headers=dict(headers) if headers else None)
        self.kind = kind
        self.title = title


def problem(
    status: int,
    detail: str,
    *,
    kind: str | None = None,
    title: str | None = None,
    headers: Mapping[str, str] | None = None,
    errors: list[dict[str, str]] | None = None,
) -> JSONResponse:
    """The response of one problem; ``kind`` is the URN's last part (None: ``about:blank``)."""
    body: dict[str, Any] = {
        "type": PREFIX + kind if kind else "about:blank",
        "title": title or _phrase(status),
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, headers=dict(headers or {}), media_type=MEDIA_TYPE)


def render(error: StarletteHTTPException) -> JSONResponse:
    kind = error.kind if isinstance(error, ApiProblem) else None
    title = error.title if isinstance(error, ApiProblem) else None
    detail = error.detail if isinstance(error.detail, str) else _phrase(error.status_code)
    return problem(error.status_code, detail, kind=kind, title=title, headers=error.headers)


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a route: each status documented as a problem document."""
    documented: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        documented[code] = {"description": DESCRIPTIONS[code], "content": {MEDIA_TYPE: {"schema": _REF}}}
        if code in HEADERS:
            documented[code]["headers"] = HEADERS[code]
    return documented


def document(openapi: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document with the problem schemas it refers to (routes name them by reference)."""
    schema = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(schema.pop("$defs", {}))
    schemas["Problem"] = schema
    return openapi


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


_REF = {"$ref": "#/components/schemas/Problem"}
