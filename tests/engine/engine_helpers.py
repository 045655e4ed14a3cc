"""Helpers shared by the emulated-engine server tests: fleets, SSE parsing, polling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from inferplane.engine.fleet import EngineSpec, FleetThread

MODEL = "llama-3-8b"


@contextmanager
def running_fleet(*specs: EngineSpec) -> Iterator[FleetThread]:
    """A fleet on a background loop; tests talk to it over real loopback HTTP."""
    fleet = FleetThread(list(specs) or [EngineSpec()])
    with fleet:
        yield fleet


def sse_payloads(body: bytes) -> tuple[list[dict[str, Any]], bool]:
    """The JSON payloads of an SSE body, and whether it ended with ``[DONE]``."""
    payloads: list[dict[str, Any]] = []
    done = False
    for block in body.split(b"\n\n"):
        if not block.strip():
            continue
        assert block.startswith(b"data: "), block
        data = block[len(b"data: ") :]
        if data == b"[DONE]":
            done = True
        else:
            payloads.append(orjson.loads(data))
    return payloads, done


def stream_text(payloads: list[dict[str, Any]]) -> str:
    """Concatenated content of chat or completion chunks."""
    parts: list[str] = []
    for payload in payloads:
        for choice in payload.get("choices", []):
            if "delta" in choice:
                parts.append(choice["delta"].get("content") or "")
            else:
                parts.append(choice.get("text") or "")
    return "".join(parts)


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Poll ``predicate`` until it holds or the timeout passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()
