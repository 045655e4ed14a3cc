"""The simulated predictor feed: profile priors tell GPUs apart, observations calibrate."""

from __future__ import annotations

import pytest

from inferplane.core.predictor import LatencyPredictor
from inferplane.core.types import CallContext, PriorityClass
from inferplane.sim.calibration import PredictorFeed
from tests.core.routing_helpers import view

MODEL = "llama-3-8b"


def _call(rid: str, prompt: int = 1000, keys: tuple[int, ...] = ()) -> CallContext:
    return CallContext(
        rid, "t", MODEL, PriorityClass.CRITICAL, 0.0, prompt, 500, prompt_block_keys=keys
    )


class OneMatch:
    """A prefix index that holds ``blocks`` leading blocks of every prompt on one endpoint."""

    def __init__(self, endpoint: str, blocks: int) -> None:
        self.endpoint, self.blocks = endpoint, blocks

    def match(self, keys: object, endpoints: object) -> dict[str, int]:
        return {self.endpoint: self.blocks}


def test_priors_make_the_slower_decoder_predict_slower() -> None:
    pred = LatencyPredictor()
    h100, a100 = view("h", model=MODEL, gpu="h100"), view("a", model=MODEL, gpu="a100")
    before = [pred.predict(v, MODEL, 1000, 0.0) for v in (h100, a100)]
    assert before[0].tpot_s == before[1].tpot_s  # the default prior: every GPU alike
    feed = PredictorFeed(pred)
    assert feed.set_priors([h100.info, a100.info, view("x", gpu="tpu9").info], {}) == 2
    fast, slow = (pred.predict(v, MODEL, 1000, 0.0) for v in (h100, a100))
    assert slow.tpot_s > 1.3 * fast.tpot_s
    assert slow.prefill_s > 2 * fast.prefill_s


def test_observed_decode_speed_calibrates_tpot() -> None:
    pred = LatencyPredictor()
    ep = view("a", model=MODEL, gpu="a100")
    feed = PredictorFeed(pred)
    feed.set_priors([ep.info], {})
    predicted = pred.predict(ep, MODEL, 1000, 0.0).tpot_s
    end_s = 0.0
    for i in range(30):  # every call decodes 3x slower than predicted
        t0 = 0.1 * i
        feed.dispatched(f"r{i}", _call(f"r{i}"), ep, t0)
        feed.first_token(f"r{i}", t0 + 0.5)
        feed.first_token(f"r{i}", t0 + 0.7)  # later tokens do not count as the first
        end_s = t0 + 0.5 + 3 * predicted * 99
        feed.finished(f"r{i}", end_s, 100)
    assert pred.tpot_factor("a", end_s) == pytest.approx(3.0, rel=0.1)
    assert pred.num_pending() == 0


def test_unstarted_calls_leave_the_queued_prefill_when_they_end() -> None:
    pred = LatencyPredictor()
    ep = view("h", model=MODEL, gpu="h100")
    feed = PredictorFeed(pred)
    feed.dispatched("r", _call("r", prompt=4000), ep, 0.0)
    assert pred.queued_tokens(ep) == 4000
    feed.finished("r", 5.0, 0)  # timed out before its first token
    assert pred.queued_tokens(ep) == 0
    assert pred.num_pending() == 0


def test_cached_prefix_is_not_queued_as_prefill() -> None:
    pred = LatencyPredictor()
    ep = view("h", model=MODEL, gpu="h100")
    feed = PredictorFeed(pred, OneMatch("h", blocks=10), block_size=16)
    feed.dispatched("r", _call("r", prompt=1000, keys=(1, 2, 3)), ep, 0.0)
    assert pred.queued_tokens(ep) == 1000 - 160
