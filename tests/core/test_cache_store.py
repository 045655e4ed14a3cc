"""LRU store bounds and expiry, per-tenant semantic index isolation, simulator cache model."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.cache import CacheEntry, CacheStatus, PayloadKind
from inferplane.core.cache_config import CacheConfig, CacheRouteConfig, SemanticRouteConfig
from inferplane.core.cache_model import CachedCall, CacheModel
from inferplane.core.cache_store import LruStore
from inferplane.core.semantic_index import SemanticIndex


def entry(key: str, size: int = 10, now: float = 0.0, ttl_s: float = 100.0) -> CacheEntry:
    return CacheEntry(key, "t", "m", PayloadKind.JSON, b"x" * size, now, now + ttl_s)


@settings(max_examples=40, deadline=None)
@given(
    puts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3000)), max_size=120),
    max_entries=st.integers(1, 20),
    max_bytes=st.integers(200, 20_000),
)
def test_eviction_bounds_memory(puts: list[tuple[int, int]], max_entries: int, max_bytes: int):
    store = LruStore(max_entries, max_bytes)
    for i, (key, size) in enumerate(puts):
        e = entry(f"k{key}", size, now=float(i))
        kept = store.put(e, float(i))
        assert kept == (e.num_bytes <= max_bytes)
        assert len(store) <= max_entries and store.num_bytes <= max_bytes
        assert store.num_bytes == sum(
            x.num_bytes for x in (store.get(f"k{k}", float(i)) for k in range(31)) if x
        )
        if kept:
            assert store.get(e.key, float(i)) == e  # the newest entry is never the one evicted


def test_lru_order_and_expiry():
    store = LruStore(max_entries=2, max_bytes=10_000)
    store.put(entry("a"), 0.0)
    store.put(entry("b"), 0.0)
    assert store.get("a", 1.0) is not None  # a is now most recent
    store.put(entry("c"), 1.0)
    assert store.get("b", 1.0) is None and store.get("a", 1.0) is not None
    assert store.evictions == 1
    assert store.get("c", 100.0) is None  # expired at 100
    assert store.expirations == 1 and len(store) == 1
    assert not store.put(entry("d", ttl_s=1.0), now=5.0)  # already expired
    small = LruStore(10, 10_000, max_entry_bytes=50)
    assert not small.put(entry("big", 100), 0.0) and len(small) == 0


def unit(rng: np.random.Generator, dim: int = 8) -> np.ndarray:
    v = rng.normal(size=dim).astype(np.float32)
    return v / np.linalg.norm(v)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), noise=st.floats(0.0, 0.05))
def test_no_semantic_hit_across_tenants_even_for_near_duplicates(seed: int, noise: float):
    rng = np.random.default_rng(seed)
    index = SemanticIndex(dim=8, max_rows_per_tenant=50, max_rows=500)
    ctx = "ab" * 32  # the same context hash in both tenants: only the tenant differs
    stored = unit(rng)
    index.add("victim", ctx, stored, "victim-key")
    for _ in range(5):
        index.add("attacker", ctx, unit(rng), "attacker-key")
    probe = stored + noise * unit(rng)
    # threshold -1 accepts any similarity: only the tenant boundary can refuse
    hit = index.nearest("attacker", ctx, probe, threshold=-1.0)
    assert hit is not None and hit.key == "attacker-key"
    assert index.nearest("nobody", ctx, probe, threshold=-1.0) is None
    own = index.nearest("victim", ctx, probe, threshold=0.9)
    assert own is not None and own.key == "victim-key" and own.similarity > 0.9


def test_semantic_index_matches_context_threshold_and_stays_bounded():
    rng = np.random.default_rng(1)
    index = SemanticIndex(dim=8, max_rows_per_tenant=3, max_rows=5)
    v = unit(rng)
    index.add("t", "1" * 64, v, "k1")
    assert index.nearest("t", "2" * 64, v, threshold=-1.0) is None  # other context
    assert index.nearest("t", "1" * 64, -v, threshold=0.5) is None  # below threshold
    for i in range(5):
        index.add("t", "1" * 64, unit(rng), f"r{i}")
    assert index.rows_of("t") == 3 and len(index) == 3  # ring per tenant
    assert index.nearest("t", "1" * 64, v, threshold=0.999) is None  # k1 was replaced
    index.add("u", "1" * 64, v, "u1")
    index.add("u", "1" * 64, v, "u2")
    index.add("w", "1" * 64, v, "w1")  # 6 rows > 5: least recently used tenant t goes
    assert len(index) == 3 and index.rows_of("t") == 0
    with pytest.raises(ValueError):
        index.add("t", "1" * 64, np.zeros(8, dtype=np.float32), "zero")
    with pytest.raises(ValueError):
        index.add("t", "1" * 64, np.ones(4, dtype=np.float32), "short")


def test_cache_model_uses_policy_and_bounds():
    cfg = CacheConfig(
        max_entries=2,
        routes={"faq": CacheRouteConfig(ttl_s=10.0, semantic=SemanticRouteConfig(enabled=True))},
    )
    model = CacheModel(cfg, semantic_recall=1.0)
    rng = random.Random(0)
    call = CachedCall("t", "m", "r1", deterministic=True)
    assert model.lookup(call, 0.0, rng) is CacheStatus.MISS
    model.store(call, 0.0, num_bytes=100, cost_usd=0.01, gpu_seconds=0.5)
    assert model.lookup(call, 1.0, rng) is CacheStatus.HIT_EXACT
    other_tenant = CachedCall("u", "m", "r1", deterministic=True)
    assert model.lookup(other_tenant, 1.0, rng) is CacheStatus.MISS
    sampled = CachedCall("t", "m", "r1", deterministic=False)
    assert model.lookup(sampled, 1.0, rng) is CacheStatus.BYPASS
    faq = CachedCall("t", "faq", "q1", deterministic=True, topic="refunds")
    model.store(faq, 0.0, num_bytes=10)
    paraphrase = CachedCall("t", "faq", "q2", deterministic=True, topic="refunds")
    assert model.lookup(paraphrase, 5.0, rng) is CacheStatus.HIT_SEMANTIC
    assert model.lookup(paraphrase, 11.0, rng) is CacheStatus.MISS  # ttl over
    saved = model.ledger.totals()
    assert saved.hits_exact == 1 and saved.hits_semantic == 1 and saved.gpu_seconds == 0.5


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 40), threshold=st.floats(-1.0, 1.0))
def test_a_scan_of_a_view_finds_what_nearest_finds(seed: int, rows: int, threshold: float):
    rng = np.random.default_rng(seed)
    index = SemanticIndex(dim=8, max_rows_per_tenant=64, max_rows=640)
    contexts = ["1" * 64, "2" * 64]
    for i in range(rows):
        index.add("t", contexts[i % 2], unit(rng), f"k{i}")
    index.add("other", contexts[0], unit(rng), "other-key")
    probe = unit(rng)
    for ctx in contexts:
        view = index.view("t", ctx)
        assert view is not None and view.tenant == "t"
        hit = view.scan(probe)
        want = index.nearest("t", ctx, probe, threshold)
        got = index.resolve(view, hit, probe, threshold)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got.key == want.key
            assert got.similarity == pytest.approx(want.similarity, abs=1e-6)
        if hit is not None:
            assert hit.row % 2 == contexts.index(ctx)  # only rows of the view's context
    assert index.view("nobody", contexts[0]) is None


def test_resolve_rechecks_a_row_replaced_after_the_view():
    """A scan runs elsewhere while the owner adds rows: its row must be judged as it is now."""
    rng = np.random.default_rng(3)
    index = SemanticIndex(dim=8, max_rows_per_tenant=2, max_rows=10)
    ctx, other_ctx = "1" * 64, "2" * 64
    v = unit(rng)
    index.add("t", ctx, v, "k1")
    index.add("t", ctx, unit(rng), "k2")
    view = index.view("t", ctx)
    assert view is not None
    hit = view.scan(v)
    assert hit is not None and hit.row == 0 and hit.similarity > 0.999
    index.add("t", ctx, -v, "k3")  # ring: row 0 now holds an opposite vector under k3
    assert index.resolve(view, hit, v, threshold=0.5) is None
    index.add("t", ctx, unit(rng), "k4")  # row 1
    index.add("t", other_ctx, v, "k5")  # row 0 again: the vector matches, the context not
    assert index.resolve(view, hit, v, threshold=0.5) is None
    index.add("t", ctx, unit(rng), "k6")  # row 1
    index.add("t", ctx, v, "k7")  # row 0: same vector, same context, another key
    near = index.resolve(view, hit, v, threshold=0.5)
    assert near is not None and near.key == "k7" and near.similarity > 0.999


def test_resolve_never_trusts_a_view_of_a_tenant_that_was_dropped_and_came_back():
    rng = np.random.default_rng(4)
    index = SemanticIndex(dim=8, max_rows_per_tenant=4, max_rows=4)
    ctx, v = "1" * 64, unit(rng)
    index.add("t", ctx, v, "old")
    view = index.view("t", ctx)
    assert view is not None
    hit = view.scan(v)
    for i in range(4):
        index.add("u", ctx, unit(rng), f"u{i}")  # t (least recent) is dropped
    assert index.rows_of("t") == 0 and index.resolve(view, hit, v, threshold=-1.0) is None
    index.add("t", ctx, -v, "new")  # t again, one add: its row 0 holds another vector
    assert index.resolve(view, hit, v, threshold=0.5) is None
