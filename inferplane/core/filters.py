"""Routing filters: which endpoints may take a call at all, each refusal with its reason.

Stage one needs only the call and the endpoint (model served, state accepts work, context
fits, not excluded by the caller, e.g. an endpoint that already failed this call). A LoRA
adapter is served under its own model name (as vLLM lists it in ``/v1/models``), so "adapter
present" is the model check. Stage two needs the latency predictions: latency-bound calls
never go to a warming replica while a ready one meets their budget, and critical calls
only to replicas predicted to meet their budget about as well as the best one (a long
critical answer sent to a slower, cheaper GPU because it won on cost and load missed its
deadline there). Pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from inferplane.core.types import CallContext, EndpointState, EndpointView, PriorityClass

#: A filter answers None (keep) or the reason the endpoint cannot take the call.
Filter = Callable[[CallContext, EndpointView], str | None]


def serves_model(call: CallContext, view: EndpointView) -> str | None:
    return None if view.serves(call.model) else f"does not serve {call.model!r}"


def accepts_work(call: CallContext, view: EndpointView) -> str | None:
    return None if view.state.accepts_work else f"state {view.state.value}"


def context_fits(call: CallContext, view: EndpointView) -> str | None:
    limit = view.info.max_model_len
    if limit is None or call.num_prompt_tokens + 1 <= limit:
        return None
    return f"prompt {call.num_prompt_tokens} tokens exceeds context {limit}"


FILTERS: tuple[tuple[str, Filter], ...] = (
    ("model", serves_model),
    ("state", accepts_work),
    ("context", context_fits),
)


def apply_filters(
    call: CallContext, views: Sequence[EndpointView], exclude: Collection[str] = ()
) -> tuple[list[EndpointView], list[tuple[str, str]]]:
    """Split endpoints into those that pass every filter and (name, reason) for the rest."""
    kept: list[EndpointView] = []
    refused: list[tuple[str, str]] = []
    for view in views:
        if view.name in exclude:
            refused.append((view.name, "excluded (already tried)"))
            continue
        for _, check in FILTERS:  # a plain loop: no generator per endpoint per call
            reason = check(call, view)
            if reason is not None:
                refused.append((view.name, reason))
                break
        else:
            kept.append(view)
    return kept, refused


def is_latency_bound(call: CallContext) -> bool:
    return call.ttft_budget_s is not None or call.deadline_s is not None


def prefer_warm(
    call: CallContext, views: Sequence[EndpointView], meets_budget: Mapping[str, bool]
) -> tuple[list[EndpointView], list[tuple[str, str]]]:
    """Drop warming endpoints for a latency-bound call when a ready one meets its budget."""
    if not is_latency_bound(call):
        return list(views), []
    warm_ok = any(v.state is EndpointState.READY and meets_budget.get(v.name, False) for v in views)
    if not warm_ok:
        return list(views), []
    kept = [v for v in views if v.state is not EndpointState.WARMING]
    refused = [
        (v.name, "warming; a ready endpoint meets the budget")
        for v in views
        if v.state is EndpointState.WARMING
    ]
    return kept, refused


#: A critical call goes only to endpoints whose predicted share of its budget is within
#: this factor of the best one's: a prediction that "meets" is an estimate, and a slower
#: replica that barely meets it decodes past the deadline once its batch grows.
CRITICAL_NEAR_BEST = 1.2


def prefer_meeting_budget(
    call: CallContext,
    views: Sequence[EndpointView],
    meets_budget: Mapping[str, bool],
    budget_uses: Mapping[str, float | None] | None = None,
) -> tuple[list[EndpointView], list[tuple[str, str]]]:
    """For a critical call, keep the endpoints that meet its budget (all when none does)
    and, given ``budget_uses``, use at most ``CRITICAL_NEAR_BEST`` x the best share of it
    (when none meets it: the ones that miss it least)."""
    if call.priority is not PriorityClass.CRITICAL or not is_latency_bound(call):
        return list(views), []
    meeting = [v for v in views if meets_budget.get(v.name, False)] or list(views)
    uses = budget_uses or {}
    known = [u for v in meeting if (u := uses.get(v.name)) is not None]
    if known:
        limit = min(known) * CRITICAL_NEAR_BEST
        meeting = [v for v in meeting if (u := uses.get(v.name)) is None or u <= limit]
    kept_names = {v.name for v in meeting}
    refused = [
        (v.name, "misses the budget, or uses much more of it than the best endpoint")
        for v in views
        if v.name not in kept_names
    ]
    return meeting, refused
