"""Tenant and API-key quotas: requests/min, tokens/min, concurrency and money per period.

Exact and pure (``now`` is passed in):

* rates are token buckets holding one minute's worth, refilled continuously; a call needs
  its cost in the bucket (or a full bucket, if it costs more than a minute's worth) and
  takes it, so a large call goes into debt rather than being refused for ever. The wait
  until it fits is exact: (shortfall) / (refill rate);
* tokens are reserved at admission (prompt + ``reserve_output_tokens``, capped by the
  call's max_tokens) and settled on completion against the real count, refunding or
  charging the difference;
* concurrency counts reservations not yet released;
* money is charged on completion into a fixed window of ``period_s`` aligned to multiples
  of it from t = 0; a scope that spent its allowance is refused until the window ends.

Every limit of the tenant and of the key is checked before anything is taken, so a refused
call takes nothing. The refusal names the quota, the scope and the limit (the 429 reason).
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from dataclasses import dataclass

from inferplane.core.admission_config import QuotaLimits, QuotasConfig

__all__ = ["QuotaBook", "QuotaExceeded", "QuotaKind"]

_MAX_SCOPES = 100_000
_CONCURRENCY_RETRY_S = 1.0


class QuotaKind(enum.Enum):
    REQUESTS_PER_MIN = "requests_per_min"
    TOKENS_PER_MIN = "tokens_per_min"
    CONCURRENCY = "max_concurrency"
    USD_PER_PERIOD = "usd_per_period"


@dataclass(frozen=True, slots=True)
class QuotaExceeded:
    """A refusal: which quota of which scope, its limit, and when to come back."""

    scope: str  # "tenant" or "key"
    name: str
    quota: QuotaKind
    limit: float
    retry_after_s: float

    @property
    def code(self) -> str:
        return f"quota_{self.quota.value}"

    @property
    def reason(self) -> str:
        what = f"{self.scope} {self.name!r}"
        return f"quota {self.quota.value} exceeded for {what} (limit {self.limit:g})"


class _Bucket:
    """A token bucket of ``capacity`` refilled at ``rate_per_s``; the level may go negative."""

    __slots__ = ("at_s", "capacity", "level", "rate_per_s")

    def __init__(self, per_min: float, now: float) -> None:
        self.capacity = per_min
        self.rate_per_s = per_min / 60.0
        self.level = per_min
        self.at_s = now

    def level_at(self, now: float) -> float:
        return min(self.capacity, self.level + self.rate_per_s * max(0.0, now - self.at_s))

    def wait_s(self, need: float, now: float) -> float:
        shortfall = min(need, self.capacity) - self.level_at(now)
        return max(0.0, shortfall / self.rate_per_s)

    def take(self, amount: float, now: float) -> None:
        self.level = min(self.capacity, self.level_at(now) - amount)
        self.at_s = max(self.at_s, now)


class _Scope:
    """Live state of one tenant's or one key's quotas."""

    __slots__ = ("concurrency", "limits", "period", "requests", "spent_usd", "tokens")

    def __init__(self, limits: QuotaLimits, now: float) -> None:
        self.limits = limits
        self.requests = (
            None if limits.requests_per_min is None else _Bucket(limits.requests_per_min, now)
        )
        self.tokens = None if limits.tokens_per_min is None else _Bucket(limits.tokens_per_min, now)
        self.concurrency = 0
        self.period = -1
        self.spent_usd = 0.0

    def refusal(self, num_tokens: int, now: float) -> tuple[QuotaKind, float, float] | None:
        """(quota, limit, retry after) of the first limit the call breaks, else None."""
        lim = self.limits
        if lim.max_concurrency is not None and self.concurrency >= lim.max_concurrency:
            return QuotaKind.CONCURRENCY, lim.max_concurrency, _CONCURRENCY_RETRY_S
        if lim.usd_per_period is not None and self._spent(now) >= lim.usd_per_period:
            end_s = (math.floor(now / lim.period_s) + 1) * lim.period_s
            return QuotaKind.USD_PER_PERIOD, lim.usd_per_period, end_s - now
        if self.requests is not None and (wait := self.requests.wait_s(1.0, now)) > 0:
            return QuotaKind.REQUESTS_PER_MIN, self.requests.capacity, wait
        if self.tokens is not None and (wait := self.tokens.wait_s(num_tokens, now)) > 0:
            return QuotaKind.TOKENS_PER_MIN, self.tokens.capacity, wait
        return None

    def _spent(self, now: float) -> float:
        period = math.floor(now / self.limits.period_s)
        if period != self.period:
            self.period, self.spent_usd = period, 0.0
        return self.spent_usd

    def take(self, num_tokens: int, now: float) -> None:
        self.concurrency += 1
        if self.requests is not None:
            self.requests.take(1.0, now)
        if self.tokens is not None:
            self.tokens.take(num_tokens, now)

    def settle(self, token_delta: int, cost_usd: float, now: float) -> None:
        self.concurrency = max(0, self.concurrency - 1)
        if self.tokens is not None and token_delta:
            self.tokens.take(token_delta, now)
        if cost_usd > 0 and self.limits.usd_per_period is not None:
            self.spent_usd = self._spent(now) + cost_usd


@dataclass(frozen=True, slots=True)
class _Reservation:
    scopes: tuple[tuple[str, str], ...]
    num_tokens: int


class QuotaBook:
    """Checks, reserves and settles quotas (module docstring)."""

    def __init__(self, config: QuotasConfig | None = None) -> None:
        self.config = config or QuotasConfig()
        self._scopes: OrderedDict[tuple[str, str], _Scope] = OrderedDict()
        self._open: OrderedDict[str, _Reservation] = OrderedDict()

    def reserve_tokens(self, num_prompt_tokens: int, max_tokens: int) -> int:
        """Tokens reserved for a call at admission."""
        return max(0, num_prompt_tokens) + max(
            0, min(max_tokens, self.config.reserve_output_tokens)
        )

    def try_acquire(
        self, request_id: str, tenant: str, key: str | None, num_tokens: int, now: float
    ) -> QuotaExceeded | None:
        """Reserve the call's share of every quota of its tenant and key; None when admitted."""
        scopes = self._scopes_of(tenant, key, now)
        for (kind, name), scope in scopes:
            refusal = scope.refusal(num_tokens, now)
            if refusal is not None:
                quota, limit, wait_s = refusal
                return QuotaExceeded(kind, name, quota, limit, wait_s)
        if not scopes:
            return None
        self.release(request_id, now)  # a repeated id replaces its old reservation
        while len(self._open) >= self.config.max_open_reservations:
            self.release(next(iter(self._open)), now)
        for _, scope in scopes:
            scope.take(num_tokens, now)
        self._open[request_id] = _Reservation(tuple(k for k, _ in scopes), num_tokens)
        return None

    def release(
        self,
        request_id: str,
        now: float,
        *,
        num_tokens: int | None = None,
        cost_usd: float = 0.0,
    ) -> bool:
        """The call ended (or never ran): free its slot, settle tokens and charge its cost."""
        held = self._open.pop(request_id, None)
        if held is None:
            return False
        delta = 0 if num_tokens is None else num_tokens - held.num_tokens
        for k in held.scopes:
            scope = self._scopes.get(k)
            if scope is not None:
                scope.settle(delta, cost_usd, now)
        return True

    def concurrency(self, scope: str, name: str) -> int:
        found = self._scopes.get((scope, name))
        return 0 if found is None else found.concurrency

    def num_open(self) -> int:
        return len(self._open)

    def _scopes_of(
        self, tenant: str, key: str | None, now: float
    ) -> list[tuple[tuple[str, str], _Scope]]:
        wanted: list[tuple[tuple[str, str], QuotaLimits]] = []
        tenant_limits = self.config.tenants.get(tenant, self.config.default_tenant)
        if tenant_limits is not None:
            wanted.append((("tenant", tenant), tenant_limits))
        key_limits = None if key is None else self.config.keys.get(key)
        if key is not None and key_limits is not None:
            wanted.append((("key", key), key_limits))
        found: list[tuple[tuple[str, str], _Scope]] = []
        for k, limits in wanted:
            scope = self._scopes.get(k)
            if scope is None:
                scope = self._new_scope(k, limits, now)
            self._scopes.move_to_end(k)
            found.append((k, scope))
        return found

    def _new_scope(self, k: tuple[str, str], limits: QuotaLimits, now: float) -> _Scope:
        if len(self._scopes) >= _MAX_SCOPES:  # forget the least recently used idle scope
            idle = next((s for s, v in self._scopes.items() if v.concurrency == 0), None)
            if idle is not None:
                del self._scopes[idle]
        scope = _Scope(limits, now)
        self._scopes[k] = scope
        return scope
