"""A pool's capacity as admission sees it: saturation, free dispatch slots, predicted wait.

One snapshot per decision, from the endpoint views (scraped load plus the gateway's own
in-flight counts, which are always current) and the latency predictor:

* an endpoint's *outstanding* calls are ``max(running + waiting, in_flight)``; those beyond
  its batch slots (``max_num_seqs`` of its prior) wait at the engine, so the waiting count
  used is ``max(scraped waiting, outstanding - slots)``;
* endpoint saturation is the llm-d rule ``max(waiting / queue_threshold, kv / kv_threshold)``
  and the pool's engine saturation its mean over endpoints that accept work. Calls waiting
  in the gateway queue ahead of a class count as more engine waiting, spread over the
  pool, so shedding follows capacity: twice the endpoints hold twice the queue;
* an endpoint takes a dispatch while its outstanding calls fit its slots plus
  ``engine_queue_allowance`` and, once its KV use reaches ``kv_threshold``, while fewer
  than ``kv_queue_allowance`` calls wait at it: a KV-bound engine admits from its own queue
  the moment blocks free, where the gateway would see it only a scrape later (and then send
  a pass's worth at once). A class below critical sees both limits lowered by its headroom
  share (``AdmissionConfig.headroom``) and, while that share of KV is kept (demand above
  it), no queue at a KV-bound engine: the last slots and KV of every endpoint stay free for
  critical calls, and its own calls wait in the gateway, where those overtake them;
* a class below critical is also held back while the predicted wait at the pool's best
  endpoint exceeds its ``headroom.max_wait_s`` (:class:`DispatchBudget` at dispatch);
* queued work drains at the pool's summed prefill and decode rates;
* a call that finds no free slot waits in the gateway queue, not at an engine, and leaves
  it when any endpoint frees one (late binding): :func:`ready_estimate` predicts it on each
  endpoint as that endpoint will be once a slot is free (nothing waiting there), instead
  of charging every full engine's own slot wait (until the predictor has learned the
  decode steps calls take, its prior of a slot held ``mean_output_tokens``, 256 by default,
  read 1.8 s per call beyond the 16 slots of the peers' engines, whose calls decode 8-128
  tokens; learned, it is the fleet's mean, ``PredictorConfig.slot_wait_learned``).

Pure: ``now`` is passed in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferplane.core.admission_config import AdmissionConfig
from inferplane.core.predictor import LatencyEstimate
from inferplane.core.queueing import WorkAhead
from inferplane.core.routing_config import EndpointPrior
from inferplane.core.types import CallContext, EndpointView, PriorityClass

__all__ = [
    "AdmissionPredictor",
    "DispatchBudget",
    "PoolCapacity",
    "endpoint_room",
    "engine_waiting",
    "free_slots",
    "kv_queue",
    "pool_capacity",
    "ready_estimate",
    "scraped_saturation",
]

_RATE_PROBE_TOKENS = 100_000


class AdmissionPredictor(Protocol):
    """What admission needs of a latency predictor (:class:`LatencyPredictor` fits)."""

    def prior(self, view: EndpointView, model: str) -> EndpointPrior: ...

    def predict(
        self, view: EndpointView, model: str, num_uncached_tokens: int, now: float
    ) -> LatencyEstimate: ...

    def prefill_s(self, view: EndpointView, model: str, num_tokens: int, now: float) -> float: ...

    def throughput_tokens_per_s(self, view: EndpointView, model: str, now: float) -> float: ...


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """The pool serving one call, at one instant."""

    num_accepting: int  # endpoints that take work now
    engine_saturation: float  # llm-d mean over accepting endpoints (inf: none accepting)
    free_slots: int  # dispatches the pool takes now
    best: LatencyEstimate | None  # the call sent now to its best endpoint (least TTFT)
    prefill_tokens_per_s: float  # summed over accepting endpoints
    output_tokens_per_s: float

    def saturation(self, ahead: WorkAhead, queue_threshold: float) -> float:
        """Engine saturation plus the gateway queue ahead, as waiting spread over the pool."""
        if self.num_accepting == 0:
            return float("inf")
        return self.engine_saturation + ahead.num_calls / (self.num_accepting * queue_threshold)

    def drain_s(self, ahead: WorkAhead) -> float:
        """Seconds for the pool to serve ``ahead`` at its saturated rates."""
        if self.num_accepting == 0:
            return float("inf")
        return (
            ahead.prompt_tokens / self.prefill_tokens_per_s
            + ahead.output_tokens / self.output_tokens_per_s
        )


def prefill_rate(
    pool: Sequence[EndpointView], model: str, predictor: AdmissionPredictor, now: float
) -> float:
    """Summed prefill tokens/s of the endpoints of ``pool`` that take work (0: none)."""
    return sum(
        _RATE_PROBE_TOKENS / max(1e-9, predictor.prefill_s(v, model, _RATE_PROBE_TOKENS, now))
        for v in pool
        if v.state.accepts_work
    )


class DispatchBudget:
    """What one dispatch pass may still send, per model and class.

    Free slots per class (headroom left), and the least predicted wait over the pool's
    endpoints, both charged for the calls this pass already sent: the views predate them.
    A sent call adds its prompt to the wait at the pool's summed prefill rate.
    """

    def __init__(
        self,
        pool_for: Callable[[str], Sequence[EndpointView]],
        predictor: AdmissionPredictor,
        cfg: AdmissionConfig,
        now: float,
    ) -> None:
        self._pool_for, self._predictor, self._cfg, self._now = pool_for, predictor, cfg, now
        self._free: dict[tuple[str, PriorityClass], int] = {}
        self._wait: dict[str, tuple[float, float]] = {}  # model: (least wait s, prefill rate)
        self._sent: dict[str, tuple[int, int]] = {}  # model: (calls, prompt tokens)

    def allows(self, call: CallContext) -> bool:
        """Whether ``call`` may be dispatched now (a slot for its class, wait under its cap)."""
        model, prio = call.model, call.priority
        calls, tokens = self._sent.get(model, (0, 0))
        if (model, prio) not in self._free:
            pool, pred, cfg = self._pool_for(model), self._predictor, self._cfg
            self._free[(model, prio)] = sum(free_slots(v, model, pred, cfg, prio) for v in pool)
        if self._free[(model, prio)] - calls <= 0:
            return False
        max_wait_s = self._cfg.headroom.max_wait_s.of(prio)
        if math.isinf(max_wait_s):
            return True
        wait_s, rate = self._least_wait(model)
        return bool(wait_s + (tokens / rate if rate > 0 else 0.0) <= max_wait_s)

    def charge(self, call: CallContext, prefill_tokens: int | None = None) -> None:
        """``call`` was dispatched, to prefill ``prefill_tokens`` (None: its whole prompt)."""
        calls, tokens = self._sent.get(call.model, (0, 0))
        n = call.num_prompt_tokens if prefill_tokens is None else prefill_tokens
        self._sent[call.model] = (calls + 1, tokens + n)

    def _least_wait(self, model: str) -> tuple[float, float]:
        if model not in self._wait:
            pool, pred, now = self._pool_for(model), self._predictor, self._now
            waits = [pred.predict(v, model, 0, now).wait_s for v in pool if v.state.accepts_work]
            rate = prefill_rate(pool, model, pred, now)
            self._wait[model] = (min(waits, default=float("inf")), rate)
        return self._wait[model]


def _outstanding(view: EndpointView) -> int:
    load = view.load
    return max(load.num_running + load.num_waiting, view.in_flight)


def free_slots(
    view: EndpointView,
    model: str,
    predictor: AdmissionPredictor,
    cfg: AdmissionConfig,
    priority: PriorityClass | None = None,
) -> int:
    """Dispatches of ``priority`` that ``view`` takes now (0: no work accepted, or full).

    ``priority`` None (or critical, by default) may use the whole endpoint; lower classes
    stop short of the headroom kept for the classes above them.
    """
    if not view.state.accepts_work:
        return 0
    num_seqs = predictor.prior(view, model).max_num_seqs
    slot_share = kv_share = 0.0
    if priority is not None:
        slot_share = cfg.headroom.slot_share.of(priority)
        kv_share = cfg.headroom.kv_share.of(priority)
    return endpoint_room(
        num_seqs,
        _outstanding(view),
        engine_waiting(view),
        view.load.kv_usage,
        cfg.engine_queue_allowance,
        slot_share,
        cfg.kv_threshold - kv_share,
        kv_queue(cfg, kv_share),
    )


def engine_waiting(view: EndpointView) -> int:
    """Calls waiting at ``view``'s engine: scraped, or in flight beyond those running (sent
    since the scrape)."""
    load = view.load
    return max(load.num_waiting, view.in_flight - load.num_running)


def kv_queue(cfg: AdmissionConfig, kv_share: float) -> int:
    """Calls a class may queue at a KV-bound endpoint: none while KV is kept above it."""
    return 0 if kv_share > 0 else cfg.kv_queue_allowance


def endpoint_room(
    num_seqs: int,
    outstanding: int,
    waiting: int,
    kv_usage: float,
    allowance: int,
    slot_share: float,
    kv_limit: float,
    kv_queue: int,
) -> int:
    """Dispatches an endpoint takes (:func:`free_slots`' arithmetic; the simulator's
    capacity book runs it too): free slots (``num_seqs`` plus ``allowance`` less the share
    kept, less the ``outstanding`` calls) and, once its KV use reaches ``kv_limit``, no more
    than ``kv_queue`` calls ``waiting`` at it."""
    # floor: a share < 1 never takes an endpoint's last slot (a 1-slot engine keeps none)
    free = num_seqs + allowance - math.floor(slot_share * num_seqs) - outstanding
    if kv_usage >= kv_limit:
        free = min(free, kv_queue - waiting)
    return free if free > 0 else 0


def endpoint_saturation(
    view: EndpointView, model: str, predictor: AdmissionPredictor, cfg: AdmissionConfig
) -> float:
    """llm-d: max(waiting / queue threshold, kv use / kv threshold), waiting from in-flight too."""
    excess = _outstanding(view) - predictor.prior(view, model).max_num_seqs
    waiting = max(view.load.num_waiting, excess)
    return max(waiting / cfg.queue_threshold, view.load.kv_usage / cfg.kv_threshold)


def scraped_saturation(
    pool: Sequence[EndpointView], queue_threshold: float, kv_threshold: float
) -> float:
    """llm-d's pool saturation from scraped metrics alone: the mean over the endpoints of
    ``max(waiting / queue_threshold, kv_use / kv_threshold)`` (0 for an empty pool)."""
    if not pool:
        return 0.0
    total = 0.0
    for view in pool:
        load = view.load
        total += max(load.num_waiting / queue_threshold, load.kv_usage / kv_threshold)
    return total / len(pool)


def pool_capacity(
    model: str,
    num_uncached_tokens: int,
    pool: Sequence[EndpointView],
    predictor: AdmissionPredictor,
    cfg: AdmissionConfig,
    now: float,
    priority: PriorityClass | None = None,
) -> PoolCapacity:
    """Capacity of ``pool`` for a call of ``model`` and class ``priority`` (None: any class)
    with that much prompt left to prefill; ``free_slots`` leaves the headroom of the class."""
    accepting = [v for v in pool if v.state.accepts_work]
    if not accepting:
        return PoolCapacity(0, float("inf"), 0, None, 0.0, 0.0)
    sat = sum(endpoint_saturation(v, model, predictor, cfg) for v in accepting)
    free = sum(free_slots(v, model, predictor, cfg, priority) for v in accepting)
    estimates = [predictor.predict(v, model, num_uncached_tokens, now) for v in accepting]
    best = min(estimates, key=lambda e: e.ttft_s)
    rate = prefill_rate(accepting, model, predictor, now)
    out_rate = sum(predictor.throughput_tokens_per_s(v, model, now) for v in accepting)
    return PoolCapacity(len(accepting), sat / len(accepting), free, best, rate, max(1e-9, out_rate))


def slot_freed(view: EndpointView, num_slots: int) -> EndpointView:
    """``view`` as it will be once one of its ``num_slots`` is free: nothing waiting there,
    at most ``num_slots - 1`` calls running (KV and the rest as observed)."""
    keep = max(0, num_slots - 1)
    load = view.load
    if view.in_flight <= keep and load.num_running <= keep and not load.num_waiting:
        return view
    freed = dataclasses.replace(load, num_waiting=0, num_running=min(load.num_running, keep))
    return dataclasses.replace(view, load=freed, in_flight=min(view.in_flight, keep))


def ready_estimate(
    model: str,
    priority: PriorityClass,
    num_uncached_tokens: int,
    pool: Sequence[EndpointView],
    predictor: AdmissionPredictor,
    cfg: AdmissionConfig,
    now: float,
) -> LatencyEstimate | None:
    """The least-TTFT estimate of a call once it holds a slot (None: nothing accepts work).

    Endpoints with a free slot for ``priority`` are predicted as they are; full ones as
    they will be when a slot frees (:func:`slot_freed`): the call waits for that in the
    gateway queue, whose drain admission charges separately.
    """
    best: LatencyEstimate | None = None
    for view in pool:
        if not view.state.accepts_work:
            continue
        if free_slots(view, model, predictor, cfg, priority) <= 0:
            view = slot_freed(view, predictor.prior(view, model).max_num_seqs)
        est = predictor.predict(view, model, num_uncached_tokens, now)
        if best is None or est.ttft_s < best.ttft_s:
            best = est
    return best
