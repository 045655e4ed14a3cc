"""The gateway's bookkeeping for a call: accounting, Prometheus series and the request log.

The proxy fills an :class:`Exchange`; when the call is over the recorder turns it into a
``RequestRecord`` for the pure accountant (which returns the call's cost), observes the
latency histograms and writes one structured log line with the request id, tenant, endpoint
and the routing reason. Calls refused before reaching an engine are recorded as rejections.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from inferplane.core.accounting import Accountant, AccountingSnapshot, RequestRecord, TaskOutcome
from inferplane.core.types import EndpointInfo, EndpointState, client_workflow_id
from inferplane.gateway.context import RequestContext
from inferplane.gateway.metrics import GatewayMetrics
from inferplane.gateway.proxy import Exchange

log = logging.getLogger("inferplane.gateway.request")


class Recorder:
    """Owns the accountant and the gateway metrics; called once per finished call."""

    def __init__(
        self,
        endpoints: Sequence[EndpointInfo],
        start_s: float,
        workflow_idle_ttl_s: float,
        log_requests: bool,
        known_models: Sequence[str] = (),
    ) -> None:
        self.accountant = Accountant(endpoints, start_s, workflow_idle_ttl_s)
        # Metric labels only for configured model names: clients can send anything.
        self._known_models = frozenset(known_models)
        self.metrics = GatewayMetrics()
        self._log_requests = log_requests

    def on_endpoint_state(self, name: str, state: EndpointState, now: float) -> None:
        self.accountant.on_endpoint_state(name, state, now)

    def on_attempt(self, ctx: RequestContext, endpoint: str, now: float) -> None:
        self.accountant.on_request_start(ctx.request_id, endpoint, now, workflow_id=ctx.workflow_id)

    def on_retry(self, reason: str) -> None:
        self.metrics.retries.labels(reason).inc()

    def finish(self, ctx: RequestContext, ex: Exchange, route_reason: str, now: float) -> float:
        """Record a call that reached an endpoint; returns its cost in USD."""
        success = ex.completed and ex.status == 200 and not ex.reason
        if success and ctx.deadline_s is not None and now > ctx.deadline_s:
            success, ex.reason = False, "deadline_missed"
        record = self._record(ctx, ex, success)
        cost = self.accountant.on_request_end(record, now)
        if record.fallback_from is not None:
            self.metrics.fallbacks.labels(self._label(ctx.model), record.model).inc()
        self.metrics.observe_request(
            self._label(ctx.model),
            ctx.priority._value_,  # ``.value`` is an interpreted property
            str(ex.status or 502),
            None if ex.first_token_s is None else ex.first_token_s - ctx.arrival_s,
            ex.tbt_s,
            now - ctx.arrival_s,
            (ex.prompt_tokens, ex.cached_tokens, ex.completion_tokens),
        )
        if self._log_requests:
            self._log(ctx, ex, route_reason, cost.usd, now)
        return cost.usd

    def reject(self, ctx: RequestContext | None, status: int, reason: str, now: float) -> None:
        """A call refused before any engine saw it (bad input, unknown model, no endpoint)."""
        self.metrics.rejects.labels(reason).inc()
        if ctx is None:
            return
        ex = Exchange(status=status, reason=reason)
        self.accountant.on_request_rejected(self._record(ctx, ex, False), now)
        self.metrics.count_request(self._label(ctx.model), ctx.priority.value, str(status))
        if self._log_requests:
            self._log(ctx, ex, reason, 0.0, now)

    def _label(self, model: str) -> str:
        return model if model in self._known_models else "(unknown)"

    def end_workflow(self, workflow_id: str, outcome: TaskOutcome, now: float) -> bool:
        return self.accountant.end_workflow(workflow_id, outcome, now)

    def snapshot(self, now: float) -> AccountingSnapshot:
        self.accountant.expire(now)
        return self.accountant.snapshot(now)

    def refresh_spend(self, now: float) -> None:
        snap = self.snapshot(now)
        spend = {
            "total": snap.fleet_spend_usd,
            "busy": snap.busy_usd,
            "idle": snap.idle_usd,
            "warming": snap.warming_usd,
            "wasted": snap.wasted_usd,
        }
        self.metrics.refresh_spend(spend, snap.tasks, snap.cost_per_successful_task_usd or 0.0)

    @staticmethod
    def _record(ctx: RequestContext, ex: Exchange, success: bool) -> RequestRecord:
        served, primary = ex.served_model(), ex.primary_model
        return RequestRecord(
            request_id=ctx.request_id,
            tenant=ctx.tenant,
            model=served or ctx.model,
            endpoint=ex.endpoint,
            priority=ctx.priority,
            workflow_id=ctx.workflow_id,
            workflow_step=ctx.workflow_step,
            prompt_tokens=ex.prompt_tokens,
            cached_tokens=ex.cached_tokens,
            completion_tokens=ex.completion_tokens,
            success=success,
            reason=ex.reason or str(ex.status),
            workflow_steps=ctx.workflow_steps,
            fallback_from=primary if served and primary and served != primary else None,
        )

    @staticmethod
    def _log(ctx: RequestContext, ex: Exchange, route_reason: str, cost: float, now: float) -> None:
        ttft = (
            None if ex.first_token_s is None else round(1e3 * (ex.first_token_s - ctx.arrival_s), 3)
        )
        log.info(
            "request",
            extra={
                "request_id": ctx.request_id,
                "tenant": ctx.tenant,
                "model": ctx.model,
                "priority": ctx.priority.value,
                "workflow_id": ctx.workflow_id and client_workflow_id(ctx.tenant, ctx.workflow_id),
                "stream": ctx.stream,
                "endpoint": ex.endpoint,
                "attempts": ex.attempts,
                "status": ex.status,
                "reason": ex.reason,
                "route": route_reason,
                "ttft_ms": ttft,
                "e2e_ms": round(1e3 * (now - ctx.arrival_s), 3),
                "prompt_tokens": ex.prompt_tokens,
                "cached_tokens": ex.cached_tokens,
                "completion_tokens": ex.completion_tokens,
                "cost_usd": cost,
            },
        )
