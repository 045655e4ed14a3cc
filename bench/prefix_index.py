"""Micro-benchmark of the prefix index: hot-path cost and memory per indexed block.

Fills an index for 8 endpoints from vLLM-style BlockStored events (many customers, each
with a long shared prefix and a few questions, like llm-d's published test), then
measures, against baselines timed in the same run:

* ``block_keys()`` per 1K tokens, vs hashing the same tokens once as one tuple (the floor
  for touching every token id once in Python);
* ``match()`` for 8K-token prompts (512 keys) over the 8 endpoints, vs a brute-force
  per-endpoint set scan; ``weighted_match()`` and ``record_route()`` too;
* ``apply_events()`` throughput in blocks/s;
* bytes per indexed (endpoint, block) entry with tracemalloc, precise (events, with the
  engine-hash map) and approximate (routes only), next to the index's own estimate.

Prints a table and writes bench/results/prefix-index.json.
Usage: .venv/bin/python bench/prefix_index.py [--blocks-per-endpoint N] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferplane.core.kv_events import BlockStored
from inferplane.core.prefix_index import PrefixIndex, PrefixIndexConfig, block_keys

BS = 16
NUM_ENDPOINTS = 8
PROMPT_TOKENS = 8192
RESULTS = Path(__file__).parent / "results" / "prefix-index.json"


def timed_us(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn`` in microseconds over ``repeat`` runs (batched by 10)."""
    samples = []
    for _ in range(max(1, repeat // 10)):
        start = time.perf_counter()
        for _ in range(10):
            fn()
        samples.append((time.perf_counter() - start) / 10 * 1e6)
    return statistics.median(samples)


def make_workload(rng: random.Random, blocks_per_endpoint: int) -> list[list[int]]:
    """Prompts: customers with a 6K-token shared prefix, a few 2K-token questions each."""
    prompts = []
    num_customers = max(1, blocks_per_endpoint * NUM_ENDPOINTS // (512 + 3 * 128))
    for _ in range(num_customers):
        prefix = [rng.randrange(32_000) for _ in range(6144)]
        for _ in range(3):
            prompts.append(prefix + [rng.randrange(32_000) for _ in range(2048)])
    return prompts


def engine_events(tokens: list[int], seed: int) -> list[BlockStored]:
    """What a vLLM engine would publish for one prompt: one chain segment per 64 blocks."""
    hashes, h = [], seed
    for i in range(len(tokens) // BS):
        h = hash((seed, h, tuple(tokens[i * BS : (i + 1) * BS]))) & (2**64 - 1)
        hashes.append(h)
    events = []
    for first in range(0, len(hashes), 64):
        last = min(first + 64, len(hashes))
        events.append(
            BlockStored(
                block_hashes=tuple(hashes[first:last]),
                parent_block_hash=hashes[first - 1] if first else None,
                token_ids=tuple(tokens[first * BS : last * BS]),
                block_size=BS,
                medium="GPU",
            )
        )
    return events


def fill_precise(prompts: list[list[int]], cap: int) -> tuple[PrefixIndex, float]:
    index = PrefixIndex(PrefixIndexConfig(max_entries=cap))
    seconds = 0.0
    for i, tokens in enumerate(prompts):
        endpoint = f"ep{hash((i // 3, 7)) % NUM_ENDPOINTS}"  # customers stick to a replica
        events = engine_events(tokens, seed=hash(endpoint) & 0xFFFF)
        start = time.perf_counter()
        index.apply_events(endpoint, events, now=0.0)
        seconds += time.perf_counter() - start
    return index, seconds


def memory_per_entry(build: Callable[[], PrefixIndex]) -> tuple[float, PrefixIndex]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / max(1, index.stats().num_entries), index


def brute_force_match(held: list[set[int]], keys: list[int]) -> list[int]:
    out = []
    for keys_held in held:
        run = 0
        for key in keys:
            if key not in keys_held:
                break
            run += 1
        out.append(run)
    return out


def run(blocks_per_endpoint: int, repeat: int) -> dict[str, Any]:
    rng = random.Random(42)
    prompts = make_workload(rng, blocks_per_endpoint)
    cap = 4 * blocks_per_endpoint * NUM_ENDPOINTS
    # Token ids are interned small ints in a real process too; build them outside tracing.
    precise_bpe, index = memory_per_entry(lambda: fill_precise(prompts, cap)[0])
    apply_s = fill_precise(prompts, cap)[1]
    total_blocks = sum(len(p) // BS for p in prompts)
    all_keys = [block_keys(p) for p in prompts]

    def build_approx() -> PrefixIndex:
        approx = PrefixIndex(PrefixIndexConfig(max_entries=cap))
        for i, tokens in enumerate(prompts):  # keys made inside: the index keeps them
            endpoint = f"ep{hash((i // 3, 7)) % NUM_ENDPOINTS}"
            approx.record_route(endpoint, block_keys(tokens), now=0.0)
        return approx

    approx_bpe, approx = memory_per_entry(build_approx)
    approx_stats = approx.stats()
    stats = index.stats()
    endpoints = index.endpoints()
    hit = all_keys[0]
    miss = block_keys([rng.randrange(32_000) for _ in range(PROMPT_TOKENS)])
    held = [set().union(*map(set, all_keys)) for _ in endpoints]  # worst case: all hit
    tokens_1k = prompts[0][:1024]
    floor_hash = timed_us(lambda: hash(tuple(tokens_1k)), repeat * 10)
    keys_1k = timed_us(lambda: block_keys(tokens_1k), repeat * 10)
    match_hit = timed_us(lambda: index.match(hit, endpoints), repeat)
    match_miss = timed_us(lambda: index.match(miss, endpoints), repeat)
    brute = timed_us(lambda: brute_force_match(held, hit), repeat)
    weighted = timed_us(lambda: index.weighted_match(hit, endpoints), repeat)
    spare = PrefixIndex()
    route = timed_us(lambda: spare.record_route("ep0", hit, now=0.0), repeat)
    return {
        "python": platform.python_version(),
        "endpoints": NUM_ENDPOINTS,
        "prompt_tokens": PROMPT_TOKENS,
        "indexed_entries": stats.num_entries,
        "distinct_keys": stats.num_keys,
        "engine_hashes": stats.num_engine_hashes,
        "block_keys_us_per_1k_tokens": round(keys_1k, 2),
        "hash_tuple_floor_us_per_1k_tokens": round(floor_hash, 2),
        "block_keys_vs_floor": round(keys_1k / floor_hash, 2),
        "match_8k_hit_us": round(match_hit, 1),
        "match_8k_miss_us": round(match_miss, 2),
        "brute_force_8k_hit_us": round(brute, 1),
        "match_vs_brute_force": round(match_hit / brute, 3),
        "weighted_match_8k_hit_us": round(weighted, 1),
        "record_route_8k_us": round(route, 1),
        "apply_blocks_per_s": round(total_blocks / apply_s),
        "bytes_per_entry_precise": round(precise_bpe, 1),
        "bytes_per_entry_approximate": round(approx_bpe, 1),
        "estimated_bytes_per_entry_precise": round(
            stats.estimated_bytes / max(1, stats.num_entries), 1
        ),
        "estimated_bytes_per_entry_approximate": round(
            approx_stats.estimated_bytes / max(1, approx_stats.num_entries), 1
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks-per-endpoint", type=int, default=50_000)
    parser.add_argument("--quick", action="store_true", help="small index, few repeats")
    args = parser.parse_args()
    blocks = 2_000 if args.quick else args.blocks_per_endpoint
    result = run(blocks, repeat=100 if args.quick else 1_000)
    width = max(map(len, result))
    for name, value in result.items():
        print(f"{name:<{width}}  {value}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
