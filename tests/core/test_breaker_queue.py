"""The breaker against engines that queue: a healthy engine whose latency its own queue
explains (KV-bound: a few calls run, the rest wait) is never a latency outlier, while a
5x-slow engine that always has a queue is ejected within a few samples, streaming or not.

The engines here are a small FIFO queue simulation, independent of the predictor's model:
``slots`` calls run at once (what fits in KV), each takes its prefill then ``n`` decode
steps; the gateway side is the real predictor (uncalibrated TTFT plus ``queue_wait_s`` on
the engine's reported queue at dispatch, as ``Reliability.expected`` computes it) and the
real breaker board, fed in time order with sweeps and overdue checks every second.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.breaker import BreakerBoard, BreakerConfig, BreakerEvent, Outcome, Trigger
from inferplane.core.predictor import LatencyPredictor
from inferplane.core.types import EndpointView
from tests.core.routing_helpers import view

MODEL, PROMPT_TOKENS = "m", 300
PREFILL_S = PROMPT_TOKENS / 30_000.0  # the default prior's prefill rate


def kv_usage(running: int, slots: int) -> float:
    return 0.95 if running >= slots else 0.9 * running / slots


def tpot_s(batch: int, kv: float) -> float:
    """A healthy step at this batch and KV usage (the default prior's physics)."""
    return 0.0075 + 0.00006 * batch + 0.02 * kv


@dataclass(frozen=True)
class Engine:
    name: str
    slots: int  # calls that fit in KV at once
    load: float  # offered load over capacity (above 1: its queue grows)
    slow: float = 1.0  # how much slower than healthy


@dataclass(frozen=True)
class Call:
    engine: str
    arrive_s: float
    start_s: float
    running: int  # calls running on the engine when it arrived
    waiting: int  # calls queued ahead of it
    slots: int
    slow: float
    steps: int

    @property
    def tpot_s(self) -> float:
        """Its step time: with the calls it found running, or in a full batch if it waited."""
        if self.start_s > self.arrive_s:
            return tpot_s(self.slots + 1, kv_usage(self.slots, self.slots)) * self.slow
        return tpot_s(self.running + 1, kv_usage(self.running, self.slots)) * self.slow

    @property
    def first_s(self) -> float:
        return self.start_s + PREFILL_S * self.slow + self.tpot_s

    @property
    def end_s(self) -> float:
        return self.first_s + (self.steps - 1) * self.tpot_s


def schedule(
    engine: Engine, steps: int, duration_s: float, rng: random.Random, vary: bool = False
) -> list[Call]:
    """Poisson arrivals served FIFO by ``slots`` servers; ``vary``: each call decodes a
    uniform 1..``steps`` tokens (``steps`` being its max_tokens), else ``steps``."""
    mean_steps = (steps + 1) / 2 if vary else steps
    full_s = (PREFILL_S + mean_steps * tpot_s(engine.slots, 0.95)) * engine.slow
    rate = engine.load * engine.slots / full_s
    free = [0.0] * engine.slots  # when each slot frees
    starts: deque[float] = deque()  # start times of calls that arrived before, in order
    calls, t = [], rng.expovariate(rate)
    while t < duration_s:
        while starts and starts[0] <= t:
            starts.popleft()
        running = sum(1 for f in free if f > t)
        start = max(t, heapq.heappop(free))
        n = rng.randint(1, steps) if vary else steps
        call = Call(engine.name, t, start, running, len(starts), engine.slots, engine.slow, n)
        heapq.heappush(free, call.end_s)
        calls.append(call)
        starts.append(start)
        t += rng.expovariate(rate)
    return calls


@dataclass
class Run:
    ejected: dict[str, int]  # engine -> its samples recorded before its latency ejection
    samples: dict[str, int]


def run(
    engines: list[Engine],
    steps: int,
    stream: bool,
    seed: int,
    duration_s: float,
    vary: bool = False,
) -> Run:
    """Every call through the predictor and the breaker, in time order."""
    rng = random.Random(seed)
    predictor, board = LatencyPredictor(), BreakerBoard(BreakerConfig(max_ejected_share=1.0))
    for e in engines:
        board.register(e.name, "p")
    events: list[tuple[float, int, int, Call]] = []
    for e in engines:
        for c in schedule(e, steps, duration_s, rng, vary):
            events += [(c.arrive_s, 0, len(events), c), (c.end_s, 2, len(events) + 1, c)]
            events.append((c.first_s, 1, len(events), c))
    events.sort(key=lambda ev: (ev[0], ev[1], ev[2]))
    expected: dict[int, float | None] = {}  # call id -> expected TTFT (None: not judged)
    est_tpot: dict[int, float] = {}
    running: dict[int, tuple[Call, float | None]] = {}  # call id -> (call, predicted total)
    overdue: set[int] = set()  # reported overdue: its time between tokens counts no more
    out = Run({}, {e.name: 0 for e in engines})
    next_sweep = 1.0
    for now, kind, _, c in events:
        while next_sweep <= now:
            _sweep(board, running, overdue, steps, next_sweep, out)
            next_sweep += 1.0
        key = id(c)
        if kind == 0:
            kv = kv_usage(c.running, c.slots)
            v = view(c.engine, model=MODEL, running=c.running, waiting=c.waiting, kv=kv)
            est = predictor.predict(v, MODEL, PROMPT_TOKENS, now)
            queue_s = predictor.queue_wait_s(v, MODEL, est.raw_tpot_s)
            ttft = None if queue_s is None else est.raw_ttft_s + queue_s
            expected[key], est_tpot[key] = ttft, est.raw_tpot_s
            running[key] = (c, None if ttft is None else ttft + est.raw_tpot_s * (steps - 1))
            predictor.on_dispatch(str(key), c.engine, PROMPT_TOKENS, est)
        elif kind == 1:
            predictor.on_first_token(str(key), c.first_s - c.arrive_s, now)
        else:
            predictor.on_finish(str(key), now)
            _, total = running.pop(key)
            out.samples[c.engine] += 1
            if stream:  # as ``Reliability.record``: an overdue attempt's TBT is counted
                tbt = (None, None) if key in overdue else (c.tpot_s, est_tpot[key])
                outcome = Outcome(None, c.first_s - c.arrive_s, expected[key], *tbt)
            else:  # as the gateway: over the tokens it produced
                ttft = expected[key]
                total = None if ttft is None else ttft + est_tpot[key] * (c.steps - 1)
                outcome = Outcome(None, now - c.arrive_s, total)
            _note(board.record(c.engine, outcome, now), out)
    return out


def _sweep(
    board: BreakerBoard,
    running: dict[int, tuple[Call, float | None]],
    overdue: set[int],
    steps: int,
    now: float,
    out: Run,
) -> None:
    """What ``Reliability.maybe_sweep`` does: overdue attempts first, then the sweep."""
    for key, (c, total) in running.items():
        if key in overdue or total is None:  # unwatched, as ``Reliability.predict`` does
            continue
        stat = board.overdue_stat(c.engine, now - c.arrive_s, total, steps, now)
        if stat is not None:
            overdue.add(key)  # reported once
            _note(board.observe_overdue(c.engine, stat, now), out)
    _note(board.sweep(now), out)


def _note(events: list[BreakerEvent], out: Run) -> None:
    for ev in events:
        if ev.trigger is Trigger.LATENCY_OUTLIER and ev.endpoint not in out.ejected:
            out.ejected[ev.endpoint] = out.samples[ev.endpoint]


def _fleet(slots: int, hot_load: float, slow: float = 1.0) -> list[Engine]:
    """One hot engine (its queue builds), seven at ordinary load."""
    hot = Engine("hot", slots, hot_load, slow)
    return [hot, *(Engine(f"e{i}", slots, 0.4) for i in range(7))]


#: The draws are fixed (``derandomize``): a random draw found the false ejection pinned below.
@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 10_000),
    slots=st.integers(2, 8),
    hot_load=st.floats(0.7, 1.3),
    steps=st.integers(8, 64),
    stream=st.booleans(),
)
def test_a_healthy_engine_explained_by_its_own_queue_is_never_ejected(
    seed: int, slots: int, hot_load: float, steps: int, stream: bool
) -> None:
    result = run(_fleet(slots, hot_load), steps, stream, seed, duration_s=60.0)
    assert result.ejected == {}


def test_a_queue_forming_before_any_call_finished_is_not_an_outlier() -> None:
    """Found by a random draw (CI at 963914b): 6 slots at 1.25x load, streams of 41 tokens.
    The queue forms at 0.28 s, before any call in the fleet has finished, so the turnover
    the queue wait is counted in is unknown; ``queue_wait_s`` said 0 then, and queued
    calls' TTFT (0.33-0.41 s) was judged against the bare 0.11-0.15 s: the healthy engine
    was ejected at ~1.8 s, 9 samples in (TTFT 3.11x predicted). Now those calls' TTFT is
    not judged (their time between tokens still is)."""
    result = run(_fleet(6, 1.25), 41, True, 45, duration_s=60.0)
    assert result.ejected == {}


def test_while_the_turnover_is_unknown_queued_calls_ttft_is_not_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same draw with the unknown wait taken as 0 (what ``queue_wait_s`` said before
    any call finished): the healthy engine is ejected 9 samples in, so the test above can
    fail."""
    original = LatencyPredictor.queue_wait_s

    def as_zero(self: LatencyPredictor, v: EndpointView, model: str, tpot_s: float) -> float:
        return original(self, v, model, tpot_s) or 0.0

    monkeypatch.setattr(LatencyPredictor, "queue_wait_s", as_zero)
    result = run(_fleet(6, 1.25), 41, True, 45, duration_s=60.0)
    assert result.ejected == {"hot": 9}


def test_calls_of_varied_lengths_queued_on_a_healthy_engine_are_not_outliers() -> None:
    """Found by random draws of this simulation with output lengths uniform in 1..max_tokens
    (5 of 1500 streaming cases ejected the healthy engine, 5 to 259 samples in): 2 slots at
    0.96x load, max_tokens 63, seed 5216, ejected 5 samples in, while the queue wait counted
    calls ahead at the *geometric* mean decode steps (an EWMA in log space seeded by the
    first call to finish, a short one); slots free at the rate set by the arithmetic mean,
    which ``decode_steps`` now gives (the slot wait's log-normal mean)."""
    result = run(_fleet(2, 0.96), 63, True, 5216, duration_s=60.0, vary=True)
    assert result.ejected == {}


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 10_000),
    slots=st.integers(2, 8),
    hot_load=st.floats(0.7, 1.3),
    steps=st.integers(8, 64),
    stream=st.booleans(),
)
def test_a_5x_slow_engine_with_a_queue_is_ejected_within_a_few_samples(
    seed: int, slots: int, hot_load: float, steps: int, stream: bool
) -> None:
    """Slowed 5x, its offered load is 5x too (3.5-6.5 x capacity): it always queues."""
    result = run(_fleet(slots, hot_load * 5, slow=5.0), steps, stream, seed, duration_s=60.0)
    assert set(result.ejected) == {"hot"}
    assert result.ejected["hot"] <= 12


def test_without_the_queue_wait_the_healthy_hot_engine_is_ejected() -> None:
    """The same simulation judged against the bare TTFT (what the breaker did before): the
    healthy KV-bound engine goes, so the tests above can fail."""
    original = LatencyPredictor.queue_wait_s
    LatencyPredictor.queue_wait_s = lambda *_a, **_k: 0.0  # type: ignore[method-assign]
    try:
        result = run(_fleet(4, 1.1), 24, True, 7, duration_s=60.0)
    finally:
        LatencyPredictor.queue_wait_s = original  # type: ignore[method-assign]
    assert "hot" in result.ejected
