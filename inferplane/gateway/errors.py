"""OpenAI-shaped errors for the gateway: one exception type and one response builder.

Every failure a client can see leaves the gateway as ``{"error": {"message", "type",
"param", "code"}}`` with a matching HTTP status, whether the gateway refused the call itself
or an upstream engine failed. Handlers raise :class:`ApiError`; the error middleware turns it
(and anything unexpected) into a response, so no traceback ever reaches a client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

log = logging.getLogger("inferplane.gateway")

#: OpenAI's error ``type`` for each status the gateway produces.
_TYPE_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """A refusal or failure to report to the client, with its status and OpenAI fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        error_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.error_type = error_type or _TYPE_BY_STATUS.get(status, "api_error")
        self.headers = dict(headers or {})
        self.recorded = False  # already counted by the request's recorder

    def body(self) -> bytes:
        return error_body(self.message, self.error_type, self.param, self.code)


def error_body(message: str, error_type: str, param: str | None, code: str | None) -> bytes:
    """The JSON bytes of an OpenAI error object."""
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    )


def error_response(err: ApiError, extra_headers: Mapping[str, str] | None = None) -> web.Response:
    """An aiohttp response for an ApiError (JSON body, matching status, its headers)."""
    headers = dict(err.headers)
    if extra_headers:
        headers.update(extra_headers)
    return web.Response(
        status=err.status, body=err.body(), content_type="application/json", headers=headers
    )


def is_error_json(payload: object) -> bool:
    """Whether a parsed body already has OpenAI's error shape."""
    return (
        isinstance(payload, dict)
        and isinstance(payload.get("error"), dict)
        and isinstance(payload["error"].get("message"), str)
    )


def sse_error_event(
    message: str, error_type: str = "upstream_error", code: str | None = None
) -> bytes:
    """An SSE ``data:`` event carrying an error object, for failures after a stream began."""
    return b"data: " + error_body(message, error_type, None, code) + b"\n\n"


def from_http_exception(exc: web.HTTPException) -> ApiError:
    """An aiohttp HTTP exception (413, 405, 404, ...) as an OpenAI-style error."""
    status = exc.status
    if status == 413:
        return ApiError(413, "request body too large", code="body_too_large")
    if status == 405:
        allow = exc.headers.get("Allow", "")
        return ApiError(
            405, "method not allowed", code="method_not_allowed", headers={"Allow": allow}
        )
    if status == 404:
        return ApiError(404, "no such endpoint", code="unknown_url")
    return ApiError(status, exc.reason or "request failed", code="http_error")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_middleware(reject: Callable[[int, str], None]) -> Callable[..., Awaitable[Any]]:
    """The app's outermost middleware: every failure becomes an OpenAI error response.

    ``reject(status, code)`` accounts for a refusal no handler recorded yet (an ``ApiError``
    raised before the call's context was known, or aiohttp's own 404/405/413).
    """

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as err:
            if not err.recorded:
                reject(err.status, err.code or err.error_type)
            return error_response(err)
        except web.HTTPException as exc:
            http_err = from_http_exception(exc)
            reject(http_err.status, http_err.code or http_err.error_type)
            return error_response(http_err)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("unexpected error", extra={"path": request.path})
            return error_response(ApiError(500, "internal gateway error", code="internal"))

    return errors
