"""Admission in the live gateway: the shell around the pure controller (``core.admission``).

A call passes :meth:`AdmissionGate.enter` before it is routed. Admitted calls return at
once; queued calls wait on a future keyed by request id until the controller lets them out
(late binding: the caller routes them only then, on fresh endpoint state); refused, expired
and evicted calls raise an :class:`~inferplane.gateway.errors.ApiError` with ``Retry-After``
and ``X-Inferplane-Reason``. A client that goes away while queued leaves the queue
(``cancel``). Every call that got through must be closed with :meth:`leave`, which settles
its quotas and polls the queue (work-conserving: a finished call frees a slot at once).
A short timer also polls while anything waits, so expiry and capacity that frees without a
finish here (engine scrapes) are seen within ``poll_interval_s``.

With a shared state store (Redis), request and token rates are taken from the shared
buckets first (:class:`~inferplane.state.quota_client.SharedQuotas`), so quotas hold across
workers and replicas; those use the wall clock (replicas share it), the rest the loop clock.
Token settlements (used minus reserved) are summed per tenant and key and charged every
``settle_interval_s`` (50 ms): one store call per scope, not one per request.
The workflow ledger is shared too (:class:`~inferplane.gateway.shared_ledger.SharedLedger`):
a workflow call reads the workflow's shared record (bounded, alongside the quota take)
before admission weighs it, and every change goes to the store from a background task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from inferplane.core.admission import Admission, Admit, Reject
from inferplane.core.admission_config import AdmissionConfig, AdmissionMode
from inferplane.core.capacity import AdmissionPredictor, endpoint_saturation, free_slots
from inferplane.core.queueing import ExitKind, QueueExit
from inferplane.core.quotas import QuotaExceeded
from inferplane.core.types import CallContext, EndpointView
from inferplane.gateway.errors import ApiError
from inferplane.gateway.metrics import GatewayMetrics
from inferplane.gateway.shared_ledger import SharedLedger
from inferplane.gateway.tracing import GatewayTracer, TracingConfig
from inferplane.state.quota_client import SharedQuotas

__all__ = ["REASON_HEADER", "AdmissionGate"]

log = logging.getLogger("inferplane.gateway.admission")

REASON_HEADER = "X-Inferplane-Reason"
_EXIT_CODES = {ExitKind.EXPIRED: "deadline", ExitKind.EVICTED: "evicted"}
_EXIT_TEXT = {
    ExitKind.EXPIRED: "the call could no longer meet its deadline while queued",
    ExitKind.EVICTED: "the call was pushed out of the queue by calls of a higher class",
}
Views = Callable[[float, str], list[EndpointView]]


class AdmissionGate:
    """Admit, queue or refuse each call; hold queued calls until dispatch (module doc)."""

    def __init__(
        self,
        config: AdmissionConfig,
        predictor: AdmissionPredictor,
        views: Views,
        clock: Callable[[], float],
        metrics: GatewayMetrics,
        shared: SharedQuotas | None = None,
        poll_interval_s: float = 0.02,
        tracer: GatewayTracer | None = None,
    ) -> None:
        self.core = Admission(config, predictor)
        # The gateway's tracer: a call that queues gets a ``queue`` hop (off: a no-op).
        self.tracer = tracer if tracer is not None else GatewayTracer(TracingConfig())
        self.poll_interval_s = poll_interval_s
        self._views = views
        self._clock = clock
        self._metrics = metrics
        self._shared = shared
        self._waiters: dict[str, asyncio.Future[QueueExit]] = {}
        # shared quota reservations: request id -> (tenant, key, tokens)
        self._reserved: dict[str, tuple[str, str | None, int]] = {}
        # token settlements not yet charged, summed per (tenant, key): one store call per
        # scope every ``settle_interval_s`` instead of one per request
        self._settle_due: dict[tuple[str, str | None], int] = {}
        self._settling: asyncio.Task[None] | None = None
        self.settle_interval_s = 0.05
        self._pending = 0  # dispatched, not yet resumed (not in the tracker's in-flight yet)
        self._wake = asyncio.Event()
        self.ledger_sync: SharedLedger | None = None
        if shared is not None:
            self.ledger_sync = SharedLedger(shared.store, self.core, clock)

    # -- the call's way in and out ------------------------------------------------------

    async def enter(
        self,
        call: CallContext,
        api_key: str | None,
        size_bytes: int,
        num_cached_tokens: int = 0,
    ) -> float:
        """Return when ``call`` may be routed (seconds it queued); raise ApiError if not.

        ``num_cached_tokens``: the prompt tokens the prefix index finds cached on the pool's
        best holder; admission prices the larger of it and the workflow's own estimate
        (:mod:`inferplane.core.prompt_reuse`) as already prefilled.
        """
        if self._shared is not None:
            if self.ledger_sync is not None and call.workflow_id is not None:
                await asyncio.gather(
                    self._take_shared(call, api_key), self.ledger_sync.hydrate(call)
                )
            else:
                await self._take_shared(call, api_key)
        now = self._clock()
        pool = self._views(now, call.model)
        prio: str = call.priority._value_  # ``.value`` is an interpreted property
        if self._fast_admit(call, pool, now, api_key):
            self._metrics.count_admission("admitted", "admitted", prio)
            return 0.0
        d = self.core.admit(
            call, pool, now, api_key=api_key, size_bytes=size_bytes,
            num_cached_tokens=num_cached_tokens,
        )  # fmt: skip
        if isinstance(d, Admit):
            self._metrics.count_admission("admitted", d.reason, prio)
            return 0.0
        if isinstance(d, Reject):
            self._metrics.count_admission("rejected", d.code, prio)
            self._settle_shared(call.request_id, 0)
            raise _refusal(d.status, d.message, d.code, d.retry_after_s)
        self._metrics.count_admission("queued", d.reason, prio)
        self._resolve(d.evicted)
        return await self._wait(call, prio, d.reason)

    async def _wait(self, call: CallContext, prio: str, reason: str) -> float:
        """Wait in the queue until dispatched (seconds waited); raise ApiError when the call
        expires or is evicted. The call's ``queue`` hop: only calls that queue have one."""
        tracer = self.tracer
        with tracer.hop("queue") as span:
            if tracer.enabled:
                span.set_attribute("inferplane.queue.reason", reason)
                span.set_attribute("inferplane.priority", prio)
            fut: asyncio.Future[QueueExit] = asyncio.get_running_loop().create_future()
            self._waiters[call.request_id] = fut
            self._wake.set()
            try:
                out = await fut
            except asyncio.CancelledError:
                self._waiters.pop(call.request_id, None)
                if fut.done() and not fut.cancelled():  # dispatched as the client left
                    self._pending -= 1
                    self.leave(call, num_tokens=0, success=False)
                elif self.core.cancel(call.request_id, self._clock()) is not None:
                    self._metrics.count_admission("cancelled", "client_disconnected", prio)
                    self._settle_shared(call.request_id, 0)
                raise
            if tracer.enabled:
                span.set_attribute("inferplane.queue.exit", out.kind.value)
                span.set_attribute("inferplane.queued_s", out.waited_s)
            if out.kind is ExitKind.DISPATCHED:
                self._pending -= 1
                return out.waited_s
            self._settle_shared(call.request_id, 0)
            raise _refusal(429, _EXIT_TEXT[out.kind], _EXIT_CODES[out.kind], 1)

    def _fast_admit(
        self, call: CallContext, pool: list[EndpointView], now: float, api_key: str | None
    ) -> bool:
        """The common case without latency predictions: nothing queued, no deadline, budget
        or workflow, a free slot and saturation under the class's threshold; quotas taken.

        The controller's own rule answers "admit" in exactly this case, but predicts TTFT on
        every endpoint first (as much CPU as routing); everything else takes the full path.
        Free slots are counted for the call's class, so the headroom kept for critical work
        holds here too; the predicted-wait cap of lower classes is left to the full path.
        """
        core = self.core
        if core.queue or call.workflow_id is not None:
            return False
        if call.deadline_s is not None or call.ttft_budget_s is not None:
            return False  # the full path weighs (and notes) its budgets
        if core.config.mode is AdmissionMode.INFERPLANE:
            core.note_arrival(call, now)  # demand the headroom protects (budget-less)
        cfg, predictor, model = core.slots_config(now), core.predictor, call.model
        free, saturation, accepting = 0, 0.0, 0
        for view in pool:
            if view.state.accepts_work:
                accepting += 1
                free += free_slots(view, model, predictor, cfg, call.priority)
                saturation += endpoint_saturation(view, model, predictor, cfg)
        if not free or saturation / accepting >= cfg.shed_saturation.of(call.priority):
            return False
        reserve = core.quotas.reserve_tokens(call.num_prompt_tokens, call.max_tokens)
        if core.quotas.try_acquire(call.request_id, call.tenant, api_key, reserve, now):
            return False  # the full path refuses it, naming the quota
        core.stats.on_admitted(call.priority)
        return True

    def leave(
        self,
        call: CallContext,
        *,
        num_tokens: int,
        cost_usd: float = 0.0,
        success: bool = True,
        num_output_tokens: int | None = None,
    ) -> None:
        """An admitted or dispatched call ended: settle it, then let waiting calls in."""
        self.core.on_finish(
            call, self._clock(), num_tokens=num_tokens, cost_usd=cost_usd, success=success,
            num_output_tokens=num_output_tokens,
        )  # fmt: skip
        self._settle_shared(call.request_id, num_tokens)
        if self.core.queue:
            self.poll()

    # -- the queue ----------------------------------------------------------------------

    def poll(self) -> None:
        """Expire futile calls and dispatch queued ones while their pools have room."""
        now = self._clock()
        # Calls dispatched by the last poll count in no view until they resume and are
        # routed; dispatching more before that would overfill the endpoints.
        limit = 0 if self._pending else None
        exits = self.core.poll(now, lambda model: self._views(now, model), limit)
        self._resolve(exits)

    def _resolve(self, exits: tuple[QueueExit, ...] | list[QueueExit]) -> None:
        for out in exits:
            call = out.item.call
            self._metrics.count_admission(out.kind.value, out.reason, call.priority.value)
            self._metrics.queue_time.labels(call.priority.value, out.kind.value).observe(
                out.waited_s
            )
            fut = self._waiters.pop(call.request_id, None)
            if fut is None or fut.done():
                if out.kind is ExitKind.DISPATCHED:  # nobody to serve: give the slot back
                    self.leave(call, num_tokens=0, success=False)
                continue
            if out.kind is ExitKind.DISPATCHED:
                self._pending += 1
            fut.set_result(out)

    async def run(self) -> None:
        """Poll every ``poll_interval_s`` while calls wait; sleep while the queue is empty
        (and, with a shared store, send workflow ledger changes alongside)."""
        if self.ledger_sync is None:
            await self._poll_loop()
            return
        sync = asyncio.create_task(self.ledger_sync.run())
        try:
            await self._poll_loop()
        finally:
            sync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sync
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.flush_settlements(), 1.0)

    async def end_workflow(self, workflow_id: str) -> bool:
        """The client reported the workflow's outcome: forget it here (and in the store)."""
        if self.ledger_sync is not None:
            return await self.ledger_sync.end(workflow_id)
        return self.core.workflows.end(workflow_id)

    async def _poll_loop(self) -> None:
        while True:
            if not self.core.queue:
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(self.poll_interval_s)
            try:
                self.poll()
            except Exception:  # the loop must outlive a bad poll
                log.exception("admission poll failed")

    def close(self) -> None:
        """Refuse everything still queued (the gateway is stopping)."""
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = dataclasses.asdict(self.core.snapshot())
        out["waiting"] = len(self._waiters)
        if self.ledger_sync is not None:
            out["workflow_sync"] = dataclasses.asdict(self.ledger_sync.stats())
        return out

    def depth(self) -> dict[str, int]:
        return dict(self.core.snapshot().queue_depth)

    # -- shared (cross-replica) rate quotas ---------------------------------------------

    async def _take_shared(self, call: CallContext, api_key: str | None) -> None:
        assert self._shared is not None
        n = self._shared.reserve_tokens(call.num_prompt_tokens, call.max_tokens)
        refusal = await self._shared.try_acquire(call.tenant, api_key, n, time.time())
        if refusal is not None:
            self._metrics.count_admission("rejected", refusal.code, call.priority.value)
            raise _quota_refusal(refusal, self.core.config)
        if n:
            self._reserved[call.request_id] = (call.tenant, api_key, n)

    def _settle_shared(self, request_id: str, num_tokens: int) -> None:
        held = self._reserved.pop(request_id, None)
        if held is None or self._shared is None:
            return
        tenant, key, reserved = held
        if num_tokens == reserved:
            return
        scope = (tenant, key)
        self._settle_due[scope] = self._settle_due.get(scope, 0) + num_tokens - reserved
        if self._settling is None or self._settling.done():
            self._settling = asyncio.ensure_future(self._settle_soon())

    async def _settle_soon(self) -> None:
        await asyncio.sleep(self.settle_interval_s)
        await self.flush_settlements()

    async def flush_settlements(self) -> None:
        """Charge (or refund) every token settlement not yet sent to the shared store."""
        due, self._settle_due = self._settle_due, {}
        for (tenant, key), delta in due.items():
            if self._shared is None or not delta:
                continue
            try:
                await self._shared.settle(tenant, key, 0, delta, time.time())
            except Exception:  # the resilient store does not raise; a plain one may
                log.warning("shared quota settlement failed", exc_info=True)


def _refusal(status: int, message: str, code: str, retry_after_s: int) -> ApiError:
    headers = {"Retry-After": str(retry_after_s), REASON_HEADER: code}
    return ApiError(status, message, code=code, headers=headers)


def _quota_refusal(refusal: QuotaExceeded, config: AdmissionConfig) -> ApiError:
    wait = refusal.retry_after_s
    ra = min(config.max_retry_after_s, max(config.min_retry_after_s, int(wait + 0.999)))
    return _refusal(429, refusal.reason, refusal.code, ra)
