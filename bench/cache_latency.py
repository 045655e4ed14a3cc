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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
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
    embedder: Embedder, chat: Chat, rows: int, tenant: str, **cfg: Any
) -> ResponseCache:
    """A semantic cache whose tenant already holds ``rows`` entries in the probes' context."""
    route = CacheRouteConfig(semantic=SemanticRouteConfig(enabled=True, threshold=0.99))
    config = CacheConfig(default=route, semantic_max_entries_per_tenant=rows,
                         semantic_max_rows=rows, **cfg)  # fmt: skip
    cache = ResponseCache(config, time.monotonic, embedder=embedder)
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
