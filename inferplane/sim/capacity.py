"""Admission's pool capacity, kept per endpoint and summed per pool between view syncs.

The core's :func:`~inferplane.core.capacity.pool_capacity` walks the whole pool on every
call: saturation, free slots, rates and a latency prediction per endpoint. Between two
syncs of the simulator's views only a few endpoints change per call (the one a call went
to, the ones that finished work), so :class:`CapacityBook` keeps each endpoint's share
(accepting or not, saturation, free slots per class, prefill and output rates, predicted
TTFT of an empty prompt) and the pool's sums, and re-reads only the endpoints the
:class:`~inferplane.sim.views.ViewBook` marks changed. Admission calls it with
``pool_capacity``'s signature (``Admission(capacity=...)``).

Approximations, both documented knobs of the scenario's ``speed`` section:

* an endpoint's share is re-read when its view changes or its engine reports events, and
  every share at each sync; in between, the drift of the predictor's calibration factors
  with time (their half-life decay) is not followed;
* ``best`` (the call's least predicted TTFT over the pool) is predicted exactly for the
  ``best_of`` endpoints with the least predicted TTFT of an empty prompt, not for all (the
  ranking by an empty prompt and by the call's own prompt differ only when endpoints'
  prefill speeds differ and their waits are close).

Sums are kept per admission config: admission passes the config in force (its holds
depend on the demand seen, :class:`~inferplane.core.headroom.HeldConfigs`, at most four
variants), so each variant keeps its own sums, at most ``_MAX_CONFIGS`` of them.

A pool or predictor it does not keep falls through to ``pool_capacity``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from inferplane.core.admission_config import AdmissionConfig
from inferplane.core.capacity import (
    AdmissionPredictor,
    PoolCapacity,
    endpoint_room,
    engine_waiting,
    free_slots,
    kv_queue,
    pool_capacity,
)
from inferplane.core.predictor import LatencyPredictor
from inferplane.core.types import EndpointView, PriorityClass
from inferplane.sim.views import ViewBook

_CLASSES = tuple(PriorityClass)
#: A class's position in ``_CLASSES``: the per-class sums are lists by it (an Enum member's
#: hash is a Python-level call, four per class per endpoint share otherwise).
_AT = {c: i for i, c in enumerate(_CLASSES)}
_PROBE_TOKENS = 100_000  # as the core's prefill_rate
_MAX_CONFIGS = 8  # admission configs with sums kept (HeldConfigs makes at most four)


class _PoolSums:
    """One pool's per-endpoint shares (by position) and their sums."""

    __slots__ = (
        "accepting", "free", "free_sum", "num_accepting", "order", "out", "out_sum", "rank",
        "rate", "rate_sum", "sat", "sat_sum",
    )  # fmt: skip

    def __init__(self, size: int) -> None:
        self.accepting = [False] * size
        self.sat = [0.0] * size
        self.rate = [0.0] * size
        self.out = [0.0] * size
        self.rank = [0.0] * size  # predicted TTFT of an empty prompt
        self.free = [[0] * size for _ in _CLASSES]  # by class position, then endpoint
        self.sat_sum = self.rate_sum = self.out_sum = 0.0
        self.free_sum = [0] * len(_CLASSES)
        self.num_accepting = 0
        self.order: list[tuple[float, int]] = []  # (rank, position) of accepting endpoints


class CapacityBook:
    """``pool_capacity`` over the :class:`ViewBook`'s pools, kept incrementally."""

    def __init__(
        self,
        book: ViewBook,
        predictor: AdmissionPredictor,
        config: AdmissionConfig,
        best_of: int = 8,
    ) -> None:
        self.book, self.predictor, self.config = book, predictor, config
        self.best_of = max(1, best_of)
        self._pools: dict[tuple[int, str], _PoolSums] = {}  # by (id of config, model)
        self._configs: dict[int, AdmissionConfig] = {}  # keeps the keyed configs alive
        self._dirty: dict[tuple[int, str], set[int]] = {}
        self._class_limits: dict[int, list[tuple[int, float, float, int]]] = {}
        self._terms = predictor.idle_terms if isinstance(predictor, LatencyPredictor) else None
        book.on_patch.append(self._mark)
        book.on_rebuild.append(self._reset)

    def _mark(self, model: str, position: int) -> None:
        for key in self._pools:
            if key[1] == model:
                self._dirty.setdefault(key, set()).add(position)

    def _reset(self) -> None:
        self._pools.clear()
        self._dirty.clear()

    def __call__(
        self,
        model: str,
        num_uncached_tokens: int,
        pool: Sequence[EndpointView],
        predictor: AdmissionPredictor,
        cfg: AdmissionConfig,
        now: float,
        priority: PriorityClass | None = None,
    ) -> PoolCapacity:
        kept = self.book.pools.get(model)
        if pool is not kept or predictor is not self.predictor:
            return pool_capacity(model, num_uncached_tokens, pool, predictor, cfg, now, priority)
        sums = self._sums(cfg, model, pool, now)
        if sums.num_accepting == 0:
            return PoolCapacity(0, float("inf"), 0, None, 0.0, 0.0)
        if priority is None:
            free = sum(free_slots(v, model, predictor, cfg) for v in pool if v.state.accepts_work)
        else:
            free = sums.free_sum[_AT[priority]]
        estimates = [
            predictor.predict(pool[pos], model, num_uncached_tokens, now)
            for _, pos in sums.order[: self.best_of]
        ]
        best = min(estimates, key=lambda e: e.ttft_s)
        n = sums.num_accepting
        return PoolCapacity(n, sums.sat_sum / n, free, best, sums.rate_sum, max(1e-9, sums.out_sum))

    def _sums(
        self, cfg: AdmissionConfig, model: str, pool: Sequence[EndpointView], now: float
    ) -> _PoolSums:
        key = (id(cfg), model)
        sums = self._pools.get(key)
        if sums is None:
            if self._configs.get(id(cfg)) is not cfg:
                if len(self._configs) >= _MAX_CONFIGS:
                    self._configs.clear()
                    self._class_limits.clear()
                    self._reset()
                self._configs[id(cfg)] = cfg
            sums = self._pools[key] = _PoolSums(len(pool))
            for pos in range(len(pool)):
                self._add(sums, cfg, model, pool, pos, now)
            return sums
        dirty = self._dirty.pop(key, None)
        if dirty:
            for pos in sorted(dirty):
                self._remove(sums, pos)
                self._add(sums, cfg, model, pool, pos, now)
        return sums

    def _add(
        self,
        sums: _PoolSums,
        cfg: AdmissionConfig,
        model: str,
        pool: Sequence[EndpointView],
        pos: int,
        now: float,
    ) -> None:
        view, pred = pool[pos], self.predictor
        if not view.state.accepts_work:
            sums.accepting[pos] = False
            return
        sums.accepting[pos] = True
        sums.num_accepting += 1
        # endpoint_saturation and free_slots per class, over one prior lookup (the core's
        # arithmetic, in its order; tests/sim/test_speed.py holds the sums to the core's)
        load = view.load
        if self._terms is not None:  # one prior lookup, the same floats
            prior, probe_s, out, rank = self._terms(view, model, _PROBE_TOKENS, now)
            num_seqs = prior.max_num_seqs
        else:
            num_seqs = pred.prior(view, model).max_num_seqs
            probe_s = pred.prefill_s(view, model, _PROBE_TOKENS, now)
            out = pred.throughput_tokens_per_s(view, model, now)
            rank = pred.predict(view, model, 0, now).ttft_s
        outstanding = max(load.num_running + load.num_waiting, view.in_flight)
        waiting = max(load.num_waiting, outstanding - num_seqs)
        sat = max(waiting / cfg.queue_threshold, load.kv_usage / cfg.kv_threshold)
        sums.sat[pos] = sat
        sums.sat_sum += sat
        rate = sums.rate[pos] = _PROBE_TOKENS / max(1e-9, probe_s)
        sums.rate_sum += rate
        sums.out[pos] = out
        sums.out_sum += out
        allowance, kv = cfg.engine_queue_allowance, load.kv_usage
        at_engine = engine_waiting(view)
        free_by, free_sum = sums.free, sums.free_sum
        for c, slot_share, kv_limit, queue in self._limits(cfg):
            free = endpoint_room(
                num_seqs, outstanding, at_engine, kv, allowance, slot_share, kv_limit, queue
            )
            free_by[c][pos] = free
            free_sum[c] += free
        sums.rank[pos] = rank
        bisect.insort(sums.order, (rank, pos))

    def _limits(self, cfg: AdmissionConfig) -> list[tuple[int, float, float, int]]:
        """Per class (its position, its headroom's slot share, the KV use it queues from,
        the calls it may queue at an endpoint there), as ``free_slots`` reads them."""
        found = self._class_limits.get(id(cfg))
        if found is None:
            head, limits = cfg.headroom, []
            for i, c in enumerate(_CLASSES):
                kv_share = head.kv_share.of(c)
                limits.append(
                    (i, head.slot_share.of(c), cfg.kv_threshold - kv_share, kv_queue(cfg, kv_share))
                )
            found = self._class_limits[id(cfg)] = limits
        return found

    def _remove(self, sums: _PoolSums, pos: int) -> None:
        if not sums.accepting[pos]:
            return
        sums.accepting[pos] = False
        sums.num_accepting -= 1
        sums.sat_sum -= sums.sat[pos]
        sums.rate_sum -= sums.rate[pos]
        sums.out_sum -= sums.out[pos]
        for i in range(len(_CLASSES)):
            sums.free_sum[i] -= sums.free[i][pos]
        entry = (sums.rank[pos], pos)
        del sums.order[bisect.bisect_left(sums.order, entry)]
