"""Rate quotas exact across workers and replicas: requests/min and tokens/min in a store.

:class:`~inferplane.core.quotas.QuotaBook` is exact inside one process; four workers each
with their own book let four times the quota through. This client keeps the same buckets
(one minute's worth, refilled continuously, debt for calls larger than the bucket) in a
:class:`~inferplane.core.state.StateStore`, where one atomic take checks every bucket of
the tenant and of the key and takes from all of them or none. Refusals are the core's
:class:`~inferplane.core.quotas.QuotaExceeded`, so the 429 reads the same.

Concurrency and money windows stay in the process's ``QuotaBook`` (a concurrency slot held
by a replica that dies would leak in a shared counter; spend is settled after the call).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.core.admission_config import QuotaLimits, QuotasConfig
from inferplane.core.quotas import QuotaExceeded, QuotaKind
from inferplane.core.state import BucketSpec, BucketTake, StateStore

__all__ = ["SharedQuotas"]

_MAX_SCOPES = 10_000  # cached bucket sets (past that the cache starts over)


@dataclass(frozen=True, slots=True)
class _Owner:
    """Which scope and quota a bucket take belongs to (to name a refusal)."""

    scope: str
    name: str
    quota: QuotaKind
    limit: float


class SharedQuotas:
    """requests/min and tokens/min of tenants and keys, checked and taken atomically."""

    def __init__(self, store: StateStore, config: QuotasConfig | None = None) -> None:
        self.store = store
        self.config = config or QuotasConfig()
        # (tenant, key) -> its buckets: built once per scope, not on every call
        self._buckets: dict[tuple[str, str | None], list[tuple[BucketSpec, _Owner, bool]]] = {}

    def reserve_tokens(self, num_prompt_tokens: int, max_tokens: int) -> int:
        """Tokens reserved at admission (as ``QuotaBook.reserve_tokens``)."""
        reserve = min(max_tokens, self.config.reserve_output_tokens)
        return max(0, num_prompt_tokens) + max(0, reserve)

    async def try_acquire(
        self, tenant: str, key: str | None, num_tokens: int, now: float
    ) -> QuotaExceeded | None:
        """Take one request and ``num_tokens`` from every bucket; None when admitted."""
        takes, owners = self._takes(tenant, key, num_tokens)
        if not takes:
            return None
        result = await self.store.take(takes, now)
        if result.admitted or result.refused_index is None:
            return None
        o = owners[result.refused_index]
        return QuotaExceeded(o.scope, o.name, o.quota, o.limit, result.wait_s)

    async def settle(
        self, tenant: str, key: str | None, reserved_tokens: int, used_tokens: int, now: float
    ) -> None:
        """The call ended: charge (or refund) the difference between used and reserved."""
        delta = used_tokens - reserved_tokens
        if delta == 0:
            return
        takes = [t for t, o in zip(*self._takes(tenant, key, delta), strict=True)
                 if o.quota is QuotaKind.TOKENS_PER_MIN]  # fmt: skip
        if takes:
            await self.store.charge(takes, now)

    def _takes(
        self, tenant: str, key: str | None, num_tokens: int
    ) -> tuple[list[BucketTake], list[_Owner]]:
        buckets = self._buckets.get((tenant, key))
        if buckets is None:
            if len(self._buckets) >= _MAX_SCOPES:
                self._buckets.clear()
            buckets = self._buckets[(tenant, key)] = self._scope_buckets(tenant, key)
        takes = [BucketTake(spec, float(num_tokens) if per_token else 1.0)
                 for spec, _, per_token in buckets]  # fmt: skip
        return takes, [owner for _, owner, _ in buckets]

    def _scope_buckets(self, tenant: str, key: str | None) -> list[tuple[BucketSpec, _Owner, bool]]:
        """The buckets of a tenant and key, with who owns each and whether it counts tokens."""
        scopes: list[tuple[str, str, QuotaLimits]] = []
        tenant_limits = self.config.tenants.get(tenant, self.config.default_tenant)
        if tenant_limits is not None:
            scopes.append(("tenant", tenant, tenant_limits))
        key_limits = None if key is None else self.config.keys.get(key)
        if key is not None and key_limits is not None:
            scopes.append(("key", key, key_limits))
        out: list[tuple[BucketSpec, _Owner, bool]] = []
        for scope, name, limits in scopes:
            for quota, per_min in (
                (QuotaKind.REQUESTS_PER_MIN, limits.requests_per_min),
                (QuotaKind.TOKENS_PER_MIN, limits.tokens_per_min),
            ):
                if per_min is None:
                    continue
                spec = BucketSpec(f"q:{scope}:{name}:{quota.value}", per_min, per_min / 60.0)
                per_token = quota is QuotaKind.TOKENS_PER_MIN
                out.append((spec, _Owner(scope, name, quota, per_min), per_token))
        return out
