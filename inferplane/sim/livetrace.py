"""One trace, two bodies: the live gateway over emulated engines and the simulator, call by call.

The parity test and the fidelity benchmark both need the same calls sent to the live gateway
and replayed by the simulator, then compared per call. A trace is a list of Mooncake-format
records (``timestamp, input_length, output_length, hash_ids``): the simulator replays it as a
``trace`` workload source; the live client sends each record's prompt as token ids to
``/v1/completions`` (``ignore_eos``, exact ``max_tokens``, streamed), built by the very
function the simulator uses (:func:`inferplane.sim.traces.prompt_for`), so both bodies see
identical tokens, block keys and prefix sharing.

Both sides run in the same units: live seconds. The simulated engines take the emulated
engines' time scale (``emulated.time_scale`` of each endpoint of the fleet config), and the
core's router and admission are wired as the gateway wires them for that config
(:func:`inferplane.sim.baselines.wired_like_gateway`): same routing config, same latency
priors, same seeded tie-break RNG, same admission config, same scrape interval.

The result of a call on either side is a :class:`CallResult`: HTTP-like status (200 served,
429/503 refused with the gateway's reason), the endpoint that served it, TTFT and end-to-end
seconds as the client saw them.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from inferplane.config import FleetConfig
from inferplane.sim.baselines import wired_like_gateway
from inferplane.sim.calibrated import CalibratedSimulation
from inferplane.sim.calibration import PredictorFeed
from inferplane.sim.gate import make_gate
from inferplane.sim.prompts import KeySpace
from inferplane.sim.records import CallRecord, Outcome
from inferplane.sim.runner import Simulation
from inferplane.sim.scenario import parse_scenario
from inferplane.sim.traces import TraceRecord, prompt_for, read_trace

TRACE_SOURCE = "trace"
_REFUSED_STATUS = {"no_endpoint": 503, "cannot_fit": 400}


@dataclass(frozen=True, slots=True)
class CallResult:
    """One call as its client saw it (seconds from the moment it was sent)."""

    index: int
    status: int  # 200 served; 429 / 503 refused; 0 failed or never answered
    endpoint: str | None
    reason: str  # the refusal reason (X-Inferplane-Reason), else ""
    ttft_s: float | None
    e2e_s: float | None
    completion_tokens: int
    sent_s: float = 0.0  # when it was sent, seconds after the trace's start
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache served

    @property
    def admitted(self) -> bool:
        return self.status == 200


# ---- the trace ----------------------------------------------------------------------------------


def shared_prefix_trace(
    num_calls: int,
    rate_per_s: float,
    *,
    seed: int,
    num_documents: int = 6,
    block_tokens: int = 64,
    document_blocks: tuple[int, int] = (4, 24),
    question_tokens: tuple[int, int] = (16, 200),
    output_tokens: tuple[int, int] = (8, 64),
    sequential_gap_s: float | None = None,
) -> list[TraceRecord]:
    """Calls over a few shared documents (prefix reuse), Poisson arrivals at ``rate_per_s``.

    Each call is a document (a run of named blocks, so calls on one document share its KV
    blocks) plus a question of its own. With ``sequential_gap_s`` the calls are instead
    evenly spaced that many seconds apart (a gap longer than a call keeps them sequential).
    """
    rng = random.Random(seed)
    docs = [rng.randint(*document_blocks) for _ in range(num_documents)]
    records: list[TraceRecord] = []
    t = 0.0
    next_id = 1_000_000
    for i in range(num_calls):
        if i:
            t += sequential_gap_s if sequential_gap_s else rng.expovariate(rate_per_s)
        doc = rng.randrange(num_documents)
        question = rng.randint(*question_tokens)
        hash_ids = [doc * 1000 + j for j in range(docs[doc])]
        tail = question
        while tail > 0:  # the question's own blocks (fresh ids)
            hash_ids.append(next_id)
            next_id += 1
            tail -= block_tokens
        prompt = docs[doc] * block_tokens + question
        records.append(TraceRecord(t, prompt, rng.randint(*output_tokens), tuple(hash_ids)))
    return records


def write_mooncake(path: Path, records: Sequence[TraceRecord]) -> None:
    """The records as a Mooncake JSONL file (timestamps in ms)."""
    lines = [
        json.dumps(
            {
                "timestamp": round(r.time_s * 1000.0, 3),
                "input_length": r.prompt_tokens,
                "output_length": r.output_tokens,
                "hash_ids": list(r.hash_ids),
            }
        )
        for r in records
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def prompts_of(records: Sequence[TraceRecord], block_tokens: int) -> list[tuple[int, ...]]:
    """Each record's prompt token ids, exactly as the simulator's trace source builds them."""
    keys = KeySpace(0)  # the trace is the scenario's first (only) source
    return [prompt_for(r, block_tokens, keys) for r in records]


# ---- the simulator side ----------------------------------------------------------------------


def simulate_trace(
    fleet: FleetConfig,
    trace_path: Path,
    *,
    block_tokens: int = 64,
    drain_s: float = 600.0,
    seed: int = 0,
    calibrated: bool = False,
) -> tuple[list[CallResult], Simulation]:
    """Replay the trace in the simulator wired like the live gateway (module docstring).

    The calls belong to the tenant an anonymous gateway gives its callers (tenant quotas
    apply alike), and are never retried (the live client does not retry either). With
    ``calibrated`` the run is a :class:`CalibratedSimulation` (what ``inferplane simulate``
    runs): the router's predictor is fed every call's dispatch, first token and finish, as
    the gateway feeds its own, starting from the same time-scaled priors; without it the
    predictor keeps its priors all run.
    """
    records = list(read_trace(trace_path, "mooncake_jsonl"))
    last_s = records[-1].time_s if records else 0.0
    scenario = parse_scenario(
        {
            "name": "livetrace",
            "fleet": "fleet.yaml",  # unused: the config is passed in
            "duration_s": last_s + 1e-3,
            "drain_s": drain_s,
            "seed": seed,
            "policies": ["inferplane"],
            "workload": [
                {"name": TRACE_SOURCE, "kind": "trace", "path": trace_path.name,
                 "format": "mooncake_jsonl", "block_tokens": block_tokens,
                 "tenant": fleet.gateway.auth.anonymous_tenant},
            ],
            "clients": {"timeout_s": drain_s, "max_retries": 0},
        }
    ).model_copy(update={"admission": fleet.admission})  # fmt: skip
    cls = CalibratedSimulation if calibrated else Simulation
    sim = cls(scenario, fleet, trace_path.parent, "inferplane", seed=seed)
    for ep in sim.fleet.endpoints:  # the emulated engines' clock: live seconds
        emulated = ep.config.emulated
        ep.engine.time_scale = 1.0 if emulated is None else emulated.time_scale
    assert sim.kv is not None
    sim.policy = wired_like_gateway(fleet, sim.kv.index)
    sim.gate = make_gate("inferplane", fleet.admission, sim.policy.predictor)
    if isinstance(sim, CalibratedSimulation):  # feed the wired predictor (its priors kept)
        block = fleet.routing.block_size  # the gateway's on_dispatch counts in these
        sim.feed = PredictorFeed(sim.policy.predictor, sim.kv.index, block)
    result = sim.run()
    return [_from_record(i, r) for i, r in enumerate(result.records)], sim


def _from_record(index: int, r: CallRecord) -> CallResult:
    if r.outcome is Outcome.SUCCESS:
        status = 200
    elif r.outcome is Outcome.REJECTED:
        status = _REFUSED_STATUS.get(r.reason, 429)
    else:
        status = 0
    endpoint = r.endpoint if status == 200 else None
    return CallResult(index, status, endpoint, "" if status == 200 else r.reason,
                      r.ttft_s, r.e2e_s, r.completion_tokens, r.arrival_s,
                      r.prompt_tokens, r.cached_tokens)  # fmt: skip


# ---- the live side ---------------------------------------------------------------------------


async def send_trace(
    url: str,
    model: str,
    records: Sequence[TraceRecord],
    *,
    block_tokens: int = 64,
    priority: str = "standard",
    lead_s: float = 0.05,
) -> list[CallResult]:
    """Send every record at its time (open loop) to the gateway at ``url``; their results."""
    prompts = prompts_of(records, block_tokens)
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter() + lead_s
        tasks = []
        for i, (record, prompt) in enumerate(zip(records, prompts, strict=True)):
            delay = start + record.time_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = {
                "model": model,
                "prompt": list(prompt),
                "max_tokens": record.output_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            tasks.append(asyncio.create_task(_one(session, url, i, body, priority, start)))
        return list(await asyncio.gather(*tasks))


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    index: int,
    body: dict[str, Any],
    priority: str,
    start: float,
) -> CallResult:
    sent = time.perf_counter()
    sent_s = sent - start
    ttft: float | None = None
    tokens = prompt = cached = 0
    headers = {"X-Priority": priority}
    try:
        async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
            endpoint = resp.headers.get("X-Inferplane-Endpoint") or None
            if resp.status != 200:
                await resp.read()
                reason = resp.headers.get("X-Inferplane-Reason", "")
                return CallResult(index, resp.status, None, reason, None, None, 0, sent_s)
            async for line in resp.content:
                if ttft is None and b'"finish_reason":null' in line:
                    ttft = time.perf_counter() - sent
                elif line.startswith(b"data: {") and b'"usage"' in line:
                    usage = orjson.loads(line[6:]).get("usage") or {}
                    tokens = int(usage.get("completion_tokens", 0))
                    prompt = int(usage.get("prompt_tokens", 0))
                    details = usage.get("prompt_tokens_details") or {}
                    cached = int(details.get("cached_tokens") or 0)
            e2e = time.perf_counter() - sent
    except (aiohttp.ClientError, TimeoutError):
        return CallResult(index, 0, None, "client error", ttft, None, 0, sent_s)
    return CallResult(index, 200, endpoint, "", ttft, e2e, tokens, sent_s, prompt, cached)


async def wait_ready(url: str, num_endpoints: int, timeout_s: float = 30.0) -> None:
    """Until the gateway answers /ready, has scraped every endpoint and holds them all
    ready, and every KV-event link (if any) is connected."""
    deadline = time.perf_counter() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.perf_counter() < deadline:
            try:
                async with session.get(url + "/ready") as resp:
                    if resp.status == 200:
                        async with session.get(url + "/v1/stats") as stats_resp:
                            stats = await stats_resp.json()
                        links = stats["routing"]["kv_events"].values()
                        ready = [e for e in stats["endpoints"] if e["state"] == "ready"]
                        scraped = all(e["scrapes_ok"] > 0 for e in stats["endpoints"])
                        connected = all(link["state"] == "connected" for link in links)
                        if len(ready) == num_endpoints and scraped and connected:
                            return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError(f"the gateway at {url} did not become ready ({num_endpoints} endpoints)")
