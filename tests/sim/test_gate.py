"""Admission in the simulator: the gates' rules, the runner's wiring, KV events, fast-forward."""

from __future__ import annotations

from pathlib import Path

from inferplane.config import load_config
from inferplane.core.admission_config import AdmissionConfig
from inferplane.core.predictor import LatencyPredictor
from inferplane.core.prefix_index import block_keys
from inferplane.core.types import (
    CallContext,
    EndpointInfo,
    EndpointLoad,
    EndpointState,
    EndpointView,
    EngineKind,
    PriorityClass,
)
from inferplane.engine.model import EngineModel
from inferplane.engine.profiles import load_profile
from inferplane.engine.types import EngineRequest
from inferplane.sim import runner, sync
from inferplane.sim.gate import CoreGate, OpenGate, PriorityShedGate, make_gate
from inferplane.sim.kvfeed import KVFeed, to_core
from inferplane.sim.records import Outcome
from inferplane.sim.scenario import load_scenario

from .helpers import write_scenario


def _view(name: str, waiting: int, kv: float) -> EndpointView:
    info = EndpointInfo(name, "http://x", EngineKind.VLLM, ("m",), "h100", 3.0, "r")
    return EndpointView(info, EndpointState.READY, EndpointLoad(waiting, 4, kv, 0.0))


def _call(priority: PriorityClass) -> CallContext:
    return CallContext("r1", "t", "m", priority, 0.0, 100, 10)


def test_priority_shed_rejects_only_sheddable_at_saturation() -> None:
    gate = PriorityShedGate()
    busy = [_view("a", 10, 0.1), _view("b", 0, 0.8)]  # max(2, .125)=2, max(0, 1)=1: mean 1.5
    calm = [_view("a", 2, 0.1), _view("b", 0, 0.4)]  # 0.4 and 0.5: mean 0.45
    shed = gate.admit(_call(PriorityClass.SHEDDABLE), busy, 0.0)
    assert type(shed).__name__ == "Reject" and shed.status == 429  # type: ignore[union-attr]
    assert type(gate.admit(_call(PriorityClass.SHEDDABLE), calm, 0.0)).__name__ == "Admit"
    for prio in (PriorityClass.CRITICAL, PriorityClass.STANDARD):
        assert type(gate.admit(_call(prio), busy, 0.0)).__name__ == "Admit"


def test_policies_get_their_gates() -> None:
    cfg, pred = AdmissionConfig(), LatencyPredictor()
    assert isinstance(make_gate("inferplane", cfg, pred), CoreGate)
    assert isinstance(make_gate("priority-shed", cfg, pred), PriorityShedGate)
    assert type(make_gate("fcfs", cfg, pred)) is OpenGate
    assert type(make_gate("round-robin", cfg, pred)) is OpenGate


def test_engine_kv_events_make_the_prefix_index_match_the_engine() -> None:
    engine = EngineModel(load_profile("llama-3-8b", "h100"), seed=1)
    prompt = tuple(range(100, 100 + 16 * 5 + 3))  # five full blocks and a partial one
    engine.submit(EngineRequest("a", prompt, 4, 0, ignore_eos=True), 0.0)
    feed = KVFeed(engine.profile.block_size)
    feed.add_endpoint("e")
    t = engine.next_event_time()
    while t is not None:
        events = [to_core(ev) for ev in engine.advance(t)]
        feed.apply("e", [ev for ev in events if ev is not None], t)
        t = engine.next_event_time()
    keys = block_keys(prompt)
    assert len(keys) == 5 and feed.index.match(keys, ["e"])["e"] == 5
    other = block_keys(tuple(range(200, 200 + 16 * 5)))
    assert feed.index.match(other, ["e"])["e"] == 0


def _run(tmp: Path, policy: str, **over: object) -> runner.Simulation:
    path = write_scenario(tmp, **over)
    sc = load_scenario(path)
    sim = runner.Simulation(sc, load_config(path.parent / sc.fleet), path.parent, policy)
    sim.run()
    return sim


OVERLOAD = {
    "duration_s": 15, "drain_s": 30, "faults": [],
    "policies": ["inferplane", "fcfs", "priority-shed"],
    "workload": [
        {"name": "vip", "kind": "chat", "rate_rps": 2, "priority": "critical",
         "slo": {"ttft_s": 3.0}, "output_tokens": 200},
        {"name": "bulk", "kind": "chat", "rate_rps": 60, "priority": "sheddable",
         "slo": {"ttft_s": 3.0}, "output_tokens": 400},
    ],
}  # fmt: skip


def test_inferplane_sheds_and_queues_under_overload_and_every_call_ends_once(
    tmp_path: Path,
) -> None:
    sim = _run(tmp_path, "inferplane", **OVERLOAD)
    records = sim.ledger.records
    assert len({r.call_id for r in records}) == len(records) == sim._next_call_id
    bulk = [r for r in records if r.source == "bulk"]
    vip = [r for r in records if r.source == "vip"]
    assert any(r.outcome is Outcome.REJECTED for r in bulk)
    assert all(r.reason != "saturated" for r in vip)  # critical is never shed
    assert any(r.queue_s > 0 for r in records)
    fcfs = _run(tmp_path, "fcfs", **OVERLOAD)
    assert not any(r.outcome is Outcome.REJECTED for r in fcfs.ledger.records)
    ok = [r for r in vip if r.outcome is Outcome.SUCCESS and (r.ttft_s or 99) <= 3.0]
    fcfs_vip = [r for r in fcfs.ledger.records if r.source == "vip"]
    fcfs_ok = [r for r in fcfs_vip if r.outcome is Outcome.SUCCESS and (r.ttft_s or 99) <= 3.0]
    assert len(ok) / len(vip) > len(fcfs_ok) / len(fcfs_vip)  # critical calls fare better


def test_fast_forward_changes_no_record(tmp_path: Path) -> None:
    """Exact mode (a sync before every call): leaping engines change nothing."""
    results = {}
    for leap in (False, True):
        sync.FAST_FORWARD = leap
        try:
            results[leap] = _run(tmp_path, "inferplane", duration_s=15, speed={"sync_s": 0})
        finally:
            sync.FAST_FORWARD = True
    assert results[True].ledger.records == results[False].ledger.records
    assert results[True].counters["engine_wakes"] * 3 < results[False].counters["engine_wakes"]
    feed = results[True].kv
    assert feed is not None and feed.events_applied > 0
