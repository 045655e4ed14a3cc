"""The latency predictor: expected TTFT and time per output token of a call on an endpoint.

Routing asks it whether an endpoint meets a call's latency budget and how much waiting an
affine endpoint would cost; admission asks it whether a call can meet its deadline at all.

Model (per endpoint, from a prior of the endpoint's hardware, calibrated online):

* TTFT = wait + own prefill. Own prefill is the call's uncached prompt tokens over the
  prefill rate. Wait is the uncached prefill work queued ahead (what this predictor saw
  dispatched there and not yet started streaming, or, when the engine reports a longer
  queue, its waiting count times the mean uncached prompt) over the same rate, plus decode
  interference (running decodes take a share of every chunked-prefill step and add their
  per-sequence cost to each chunk), plus the wait for a sequence slot when the batch or
  the KV cache is full (calls ahead x mean output tokens x TPOT / max_num_seqs; calls
  waiting beside free slots wait for the step's token budget, already counted above),
  plus the first step itself. A fully cached call on a saturated replica therefore still
  predicts a long TTFT, which is what lets routing leave a hot prefix holder.
  The output tokens a call holds its slot for are learned (``slot_steps``): the mean decode
  steps of finished calls, once ``slot_steps_min_calls`` have finished, else the prior's
  ``mean_output_tokens``; either at most the mean ``max_tokens`` of the calls dispatched
  (known at once: a fleet's first seconds of 16-64-token answers were otherwise judged by
  the prior's 256, a hot prefix holder predicted at 5 s TTFT that served in about 1).
  The mean, not the median: slots free at the rate running calls
  finish, whose mean is what sets it; it is estimated robustly as a log-normal's,
  exp(log-mean + log-variance / 2), the variance's share capped at 2x. Learned, not
  min(prior, learned): the prior is a profile default, and a fleet whose calls decode
  longer than it would otherwise see full engines as cheaper than they are.
* TPOT = base + per-sequence cost x batch + full-KV read cost x KV usage.

For the breaker only, ``queue_wait_s`` adds what the TTFT above leaves out on an engine
that queues with free slots or whose KV is full (KV-bound): a new call starts as running
calls finish, one every (decode time / running calls), so it waits about (queued + 1) x
that. The decode time is the uncalibrated TPOT times the decode steps a call takes,
learned over every endpoint (first token to finish, over the TPOT predicted at dispatch:
a slow engine's share moves it by its share only) as their mean (the slot wait's
statistic; the geometric mean, seeded by the first call to finish, read a healthy engine
queueing calls of 1-63 tokens as an outlier in 5 of 1,500 random runs), so a healthy
engine's own queue explains its wait while a degraded engine's queue, emptied 5x slower,
does not. Before any call has finished that wait is unknown (None: not 0, which judged
calls queued in the fleet's first turnover as if nothing queued, and ejected a healthy
engine). Routing
does not use it: folding it into the routing TTFT (e2a8925) cost hit rate live.

Calibration: each observed TTFT (TPOT) divided by the uncalibrated prediction made at
dispatch is a ratio; a per-endpoint factor follows those ratios as an EWMA in log space, each
ratio clipped to within ``clip_ratio`` of the current factor (so one outlier moves it by a
bounded step), and decays toward 1 (the prior) with a half-life when unobserved. Pure: no
clock; ``now`` is passed in.

Memo: one call is predicted on the same endpoint by routing and again at dispatch (and by
admission), with nothing changed in between. ``predict`` keeps its answers for the exact
view object (views are frozen), model, token count and ``now`` until the next observation
or prior changes what it knows, so asking twice costs one prediction and the answer is the
very same estimate a fresh prediction would give. The calibration factors' values are kept
likewise for one ``now`` until a factor learns (routing asks ``predict``, ``prefill_s`` and
the throughput of each candidate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferplane.core.routing_config import EndpointPrior, PredictorConfig
from inferplane.core.types import EndpointView

_INITIAL_MEAN_UNCACHED_TOKENS = 512.0
_STEPS_ALPHA = 0.05  # EWMA weight of one call's decode steps (in log space)
_MAX_LOG_VAR = 2 * math.log(2.0)  # the mean is at most 2x the median (log-normal)
_KV_FULL = 0.9  # KV usage from which a new call waits for a running one to finish
_MAX_RESOLVED = 10_000
_MAX_MEMO = 4096  # predictions kept between two observations

#: A memoised prediction's key: (id of the view, model, uncached tokens, now).
_MemoKey = tuple[int, str, int, float]


@dataclass(frozen=True, slots=True, init=False)
class LatencyEstimate:
    """A prediction for one call on one endpoint (seconds)."""

    ttft_s: float  # wait_s + prefill_s
    tpot_s: float
    wait_s: float  # queued prefill ahead + decode interference
    prefill_s: float  # the call's own uncached prefill
    raw_ttft_s: float  # before calibration (kept to calibrate against the observation)
    raw_tpot_s: float

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        ttft_s: float,
        tpot_s: float,
        wait_s: float,
        prefill_s: float,
        raw_ttft_s: float,
        raw_tpot_s: float,
    ) -> None:
        object.__setattr__(self, "ttft_s", ttft_s)
        object.__setattr__(self, "tpot_s", tpot_s)
        object.__setattr__(self, "wait_s", wait_s)
        object.__setattr__(self, "prefill_s", prefill_s)
        object.__setattr__(self, "raw_ttft_s", raw_ttft_s)
        object.__setattr__(self, "raw_tpot_s", raw_tpot_s)

    def e2e_s(self, num_output_tokens: int) -> float:
        return self.ttft_s + self.tpot_s * max(0, num_output_tokens - 1)


class _Factor:
    """A calibration factor: log-space clipped EWMA that decays toward 1."""

    __slots__ = ("last_s", "log_f")

    def __init__(self) -> None:
        self.log_f = 0.0
        self.last_s: float | None = None

    def value(self, now: float, half_life_s: float) -> float:
        if self.last_s is None:
            return 1.0
        age_s = max(0.0, now - self.last_s)
        return math.exp(self.log_f * 0.5 ** (age_s / half_life_s))

    def update(self, ratio: float, now: float, cfg: PredictorConfig) -> None:
        if not math.isfinite(ratio) or ratio <= 0:
            return
        current = math.log(self.value(now, cfg.half_life_s))
        clip = math.log(cfg.clip_ratio)
        target = min(max(math.log(ratio), current - clip), current + clip)
        blended = (1 - cfg.ewma_alpha) * current + cfg.ewma_alpha * target
        self.log_f = min(max(blended, math.log(cfg.min_factor)), math.log(cfg.max_factor))
        self.last_s = now if self.last_s is None else max(self.last_s, now)


class _StepStats:
    """Decode steps per call: mean and variance in log space, a running mean for the first
    1 / ``_STEPS_ALPHA`` calls (no call dominates), then an EWMA."""

    __slots__ = ("count", "log_mean", "log_var")

    def __init__(self) -> None:
        self.count = 0
        self.log_mean = 0.0
        self.log_var = 0.0

    def update(self, log_steps: float) -> None:
        self.count += 1
        alpha = max(_STEPS_ALPHA, 1.0 / self.count)
        delta = log_steps - self.log_mean
        self.log_mean += alpha * delta
        self.log_var = (1 - alpha) * (self.log_var + alpha * delta * delta)

    def mean_steps(self) -> float:
        """The mean steps, taking the steps as log-normal."""
        return math.exp(self.log_mean + 0.5 * min(self.log_var, _MAX_LOG_VAR))


@dataclass(slots=True)
class _Pending:
    endpoint: str
    num_tokens: int
    raw_ttft_s: float
    raw_tpot_s: float
    started: bool = False  # first token seen: no longer queued prefill work
    first_token_s: float | None = None  # when it came (the decode time runs from it)


class LatencyPredictor:
    """Per-endpoint TTFT/TPOT predictions with online calibration (module docstring)."""

    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config or PredictorConfig()
        self._priors: dict[str, EndpointPrior] = {}
        self._resolved: dict[tuple[str, str, str], EndpointPrior] = {}  # bounded by fleet
        self._ttft: dict[str, _Factor] = {}
        self._tpot: dict[str, _Factor] = {}
        self._pending: dict[str, _Pending] = {}
        self._queued_tokens: dict[str, int] = {}
        self._queued_calls: dict[str, int] = {}
        self._mean_uncached = _INITIAL_MEAN_UNCACHED_TOKENS
        self._slot_stats = _StepStats()  # decode time / raw TPOT per finished call
        self._max_steps = _StepStats()  # dispatched calls' max_tokens: a bound on the steps
        # Predictions since the last change of state; the view is kept with its estimate,
        # so its id cannot be reused by another view while the entry lives.
        self._memo: dict[_MemoKey, tuple[EndpointView, LatencyEstimate]] = {}
        # The calibration factors' values at one ``now`` (``_factors``), until one learns.
        self._factors_now = math.nan
        self._factors_at: dict[str, tuple[float, float]] = {}

    # -- priors and factors ---------------------------------------------------------------

    def set_prior(self, endpoint: str, prior: EndpointPrior) -> None:
        """Override the configured prior of one endpoint (e.g. built from its profile)."""
        self._priors[endpoint] = prior
        self._resolved.clear()
        self._memo.clear()

    def prior(self, view: EndpointView, model: str) -> EndpointPrior:
        """The endpoint's own prior, else ``model@gpu``, else ``gpu``, else the default."""
        key = (view.name, model, view.info.gpu)
        found = self._resolved.get(key)
        if found is None:
            table, gpu = self.config.priors, view.info.gpu
            found = (
                self._priors.get(view.name)
                or table.get(f"{model}@{gpu}")
                or table.get(gpu)
                or self.config.default_prior
            )
            if len(self._resolved) < _MAX_RESOLVED:
                self._resolved[key] = found
        return found

    def ttft_factor(self, endpoint: str, now: float) -> float:
        factor = self._ttft.get(endpoint)
        return 1.0 if factor is None else factor.value(now, self.config.half_life_s)

    def tpot_factor(self, endpoint: str, now: float) -> float:
        factor = self._tpot.get(endpoint)
        return 1.0 if factor is None else factor.value(now, self.config.half_life_s)

    # -- predictions ----------------------------------------------------------------------

    def queued_tokens(self, view: EndpointView) -> float:
        """Uncached prefill tokens believed queued ahead on the endpoint."""
        tracked = float(self._queued_tokens.get(view.name, 0))
        reported = view.load.num_waiting * self._mean_uncached
        return max(tracked, reported)

    def predict(
        self, view: EndpointView, model: str, num_uncached_tokens: int, now: float
    ) -> LatencyEstimate:
        """TTFT and TPOT of a call with ``num_uncached_tokens`` to prefill, sent now."""
        memo = self._memo
        key = (id(view), model, num_uncached_tokens, now)
        found = memo.get(key)
        if found is not None and found[0] is view:
            return found[1]
        estimate = self._predict(view, model, num_uncached_tokens, now)
        if len(memo) >= _MAX_MEMO:
            memo.clear()
        memo[key] = (view, estimate)
        return estimate

    def _predict(
        self, view: EndpointView, model: str, num_uncached_tokens: int, now: float
    ) -> LatencyEstimate:
        # ``queued_tokens`` and the prefill-ahead arithmetic inlined, the factors read once
        # per (endpoint, now): this runs for every candidate of every routing call and for
        # admission's pool.
        prior = self.prior(view, model)
        name, load = view.info.name, view.load
        num_seqs, rate = prior.max_num_seqs, prior.prefill_tokens_per_s
        num_running, num_waiting = load.num_running, load.num_waiting
        outstanding = max(num_running + num_waiting, view.in_flight)
        batch = min(outstanding, num_seqs) + 1
        kv = min(1.0, max(0.0, load.kv_usage))
        raw_tpot = (
            prior.decode_base_s + prior.decode_per_seq_s * batch + prior.decode_full_kv_s * kv
        )
        own_tokens = max(0, num_uncached_tokens)
        own_s = own_tokens / rate
        # queued prefill ahead, and decode interference: decodes share each chunked-prefill
        # step's token budget and add per-sequence cost
        ahead_tokens = max(
            float(self._queued_tokens.get(name, 0)), num_waiting * self._mean_uncached
        )
        started = view.in_flight - self._queued_calls.get(name, 0)
        running = min(max(num_running, started), num_seqs)
        share = running / max(1.0, prior.chunk_tokens - running)
        chunks = math.ceil((ahead_tokens + own_tokens) / prior.chunk_tokens)
        work_s = (ahead_tokens + own_tokens) / rate
        interference_s = work_s * share + chunks * running * prior.decode_per_seq_s
        ahead_s = ahead_tokens / rate
        # No free sequence slot (a full batch, or KV too full to start another): wait for calls
        # to finish. Calls waiting while slots are free (chunked prefill) wait only for the
        # step's token budget, which ``ahead_s`` counts: not slot turnover.
        slots_short = num_running >= num_seqs or kv >= _KV_FULL
        queued = num_waiting + 1 if num_waiting and slots_short else 0
        excess = max(outstanding + 1 - num_seqs, queued)
        slot_wait_s = excess * self.slot_steps(prior) * raw_tpot / num_seqs
        raw_wait = ahead_s + interference_s + slot_wait_s + raw_tpot  # + the first step itself
        f_ttft, f_tpot = self._factors(name, now)
        wait_s, prefill_s = raw_wait * f_ttft, own_s * f_ttft
        return LatencyEstimate(
            wait_s + prefill_s, raw_tpot * f_tpot, wait_s, prefill_s, raw_wait + own_s, raw_tpot
        )

    def _factors(self, endpoint: str, now: float) -> tuple[float, float]:
        """(TTFT factor, TPOT factor) of ``endpoint`` at ``now``, kept for that ``now``
        until a factor learns (routing asks for one candidate up to four times)."""
        if now != self._factors_now:
            self._factors_at.clear()
            self._factors_now = now
        found = self._factors_at.get(endpoint)
        if found is None:
            found = self._factors_at[endpoint] = (
                self.ttft_factor(endpoint, now),
                self.tpot_factor(endpoint, now),
            )
        return found

    def slot_steps(self, prior: EndpointPrior) -> float:
        """Decode steps a running call holds its batch slot for (module docstring)."""
        cfg, stats = self.config, self._slot_stats
        if not cfg.slot_wait_learned:
            return prior.mean_output_tokens
        steps = prior.mean_output_tokens
        if stats.count >= cfg.slot_steps_min_calls:
            steps = stats.mean_steps()
        if self._max_steps.count:  # no call holds its slot past its max_tokens
            steps = min(steps, self._max_steps.mean_steps())
        return steps

    def prefill_s(self, view: EndpointView, model: str, num_tokens: int, now: float) -> float:
        """Calibrated time to prefill ``num_tokens`` on an idle endpoint (what a cache saves)."""
        rate = self.prior(view, model).prefill_tokens_per_s
        return max(0, num_tokens) / rate * self._factors(view.info.name, now)[0]

    def throughput_tokens_per_s(self, view: EndpointView, model: str, now: float) -> float:
        """Output tokens/s at saturation, scaled by the observed decode speed."""
        tpot_factor = self._factors(view.info.name, now)[1]
        return self.prior(view, model).throughput_tokens_per_s / tpot_factor

    def idle_terms(
        self, view: EndpointView, model: str, probe_tokens: int, now: float
    ) -> tuple[EndpointPrior, float, float, float]:
        """``(prior, prefill_s(probe_tokens), throughput_tokens_per_s, TTFT of an empty
        prompt)``, the same floats as those methods and ``predict(view, model, 0, now)``
        give, over one prior lookup (admission's pool capacity asks all four per endpoint).
        """
        prior = self.prior(view, model)
        f_ttft, f_tpot = self._factors(view.info.name, now)
        prefill_s = max(0, probe_tokens) / prior.prefill_tokens_per_s * f_ttft
        throughput = prior.throughput_tokens_per_s / f_tpot
        return prior, prefill_s, throughput, self._predict(view, model, 0, now).ttft_s

    # -- observations ---------------------------------------------------------------------

    def on_dispatch(
        self,
        request_id: str,
        endpoint: str,
        num_uncached_tokens: int,
        estimate: LatencyEstimate,
        max_output_tokens: int | None = None,
    ) -> None:
        """A call was sent: its prefill is queued work until its first token.
        ``max_output_tokens`` (its ``max_tokens``) bounds the steps it can hold a slot."""
        self._memo.clear()
        self._drop(request_id)
        while len(self._pending) >= self.config.max_pending:
            self._drop(next(iter(self._pending)))
        tokens = max(0, num_uncached_tokens)
        self._pending[request_id] = _Pending(
            endpoint, tokens, estimate.raw_ttft_s, estimate.raw_tpot_s
        )
        self._queued_tokens[endpoint] = self._queued_tokens.get(endpoint, 0) + tokens
        self._queued_calls[endpoint] = self._queued_calls.get(endpoint, 0) + 1
        self._mean_uncached += 0.05 * (tokens - self._mean_uncached)
        if max_output_tokens is not None:
            self._max_steps.update(math.log(max(1, max_output_tokens)))

    def on_first_token(self, request_id: str, ttft_s: float, now: float) -> None:
        """The call's first token arrived after ``ttft_s``: calibrate, unqueue its prefill."""
        pending = self._pending.get(request_id)
        if pending is None or pending.started:
            return
        self._memo.clear()
        self._unqueue(pending)
        pending.started = True
        pending.first_token_s = now
        if pending.raw_ttft_s > 0:
            ratio = ttft_s / pending.raw_ttft_s
            self._factors_at.clear()
            self._ttft.setdefault(pending.endpoint, _Factor()).update(ratio, now, self.config)

    def on_finish(self, request_id: str, now: float, tpot_s: float | None = None) -> None:
        """The call ended (any way); ``tpot_s``, if measured, calibrates decode speed."""
        pending = self._pending.get(request_id)
        if pending is None:
            return
        self._memo.clear()
        self._drop(request_id)
        self._learn_decode_steps(pending, now)
        if tpot_s is not None and pending.raw_tpot_s > 0:
            ratio = tpot_s / pending.raw_tpot_s
            self._factors_at.clear()
            self._tpot.setdefault(pending.endpoint, _Factor()).update(ratio, now, self.config)

    def _learn_decode_steps(self, pending: _Pending, now: float) -> None:
        first_s = pending.first_token_s
        if first_s is None or pending.raw_tpot_s <= 0 or now <= first_s:
            return
        log_steps = math.log(max(1.0, (now - first_s) / pending.raw_tpot_s))
        self._slot_stats.update(log_steps)

    def decode_steps(self) -> float | None:
        """The mean decode steps a call takes, as learned (None before any call finished):
        the slot wait's statistic, whose mean (not the median: slots free at the rate set by
        the arithmetic mean) kept a healthy engine queueing calls of varied lengths from
        reading as an outlier."""
        stats = self._slot_stats
        return stats.mean_steps() if stats.count else None

    def queue_wait_s(self, view: EndpointView, model: str, raw_tpot_s: float) -> float | None:
        """Uncalibrated wait of a call sent now behind the engine's queue when the engine
        queues with free slots or its KV is full (KV-bound), beyond what ``raw_ttft_s``
        counts (module docstring); 0 when neither; None when it is KV-bound before any call
        has finished (the turnover is unknown, so the TTFT cannot be judged)."""
        load = view.load
        kv_bound = load.num_waiting > 0 or (load.kv_usage >= _KV_FULL and load.num_running > 0)
        if not kv_bound or load.num_running >= self.prior(view, model).max_num_seqs:
            return 0.0
        steps = self.decode_steps()
        if steps is None:
            return None
        running = max(1, load.num_running)
        return (load.num_waiting + 1) * steps * max(0.0, raw_tpot_s) / running

    def _unqueue(self, pending: _Pending) -> None:
        ep = pending.endpoint
        self._queued_tokens[ep] = max(0, self._queued_tokens.get(ep, 0) - pending.num_tokens)
        self._queued_calls[ep] = max(0, self._queued_calls.get(ep, 0) - 1)

    def _drop(self, request_id: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None and not pending.started:
            self._unqueue(pending)

    def num_pending(self) -> int:
        return len(self._pending)
