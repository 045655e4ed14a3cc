"""The upstream client's errors, subclasses of aiohttp's so the proxy handles both clients
alike. Kept apart from :mod:`upstream_response`: a compiled (mypyc) class cannot subclass
aiohttp's exceptions, and the response class is on the hot path and compiles.
"""

from __future__ import annotations

import aiohttp

__all__ = [
    "UpstreamClosed",
    "UpstreamConnectError",
    "UpstreamDisconnected",
    "UpstreamProtocolError",
]


class UpstreamConnectError(aiohttp.ClientConnectorError):
    """The engine could not be reached (refused, unreachable): no request was sent."""

    def __init__(self, host: str, port: int, os_error: OSError) -> None:
        self._where = (host, port)
        self._os_error = os_error
        OSError.__init__(self, os_error.errno, os_error.strerror)
        self.args = (host, port, os_error)

    @property
    def host(self) -> str:
        return self._where[0]

    @property
    def port(self) -> int | None:
        return self._where[1]

    @property
    def ssl(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"cannot connect to {self._where[0]}:{self._where[1]} [{self.strerror}]"


class UpstreamDisconnected(aiohttp.ServerDisconnectedError):
    """The engine closed the connection before its answer was complete."""


class UpstreamProtocolError(aiohttp.ClientPayloadError):
    """The engine's answer is not valid HTTP/1.1 (bad status line, header or chunk)."""


class UpstreamClosed(aiohttp.ClientConnectionError):
    """The response was closed by its reader (or the client shut down)."""
