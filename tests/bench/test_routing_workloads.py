"""The pure parts of the routing benchmark: its two workloads, the oracle hit rate and the
summaries of engine counters and KV samples (bench/routing*.py)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from routing_client import counter_summary, kv_summary, percentile
from routing_workloads import (
    BLOCK_TOKENS,
    AgentShape,
    SentCall,
    agent_first_messages,
    agent_sessions,
    agent_system_prompt,
    lru_hit_rate,
    oracle_hit_rate,
    prefix_calls,
    prefix_messages,
    tenant_prompt,
    tool_message,
)

from inferplane.tokenizer import apply_chat_template

SHAPE = AgentShape(
    session_rate_per_s=2.0, duration_s=10.0, kinds=3, system_words=60, min_steps=2,
    max_steps=5, tool_words=(10, 30), tool_pause_mean_s=0.5,
)  # fmt: skip


def test_agent_sessions_are_seeded_and_within_the_shape() -> None:
    a, b, c = agent_sessions(7, SHAPE), agent_sessions(7, SHAPE), agent_sessions(8, SHAPE)
    assert a == b
    assert a != c
    assert len(a) > 5
    assert [s.start_s for s in a] == sorted(s.start_s for s in a)
    assert len({s.session_id for s in a}) == len(a)
    for s in a:
        assert 0 <= s.start_s < SHAPE.duration_s
        assert SHAPE.min_steps <= s.num_steps <= SHAPE.max_steps
        assert len(s.pauses_s) == len(s.tool_results) == s.num_steps - 1
        assert 0 <= s.kind < SHAPE.kinds
        assert all(p > 0 for p in s.pauses_s)


def _session_prompts(answer: str) -> list[list[int]]:
    """The token ids of every call of the first session, answering each with ``answer``."""
    session = agent_sessions(7, SHAPE)[0]
    messages = agent_first_messages(session, agent_system_prompt(session.kind, 60))
    prompts = [apply_chat_template(messages)]
    for step in range(2, session.num_steps + 1):
        messages += [{"role": "assistant", "content": answer},
                     tool_message(session, step, session.tool_results[step - 2])]  # fmt: skip
        prompts.append(apply_chat_template(messages))
    return prompts


def test_each_agent_call_extends_the_previous_prompt_and_answer() -> None:
    prompts = _session_prompts("call search policy7")
    assert len(prompts) >= 2
    for before, after in itertools.pairwise(prompts):
        assert len(after) > len(before)
        assert after[: len(before)] == before


def test_the_oracle_counts_reuse_of_prompts_and_answers() -> None:
    session = agent_sessions(7, SHAPE)[0]
    system = agent_system_prompt(session.kind, 60)
    first = agent_first_messages(session, system)
    answer = " ".join(["ledger"] * 40)  # 40 tokens: two full blocks past the prompt
    second = [*first, {"role": "assistant", "content": answer}, tool_message(session, 2, "ok")]
    # Alone, nothing is reused; the same prompt twice hits all its full blocks.
    assert oracle_hit_rate([SentCall(first, answer)]) == 0.0
    n = len(apply_chat_template(first))
    twice = oracle_hit_rate([SentCall(first, None), SentCall(first, None)])
    assert twice == (n // BLOCK_TOKENS * BLOCK_TOKENS) / (2 * n)
    # The answer is cached with its prompt, so the next call hits more than the prompt.
    with_answer = oracle_hit_rate([SentCall(first, answer), SentCall(second, answer)])
    without = oracle_hit_rate([SentCall(first, None), SentCall(second, answer)])
    assert with_answer > without > 0.0


def test_prefix_workload_is_seeded_poisson_over_tenants() -> None:
    calls = prefix_calls(7, rate_per_s=20.0, duration_s=10.0, tenants=4)
    assert calls == prefix_calls(7, 20.0, 10.0, 4)
    assert 120 < len(calls) < 280
    assert {tenant for _, tenant, _ in calls} == {0, 1, 2, 3}
    assert all(0 < t < 10.0 for t, _, _ in calls)
    prompts = [tenant_prompt(i, 50) for i in range(4)]
    sent = [SentCall(prefix_messages(prompts[t], q), None) for _, t, q in calls]
    assert 0.5 < oracle_hit_rate(sent) < 1.0


def test_fleet_lru_reference_grows_with_memory_up_to_the_oracle() -> None:
    calls = prefix_calls(7, rate_per_s=20.0, duration_s=5.0, tenants=6)
    prompts = [tenant_prompt(i, 100) for i in range(6)]
    sent = [SentCall(prefix_messages(prompts[t], q), None, s, s) for s, t, q in calls]
    prompt_blocks = len(apply_chat_template(sent[0].messages)) // BLOCK_TOKENS
    rates = [lru_hit_rate(sent, blocks) for blocks in (1, 2 * prompt_blocks, 10**6)]
    total_tokens = sum(len(apply_chat_template(c.messages)) for c in sent)
    assert rates[0] <= BLOCK_TOKENS * len(sent) / total_tokens  # one block: one hit at most
    assert rates[0] < rates[1] < rates[2]  # two tenants' prompts of six fit
    assert rates[2] == oracle_hit_rate(sent)  # unbounded LRU is the oracle


def test_counter_and_kv_summaries() -> None:
    zero = {"prefix_cache_hits": 0.0, "prefix_cache_queries": 0.0, "request_success": 0.0,
            "num_preemptions": 0.0}  # fmt: skip
    after = [
        {**zero, "prefix_cache_hits": 30.0, "prefix_cache_queries": 40.0, "request_success": 3},
        {**zero, "prefix_cache_hits": 10.0, "prefix_cache_queries": 60.0, "num_preemptions": 2},
    ]
    summary = counter_summary([zero, zero], after)
    assert summary["prefix_hit_rate"] == 40.0 / 100.0
    assert summary["engine_requests"] == [3, 0]
    assert summary["engine_uncached_tokens"] == [10, 50]
    assert summary["preemptions"] == 2
    kv = kv_summary([[0.95, 0.2], [0.5, 0.4], []])
    assert kv["kv_samples"] == 2
    assert kv["kv_imbalanced_samples"] == 1
    assert kv["kv_max_usage"] == 0.95
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 3.0
    assert percentile([], 0.9) is None
