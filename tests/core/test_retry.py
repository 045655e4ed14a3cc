"""Retry policy: failure classes, safety, attempts, deadline, workflow allowance, budget."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.retry import (
    Failure,
    FailureKind,
    RetryBudget,
    RetryConfig,
    RetryMode,
    RetryReason,
    backoff_s,
    failure_of_status,
)
from tests.core.routing_helpers import call


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (200, None),
        (400, FailureKind.CLIENT_ERROR),
        (413, FailureKind.CLIENT_ERROR),
        (408, FailureKind.TIMEOUT),
        (429, FailureKind.OVERLOADED),
        (500, FailureKind.SERVER_ERROR),
        (503, FailureKind.SERVER_ERROR),
    ],
)
def test_status_classes(status: int, kind: FailureKind | None) -> None:
    assert failure_of_status(status) is kind


def test_only_endpoint_failures_count_and_request_faults_never_retry() -> None:
    counted = {k for k in FailureKind if k.counts_against_endpoint}
    assert FailureKind.CLIENT_ERROR not in counted
    assert FailureKind.CANCELLED not in counted
    assert FailureKind.OVERLOADED not in counted
    assert not FailureKind.CLIENT_ERROR.retryable
    assert not FailureKind.CANCELLED.retryable
    assert FailureKind.OVERLOADED.retryable


def _decide(
    budget: RetryBudget,
    failure: Failure,
    *,
    attempts: int = 1,
    active: int = 100,
    deadline_s: float | None = None,
    workflow: str | None = None,
    now: float = 0.0,
) -> tuple[RetryMode, RetryReason]:
    c = call(deadline_s=deadline_s, workflow_id=workflow)
    d = budget.may_retry(c, failure, attempts, {"x"}, now, random.Random(0), active_requests=active)
    return d.mode, d.reason


E = "a"


@pytest.mark.parametrize(
    ("failure", "kwargs", "mode", "reason"),
    [
        (Failure(E, FailureKind.CONNECT), {}, RetryMode.REPLAY, RetryReason.REPLAY),
        (Failure(E, FailureKind.OVERLOADED), {}, RetryMode.REPLAY, RetryReason.REPLAY),
        (Failure(E, FailureKind.CLIENT_ERROR), {}, RetryMode.NONE, RetryReason.NOT_RETRYABLE),
        (Failure(E, FailureKind.CANCELLED), {}, RetryMode.NONE, RetryReason.NOT_RETRYABLE),
        (Failure(E, FailureKind.RESET, True), {}, RetryMode.NONE, RetryReason.UNSAFE),
        (Failure(E, FailureKind.RESET, True, True), {}, RetryMode.RESUME, RetryReason.RESUME),
        (
            Failure(E, FailureKind.SERVER_ERROR),
            {"attempts": 3},
            RetryMode.NONE,
            RetryReason.ATTEMPTS_EXHAUSTED,
        ),
        (
            Failure(E, FailureKind.TIMEOUT),
            {"deadline_s": 0.001, "attempts": 2},
            RetryMode.NONE,
            RetryReason.DEADLINE,
        ),
        (
            Failure(E, FailureKind.TIMEOUT),
            {"deadline_s": 10.0},
            RetryMode.REPLAY,
            RetryReason.REPLAY,
        ),
    ],
)
def test_decision_table(
    failure: Failure, kwargs: dict[str, float], mode: RetryMode, reason: RetryReason
) -> None:
    assert _decide(RetryBudget(), failure, **kwargs) == (mode, reason)  # type: ignore[arg-type]


def test_granted_retry_excludes_every_endpoint_tried() -> None:
    budget = RetryBudget()
    d = budget.may_retry(
        call(), Failure("b", FailureKind.RESET), 2, {"a"}, 0.0, random.Random(1), active_requests=5
    )
    assert d.allowed and d.exclude == frozenset({"a", "b"})
    assert d.attempt == 3
    assert 0.0 <= d.backoff_s <= 0.075  # second retry: base x (2^2 - 1)
    assert budget.in_flight == 1
    budget.release()
    assert budget.in_flight == 0


def test_budget_is_a_share_of_active_requests_with_a_floor() -> None:
    budget = RetryBudget(RetryConfig(budget_ratio=0.2, min_concurrent_retries=3))
    assert [budget.limit(n) for n in (0, 10, 15, 20, 100)] == [3, 3, 3, 4, 20]
    granted = [budget.try_acquire(50) for _ in range(12)]
    assert granted == [True] * 10 + [False] * 2
    failure = Failure(E, FailureKind.SERVER_ERROR)
    assert _decide(budget, failure, active=50) == (RetryMode.NONE, RetryReason.BUDGET_EXHAUSTED)
    budget.release()
    assert _decide(budget, failure, active=50) == (RetryMode.REPLAY, RetryReason.REPLAY)


def test_workflow_allowance_grows_with_its_calls() -> None:
    budget = RetryBudget(RetryConfig(workflow_ratio=0.5, workflow_min_retries=1))
    failure = Failure(E, FailureKind.SERVER_ERROR)
    budget.on_call("w")
    assert budget.workflow_left("w") == 1
    assert _decide(budget, failure, workflow="w")[0] is RetryMode.REPLAY
    assert _decide(budget, failure, workflow="w") == (
        RetryMode.NONE,
        RetryReason.WORKFLOW_ALLOWANCE,
    )
    assert _decide(budget, failure, workflow="other")[0] is RetryMode.REPLAY  # its own allowance
    budget.on_call("w")
    budget.on_call("w")  # 3 calls: 1 + floor(1.5) = 2 allowed, 1 used
    assert budget.workflow_left("w") == 1
    assert budget.workflow_left(None) is None


def test_workflows_are_bounded() -> None:
    budget = RetryBudget(RetryConfig(max_workflows=2, workflow_min_retries=0, workflow_ratio=1))
    for w in ("a", "b", "c"):
        budget.on_call(w)
    assert budget.workflow_left("a") == 0  # forgotten: back to the floor
    assert budget.workflow_left("c") == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"budget_ratio": -0.1},
        {"max_attempts": 0},
        {"backoff_base_s": 0.5, "backoff_cap_s": 0.25},
        {"min_concurrent_retries": -1},
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryConfig(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), seed=st.integers(0, 2**32))
def test_backoff_within_bounds(n: int, seed: int) -> None:
    cfg = RetryConfig()
    wait = backoff_s(n, random.Random(seed), cfg)
    assert 0.0 <= wait <= min(cfg.backoff_cap_s, cfg.backoff_base_s * (2 ** min(n, 32) - 1))


def test_backoff_grows_then_caps() -> None:
    cfg = RetryConfig()
    rng = random.Random(5)
    means = [sum(backoff_s(n, rng, cfg) for _ in range(400)) / 400 for n in (1, 2, 3, 6)]
    assert means[0] < means[1] < means[2] <= cfg.backoff_cap_s
    assert means[3] == pytest.approx(cfg.backoff_cap_s / 2, rel=0.15)  # uniform(0, cap)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["retry", "release", "hedge"]), st.integers(0, 60)),
        max_size=120,
    )
)
def test_retries_in_flight_never_exceed_the_budget(steps: list[tuple[str, int]]) -> None:
    budget = RetryBudget(RetryConfig(max_attempts=10))
    rng = random.Random(0)
    failure = Failure(E, FailureKind.SERVER_ERROR)
    for op, active in steps:
        if op == "release":
            budget.release()
            assert budget.in_flight >= 0
            continue
        before = budget.in_flight
        if op == "retry":
            granted = budget.may_retry(
                call(), failure, 1, (), 0.0, rng, active_requests=active
            ).allowed
        else:
            granted = budget.try_acquire(active)
        assert budget.in_flight == before + int(granted)
        if granted:
            assert budget.in_flight <= budget.limit(active)
        else:
            assert before + 1 > budget.limit(active)
