"""EngineModel: batching invariants under random workloads, prefix reuse, KV events,
continuation across engines, time scale, cold start, crash, late callers."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.engine.model import EngineModel
from inferplane.engine.profiles import EngineProfile, load_profile
from inferplane.engine.types import (
    EOS_TOKEN_ID,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineEvent,
    EngineRequest,
    EngineState,
    FinishReason,
    RequestFinished,
    RequestPreempted,
    RequestScheduled,
    StateChanged,
    TokensGenerated,
)

SMALL = load_profile(
    "llama-3.2-1b",
    "h100",
    overrides={"max_num_batched_tokens": 64, "max_num_seqs": 4, "mean_output_tokens": 20},
)
H100_8B = load_profile("llama-3-8b", "h100")


def drain(model: EngineModel, limit: int = 100_000, **kw: bool) -> list[EngineEvent]:
    """Run the engine until idle, step by step as a simulator would."""
    events: list[EngineEvent] = []
    for _ in range(limit):
        t = model.next_event_time()
        if t is None:
            return events
        events += model.advance(t, **kw)
    raise AssertionError("engine did not go idle")


def check_blocks(model: EngineModel) -> None:
    """Every block is free xor held, and its ref count is its number of holders."""
    pool, sched = model.block_pool, model.scheduler
    holders = Counter(b for seq in sched.running for b in seq.block_ids)
    assert all(pool.ref_count(b) == holders[b] for b in range(pool.num_blocks))
    assert pool.num_used == len(holders)
    assert pool.num_free + pool.num_used == pool.num_blocks
    for seq in sched.running:
        assert len(seq.block_ids) * pool.block_size >= seq.num_computed


def replay_kv(events: list[EngineEvent]) -> set[int]:
    cached: set[int] = set()
    for e in events:
        if isinstance(e, BlockStored):
            assert cached.isdisjoint(e.block_hashes)
            cached.update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            assert cached.issuperset(e.block_hashes)
            cached.difference_update(e.block_hashes)
        elif isinstance(e, AllBlocksCleared):
            cached.clear()
    return cached


PREFIXES = [tuple(range(1000 + 100 * k, 1000 + 100 * k + 40)) for k in range(3)]
submit_op = st.tuples(
    st.just("submit"),
    st.integers(0, 3),  # a shared prefix, or none (3)
    st.integers(1, 40),  # prompt tokens of its own
    st.integers(1, 80),  # max_tokens
    st.booleans(),  # ignore_eos
)
op = st.one_of(
    submit_op,
    submit_op,
    st.tuples(st.just("abort"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.floats(0.0, 0.02)),
)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(op, min_size=1, max_size=40), num_blocks=st.integers(4, 14))
def test_random_workload_invariants(ops: list[tuple[object, ...]], num_blocks: int) -> None:
    model = EngineModel(SMALL, seed=5, num_gpu_blocks=num_blocks)
    events: list[EngineEvent] = []
    submitted: dict[str, EngineRequest] = {}
    aborted: set[str] = set()
    now = 0.0
    for i, o in enumerate(ops):
        if o[0] == "submit":
            _, k, n, max_tokens, ignore_eos = o
            assert isinstance(k, int) and isinstance(n, int) and isinstance(max_tokens, int)
            prefix = PREFIXES[k] if k < len(PREFIXES) else ()
            prompt = prefix + tuple(16 + (i * 7919 + j) % 30_000 for j in range(n))
            request = EngineRequest(f"r{i}", prompt, max_tokens, ignore_eos=bool(ignore_eos))
            if len(prompt) >= num_blocks * SMALL.block_size:
                with pytest.raises(ValueError, match="never fits"):
                    model.submit(request, now)
                continue
            model.submit(request, now)
            submitted[request.request_id] = request
        elif o[0] == "abort" and submitted:
            assert isinstance(o[1], int)
            rid = list(submitted)[o[1] % len(submitted)]
            out = model.abort(rid, now)
            events += out
            if any(isinstance(e, RequestFinished) and e.request_id == rid for e in out):
                aborted.add(rid)
        elif o[0] == "advance":
            assert isinstance(o[1], float)
            now += o[1]
            events += model.advance(now)
        check_blocks(model)
    events += drain(model)
    check_blocks(model)
    assert model.block_pool.num_used == 0

    times = [e.time_s for e in events]
    assert times == sorted(times)
    finished = [e for e in events if isinstance(e, RequestFinished)]
    assert Counter(e.request_id for e in finished) == Counter(list(submitted))  # once each
    tokens: dict[str, list[int]] = {rid: [] for rid in submitted}
    for e in events:
        if isinstance(e, TokensGenerated):
            tokens[e.request_id] += e.token_ids
    for f in finished:
        request = submitted[f.request_id]
        assert len(tokens[f.request_id]) == f.num_completion_tokens <= request.max_tokens
        assert f.num_prompt_tokens == len(request.prompt_token_ids)
        assert 0 <= f.num_cached_tokens < f.num_prompt_tokens
        if f.request_id in aborted:
            assert f.reason is FinishReason.ABORT
        elif f.reason is FinishReason.STOP:
            assert tokens[f.request_id][-1] == EOS_TOKEN_ID and not request.ignore_eos
        else:
            assert f.reason is FinishReason.LENGTH
    preempted = {e.request_id for e in events if isinstance(e, RequestPreempted)}
    assert preempted <= {f.request_id for f in finished}
    assert replay_kv(events) == model.cached_block_hashes()
    stats = model.stats()
    assert stats.num_preemptions == sum(isinstance(e, RequestPreempted) for e in events)
    assert stats.generation_tokens_total >= sum(f.num_completion_tokens for f in finished)


def test_small_cache_forces_preemption_and_everyone_finishes() -> None:
    model = EngineModel(SMALL, num_gpu_blocks=10)
    for i in range(4):
        prompt = tuple(range(100 * i + 16, 100 * i + 16 + 30))
        model.submit(EngineRequest(f"r{i}", prompt, 60, ignore_eos=True), 0.0)
    events = drain(model)
    assert any(isinstance(e, RequestPreempted) for e in events)
    done = [e for e in events if isinstance(e, RequestFinished)]
    assert sorted(e.request_id for e in done) == ["r0", "r1", "r2", "r3"]
    assert all(e.num_completion_tokens == 60 for e in done)
    assert replay_kv(events) == model.cached_block_hashes()


def _ttft(events: list[EngineEvent], rid: str, submit_s: float) -> float:
    first = next(e for e in events if isinstance(e, TokensGenerated) and e.request_id == rid)
    return first.time_s - submit_s


def test_repeated_prefix_is_served_from_cache_with_lower_ttft() -> None:
    model = EngineModel(H100_8B)
    shared = tuple(range(16, 16 + 3000))
    model.submit(EngineRequest("a", (*shared, 7, 8, 9), 4, ignore_eos=True), 0.0)
    events_a = drain(model)
    prompt_b = (*shared, 70, 80, 90)
    model.submit(EngineRequest("b", prompt_b, 4, ignore_eos=True), 10.0)
    events_b = drain(model)
    sched_b = next(e for e in events_b if isinstance(e, RequestScheduled))
    assert sched_b.num_cached_tokens == 3000 // 16 * 16
    fin_b = next(e for e in events_b if isinstance(e, RequestFinished))
    assert fin_b.num_cached_tokens == sched_b.num_cached_tokens
    assert _ttft(events_b, "b", 10.0) < _ttft(events_a, "a", 0.0) / 3
    stats = model.stats()
    assert stats.prefix_cache_hits_tokens == sched_b.num_cached_tokens
    assert stats.prefix_cache_queries_tokens == 2 * 3003


def test_continuation_on_another_engine_gives_the_same_text() -> None:
    prompt = tuple(range(500, 620))
    engines = [EngineModel(H100_8B, seed=s) for s in (1, 2)]
    engines[0].submit(EngineRequest("full", prompt, 80), 0.0)
    full_events = drain(engines[0])
    full = [t for e in full_events if isinstance(e, TokensGenerated) for t in e.token_ids]
    assert len(full) > 12
    n = 10  # past the prompt's open block (8 tokens): both draw rules are continued
    engines[1].submit(EngineRequest("rest", prompt + tuple(full[:n]), 80 - n), 0.0)
    rest_events = drain(engines[1])
    rest = [t for e in rest_events if isinstance(e, TokensGenerated) for t in e.token_ids]
    assert full[:n] + rest == full
    hashes = [set(replay_kv(ev)) for ev in (full_events, rest_events)]
    assert hashes[0] and hashes[0].isdisjoint(hashes[1])  # per-engine hash seeds differ


def _workload(model: EngineModel, scale: float, emit_tokens: bool = True) -> list[EngineEvent]:
    events = model.start_loading(0.0)
    for i in range(6):
        prompt = tuple(range(20 + 50 * i, 20 + 50 * i + 200 * (i + 1)))
        model.submit(EngineRequest(f"r{i}", prompt, 30), 3.0 * i * scale)
        events += model.advance(3.0 * i * scale, emit_tokens=emit_tokens)
    events += model.abort("r5", 16.0 * scale)
    return events + drain(model, emit_tokens=emit_tokens)


def test_time_scale_multiplies_every_duration_exactly() -> None:
    base = _workload(EngineModel(H100_8B, start_state=EngineState.COLD), 1.0)
    slow = _workload(EngineModel(H100_8B, start_state=EngineState.COLD, time_scale=10), 10.0)
    assert len(base) == len(slow) > 50
    for a, b in zip(base, slow, strict=True):
        assert b.time_s == pytest.approx(10 * a.time_s, rel=1e-9, abs=1e-9)
        assert dataclasses.replace(b, time_s=0.0) == dataclasses.replace(a, time_s=0.0)
    degraded = EngineModel(H100_8B, start_state=EngineState.COLD, time_scale=5)
    degraded.slowdown = 2.0
    assert [e.time_s for e in _workload(degraded, 10.0)] == pytest.approx(
        [e.time_s for e in slow], rel=1e-9
    )


def test_emit_tokens_false_keeps_everything_but_later_tokens() -> None:
    full = _workload(EngineModel(H100_8B, start_state=EngineState.COLD), 1.0)
    lean = _workload(EngineModel(H100_8B, start_state=EngineState.COLD), 1.0, emit_tokens=False)
    seen: set[str] = set()
    expected = []
    for e in full:
        if isinstance(e, TokensGenerated):
            if e.request_id in seen:
                continue  # only the first token of each request stays
            seen.add(e.request_id)
        expected.append(e)
    assert len(seen) == 5 and len(expected) < len(full)
    assert lean == expected


def test_late_caller_sees_the_same_timeline() -> None:
    def run(step_by_step: bool) -> list[EngineEvent]:
        model = EngineModel(H100_8B)
        for i in range(5):
            model.submit(EngineRequest(f"r{i}", tuple(range(16, 16 + 500 * (i + 1))), 20), 0.0)
        return drain(model) if step_by_step else model.advance(1e6)

    assert run(True) == run(False)


def test_cold_start_then_queued_requests_run() -> None:
    profile: EngineProfile = H100_8B
    model = EngineModel(profile, start_state=EngineState.COLD, now=0.0)
    model.submit(EngineRequest("q", (16, 17, 18), 5), 1.0)
    assert model.next_event_time() is None and model.advance(100.0) == []
    assert model.stats().num_waiting == 1
    events = model.start_loading(100.0)
    assert events == [StateChanged(100.0, EngineState.LOADING)]
    ready_s = 100.0 + profile.load_time_s
    assert model.next_event_time() == pytest.approx(ready_s)
    events = model.advance(ready_s + 5.0)
    assert events[0] == StateChanged(pytest.approx(ready_s), EngineState.READY)  # type: ignore[arg-type]
    sched = next(e for e in events if isinstance(e, RequestScheduled))
    assert sched.time_s == pytest.approx(ready_s)
    assert any(isinstance(e, RequestFinished) for e in events)
    assert model.state is EngineState.READY


def test_reset_fails_in_flight_and_clears_the_cache() -> None:
    model = EngineModel(H100_8B)
    for i in range(3):
        prompt = tuple(range(16, 16 + 100 * (i + 1)))  # no EOS: all three still run at reset
        model.submit(EngineRequest(f"r{i}", prompt, 500, ignore_eos=True), 0.0)
    model.advance(0.2)
    assert model.cached_block_hashes()
    events = model.reset(0.25)
    failed = [e for e in events if isinstance(e, RequestFinished)]
    assert {e.request_id for e in failed} == {"r0", "r1", "r2"}
    assert all(e.reason is FinishReason.ERROR for e in failed)
    assert isinstance(events[-2], AllBlocksCleared) and events[-1].state is EngineState.COLD  # type: ignore[union-attr]
    assert model.cached_block_hashes() == frozenset()
    stats = model.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_used_blocks) == (0, 0, 0)
    assert model.next_event_time() is None


def test_stats_report_load() -> None:
    model = EngineModel(SMALL)
    for i in range(6):
        model.submit(EngineRequest(f"r{i}", tuple(range(16, 16 + 10)), 50, ignore_eos=True), 0.0)
    model.advance(model.next_event_time() or 0.0)
    stats = model.stats()
    assert stats.num_running == 4 and stats.num_waiting == 2  # max_num_seqs 4
    assert stats.num_used_blocks > 0 and 0 < stats.kv_usage < 1
    assert stats.num_steps == 1 and stats.block_size == 16
