"""The slot wait's decode steps: the prior until enough calls finished, then the learned mean."""

from __future__ import annotations

import math

import pytest

from inferplane.core.predictor import LatencyPredictor
from inferplane.core.routing_config import PredictorConfig
from tests.core.routing_helpers import view
from tests.core.test_predictor import PRIOR as BASE_PRIOR

PRIOR = BASE_PRIOR.model_copy(update={"max_num_seqs": 8, "mean_output_tokens": 256.0})
STEP_S = 0.01 + 0.001 * 9  # a full batch of 8 plus the new call


def _pred(**kw: object) -> LatencyPredictor:
    return LatencyPredictor(PredictorConfig(default_prior=PRIOR, **kw))  # type: ignore[arg-type]


def _finish(pred: LatencyPredictor, steps: list[int], start: int = 0) -> None:
    """Calls on an idle ``e`` whose decode took each of ``steps`` raw TPOTs."""
    for i, count in enumerate(steps, start):
        est = pred.predict(view("e"), "m", 10, float(i))
        pred.on_dispatch(f"c{i}", "e", 10, est)
        pred.on_first_token(f"c{i}", 0.1, float(i))
        pred.on_finish(f"c{i}", float(i) + count * est.raw_tpot_s)


def _slot_wait_s(pred: LatencyPredictor, excess: int) -> float:
    """The full-batch wait of a cached call, less the first step."""
    est = pred.predict(view("a", in_flight=8 + excess - 1), "m", 0, 1e3)
    return est.wait_s - STEP_S


def test_slot_wait_uses_the_prior_until_enough_calls_finished() -> None:
    pred = _pred(slot_steps_min_calls=5)
    _finish(pred, [20] * 4)
    assert _slot_wait_s(pred, 3) == pytest.approx(3 * 256 * STEP_S / 8)
    _finish(pred, [20], start=4)
    assert pred.slot_steps(PRIOR) == pytest.approx(20)
    assert _slot_wait_s(pred, 3) == pytest.approx(3 * 20 * STEP_S / 8)


def test_dispatched_max_tokens_bound_the_steps_before_any_call_finished() -> None:
    """A fleet's first seconds: no call has finished, but the calls sent asked for at most
    40 tokens, so none holds its slot the prior's 256 steps."""
    pred = _pred(slot_steps_min_calls=5)
    est = pred.predict(view("e"), "m", 10, 0.0)
    for i in range(4):
        pred.on_dispatch(f"c{i}", "e", 10, est, max_output_tokens=40)
    assert pred.slot_steps(PRIOR) == pytest.approx(40)
    assert _slot_wait_s(pred, 3) == pytest.approx(3 * 40 * STEP_S / 8)
    pred.on_dispatch("long", "e", 10, est, max_output_tokens=4000)  # a bound, not a mean
    assert 40 < pred.slot_steps(PRIOR) <= 256
    _finish(pred, [20] * 5, start=10)  # learned: 20 steps, under the bound
    assert pred.slot_steps(PRIOR) == pytest.approx(20)


def test_slot_wait_learned_off_keeps_the_prior() -> None:
    pred = _pred(slot_wait_learned=False, slot_steps_min_calls=1)
    _finish(pred, [20] * 10)
    assert pred.slot_steps(PRIOR) == 256
    assert _slot_wait_s(pred, 2) == pytest.approx(2 * 256 * STEP_S / 8)


def test_learned_steps_may_exceed_the_prior() -> None:
    """The prior is a default, not a bound: calls decoding 600 steps hold slots 600 steps."""
    pred = _pred(slot_steps_min_calls=3)
    _finish(pred, [600] * 3)
    assert pred.slot_steps(PRIOR) == pytest.approx(600)


def test_varied_outputs_count_at_their_mean_not_their_median() -> None:
    pred = _pred(slot_steps_min_calls=1)
    _finish(pred, [10, 40] * 10)  # median (geometric) 20, mean 25
    steps = pred.slot_steps(PRIOR)
    assert steps == pytest.approx(20 * math.exp(math.log(2) ** 2 / 2), rel=1e-6)
    assert 24 < steps < 26


def test_no_call_dominates_and_the_variance_share_is_capped() -> None:
    """The first calls are a running mean (the first is not an EWMA's seed), and one wild
    call moves the mean at most 2x through the variance."""
    pred = _pred(slot_steps_min_calls=1)
    _finish(pred, [10_000] + [20] * 19)
    geometric = math.exp((math.log(10_000) + 19 * math.log(20)) / 20)
    assert pred.slot_steps(PRIOR) == pytest.approx(2 * geometric)
    assert pred.slot_steps(PRIOR) < 70
