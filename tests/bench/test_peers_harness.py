"""The pure parts of the peer scoreboard: workload generation, statistics, report."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from peerlib import workloads as wl
from peerlib.loadgen import RECORD_FIELDS
from peerlib.report import table, target_lines
from peerlib.stats import Row, RunInfo, percentile, prefix_counts, summarize

SCALE = wl.Scale(duration_s=20.0, capacity_tok_s=2000.0, time_scale=10.0)


@pytest.mark.parametrize("kind", list(wl.WorkloadKind))
def test_workloads_are_deterministic_and_seed_dependent(kind: wl.WorkloadKind) -> None:
    a = wl.build(kind, SCALE, seed=7)
    b = wl.build(kind, SCALE, seed=7)
    c = wl.build(kind, SCALE, seed=8)
    assert a == b
    assert json.dumps(wl.to_json(a)) == json.dumps(wl.to_json(b))
    assert a.tasks != c.tasks
    assert a.tasks, "a workload offers some tasks"
    starts = [t.start_s for t in a.tasks]
    assert starts == sorted(starts) and starts[0] >= 0 and starts[-1] < SCALE.duration_s


def test_offered_load_scales_with_the_multiplier() -> None:
    big = wl.Scale(duration_s=100.0, capacity_tok_s=2000.0, time_scale=10.0)
    over = wl.build(wl.WorkloadKind.OVERLOAD, big, seed=1)  # 3x, chat only
    crash = wl.build(wl.WorkloadKind.CRASH, big, seed=1)  # 0.5x, longer chat answers
    assert len(over.tasks) / len(crash.tasks) > 3.0  # 6x the tokens, 2x tokens per chat
    offered_tok_s = wl.expected_output_tokens(over) / big.duration_s
    assert offered_tok_s == pytest.approx(3.0 * big.capacity_tok_s, rel=0.12)


def test_agentic_tasks_grow_context_with_pauses_and_priorities() -> None:
    work = wl.build(wl.WorkloadKind.AGENTIC, wl.Scale(60.0, 2000.0, 10.0), seed=3)
    agents = [t for t in work.tasks if t.kind == "agent"]
    chats = [t for t in work.tasks if t.kind == "chat"]
    assert agents and chats
    for task in agents:
        assert 10 <= len(task.calls) <= 50
        assert task.priority in ("standard", "sheddable")
        assert task.calls[0].pause_s == 0 and all(c.pause_s > 0 for c in task.calls[1:])
        deadlines = [c.deadline_s - 0.04 * 10 * c.max_tokens for c in task.calls]
        assert deadlines == sorted(deadlines), "the prompt part of the budget grows"
    assert {t.priority for t in chats} == {"critical", "standard", "sheddable"}


PROBED = wl.Scale(40.0, 1666.0, 10.0, ttft_at_capacity_s=0.93, tbt_at_capacity_s=0.076)


def test_agentic_offers_its_load_inside_the_window() -> None:
    work = wl.build(wl.WorkloadKind.AGENTIC, PROBED, seed=0)
    asked = sum(wl.tokens_in_window(t, PROBED.duration_s) for t in work.tasks)
    assert asked / (PROBED.capacity_tok_s * PROBED.duration_s) == pytest.approx(1.5, rel=0.02)
    # agents ask for more than that over their whole run: sizing by it offered less than 1x
    assert wl.expected_output_tokens(work) > 1.3 * asked
    assert work.drain_s == wl.agentic_drain_s(PROBED)


def test_tasks_that_cannot_end_by_the_cut_off_are_not_counted() -> None:
    work = wl.build(wl.WorkloadKind.AGENTIC, PROBED, seed=0)
    cutoff_s = PROBED.duration_s + (work.drain_s or 0.0)
    agents = [t for t in work.tasks if t.kind == "agent"]
    for task in work.tasks:
        end_s = task.start_s + sum(c.pause_s + c.deadline_s / wl.DEADLINE_SLACK for c in task.calls)
        assert task.counted == (end_s <= cutoff_s)
    assert all(t.counted for t in work.tasks if t.kind == "chat")  # chat ends in the drain
    assert 0 < sum(t.counted for t in agents) < len(agents)
    assert [t["counted"] for t in wl.to_json(work)["tasks"]] == [t.counted for t in work.tasks]


def test_cascade_mixes_pinned_sessions_into_chat_at_its_load_inside_the_window() -> None:
    work = wl.build(wl.WorkloadKind.CASCADE, PROBED, seed=0)
    asked = sum(wl.tokens_in_window(t, PROBED.duration_s) for t in work.tasks)
    share = asked / (PROBED.capacity_tok_s * PROBED.duration_s)
    assert share == pytest.approx(wl.CASCADE_LOAD, rel=0.02)
    sessions = [t for t in work.tasks if t.kind == "agent"]
    assert len(sessions) / len(work.tasks) == pytest.approx(wl.CASCADE_SESSION_SHARE, abs=0.06)
    assert {t.priority for t in work.tasks} == {"standard"}
    assert work.client.retry_on_timeout and work.client.timeout_factor == 1.0
    assert [f.engine_index for f in work.faults] == [0] and work.drain_s is not None


def test_tokens_in_window_stop_at_the_window() -> None:
    call = wl.Call((("user", "x"),), 10, 1.0, 4.0)  # 1 s pause + 2 s at capacity
    task = wl.Task("t", "x", "agent", "standard", 0.0, (call, call, call))
    assert wl.tokens_in_window(task, 100.0) == 30
    assert wl.tokens_in_window(task, 4.5) == 20  # the third call would start at 7 s
    assert wl.tokens_in_window(task, 0.5) == 0  # still in its first pause


def test_deadlines_follow_the_time_scale() -> None:
    slow = wl.build(wl.WorkloadKind.CRASH, wl.Scale(20.0, 2000.0, 20.0), seed=0)
    fast = wl.build(wl.WorkloadKind.CRASH, wl.Scale(20.0, 2000.0, 10.0), seed=0)
    for a, b in zip(slow.tasks, fast.tasks, strict=True):
        assert a.calls[0].deadline_s == pytest.approx(2 * b.calls[0].deadline_s, rel=1e-3)
    assert [f.engine_index for f in fast.faults] == [0, 3]


def test_deadlines_come_from_the_capacity_probe_when_measured() -> None:
    probed = wl.Scale(20.0, 2000.0, 10.0, ttft_at_capacity_s=1.5, tbt_at_capacity_s=0.1)
    work = wl.build(wl.WorkloadKind.OVERLOAD, probed, seed=1)
    for task in work.tasks:
        (call,) = task.calls
        at_capacity = 1.5 + 0.1 * call.max_tokens
        assert call.deadline_s == pytest.approx(wl.DEADLINE_SLACK * at_capacity, abs=1e-3)
    slower = wl.Scale(20.0, 2000.0, 10.0, ttft_at_capacity_s=1.5, tbt_at_capacity_s=0.2)
    longer = wl.build(wl.WorkloadKind.OVERLOAD, slower, seed=1)
    assert all(
        b.calls[0].deadline_s > a.calls[0].deadline_s
        for a, b in zip(work.tasks, longer.tasks, strict=True)
    )


def test_shared_prefix_customers_share_their_system_prompt() -> None:
    work = wl.build(wl.WorkloadKind.SHARED_PREFIX, SCALE, seed=0)
    by_customer: dict[str, set[str]] = {}
    for task in work.tasks:
        by_customer.setdefault(task.tenant, set()).add(task.calls[0].messages[0][1])
    assert all(len(prompts) == 1 for prompts in by_customer.values())
    assert len({p for ps in by_customer.values() for p in ps}) == len(by_customer) > 1


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(5)
    for n in (1, 2, 7, 100):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None


def _record(
    task: str,
    *,
    ok: bool = True,
    status: int = 200,
    ttft: float | None = 0.1,
    e2e: float = 1.0,
    broken: bool = False,
    attempts: int = 1,
) -> list[Any]:
    values = {
        "task_id": task,
        "kind": "chat",
        "priority": "standard",
        "start_s": 0.0,
        "ttft_s": ttft,
        "e2e_s": e2e,
        "ok": ok,
        "in_deadline": ok,
        "status": status,
        "attempts": attempts,
        "tokens": 10 if ok else 0,
        "broken": broken,
        "timed_out": False,
        "max_gap_s": 0.01,
        "deadline_s": 2.0,
    }
    return [values[f] for f in RECORD_FIELDS]


def _result() -> dict[str, Any]:
    records = [
        _record("a", ttft=0.1),
        _record("b", ttft=0.3, attempts=2),
        _record("c", ok=False, status=429, ttft=None, attempts=3),
        _record("d", ok=False, ttft=0.2, broken=True),
    ]
    tasks = [
        ["a", "chat", "standard", True],
        ["b", "chat", "standard", True],
        ["c", "chat", "standard", False],
        ["d", "chat", "standard", False],
    ]
    return {
        "fields": list(RECORD_FIELDS),
        "records": records,
        "tasks": tasks,
        "unfinished_tasks": 1,
        "elapsed_s": 10.0,
        "tbt_p99_s": 0.05,
    }


def test_summarize_counts_outcomes() -> None:
    info = RunInfo(
        "x", "overload", tasks_offered=5, window_s=2.0, fleet_usd_per_hour=36.0, time_scale=10.0
    )
    row = summarize(info, _result(), (30.0, 120.0))
    assert (row.tasks_ok, row.calls, row.calls_ok) == (2, 4, 2)
    assert row.goodput_tasks_s == pytest.approx(1.0)
    assert row.success_rate == pytest.approx(2 / 5)  # the unfinished task's call counts
    assert (row.rejected, row.failed, row.broken, row.unfinished) == (1, 1, 1, 1)
    assert (row.streams_started, row.streams_completed) == (3, 2)
    assert row.retries == 3
    assert row.prefix_hit_rate == pytest.approx(0.25)
    assert row.ttft_p50_s == pytest.approx(0.2)
    spend = 36.0 * 2.0 / 10.0 / 3600.0
    assert row.cost_per_task_usd == pytest.approx(spend / 2)
    assert row.output_tok_s == pytest.approx(2.0)


def test_prefix_counts_sum_labelled_counters() -> None:
    text = (
        "# HELP vllm:prefix_cache_hits_total x\n"
        'vllm:prefix_cache_hits_total{model_name="m"} 30.0\n'
        'vllm:prefix_cache_queries_total{model_name="m"} 100.0\n'
        "vllm:prefix_cache_hits_created 1.7e9\n"
    )
    assert prefix_counts(text) == (30.0, 100.0)


def _row(gateway: str, goodput: float, cost: float | None, broken: int = 0) -> Row:
    info = RunInfo(gateway, "agentic", 4, 2.0, 36.0, 10.0)
    base = summarize(info, _result(), None)
    data = {
        **base.to_json(),
        "goodput_tasks_s": goodput,
        "cost_per_task_usd": cost,
        "broken": broken,
    }
    return Row(**data)


def test_targets_compare_against_the_best_peer() -> None:
    rows = [
        _row("inferplane", 3.0, 0.5),
        _row("sglang-router cache_aware", 1.5, 1.0),
        _row("litellm", 2.5, 0.8),
    ]
    lines = target_lines("agentic", rows)
    assert "1.20x best peer (litellm)" in lines[0] and "MISS" in lines[0]
    assert "0.62x best peer (litellm)" in lines[1] and "PASS" in lines[1]
    crash = target_lines("crash", [_row("inferplane", 1.0, 1.0, broken=1)])
    assert "MISS" in crash[0]
    md = table(rows)
    assert len(md) == 2 + len(rows) and md[2].startswith("| inferplane | 3.000 |")


def test_inferplane_variant_rows_change_only_the_named_knob(tmp_path: Path) -> None:
    from peerlib import gateways as gw

    engines = [{"name": "e-0", "url": "http://127.0.0.1:1"}]
    plain = gw._inferplane_cmd(engines, 9000, tmp_path)
    plain_cfg = json.loads((tmp_path / "inferplane.yaml").read_text())
    assert "routing" not in plain_cfg and plain[1:3] == ["-m", "inferplane.cli"]
    gw._inferplane_cmd(engines, 9000, tmp_path, "weights.kv_cache=12+weights.load=0.5")
    weights = json.loads((tmp_path / "inferplane.yaml").read_text())["routing"]["weights"]
    assert weights == {"kv_cache": 12.0, "load": 0.5}
    ttl = gw._inferplane_cmd(engines, 9000, tmp_path, "speculative_ttl_s=30")
    assert ttl[1].endswith("inferplane_variant.py") and ttl[2] == "speculative_ttl_s=30"


def test_variant_knobs_parse_and_reject_unknown_names() -> None:
    from peerlib.inferplane_variant import parse_knobs

    assert parse_knobs("approximate_ttl_s=5+speculative_ttl_s=30") == {
        "approximate_ttl_s": 5.0,
        "speculative_ttl_s": 30.0,
    }
    with pytest.raises(SystemExit):
        parse_knobs("max_num_seqs=16")  # batch slots travel in the endpoint configs


def test_breakdown_puts_every_offered_task_in_one_outcome() -> None:
    from peerlib.breakdown import OUTCOMES, breakdown, by_priority

    def late(task: str, **kw: Any) -> list[Any]:
        rec = dict(zip(RECORD_FIELDS, _record(task, **kw), strict=True))
        rec["in_deadline"] = False
        return [rec[f] for f in RECORD_FIELDS]

    result = _result()
    result["records"] += [
        late("q", ttft=1.5, e2e=3.0),  # waited 1.5 s of a 2 s deadline for its first token
        late("s", ttft=0.2, e2e=3.0),  # started in time, decoded too slowly
        late("r", ttft=0.2, e2e=3.0, attempts=2),
    ]
    result["tasks"] += [[t, "chat", "sheddable", False] for t in ("q", "s", "r")]
    counts = breakdown(result, tasks_offered=8)
    assert set(counts) == set(OUTCOMES) and sum(counts.values()) == 8
    assert counts["ok"] == 2 and counts["429"] == 1 and counts["broken"] == 1
    assert (counts["late, queued"], counts["late, slow decode"], counts["late, retried"]) == (
        1,
        1,
        1,
    )
    assert counts["cut off"] == 1  # offered but never reported by the load generator
    assert by_priority(result) == {"standard": (2, 4), "sheddable": (0, 3)}


def test_config_variant_sets_one_leaf_and_keeps_its_siblings(tmp_path: Path) -> None:
    from peerlib import gateways as gw

    from inferplane.config import FleetConfig

    engine = {"name": "e-0", "url": "http://127.0.0.1:1", "models": ["m"], "gpu": "h100"}
    engines = [{**engine, "price_per_hour_usd": 2.0}]
    share_of = "cfg.admission.headroom.slot_share"
    variant = f"{share_of}.standard=0.2+{share_of}.sheddable=0.25"
    gw._inferplane_cmd(engines, 9000, tmp_path, variant)
    cfg = json.loads((tmp_path / "inferplane.yaml").read_text())
    share = FleetConfig.model_validate(cfg).admission.headroom.slot_share
    assert (share.critical, share.standard, share.sheddable) == (0.0, 0.2, 0.25)


def test_named_variant_expands_to_its_config(tmp_path: Path) -> None:
    from peerlib import gateways as gw

    engines = [{"name": "e-0", "url": "http://127.0.0.1:1"}]
    gw._inferplane_cmd(engines, 9000, tmp_path, "fit16")
    share = json.loads((tmp_path / "inferplane.yaml").read_text())["admission"]["headroom"]
    assert share["slot_share"] == {"critical": 0.0, "standard": 0.07, "sheddable": 0.13}
    assert "tpot_share" not in share  # decode protection as the defaults
    assert gw.parse_spec("inferplane:fit16").label == "inferplane fit16"


def test_a_variant_sets_a_plain_admission_field_alone(tmp_path: Path) -> None:
    from peerlib import gateways as gw

    engines = [{"name": "e-0", "url": "http://127.0.0.1:1"}]
    gw._inferplane_cmd(engines, 9000, tmp_path, "cfg.admission.edf_overtake_share=0")
    cfg = json.loads((tmp_path / "inferplane.yaml").read_text())
    assert cfg["admission"] == {"edf_overtake_share": 0.0}


def test_router_rows_can_turn_on_the_routers_own_concurrency_limit() -> None:
    from peerlib import gateways as gw

    spec = gw.parse_spec("sglang-router:cache_aware+limit=128+queue=0")
    cmd = gw._router_cmd(spec, Path("python"), ["http://a"], 9000)
    i = cmd.index("--policy")
    assert cmd[i + 1 : i + 6] == [
        "cache_aware",
        "--max-concurrent-requests",
        "128",
        "--queue-size",
        "0",
    ]
    plain = gw._router_cmd(gw.parse_spec("vllm-router"), Path("python"), ["http://a"], 9000)
    assert "--max-concurrent-requests" not in plain and "cache_aware" in plain


def test_long_prompts_add_the_engines_prefill_time_to_the_deadline() -> None:
    from inferplane.engine.perf import PerfModel
    from inferplane.engine.profiles import load_profile

    probed = wl.Scale(20.0, 2000.0, 10.0, ttft_at_capacity_s=1.0, tbt_at_capacity_s=0.1)
    work = wl.build(wl.WorkloadKind.SHARED_PREFIX, probed, seed=2)
    call = work.tasks[0].calls[0]
    extra = wl.DEADLINE_SLACK * (call.deadline_s / wl.DEADLINE_SLACK - 1.0 - 0.1 * call.max_tokens)
    prefill_s = PerfModel(load_profile("llama-3-8b", "h100")).prefill_s(2040 - 300) * 10.0
    # what the engine model needs to prefill the extra tokens, within 25% (rounded up)
    assert prefill_s <= extra / wl.DEADLINE_SLACK <= 1.25 * prefill_s
