"""Outlier detection and circuit breaking, driven by an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.breaker import (
    BreakerBoard,
    BreakerConfig,
    BreakerState,
    Outcome,
    Trigger,
)
from inferplane.core.retry import FailureKind
from inferplane.core.types import EndpointState
from tests.core.routing_helpers import view

OK = Outcome()
FAIL = Outcome(FailureKind.SERVER_ERROR)
CFG = BreakerConfig(max_ejected_share=0.5)


def _board(n: int = 4, cfg: BreakerConfig = CFG, pool: str = "p") -> BreakerBoard:
    board = BreakerBoard(cfg)
    for i in range(n):
        board.register(f"e{i}", pool)
    return board


def _feed(
    board: BreakerBoard, name: str, outcomes: list[Outcome], now: float = 0.0
) -> list[Trigger]:
    return [ev.trigger for o in outcomes for ev in board.record(name, o, now)]


@pytest.mark.parametrize(
    ("outcomes", "ejected"),
    [
        ([FAIL] * 4, False),
        ([FAIL] * 5, True),
        ([FAIL] * 4 + [OK] + [FAIL] * 4, False),  # a success resets the run
        # the request's fault, the client's, or load: neither counted nor resetting
        ([FAIL] * 4 + [Outcome(FailureKind.CLIENT_ERROR)] * 20 + [FAIL], True),
        ([Outcome(FailureKind.CLIENT_ERROR)] * 50, False),
        ([Outcome(FailureKind.CANCELLED)] * 50, False),
        ([Outcome(FailureKind.OVERLOADED)] * 50, False),
        ([Outcome(FailureKind.CONNECT)] * 5, True),
        ([Outcome(FailureKind.TIMEOUT)] * 5, True),
    ],
)
def test_consecutive_failures(outcomes: list[Outcome], ejected: bool) -> None:
    board = _board()
    triggers = _feed(board, "e0", outcomes)
    assert (board.state("e0") is BreakerState.OPEN) is ejected
    assert triggers == ([Trigger.CONSECUTIVE_FAILURES] if ejected else [])


def test_failure_rate_over_the_window() -> None:
    board = _board(cfg=BreakerConfig(failure_rate=0.5, min_requests=10, max_ejected_share=0.5))
    outcomes = [FAIL, OK] * 4 + [FAIL]  # 9 outcomes: below min_requests
    assert _feed(board, "e0", outcomes) == []
    assert _feed(board, "e0", [FAIL]) == [Trigger.FAILURE_RATE]  # 6 of 10
    # the same mix spread beyond the window never gathers enough evidence
    board2 = _board(cfg=BreakerConfig(failure_window_s=10.0, max_ejected_share=0.5))
    for i, o in enumerate([FAIL, OK] * 10):
        board2.record("e0", o, now=i * 3.0)
    assert board2.state("e0") is BreakerState.CLOSED


def test_ejection_grows_expires_into_probing_and_caps() -> None:
    cfg = BreakerConfig(base_ejection_s=30.0, max_ejection_s=70.0, max_ejected_share=0.5)
    board = _board(cfg=cfg)
    assert board.record("e0", FAIL, 0.0) == []  # one failure alone does nothing
    events = [ev for _ in range(4) for ev in board.record("e0", FAIL, 0.0)]
    assert [ev.trigger for ev in events] == [Trigger.CONSECUTIVE_FAILURES]
    now, until, durations = 0.0, events[0].until_s, []
    for _ in range(3):
        assert until is not None
        durations.append(until - now)
        assert board.sweep(until - 0.001) == []
        (expired,) = board.sweep(until)
        assert expired.trigger is Trigger.EJECTION_EXPIRED
        assert board.state("e0") is BreakerState.HALF_OPEN
        now = until
        (failed,) = board.record("e0", FAIL, now)
        assert failed.trigger is Trigger.PROBE_FAILED
        assert board.state("e0") is BreakerState.OPEN
        until = failed.until_s
    assert durations == [30.0, 60.0, 70.0]
    assert board.times_ejected("e0") == 4  # the first ejection and three failed probes


def test_half_open_admits_one_probe_at_a_time_then_closes() -> None:
    board = _board(cfg=BreakerConfig(probe_successes=2, probe_concurrency=1, max_ejected_share=0.5))
    views = [view(f"e{i}") for i in range(4)]
    _feed(board, "e0", [FAIL] * 5)
    assert board.overlay(views)[0].state is EndpointState.EJECTED
    board.sweep(1000.0)
    assert board.overlay(views)[0].state is EndpointState.READY  # a probe may go
    board.on_dispatch("e0")
    assert board.overlay(views)[0].state is EndpointState.EJECTED  # slot taken
    assert board.record("e0", OK, 1001.0) == []
    assert board.overlay(views)[0].state is EndpointState.READY
    board.on_dispatch("e0")
    (ev,) = board.record("e0", OK, 1002.0)
    assert ev.trigger is Trigger.PROBES_PASSED and ev.after is BreakerState.CLOSED
    assert [v.state for v in board.overlay(views)] == [EndpointState.READY] * 4
    # a cancelled probe frees its slot without counting either way
    _feed(board, "e0", [FAIL] * 5, 1003.0)
    board.sweep(5000.0)
    board.on_dispatch("e0")
    assert board.record("e0", Outcome(FailureKind.CANCELLED), 5001.0) == []
    assert board.state("e0") is BreakerState.HALF_OPEN
    assert board.overlay(views)[0].state is EndpointState.READY


def test_overlay_leaves_non_serving_states_alone() -> None:
    board = _board()
    _feed(board, "e0", [FAIL] * 5)
    cold = view("e0", state=EndpointState.COLD)
    assert board.overlay([cold])[0] is cold
    unknown = view("zz")
    assert board.overlay([unknown])[0] is unknown


def test_late_outcomes_while_open_are_ignored() -> None:
    board = _board()
    _feed(board, "e0", [FAIL] * 5)
    assert _feed(board, "e0", [FAIL] * 20 + [OK] * 20) == []
    assert board.times_ejected("e0") == 1


@pytest.mark.parametrize(
    ("size", "share", "cap"), [(10, 0.1, 1), (3, 0.1, 1), (20, 0.1, 2), (4, 0.5, 2)]
)
def test_at_most_a_share_of_the_pool_is_ejected(size: int, share: float, cap: int) -> None:
    board = _board(size, BreakerConfig(max_ejected_share=share))
    board.register("other", "q")
    assert board.max_ejected("p") == cap
    triggers = [_feed(board, f"e{i}", [FAIL] * 5) for i in range(size)]
    assert triggers[:cap] == [[Trigger.CONSECUTIVE_FAILURES]] * cap
    assert all(t == [Trigger.CAP_REACHED] for t in triggers[cap:])
    assert board.ejected("p") == (cap, size)
    assert _feed(board, "other", [FAIL] * 5) == [Trigger.CONSECUTIVE_FAILURES]  # own pool


def _slow(ratio: float, predicted: float = 0.2) -> Outcome:
    return Outcome(ttft_s=predicted * ratio, predicted_ttft_s=predicted)


def test_latency_outlier_is_ejected_relative_to_its_peers() -> None:
    board = _board(5)
    for t in range(6):
        for i in range(4):
            board.record(f"e{i}", _slow(1.0 + 0.1 * i), float(t))
        board.record("e4", _slow(5.0), float(t))  # a degraded GPU: 5x its prediction
    events = board.sweep(6.0)
    assert [(e.endpoint, e.trigger) for e in events] == [("e4", Trigger.LATENCY_OUTLIER)]
    assert "TTFT" in events[0].reason


def test_busy_but_healthy_endpoint_is_not_an_outlier() -> None:
    board = _board(5)
    for t in range(6):
        for i in range(4):
            board.record(f"e{i}", _slow(1.0, predicted=0.1), float(t))
        # long TTFTs, but predicted from its long queue: ratio 1.1
        board.record("e4", Outcome(ttft_s=2.2, predicted_ttft_s=2.0), float(t))
    assert board.sweep(6.0) == []


@pytest.mark.parametrize(
    ("ratios", "ejected"),
    [
        ([1.0, 1.0, 5.0], ["e2"]),
        ([1.0, 5.0], []),  # two endpoints: no pool median to compare with
        ([5.0, 5.0, 5.0, 5.0], []),  # everyone equally slow: a model problem, not a GPU
        ([1.0, 1.0, 1.0, 1.4], []),  # within the ratio
        ([0.2, 0.2, 0.2, 1.2], []),  # 6x the peers but below the absolute floor of 1.5
    ],
)
def test_latency_outlier_table(ratios: list[float], ejected: list[str]) -> None:
    board = _board(len(ratios), BreakerConfig(max_ejected_share=1.0))
    for t in range(5):
        for i, r in enumerate(ratios):
            board.record(f"e{i}", Outcome(tbt_s=0.02 * r, predicted_tbt_s=0.02), float(t))
    assert [e.endpoint for e in board.sweep(5.0)] == ejected


def test_latency_samples_expire_and_need_a_minimum() -> None:
    board = _board(
        4, BreakerConfig(latency_window_s=10.0, latency_min_samples=5, latency_recent_samples=5)
    )
    for t in range(5):
        for i in range(3):
            board.record(f"e{i}", _slow(1.0), float(t))
        board.record("e3", _slow(6.0), float(t))
    assert board.sweep(100.0) == []  # the evidence is old
    board2 = _board(4, BreakerConfig(latency_min_samples=5, latency_recent_samples=5))
    for t in range(4):  # 4 samples < 5
        for i in range(4):
            board2.record(f"e{i}", _slow(6.0 if i == 3 else 1.0), float(t))
    assert board2.sweep(4.0) == []


def test_slow_probe_reopens() -> None:
    board = _board(5)
    for t in range(6):
        for i in range(4):
            board.record(f"e{i}", _slow(1.0), float(t))
        board.record("e4", _slow(5.0), float(t))
    board.sweep(6.0)
    for t in range(30, 36):  # the peers keep serving as predicted
        for i in range(4):
            board.record(f"e{i}", _slow(1.0), float(t))
    board.sweep(6.0 + 30.0)
    assert board.state("e4") is BreakerState.HALF_OPEN
    (ev,) = board.record("e4", _slow(5.0), 36.5)
    assert ev.trigger is Trigger.PROBE_FAILED and "slow" in ev.reason
    assert ev.until_s == pytest.approx(36.5 + 60.0)


def test_slow_probe_without_fresh_peers_is_judged_against_its_prediction() -> None:
    board = _board(4, BreakerConfig(probe_successes=1, max_ejected_share=0.5))
    _feed(board, "e0", [FAIL] * 5)
    board.sweep(1000.0)
    (ev,) = board.record("e0", _slow(4.0), 1000.0)
    assert ev.trigger is Trigger.PROBE_FAILED
    board.sweep(5000.0)
    (ev,) = board.record("e0", _slow(1.2), 5000.0)
    assert ev.trigger is Trigger.PROBES_PASSED


def test_repeat_count_is_forgiven_after_a_quiet_stretch() -> None:
    board = _board(
        cfg=BreakerConfig(forgive_after_s=100.0, probe_successes=1, max_ejected_share=0.5)
    )
    _feed(board, "e0", [FAIL] * 5)
    board.sweep(30.0)
    board.record("e0", OK, 30.0)
    assert board.state("e0") is BreakerState.CLOSED and board.times_ejected("e0") == 1
    board.sweep(129.0)
    assert board.times_ejected("e0") == 1
    board.sweep(130.0)
    assert board.times_ejected("e0") == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"consecutive_failures": 0},
        {"failure_rate": 0.0},
        {"max_ejected_share": 1.5},
        {"base_ejection_s": 100.0, "max_ejection_s": 50.0},
        {"latency_ratio": 1.0},
        {"latency_min_peers": 1},
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(**kwargs)  # type: ignore[arg-type]


_KINDS = [None, *FailureKind]


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 12),
    share=st.sampled_from([0.0, 0.1, 0.25, 0.5]),
    steps=st.lists(
        st.tuples(
            st.integers(0, 11), st.sampled_from(_KINDS), st.floats(0.1, 8.0), st.floats(0, 20)
        ),
        max_size=150,
    ),
)
def test_ejected_share_never_above_the_cap(
    size: int, share: float, steps: list[tuple[int, FailureKind | None, float, float]]
) -> None:
    board = _board(
        size,
        BreakerConfig(
            max_ejected_share=share,
            consecutive_failures=2,
            min_requests=3,
            latency_min_samples=2,
            probe_successes=1,
        ),
    )
    now = 0.0
    cap = max(1, int(share * size + 1e-9))
    for index, kind, ratio, dt in steps:
        now += dt
        name = f"e{index % size}"
        board.on_dispatch(name)
        board.record(name, Outcome(kind, ttft_s=ratio, predicted_ttft_s=1.0), now)
        assert board.ejected("p")[0] <= cap
        board.sweep(now)
        assert board.ejected("p")[0] <= cap


def test_a_step_change_is_not_outvoted_by_the_endpoints_healthy_past() -> None:
    board = _board(8, BreakerConfig(max_ejected_share=0.25))
    for t in range(30):  # 30 s of healthy history everywhere
        for i in range(8):
            board.record(f"e{i}", _slow(1.0), float(t) * 0.5)
    assert board.sweep(15.0) == []
    # e0 degrades 5x; routing now sends it little: a slow attempt every 2 s.
    triggers = []
    for now in (16.0, 18.0, 20.0):
        board.record("e0", _slow(5.0), now)
        for i in range(1, 8):
            board.record(f"e{i}", _slow(1.0), now)
        triggers += [(now, ev.endpoint, ev.trigger) for ev in board.sweep(now)]
    # 2 of its 3 latest samples are slow: out, though 30 healthy ones are in the window.
    assert triggers == [(18.0, "e0", Trigger.LATENCY_OUTLIER)]


def _tbt(ratio: float) -> Outcome:
    return Outcome(tbt_s=0.02 * ratio, predicted_tbt_s=0.02)


def test_latency_of_an_attempt_the_client_gave_up_on_counts() -> None:
    board = _board(4)
    for t in range(5):
        for i in range(3):
            board.record(f"e{i}", _tbt(1.0), float(t))
        gave_up = Outcome(FailureKind.CANCELLED, tbt_s=0.1, predicted_tbt_s=0.02)
        assert board.record("e3", gave_up, float(t)) == []  # not a failure of its own
    (ev,) = board.sweep(5.0)
    assert (ev.endpoint, ev.trigger) == ("e3", Trigger.LATENCY_OUTLIER)
    assert "TBT 5.00x" in ev.reason


def test_overdue_attempts_are_evidence_and_fail_a_probe() -> None:
    board = _board(4)
    for t in range(5):
        for i in range(3):
            board.record(f"e{i}", _tbt(1.0), float(t))
    # 10 tokens predicted to take 1 s: 2 s in is under 3x the pool's ratio of 1.0, 4 s is not
    assert board.overdue_stat("e3", 2.0, 1.0, 10, 5.0) is None
    for now in (5.0, 6.0):
        stat = board.overdue_stat("e3", 4.0, 1.0, 10, now)
        assert stat is not None and stat.ratio == pytest.approx(4.0)
        assert stat.excess_s == pytest.approx(3.0 / 9)  # the excess per token after the first
        assert board.observe_overdue("e3", stat, now) == []
    assert board.sweep(6.5) == []  # two samples < latency_min_samples
    stat = board.overdue_stat("e3", 4.0, 1.0, 10, 7.0)
    assert stat is not None
    board.observe_overdue("e3", stat, 7.0)
    (ev,) = board.sweep(7.0)
    assert ev.trigger is Trigger.LATENCY_OUTLIER
    board.sweep(7.0 + 30.0)  # half-open: a probe goes out and is overdue
    assert board.state("e3") is BreakerState.HALF_OPEN
    board.on_dispatch("e3")
    assert board.overdue_stat("e3", 2.0, 1.0, 10, 38.0) is None  # no fresh peers: limit 3x
    stat = board.overdue_stat("e3", 4.0, 1.0, 10, 38.5)
    assert stat is not None
    (ev,) = board.observe_overdue("e3", stat, 38.5)
    assert ev.trigger is Trigger.PROBE_FAILED and board.state("e3") is BreakerState.OPEN
