"""Semantic-cache latency on this CPU, for ``bench/cache.py`` (issue 10: p99 < 10 ms at 10k).

- *Embedding*: one user turn per call, as the gateway embeds. The reference (plain
  ``transformers`` float32 forward, how the cache first embedded) and the fast path
  (:mod:`inferplane.cache.minilm`) are measured interleaved, sentence by sentence, so machine
  load hits both alike; wall and thread-CPU milliseconds. Optional extra variants (float32
  weights, eager, two torch threads) show what each step buys.
- *Lookup*: the whole semantic lookup through the gateway's :class:`ResponseCache` (exact
  miss, embed the last user turn, nearest neighbour among 10,000 cached entries of the same
  tenant and context), one request at a time, memo off (every text new to the model).
- *Concurrent lookups*: the same, N at a time, to show micro-batching (per-request latency
  and throughput, with and without batching).
- *Where the scan runs*: the whole lookup as now (the caller's own task hands the embedding
  and the nearest-neighbour scan to the worker: one hop) against the earlier design (through
  the batcher's drain task, the scan on the event loop once the vector is back), interleaved
  text by text, on an idle loop and on a loop kept ~50% busy by
  another task (0.5 ms of Python, then 0.5 ms asleep, as other requests would). Reports wall
  times and the event loop's own CPU per lookup (what the lookup takes from other requests).
- *The hop*: handing a no-op to the embedding worker and back, idle and busy loop, the
  batcher's own thread against asyncio's shared default pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from cache_faq import DISTRACTORS, FAQ  # beside this script

from inferplane.cache.embedder import Embedder, MiniLmEmbedder
from inferplane.core.cache import semantic_query
from inferplane.core.cache_config import CacheConfig, CacheRouteConfig, SemanticRouteConfig
from inferplane.gateway.response_cache import ResponseCache

Chat = Callable[[str], dict[str, Any]]
TEXTS = [q for group in FAQ for q in group] + list(DISTRACTORS)


def summary(wall_ms: Sequence[float], cpu_ms: Sequence[float] = ()) -> dict[str, float]:
    out = {"p50": float(np.percentile(wall_ms, 50)), "p99": float(np.percentile(wall_ms, 99)),
           "n": float(len(wall_ms))}  # fmt: skip
    if cpu_ms:
        out["cpu_p50"] = float(np.percentile(cpu_ms, 50))
        out["cpu_p99"] = float(np.percentile(cpu_ms, 99))
    return out


def embedding_variants(
    variants: dict[str, tuple[Embedder, int]], repeats: int
) -> dict[str, dict[str, float]]:
    """Per variant (embedder, torch threads): one-sentence embed times, interleaved."""
    import torch

    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for model, threads in variants.values():  # warm-up (lazy loads, first-call compiles)
        torch.set_num_threads(threads)
        model.embed(TEXTS[:3])
    for _ in range(repeats):
        for text in TEXTS:
            for name, (model, threads) in variants.items():
                torch.set_num_threads(threads)
                start, start_cpu = time.perf_counter(), time.thread_time()
                model.embed([text])
                cpu[name].append(1e3 * (time.thread_time() - start_cpu))
                wall[name].append(1e3 * (time.perf_counter() - start))
    torch.set_num_threads(1)
    return {name: summary(wall[name], cpu[name]) for name in variants}


def filled_cache(
    embedder: Embedder, chat: Chat, rows: int, tenant: str, one_hop: bool = True,
    **cfg: Any,
) -> ResponseCache:  # fmt: skip
    """A semantic cache whose tenant already holds ``rows`` entries in the probes' context."""
    route = CacheRouteConfig(semantic=SemanticRouteConfig(enabled=True, threshold=0.99))
    config = CacheConfig(default=route, semantic_max_entries_per_tenant=rows,
                         semantic_max_rows=rows, **cfg)  # fmt: skip
    cache = ResponseCache(config, time.monotonic, embedder=embedder, one_hop=one_hop)
    body = chat("anything")
    query, _ = semantic_query(route, tenant, body["model"], "/v1/chat/completions", body)
    assert query is not None
    index = cache.semantic_index()
    rng = np.random.default_rng(7)
    for i in range(rows):
        index.add(tenant, query.context_hash, rng.normal(size=384).astype(np.float32), f"k{i}")
    return cache


async def lookup_latency(
    embedder: Embedder, chat: Chat, ctx_for: Callable[..., Any], rows: int, repeats: int
) -> dict[str, float]:
    """Sequential whole-lookup times (ms) over the FAQ texts, memo off."""
    cache = filled_cache(embedder, chat, rows, "big", semantic_memo_entries=0)
    await cache.warm()
    times: list[float] = []
    for _ in range(repeats):
        for text in TEXTS:
            body = chat(text)
            start = time.perf_counter()
            found = await cache.lookup(ctx_for("big", body), body, {})
            times.append(1e3 * (time.perf_counter() - start))
            assert found.status.value == "miss"  # random rows never pass 0.99
    return summary(times)


async def concurrent_lookups(
    embedder: Embedder, chat: Chat, ctx_for: Callable[..., Any], rows: int, clients: int,
    max_batch: int,
) -> dict[str, float]:  # fmt: skip
    """``clients`` lookups in flight at a time over the FAQ texts: latency and throughput."""
    cache = filled_cache(embedder, chat, rows, "big", semantic_memo_entries=0,
                         semantic_max_batch=max_batch)  # fmt: skip
    await cache.warm()
    times: list[float] = []
    queue = list(TEXTS)

    async def client() -> None:
        while queue:
            body = chat(queue.pop())
            start = time.perf_counter()
            await cache.lookup(ctx_for("big", body), body, {})
            times.append(1e3 * (time.perf_counter() - start))

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed_s = time.perf_counter() - start
    out = summary(times)
    out["lookups_per_s"] = len(times) / elapsed_s
    stats = cache.embedding_stats()
    out["mean_batch"] = stats["batched_texts"] / max(1, stats["batches"])
    return out


def fast_embedder(**kwargs: Any) -> MiniLmEmbedder:
    model = MiniLmEmbedder(num_threads=1, **kwargs)
    model.load()
    return model


@contextlib.asynccontextmanager
async def busy_loop(busy: bool, chunk_s: float = 0.0005) -> AsyncIterator[None]:
    """While inside: another task keeps the event loop ~50% busy (spin, then sleep)."""

    async def spin() -> None:
        while True:
            end = time.perf_counter() + chunk_s
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(chunk_s)

    task = asyncio.create_task(spin()) if busy else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def lookup_paths(
    embedder: Embedder, chat: Chat, ctx_for: Callable[..., Any], rows: int, repeats: int,
    busy: bool,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Whole lookups, scan in the worker vs on the loop, interleaved; wall and loop-CPU ms."""
    paths = {
        "one hop: scan in the worker (now)": True,
        "drain task, scan on the loop (before)": False,
    }
    caches = {name: filled_cache(embedder, chat, rows, "big", one_hop=w,
                                 semantic_memo_entries=0) for name, w in paths.items()}  # fmt: skip
    for cache in caches.values():
        await cache.warm()
    wall: dict[str, list[float]] = {name: [] for name in paths}
    loop_cpu: dict[str, list[float]] = {name: [] for name in paths}
    async with busy_loop(busy):
        for i in range(repeats):
            for text in TEXTS:
                body = chat(text)
                order = list(caches.items())
                for name, cache in order if i % 2 == 0 else order[::-1]:
                    start, start_cpu = time.perf_counter(), time.thread_time()
                    found = await cache.lookup(ctx_for("big", body), body, {})
                    loop_cpu[name].append(1e3 * (time.thread_time() - start_cpu))
                    wall[name].append(1e3 * (time.perf_counter() - start))
                    assert found.status.value == "miss"
    for cache in caches.values():
        await cache.close()
    out = {name: summary(wall[name]) for name in paths}
    for name in paths:  # on a busy loop this also counts the spinning task's share
        out[name]["loop_cpu_p50"] = float(np.percentile(loop_cpu[name], 50))
    return out


async def hop_ms(busy: bool, repeats: int) -> dict[str, dict[str, float]]:
    """A no-op to a worker thread and back: the batcher's own thread vs asyncio.to_thread."""
    own = ThreadPoolExecutor(max_workers=1)
    loop = asyncio.get_running_loop()
    times: dict[str, list[float]] = {"own thread": [], "asyncio.to_thread": []}
    async with busy_loop(busy):
        for _ in range(repeats):
            start = time.perf_counter()
            await loop.run_in_executor(own, int)
            times["own thread"].append(1e3 * (time.perf_counter() - start))
            start = time.perf_counter()
            await asyncio.to_thread(int)
            times["asyncio.to_thread"].append(1e3 * (time.perf_counter() - start))
    own.shutdown()
    return {name: summary(t) for name, t in times.items()}


async def scan_placement(
    embedders: dict[str, Embedder], chat: Chat, ctx_for: Callable[..., Any], rows: int,
    repeats: int,
) -> dict[str, Any]:  # fmt: skip
    """Paths x embedders x idle/busy loop, plus the hop alone."""
    paths: list[dict[str, Any]] = []
    for busy in (False, True):
        for name, model in embedders.items():
            found = await lookup_paths(model, chat, ctx_for, rows, repeats, busy)
            for path, r in found.items():
                paths.append({"embedder": name, "loop": "busy" if busy else "idle",
                              "path": path, **r})  # fmt: skip
    hops = {("busy" if busy else "idle"): await hop_ms(busy, 150 * repeats)
            for busy in (False, True)}  # fmt: skip
    return {"rows": rows, "paths": paths, "hop_ms": hops}


def print_scan_placement(result: dict[str, Any]) -> None:
    print(f"\n## Where the scan runs: whole lookup at {result['rows']:,} entries, interleaved "
          "(ms; loop CPU = the event loop's own CPU per lookup)")  # fmt: skip
    print("| embedder | loop | path | p50 | p99 | loop CPU p50 | target p99 < 10 |")
    print("|---|---|---|---|---|---|---|")
    for r in result["paths"]:
        verdict = "PASS" if r["p99"] < 10.0 else "MISS"
        print(f"| {r['embedder']} | {r['loop']} | {r['path']} | {r['p50']:.2f} | "
              f"{r['p99']:.2f} | {r['loop_cpu_p50']:.2f} | {verdict} |")  # fmt: skip
    print("\n| hop to a worker and back | loop | p50 | p99 |")
    print("|---|---|---|---|")
    for loop, hops in result["hop_ms"].items():
        for name, h in hops.items():
            print(f"| {name} | {loop} | {h['p50']:.3f} | {h['p99']:.3f} |")
