"""How a call becomes work for endpoints: the call admission judges, and the ranked plan.

``admission_call`` is the call against the pool of its first target model that takes work
(admission runs before routing). ``plan_call`` routes it over the model's targets in order
(routes with fallbacks) on the tracker's state at that moment (for a queued call: when it is
dispatched, the late binding), and gives the proxy its candidates, the call as each
endpoint's target model sees it, and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferplane.core.types import CallContext
from inferplane.gateway.context import RequestContext, upstream_body
from inferplane.gateway.errors import ApiError
from inferplane.gateway.proxy import Candidate

if TYPE_CHECKING:
    from inferplane.gateway.app import Gateway

__all__ = ["admission_call", "plan_call"]


def plan_call(
    gw: Gateway,
    ctx: RequestContext,
    raw: bytes,
    body: dict[str, Any],
    admitted: CallContext | None = None,
) -> tuple[list[Candidate], dict[str, CallContext], str]:
    """Ranked endpoints to try (over the model's targets, in order), the call as each
    endpoint's target model sees it, and why.

    ``admitted`` (the call admission judged) is reused for its own model when no prompt
    keys change it: the same call, without building it again.
    """
    targets = gw.targets.get(ctx.model, ())
    if not targets:
        raise ApiError(
            404, f"the model '{ctx.model}' does not exist", param="model",
            code="model_not_found",
        )  # fmt: skip
    now = gw.clock()
    prompt = gw.router.prompt_keys(ctx.path, body, targets)
    candidates: list[Candidate] = []
    calls: dict[str, CallContext] = {}
    reasons: list[str] = []
    for target in targets:
        if admitted is not None and admitted.model == target and not prompt.num_tokens:
            call = admitted  # the same fields: no exact count, hence no block keys
        else:
            call = _target_call(ctx, target, prompt.num_tokens, prompt.keys)
        decision = gw.router.route(call, gw.tracker.views(now, target), now)
        gw.tracer.route(decision, target)
        reasons.append(f"{target}: {decision.reason}" if len(targets) > 1 else decision.reason)
        if decision.ranked:
            data = upstream_body(raw, body, target, ctx.stream)
            for name in decision.names():
                candidates.append(Candidate(name, gw.tracker.info(name).url + ctx.path, data))
                calls.setdefault(name, call)
        if len(candidates) > gw.retries or not gw.fallback.get(ctx.model, True):
            break
    return candidates, calls, "; ".join(reasons)


def _target_call(
    ctx: RequestContext, target: str, num_tokens: int | None, keys: tuple[int, ...]
) -> CallContext:
    """The call as ``target``'s endpoints see it (exact token count and block keys)."""
    return CallContext(
        request_id=ctx.request_id, tenant=ctx.tenant, model=target,
        priority=ctx.priority, arrival_s=ctx.arrival_s,
        num_prompt_tokens=num_tokens or ctx.num_prompt_tokens,
        max_tokens=ctx.max_tokens, deadline_s=ctx.deadline_s,
        ttft_budget_s=ctx.ttft_budget_s, workflow_id=ctx.workflow_id,
        workflow_step=ctx.workflow_step, workflow_steps=ctx.workflow_steps,
        stream=ctx.stream, prompt_block_keys=keys,
    )  # fmt: skip


def admission_call(gw: Gateway, ctx: RequestContext) -> CallContext:
    """The call as admission sees it: against the pool of its first target model that has an
    endpoint taking work (a route falls back when its first model is down)."""
    targets = gw.targets.get(ctx.model, ())
    if not targets:
        raise ApiError(
            404, f"the model '{ctx.model}' does not exist", param="model",
            code="model_not_found",
        )  # fmt: skip
    model = targets[0]
    if len(targets) > 1 and gw.fallback.get(ctx.model, True):
        now = gw.clock()
        for target in targets:
            if any(v.state.accepts_work for v in gw.tracker.views(now, target)):
                model = target
                break
    return CallContext(
        request_id=ctx.request_id, tenant=ctx.tenant, model=model,
        priority=ctx.priority, arrival_s=ctx.arrival_s,
        num_prompt_tokens=ctx.num_prompt_tokens, max_tokens=ctx.max_tokens,
        deadline_s=ctx.deadline_s, ttft_budget_s=ctx.ttft_budget_s,
        workflow_id=ctx.workflow_id, workflow_step=ctx.workflow_step,
        workflow_steps=ctx.workflow_steps, stream=ctx.stream,
    )  # fmt: skip
