"""The policy core's vocabulary: what it sees (views, calls) and what it answers (decisions).

Both bodies build these values: the gateway from scraping and its own in-flight counts, the
simulator from its engine models. The core never asks an endpoint anything; it reads a
snapshot and returns a decision that carries its reason, so every decision can be logged,
traced, counted and compared between the live gateway and the simulator.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class PriorityClass(enum.Enum):
    """Criticality of a call (the Kubernetes inference extension's names)."""

    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"

    @property
    def rank(self) -> int:
        """0 for the most important class; lower ranks are served and kept first."""
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {PriorityClass.CRITICAL: 0, PriorityClass.STANDARD: 1, PriorityClass.SHEDDABLE: 2}


class EngineKind(enum.Enum):
    """The protocol family an endpoint speaks (decides which metric names to scrape)."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    OPENAI = "openai"


class EndpointState(enum.Enum):
    """One state per endpoint, as the control plane sees it."""

    COLD = "cold"  # weights not loaded / not answering health checks
    WARMING = "warming"  # healthy again recently; takes a ramped share (slow start)
    READY = "ready"
    DRAINING = "draining"  # finishes in-flight work, takes no new work
    EJECTED = "ejected"  # taken out by outlier detection / circuit breaker

    @property
    def accepts_work(self) -> bool:
        return self in (EndpointState.READY, EndpointState.WARMING)


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """The static identity of one engine replica, from the fleet config."""

    name: str
    url: str
    kind: EngineKind
    models: tuple[str, ...]
    gpu: str
    price_per_hour_usd: float
    region: str
    max_model_len: int | None = None
    tensor_parallel: int = 1  # GPUs per replica: GPU-seconds accrue this many per second


@dataclass(frozen=True, slots=True)
class EndpointLoad:
    """The latest observed load of an endpoint (scraped or simulated)."""

    num_waiting: int = 0
    num_running: int = 0
    kv_usage: float = 0.0  # 0..1
    observed_at_s: float | None = None  # None: never observed

    def age_s(self, now: float) -> float:
        """Seconds since the observation; infinite when there is none."""
        return float("inf") if self.observed_at_s is None else max(0.0, now - self.observed_at_s)


@dataclass(frozen=True, slots=True, init=False)
class EndpointView:
    """What the core knows about one endpoint at one instant."""

    info: EndpointInfo
    state: EndpointState
    load: EndpointLoad = field(default_factory=EndpointLoad)
    in_flight: int = 0  # requests the gateway itself has outstanding there
    state_since_s: float = 0.0

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        info: EndpointInfo,
        state: EndpointState,
        load: EndpointLoad | None = None,
        in_flight: int = 0,
        state_since_s: float = 0.0,
    ) -> None:
        object.__setattr__(self, "info", info)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "load", EndpointLoad() if load is None else load)
        object.__setattr__(self, "in_flight", in_flight)
        object.__setattr__(self, "state_since_s", state_since_s)

    @property
    def name(self) -> str:
        return self.info.name

    def serves(self, model: str) -> bool:
        return model in self.info.models


@dataclass(frozen=True, slots=True, init=False)
class CallContext:
    """One call, parsed once at the front door."""

    request_id: str
    tenant: str
    model: str
    priority: PriorityClass
    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int
    deadline_s: float | None = None  # absolute, on the caller's clock
    ttft_budget_s: float | None = None  # relative to arrival
    workflow_id: str | None = None
    workflow_step: int | None = None
    workflow_steps: int | None = None
    stream: bool = False
    prompt_block_keys: tuple[int, ...] = ()

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        request_id: str,
        tenant: str,
        model: str,
        priority: PriorityClass,
        arrival_s: float,
        num_prompt_tokens: int,
        max_tokens: int,
        deadline_s: float | None = None,
        ttft_budget_s: float | None = None,
        workflow_id: str | None = None,
        workflow_step: int | None = None,
        workflow_steps: int | None = None,
        stream: bool = False,
        prompt_block_keys: tuple[int, ...] = (),
    ) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "arrival_s", arrival_s)
        object.__setattr__(self, "num_prompt_tokens", num_prompt_tokens)
        object.__setattr__(self, "max_tokens", max_tokens)
        object.__setattr__(self, "deadline_s", deadline_s)
        object.__setattr__(self, "ttft_budget_s", ttft_budget_s)
        object.__setattr__(self, "workflow_id", workflow_id)
        object.__setattr__(self, "workflow_step", workflow_step)
        object.__setattr__(self, "workflow_steps", workflow_steps)
        object.__setattr__(self, "stream", stream)
        object.__setattr__(self, "prompt_block_keys", prompt_block_keys)


@dataclass(frozen=True, slots=True)
class AxisScore:
    """One scorer's opinion of one endpoint, in [0, 1], with its reason."""

    axis: str
    score: float
    reason: str = ""


@dataclass(frozen=True, slots=True, init=False)
class RankedEndpoint:
    name: str
    score: float
    axes: tuple[AxisScore, ...] = ()
    predicted_ttft_s: float | None = None  # None: no prediction was made
    meets_budget: bool = True  # the prediction fits the call's latency budget (or none set)

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        name: str,
        score: float,
        axes: tuple[AxisScore, ...] = (),
        predicted_ttft_s: float | None = None,
        meets_budget: bool = True,
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "score", score)
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "predicted_ttft_s", predicted_ttft_s)
        object.__setattr__(self, "meets_budget", meets_budget)


@dataclass(frozen=True, slots=True, init=False)
class RouteDecision:
    """Endpoints in order of preference (primary first, then fallbacks) and why."""

    ranked: tuple[RankedEndpoint, ...]
    reason: str

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(self, ranked: tuple[RankedEndpoint, ...], reason: str) -> None:
        object.__setattr__(self, "ranked", ranked)
        object.__setattr__(self, "reason", reason)

    @property
    def primary(self) -> str | None:
        return self.ranked[0].name if self.ranked else None

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.ranked)


#: Between a tenant and its workflow id in the id the control plane keys workflows by. Client
#: ids never contain it (the gateway accepts ``[A-Za-z0-9_.:@/+=-]``), so no two (tenant, id)
#: pairs share a scoped id.
WORKFLOW_SCOPE_SEP = "|"


def scoped_workflow_id(tenant: str, workflow_id: str) -> str:
    """The id a tenant's workflow is kept under: two tenants that pick the same id (``job-1``,
    a session id their agent tool makes up) get two workflows, never one shared record of
    steps, sunk cost, affinity or spend, and one cannot end the other's."""
    return f"{tenant}{WORKFLOW_SCOPE_SEP}{workflow_id}"


def client_workflow_id(tenant: str, workflow_id: str) -> str:
    """The id as its tenant's client sent it (``workflow_id`` itself when not scoped)."""
    return workflow_id.removeprefix(f"{tenant}{WORKFLOW_SCOPE_SEP}")
