"""Quotas: exact token buckets, settlement, concurrency, money windows, named refusals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.admission_config import QuotaLimits, QuotasConfig
from inferplane.core.quotas import QuotaBook, QuotaKind


def book(tenant: QuotaLimits | None = None, key: QuotaLimits | None = None) -> QuotaBook:
    return QuotaBook(
        QuotasConfig(
            tenants={"acme": tenant} if tenant else {},
            keys={"k1": key} if key else {},
            reserve_output_tokens=0,
        )
    )


def test_requests_per_min_refuses_with_exact_wait_then_refills() -> None:
    b = book(QuotaLimits(requests_per_min=3))
    for i in range(3):
        assert b.try_acquire(f"r{i}", "acme", None, 10, 0.0) is None
    refusal = b.try_acquire("r3", "acme", None, 10, 0.0)
    assert refusal is not None and refusal.quota is QuotaKind.REQUESTS_PER_MIN
    assert refusal.retry_after_s == pytest.approx(20.0)  # one request per 20 s
    assert refusal.code == "quota_requests_per_min" and "'acme'" in refusal.reason
    assert b.try_acquire("r3", "acme", None, 10, 19.9) is not None
    assert b.try_acquire("r3", "acme", None, 10, 20.0) is None


def test_tokens_are_settled_against_the_real_count() -> None:
    b = book(QuotaLimits(tokens_per_min=1000))
    assert b.try_acquire("a", "acme", None, 800, 0.0) is None
    refusal = b.try_acquire("b", "acme", None, 500, 0.0)
    assert refusal is not None and refusal.quota is QuotaKind.TOKENS_PER_MIN
    assert refusal.retry_after_s == pytest.approx(300 / (1000 / 60))
    assert b.release("a", 0.0, num_tokens=100)  # used far less than reserved: refund 700
    assert b.try_acquire("b", "acme", None, 500, 0.0) is None
    assert not b.release("a", 0.0)  # released once only


def test_a_call_larger_than_a_minute_fits_a_full_bucket_and_leaves_debt() -> None:
    b = book(QuotaLimits(tokens_per_min=600))
    assert b.try_acquire("big", "acme", None, 1200, 0.0) is None
    refusal = b.try_acquire("next", "acme", None, 60, 0.0)
    assert refusal is not None
    assert refusal.retry_after_s == pytest.approx((600 + 60) / 10)  # debt 600 + need 60


def test_concurrency_counts_open_reservations() -> None:
    b = book(QuotaLimits(max_concurrency=2))
    assert b.try_acquire("a", "acme", None, 1, 0.0) is None
    assert b.try_acquire("b", "acme", None, 1, 0.0) is None
    refusal = b.try_acquire("c", "acme", None, 1, 0.0)
    assert refusal is not None and refusal.quota is QuotaKind.CONCURRENCY
    assert refusal.retry_after_s >= 1.0
    b.release("a", 1.0)
    assert b.concurrency("tenant", "acme") == 1
    assert b.try_acquire("c", "acme", None, 1, 1.0) is None


def test_money_per_period_refuses_until_the_window_ends() -> None:
    b = book(QuotaLimits(usd_per_period=1.0, period_s=3600.0))
    assert b.try_acquire("a", "acme", None, 1, 100.0) is None
    b.release("a", 200.0, cost_usd=0.6)
    assert b.try_acquire("b", "acme", None, 1, 300.0) is None
    b.release("b", 400.0, cost_usd=0.5)
    refusal = b.try_acquire("c", "acme", None, 1, 500.0)
    assert refusal is not None and refusal.quota is QuotaKind.USD_PER_PERIOD
    assert refusal.retry_after_s == pytest.approx(3100.0)
    assert b.try_acquire("c", "acme", None, 1, 3600.0) is None  # a new window


def test_key_quota_is_named_and_a_refused_call_takes_nothing() -> None:
    b = book(QuotaLimits(requests_per_min=2), key=QuotaLimits(max_concurrency=1))
    assert b.try_acquire("a", "acme", "k1", 1, 0.0) is None
    refusal = b.try_acquire("b", "acme", "k1", 1, 0.0)
    assert refusal is not None and (refusal.scope, refusal.name) == ("key", "k1")
    # The tenant's request bucket was not charged by the refused call: one more fits.
    assert b.try_acquire("c", "acme", "other-key", 1, 0.0) is None
    assert b.try_acquire("d", "acme", "other-key", 1, 0.0) is not None


def test_unlisted_tenants_use_the_default_and_unlimited_is_free() -> None:
    b = QuotaBook(QuotasConfig(default_tenant=QuotaLimits(max_concurrency=1)))
    assert b.try_acquire("a", "x", None, 1, 0.0) is None
    assert b.try_acquire("b", "x", None, 1, 0.0) is not None
    assert b.try_acquire("c", "y", None, 1, 0.0) is None  # its own scope
    free = QuotaBook()
    assert all(free.try_acquire(f"r{i}", "t", None, 10**9, 0.0) is None for i in range(100))
    assert free.num_open() == 0  # nothing to hold


def test_open_reservations_are_bounded() -> None:
    b = QuotaBook(
        QuotasConfig(default_tenant=QuotaLimits(max_concurrency=10**6), max_open_reservations=10)
    )
    for i in range(50):
        assert b.try_acquire(f"r{i}", "t", None, 1, 0.0) is None
    assert b.num_open() == 10 and b.concurrency("tenant", "t") == 10


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 30),
    st.lists(st.floats(0, 600, allow_nan=False), min_size=1, max_size=200),
)
def test_rate_never_exceeds_burst_plus_refill(per_min: int, times: list[float]) -> None:
    """Over any run, admitted requests <= one minute's worth + rate x elapsed time."""
    b = book(QuotaLimits(requests_per_min=per_min))
    admitted: list[float] = []
    for i, t in enumerate(sorted(times)):
        if b.try_acquire(f"r{i}", "acme", None, 1, t) is None:
            admitted.append(t)
            b.release(f"r{i}", t)
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            window_s = admitted[j] - start
            assert j - i + 1 <= per_min + per_min / 60 * window_s + 1e-9
