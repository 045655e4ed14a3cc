"""The client side of the routing benchmark (``bench/routing.py``): streams the calls of a
workload at a gateway or straight at the engines, and measures what the issue asks for.

One streamed call gives its TTFT (first token carrying text), its answer text (the next
agent step needs it) and, when it fails, why: an HTTP status with the OpenAI error code, an
SSE error event after the stream began, or a client-side timeout or connection error.
Around a run, the engines' own prefix-cache counters are scraped and their KV usage sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from routing_workloads import (
    AgentSession,
    SentCall,
    agent_first_messages,
    prefix_messages,
    tool_message,
)

_COUNTERS = ("prefix_cache_hits", "prefix_cache_queries", "request_success", "num_preemptions")
_COUNTER = re.compile(rf"^vllm:({'|'.join(_COUNTERS)})_total(?:\{{[^}}]*\}})? ([0-9.e+]+)$", re.M)
_BLOCKS = re.compile(r'^vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', re.M)
_KV = re.compile(r"^vllm:kv_cache_usage_perc(?:\{[^}]*\})? ([0-9.e+-]+)$", re.M)
KV_HIGH, KV_LOW = 0.9, 0.3  # issue 4: no replica above 90% while another sits under 30%
CLIENT_TIMEOUT_S = 120.0
MAX_RETRY_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class CallResult:
    """One streamed call: TTFT and answer when it succeeded, else why it failed."""

    ttft_s: float | None  # from the first attempt, retries and their waits included
    text: str
    error: str | None  # "http 429 <code>", "sse <code>", "client timeout", an exception name
    retry_after_s: float | None = None  # set when the client may try again (see _retry_wait_s)
    rejected: int = 0  # refusals this call got before this outcome (each retried)


def _error_code(raw: bytes) -> str:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        error = json.loads(raw)["error"]
        return str(error.get("code") or error.get("type") or "-")
    return "-"


def _retry_after_s(resp: aiohttp.ClientResponse) -> float | None:
    """Like the OpenAI SDKs: 408, 409, 429 and 5xx are retried, after the server's
    Retry-After when it gives one (0.0 here: the caller backs off on its own)."""
    if resp.status not in (408, 409, 429) and resp.status < 500:
        return None
    try:
        return max(0.0, float(resp.headers.get("Retry-After", "0")))
    except ValueError:
        return 0.0


async def stream_call(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    start: float,
) -> CallResult:
    """Stream one chat call and time its first text token from ``start``."""
    ttft: float | None = None
    parts: list[str] = []
    try:
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                error = f"http {resp.status} {_error_code(await resp.read())}"
                return CallResult(None, "", error, _retry_after_s(resp))
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return CallResult(None, "", f"sse {_error_code(line[6:])}")
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        parts.append(text)
                        if ttft is None:
                            ttft = time.perf_counter() - start
    except TimeoutError:
        return CallResult(None, "", "client timeout")
    except aiohttp.ClientError as exc:
        return CallResult(None, "", type(exc).__name__)
    # A reply whose few tokens all decode to no text: its first token came by the end.
    return CallResult(time.perf_counter() - start if ttft is None else ttft, "".join(parts), None)


# ---- engine metrics -------------------------------------------------------------------------


async def scrape_counters(
    session: aiohttp.ClientSession, urls: list[str]
) -> list[dict[str, float]]:
    """Per engine: its cumulative prefix-cache hits and queries (tokens), finished requests
    and preemptions (label sets summed)."""

    async def one(url: str) -> dict[str, float]:
        counts: dict[str, float] = dict.fromkeys(_COUNTERS, 0.0)
        async with session.get(url + "/metrics") as resp:
            for name, value in _COUNTER.findall(await resp.text()):
                counts[name] += float(value)
        return counts

    return list(await asyncio.gather(*(one(url) for url in urls)))


def counter_summary(
    before: list[dict[str, float]], after: list[dict[str, float]]
) -> dict[str, Any]:
    """The engines' own prefix-cache hit rate over the run, and how the work spread."""
    delta = [{k: b[k] - a[k] for k in _COUNTERS} for a, b in zip(before, after, strict=True)]
    hits = sum(d["prefix_cache_hits"] for d in delta)
    queries = sum(d["prefix_cache_queries"] for d in delta)
    return {
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "engine_requests": [int(d["request_success"]) for d in delta],
        "engine_uncached_tokens": [
            int(d["prefix_cache_queries"] - d["prefix_cache_hits"]) for d in delta
        ],
        "preemptions": int(sum(d["num_preemptions"] for d in delta)),
    }


async def fleet_kv_blocks(session: aiohttp.ClientSession, urls: list[str]) -> int:
    """The KV blocks of all the engines together (``vllm:cache_config_info``)."""
    total = 0
    for url in urls:
        async with session.get(url + "/metrics") as resp:
            match = _BLOCKS.search(await resp.text())
            total += int(match.group(1)) if match else 0
    return total


async def _kv_usages(session: aiohttp.ClientSession, urls: list[str]) -> list[float]:
    async def one(url: str) -> float:
        async with session.get(url + "/metrics") as resp:
            match = _KV.search(await resp.text())
            return float(match.group(1)) if match else 0.0

    return list(await asyncio.gather(*(one(url) for url in urls)))


async def sample_kv(
    session: aiohttp.ClientSession, urls: list[str], period_s: float, out: list[list[float]]
) -> None:
    """Append every engine's KV usage to ``out`` every ``period_s`` until cancelled."""
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            out.append(await _kv_usages(session, urls))
        await asyncio.sleep(period_s)


def kv_summary(samples: list[list[float]]) -> dict[str, Any]:
    """Max usage, max/mean spread (max - min across engines), and the imbalanced samples
    (some engine above KV_HIGH while another is under KV_LOW)."""
    spreads = [max(row) - min(row) for row in samples if row]
    return {
        "kv_samples": len(spreads),
        "kv_max_usage": max((max(row) for row in samples if row), default=0.0),
        "kv_spread_max": max(spreads, default=0.0),
        "kv_spread_mean": sum(spreads) / len(spreads) if spreads else 0.0,
        "kv_imbalanced_samples": sum(
            1 for row in samples if row and max(row) > KV_HIGH and min(row) < KV_LOW
        ),
    }


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# ---- one measured run -----------------------------------------------------------------------

Send = Callable[[dict[str, Any], dict[str, str]], Coroutine[Any, Any, CallResult]]


async def measure(
    engine_urls: list[str],
    run: Callable[[Send], Awaitable[list[CallResult]]],
    send_to: list[str],
    time_scale: float = 1.0,
    retries: int = 2,
) -> dict[str, Any]:
    """Run a workload (``run`` gets a ``send(body, headers)``) and summarise what it got.

    ``send`` rotates over ``send_to`` call by call (one gateway, or the engines themselves).
    With engines emulated ``time_scale`` times slower (the runner stretched its timeline
    to match), latencies and rates are reported in model time.
    """
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        counter = iter(range(1 << 62))

        async def send(body: dict[str, Any], headers: dict[str, str]) -> CallResult:
            # Like the OpenAI SDKs: a refusal (429, 5xx) is retried after its Retry-After
            # (capped) or a backoff, twice by default; TTFT counts from the first attempt.
            start = time.perf_counter()
            for rejected in range(retries + 1):
                url = send_to[next(counter) % len(send_to)]
                result = await stream_call(session, url, body, headers, start)
                if result.retry_after_s is None or rejected == retries:
                    return replace(result, rejected=rejected + (result.retry_after_s is not None))
                backoff_s = 0.5 * 2**rejected  # the SDKs' default when no Retry-After
                await asyncio.sleep(min(result.retry_after_s or backoff_s, MAX_RETRY_WAIT_S))
            raise AssertionError("unreachable")

        kv_blocks = await fleet_kv_blocks(session, engine_urls)
        before = await scrape_counters(session, engine_urls)
        kv_rows: list[list[float]] = []
        sampler = asyncio.create_task(sample_kv(session, engine_urls, 0.5, kv_rows))
        start = time.perf_counter()
        results = await run(send)
        wall_s = time.perf_counter() - start
        sampler.cancel()
        after = await scrape_counters(session, engine_urls)
    ok = sorted(r.ttft_s / time_scale for r in results if r.ttft_s is not None)
    return {
        "calls": len(results),
        "errors": len(results) - len(ok),
        "error_kinds": dict(Counter(r.error for r in results if r.error is not None)),
        "fleet_kv_blocks": kv_blocks,
        "rejected_429": sum(r.rejected for r in results),
        "retried_ok": sum(1 for r in results if r.rejected and r.error is None),
        "wall_s": wall_s,
        "completed_per_s": len(ok) / wall_s * time_scale,
        "ttft_p50_s": percentile(ok, 0.5),
        "ttft_p90_s": percentile(ok, 0.9),
        "ttft_p99_s": percentile(ok, 0.99),
        **counter_summary(before, after),
        **kv_summary(kv_rows),
    }


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def run_prefix(
    send: Send, calls: list[tuple[float, int, str]], prompts: list[str], model: str,
    max_tokens: int, time_scale: float,
) -> list[CallResult]:  # fmt: skip
    """Open loop: every call at its arrival time, whatever the others are doing."""
    start = time.perf_counter()
    tasks: list[asyncio.Task[CallResult]] = []
    for offset, tenant, question in calls:
        await _sleep_until(start + offset * time_scale)
        body = {"model": model, "max_tokens": max_tokens, "stream": True,
                "messages": prefix_messages(prompts[tenant], question)}  # fmt: skip
        tasks.append(asyncio.create_task(send(body, {})))
    return list(await asyncio.gather(*tasks))


async def run_agent(
    send: Send, agent: AgentSession, system_prompt: str, model: str, max_tokens: int,
    start: float, sent: list[SentCall], time_scale: float,
) -> list[CallResult]:  # fmt: skip
    """One agent session, closed loop: each call waits for the previous answer and a tool
    pause; it stops at its first failed call (the task failed)."""
    await _sleep_until(start + agent.start_s * time_scale)
    messages = agent_first_messages(agent, system_prompt)
    results: list[CallResult] = []
    for step in range(1, agent.num_steps + 1):
        if step > 1:
            await asyncio.sleep(agent.pauses_s[step - 2] * time_scale)
            messages.append(tool_message(agent, step, agent.tool_results[step - 2]))
        headers = {"X-Workflow-Id": agent.session_id, "X-Workflow-Step": str(step),
                   "X-Workflow-Steps": str(agent.num_steps)}  # fmt: skip
        sent_messages = list(messages)
        body = {"model": model, "max_tokens": max_tokens, "stream": True,
                "messages": sent_messages}  # fmt: skip
        sent_s = time.perf_counter()
        result = await send(body, headers)
        answer = None if result.error else result.text
        results.append(result)
        sent.append(SentCall(sent_messages, answer, sent_s, time.perf_counter()))
        if result.error is not None:
            break
        messages.append({"role": "assistant", "content": result.text})
    return results


async def run_agentic(
    send: Send, agents: list[AgentSession], system_prompts: list[str], model: str,
    max_tokens: int, sent_by_agent: list[list[SentCall]], time_scale: float,
) -> list[CallResult]:  # fmt: skip
    """Every session concurrently; ``sent_by_agent[i]`` gets session i's calls in order."""
    start = time.perf_counter()
    sent_by_agent[:] = [[] for _ in agents]
    per_agent = await asyncio.gather(
        *(
            run_agent(send, a, system_prompts[a.kind], model, max_tokens, start, sent, time_scale)
            for a, sent in zip(agents, sent_by_agent, strict=True)
        )
    )
    return [r for results in per_agent for r in results]
