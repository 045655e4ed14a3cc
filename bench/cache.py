"""Benchmark of the response caches: hit rates, false hits, overhead, work saved.

Two workloads through the gateway's :class:`ResponseCache` (in process, no HTTP):

- *evaluation*: an eval suite re-run in part: 30% of calls repeat an earlier call exactly
  (temperature 0). Reports the hit rate, the time the exact cache adds to a miss (lookup +
  store; target < 0.5 ms) in memory and in Redis, and the latency and GPU-seconds the hits
  saved, priced with the engine model (Llama-3-8B on H100, batch 32 for the GPU share).
- *FAQ*: 40 support questions asked in paraphrase (``bench/cache_faq.py``) mixed with related
  but different questions. Per similarity threshold: hit rate, false-hit rate (hits that served
  another question's answer), and a human-readable sample of semantic hits.

Plus, on this CPU (``bench/cache_latency.py``): the embedding cost per request (all-MiniLM-L6-v2,
one sentence per call as the gateway embeds; the plain ``transformers`` reference and the fast
path, interleaved), the nearest-neighbour step, and the whole semantic lookup at 10,000 cached
entries (target p99 < 10 ms), alone and 8 at a time with and without micro-batching; where the
nearest-neighbour scan runs (embedding worker vs event loop, idle and busy loop) and the cost of
the hop itself. The opt-in bfloat16 embedder is timed too where the CPU has native bfloat16. The
FAQ workload runs with every embedder, so any change in hit or false-hit rate shows.
Usage: ``python bench/cache.py [--quick] [--no-redis] [--variants]``; results go to
bench/results/cache.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cache_latency as lat  # beside this script
import numpy as np
from cache_faq import DISTRACTORS, FAQ  # beside this script

from inferplane.cache.embedder import Embedder
from inferplane.cache.embedder_reference import ReferenceMiniLmEmbedder
from inferplane.cache.minilm import bf16_gemm_available
from inferplane.core.cache_config import (
    CacheBackendKind,
    CacheConfig,
    CacheRouteConfig,
    SemanticRouteConfig,
)
from inferplane.core.semantic_index import SemanticIndex
from inferplane.core.types import PriorityClass
from inferplane.engine.perf import PerfModel
from inferplane.engine.profiles import load_profile
from inferplane.gateway.context import RequestContext
from inferplane.gateway.response_cache import ResponseCache

CHAT = "/v1/chat/completions"
RESULTS = Path(__file__).parent / "results" / "cache.json"
PERF = PerfModel(load_profile("llama-3-8b", "h100"))
BATCH = 32


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def ctx_for(tenant: str, body: dict[str, Any]) -> RequestContext:
    return RequestContext(
        request_id="b", tenant=tenant, priority=PriorityClass.STANDARD, arrival_s=0.0,
        model=body["model"], path=CHAT, stream=False, client_wants_usage=False,
        num_prompt_tokens=0, max_tokens=256, deadline_s=None, ttft_budget_s=None,
        workflow_id=None, workflow_step=None, workflow_steps=None,
    )  # fmt: skip


def engine_cost(prompt_tokens: int, output_tokens: int) -> tuple[float, float]:
    """(latency s, GPU-seconds share) of one call on the engine model at batch ``BATCH``."""
    prefill = PERF.prefill_s(prompt_tokens)
    step = PERF.decode_step_s(BATCH, prompt_tokens + output_tokens // 2)
    return prefill + output_tokens * step, prefill + output_tokens * step / BATCH


def chat(text: str, model: str = "m") -> dict[str, Any]:
    return {"model": model, "temperature": 0, "max_tokens": 256,
            "messages": [{"role": "system", "content": "Answer briefly."},
                         {"role": "user", "content": text}]}  # fmt: skip


# ---- evaluation workload (exact cache) --------------------------------------------------------


def eval_prompts(n: int, rng: random.Random) -> list[str]:
    """n prompts, ~30% exact repeats of an earlier one; each ~600 characters (few-shot)."""
    shots = " ".join(f"Example {k}: {k} + {k} = {2 * k}." for k in range(30))
    out: list[str] = []
    for i in range(n):
        if out and rng.random() < 0.3:
            out.append(rng.choice(out))
        else:
            out.append(f"{shots} Question {i}: what is {rng.randint(1, 10**6)} squared?")
    return out


async def run_eval(backend: CacheBackendKind, n: int, seed: int) -> dict[str, Any]:
    config = CacheConfig(backend=backend, namespace=f"bench-cache-{seed}-{time.time_ns()}")
    cache = ResponseCache(config, asyncio.get_running_loop().time)
    rng = random.Random(seed)
    answer = json.dumps({"choices": [{"message": {"content": "x" * 800}}]}).encode()
    miss_us: list[float] = []
    hits = 0
    saved_latency_s = saved_gpu_s = 0.0
    latency_s, gpu_s = engine_cost(prompt_tokens=600 // 4 + 20, output_tokens=100)
    for prompt in eval_prompts(n, rng):
        body = chat(prompt)
        start = time.perf_counter()
        found = await cache.lookup(ctx_for("eval", body), body, {})
        if found.hit:
            hits += 1
            saved_latency_s += latency_s
            continue
        await cache.store_json(found, answer, gpu_seconds=gpu_s, completion_tokens=100)
        miss_us.append(1e6 * (time.perf_counter() - start))
    if backend is CacheBackendKind.REDIS:
        from inferplane.cache.redis_backend import RedisBackend

        assert isinstance(cache.backend, RedisBackend)
        await cache.backend.clear()
    await cache.close()
    saved_gpu_s = cache.stats()["gpu_seconds_saved"]
    return {
        "backend": backend.value, "requests": n, "hit_rate": hits / n,
        "miss_overhead_us_p50": pct(miss_us, 50), "miss_overhead_us_p99": pct(miss_us, 99),
        "latency_saved_s": saved_latency_s, "gpu_seconds_saved": saved_gpu_s,
        "latency_saved_per_hit_s": latency_s,
    }  # fmt: skip


# ---- FAQ workload (semantic cache) ------------------------------------------------------------


class MemoEmbedder:
    """The real model, remembering vectors so each threshold run embeds nothing twice."""

    def __init__(self, model: Embedder) -> None:
        self.model = model
        self.memo: dict[str, np.ndarray] = {}

    @property
    def dim(self) -> int:
        return self.model.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in texts if t not in self.memo]
        if missing:
            for t, v in zip(missing, self.model.embed(missing), strict=True):
                self.memo[t] = v
        return np.stack([self.memo[t] for t in texts])


def faq_asks(n: int, rng: random.Random) -> list[tuple[str, int]]:
    """(question, topic) pairs; topic -1 marks a distractor (its own question)."""
    asks: list[tuple[str, int]] = []
    for _ in range(n):
        if rng.random() < 0.25:
            asks.append((rng.choice(DISTRACTORS), -1))
        else:
            topic = rng.randrange(len(FAQ))
            asks.append((rng.choice(FAQ[topic]), topic))
    return asks


async def run_faq(
    embedder: MemoEmbedder, threshold: float, asks: list[tuple[str, int]]
) -> dict[str, Any]:
    route = CacheRouteConfig(semantic=SemanticRouteConfig(enabled=True, threshold=threshold))
    cache = ResponseCache(
        CacheConfig(default=route), asyncio.get_running_loop().time, embedder=embedder
    )
    exact = semantic = false = chances = caught = 0
    samples: list[tuple[bool, float, str, str]] = []
    seen_topics: set[int] = set()
    seen_texts: set[str] = set()
    for question, topic in asks:
        body = chat(question)
        found = await cache.lookup(ctx_for("acme", body), body, {})
        # a chance: a new phrasing of a question already answered
        chance = topic in seen_topics and question not in seen_texts
        chances += chance
        seen_texts.add(question)
        if topic != -1:
            seen_topics.add(topic)
        if found.entry is None:
            payload = json.dumps({"topic": topic, "q": question}).encode()
            await cache.store_json(found, payload)
            continue
        stored = json.loads(found.entry.payload)
        if found.status.value == "hit-exact":
            exact += 1
            continue
        semantic += 1
        wrong = topic == -1 or stored["topic"] != topic
        false += wrong
        caught += chance and not wrong
        samples.append((wrong, found.similarity or 0.0, question, stored["q"]))
    n = len(asks)
    return {
        "threshold": threshold, "asks": n, "hit_rate": (exact + semantic) / n,
        "exact_hits": exact, "semantic_hits": semantic, "false_hits": false,
        "false_hit_rate": false / semantic if semantic else 0.0,
        "paraphrase_recall": caught / chances if chances else 0.0,
        "samples": samples,
    }  # fmt: skip


def index_lookup_ms(rows: int, queries: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    index = SemanticIndex(384, rows, rows)
    for i in range(rows):
        index.add("big", "c" * 64, rng.normal(size=384).astype(np.float32), f"k{i}")
    out: list[float] = []
    for _ in range(queries):
        q = rng.normal(size=384).astype(np.float32)
        start = time.perf_counter()
        index.nearest("big", "c" * 64, q, 0.9)
        out.append(1e3 * (time.perf_counter() - start))
    return out


# ---- report -----------------------------------------------------------------------------------


def print_faq(rows: list[dict[str, Any]], embedder: str) -> None:
    print(f"\n## Semantic cache, FAQ workload ({embedder})")
    print("| threshold | asks | hit rate | exact | semantic | false hits | false-hit rate "
          "| paraphrase recall |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['threshold']:.2f} | {r['asks']} | {r['hit_rate']:.1%} | "
              f"{r['exact_hits']} | {r['semantic_hits']} | {r['false_hits']} | "
              f"{r['false_hit_rate']:.1%} | {r['paraphrase_recall']:.1%} |")  # fmt: skip


def print_latency(result: dict[str, Any]) -> None:
    print("\n## Embedding one user turn on this CPU (interleaved, same texts; ms)")
    print("| embedder | wall p50 | wall p99 | CPU p50 | CPU p99 |")
    print("|---|---|---|---|---|")
    for name, e in result["embedding_ms"].items():
        print(f"| {name} | {e['p50']:.2f} | {e['p99']:.2f} | {e['cpu_p50']:.2f} | "
              f"{e['cpu_p99']:.2f} |")  # fmt: skip
    s = result["index_ms"]
    print(f"\nnearest neighbour alone, {s['rows']} rows x 384: p50 {s['p50']:.3f} ms, "
          f"p99 {s['p99']:.3f} ms")  # fmt: skip
    print(f"\n## Whole semantic lookup at {s['rows']:,} cached entries (exact miss + embed "
          "+ nearest; ms; target p99 < 10)")  # fmt: skip
    print("| embedder | clients | max batch | p50 | p99 | lookups/s | mean batch | target |")
    print("|---|---|---|---|---|---|---|---|")
    for r in result["lookup_ms"]:
        verdict = ("PASS" if r["p99"] < 10.0 else "MISS") if r["clients"] == 1 else "-"
        print(f"| {r['embedder']} | {r['clients']} | {r['max_batch']} | {r['p50']:.2f} | "
              f"{r['p99']:.2f} | {r.get('lookups_per_s', 0):.0f} | "
              f"{r.get('mean_batch', 1):.1f} | {verdict} |")  # fmt: skip
    lat.print_scan_placement(result["scan_placement"])


def print_report(result: dict[str, Any]) -> None:
    print("\n## Exact cache, evaluation workload (30% exact repeats)")
    print("| backend | requests | hit rate | miss overhead p50 / p99 (us) | latency saved (s) "
          "| GPU-s saved |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in result["eval"]:
        print(f"| {r['backend']} | {r['requests']} | {r['hit_rate']:.1%} | "
              f"{r['miss_overhead_us_p50']:.0f} / {r['miss_overhead_us_p99']:.0f} | "
              f"{r['latency_saved_s']:.1f} | {r['gpu_seconds_saved']:.2f} |")  # fmt: skip
    for name, rows in result["faq"].items():
        print_faq(rows, name)
    print_latency(result)
    print(f"\n(1-minute load average on this 2-core machine: {result['load_average_1m']:.1f} "
          f"at the start, {result['load_average_end_1m']:.1f} at the end; "
          f"nice {os.nice(0)})")  # fmt: skip
    print(f"\nSample of distinct semantic hits at threshold {result['sample_threshold']:.2f} "
          "(query -> question whose answer was served):")  # fmt: skip
    for wrong, sim, query, original in result["sample"]:
        mark = "FALSE" if wrong else "ok   "
        print(f"  {mark} {sim:.3f}  {query!r} -> {original!r}")


async def measure_latency(args: argparse.Namespace, reference: Embedder) -> dict[str, Any]:
    fast = lat.fast_embedder()
    variants: dict[str, tuple[Embedder, int]] = {
        "reference (transformers fp32)": (reference, 1),
        f"fast ({fast.description})": (fast, 1),
    }
    bf16 = lat.fast_embedder(precision="bf16") if bf16_gemm_available() else None
    if bf16 is not None:
        variants["fast, bf16 (opt-in)"] = (bf16, 1)
    if args.variants:
        variants["fast, fp32 weights"] = (lat.fast_embedder(precision="fp32"), 1)
        variants["fast, int8 (opt-in, lossy)"] = (lat.fast_embedder(precision="int8"), 1)
        variants["fast, eager (no TorchScript)"] = (lat.fast_embedder(compile=False), 1)
        variants["fast, 2 torch threads"] = (fast, 2)
    repeats = 1 if args.quick else 3
    out: dict[str, Any] = {"embedding_ms": lat.embedding_variants(variants, repeats)}
    index_ms = index_lookup_ms(10_000, 500 if args.quick else 2000, 2)
    out["index_ms"] = {"rows": 10_000, "p50": pct(index_ms, 50), "p99": pct(index_ms, 99)}
    lookups: list[dict[str, Any]] = []
    lookup_models: list[tuple[str, Embedder]] = [("reference", reference), ("fast", fast)]
    if args.variants:
        lookup_models.append(("int8 (opt-in)", variants["fast, int8 (opt-in, lossy)"][0]))
    for name, model in lookup_models:
        r = await lat.lookup_latency(model, chat, ctx_for, 10_000, repeats)
        lookups.append({"embedder": name, "clients": 1, "max_batch": 1, **r})
    for clients, max_batch in ((8, 1), (8, 32)):
        r = await lat.concurrent_lookups(fast, chat, ctx_for, 10_000, clients, max_batch)
        lookups.append({"embedder": "fast", "clients": clients, "max_batch": max_batch, **r})
    out["lookup_ms"] = lookups
    placed = {"fast (fp16 weights)": fast, **({"bf16 (opt-in)": bf16} if bf16 else {})}
    out["scan_placement"] = await lat.scan_placement(placed, chat, ctx_for, 10_000, repeats)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis backend")
    parser.add_argument("--variants", action="store_true", help="also time fp32/eager/2 threads")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args()
    n_eval, n_faq = (600, 300) if args.quick else (3000, 800)
    load_start = os.getloadavg()[0]
    backends = [CacheBackendKind.MEMORY] + ([] if args.no_redis else [CacheBackendKind.REDIS])
    result: dict[str, Any] = {"eval": [await run_eval(b, n_eval, 1) for b in backends]}
    reference = ReferenceMiniLmEmbedder(num_threads=1)
    reference.load()
    result.update(await measure_latency(args, reference))
    asks = faq_asks(n_faq, random.Random(3))
    thresholds = (0.75, 0.80, 0.85, 0.90)
    result["faq"] = {}
    embedders: list[tuple[str, Embedder]] = [
        ("reference embedder", reference), ("fast embedder", lat.fast_embedder())
    ]  # fmt: skip
    if bf16_gemm_available():
        embedders.append(("bf16 embedder, opt-in", lat.fast_embedder(precision="bf16")))
    if args.variants:
        embedders.append(("int8 embedder, opt-in", lat.fast_embedder(precision="int8")))
    for name, model in embedders:
        memo = MemoEmbedder(model)
        result["faq"][name] = [await run_faq(memo, t, asks) for t in thresholds]
    pick = next(r for r in result["faq"]["fast embedder"] if r["threshold"] == 0.85)
    unique = list(dict.fromkeys((s[0], round(s[1], 3), s[2], s[3]) for s in pick["samples"]))
    wrong, right = [s for s in unique if s[0]], [s for s in unique if not s[0]]
    result["sample_threshold"], result["sample"] = 0.85, wrong[:5] + right[:7]
    result["load_average_1m"], result["load_average_end_1m"] = load_start, os.getloadavg()[0]
    for rows in result["faq"].values():
        for r in rows:
            r.pop("samples")
    print_report(result)
    result["nice"] = os.nice(0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
