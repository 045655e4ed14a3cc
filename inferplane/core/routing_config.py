"""Configuration of the routing brain: scorer weights per pool, knobs, latency priors.

Frozen pydantic models with defaults, so ``RoutingConfig()`` is a working brain and a fleet
YAML only names what it changes. Mounted in the fleet config as
``routing: RoutingConfig = RoutingConfig()`` (one line in ``FleetConfig``).
Unknown keys are errors, as in the rest of the configuration tree.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ScorerWeights(_Frozen):
    """Weight of each axis in the pool's score (0 switches an axis off)."""

    kv_cache: float = Field(default=3.0, ge=0)  # prefix match fraction
    load: float = Field(default=2.0, ge=0)  # queue depth relative to the pool
    headroom: float = Field(default=2.0, ge=0)  # HBM headroom (1 - KV usage)
    latency: float = Field(default=2.0, ge=0)  # predicted TTFT vs the call's budget
    cost: float = Field(default=1.0, ge=0)  # USD per token, relative to the cheapest
    warm: float = Field(default=1.0, ge=0)  # weights warm; slow-start ramp while warming
    priority: float = Field(default=1.0, ge=0)  # critical calls prefer headroom
    affinity: float = Field(default=1.0, ge=0)  # the workflow's previous endpoint
    kv_claim: float = Field(default=3.0, ge=0)  # a new session: KV its sessions claim

    def as_dict(self) -> dict[str, float]:
        return dict(self.model_dump())


class EndpointPrior(_Frozen):
    """What an endpoint is expected to do before it has been observed (calibrated online).

    ``tpot = decode_base_s + decode_per_seq_s * batch + decode_full_kv_s * kv_usage``;
    prefill runs at ``prefill_tokens_per_s`` in chunks of ``chunk_tokens``; at most
    ``max_num_seqs`` calls run at once, each holding its slot ~``mean_output_tokens`` steps
    (until the predictor has learned the steps calls take: ``slot_wait_learned``);
    ``throughput_tokens_per_s`` (output tokens/s at saturation) prices a token.
    The defaults are Llama-3-8B on one H100 (REFERENCE §2).
    """

    prefill_tokens_per_s: float = Field(default=30_000.0, gt=0)
    chunk_tokens: int = Field(default=2048, ge=1)
    decode_base_s: float = Field(default=0.0075, gt=0)
    decode_per_seq_s: float = Field(default=0.00006, ge=0)
    decode_full_kv_s: float = Field(default=0.02, ge=0)
    throughput_tokens_per_s: float = Field(default=5_000.0, gt=0)
    max_num_seqs: int = Field(default=256, ge=1)  # batch slots; beyond, calls queue
    mean_output_tokens: float = Field(default=256.0, gt=0)  # how long a slot stays taken


class PredictorConfig(_Frozen):
    """Online calibration of the latency predictor (robust, decaying)."""

    ewma_alpha: float = Field(default=0.2, gt=0, le=1)  # weight of one observation (log space)
    clip_ratio: float = Field(default=4.0, ge=1)  # one observation moves at most this factor
    min_factor: float = Field(default=0.05, gt=0)  # bounds of the calibration factor
    max_factor: float = Field(default=20.0, gt=0)
    half_life_s: float = Field(default=120.0, gt=0)  # unobserved factors decay toward 1
    max_pending: int = Field(default=100_000, ge=1)  # dispatched calls awaiting first token
    #: The wait for a batch slot counts each call ahead as holding its slot for the decode
    #: steps learned from finished calls (their mean, over every endpoint) once
    #: ``slot_steps_min_calls`` calls have finished; before, or when off, for the prior's
    #: ``mean_output_tokens`` (a profile default, 256, unless the deployer states it).
    slot_wait_learned: bool = True
    slot_steps_min_calls: int = Field(default=20, ge=1)
    default_prior: EndpointPrior = EndpointPrior()
    #: Priors by ``model@gpu`` or ``gpu`` (most specific wins), else the default prior.
    priors: dict[str, EndpointPrior] = Field(default_factory=dict)


class RoutingConfig(_Frozen):
    """The routing pipeline's knobs."""

    weights: ScorerWeights = ScorerWeights()
    #: Weights per pool (model name); pools not listed use ``weights``.
    pool_weights: dict[str, ScorerWeights] = Field(default_factory=dict)
    #: 0: max score with a random tie-break; > 0: the primary is drawn with softmax(score / T).
    softmax_temperature: float = Field(default=0.0, ge=0)
    #: Ranked endpoints whose per-axis scores and reasons are built; the rest carry their
    #: total only. The decision's reason names the primary's best axes either way.
    explain_top: int = Field(default=0, ge=0)
    block_size: int = Field(default=16, ge=1)  # tokens per prefix-index block
    #: An affine endpoint keeps its bonus while its predicted TTFT over the best candidate's
    #: is at most ``affinity_penalty_ratio`` x the prefill time its cache saves.
    affinity_penalty_ratio: float = Field(default=1.0, ge=0)
    #: ... and, past that ratio, while its prediction uses at most this share of the call's
    #: latency budget (0: off): a holder that meets the budget with room to spare costs the
    #: caller nothing it asked for, and a cold copy costs the fleet the prefill again.
    #: 0.9, not 0.75: on the scoreboard's shared prefixes (seed 0, full run, same run) 0.75
    #: still sent 3 calls whose holder used 76-85% of the budget to a cold engine (95.3%
    #: hit rate; 7 calls and 95.0% in another run, routers 95.5%); 0.9 sent none (95.6%,
    #: every call with a holder on its best holder) at the same TTFT p90 (1.32 s).
    affinity_budget_use: float = Field(default=0.9, ge=0, le=1)
    #: Without prefix data, the share of a workflow call's prompt assumed cached on the
    #: endpoint that served the previous step.
    affinity_reuse_fraction: float = Field(default=0.8, ge=0, le=1)
    affinity_ttl_s: float = Field(default=300.0, gt=0)
    max_affinities: int = Field(default=100_000, ge=1)
    #: A new session's KV placement cost on an endpoint is the blocks its recent sessions
    #: claim plus this many times the blocks of the prompt it lacks (which would be copied
    #: there: a shared prefix on one more engine).
    claim_uncached_weight: float = Field(default=4.0, ge=0)
    #: The kv_claim score halves for each this many blocks of cost over the pool's least.
    claim_scale_blocks: float = Field(default=128.0, gt=0)
    #: Latency score is 1 while the prediction uses at most this share of the budget.
    budget_comfort: float = Field(default=0.5, gt=0, le=1)
    #: The load score halves for each this many outstanding requests over the least loaded.
    load_scale: float = Field(default=8.0, gt=0)
    #: Without a budget: the latency score halves for each this much TTFT over the best.
    latency_scale_s: float = Field(default=0.5, gt=0)
    #: Output tokens assumed at most when checking an end-to-end deadline.
    max_output_tokens_estimate: int = Field(default=1024, ge=1)
    #: Envoy slow start for warming endpoints: max(min, (t / window) ^ (1 / aggression)).
    slow_start_window_s: float = Field(default=30.0, gt=0)
    slow_start_aggression: float = Field(default=1.0, gt=0)
    slow_start_min_weight: float = Field(default=0.1, ge=0, le=1)
    #: Critical calls: KV usage above this counts as no headroom.
    critical_kv_limit: float = Field(default=0.8, gt=0, le=1)
    predictor: PredictorConfig = PredictorConfig()

    def weights_for(self, model: str) -> ScorerWeights:
        return self.pool_weights.get(model, self.weights)
