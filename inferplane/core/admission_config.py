"""Configuration of admission control: queue bounds, shedding, headroom, quotas, workflows.

Frozen pydantic models with working defaults, so ``AdmissionConfig()`` is a usable
controller and a fleet YAML names only what it changes. Mounted in the fleet config as
``admission: AdmissionConfig = AdmissionConfig()`` (one line in ``FleetConfig``). Unknown
keys are errors, as in the rest of the configuration tree.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferplane.core.types import PriorityClass


class AdmissionMode(enum.Enum):
    """Which admission rule runs (the baselines exist to be compared against, same fleet).

    * ``inferplane``: the full rule of :mod:`inferplane.core.admission`;
    * ``fcfs``: no admission control: every call is admitted at once (tenant quotas still
      apply), so the engines' own unbounded queues serve in arrival order;
    * ``priority_shed``: the Kubernetes inference extension's rule (REFERENCE §5): a
      sheddable call gets 429 while the pool's saturation from scraped metrics (mean over
      its endpoints of ``max(waiting / queue_threshold, kv_use / kv_threshold)``) is at
      least 1, with no Retry-After hint (the header says 0); everything else is admitted.
    """

    INFERPLANE = "inferplane"
    FCFS = "fcfs"
    PRIORITY_SHED = "priority_shed"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PerClass(_Frozen):
    """One number per priority class."""

    critical: float
    standard: float
    sheddable: float

    def of(self, priority: PriorityClass) -> float:
        if priority is PriorityClass.CRITICAL:
            return self.critical
        return self.standard if priority is PriorityClass.STANDARD else self.sheddable


class QueueConfig(_Frozen):
    """The gateway queue: bounded by count and bytes; fair across tenants within a class."""

    max_items: int = Field(default=10_000, ge=1)
    max_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    #: Attained service per (class, tenant) halves every this many seconds.
    service_half_life_s: float = Field(default=60.0, gt=0)
    #: Fair-share weight per tenant (missing tenants weigh ``default_tenant_weight``).
    tenant_weights: dict[str, float] = Field(default_factory=dict)
    default_tenant_weight: float = Field(default=1.0, gt=0)
    #: How many queued calls one dispatch looks at before giving up (work conservation).
    max_scan: int = Field(default=256, ge=1)
    #: Longest a call may wait without a deadline, per class.
    max_wait_s: PerClass = PerClass(critical=120.0, standard=60.0, sheddable=30.0)

    @model_validator(mode="after")
    def _check_weights(self) -> QueueConfig:
        bad = sorted(t for t, w in self.tenant_weights.items() if not w > 0)
        if bad:
            raise ValueError(f"tenant weights must be > 0: {', '.join(bad)}")
        return self

    def weight_of(self, tenant: str) -> float:
        return self.tenant_weights.get(tenant, self.default_tenant_weight)


class QuotaLimits(_Frozen):
    """Limits of one tenant or one API key (None: unlimited).

    Rates are token buckets holding one minute's worth (bursts up to the per-minute limit);
    money is a fixed window of ``period_s`` aligned to multiples of it from t = 0.
    """

    requests_per_min: float | None = Field(default=None, gt=0)
    tokens_per_min: float | None = Field(default=None, gt=0)
    max_concurrency: int | None = Field(default=None, ge=1)
    usd_per_period: float | None = Field(default=None, gt=0)
    period_s: float = Field(default=86_400.0, gt=0)


class QuotasConfig(_Frozen):
    """Quotas per tenant and per API key name; ``default_tenant`` applies to unlisted tenants."""

    tenants: dict[str, QuotaLimits] = Field(default_factory=dict)
    keys: dict[str, QuotaLimits] = Field(default_factory=dict)
    default_tenant: QuotaLimits | None = None
    #: Output tokens reserved against tokens/min at admission (settled on completion).
    reserve_output_tokens: int = Field(default=256, ge=0)
    max_open_reservations: int = Field(default=100_000, ge=1)


class WorkflowConfig(_Frozen):
    """Workflow awareness: protection of sunk cost, fairness of attained service, retries."""

    idle_ttl_s: float = Field(default=300.0, gt=0)
    max_workflows: int = Field(default=100_000, ge=1)
    #: Steps assumed still to come when a workflow does not say how many it expects.
    assumed_remaining_steps: float = Field(default=10.0, gt=0)
    #: A protected workflow is shed at a saturation this much higher, times its progress.
    protect_headroom: float = Field(default=0.5, ge=0)
    #: The first call of a new workflow is shed at a saturation this much lower.
    new_workflow_margin: float = Field(default=0.1, ge=0)
    #: Queue order: a workflow's key moves earlier by up to this many seconds with progress...
    progress_credit_s: float = Field(default=2.0, ge=0)
    #: ...and later by up to this many seconds with attained service (tokens).
    service_penalty_s: float = Field(default=2.0, ge=0)
    service_scale_tokens: float = Field(default=200_000.0, gt=0)
    #: Retries of a step that keep the workflow's protection; beyond, it is a plain call.
    retry_allowance: int = Field(default=3, ge=0)
    #: Task-aware admission (:mod:`inferplane.core.admission_workflow`): a new workflow
    #: (not critical) is refused at its first call while its odds of finishing, (1 - the
    #: hazard that a workflow of its class dies per step now) ** its steps to go, are
    #: under ``min_finish_share``.
    finish_gate: bool = True
    min_finish_share: float = Field(default=0.5, ge=0, le=1)
    #: A workflow silent this long with steps to go has died (its clients retry a refused
    #: call and send the next step within a few seconds).
    abandon_after_s: float = Field(default=10.0, gt=0)
    #: Deaths and steps served count less with age (they halve every this)...
    step_outcome_half_life_s: float = Field(default=30.0, gt=0)
    #: ...plus this many steps served (a few early deaths do not close the gate).
    step_prior_calls: float = Field(default=20.0, ge=0)


class HeadroomConfig(_Frozen):
    """Capacity held back for higher classes, as a share of each endpoint, per class.

    A call of a class is admitted or dispatched to an endpoint only while that endpoint
    keeps ``floor(slot_share x max_num_seqs)`` of its sequence slots free after taking it
    (never its last slot), and its KV use is under ``kv_threshold - kv_share``. Critical
    (share 0) may use everything, so critical calls find a slot and KV at once instead of
    waiting for lower-class work to finish.

    Slots and KV rarely bind first: an engine's batch holds hundreds of sequences, and
    long before they fill, the prefill work queued at the engines delays every new call.
    So a lower class is also admitted or dispatched only while the predicted wait at the
    best endpoint (queued prefill, decode interference, slot wait) is at most its
    ``max_wait_s``: the engines' queues stay short enough for a critical call arriving
    next to meet a TTFT budget of a few seconds, and the rest waits in the gateway queue,
    where critical calls overtake it.

    The hold protects demand that exists: a class is held only while a call of a higher
    class arrived within ``demand_window_s`` (a fleet serving standard calls alone lets
    its engines queue as deep as its deadlines allow), and its cap follows the TTFT
    budgets those higher-class calls carry: ``budget_share`` x their mean budget (EWMA),
    or ``max_wait_s`` while they carry none. Budgets are on the gateway's clock, so the
    cap follows engines slower than the GPUs the defaults assume (emulated, scaled).
    """

    #: 0.07 / 0.13: 1 / 2 of 16 slots (17 / 33 of 256) kept for the classes above. On
    #: 16-slot engines decode barely slows with batch size, so every slot kept free costs
    #: 1/16 of the output rate: at 0.2 / 0.25 the peers' agentic run streamed 87% of
    #: capacity in its window; 0.07 / 0.13 ended 902 tasks in time vs 853 (same commit,
    #: peers-2026-12-01-h2diag1), critical 342/342 both. Neither simulator bench binds on
    #: slots (bench/overload.py 2x / 5x and bench/decode_hold_sim.py: identical figures at
    #: 0.2 / 0.25 and 0.07 / 0.13). Before: 0.8 / 0.85, then 0.2 / 0.25 once ``tpot_share``
    #: protected decode itself (overload.py good tasks/GPU-h 2x 16654 -> 19356).
    slot_share: PerClass = PerClass(critical=0.0, standard=0.07, sheddable=0.13)
    kv_share: PerClass = PerClass(critical=0.0, standard=0.1, sheddable=0.2)
    max_wait_s: PerClass = PerClass(critical=float("inf"), standard=1.0, sheddable=0.5)
    #: A class is held only while a higher class had a call within this many seconds.
    demand_window_s: float = Field(default=30.0, gt=0)
    #: Cap as a share of the higher classes' TTFT budgets (2 s budgets: the caps above).
    budget_share: PerClass = PerClass(critical=float("inf"), standard=0.5, sheddable=0.25)
    #: Decode protection: held while no endpoint's predicted TPOT with one more call is
    #: within its batch-of-one TPOT plus this share of the slack up to the TPOT the higher
    #: classes' deadlines need (``core.headroom.decode_cap_s``). 0.3 / 0.2: simulator on
    #: bench/overload_live.py's fleet (70B on 4xH100 + 4xA100, 300 s,
    #: bench/decode_hold_sim.py, seeds 0 and 1): critical chat 2x 100% / 99.6%, 5x 99.1% /
    #: 99.1% (standard 0.45: 5x 98.0% / 97.9%; 0.6 / 0.4: 97.5% / 97.9%). The former rule
    #: (0.6 / 0.4 of the need itself) held lower classes at any load on engines whose batch
    #: of one takes most of the need (the peers' 16-slot fleet with 2x deadlines).
    tpot_share: PerClass = PerClass(critical=float("inf"), standard=0.3, sheddable=0.2)

    @model_validator(mode="after")
    def _check_shares(self) -> HeadroomConfig:
        for name in ("slot_share", "kv_share"):
            per: PerClass = getattr(self, name)
            for value in (per.critical, per.standard, per.sheddable):
                if not 0.0 <= value < 1.0:
                    raise ValueError(f"headroom {name} must be in [0, 1): {value}")
        for name in ("max_wait_s", "budget_share", "tpot_share"):
            per = getattr(self, name)
            if min(per.critical, per.standard, per.sheddable) <= 0:
                raise ValueError(f"headroom {name} must be > 0")
        return self


class AdmissionConfig(_Frozen):
    """The admission rule (see :mod:`inferplane.core.admission`)."""

    #: The rule itself; ``fcfs`` and ``priority_shed`` are baselines for benchmarks.
    mode: AdmissionMode = AdmissionMode.INFERPLANE
    #: llm-d saturation: an endpoint is saturated at ``max(waiting/queue_threshold,
    #: kv_use/kv_threshold) >= 1``; the pool's saturation is the mean over its endpoints.
    queue_threshold: float = Field(default=5.0, gt=0)
    kv_threshold: float = Field(default=0.8, gt=0, le=1)
    #: Calls are dispatched to an endpoint while it has a free sequence slot, plus this many
    #: waiting at the engine (the rest wait in the gateway queue, routed at dispatch).
    engine_queue_allowance: int = Field(default=1, ge=0)
    #: Calls that may wait at an endpoint whose KV use is at ``kv_threshold`` (less the
    #: class's ``headroom.kv_share``), for a class with no KV kept above it: the engine
    #: admits them as its blocks free, without the scrape's lag. 0: the gateway holds
    #: every call while KV reads full (the rule before 2026-12-06).
    kv_queue_allowance: int = Field(default=8, ge=0)
    #: A class is shed once the pool's saturation reaches this (critical: never).
    shed_saturation: PerClass = PerClass(critical=float("inf"), standard=2.0, sheddable=1.0)
    #: ...but only while the call's predicted TTFT (its best endpoint, plus draining the
    #: queued work served before it) is at least this, scaled as the saturation threshold
    #: is by workflow progress. Saturation counts calls; a queue the fleet drains well
    #: inside a class's wait is no reason to refuse work (a pool whose new replica warms up
    #: queues a burst instead of killing tasks), while a long one still sheds at once. 0:
    #: saturation alone decides (llm-d's rule; the rule before). A call that states a TTFT
    #: budget, while no higher class has demand, is held to what is left of its budget
    #: instead where that is longer: refusing it protects no one, and it says what it can wait.
    shed_min_ttft_s: PerClass = PerClass(critical=float("inf"), standard=2.0, sheddable=1.0)
    #: Output tokens a call is assumed to generate before any finished (the prior of the
    #: length learned per model from finished calls, :mod:`inferplane.core.output_lengths`),
    #: for predicting completion and the queue's drain; cut at each call's max_tokens.
    expected_output_tokens: int = Field(default=256, ge=1)
    #: Reject early when the prediction exceeds the time left by this factor.
    deadline_slack: float = Field(default=1.0, gt=0)
    #: The deadline test's queue wait: of the queued calls of its own class keyed after a
    #: call (EDF: due later), the share it is assumed to overtake. 1: it waits only for
    #: those due before it; 0: for its whole class, as if FIFO (calls due sooner keep
    #: arriving while it waits, so a call due late is overtaken by work not yet queued).
    #: 0: peers agentic 1.5x at da43f90, one run: 914 tasks in time at 0 vs 795 at 1 (at 1
    #: agents' steps, due soonest, got through, 17-18 of 25 agents, at the cost of ~110
    #: standard chats; vllm-router 616), peers-2026-12-01-h2-final-agentic.md.
    edf_overtake_share: float = Field(default=0.0, ge=0, le=1)
    #: A call the deadline test refuses at the pool's best endpoint as it is is tested once
    #: more as a call waiting in the gateway queue for a slot (the queue's drain, then an
    #: endpoint with a free slot: ``core.admission_deadline.queued_miss``); False: the
    #: first test decides (the rule before; a diagnostic, never a default).
    queued_deadline_test: bool = True
    #: Critical calls predicted to miss their deadline are queued anyway unless this is set.
    reject_critical_on_deadline: bool = False
    min_retry_after_s: int = Field(default=1, ge=1)
    max_retry_after_s: int = Field(default=120, ge=1)
    #: Retry-After when nothing can be predicted (no endpoint takes work).
    unknown_retry_after_s: int = Field(default=5, ge=1)
    #: Slots and KV kept free for higher classes (critical headroom).
    headroom: HeadroomConfig = HeadroomConfig()
    queue: QueueConfig = QueueConfig()
    quotas: QuotasConfig = QuotasConfig()
    workflows: WorkflowConfig = WorkflowConfig()

    @model_validator(mode="after")
    def _check_retry_after(self) -> AdmissionConfig:
        if self.min_retry_after_s > self.max_retry_after_s:
            raise ValueError("min_retry_after_s is above max_retry_after_s")
        kv = self.headroom.kv_share
        if max(kv.critical, kv.standard, kv.sheddable) >= self.kv_threshold:
            raise ValueError("headroom kv_share must stay below kv_threshold")
        return self
