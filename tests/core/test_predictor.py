"""The latency predictor: the model's terms, queued work, robust decaying calibration."""

from __future__ import annotations

import pytest

from inferplane.core.predictor import LatencyPredictor
from inferplane.core.routing_config import EndpointPrior, PredictorConfig
from tests.core.routing_helpers import view

PRIOR = EndpointPrior(
    prefill_tokens_per_s=10_000.0,
    chunk_tokens=1000,
    decode_base_s=0.01,
    decode_per_seq_s=0.001,
    decode_full_kv_s=0.02,
    throughput_tokens_per_s=2000.0,
)


def _pred(**kw: object) -> LatencyPredictor:
    return LatencyPredictor(PredictorConfig(default_prior=PRIOR, **kw))  # type: ignore[arg-type]


def test_idle_endpoint_is_own_prefill_and_base_decode() -> None:
    est = _pred().predict(view("a"), "m", 2000, 0.0)
    step_s = 0.01 + 0.001  # batch of one; the first token needs one step
    assert est.tpot_s == pytest.approx(step_s)
    assert est.prefill_s == pytest.approx(0.2) and est.wait_s == pytest.approx(step_s)
    assert est.ttft_s == pytest.approx(0.2 + step_s)
    assert est.e2e_s(11) == pytest.approx(0.2 + step_s + 10 * step_s)


def test_tpot_grows_with_batch_and_kv() -> None:
    pred = _pred()
    small = pred.predict(view("a", running=1, kv=0.0), "m", 10, 0.0).tpot_s
    big = pred.predict(view("a", running=99, kv=0.5), "m", 10, 0.0).tpot_s
    assert small == pytest.approx(0.01 + 0.002)
    assert big == pytest.approx(0.01 + 0.1 + 0.01)


def test_running_decodes_interfere_with_prefill() -> None:
    pred = _pred()
    alone = pred.predict(view("a"), "m", 2000, 0.0).ttft_s
    busy = pred.predict(view("a", running=100), "m", 2000, 0.0)
    # 100 decodes take 100 of 1000 tokens per step and add 2 chunks x 100 x 1 ms.
    step_s = 0.01 + 0.001 * 101
    assert busy.ttft_s == pytest.approx(0.2 + 0.2 * 100 / 900 + 0.2 + step_s)
    assert busy.ttft_s > alone


def test_dispatched_work_queues_until_first_token() -> None:
    pred = _pred()
    a = view("a")
    first = pred.predict(a, "m", 3000, 0.0)
    pred.on_dispatch("r1", "a", 3000, first)
    queued = pred.predict(a, "m", 1000, 0.0)
    assert queued.wait_s == pytest.approx(0.3 + 0.011)
    assert queued.ttft_s == pytest.approx(0.4 + 0.011)
    pred.on_first_token("r1", first.raw_ttft_s, 0.3)  # as predicted: factor stays 1
    assert pred.predict(a, "m", 1000, 0.3).wait_s == pytest.approx(0.011)
    pred.on_finish("r1", 1.0)
    assert pred.num_pending() == 0


def test_engine_reported_queue_counts_when_larger() -> None:
    pred = _pred()
    est = pred.predict(view("a", waiting=4), "m", 0, 0.0)
    step_s = 0.01 + 0.001 * 5
    # slots are free (chunked prefill): the queue waits for the step's token budget only
    assert est.wait_s == pytest.approx(4 * 512 / 10_000 + step_s)


def test_a_queue_beside_full_kv_waits_for_slots() -> None:
    pred = _pred()
    est = pred.predict(view("a", waiting=4, kv=0.95), "m", 0, 0.0)
    step_s = 0.01 + 0.001 * 5 + PRIOR.decode_full_kv_s * 0.95
    slot_s = 5 * 256 * step_s / 256  # no room to start another: wait for 5 calls to finish
    assert est.wait_s == pytest.approx(4 * 512 / 10_000 + slot_s + step_s)


def test_full_batch_waits_for_a_slot_even_when_cached() -> None:
    pred = LatencyPredictor(
        PredictorConfig(default_prior=PRIOR.model_copy(update={"max_num_seqs": 8}))
    )
    free = pred.predict(view("a", running=4), "m", 0, 0.0)
    full = pred.predict(view("a", in_flight=40), "m", 0, 0.0)
    step_s = 0.01 + 0.001 * 9
    assert full.wait_s == pytest.approx(33 * 256 * step_s / 8 + step_s)
    assert free.wait_s < 0.02 < full.wait_s


def test_priors_most_specific_wins() -> None:
    h200 = EndpointPrior(prefill_tokens_per_s=20_000.0)
    pair = EndpointPrior(prefill_tokens_per_s=40_000.0)
    own = EndpointPrior(prefill_tokens_per_s=80_000.0)
    cfg = PredictorConfig(default_prior=PRIOR, priors={"h200": h200, "big@h200": pair})
    pred = LatencyPredictor(cfg)
    v = view("x", gpu="h200")
    assert pred.prior(v, "m") is h200
    assert pred.prior(v, "big") is pair
    assert pred.prior(view("y", gpu="a100"), "m") is PRIOR
    pred.set_prior("x", own)
    assert pred.prior(v, "big") is own


def _observe(pred: LatencyPredictor, rid: str, times_prior: float, now: float) -> None:
    est = pred.predict(view("a"), "m", 1000, now)
    pred.on_dispatch(rid, "a", 1000, est)
    pred.on_first_token(rid, est.raw_ttft_s * times_prior, now)
    pred.on_finish(rid, now)


def test_calibration_converges_to_observed_ratio() -> None:
    pred = _pred()
    for i in range(60):
        _observe(pred, f"r{i}", 2.0, float(i))  # the engine is 2x slower than its prior
    assert pred.ttft_factor("a", 60.0) == pytest.approx(2.0, rel=0.02)
    est = pred.predict(view("a"), "m", 1000, 60.0)
    assert est.ttft_s == pytest.approx(2.0 * est.raw_ttft_s, rel=0.02)
    assert pred.ttft_factor("other", 60.0) == 1.0


def test_one_outlier_moves_the_factor_a_bounded_step() -> None:
    pred = _pred(ewma_alpha=0.2, clip_ratio=4.0)
    _observe(pred, "r", 1000.0, 0.0)  # 1000x the prediction
    assert pred.ttft_factor("a", 0.0) == pytest.approx(4.0**0.2)


def test_calibration_decays_toward_the_prior() -> None:
    pred = _pred(half_life_s=10.0)
    for i in range(40):
        _observe(pred, f"r{i}", 3.0, 0.0)
    at_once = pred.ttft_factor("a", 0.0)
    assert at_once > 2.5
    assert pred.ttft_factor("a", 10.0) == pytest.approx(at_once**0.5)
    assert pred.ttft_factor("a", 1000.0) == pytest.approx(1.0, abs=1e-6)


def test_tpot_calibrates_from_finish() -> None:
    pred = _pred()
    for i in range(60):
        est = pred.predict(view("a"), "m", 10, float(i))
        pred.on_dispatch(f"r{i}", "a", 10, est)
        pred.on_finish(f"r{i}", float(i), tpot_s=est.raw_tpot_s * 0.5)
    assert pred.tpot_factor("a", 60.0) == pytest.approx(0.5, rel=0.02)
    assert pred.throughput_tokens_per_s(view("a"), "m", 60.0) == pytest.approx(4000.0, rel=0.02)


def test_pending_is_bounded_and_unqueues_on_eviction() -> None:
    pred = _pred(max_pending=3)
    a = view("a")
    est = pred.predict(a, "m", 100, 0.0)
    for i in range(10):
        pred.on_dispatch(f"r{i}", "a", 100, est)
    assert pred.num_pending() == 3
    assert pred.queued_tokens(a) == 300


def test_garbage_observations_are_ignored() -> None:
    pred = _pred()
    est = pred.predict(view("a"), "m", 1000, 0.0)
    pred.on_dispatch("r", "a", 1000, est)
    pred.on_first_token("r", float("nan"), 0.0)
    pred.on_first_token("unknown", 1.0, 0.0)
    pred.on_finish("r", 0.0, tpot_s=-1.0)
    assert pred.ttft_factor("a", 0.0) == 1.0 and pred.tpot_factor("a", 0.0) == 1.0


def _learn_steps(pred: LatencyPredictor, steps: int, raw_tpot_s: float, calls: int) -> None:
    """Calls on ``e`` whose decode (first token to finish) took ``steps`` raw TPOTs."""
    for i in range(calls):
        est = pred.predict(view("e"), "m", 10, float(i))
        pred.on_dispatch(f"c{i}", "e", 10, est)
        pred.on_first_token(f"c{i}", 0.1, float(i))
        pred.on_finish(f"c{i}", float(i) + steps * est.raw_tpot_s)
    assert est.raw_tpot_s == pytest.approx(raw_tpot_s)


def test_queue_wait_counts_calls_ahead_at_the_healthy_decode_pace() -> None:
    """A KV-bound engine (it queues, or its KV is full): a new call waits for (queued + 1)
    running calls to finish, one every (decode steps x raw TPOT / running)."""
    pred = _pred()
    assert pred.decode_steps() is None
    # before any call finished, the wait of a KV-bound engine is unknown, not 0 ...
    assert pred.queue_wait_s(view("a", running=4, waiting=3), "m", 0.02) is None
    assert pred.queue_wait_s(view("a", running=4, kv=0.95), "m", 0.02) is None
    # ... while an engine with room left has none to know
    assert pred.queue_wait_s(view("a", running=4, kv=0.5), "m", 0.02) == 0.0
    _learn_steps(pred, 20, 0.011, calls=3)
    assert pred.decode_steps() == pytest.approx(20)
    queued = pred.queue_wait_s(view("a", running=4, waiting=3), "m", 0.02)
    assert queued is not None and queued == pytest.approx((3 + 1) * 20 * 0.02 / 4)
    full = pred.queue_wait_s(view("a", running=4, kv=0.95), "m", 0.02)
    assert full == pytest.approx(20 * 0.02 / 4)
    assert pred.queue_wait_s(view("a", running=4, kv=0.5), "m", 0.02) == 0.0  # room left
    # the routing prediction does not include it
    assert pred.predict(view("a", running=4, waiting=3), "m", 10, 9.0).ttft_s < queued


def test_decode_steps_follow_calls_with_a_bounded_step() -> None:
    pred = _pred()
    _learn_steps(pred, 20, 0.011, calls=20)
    assert pred.decode_steps() == pytest.approx(20)
    _learn_steps(pred, 100, 0.011, calls=1)  # one 5x slow call: a twentieth in log, and
    steps = pred.decode_steps()  # the variance it adds (the mean of a log-normal)
    assert steps is not None and 20 * 5**0.05 < steps < 20 * 5**0.1
