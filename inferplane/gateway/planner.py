"""How a call becomes work for endpoints: the call admission judges, and the ranked plan.

``admission_call`` is the call against the pool of its first target model that takes work
(admission runs before routing). ``plan_call`` routes it over the model's targets in order
(routes with fallbacks) on the tracker's state at that moment (for a queued call: when it is
dispatched, the late binding), and gives the proxy its candidates, the call as each
endpoint's target model sees it, and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferplane.core.routing import TargetChoice, choose_target
from inferplane.core.types import CallContext, RouteDecision
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
    """Ranked endpoints to try, the call as each endpoint's target model sees it, and why.

    Moving the work (``choose_target``): the route's targets are routed in order until one's
    best endpoint meets the call's latency budget; that target's endpoints come first, the
    others follow for failover. Fallback targets are used only when both the route
    (``allow_fallback``) and the request (``X-Allow-Fallback``) allow it. ``admitted`` (the
    call admission judged) is reused for its own model when no prompt keys change it.
    """
    targets = gw.targets.get(ctx.model, ())
    if not targets:
        raise ApiError(
            404, f"the model '{ctx.model}' does not exist", param="model",
            code="model_not_found",
        )  # fmt: skip
    allow = ctx.allow_fallback and gw.fallback.get(ctx.model, True)
    tried = targets if allow else targets[:1]
    now = gw.clock()
    prompt = gw.router.prompt_keys(ctx.path, body, tried)
    decisions: dict[str, RouteDecision] = {}
    target_calls: dict[str, CallContext] = {}
    num_ranked, met = 0, False
    for target in tried:
        if admitted is not None and admitted.model == target and not prompt.num_tokens:
            call = admitted  # the same fields: no exact count, hence no block keys
        else:
            call = _target_call(ctx, target, prompt.num_tokens, prompt.keys)
        decision = gw.router.route(call, gw.tracker.views(now, target), now)
        gw.tracer.route(decision, target)
        decisions[target], target_calls[target] = decision, call
        num_ranked += len(decision.ranked)
        met = met or bool(decision.ranked and decision.ranked[0].meets_budget)
        if met and num_ranked > gw.retries:
            break
    if len(decisions) == 1:  # one target: choose_target would pick it when it has endpoints
        ((target, decision),) = decisions.items()
        order, reason = [target], decision.reason
    else:
        choice = choose_target(tuple(decisions), decisions, allow)
        first = [choice.model] if choice.model is not None else []
        order = first + [t for t in decisions if t != choice.model]
        reason = _reason(choice, decisions)
    candidates, calls = _candidates(gw, ctx, raw, body, order, decisions, target_calls)
    return candidates, calls, reason


def _candidates(
    gw: Gateway,
    ctx: RequestContext,
    raw: bytes,
    body: dict[str, Any],
    order: list[str],
    decisions: dict[str, RouteDecision],
    target_calls: dict[str, CallContext],
) -> tuple[list[Candidate], dict[str, CallContext]]:
    """Each target's ranked endpoints in ``order``, with the body and call each is sent."""
    candidates: list[Candidate] = []
    calls: dict[str, CallContext] = {}
    for target in order:
        names = decisions[target].names()
        if names:
            data = upstream_body(raw, body, target, ctx.stream)
            for name in names:
                candidates.append(Candidate(name, gw.tracker.info(name).url + ctx.path, data))
                calls.setdefault(name, target_calls[target])
    return candidates, calls


def _reason(choice: TargetChoice, decisions: dict[str, RouteDecision]) -> str:
    if len(decisions) == 1:
        return next(iter(decisions.values())).reason
    routed = "; ".join(f"{t}: {d.reason}" for t, d in decisions.items())
    return f"{choice.reason} | {routed}"


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
    """The call as admission sees it: against the pool of the target the route would move it
    to now (the first whose best endpoint meets the budget, ``choose_target``), so a
    saturated primary with a fallback that fits does not refuse the call. Routes with one
    target (or whose fallback is off) judge the call against that target's pool."""
    targets = gw.targets.get(ctx.model, ())
    if not targets:
        raise ApiError(
            404, f"the model '{ctx.model}' does not exist", param="model",
            code="model_not_found",
        )  # fmt: skip
    model = targets[0]
    if len(targets) > 1 and ctx.allow_fallback and gw.fallback.get(ctx.model, True):
        now = gw.clock()
        decisions = {
            t: gw.router.route(_target_call(ctx, t, None, ()), gw.tracker.views(now, t), now)
            for t in targets
        }
        model = choose_target(targets, decisions).model or model
    return _target_call(ctx, model, None, ())
