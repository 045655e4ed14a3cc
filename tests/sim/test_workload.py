"""Workload generators: rates, lengths, burstiness, agentic context growth, shared prefixes.

Statistical checks use a fixed seed and tolerances several standard errors wide, so they
test the parameters, not the luck of one draw.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from pathlib import Path
from typing import Any

from inferplane.config import parse_config
from inferplane.core.prefix_blocks import block_keys
from inferplane.engine.generation import fill
from inferplane.sim.calibrated import CalibratedSimulation
from inferplane.sim.prompts import KeySpace, segment
from inferplane.sim.scenario import (
    AgenticSource,
    ChatSource,
    CodeSource,
    Demand,
    LengthDist,
    LongContextSource,
    parse_scenario,
)
from inferplane.sim.workload import (
    AgenticTasks,
    CallSpec,
    ChatCalls,
    CodeCalls,
    LongContextCalls,
    SourceBase,
    diurnal_factor,
    sample_length,
)


def _base(name: str = "s", seed: int = 1, limit: int = 1_000_000, **demand: Any) -> SourceBase:
    return SourceBase(name, random.Random(seed), KeySpace(0), Demand(**demand), limit)


def _arrivals(source: Any, until_s: float) -> list[tuple[float, CallSpec]]:
    out = []
    while (nxt := source.next_arrival()) is not None and nxt[0] < until_s:
        out.append(nxt)
    return out


def test_chat_rate_and_lengths_match_parameters() -> None:
    src = ChatSource.model_validate(
        {"name": "chat", "kind": "chat", "rate_rps": 5.0,
         "prompt_tokens": {"median": 1000, "sigma": 0.6},
         "output_tokens": {"median": 129, "sigma": 0.5}}
    )  # fmt: skip
    arrivals = _arrivals(ChatCalls(src, _base()), 2000.0)
    rate = len(arrivals) / 2000.0
    assert abs(rate - 5.0) < 0.25  # ~10,000 arrivals: sd of the rate ~0.05
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert 0.9 < cv < 1.1  # Poisson
    logs = [math.log(len(spec.prompt_token_ids)) for _, spec in arrivals]
    assert abs(math.exp(statistics.median(logs)) - 1000) < 60
    assert abs(statistics.pstdev(logs) - 0.6) < 0.05
    outs = sorted(spec.max_tokens for _, spec in arrivals)
    assert abs(outs[len(outs) // 2] - 129) < 10


def test_code_is_bursty() -> None:
    src = CodeSource.model_validate({"name": "code", "kind": "code"})
    arrivals = _arrivals(CodeCalls(src, _base()), 3000.0)
    per_second = [0] * 3000
    for t, _ in arrivals:
        per_second[int(t)] += 1
    empty = sum(c == 0 for c in per_second) / len(per_second)
    assert empty > 0.6  # Azure code: ~73% of seconds empty
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    assert statistics.pstdev(gaps) / statistics.mean(gaps) > 3  # far burstier than Poisson


def test_diurnal_modulation_shapes_the_rate() -> None:
    src = ChatSource.model_validate(
        {"name": "c", "kind": "chat", "rate_rps": 10,
         "diurnal": {"period_s": 400, "amplitude": 0.8}}
    )  # fmt: skip
    times = [t for t, _ in _arrivals(ChatCalls(src, _base()), 400.0)]
    peak = sum(50 <= t < 150 for t in times)  # sin > 0.7 around t = 100
    trough = sum(250 <= t < 350 for t in times)  # around t = 300
    assert peak > 3 * trough
    assert diurnal_factor(src.diurnal, 100.0) == 1.8


def test_demand_knobs_scale_users_calls_and_tokens() -> None:
    src = ChatSource.model_validate(
        {"name": "c", "kind": "chat", "rate_rps": 2, "prompt_tokens": 100, "output_tokens": 10}
    )
    plain = _arrivals(ChatCalls(src, _base()), 500.0)
    scaled = _arrivals(ChatCalls(src, _base(users_x=3.0, tokens_x=2.0)), 500.0)
    assert 2.5 < len(scaled) / len(plain) < 3.5
    assert {len(s.prompt_token_ids) for _, s in scaled} == {200}
    assert {s.max_tokens for _, s in scaled} == {20}


def _agent_source(**over: Any) -> AgenticSource:
    data = {"name": "a", "kind": "agentic", "users": 100, "tasks_per_user_per_hour": 36,
            "calls_per_task": [3, 6], "system_prompt_tokens": 500, "first_input_tokens": 300,
            "tool_result_tokens": 200, "output_tokens": 50, "tool_pause_s": 1.0}  # fmt: skip
    data.update(over)
    return AgenticSource.model_validate(data)


def test_agentic_context_grows_and_shares_the_system_prompt() -> None:
    tasks = AgenticTasks(_agent_source(), _base())
    _t0, first = tasks.next_arrival() or (0.0, None)
    assert first is not None and first.step == 0 and 3 <= first.steps <= 6
    _, other = tasks.next_arrival() or (0.0, None)
    assert other is not None
    system = first.prompt_token_ids[:500]
    assert other.prompt_token_ids[:500] == system  # shared across tasks
    assert other.prompt_token_ids[500:516] != first.prompt_token_ids[500:516]
    spec, pauses = first, []
    while (nxt := tasks.follow_up(spec, True)) is not None:
        delay, follow = nxt
        pauses.append(delay)
        assert follow.task_id == first.task_id and follow.step == spec.step + 1
        assert follow.prompt_token_ids[: len(spec.prompt_token_ids)] == spec.prompt_token_ids
        assert len(follow.prompt_token_ids) == len(spec.prompt_token_ids) + 50 + 200
        spec = follow
    assert spec.step == first.steps - 1 and len(pauses) == first.steps - 1
    assert all(p >= 0 for p in pauses)


def test_agentic_failure_ends_the_task_and_context_is_compacted_at_the_limit() -> None:
    tasks = AgenticTasks(_agent_source(calls_per_task=40), _base(limit=4000))
    _, spec = tasks.next_arrival() or (0.0, None)
    assert spec is not None
    lengths = []
    for _ in range(39):
        nxt = tasks.follow_up(spec, True)
        assert nxt is not None
        spec = nxt[1]
        lengths.append(len(spec.prompt_token_ids))
        assert len(spec.prompt_token_ids) + spec.max_tokens <= 4000
    assert min(lengths) < max(lengths) - 500  # it compacted at least once
    assert tasks.follow_up(spec, True) is None  # last call done
    _, spec2 = tasks.next_arrival() or (0.0, None)
    assert spec2 is not None and tasks.follow_up(spec2, False) is None
    assert tasks.open_tasks() == 0


def test_long_context_documents_are_shared_prefixes() -> None:
    src = LongContextSource.model_validate(
        {"name": "d", "kind": "long_context", "rate_rps": 5, "num_documents": 3,
         "document_tokens": 2000, "question_tokens": 50}
    )  # fmt: skip
    specs = [s for _, s in _arrivals(LongContextCalls(src, _base()), 20.0)]
    prefixes = {s.prompt_token_ids[:2000] for s in specs}
    assert 1 < len(prefixes) <= 3
    assert len({s.prompt_token_ids for s in specs}) == len(specs)  # questions differ


def test_segments_and_length_sampling() -> None:
    assert segment(7, 100) == segment(7, 100)
    assert segment(7, 100)[0] != segment(8, 100)[0]
    assert segment(7, 50) == segment(7, 100)[:50]
    assert all(16 <= t < 32_000 for t in segment(123456789, 3000))
    dist = LengthDist.model_validate(
        {"median": 100, "sigma": 2, "min_tokens": 5, "max_tokens": 300}
    )
    rng = random.Random(3)
    values = [sample_length(dist, rng) for _ in range(2000)]
    assert min(values) == 5 and max(values) == 300


def test_agentic_prompts_and_keys_kept_incrementally_match_a_rebuild() -> None:
    """A task's prompt and its block keys are extended step by step (a new key chain after
    each compaction): the same token ids as its segments, the same keys as hashing it all."""
    tasks = AgenticTasks(_agent_source(calls_per_task=40), _base(limit=4000))
    _, spec = tasks.next_arrival() or (0.0, None)
    assert spec is not None
    chains: list[object] = []  # kept alive, so their ids stay distinct
    for _ in range(39):
        task = tasks._tasks[spec.task_id]
        rebuilt = tuple(t for key, n in task.segments for t in segment(key, n))
        assert spec.prompt_token_ids == rebuilt
        assert spec.block_keys() == tuple(block_keys(spec.prompt_token_ids))
        chains.append(spec.chain)
        nxt = tasks.follow_up(spec, True)
        assert nxt is not None
        spec = nxt[1]
    assert len({id(c) for c in chains}) > 1  # compacted: a fresh chain, keys still match


def test_agentic_resend_answers_carries_the_engines_answer_verbatim() -> None:
    """With ``resend_answers`` the next prompt is the previous one, the content-free
    engine's answer to it (``generation.fill`` at its position) and a fresh tool result."""
    tasks = AgenticTasks(_agent_source(resend_answers=True), _base())
    _, spec = tasks.next_arrival() or (0.0, None)
    assert spec is not None
    plain = AgenticTasks(_agent_source(), _base())
    _, plain_spec = plain.next_arrival() or (0.0, None)
    assert plain_spec is not None and plain_spec.prompt_token_ids == spec.prompt_token_ids
    while (nxt := tasks.follow_up(spec, True)) is not None:
        follow, n = nxt[1], len(spec.prompt_token_ids)
        assert follow.prompt_token_ids[:n] == spec.prompt_token_ids
        assert follow.prompt_token_ids[n : n + 50] == tuple(fill(n, 50))
        assert len(follow.prompt_token_ids) == n + 50 + 200
        assert follow.block_keys() == tuple(block_keys(follow.prompt_token_ids))
        plain_nxt = plain.follow_up(plain_spec, True)
        assert plain_nxt is not None
        plain_spec = plain_nxt[1]  # without it: fresh tokens where the answer was
        assert plain_spec.prompt_token_ids[n : n + 50] != follow.prompt_token_ids[n : n + 50]
        spec = follow


def test_resent_answers_hit_the_engines_cache(tmp_path: Path) -> None:
    """One agent task on one engine: each follow-up finds its previous prompt cached, and
    with ``resend_answers`` the previous answer too (the full blocks of both, but for the
    answer's last token, whose KV the engine never computes)."""
    fleet = parse_config({"gateway": {"auth": {"mode": "anonymous"}}, "endpoints": [
        {"name": "e0", "url": "http://127.0.0.1:9000", "gpu": "h100",
         "price_per_hour_usd": 2.0, "models": ["llama-3-8b"]}]})  # fmt: skip
    cached: dict[bool, list[tuple[int, int, int]]] = {}
    for resend in (False, True):
        source = _agent_source(users=1, tasks_per_user_per_hour=36_000, calls_per_task=5,
                               resend_answers=resend, stop_s=0.5)  # fmt: skip
        scenario = parse_scenario(
            {"name": "s", "fleet": "x", "duration_s": 30.0, "drain_s": 60,
             "policies": ["inferplane"], "workload": [source.model_dump()]}
        )  # fmt: skip
        records = CalibratedSimulation(scenario, fleet, tmp_path, "inferplane").run().records
        first = min(r.task_id for r in records)
        task = sorted((r for r in records if r.task_id == first), key=lambda r: r.step)
        assert [r.step for r in task] == [0, 1, 2, 3, 4]
        cached[resend] = [(r.prompt_tokens, r.cached_tokens, r.completion_tokens) for r in task]
    for resend, steps in cached.items():
        for (prompt, _, answer), (_, hit, _) in itertools.pairwise(steps):
            held = prompt + answer - 1 if resend else prompt  # the last token is never fed
            assert hit >= held // 16 * 16, (resend, steps)
    assert sum(c for _, c, _ in cached[True]) > sum(c for _, c, _ in cached[False])
