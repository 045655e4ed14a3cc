"""The stream filter's per-segment time between tokens, which the breaker judges by."""

from __future__ import annotations

import orjson
import pytest

from inferplane.gateway.exchange import Exchange
from inferplane.gateway.sse_filter import EventFilter


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def token_event(text: str) -> bytes:
    body = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def stream(f: EventFilter, clock: Clock, gaps_s: list[float]) -> None:
    """One token now, then one after each gap."""
    assert f.feed(token_event("a"))
    for gap in gaps_s:
        clock.now_s += gap
        assert f.feed(token_event("b"))


def new_filter(clock: Clock) -> EventFilter:
    return EventFilter(keep_usage=False, ex=Exchange(), clock=clock)


def test_steady_stream_reads_its_pace() -> None:
    clock = Clock()
    f = new_filter(clock)
    stream(f, clock, [0.05] * 30)
    assert f.seg_tbt_s() == pytest.approx(0.05)


def test_one_stall_does_not_make_a_healthy_engine_read_slow() -> None:
    clock = Clock()
    f = new_filter(clock)
    gaps = [0.02] * 40
    gaps[17] = 3.0  # a preemption: the call waits for KV once
    stream(f, clock, gaps)
    mean_s = sum(gaps) / len(gaps)
    assert mean_s > 0.09  # what a plain mean would judge: over 4x the pace
    assert f.seg_tbt_s() == pytest.approx(0.02)


def test_slow_on_every_token_reads_slow() -> None:
    clock = Clock()
    f = new_filter(clock)
    stream(f, clock, [0.1, 0.25] * 15)
    assert f.seg_tbt_s() is not None
    assert 0.1 < (f.seg_tbt_s() or 0.0) < 0.25


def test_continuation_segment_excludes_the_gap_across_failover() -> None:
    clock = Clock()
    f = new_filter(clock)
    stream(f, clock, [0.02] * 5)
    clock.now_s += 4.0  # the engine dies; another replica resumes the stream
    f.new_segment(clock.now_s)
    assert f.seg_tbt_s() is None
    clock.now_s += 0.5  # the new segment's TTFT
    stream(f, clock, [0.03] * 5)
    assert f.seg_tbt_s() == pytest.approx(0.03)


def test_all_tokens_in_one_read_give_no_reading() -> None:
    clock = Clock()
    f = new_filter(clock)
    stream(f, clock, [0.0] * 8)
    assert f.seg_tbt_s() is None
