"""The simulated predictor feed: profile priors tell GPUs apart, observations calibrate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferplane.config import load_config
from inferplane.core.predictor import LatencyEstimate, LatencyPredictor
from inferplane.core.types import CallContext, PriorityClass
from inferplane.sim.calibrated import CalibratedSimulation
from inferplane.sim.calibration import PredictorFeed
from inferplane.sim.scenario import load_scenario
from tests.core.routing_helpers import view
from tests.sim.helpers import write_scenario

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


def test_the_feed_counts_what_the_endpoint_held_before_the_route_was_guessed(
    tmp_path: Path,
) -> None:
    """As the gateway's ``on_dispatch``: the cached prompt is matched before the route's own
    guesses enter the index (after them, every prompt would look fully cached)."""
    path = write_scenario(tmp_path, duration_s=15, drain_s=10, faults=[])
    sc = load_scenario(path)
    sim = CalibratedSimulation(sc, load_config(path.parent / sc.fleet), path.parent, "inferplane")
    assert sim.feed is not None
    seen: list[tuple[int, int]] = []  # (prompt tokens, uncached tokens) per dispatch
    on_dispatch = sim.feed.predictor.on_dispatch
    prompts: dict[str, int] = {}

    def spy(
        key: str, endpoint: str, uncached: int, estimate: LatencyEstimate, max_out: int | None
    ) -> None:
        seen.append((prompts[key], uncached))
        on_dispatch(key, endpoint, uncached, estimate, max_out)

    dispatched = sim.feed.dispatched

    def keep(key: str, call: CallContext, *args: Any) -> None:
        prompts[key] = call.num_prompt_tokens
        dispatched(key, call, *args)

    sim.feed.predictor.on_dispatch = spy  # type: ignore[method-assign]
    sim.feed.dispatched = keep  # type: ignore[method-assign]
    sim.run()
    assert len(seen) > 30
    cold = sum(1 for prompt, uncached in seen if uncached >= prompt - 16)
    assert cold > 0.2 * len(seen)  # first calls of tasks and chats are not cached anywhere
    assert any(0 < uncached < prompt - 16 for prompt, uncached in seen)  # later agent steps
