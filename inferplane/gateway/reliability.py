"""The gateway's reliability shell: the pure breaker, retry and throttle cores, fed live.

One :class:`Reliability` per gateway holds one ``BreakerBoard`` (endpoints grouped in pools,
a pool being the first model an endpoint serves), and per pool one ``RetryBudget`` and one
``AdaptiveThrottle``. The proxy asks it, per call and per attempt:

* ``begin_call`` / ``end_call``: the workflow earns retry allowance, the throttle may shed
  the call (429 with ``Retry-After``), the pool's active count feeds the budget;
* ``predict`` at dispatch: the predictor's *uncalibrated* TTFT/TPOT (a calibrated one
  absorbs a degraded GPU's slowness), the TTFT with the wait behind the engine's queue
  when it is KV-bound (``expected``: a KV-full engine's queue explains
  its TTFT; without it the breaker ejected healthy KV-full engines as latency outliers),
  against which ``record`` measures each attempt;
* ``record`` when an attempt ends: the breaker counts it; a transition (ejection, probe,
  return) is logged and mirrored in the tracker (EJECTED while the breaker is open);
  latencies count however the attempt ended (a client that gave up on a slow stream
  measured it as well as one that waited);
* ``may_retry`` / ``release``: the retry decision and the budget slot it holds.

Time-driven breaker transitions (ejection expiry, latency outliers) are swept at most once
per ``sweep_interval_s`` from the hot path (``maybe_sweep``), so no background task is
needed: with no traffic nobody needs the answer. The sweep also looks at the attempts still
running: a degraded GPU's streams are slow to *end* (and its clients time out first), so an
attempt already running longer than the breaker's latency limit times its predicted whole
duration (TTFT + TPOT x (max_tokens - 1)) is reported at once, as a lower bound
(``BreakerBoard.observe_overdue``). Attempts are told apart by the caller's ``attempt`` key
(the proxy passes its call's; ``predict`` at dispatch and ``record`` at the end are made for
the same call), or else by the asyncio task that runs them.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass

from inferplane.core.breaker import BreakerBoard, BreakerEvent, BreakerState, Outcome
from inferplane.core.predictor import LatencyEstimate, LatencyPredictor
from inferplane.core.retry import Failure, FailureKind, RetryBudget, RetryDecision
from inferplane.core.throttle import AdaptiveThrottle
from inferplane.core.types import CallContext, EndpointState
from inferplane.gateway.context import RequestContext
from inferplane.gateway.errors import ApiError
from inferplane.gateway.reliability_config import ReliabilityConfig
from inferplane.gateway.tracker import EndpointTracker

log = logging.getLogger("inferplane.gateway.reliability")

__all__ = ["AttemptTiming", "Reliability"]


@dataclass(frozen=True, slots=True, init=False)
class AttemptTiming:
    """What one attempt measured and what was predicted for it at dispatch."""

    ttft_s: float | None = None
    predicted_ttft_s: float | None = None
    tbt_s: float | None = None
    predicted_tbt_s: float | None = None

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        ttft_s: float | None = None,
        predicted_ttft_s: float | None = None,
        tbt_s: float | None = None,
        predicted_tbt_s: float | None = None,
    ) -> None:
        object.__setattr__(self, "ttft_s", ttft_s)
        object.__setattr__(self, "predicted_ttft_s", predicted_ttft_s)
        object.__setattr__(self, "tbt_s", tbt_s)
        object.__setattr__(self, "predicted_tbt_s", predicted_tbt_s)


@dataclass(slots=True, init=False)
class _Running:
    """An attempt in progress: where, since when, and how long it should take in all."""

    endpoint: str
    started_s: float
    predicted_s: float | None  # TTFT + TPOT x (max_tokens - 1); None: unknown length
    num_tokens: int = 0  # max_tokens
    overdue: bool = False  # reported to the breaker already

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        endpoint: str,
        started_s: float,
        predicted_s: float | None,
        num_tokens: int = 0,
        overdue: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.started_s = started_s
        self.predicted_s = predicted_s
        self.num_tokens = num_tokens
        self.overdue = overdue


class Reliability:
    """Breakers, retry budgets and throttles of one gateway (used from its event loop)."""

    def __init__(
        self,
        config: ReliabilityConfig,
        tracker: EndpointTracker,
        clock: Callable[[], float],
        predictor: LatencyPredictor | None = None,
    ) -> None:
        self.config = config
        self.predictor = predictor
        self._tracker = tracker
        self._clock = clock
        self._rng = random.Random(config.seed)
        self.board = BreakerBoard(config.breaker.to_core())
        self._pool_of: dict[str, str] = {}
        for name in tracker.names():
            models = tracker.info(name).models
            pool = models[0] if models else ""
            self._pool_of[name] = pool
            self.board.register(name, pool)
        self._budgets: dict[str, RetryBudget] = {}
        self._throttles: dict[str, AdaptiveThrottle] = {}
        self._active: Counter[str] = Counter()
        self._restore: dict[str, EndpointState] = {}  # state to return to after ejection
        self._last_sweep_s = clock()
        # Attempts watched, by the caller's key (or task): a plain dict, as ``record``
        # always follows ``predict`` (the proxy's ``finally``); a weak one costs interpreted
        # calls per attempt.
        self._running: dict[object, _Running] = {}
        self.counts: Counter[str] = Counter()  # retries, denials, resumptions, ejections
        tracker.attach_reliability(self)

    # ---- per call --------------------------------------------------------------------------

    def _budget(self, pool: str) -> RetryBudget:
        found = self._budgets.get(pool)
        if found is None:
            found = self._budgets[pool] = RetryBudget(self.config.retry.to_core())
        return found

    def begin_call(self, ctx: RequestContext, now: float) -> None:
        """The call enters the proxy; raises a 429 when the pool's throttle sheds it."""
        throttle_cfg = self.config.throttle
        if throttle_cfg.enabled:
            throttle = self._throttles.get(ctx.model)
            if throttle is None:
                throttle = self._throttles[ctx.model] = AdaptiveThrottle(throttle_cfg.to_core())
            decision = throttle.admit(now, self._rng)
            if decision.reject:
                self.counts["throttled"] += 1
                retry_after = f"{max(1, round(decision.retry_after_s or 1.0))}"
                raise ApiError(
                    429, f"endpoints are failing; shed locally ({decision.reason})",
                    code="throttled", headers={"Retry-After": retry_after},
                )  # fmt: skip
        self._budget(ctx.model).on_call(ctx.workflow_id)
        self._active[ctx.model] += 1

    def end_call(self, ctx: RequestContext) -> None:
        self._active[ctx.model] = max(0, self._active[ctx.model] - 1)

    def accepted(self, ctx: RequestContext, now: float) -> None:
        """An endpoint accepted the call (for the throttle)."""
        throttle = self._throttles.get(ctx.model)
        if throttle is not None:
            throttle.record_accept(now)

    # ---- per attempt -----------------------------------------------------------------------

    def admits(self, endpoint: str) -> bool:
        """Whether the breaker lets an attempt go to ``endpoint`` now."""
        if not self.config.breaker.enabled:
            return True
        # What ``board.overlay`` would make of the endpoint's view, without building it.
        state = self._tracker.state(endpoint)
        if state is EndpointState.EJECTED:
            return False
        return not (state.accepts_work and self.board.blocks(endpoint))

    def predict(
        self,
        endpoint: str,
        ctx: RequestContext,
        now: float,
        estimate: LatencyEstimate | None = None,
        attempt: object | None = None,
    ) -> tuple[float | None, float | None]:
        """The uncalibrated (TTFT, TPOT) predicted for ``ctx`` on ``endpoint`` now (routing's
        ``estimate`` at dispatch when given, not computed twice), the TTFT with the wait
        for the engine's queue (``expected``); the attempt is watched until ``record``
        (given the same ``attempt`` key, or called from the same task) ends it."""
        if self.predictor is None:
            return None, None
        ttft_s, tpot_s = self.expected(endpoint, ctx.model, ctx.num_prompt_tokens, now, estimate)
        num_tokens = ctx.max_tokens or 0
        if num_tokens > 0 and ttft_s is not None and self.config.breaker.enabled:
            # Watched only with a predicted total: the overdue check skips the others.
            total = ttft_s + tpot_s * (num_tokens - 1)
            key = (attempt if attempt is not None else _current_task()) if total else None
            if key is not None:
                self._running[key] = _Running(endpoint, now, total, num_tokens)
        return ttft_s, tpot_s

    def expected(
        self,
        endpoint: str,
        model: str,
        num_prompt_tokens: int,
        now: float,
        estimate: LatencyEstimate | None = None,
    ) -> tuple[float | None, float]:
        """What the breaker judges an attempt sent now against: the predictor's
        uncalibrated (TTFT, TPOT), the TTFT plus its wait behind the engine's queue when
        the engine is KV-bound (``LatencyPredictor.queue_wait_s``), so that a
        healthy engine's latency explained by its own queue is not an outlier while a
        degraded one's still is (that wait is at a healthy engine's pace). The TTFT is
        None (not judged) when that wait is not known yet: no call has finished."""
        assert self.predictor is not None
        view = self._tracker.view(endpoint, now)
        est = estimate
        if est is None:
            est = self.predictor.predict(view, model, num_prompt_tokens, now)
        queue_s = self.predictor.queue_wait_s(view, model, est.raw_tpot_s)
        if queue_s is None:
            self.counts["queued_dispatches_unjudged"] += 1
            return None, est.raw_tpot_s
        if queue_s > 0:
            self.counts["queued_dispatches"] += 1
        return est.raw_ttft_s + queue_s, est.raw_tpot_s

    def dispatch(self, endpoint: str) -> None:
        if self.config.breaker.enabled:
            self.board.on_dispatch(endpoint)

    def record(
        self,
        endpoint: str,
        failure: FailureKind | None,
        timing: AttemptTiming,
        now: float,
        attempt: object | None = None,
    ) -> None:
        """One attempt on ``endpoint`` ended (``failure`` None: it succeeded); ``attempt``:
        the key ``predict`` was given (None: the current task)."""
        if not self.config.breaker.enabled:
            return
        tbt_s, predicted_tbt_s = timing.tbt_s, timing.predicted_tbt_s
        key = (attempt if attempt is not None else _current_task()) if self._running else None
        running = None if key is None else self._running.pop(key, None)
        if running is not None and running.endpoint == endpoint and running.overdue:
            tbt_s = predicted_tbt_s = None  # its slowness is counted already
        outcome = Outcome(failure, timing.ttft_s, timing.predicted_ttft_s, tbt_s, predicted_tbt_s)
        self._apply(self.board.record(endpoint, outcome, now))
        self.maybe_sweep(now)

    def may_retry(
        self,
        ctx: RequestContext,
        failure: Failure,
        attempts_made: int,
        tried: Collection[str],
        now: float,
    ) -> RetryDecision:
        """The retry decision; a granted one holds a budget slot until ``release``."""
        call = CallContext(
            request_id=ctx.request_id, tenant=ctx.tenant, model=ctx.model,
            priority=ctx.priority, arrival_s=ctx.arrival_s,
            num_prompt_tokens=ctx.num_prompt_tokens, max_tokens=ctx.max_tokens,
            deadline_s=ctx.deadline_s, workflow_id=ctx.workflow_id, stream=ctx.stream,
        )  # fmt: skip
        budget = self._budget(ctx.model)
        decision = budget.may_retry(
            call, failure, attempts_made, tried, now, self._rng,
            active_requests=self._active[ctx.model],
        )  # fmt: skip
        self.counts[f"retry_{decision.reason.value}"] += 1
        return decision

    def release(self, ctx: RequestContext) -> None:
        self._budget(ctx.model).release()

    # ---- breaker transitions ---------------------------------------------------------------

    def maybe_sweep(self, now: float) -> None:
        """Sweep the breakers when ``sweep_interval_s`` has passed since the last sweep."""
        if not self.config.breaker.enabled:
            return
        if now - self._last_sweep_s >= self.config.breaker.sweep_interval_s:
            self._last_sweep_s = now
            self._check_running(now)
            self._apply(self.board.sweep(now))

    def _check_running(self, now: float) -> None:
        """Report each attempt running past its endpoint's latency limit, once."""
        for running in list(self._running.values()):
            if running.overdue or not running.predicted_s:
                continue
            name, elapsed_s = running.endpoint, now - running.started_s
            stat = self.board.overdue_stat(
                name, elapsed_s, running.predicted_s, running.num_tokens, now
            )
            if stat is not None:
                running.overdue = True
                self.counts["overdue_attempts"] += 1
                self._apply(self.board.observe_overdue(name, stat, now))

    def _apply(self, events: list[BreakerEvent]) -> None:
        for event in events:
            log.info(
                "breaker",
                extra={
                    "endpoint": event.endpoint, "from": event.before.value,
                    "to": event.after.value, "trigger": event.trigger.value,
                    "why": event.reason,
                },
            )  # fmt: skip
            self.counts[f"breaker_{event.trigger.value}"] += 1
            name, state = event.endpoint, self._tracker.state(event.endpoint)
            if event.after is BreakerState.OPEN:
                if state is not EndpointState.EJECTED:
                    self._restore[name] = state
                    self._tracker.set_state(name, EndpointState.EJECTED)
            elif event.before is BreakerState.OPEN and state is EndpointState.EJECTED:
                self._tracker.set_state(name, self._restore.pop(name, EndpointState.READY))

    def breaker_state(self, endpoint: str) -> str:
        return self.board.state(endpoint).value

    def stats(self) -> dict[str, object]:
        """JSON-able counters and budgets for /v1/stats."""
        return {
            "counts": dict(self.counts),
            "retries_in_flight": {p: b.in_flight for p, b in self._budgets.items()},
            "active": dict(self._active),
        }


def _current_task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop (a synchronous caller, as in unit tests)
        return None
