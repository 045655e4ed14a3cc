"""The simulator's speed knobs: patched views, kept pool capacity, routing candidates."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import yaml

from inferplane.config import load_config, parse_config
from inferplane.core.admission_config import AdmissionConfig
from inferplane.core.capacity import pool_capacity
from inferplane.core.headroom import HeadroomDemand, HeldConfigs
from inferplane.core.predictor import LatencyPredictor
from inferplane.core.types import EndpointLoad, EndpointState, PriorityClass
from inferplane.sim.capacity import CapacityBook
from inferplane.sim.fleet import Fleet
from inferplane.sim.records import Outcome
from inferplane.sim.runner import Simulation
from inferplane.sim.scenario import load_scenario
from inferplane.sim.views import ViewBook

from .helpers import write_scenario


def _fleet(n: int) -> Fleet:
    endpoints = [
        {"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}", "gpu": "h100" if i % 2 else "a100",
         "price_per_hour_usd": 2.0, "models": ["llama-3-8b"]}
        for i in range(n)
    ]  # fmt: skip
    config = parse_config({"gateway": {"auth": {"mode": "anonymous"}}, "endpoints": endpoints})
    return Fleet(config, 1, 0.1)


def test_views_are_patched_per_change_and_pools_are_shared() -> None:
    fleet = _fleet(4)
    book = ViewBook(fleet)
    book.rebuild(0.0)
    pool = book.pool("llama-3-8b")
    assert [v.name for v in pool] == ["e0", "e1", "e2", "e3"]
    before = pool[2]
    fleet.endpoints[2].in_flight += 3
    assert pool[2] is before  # not before the reader asks
    views = book.current(0.01)
    assert pool[2].in_flight == 3 and views[2] is pool[2] and pool[1] is book.views[1]
    fleet.endpoints[1].draining = True
    book.current(0.02)
    assert pool[1].state is EndpointState.DRAINING
    fleet.endpoints[1].stopped_s = 0.03
    assert [v.name for v in book.current(0.03)] == ["e0", "e2", "e3"]  # re-listed
    fleet.add_replica("e0", 0.04)
    assert [v.name for v in book.current(0.04)][-1] == "e0+1"


def _shifted(book: ViewBook, rng: random.Random) -> None:
    """Random load on random endpoints, as calls and scrapes would leave it."""
    for ep in book.fleet.endpoints:
        ep.load = EndpointLoad(rng.randrange(4), rng.randrange(40), rng.random(), 0.0)


def _held_variants(base: AdmissionConfig) -> list[AdmissionConfig]:
    """The config in force as admission's holds switch with demand (as HeldConfigs does)."""
    held = HeldConfigs(base, HeadroomDemand(base.headroom))
    return [held._slots_for((std, shed)) for std in (False, True) for shed in (False, True)]


def test_kept_capacity_matches_the_core_after_every_change() -> None:
    fleet = _fleet(12)
    book = ViewBook(fleet)
    predictor, base = LatencyPredictor(), AdmissionConfig()
    variants = [base, *_held_variants(base)]
    kept = CapacityBook(book, predictor, base, best_of=12)
    rng = random.Random(4)
    _shifted(book, rng)
    book.rebuild(0.0)
    for step in range(80):
        ep = fleet.endpoints[rng.randrange(12)]
        ep.in_flight = max(0, ep.in_flight + rng.choice((-1, 1, 2)))
        book.current(step * 0.01)
        pool = book.pool("llama-3-8b")
        prio = rng.choice(list(PriorityClass))
        tokens = rng.randrange(0, 4000)
        cfg = rng.choice(variants)
        got = kept("llama-3-8b", tokens, pool, predictor, cfg, 0.0, prio)
        want = pool_capacity("llama-3-8b", tokens, pool, predictor, cfg, 0.0, prio)
        assert got.num_accepting == want.num_accepting and got.free_slots == want.free_slots
        assert got.best == want.best
        for field in ("engine_saturation", "prefill_tokens_per_s", "output_tokens_per_s"):
            assert abs(getattr(got, field) - getattr(want, field)) <= 1e-6 * (
                1 + abs(getattr(want, field))
            )
    assert {key[0] for key in kept._pools} == {id(c) for c in variants}  # kept, not recomputed


def test_kept_capacity_falls_through_for_a_pool_it_does_not_keep() -> None:
    fleet = _fleet(3)
    book = ViewBook(fleet)
    predictor, cfg = LatencyPredictor(), AdmissionConfig()
    kept = CapacityBook(book, predictor, cfg, best_of=1)
    book.rebuild(0.0)
    other = [dataclasses.replace(v, in_flight=5) for v in book.pool("llama-3-8b")]
    std = PriorityClass.STANDARD
    got = kept("llama-3-8b", 100, other, predictor, cfg, 0.0, std)
    assert got == pool_capacity("llama-3-8b", 100, other, predictor, cfg, 0.0, std)


def _run(tmp: Path, **over: Any) -> Simulation:
    path = write_scenario(tmp, **over)
    sc = load_scenario(path)
    sim = Simulation(sc, load_config(path.parent / sc.fleet), path.parent, "inferplane")
    sim.run()
    return sim


BIG_FLEET = {
    "gateway": {"auth": {"mode": "anonymous"}},
    "endpoints": [
        {"name": f"h{i}", "url": f"http://127.0.0.1:{9100 + i}", "gpu": "h100",
         "price_per_hour_usd": 3.0, "region": "east", "models": ["llama-3-8b"]}
        for i in range(24)
    ],
}  # fmt: skip
BUSY = {
    "duration_s": 12, "drain_s": 30, "faults": [],
    "workload": [
        {"name": "chat", "kind": "chat", "rate_rps": 40, "slo": {"ttft_s": 2.0}},
        {"name": "agents", "kind": "agentic", "users": 3000, "tasks_per_user_per_hour": 6,
         "calls_per_task": [3, 6], "system_prompt_tokens": 600, "first_input_tokens": 300,
         "tool_result_tokens": 100, "output_tokens": 60, "tool_pause_s": 0.5},
    ],
}  # fmt: skip


def _big(tmp: Path, speed: dict[str, Any]) -> Simulation:
    (tmp / "big.yaml").write_text(yaml.safe_dump(BIG_FLEET), encoding="utf-8")
    return _run(tmp, fleet="big.yaml", speed=speed, **BUSY)


def test_fast_knobs_are_deterministic_and_close_to_exact(tmp_path: Path) -> None:
    exact = _big(tmp_path, {"sync_s": 0, "route_candidates": 0})
    fast = _big(tmp_path, {"sync_s": 0.25, "route_candidates": 4, "admission_best_of": 2})
    again = _big(tmp_path, {"sync_s": 0.25, "route_candidates": 4, "admission_best_of": 2})
    assert fast.ledger.records == again.ledger.records
    assert fast.counters["syncs"] < exact.counters["syncs"] / 5
    ok = {
        name: sum(r.outcome is Outcome.SUCCESS for r in sim.ledger.records)
        for name, sim in (("exact", exact), ("fast", fast))
    }
    assert ok["exact"] > 300
    assert abs(ok["fast"] - ok["exact"]) <= 0.03 * ok["exact"]
    ttft = {
        name: sorted(r.ttft_s for r in sim.ledger.records if r.ttft_s is not None)
        for name, sim in (("exact", exact), ("fast", fast))
    }
    p50 = {k: v[len(v) // 2] for k, v in ttft.items()}
    assert abs(p50["fast"] - p50["exact"]) <= 0.15 * p50["exact"]
    spread = {len({r.endpoint for r in fast.ledger.records if r.endpoint})}
    assert spread == {24}  # sampling still reaches the whole pool


def test_index_bounds_cover_every_block_the_fleet_can_cache(tmp_path: Path) -> None:
    """Past ``max_engine_hashes`` the index clears an endpoint: at 48 H100s (~1.3M blocks)
    the default 2M would do so mid-run; the simulator sizes both bounds to the fleet."""
    fleet = {**BIG_FLEET, "endpoints": [
        {**BIG_FLEET["endpoints"][0], "name": f"h{i}", "url": f"http://127.0.0.1:{9100 + i}"}
        for i in range(48)
    ]}  # fmt: skip
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(fleet), encoding="utf-8")
    path = write_scenario(tmp_path, fleet="big.yaml", **{**BUSY, "duration_s": 0.1})
    sc = load_scenario(path)
    sim = Simulation(sc, load_config(path.parent / sc.fleet), path.parent, "inferplane")
    assert sim.kv is not None
    blocks = sum(ep.engine.num_gpu_blocks for ep in sim.fleet.endpoints)
    assert blocks > 1_000_000
    config = sim.kv.index.config
    assert config.max_entries >= 2 * blocks and config.max_engine_hashes >= 2 * blocks


def test_predictor_shortcuts_give_the_floats_of_the_formulas() -> None:
    """The predictor's per-``now`` factor cache and ``idle_terms`` (the capacity book's one
    lookup) answer exactly what the uncached factors and the separate methods give, over a
    random history of observations at repeated instants."""
    rng = random.Random(5)
    pred = LatencyPredictor()
    views = _fleet(3)
    book = ViewBook(views)
    book.rebuild(0.0)
    now, pending = 0.0, []
    for i in range(1500):
        v = rng.choice(book.views)
        f_ttft, f_tpot = pred.ttft_factor(v.name, now), pred.tpot_factor(v.name, now)
        prior = pred.prior(v, "llama-3-8b")
        probe = max(0, 5000) / prior.prefill_tokens_per_s * f_ttft
        assert pred.prefill_s(v, "llama-3-8b", 5000, now) == probe
        out = prior.throughput_tokens_per_s / f_tpot
        assert pred.throughput_tokens_per_s(v, "llama-3-8b", now) == out
        empty = pred.predict(dataclasses.replace(v), "llama-3-8b", 0, now).ttft_s
        assert pred.idle_terms(v, "llama-3-8b", 5000, now) == (prior, probe, out, empty)
        op = rng.randrange(4)
        if op == 0:
            est = pred.predict(v, "llama-3-8b", 800, now)
            pred.on_dispatch(f"r{i}", v.name, 800, est)
            pending.append(f"r{i}")
        elif op == 1 and pending:
            pred.on_first_token(rng.choice(pending), rng.uniform(0.01, 2.0), now)
        elif op == 2 and pending:
            pred.on_finish(pending.pop(rng.randrange(len(pending))), now, rng.uniform(0.005, 0.05))
        else:
            now += rng.choice((0.0, 0.01, 3.0))
    assert pred.ttft_factor("e0", now) != 1.0  # the history did calibrate
