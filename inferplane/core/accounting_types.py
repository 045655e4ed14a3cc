"""Values of the accounting ledger: what goes in (a finished request) and what comes out.

Kept apart from the ledger itself (``inferplane.core.accounting``) so the shells can build
records and read snapshots without the bookkeeping. A snapshot is plain data: every field
is a number, a string (enums as their values), a dict of those, or a tuple of frozen
dataclasses, so ``dataclasses.asdict(snapshot)`` is ready for JSON.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from inferplane.core.types import PriorityClass


class TaskOutcome(enum.Enum):
    """How a task ended (OPEN: still running, only in summaries)."""

    SUCCESS = "success"
    FAILURE = "failure"
    ABANDONED = "abandoned"  # idle past the TTL, or evicted when too many were open
    OPEN = "open"


@dataclass(frozen=True, slots=True, init=False)
class RequestRecord:
    """One finished (or rejected) request, as the gateway or simulator saw it.

    ``workflow_step`` counts from 1; a successful call whose step equals ``workflow_steps``
    completes its workflow.
    """

    request_id: str
    tenant: str
    model: str
    endpoint: str | None
    priority: PriorityClass
    workflow_id: str | None
    workflow_step: int | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    success: bool
    reason: str = ""
    workflow_steps: int | None = None
    #: The route's first target when a fallback model served the call (``model`` is the
    #: model that served it).
    fallback_from: str | None = None

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        request_id: str,
        tenant: str,
        model: str,
        endpoint: str | None,
        priority: PriorityClass,
        workflow_id: str | None,
        workflow_step: int | None,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        success: bool,
        reason: str = "",
        workflow_steps: int | None = None,
        fallback_from: str | None = None,
    ) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "endpoint", endpoint)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "workflow_id", workflow_id)
        object.__setattr__(self, "workflow_step", workflow_step)
        object.__setattr__(self, "prompt_tokens", prompt_tokens)
        object.__setattr__(self, "cached_tokens", cached_tokens)
        object.__setattr__(self, "completion_tokens", completion_tokens)
        object.__setattr__(self, "success", success)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "workflow_steps", workflow_steps)
        object.__setattr__(self, "fallback_from", fallback_from)


@dataclass(frozen=True, slots=True, init=False)
class RequestCost:
    """What one request cost: its share of its endpoints' time, all attempts included."""

    gpu_seconds: float
    usd: float

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(self, gpu_seconds: float, usd: float) -> None:
        object.__setattr__(self, "gpu_seconds", gpu_seconds)
        object.__setattr__(self, "usd", usd)


@dataclass(frozen=True, slots=True)
class EndpointSpend:
    """One endpoint's spend over the window, split by what it was doing."""

    name: str
    gpu: str
    state: str
    in_flight: int
    spend_usd: float
    busy_usd: float  # at least one request in flight
    idle_usd: float  # nothing in flight while ready, draining or ejected
    warming_usd: float  # nothing in flight while cold or warming
    busy_share: float  # busy time over window time


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Requests, tokens and cost for one model or one tenant."""

    key: str
    requests: int
    failed: int
    rejected: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: float
    gpu_seconds: float
    fallbacks: int = 0  # requests this model served as a route's fallback


@dataclass(frozen=True, slots=True)
class WorkflowSummary:
    """One workflow (task of many calls), open or closed."""

    workflow_id: str
    tenant: str
    outcome: str
    steps_done: int
    steps_expected: int | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    first_seen_s: float
    last_seen_s: float


@dataclass(frozen=True, slots=True)
class AccountingSnapshot:
    """Fleet totals at one instant.

    Identity: ``fleet_spend_usd == charged_usd + in_flight_usd + idle_usd + warming_usd``
    and ``busy_usd == charged_usd + in_flight_usd`` (floating-point rounding aside).
    """

    at_s: float
    window_s: float
    fleet_spend_usd: float
    busy_usd: float
    idle_usd: float
    warming_usd: float
    charged_usd: float  # sum of the costs of finished requests
    in_flight_usd: float  # accrued by requests still running
    wasted_usd: float  # cost of failed requests
    retry_usd: float  # cost of attempts abandoned by failover
    gpu_seconds: float
    charged_gpu_seconds: float
    num_requests: int
    num_failed: int
    num_rejected: int
    num_in_flight: int
    tasks: dict[str, int]  # by TaskOutcome value, "open" for running workflows
    cost_per_successful_task_usd: float | None
    success_per_dollar: float | None
    endpoints: tuple[EndpointSpend, ...]
    models: tuple[UsageTotals, ...]
    tenants: tuple[UsageTotals, ...]
    top_workflows: tuple[WorkflowSummary, ...]
    num_fallbacks: int = 0  # requests served by a fallback model of their route
