"""Continuous batching: token budget, chunked prefill, admission order, preemption."""

from __future__ import annotations

import pytest

from inferplane.engine.generation import TokenGenerator
from inferplane.engine.kvcache import BlockPool
from inferplane.engine.scheduler import Scheduler
from inferplane.engine.sequence import SeqStatus, StepPlan
from inferplane.engine.types import (
    EngineEvent,
    EngineRequest,
    RequestFinished,
    RequestPreempted,
    RequestScheduled,
    TokensGenerated,
)


def make(
    num_blocks: int = 64,
    *,
    block_size: int = 4,
    max_num_seqs: int = 8,
    budget: int = 64,
    priority: bool = False,
    max_model_len: int = 1000,
) -> Scheduler:
    return Scheduler(
        BlockPool(num_blocks, block_size, seed=3),
        TokenGenerator(mean_output_tokens=1000),
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        priority_scheduling=priority,
    )


def req(
    rid: str, n: int, max_tokens: int = 10, *, first: int = 100, priority: int = 0
) -> EngineRequest:
    prompt = tuple(range(first, first + n))
    return EngineRequest(rid, prompt, max_tokens, priority=priority, ignore_eos=True)


def step(s: Scheduler, t: float) -> tuple[StepPlan, list[EngineEvent]]:
    plan = s.schedule(t)
    assert plan is not None
    plan.end_s = t + 1.0
    return plan, plan.events + s.complete(plan)


def scheduled_tokens(plan: StepPlan) -> dict[str, int]:
    return {q.request.request_id: n for q, n in zip(plan.seqs, plan.num_new, strict=True)}


def test_long_prompt_is_prefilled_in_chunks_within_the_budget() -> None:
    s = make(budget=64)
    s.add(req("a", 200), 0.0)
    sizes = []
    first_token_step = None
    for i in range(6):
        plan, events = step(s, float(i))
        sizes.append(scheduled_tokens(plan)["a"])
        if first_token_step is None and any(isinstance(e, TokensGenerated) for e in events):
            first_token_step = i
    assert sizes == [64, 64, 64, 8, 1, 1]
    assert first_token_step == 3


def test_decodes_are_served_before_new_prefills() -> None:
    s = make(budget=32)
    s.add(req("a", 8), 0.0)
    step(s, 0.0)  # a prefilled, now decoding
    s.add(req("b", 100, first=500), 1.0)
    plan, _ = step(s, 1.0)
    assert scheduled_tokens(plan) == {"a": 1, "b": 31}


def test_max_num_seqs_caps_the_batch() -> None:
    s = make(max_num_seqs=3, budget=1000)
    for i in range(5):
        s.add(req(f"r{i}", 8, first=100 * i + 16), 0.0)
    plan, _ = step(s, 0.0)
    assert len(plan.seqs) == 3 and s.num_waiting == 2


def test_fcfs_head_of_line_blocks_and_priority_mode_reorders() -> None:
    for priority, expected in [(False, ["a", "b", "c"]), (True, ["c", "b", "a"])]:
        s = make(max_num_seqs=1, budget=1000, priority=priority)
        for rid, prio in [("a", 2), ("b", 1), ("c", 0)]:
            s.add(req(rid, 8, max_tokens=1, first=ord(rid) * 50, priority=prio), 0.0)
        order = []
        for t in range(3):
            plan, _ = step(s, float(t))
            order += [q.request.request_id for q in plan.seqs]
        assert order == expected


def test_out_of_blocks_preempts_the_latest_arrival_which_then_finishes() -> None:
    s = make(num_blocks=6, block_size=4, budget=100)
    s.add(req("old", 8, max_tokens=12, first=100), 0.0)
    s.add(req("new", 8, max_tokens=12, first=300), 0.0)
    events: list[EngineEvent] = []
    for t in range(60):
        if not s.has_work():
            break
        plan = s.schedule(float(t))
        assert plan is not None
        plan.end_s = t + 1.0
        events += plan.events + s.complete(plan)
    preempted = [e.request_id for e in events if isinstance(e, RequestPreempted)]
    assert preempted and set(preempted) == {"new"}
    finished = {e.request_id: e for e in events if isinstance(e, RequestFinished)}
    assert set(finished) == {"old", "new"}
    assert all(f.num_completion_tokens == 12 for f in finished.values())
    assert s.num_preemptions == len(preempted)
    scheduled = [e.request_id for e in events if isinstance(e, RequestScheduled)]
    assert sorted(scheduled) == ["new", "old"]  # once each, despite the preemption


def test_cached_prefix_skips_prefill_but_never_the_last_token() -> None:
    s = make(block_size=4, budget=1000)
    s.add(req("a", 8, max_tokens=1), 0.0)  # exactly two blocks
    step(s, 0.0)
    s.add(req("b", 8, max_tokens=1), 1.0)
    plan, events = step(s, 1.0)
    sched = next(e for e in events if isinstance(e, RequestScheduled))
    assert sched.num_cached_tokens == 4  # one block reused, the last block recomputed
    assert scheduled_tokens(plan) == {"b": 4}
    s.add(req("c", 12, max_tokens=1), 2.0)
    plan, events = step(s, 2.0)
    assert scheduled_tokens(plan) == {"c": 4}  # 8 of 12 prompt tokens cached
    assert s.prefix_hits_tokens == 4 + 8
    assert s.prefix_queries_tokens == 8 + 8 + 12


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (EngineRequest("x", (), 5), "empty"),
        (EngineRequest("x", (5,), 0), "max_tokens"),
        (EngineRequest("x", tuple(range(16, 1016)), 5), "maximum context length"),
        (EngineRequest("x", (16, 40_000), 5), "token ids"),
    ],
)
def test_invalid_requests_are_refused(request_: EngineRequest, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make().add(request_, 0.0)


def test_prompt_that_never_fits_and_duplicate_ids_are_refused() -> None:
    s = make(num_blocks=4, block_size=4, max_model_len=100)
    with pytest.raises(ValueError, match="never fits"):
        s.add(req("big", 16), 0.0)
    s.add(req("a", 8), 0.0)
    with pytest.raises(ValueError, match="already in flight"):
        s.add(req("a", 8), 0.0)


def test_abort_waiting_and_running() -> None:
    s = make(max_num_seqs=1)
    s.add(req("run", 8), 0.0)
    s.add(req("wait", 8, first=400), 0.0)
    step(s, 0.0)
    (fin,) = s.abort("wait", 1.0)
    assert isinstance(fin, RequestFinished) and fin.num_completion_tokens == 0
    (fin,) = s.abort("run", 1.0)
    assert isinstance(fin, RequestFinished) and fin.num_completion_tokens == 1
    assert s.abort("run", 1.0) == []
    assert not s.has_work() and s.schedule(2.0) is None
    assert s.get("run") is None


def test_sequence_stops_at_the_context_limit() -> None:
    s = make(max_model_len=20, budget=100)
    s.add(req("a", 15, max_tokens=100), 0.0)
    for t in range(10):
        if not s.has_work():
            break
        _, events = step(s, float(t))
    fin = next(e for e in events if isinstance(e, RequestFinished))
    assert fin.num_completion_tokens == 5 and fin.reason.value == "length"
    assert s.running == [] and SeqStatus.FINISHED


def test_priority_mode_preempts_the_lowest_priority_even_if_it_arrived_first() -> None:
    s = make(num_blocks=5, block_size=4, budget=100, priority=True)
    s.add(req("low", 6, max_tokens=20, first=100, priority=5), 0.0)
    step(s, 0.0)  # low runs alone, 2 blocks
    s.add(req("high", 6, max_tokens=20, first=300, priority=0), 1.0)
    events: list[EngineEvent] = []
    for t in range(1, 80):
        if not s.has_work():
            break
        events += step(s, float(t))[1]
    preempted = {e.request_id for e in events if isinstance(e, RequestPreempted)}
    assert preempted == {"low"}
    finished = [e.request_id for e in events if isinstance(e, RequestFinished)]
    assert finished == ["high", "low"]
