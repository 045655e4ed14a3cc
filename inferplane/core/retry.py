"""Retry policy: which failures may be retried, when, where, and how many at once.

Blind retries are how a slow replica takes a region down: every timeout becomes two or
three requests, the healthy replicas' queues grow, more calls time out, and so on. So a
retry here needs all of:

* a failure another endpoint might not have (connect error, reset, 5xx, timeout, 429;
  never a 4xx caused by the request, never a client that went away);
* safety: no byte has reached the client yet (the request is *replayed*), or the stream
  can be *resumed* from what was already sent (:mod:`inferplane.core.resumption`);
* attempts left (``max_attempts`` per call, the first one included), and time left
  before the call's deadline once the back-off is slept;
* the workflow's allowance: ``workflow_min_retries`` plus ``workflow_ratio`` of the calls
  it has made (Finagle-style), so one agent stuck in a failure loop cannot spend the
  gateway's budget;
* the gateway's budget (Envoy semantics, REFERENCE §4): retries in flight at most
  ``budget_ratio`` of the active plus pending requests, never fewer than
  ``min_concurrent_retries``.

A granted retry holds a budget slot until the caller calls ``release()``; it carries a
fully jittered exponential back-off (``uniform(0, min(cap, base x (2^n - 1)))``, 25 ms
base and 250 ms cap as in Envoy) and the endpoints to exclude: every one already tried,
the one that just failed included. Pure: ``now`` and a seeded RNG are passed in.
"""

from __future__ import annotations

import enum
import math
import random
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

from inferplane.core.types import CallContext

__all__ = [
    "Failure",
    "FailureKind",
    "RetryBudget",
    "RetryConfig",
    "RetryDecision",
    "RetryMode",
    "RetryReason",
    "backoff_s",
    "failure_of_status",
]


class FailureKind(enum.Enum):
    """Why an attempt failed, as far as the endpoint's health and retries are concerned."""

    CONNECT = "connect"  # could not connect
    RESET = "reset"  # connection broke or closed early
    SERVER_ERROR = "server_error"  # 5xx, or an error event from the engine mid-stream
    TIMEOUT = "timeout"  # no answer in time, or a stall beyond the inter-token timeout
    OVERLOADED = "overloaded"  # 429: a load signal, not a health one
    CLIENT_ERROR = "client_error"  # 4xx caused by the request itself
    CANCELLED = "cancelled"  # the client went away
    EXPIRED = "expired"  # the call's own time ran out (its deadline passed): not the engine's

    @property
    def counts_against_endpoint(self) -> bool:
        """Whether outlier detection counts it (only failures the endpoint caused)."""
        return self in _COUNTED

    @property
    def retryable(self) -> bool:
        """Another endpoint might succeed where this one failed."""
        return self in _COUNTED or self is FailureKind.OVERLOADED


_COUNTED = frozenset(
    {FailureKind.CONNECT, FailureKind.RESET, FailureKind.SERVER_ERROR, FailureKind.TIMEOUT}
)


def failure_of_status(status: int) -> FailureKind | None:
    """The failure an HTTP status from an engine stands for (None: not a failure)."""
    if status < 400:
        return None
    if status == 429:
        return FailureKind.OVERLOADED
    if status == 408:
        return FailureKind.TIMEOUT
    return FailureKind.CLIENT_ERROR if status < 500 else FailureKind.SERVER_ERROR


@dataclass(frozen=True, slots=True)
class RetryConfig:
    budget_ratio: float = 0.2
    min_concurrent_retries: int = 3
    max_attempts: int = 3  # per call, the first attempt included
    workflow_ratio: float = 0.2  # retries a workflow earns per call it makes
    workflow_min_retries: int = 3
    max_workflows: int = 10_000  # least recently seen workflows are forgotten past this
    backoff_base_s: float = 0.025
    backoff_cap_s: float = 0.25

    def __post_init__(self) -> None:
        if self.budget_ratio < 0 or self.workflow_ratio < 0:
            raise ValueError("retry ratios must be >= 0")
        if self.min_concurrent_retries < 0 or self.workflow_min_retries < 0:
            raise ValueError("retry minimums must be >= 0")
        if self.max_attempts < 1 or self.max_workflows < 1:
            raise ValueError("max_attempts and max_workflows must be >= 1")
        if not 0 <= self.backoff_base_s <= self.backoff_cap_s:
            raise ValueError("need 0 <= backoff_base_s <= backoff_cap_s")


class RetryMode(enum.Enum):
    NONE = "none"  # do not retry
    REPLAY = "replay"  # send the same request elsewhere: nothing reached the client yet
    RESUME = "resume"  # continue the partial stream elsewhere (resumption plan)


class RetryReason(enum.Enum):
    """Why a retry was granted or refused (a metric label)."""

    REPLAY = "replay"
    RESUME = "resume"
    NOT_RETRYABLE = "not_retryable"
    UNSAFE = "unsafe"  # bytes reached the client and the stream cannot be resumed
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    DEADLINE = "deadline"
    WORKFLOW_ALLOWANCE = "workflow_allowance"
    BUDGET_EXHAUSTED = "budget_exhausted"


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt, as the retry policy needs to know it."""

    endpoint: str
    kind: FailureKind
    client_bytes_sent: bool = False  # any byte of the answer already forwarded to the client
    resumable: bool = False  # a resumption plan exists for what was sent


@dataclass(frozen=True, slots=True)
class RetryDecision:
    mode: RetryMode
    reason: RetryReason
    detail: str
    backoff_s: float = 0.0
    exclude: frozenset[str] = frozenset()  # endpoints the retry must not go to
    attempt: int = 0  # the number of the attempt granted (2: the first retry)

    @property
    def allowed(self) -> bool:
        return self.mode is not RetryMode.NONE


def backoff_s(retry_number: int, rng: random.Random, config: RetryConfig) -> float:
    """Fully jittered exponential back-off before retry ``retry_number`` (1 = first)."""
    n = max(1, retry_number)
    upper = config.backoff_cap_s if n >= 32 else config.backoff_base_s * (2**n - 1)
    return rng.uniform(0.0, min(config.backoff_cap_s, upper))


class RetryBudget:
    """The gateway-wide retry budget and each workflow's allowance (mutable, pure)."""

    def __init__(self, config: RetryConfig | None = None) -> None:
        self._cfg = config or RetryConfig()
        self._in_flight = 0
        self._workflows: OrderedDict[str, list[int]] = OrderedDict()  # id -> [calls, retries]

    @property
    def config(self) -> RetryConfig:
        return self._cfg

    @property
    def in_flight(self) -> int:
        """Retries (and hedges) granted and not yet released."""
        return self._in_flight

    def limit(self, active_requests: int) -> int:
        """Most retries in flight allowed while ``active_requests`` are active or pending."""
        cfg = self._cfg
        share = math.floor(cfg.budget_ratio * max(0, active_requests) + 1e-9)
        return max(cfg.min_concurrent_retries, share)

    def try_acquire(self, active_requests: int) -> bool:
        """Take a slot for one extra attempt (a retry or a hedge) if the budget allows."""
        if self._in_flight + 1 > self.limit(active_requests):
            return False
        self._in_flight += 1
        return True

    def release(self) -> None:
        """The extra attempt is over (succeeded, failed or cancelled)."""
        self._in_flight = max(0, self._in_flight - 1)

    def on_call(self, workflow_id: str | None) -> None:
        """A call of ``workflow_id`` arrived: it earns the workflow ``workflow_ratio``."""
        if workflow_id is not None:
            self._workflow(workflow_id)[0] += 1

    def workflow_left(self, workflow_id: str | None) -> int | None:
        """Retries the workflow may still make (None: not a workflow)."""
        if workflow_id is None:
            return None
        calls, retries = self._workflows.get(workflow_id, (0, 0))
        cfg = self._cfg
        allowance = cfg.workflow_min_retries + math.floor(cfg.workflow_ratio * calls + 1e-9)
        return max(0, allowance - retries)

    def _workflow(self, workflow_id: str) -> list[int]:
        entry = self._workflows.get(workflow_id)
        if entry is None:
            entry = self._workflows[workflow_id] = [0, 0]
            while len(self._workflows) > self._cfg.max_workflows:
                self._workflows.popitem(last=False)
        else:
            self._workflows.move_to_end(workflow_id)
        return entry

    def may_retry(
        self,
        call: CallContext,
        failure: Failure,
        attempts_made: int,
        tried: Collection[str],
        now: float,
        rng: random.Random,
        *,
        active_requests: int,
    ) -> RetryDecision:
        """Decide whether the call that just failed is retried. A granted retry holds a
        budget slot: call ``release()`` when that attempt ends."""
        kind = failure.kind
        if not kind.retryable:
            return _deny(RetryReason.NOT_RETRYABLE, f"{kind.value} is not retried")
        if failure.client_bytes_sent and not failure.resumable:
            return _deny(RetryReason.UNSAFE, "answer already streaming and not resumable")
        mode = RetryMode.RESUME if failure.client_bytes_sent else RetryMode.REPLAY
        if attempts_made >= self._cfg.max_attempts:
            return _deny(RetryReason.ATTEMPTS_EXHAUSTED, f"{attempts_made} attempts made")
        wait_s = backoff_s(attempts_made, rng, self._cfg)
        if call.deadline_s is not None and now + wait_s >= call.deadline_s:
            return _deny(RetryReason.DEADLINE, f"deadline in {call.deadline_s - now:.3f}s")
        left = self.workflow_left(call.workflow_id)
        if left == 0:
            return _deny(RetryReason.WORKFLOW_ALLOWANCE, f"workflow {call.workflow_id} spent")
        if not self.try_acquire(active_requests):
            limit = self.limit(active_requests)
            why = f"{self._in_flight} retries in flight (limit {limit} of {active_requests})"
            return _deny(RetryReason.BUDGET_EXHAUSTED, why)
        if call.workflow_id is not None:
            self._workflow(call.workflow_id)[1] += 1
        reason = RetryReason.RESUME if mode is RetryMode.RESUME else RetryReason.REPLAY
        exclude = frozenset(tried) | {failure.endpoint}
        detail = f"{mode.value} after {kind.value} on {failure.endpoint}"
        return RetryDecision(mode, reason, detail, wait_s, exclude, attempts_made + 1)


def _deny(reason: RetryReason, detail: str) -> RetryDecision:
    return RetryDecision(RetryMode.NONE, reason, detail)
