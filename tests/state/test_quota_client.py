"""Shared rate quotas: tenant and key buckets taken together, refusals named as the core's."""

from __future__ import annotations

import pytest

from inferplane.core.admission_config import QuotaLimits, QuotasConfig
from inferplane.core.quotas import QuotaKind
from inferplane.state.memory import MemoryStore
from inferplane.state.quota_client import SharedQuotas

CFG = QuotasConfig(
    tenants={"acme": QuotaLimits(requests_per_min=3, tokens_per_min=1000)},
    keys={"k1": QuotaLimits(requests_per_min=2)},
)


async def test_key_refusal_takes_nothing_from_the_tenant() -> None:
    q = SharedQuotas(MemoryStore(), CFG)
    assert await q.try_acquire("acme", "k1", 100, 0.0) is None
    assert await q.try_acquire("acme", "k1", 100, 0.0) is None
    refused = await q.try_acquire("acme", "k1", 100, 0.0)
    assert refused is not None and (refused.scope, refused.quota) == (
        "key",
        QuotaKind.REQUESTS_PER_MIN,
    )
    assert refused.retry_after_s == pytest.approx(30.0)  # 1 request at 2/min
    assert await q.try_acquire("acme", None, 100, 0.0) is None  # tenant still had one
    tenant = await q.try_acquire("acme", None, 100, 0.0)
    assert tenant is not None and tenant.scope == "tenant" and tenant.limit == 3


async def test_settle_refunds_unused_reserved_tokens() -> None:
    q = SharedQuotas(MemoryStore(), QuotasConfig(tenants={"t": QuotaLimits(tokens_per_min=1000)}))
    reserved = q.reserve_tokens(400, 5000)  # 400 + the default output reserve
    assert await q.try_acquire("t", None, reserved, 0.0) is None
    refused = await q.try_acquire("t", None, 500, 0.0)
    assert refused is not None and refused.quota is QuotaKind.TOKENS_PER_MIN
    await q.settle("t", None, reserved, 410, 0.0)  # used far less than reserved
    assert await q.try_acquire("t", None, 500, 0.0) is None


async def test_unlimited_tenant_takes_nothing() -> None:
    store = MemoryStore()
    q = SharedQuotas(store, CFG)
    for _ in range(10):
        assert await q.try_acquire("other", None, 10**6, 0.0) is None
