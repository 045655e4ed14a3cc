"""The built-in traffic generator of ``inferplane up --load chat|agentic|mixed``.

It speaks to the gateway like any client (HTTP, streaming chat completions) so a newcomer
sees the control plane at work at once:

- ``chat``: single calls arriving as a Poisson process, prompts of lognormal length,
  priority classes mixed 20/60/20 (critical/standard/sheddable);
- ``agentic``: tasks of 4-12 calls that share a workflow id, a growing context (each step
  resends the conversation so far) and a short tool pause between calls; each task is
  reported with ``POST /v1/workflows/{id}/end``;
- ``mixed``: both, at half the rate each.

Sizes are scaled down from the public traces (REFERENCE section 3) so a 2-core machine keeps
up with the emulated fleet. Counters feed the live one-line summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

_WORDS = (
    "the", "model", "routes", "tokens", "across", "a", "fleet", "of", "replicas", "while",
    "caches", "keep", "prefixes", "warm", "and", "agents", "call", "tools", "then", "think",
    "again", "about", "plans", "budgets", "deadlines", "costs", "and", "answers",
)  # fmt: skip
_PRIORITIES = (("critical", 0.2), ("standard", 0.6), ("sheddable", 0.2))
_MAX_IN_FLIGHT = 256


@dataclass(slots=True)
class LoadStats:
    """Running totals of what the generator sent and got back."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    tasks_ok: int = 0
    tasks_failed: int = 0
    in_flight: int = 0
    chunks: int = 0
    ttft_s: list[float] = field(default_factory=list)

    def take_ttfts(self) -> list[float]:
        out, self.ttft_s = self.ttft_s, []
        return out


class LoadGenerator:
    """Sends ``kind`` traffic to ``base_url`` at ``rate_per_s`` calls per second."""

    def __init__(
        self, base_url: str, kind: str, rate_per_s: float, models: list[str], seed: int = 0
    ) -> None:
        if kind not in ("chat", "agentic", "mixed"):
            raise ValueError(f"unknown load kind {kind!r}")
        self._url = base_url.rstrip("/")
        self._kind = kind
        self._rate = rate_per_s
        self._models = models
        self._rng = random.Random(seed)
        self.stats = LoadStats()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Generate until ``stop`` is set, then cancel what is still running."""
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            loops = []
            if self._kind in ("chat", "mixed"):
                share = 1.0 if self._kind == "chat" else 0.5
                loops.append(asyncio.create_task(self._arrivals(session, share, agentic=False)))
            if self._kind in ("agentic", "mixed"):
                share = 1.0 if self._kind == "agentic" else 0.5
                loops.append(asyncio.create_task(self._arrivals(session, share, agentic=True)))
            await stop.wait()
            for task in [*loops, *self._tasks]:
                task.cancel()
            for task in [*loops, *self._tasks]:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _arrivals(self, session: aiohttp.ClientSession, share: float, agentic: bool) -> None:
        # An agentic task makes ~8 calls, so tasks arrive 8x less often for the same call rate.
        rate = self._rate * share / (8.0 if agentic else 1.0)
        while True:
            await asyncio.sleep(self._rng.expovariate(rate))
            if self.stats.in_flight >= _MAX_IN_FLIGHT:
                continue  # the generator itself stays bounded
            coro = self._task(session) if agentic else self._chat(session)
            task = asyncio.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _text(self, mean_words: float) -> str:
        n = max(3, int(self._rng.lognormvariate(0, 0.8) * mean_words))
        return " ".join(self._rng.choice(_WORDS) for _ in range(n))

    def _priority(self) -> str:
        roll, acc = self._rng.random(), 0.0
        for name, p in _PRIORITIES:
            acc += p
            if roll < acc:
                return name
        return "standard"

    async def _chat(self, session: aiohttp.ClientSession) -> None:
        messages = [{"role": "user", "content": self._text(60)}]
        ok = await self._call(session, self._rng.choice(self._models), messages, {})
        if ok:
            self.stats.tasks_ok += 1
        else:
            self.stats.tasks_failed += 1

    async def _task(self, session: aiohttp.ClientSession) -> None:
        workflow_id = f"task-{uuid.UUID(int=self._rng.getrandbits(128)).hex[:12]}"
        steps = self._rng.randint(4, 12)
        model = self._models[0]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent. " + self._text(80)}
        ]
        success = True
        for step in range(1, steps + 1):
            messages.append({"role": "user", "content": "tool result: " + self._text(30)})
            headers = {
                "X-Workflow-Id": workflow_id,
                "X-Workflow-Step": str(step),
                "X-Workflow-Steps": str(steps),
                "X-Priority": "standard",
            }
            if not await self._call(session, model, messages, headers):
                success = False
                break
            messages.append({"role": "assistant", "content": self._text(20)})
            await asyncio.sleep(self._rng.uniform(0.1, 0.6))  # the tool runs
        if success:
            self.stats.tasks_ok += 1
            return
        self.stats.tasks_failed += 1
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.post(
                f"{self._url}/v1/workflows/{workflow_id}/end", json={"outcome": "failure"}
            ) as resp:
                await resp.read()

    async def _call(
        self,
        session: aiohttp.ClientSession,
        model: str,
        messages: list[dict[str, Any]],
        headers: dict[str, str],
    ) -> bool:
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": int(min(512, 16 + self._rng.expovariate(1 / 96))),
            "stream": True,
        }
        headers = {"X-Priority": self._priority(), **headers}
        self.stats.sent += 1
        self.stats.in_flight += 1
        start = asyncio.get_running_loop().time()
        try:
            async with session.post(
                self._url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers
            ) as resp:
                if resp.status != 200:
                    await resp.read()
                    self.stats.failed += 1
                    return False
                return await self._read_stream(resp, start)
        except (aiohttp.ClientError, TimeoutError):
            self.stats.failed += 1
            return False
        finally:
            self.stats.in_flight -= 1

    async def _read_stream(self, resp: aiohttp.ClientResponse, start: float) -> bool:
        first = True
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            if line.startswith(b"data: [DONE]"):
                self.stats.ok += 1
                return True
            if b'"error"' in line:
                break
            if first:
                self.stats.ttft_s.append(asyncio.get_running_loop().time() - start)
                first = False
            self.stats.chunks += 1
        self.stats.failed += 1
        return False
