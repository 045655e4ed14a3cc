"""The predictor's memo: a repeated question gets the very answer a fresh prediction gives.

The reference is the same predictor asked about an equal copy of the view (another object,
hence never memoised), after the same history of observations.
"""

from __future__ import annotations

import dataclasses
import random

from inferplane.core.predictor import LatencyEstimate, LatencyPredictor
from inferplane.core.routing_config import PredictorConfig
from inferplane.core.types import EndpointView
from tests.core.routing_helpers import view
from tests.core.test_predictor import PRIOR


def _pred() -> LatencyPredictor:
    return LatencyPredictor(PredictorConfig(default_prior=PRIOR, half_life_s=10.0))


def test_asking_twice_returns_the_same_estimate_until_an_observation() -> None:
    pred, a = _pred(), view("a", running=3)
    first = pred.predict(a, "m", 500, 1.0)
    assert pred.predict(a, "m", 500, 1.0) is first
    assert pred.predict(a, "m", 501, 1.0) is not first  # another question
    assert pred.predict(a, "m", 500, 1.5) is not first
    pred.on_dispatch("r1", "a", 500, first)
    queued = pred.predict(a, "m", 500, 1.0)
    assert queued.wait_s > first.wait_s  # the dispatched prefill is now ahead


def _fresh(pred: LatencyPredictor, v: EndpointView, tokens: int, now: float) -> LatencyEstimate:
    return pred.predict(dataclasses.replace(v), "m", tokens, now)


def test_calibration_and_priors_end_the_memo() -> None:
    pred, a = _pred(), view("a")
    first = pred.predict(a, "m", 1000, 0.0)
    pred.on_dispatch("r1", "a", 1000, first)
    queued = pred.predict(a, "m", 1000, 0.0)
    assert queued != first and queued == _fresh(pred, a, 1000, 0.0)
    pred.on_first_token("r1", 3 * first.raw_ttft_s, 0.0)  # three times slower than predicted
    started = pred.predict(a, "m", 1000, 0.0)
    assert started.prefill_s > first.prefill_s  # calibrated: slower prefill
    assert started == _fresh(pred, a, 1000, 0.0)
    pred.on_finish("r1", 0.0, tpot_s=5 * first.raw_tpot_s)
    finished = pred.predict(a, "m", 1000, 0.0)
    assert finished.tpot_s > started.tpot_s and finished == _fresh(pred, a, 1000, 0.0)
    pred.set_prior("a", PRIOR.model_copy(update={"prefill_tokens_per_s": 1000.0}))
    slow = pred.predict(a, "m", 1000, 0.0)
    assert slow.prefill_s > finished.prefill_s and slow == _fresh(pred, a, 1000, 0.0)


def test_memoised_predictions_equal_fresh_ones_over_random_histories() -> None:
    rng = random.Random(11)
    pred = _pred()
    views = [view(n, running=r, waiting=w) for n in "ab" for r in (0, 5) for w in (0, 2)]
    now, pending = 0.0, []
    for i in range(2000):
        v = rng.choice(views)
        tokens = rng.choice((0, 100, 2000))
        memo = pred.predict(v, "m", tokens, now)
        fresh = pred.predict(dataclasses.replace(v), "m", tokens, now)
        assert memo == fresh
        op = rng.randrange(5)
        if op == 0:
            pred.on_dispatch(f"r{i}", v.name, tokens, memo)
            pending.append(f"r{i}")
        elif op == 1 and pending:
            pred.on_first_token(rng.choice(pending), rng.uniform(0.01, 1.0), now)
        elif op == 2 and pending:
            pred.on_finish(pending.pop(rng.randrange(len(pending))), now, tpot_s=0.02)
        elif op == 3:
            now += rng.choice((0.001, 1.0))
