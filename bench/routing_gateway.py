"""The gateway side of ``bench/routing.py``: waiting for it to be ready, and what it
reports after a run (endpoint state changes and breaker reasons from its log, its reject,
retry and admission counters, its prefix-routing and reliability counts). Split from
``bench/routing.py`` to keep each file readable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            try:
                async with session.get(url + "/ready") as resp:
                    if resp.status == 200:
                        stats = await (await session.get(url + "/v1/stats")).json()
                        links = stats["routing"]["kv_events"].values()
                        if all(link["state"] == "connected" for link in links):
                            return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the gateway did not become ready")


_MAX_REASONS = 20


def state_changes(log_path: Path) -> tuple[dict[str, int], list[str]]:
    """The gateway's endpoint state changes and breaker events in its log, counted by
    "to-state: why" and "breaker: trigger", and the first breaker events' reasons."""
    changes: Counter[str] = Counter()
    reasons: list[str] = []
    with contextlib.suppress(OSError):
        for line in log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("msg") == "endpoint state":
                    changes[f"{record.get('to')}: {record.get('why')}"] += 1
                elif record.get("msg") == "breaker":
                    changes[f"breaker: {record.get('trigger')}"] += 1
                    reasons.append(f"{record.get('endpoint')} {record.get('trigger')}: "
                                   f"{record.get('why')}")  # fmt: skip
    return dict(changes), reasons[:_MAX_REASONS]


_COUNTED = ("rejects", "retries", "fallbacks", "admission_decisions")
_GATEWAY_COUNTERS = tuple(f"inferplane_{name}_total" for name in _COUNTED)


async def gateway_counters(url: str) -> list[str]:
    """The gateway's nonzero reject, retry, fallback and admission counters (why calls
    failed or moved, as the gateway saw it)."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    return [
        line
        for line in text.splitlines()
        if line.startswith(_GATEWAY_COUNTERS) and not line.endswith((" 0", " 0.0"))
    ]


async def gateway_prefix(url: str) -> dict[str, Any]:
    """The gateway's prefix-routing counters: how each keyed call's primary compared with
    the endpoint holding most of its blocks, with a few explained misses."""
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/stats") as resp:
        stats = await resp.json()
    prefix: dict[str, Any] = stats["routing"]["prefix"]
    prefix.pop("keyed_models", None)
    prefix["reliability_counts"] = stats.get("reliability", {}).get("counts", {})
    return prefix
