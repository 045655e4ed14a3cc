"""A simulation scenario: fleet, workload, faults, policies to compare, duration and seed.

A scenario is a YAML file validated once into frozen pydantic models, like the fleet config
it points at (the very file ``inferplane serve`` takes). A bad file fails with the dotted path
of every bad field (``workload.1.agentic.calls_per_task: ...``); unknown keys are errors, so
a typo cannot silently fall back to a default.

Default token-length distributions follow REFERENCE §3. Its Azure figures give both
lognormal parameters and a median / p99 that do not agree with each other; the defaults here
use the median and p99 (what a reader checks first) and derive sigma from them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferplane.config import read_yaml_file, validate_yaml_tree
from inferplane.core.admission_config import AdmissionConfig
from inferplane.core.types import PriorityClass

_Z99 = 2.326  # standard normal quantile at 0.99


class ScenarioError(ValueError):
    """A scenario that cannot be run; the message names every bad field."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LogNormalMode(_Frozen):
    """One lognormal component: its median, its sigma (of the log) and its weight."""

    median: float = Field(gt=0)
    sigma: float = Field(default=0.0, ge=0, le=5)
    weight: float = Field(default=1.0, gt=0)


class LengthDist(_Frozen):
    """Token counts: a mixture of lognormal modes, rounded and clipped to [min, max].

    Accepts shorthands: ``512`` (constant), ``{median: 1020, sigma: 0.6}`` (one mode) or
    ``{median: 13, p99: 251}`` (one mode with sigma derived from the 99th percentile).
    """

    modes: tuple[LogNormalMode, ...] = Field(min_length=1)
    min_tokens: int = Field(default=1, ge=1)
    max_tokens: int = Field(default=1_000_000, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, int | float) and not isinstance(data, bool):
            return {"modes": [{"median": data}]}
        if isinstance(data, Mapping) and "median" in data:
            rest = {k: v for k, v in data.items() if k not in ("median", "sigma", "p99")}
            mode: dict[str, Any] = {"median": data["median"]}
            if "sigma" in data:
                mode["sigma"] = data["sigma"]
            elif "p99" in data:
                ratio = float(data["p99"]) / float(data["median"])
                if ratio < 1:
                    raise ValueError("p99 must be at least the median")
                mode["sigma"] = math.log(ratio) / _Z99
            return {**rest, "modes": [mode]}
        return data

    @model_validator(mode="after")
    def _check_bounds(self) -> LengthDist:
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens is above max_tokens")
        return self


def _dist(median: float, p99: float, max_tokens: int = 1_000_000) -> LengthDist:
    return LengthDist.model_validate({"median": median, "p99": p99, "max_tokens": max_tokens})


AZURE_CHAT_PROMPT = _dist(1020, 4142, 32_000)
AZURE_CHAT_OUTPUT = LengthDist(
    modes=(
        LogNormalMode(median=100, sigma=0.35, weight=0.65),
        LogNormalMode(median=400, sigma=0.3, weight=0.35),
    ),
    max_tokens=4096,
)
AZURE_CODE_PROMPT = _dist(1469, 20_000, 32_000)
AZURE_CODE_OUTPUT = _dist(13, 251, 4096)
MOONCAKE_OUTPUT = _dist(350, 1500, 8192)


class Slo(_Frozen):
    """Per-class service level: time to first token and end-to-end, both optional."""

    ttft_s: float | None = Field(default=None, gt=0)
    e2e_s: float | None = Field(default=None, gt=0)


class Diurnal(_Frozen):
    """Rate multiplier ``1 + amplitude * sin(2π (t + phase_s) / period_s)``."""

    period_s: float = Field(default=86_400.0, gt=0)
    amplitude: float = Field(default=0.5, ge=0, le=1)
    phase_s: float = 0.0


class _Source(_Frozen):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    priority: PriorityClass = PriorityClass.STANDARD
    model: str | None = None  # None: the fleet's first served model
    tenant: str | None = None  # None: the source name
    slo: Slo = Slo()
    start_s: float = Field(default=0.0, ge=0)
    stop_s: float | None = Field(default=None, gt=0)
    diurnal: Diurnal | None = None


class ChatSource(_Source):
    """Independent chat calls, near-Poisson (Azure 2023 conversation)."""

    kind: Literal["chat"]
    rate_rps: float = Field(gt=0)
    prompt_tokens: LengthDist = AZURE_CHAT_PROMPT
    output_tokens: LengthDist = AZURE_CHAT_OUTPUT


class CodeSource(_Source):
    """Completion calls in on/off bursts (Azure 2023 code: ~114 calls per burst, ~43 s gaps)."""

    kind: Literal["code"]
    burst_rate_rps: float = Field(default=23.0, gt=0)
    burst_s: float = Field(default=5.0, gt=0)  # mean on-period (exponential)
    gap_s: float = Field(default=43.0, gt=0)  # mean off-period (exponential)
    prompt_tokens: LengthDist = AZURE_CODE_PROMPT
    output_tokens: LengthDist = AZURE_CODE_OUTPUT


class LongContextSource(_Source):
    """Questions over shared long documents (Mooncake-style prefix reuse, Zipf popularity)."""

    kind: Literal["long_context"]
    rate_rps: float = Field(gt=0)
    num_documents: int = Field(default=100, ge=1, le=1_000_000)
    zipf_s: float = Field(default=1.1, ge=0)
    document_tokens: LengthDist = _dist(6000, 60_000, 120_000)
    question_tokens: LengthDist = _dist(300, 3000, 8000)
    output_tokens: LengthDist = MOONCAKE_OUTPUT


class AgenticSource(_Source):
    """Multi-call tasks: a shared system prompt, growing context and tool pauses between calls."""

    kind: Literal["agentic"]
    users: int = Field(default=10, ge=1)
    tasks_per_user_per_hour: float = Field(default=6.0, gt=0)
    calls_per_task: tuple[int, int] = (10, 20)  # inclusive range, uniform
    system_prompt_tokens: int = Field(default=2000, ge=0)
    first_input_tokens: LengthDist = _dist(1500, 6000, 32_000)
    tool_result_tokens: LengthDist = _dist(800, 8000, 32_000)
    output_tokens: LengthDist = _dist(500, 2000, 8192)
    tool_pause_s: float = Field(default=2.0, ge=0)  # mean (exponential)
    max_context_tokens: int = Field(default=100_000, ge=256)
    # The next call resends the previous answer verbatim (the tokens the simulated engine
    # generated), as a real agent does, so the answer's KV blocks can hit; off: the answer
    # comes back as fresh tokens (never cached). Off by default (results-changing).
    resend_answers: bool = False

    @model_validator(mode="before")
    @classmethod
    def _calls_shorthand(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("calls_per_task"), int):
            n = data["calls_per_task"]
            return {**data, "calls_per_task": (n, n)}
        return data

    @model_validator(mode="after")
    def _check_calls(self) -> AgenticSource:
        lo, hi = self.calls_per_task
        if lo < 1 or hi < lo:
            raise ValueError("calls_per_task must be [lo, hi] with 1 <= lo <= hi")
        return self


class TraceSource(_Source):
    """Replay of a public trace file (REFERENCE §3), path relative to the scenario file."""

    kind: Literal["trace"]
    path: str = Field(min_length=1)
    format: Literal["azure_csv", "mooncake_jsonl"]
    speedup: float = Field(default=1.0, gt=0)  # 2.0 replays twice as fast
    block_tokens: int = Field(default=512, ge=1)  # Mooncake hash_ids block size


Source = Annotated[
    ChatSource | CodeSource | LongContextSource | AgenticSource | TraceSource,
    Field(discriminator="kind"),
]


class _Fault(_Frozen):
    at_s: float = Field(ge=0)


class SlowdownFault(_Fault):
    """A degrading GPU: every step of the endpoints takes ``factor`` times longer."""

    kind: Literal["slowdown"]
    endpoints: tuple[str, ...] = Field(min_length=1)
    factor: float = Field(gt=0)
    duration_s: float | None = Field(default=None, gt=0)  # None: until the end


class CrashFault(_Fault):
    """Engines die: in-flight calls fail, the cache is lost; restart with a cold start."""

    kind: Literal["crash"]
    endpoints: tuple[str, ...] = Field(min_length=1)
    restart_after_s: float | None = Field(default=0.0, ge=0)  # None: stays down


class RegionOutageFault(_Fault):
    """Every endpoint of a region crashes and stays down for ``duration_s``, then cold-starts."""

    kind: Literal["region_outage"]
    region: str = Field(min_length=1)
    duration_s: float = Field(gt=0)


class ScaleOutFault(_Fault):
    """New replicas of an endpoint appear cold and take traffic once their weights load."""

    kind: Literal["scale_out"]
    template: str = Field(min_length=1)
    count: int = Field(default=1, ge=1, le=10_000)


Fault = Annotated[
    SlowdownFault | CrashFault | RegionOutageFault | ScaleOutFault,
    Field(discriminator="kind"),
]


class Clients(_Frozen):
    """Client behaviour: timeouts (None: the fleet config's per-class timeouts) and retries."""

    timeout_s: float | None = Field(default=None, gt=0)
    max_retries: int = Field(default=1, ge=0, le=20)
    backoff_s: float = Field(default=1.0, ge=0)  # doubles per retry, jittered ±50%
    retry_on_reject: bool = True
    #: A rejected client waits the answer's Retry-After (jittered up to +25%) when it has one.
    honour_retry_after: bool = True


class Demand(_Frozen):
    """Knobs that scale the whole workload: users (rates), calls per task, tokens per call."""

    users_x: float = Field(default=1.0, gt=0)
    calls_x: float = Field(default=1.0, gt=0)
    tokens_x: float = Field(default=1.0, gt=0)


class Speed(_Frozen):
    """Exactness the simulator trades for speed at fleet scale; 0 everywhere is exact.

    ``sync_s``: virtual seconds between syncs, when every engine catches up with the clock
    (its KV events reach the prefix index then), every endpoint view is rebuilt and
    admission's pool sums are recomputed; in between, only the views of endpoints whose
    in-flight count, engine state or first tokens changed are rebuilt (in-flight counts stay
    exact, as the gateway's own). None: the scrape interval (the live gateway's load data is
    that old too); 0: sync before every call (exact; time linear in the fleet per call).
    ``route_candidates``: the core's router ranks the prompt's prefix holders, the workflow's
    last endpoint and this many endpoints drawn at random from the pool (power of d choices)
    instead of the whole pool (0: the whole pool); ``admission_best_of``: admission predicts
    the call's TTFT on that many endpoints (least empty-prompt TTFT first) to find the pool's
    best (used only between syncs). See inferplane.sim.views, .capacity, core.candidates.
    """

    sync_s: float | None = Field(default=None, ge=0)
    route_candidates: int = Field(default=16, ge=0)
    admission_best_of: int = Field(default=8, ge=1)


class Scenario(_Frozen):
    """The whole scenario file."""

    name: str = Field(default="scenario", min_length=1)
    fleet: str = Field(min_length=1)  # path to the fleet config, relative to this file
    duration_s: float = Field(gt=0)
    drain_s: float = Field(default=60.0, ge=0)  # after duration: no arrivals, finish work
    seed: int = 0
    policies: tuple[str, ...] = ("inferplane",)
    workload: tuple[Source, ...] = Field(min_length=1)
    faults: tuple[Fault, ...] = ()
    clients: Clients = Clients()
    demand: Demand = Demand()
    sample_interval_s: float | None = Field(default=None, gt=0)  # None: duration / 200
    scrape_interval_s: float | None = Field(default=None, gt=0)  # None: the fleet config's
    #: The core's admission rule, for the ``inferplane`` policy (see inferplane.core.admission).
    admission: AdmissionConfig = AdmissionConfig()
    #: Who sizes the pools: ``off`` (the fleet config's endpoints, fixed), ``inferplane`` (the
    #: core's autoscaler with the fleet config's ``autoscale`` section) or ``queue-hpa``
    #: (production-stack's KEDA rule on waiting calls). None: the fleet config decides.
    autoscale: Literal["off", "inferplane", "queue-hpa"] | None = None
    speed: Speed = Speed()

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        from inferplane.sim.baselines import POLICY_NAMES

        unknown = [p for p in self.policies if p not in POLICY_NAMES]
        if unknown:
            known = ", ".join(POLICY_NAMES)
            raise ValueError(f"unknown policies {', '.join(unknown)}; known: {known}")
        if not self.policies or len(set(self.policies)) != len(self.policies):
            raise ValueError("policies must be a non-empty list without repeats")
        names = [s.name for s in self.workload]
        if len(set(names)) != len(names):
            raise ValueError("workload source names must be unique")
        return self

    def sample_every_s(self) -> float:
        if self.sample_interval_s is not None:
            return self.sample_interval_s
        return max(0.1, self.duration_s / 200.0)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate an already-parsed mapping into a Scenario or raise ScenarioError."""
    return validate_yaml_tree(data, Scenario, ScenarioError, "scenario", source)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a YAML scenario file."""
    return parse_scenario(read_yaml_file(path, ScenarioError, "scenario"), str(path))
