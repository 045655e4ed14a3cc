"""The values the request context is made of: the caller, what the headers say, the call.

Built once per call (``context``), read everywhere after. Each writes its ``__init__`` out
(``init=False``): mypyc compiles it, where a named tuple's ``__new__`` or a dataclass's
generated ``__init__`` runs interpreted (``tests/core/test_explicit_init.py`` keeps each in
step with its fields).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.core.types import PriorityClass

__all__ = ["Caller", "HeaderContext", "RequestContext"]


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated caller and the priorities its key allows."""

    tenant: str
    default_priority: PriorityClass
    max_priority: PriorityClass
    key_name: str | None = None  # the API key's configured name (per-key quotas)


@dataclass(frozen=True, slots=True, init=False)
class RequestContext:
    """One call as the gateway sees it after parsing: headers, caller and body essentials.

    Built once per call with a written-out ``__init__`` (mypyc compiles it; a named tuple's
    ``__new__`` and a generated ``__init__`` run interpreted).
    """

    request_id: str
    tenant: str
    priority: PriorityClass
    arrival_s: float
    model: str
    path: str
    stream: bool
    client_wants_usage: bool
    num_prompt_tokens: int
    max_tokens: int
    deadline_s: float | None
    ttft_budget_s: float | None
    workflow_id: str | None
    workflow_step: int | None
    workflow_steps: int | None
    api_key_name: str | None = None  # the caller's configured key name (per-key quotas)
    #: ``X-Allow-Fallback``: may the route move this call to a fallback model? (The route's
    #: own ``allow_fallback`` must allow it too.)
    allow_fallback: bool = True

    def __init__(
        self,
        request_id: str,
        tenant: str,
        priority: PriorityClass,
        arrival_s: float,
        model: str,
        path: str,
        stream: bool,
        client_wants_usage: bool,
        num_prompt_tokens: int,
        max_tokens: int,
        deadline_s: float | None,
        ttft_budget_s: float | None,
        workflow_id: str | None,
        workflow_step: int | None,
        workflow_steps: int | None,
        api_key_name: str | None = None,
        allow_fallback: bool = True,
    ) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "arrival_s", arrival_s)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "stream", stream)
        object.__setattr__(self, "client_wants_usage", client_wants_usage)
        object.__setattr__(self, "num_prompt_tokens", num_prompt_tokens)
        object.__setattr__(self, "max_tokens", max_tokens)
        object.__setattr__(self, "deadline_s", deadline_s)
        object.__setattr__(self, "ttft_budget_s", ttft_budget_s)
        object.__setattr__(self, "workflow_id", workflow_id)
        object.__setattr__(self, "workflow_step", workflow_step)
        object.__setattr__(self, "workflow_steps", workflow_steps)
        object.__setattr__(self, "api_key_name", api_key_name)
        object.__setattr__(self, "allow_fallback", allow_fallback)


@dataclass(frozen=True, slots=True, init=False)
class HeaderContext:
    """What the headers say, before the body is read (``__init__`` written out, as in
    RequestContext)."""

    request_id: str
    caller: Caller
    priority: PriorityClass
    deadline_s: float | None = None
    ttft_budget_s: float | None = None
    workflow_id: str | None = None
    workflow_step: int | None = None
    workflow_steps: int | None = None
    allow_fallback: bool = True

    def __init__(
        self,
        request_id: str,
        caller: Caller,
        priority: PriorityClass,
        deadline_s: float | None = None,
        ttft_budget_s: float | None = None,
        workflow_id: str | None = None,
        workflow_step: int | None = None,
        workflow_steps: int | None = None,
        allow_fallback: bool = True,
    ) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "caller", caller)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "deadline_s", deadline_s)
        object.__setattr__(self, "ttft_budget_s", ttft_budget_s)
        object.__setattr__(self, "workflow_id", workflow_id)
        object.__setattr__(self, "workflow_step", workflow_step)
        object.__setattr__(self, "workflow_steps", workflow_steps)
        object.__setattr__(self, "allow_fallback", allow_fallback)
