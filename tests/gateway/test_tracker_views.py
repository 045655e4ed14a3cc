"""The tracker's view cache: reused while nothing changed, rebuilt on every change it shows.

Each test checks the cached views against what a fresh build shows (a tracker built the
same way that never answered before), so a cache that missed a change fails here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from inferplane.config import parse_config
from inferplane.core.types import EndpointState
from inferplane.gateway.tracker import EndpointTracker

METRICS = (
    "vllm:num_requests_waiting {w}\nvllm:num_requests_running {r}\nvllm:kv_cache_usage_perc 0.5\n"
)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _Resp:
    text_body: str
    status: int = 200

    async def __aenter__(self) -> _Resp:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def text(self, errors: str = "strict") -> str:
        return self.text_body


class _Session:
    """Answers every GET with the metrics text it was last given."""

    def __init__(self) -> None:
        self.body = METRICS.format(w=0, r=0)

    def get(self, url: str, timeout: Any = None) -> _Resp:
        return _Resp(self.body)


def _tracker(num: int = 2, models: tuple[str, ...] = ("m", "n")) -> tuple[EndpointTracker, _Clock]:
    cfg = parse_config(
        {
            "gateway": {"stale_after_s": 0.5},
            "endpoints": [
                {
                    "name": f"e{i}",
                    "url": f"http://127.0.0.1:{9 + i}",
                    "models": [models[i % len(models)]],
                    "gpu": "h100",
                    "price_per_hour_usd": 3.0,
                }
                for i in range(num)
            ],
        }
    )
    clock = _Clock()
    return EndpointTracker(cfg.endpoints, cfg.gateway, clock), clock


def _fresh(tracker: EndpointTracker, now: float) -> list[Any]:
    """What the views show, field by field, built without the cache."""
    return [
        (v.name, v.state, v.load, v.in_flight, v.state_since_s)
        for v in tracker._build(now).by_name.values()
    ]


def _shown(tracker: EndpointTracker, now: float) -> list[Any]:
    return [(v.name, v.state, v.load, v.in_flight, v.state_since_s) for v in tracker.views(now)]


def test_views_are_reused_until_something_changes() -> None:
    tracker, clock = _tracker()
    first = tracker.views(clock.now)
    again = tracker.views(clock.now + 0.01)
    assert [a is b for a, b in zip(first, again, strict=True)] == [True, True]
    assert tracker.view("e0", clock.now) is first[0]
    assert first is not again  # callers get their own list


def test_in_flight_changes_end_the_cache() -> None:
    tracker, clock = _tracker()
    before = tracker.view("e0", clock.now)
    tracker.acquire("e0")
    after = tracker.view("e0", clock.now)
    assert before.in_flight == 0 and after.in_flight == 1
    assert _shown(tracker, clock.now) == _fresh(tracker, clock.now)
    tracker.release("e0")
    assert tracker.view("e0", clock.now).in_flight == 0
    assert _shown(tracker, clock.now) == _fresh(tracker, clock.now)


def test_state_changes_end_the_cache() -> None:
    tracker, clock = _tracker()
    tracker.views(clock.now)
    clock.now += 1.0
    tracker.set_state("e1", EndpointState.DRAINING)
    view = tracker.view("e1", clock.now)
    assert view.state is EndpointState.DRAINING and view.state_since_s == clock.now
    assert _shown(tracker, clock.now) == _fresh(tracker, clock.now)


@pytest.mark.asyncio
async def test_a_scrape_ends_the_cache_and_stale_load_is_dropped_on_time() -> None:
    tracker, clock = _tracker()
    session = _Session()
    tracker._session = session  # type: ignore[assignment]
    tracked = tracker._eps["e0"]
    tracker.views(clock.now)
    session.body = METRICS.format(w=3, r=7)
    await tracker._scrape(tracked)
    view = tracker.view("e0", clock.now)
    assert (view.load.num_waiting, view.load.num_running) == (3, 7)
    # Still fresh at exactly stale_after; stale just past it, with no change in between.
    at_edge = clock.now + 0.5
    assert tracker.view("e0", at_edge).load.num_running == 7
    past = clock.now + 0.5001
    stale = tracker.view("e0", past)
    assert stale.load.num_running == 0 and stale.load.observed_at_s == clock.now
    assert _shown(tracker, past) == _fresh(tracker, past)
    # An earlier time than the cache was built for is answered anew, not from the cache.
    assert tracker.view("e0", clock.now).load.num_running == 7


def test_views_per_model_follow_the_same_cache() -> None:
    tracker, clock = _tracker(num=4)
    assert [v.name for v in tracker.views(clock.now, "m")] == ["e0", "e2"]
    assert [v.name for v in tracker.views(clock.now, "n")] == ["e1", "e3"]
    tracker.acquire("e2")
    assert [v.in_flight for v in tracker.views(clock.now, "m")] == [0, 1]
    assert [v.in_flight for v in tracker.views(clock.now, "n")] == [0, 0]
    assert tracker.views(clock.now, "absent") == []


def test_random_changes_always_match_a_fresh_build() -> None:
    import random

    rng = random.Random(7)
    tracker, clock = _tracker(num=3)
    names = ["e0", "e1", "e2"]
    states = [EndpointState.READY, EndpointState.DRAINING, EndpointState.EJECTED]
    for _ in range(500):
        op = rng.randrange(4)
        name = rng.choice(names)
        if op == 0:
            tracker.acquire(name)
        elif op == 1:
            tracker.release(name)
        elif op == 2:
            tracker.set_state(name, rng.choice(states))
        else:
            clock.now += rng.choice((0.0, 0.001, 0.3))
        now = clock.now
        assert _shown(tracker, now) == _fresh(tracker, now)
        assert tracker.view(name, now).in_flight == tracker.in_flight(name)
