"""The scoreboard's one load generator: replays a workload against one gateway URL.

It runs in its own process (started by ``bench/peers.py --role load``) on uvloop with
aiohttp. Every task starts at its arrival time; a task's calls run one after another
(with their tool pauses), each call resends the conversation so far plus the previous
reply. Calls stream (``stream_options.include_usage``); the generator records per call
the time to the first content token, the end, the tokens received, the largest gap
between tokens, whether the stream ended with ``[DONE]``, the final status and the
attempts. Clients retry as the workload's ``ClientPolicy`` says (Retry-After honoured,
timeouts), and keep the call's deadline: each attempt sends what is left of it
(:func:`attempt_headers`). It also fires the workload's faults at the engines' ``/admin/faults``.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

MODEL = "llama-3-8b"
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(slots=True)
class Attempt:
    status: int = 0
    ttft_s: float | None = None
    end_s: float = 0.0
    tokens: int = 0
    text: str = ""
    done: bool = False
    timed_out: bool = False
    retry_after_s: float | None = None
    max_gap_s: float = 0.0
    refusal: str = ""  # non-200: X-Inferplane-Reason and the body's start


@dataclass(slots=True)
class Shared:
    url: str
    headers: dict[str, str]
    client: dict[str, Any]
    t0: float
    gaps: array[float] = field(default_factory=lambda: array("d"))
    records: list[list[Any]] = field(default_factory=list)
    tasks_done: list[list[Any]] = field(default_factory=list)
    error_samples: dict[str, str] = field(default_factory=dict)
    #: every refused attempt: [task_id, step, priority, sent_s, status, reason and message]
    refusals: list[list[Any]] = field(default_factory=list)


def _retry_after(resp: aiohttp.ClientResponse) -> float | None:
    value = resp.headers.get("Retry-After")
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None


async def _read_stream(
    resp: aiohttp.ClientResponse, sent: float, att: Attempt, gaps: array[float]
) -> None:
    last = sent
    parts: list[str] = []
    async for line in resp.content:
        if not line.startswith(b"data: "):
            continue
        if line.startswith(b"data: [DONE]"):
            att.done = True
            break
        try:
            chunk = orjson.loads(line[6:])
        except orjson.JSONDecodeError:
            continue
        for choice in chunk.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if not content:
                continue
            now = time.monotonic()
            if att.ttft_s is None:
                att.ttft_s = now - sent
            else:
                gaps.append(now - last)
                att.max_gap_s = max(att.max_gap_s, now - last)
            last = now
            att.tokens += 1
            parts.append(content)
    att.text = "".join(parts)


async def _attempt(
    session: aiohttp.ClientSession,
    sh: Shared,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float | None,
) -> Attempt:
    att = Attempt()
    sent = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(sh.url, data=body, headers=headers) as resp:
                att.status = resp.status
                if resp.status != 200:
                    att.retry_after_s = _retry_after(resp)
                    text = (await resp.read())[:300].decode(errors="replace")
                    sh.error_samples.setdefault(str(resp.status), text)
                    reason = resp.headers.get("X-Inferplane-Reason", "")
                    att.refusal = f"{reason} {text[:160]}"
                else:
                    await _read_stream(resp, sent, att, sh.gaps)
    except TimeoutError:
        att.timed_out = True
    except (aiohttp.ClientError, ConnectionError):
        pass
    att.end_s = time.monotonic() - sent
    return att


def attempt_headers(
    headers: dict[str, str], deadline_s: float, elapsed_s: float, retries: int
) -> dict[str, str]:
    """The headers of one attempt of a call: its budget is what is LEFT of the call's deadline.

    A client keeps its deadline across retries (gRPC's rule: a retry never extends the
    deadline; each attempt carries the remaining time). So every attempt sends
    ``X-Deadline-Ms`` = deadline - time already spent on the call (refused attempts and
    Retry-After waits), at least 1 ms, and, as the OpenAI SDKs do, ``x-stainless-retry-count``.
    Gateways that ignore both headers see the same calls as before.
    """
    left_ms = max(1, int(1000 * (deadline_s - elapsed_s)))
    return {**headers, "X-Deadline-Ms": str(left_ms), "x-stainless-retry-count": str(retries)}


def _should_retry(att: Attempt, client: dict[str, Any]) -> float | None:
    """Seconds to wait before the next attempt, or None to give up."""
    if att.timed_out:
        return client["backoff_s"] if client["retry_on_timeout"] else None
    if att.status == 200 and att.ttft_s is not None:
        return None  # a started stream is never replayed by the client
    if att.status == 429 and client["honour_retry_after"] and att.retry_after_s is not None:
        return float(min(att.retry_after_s, client["max_retry_after_s"]))
    if att.status in RETRYABLE or att.status == 0:
        return float(client["backoff_s"])
    return None


async def _call(
    session: aiohttp.ClientSession,
    sh: Shared,
    task: dict[str, Any],
    step: int,
    call: dict[str, Any],
    conversation: list[dict[str, str]],
) -> tuple[bool, str]:
    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": conversation,
            "max_tokens": call["max_tokens"],
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    )
    deadline = call["deadline_s"]
    headers = {**sh.headers, "X-Priority": task["priority"]}
    if task["kind"] == "agent":
        headers.update(
            {
                "X-Workflow-Id": task["task_id"],
                "X-Workflow-Step": str(step + 1),
                "X-Workflow-Steps": str(len(task["calls"])),
            }
        )
    factor = sh.client["timeout_factor"]
    start = time.monotonic()
    attempts = 0
    ttft: float | None = None
    while True:
        attempts += 1
        sent_s = time.monotonic() - sh.t0
        att = await _attempt(
            session,
            sh,
            body,
            attempt_headers(headers, deadline, time.monotonic() - start, attempts - 1),
            None if factor is None else factor * deadline,
        )
        if att.refusal:
            sh.refusals.append(
                [task["task_id"], step, task["priority"], round(sent_s, 3), att.status, att.refusal]
            )
        if att.ttft_s is not None and ttft is None:
            ttft = time.monotonic() - start - att.end_s + att.ttft_s
        wait = None if attempts >= sh.client["max_attempts"] else _should_retry(att, sh.client)
        if wait is None:
            break
        await asyncio.sleep(wait)
    e2e = time.monotonic() - start
    ok = att.status == 200 and att.done and att.tokens > 0
    broken = att.status == 200 and att.ttft_s is not None and not att.done
    sh.records.append(
        [
            task["task_id"],
            task["kind"],
            task["priority"],
            round(start - sh.t0, 4),
            ttft,
            round(e2e, 4),
            ok,
            ok and e2e <= deadline,
            att.status,
            attempts,
            att.tokens,
            broken,
            att.timed_out,
            round(att.max_gap_s, 4),
            deadline,
        ]
    )
    return ok and e2e <= deadline, att.text


RECORD_FIELDS = (
    "task_id",
    "kind",
    "priority",
    "start_s",
    "ttft_s",
    "e2e_s",
    "ok",
    "in_deadline",
    "status",
    "attempts",
    "tokens",
    "broken",
    "timed_out",
    "max_gap_s",
    "deadline_s",
)


async def _task(session: aiohttp.ClientSession, sh: Shared, task: dict[str, Any]) -> None:
    await asyncio.sleep(max(0.0, sh.t0 + task["start_s"] - time.monotonic()))
    conversation: list[dict[str, str]] = []
    success = True
    for step, call in enumerate(task["calls"]):
        if call["pause_s"]:
            await asyncio.sleep(call["pause_s"])
        conversation.extend({"role": r, "content": c} for r, c in call["messages"])
        good, text = await _call(session, sh, task, step, call, conversation)
        if not good:
            success = False
            break
        conversation.append({"role": "assistant", "content": text})
    if task.get("counted", True):  # a task that could not end by the cut-off scores for no one
        sh.tasks_done.append([task["task_id"], task["kind"], task["priority"], success])


async def _fault(
    session: aiohttp.ClientSession, t0: float, url: str, at_s: float, body: str
) -> None:
    await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
    async with session.post(
        url + "/admin/faults", data=body, headers={"Content-Type": "application/json"}
    ) as resp:
        await resp.read()


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Replay ``spec["workload"]`` against ``spec["url"]``; the records and totals."""
    wl = spec["workload"]
    headers = {"Content-Type": "application/json"}
    if spec.get("api_key"):
        headers["Authorization"] = f"Bearer {spec['api_key']}"
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        sh = Shared(spec["url"], headers, wl["client"], time.monotonic() + 0.2)
        faults = [
            asyncio.create_task(
                _fault(session, sh.t0, spec["engine_urls"][f["engine_index"]], f["at_s"], f["body"])
            )
            for f in wl["faults"]
        ]
        jobs = {asyncio.create_task(_task(session, sh, t)): t for t in wl["tasks"]}
        cutoff = wl["duration_s"] + spec["drain_s"]
        _, pending = await asyncio.wait(jobs, timeout=cutoff + 0.2)
        unfinished = sum(1 for job in pending if jobs[job].get("counted", True))
        for job in [*pending, *faults]:
            job.cancel()
        await asyncio.gather(*pending, *faults, return_exceptions=True)
        elapsed = time.monotonic() - sh.t0
    gaps = sorted(sh.gaps)
    return {
        "records": sh.records,
        "fields": RECORD_FIELDS,
        "tasks": sh.tasks_done,
        "unfinished_tasks": unfinished,
        "uncounted_tasks": sum(1 for t in wl["tasks"] if not t.get("counted", True)),
        "error_samples": sh.error_samples,
        "refusals": sh.refusals,
        "elapsed_s": elapsed,
        "tbt_p99_s": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else None,
        "tbt_p50_s": gaps[len(gaps) // 2] if gaps else None,
    }


async def _closed_worker(
    session: aiohttp.ClientSession,
    url: str,
    bodies: list[bytes],
    headers: dict[str, str],
    until: float,
    out: dict[str, Any],
    window: tuple[float, float],
) -> None:
    i = 0
    while time.monotonic() < until:
        body = bodies[i % len(bodies)]
        i += 1
        sent = time.monotonic()
        first: float | None = None
        count = 0
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                if resp.status != 200:
                    out["errors"] += 1
                    await resp.read()
                    continue
                streaming = resp.content_type == "text/event-stream"
                async for line in resp.content:
                    if streaming and b'"content":"' in line and b'"content":""' not in line:
                        now = time.monotonic()
                        first = now if first is None else first
                        count += 1
                        out["tokens"] += window[0] <= now < window[1]
                now = time.monotonic()
                if window[0] <= now < window[1]:
                    out["calls"] += 1
                    out["latencies"].append(now - sent)
                if now >= window[0] and sent < window[1] and first is not None and count > 1:
                    # calls that ran at the window's load (ending after it too: on a busy
                    # machine few calls both start and end inside a short window)
                    out["ttfts"].append(first - sent)
                    out["tbts"].append((now - first) / (count - 1))
        except (aiohttp.ClientError, ConnectionError):
            out["errors"] += 1


async def closed_loop(spec: dict[str, Any]) -> dict[str, Any]:
    """``concurrency`` workers per URL, back to back; tokens, calls and latency in the window."""
    headers = {"Content-Type": "application/json"}
    if spec.get("api_key"):
        headers["Authorization"] = f"Bearer {spec['api_key']}"
    bodies = [orjson.dumps(b) for b in spec["bodies"]]
    out: dict[str, Any] = {
        "tokens": 0,
        "calls": 0,
        "errors": 0,
        "latencies": [],
        "ttfts": [],
        "tbts": [],
    }
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.monotonic() + spec["warmup_s"]
        window = (start, start + spec["window_s"])
        workers = [
            _closed_worker(session, url, bodies[k:] + bodies[:k], headers, window[1], out, window)
            for url in spec["urls"]
            for k in range(spec["concurrency"])
        ]
        await asyncio.gather(*workers)
    lat = sorted(out.pop("latencies"))
    ttfts = sorted(out.pop("ttfts"))
    tbts = sorted(out.pop("tbts"))
    # What a call takes at this load: the deadlines of the workloads are set from these.
    out["ttft_p90_s"] = ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else None
    out["tbt_p50_s"] = tbts[len(tbts) // 2] if tbts else None
    out["tok_s"] = out["tokens"] / spec["window_s"]
    out["calls_s"] = out["calls"] / spec["window_s"]
    out["p50_s"] = lat[len(lat) // 2] if lat else None
    out["p99_s"] = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None
    return out
