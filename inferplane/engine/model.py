"""The clock-free engine model: one vLLM-like replica, advanced by its caller's clock.

It ties together the performance model (how long a step takes), the scheduler
(continuous batching, chunked prefill, preemption), the paged KV cache with its prefix
cache, the deterministic generator, and the replica's lifecycle (cold, loading, ready).
The emulated engine server drives it with the event loop's time; the simulator with its
virtual clock. Times are seconds on the caller's clock.

    model = EngineModel(profile, time_scale=1.0, seed=0, start_state=EngineState.READY, now=0.0)
    model.submit(EngineRequest(...), now)          # queue (ValueError if it can never run)
    events = model.advance(now)                    # run every step that ends at or before now
    t = model.next_event_time()                    # next step end / loading end; None if idle
    t = model.next_wake_time()                     # the same, leaping over quiet decode steps
    events = model.abort(request_id, now)          # RequestFinished(ABORT), blocks freed
    events = model.reset(now, cold=True)           # crash: in-flight ERROR, cache cleared, COLD
    events = model.start_loading(now)              # COLD -> LOADING -> READY after load time
    model.slowdown = 5.0                           # a degrading GPU: every duration 5x longer
    model.stats() -> EngineStats

Timing rules: a step starts at the previous step's end, or, when the engine was idle, at
the time of the submit that woke it; steps run back to back while there is work, so
virtual time stays consistent however late the caller is. A step's decisions
(RequestScheduled, RequestPreempted, BlockRemoved) carry its start time; its results
(TokensGenerated, BlockStored, RequestFinished) its end time. Every duration (steps, cold
start) is multiplied by ``time_scale * slowdown``. Calls that take ``now`` first run the
engine up to ``now``; events they produce that way are returned by the next ``advance``
(``submit``) or with their own (``abort``, ``reset``, ``start_loading``).

With ``emit_tokens=False`` a run of pure-decode steps that all end by ``now`` is completed in
one go (``decode_leap``): the same state, events and times as stepping, less Python per step.
"""

from __future__ import annotations

from inferplane.engine.decode_leap import (
    blocks_needed,
    quiet_blocks,
    run_decode_stretch,
    stretch_steps,
)
from inferplane.engine.generation import ContentFreeGenerator, TokenGenerator
from inferplane.engine.kvcache import BlockPool
from inferplane.engine.perf import PerfModel
from inferplane.engine.profiles import EngineProfile
from inferplane.engine.scheduler import Scheduler
from inferplane.engine.sequence import StepPlan
from inferplane.engine.types import (
    AllBlocksCleared,
    EngineEvent,
    EngineRequest,
    EngineState,
    EngineStats,
    StateChanged,
)

_READY, _LOADING = EngineState.READY, EngineState.LOADING


class EngineModel:
    """One engine replica in the caller's time; see the module docstring for the rules."""

    def __init__(
        self,
        profile: EngineProfile,
        *,
        time_scale: float = 1.0,
        seed: int = 0,
        start_state: EngineState = EngineState.READY,
        now: float = 0.0,
        priority_scheduling: bool = False,
        kv_events: bool = True,
        num_gpu_blocks: int | None = None,
        content_free: bool = False,
        check_token_ids: bool = True,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.profile = profile
        self.time_scale = time_scale
        self._slowdown = 1.0
        self.state = start_state
        self.max_model_len = profile.model.max_model_len
        self.perf = PerfModel(profile)
        blocks = profile.num_gpu_blocks if num_gpu_blocks is None else num_gpu_blocks
        self._pool = BlockPool(blocks, profile.block_size, seed)
        self._sched = Scheduler(
            self._pool,
            (ContentFreeGenerator if content_free else TokenGenerator)(profile.mean_output_tokens),
            max_model_len=self.max_model_len,
            max_num_seqs=profile.max_num_seqs,
            max_num_batched_tokens=profile.max_num_batched_tokens,
            priority_scheduling=priority_scheduling,
            kv_events=kv_events,
            check_token_ids=check_token_ids,
        )
        self._kv_events = kv_events
        self._step: StepPlan | None = None
        self._start_s: float | None = None  # when the next step may start (work, no step)
        self._load_end_s: float | None = None
        self._clock_s = now  # the latest time the caller has told us
        self._emit_tokens = True
        self._num_steps = 0
        self._buffer: list[EngineEvent] = []
        if start_state is EngineState.LOADING:
            self._load_end_s = now + self._scaled(profile.load_time_s)

    # -- knobs -------------------------------------------------------------------------------

    @property
    def slowdown(self) -> float:
        """Fault knob: every duration that starts from now on is this many times longer."""
        return self._slowdown

    @slowdown.setter
    def slowdown(self, value: float) -> None:
        if not value > 0:
            raise ValueError(f"slowdown must be > 0, got {value}")
        self._slowdown = float(value)

    @property
    def num_gpu_blocks(self) -> int:
        return self._pool.num_blocks

    @property
    def block_pool(self) -> BlockPool:
        """The KV block pool (read it, do not mutate it: for tests and tools)."""
        return self._pool

    @property
    def scheduler(self) -> Scheduler:
        """The batching scheduler (read it, do not mutate it: for tests and tools)."""
        return self._sched

    def cached_block_hashes(self) -> frozenset[int]:
        """Hashes of the blocks the prefix cache holds now (what KV events describe)."""
        return self._pool.cached_hashes()

    # -- the public verbs --------------------------------------------------------------------

    def submit(self, request: EngineRequest, now: float) -> None:
        """Queue a request (also while cold or loading); ValueError if it can never run."""
        self._run_until(now)
        self._sched.add(request, self._clock_s)
        if self.state is EngineState.READY and self._step is None and self._start_s is None:
            self._start_s = self._clock_s

    def advance(self, now: float, *, emit_tokens: bool = True) -> list[EngineEvent]:
        """Run every step that ends at or before ``now``; the events, oldest first.

        ``emit_tokens=False`` reports only the first TokensGenerated of each request (its
        time is the TTFT) and skips the rest: a simulator needs scheduling, first tokens,
        finishes and KV events; all tokens are still generated and counted.
        """
        self._emit_tokens = emit_tokens
        self._run_until(now)
        return self._flush()

    def next_event_time(self) -> float | None:
        """When the current step ends (or loading completes); None when nothing will happen."""
        if self.state is EngineState.LOADING:
            return self._load_end_s
        if self.state is not EngineState.READY:
            return None
        if self._step is None and self._start_s is not None:
            self._plan(self._start_s)
        return None if self._step is None else self._step.end_s

    def next_wake_time(self) -> float | None:
        """When the caller next *needs* to advance: like :meth:`next_event_time`, but over a
        pure-decode stretch it leaps to the end of the step where the first request finishes.

        A stretch qualifies when the current step decodes every running request, nothing
        waits, every request runs to its length (``ignore_eos``, so no early stop) and the
        free blocks cover every block the stretch allocates (no preemption): then the steps
        up to that finish produce only KV events and non-first tokens, and their end times
        follow from the batch alone (the same sums, in the same order, as stepping). The
        engine still runs every step, lazily, when the caller next advances it or calls a
        verb with ``now``; a submit before the leap's end simply changes what follows.
        """
        end_s = self.next_event_time()
        step = self._step
        if end_s is None or step is None or self.state is not EngineState.READY:
            return end_s
        sched = self._sched
        running = sched.running
        if (
            step.num_prefill_seqs
            or sched.num_waiting
            or len(step.seqs) != len(running)
            or step.num_decode_seqs != len(running)
        ):
            return end_s
        bs, remaining, need = self._pool.block_size, None, 0
        for seq in running:
            if not seq.request.ignore_eos:
                return end_s
            left = seq.max_len - len(seq.token_ids)  # tokens still to come, this step's first
            remaining = left if remaining is None or left < remaining else remaining
        if remaining is None or remaining <= 1:
            return end_s
        free = self._pool.num_free
        if free < len(running) * ((remaining - 1) // bs + 2):  # else enough, whatever each needs
            for seq in running:  # blocks the next ``remaining - 1`` steps allocate
                need += max(0, -(-(seq.num_computed + remaining) // bs) - len(seq.block_ids))
            if need > free:
                return end_s
        num_seqs = step.num_decode_seqs
        return self.perf.decode_stretch_end(
            end_s, num_seqs, step.decode_context_tokens + num_seqs, remaining - 1, self._scale()
        )

    def abort(self, request_id: str, now: float) -> list[EngineEvent]:
        """Cancel a request: RequestFinished(ABORT) and its blocks freed; no-op if unknown."""
        self._run_until(now)
        self._buffer.extend(self._sched.abort(request_id, self._clock_s))
        return self._flush()

    def reset(self, now: float, *, cold: bool = True) -> list[EngineEvent]:
        """Crash/restart: every request in flight finishes with ERROR, the KV cache is
        cleared (AllBlocksCleared) and the engine is COLD (or READY again if not ``cold``)."""
        self._run_until(now)
        t = self._clock_s
        self._buffer.extend(self._sched.fail_all(t))
        self._pool.clear()
        if self._kv_events:
            self._buffer.append(AllBlocksCleared(t))
        self._step = None
        self._start_s = None
        self._load_end_s = None
        self._set_state(EngineState.COLD if cold else EngineState.READY, t)
        return self._flush()

    def start_loading(self, now: float) -> list[EngineEvent]:
        """COLD -> LOADING; READY after weights/storage bandwidth + warm-up (scaled)."""
        self._run_until(now)
        if self.state is EngineState.COLD:
            self._load_end_s = self._clock_s + self._scaled(self.profile.load_time_s)
            self._set_state(EngineState.LOADING, self._clock_s)
        return self._flush()

    def load(self) -> tuple[int, int, float]:
        """(waiting, running, KV usage): what a scrape reads, without the whole ``stats``."""
        pool = self._pool
        return self._sched.num_waiting, len(self._sched.running), pool.num_used / pool.num_blocks

    def load_at(self, now: float) -> tuple[int, int, float] | None:
        """The :meth:`load` that ``advance(now)`` would leave, read without advancing when
        all that advance would do is quiet decoding (``decode_leap.quiet_blocks``: pure
        decode steps, no finish, no eviction, nothing buffered), so it would report nothing
        but ``BlockStored`` of decoded blocks; None when the engine must be advanced first.
        A caller that reads this instead of advancing gets those events, unchanged, from
        its next ``advance`` (a simulator's sync of an engine between its wakes)."""
        if self.state is not _READY or self._buffer or self._emit_tokens:
            return None
        step = self._step
        extra = 0
        if step is None:
            if self._start_s is not None and self._start_s < now:
                return None  # advance would plan a step
        elif step.end_s <= now:
            num_steps, num_seqs = stretch_steps(self._sched, step), step.num_decode_seqs
            ends = [step.end_s]
            ends += self.perf.decode_step_ends(
                step.end_s, num_seqs, step.decode_context_tokens + num_seqs, num_steps - 1,
                self._scale(), now,
            )  # fmt: skip
            extra = quiet_blocks(self._sched, num_steps, ends, now)
            if extra < 0:
                return None
        sched, pool = self._sched, self._pool
        return sched.num_waiting, len(sched.running), (pool.num_used + extra) / pool.num_blocks

    def stats(self) -> EngineStats:
        pool, sched = self._pool, self._sched
        return EngineStats(
            state=self.state,
            num_waiting=sched.num_waiting,
            num_running=len(sched.running),
            num_gpu_blocks=pool.num_blocks,
            num_used_blocks=pool.num_used,
            num_cached_free_blocks=pool.num_cached_free,
            block_size=pool.block_size,
            kv_usage=pool.num_used / pool.num_blocks,
            prefix_cache_queries_tokens=sched.prefix_queries_tokens,
            prefix_cache_hits_tokens=sched.prefix_hits_tokens,
            num_preemptions=sched.num_preemptions,
            prompt_tokens_total=sched.prompt_tokens_total,
            generation_tokens_total=sched.generation_tokens_total,
            num_steps=self._num_steps,
        )

    # -- the engine loop ---------------------------------------------------------------------

    def _run_until(self, now: float) -> None:
        if now > self._clock_s:
            self._clock_s = now
        while True:
            if self.state is not _READY:
                if self.state is not _LOADING:
                    return
                load_end = self._load_end_s
                if load_end is None or load_end > now:
                    return
                self._become_ready(load_end)
                continue
            step = self._step
            if step is None:
                start = self._start_s
                if start is None or start >= now:
                    return  # a step starting exactly now waits for more arrivals at now
                step = self._plan(start)
                if step is None:
                    return
            if step.end_s > now:
                return
            if (
                self._emit_tokens
                or 2.0 * step.end_s - step.start_s > now  # a second step cannot end by now
                or not self._leap(step, now)
            ):
                self._finish_step(step)

    def _plan(self, start_s: float) -> StepPlan | None:
        self._start_s = None
        plan = self._sched.schedule(start_s)
        if plan is None:
            return None
        busy_s = self.perf.step_time_s(
            plan.num_decode_seqs,
            plan.decode_context_tokens,
            plan.num_prefill_seqs,
            plan.prefill_tokens,
            plan.prefill_context_tokens,
            plan.prefill_pairs,
        )
        plan.end_s = start_s + self._scaled(busy_s)
        self._step = plan
        self._buffer.extend(plan.events)
        return plan

    def _finish_step(self, step: StepPlan) -> None:
        self._step = None
        self._num_steps += 1
        self._buffer.extend(self._sched.complete(step, emit_tokens=self._emit_tokens))
        if self._sched.has_work():
            self._start_s = step.end_s

    def _leap(self, step: StepPlan, now: float) -> bool:
        """Complete ``step`` and the pure-decode steps after it that end by ``now`` in one
        go (``decode_leap``: same state, events and times as stepping); False if it cannot."""
        sched = self._sched
        num_steps = stretch_steps(sched, step)
        if num_steps < 2:
            return False
        num_seqs = step.num_decode_seqs
        context = step.decode_context_tokens + num_seqs
        ends = [step.end_s]
        ends += self.perf.decode_step_ends(
            ends[0], num_seqs, context, num_steps - 1, self._scale(), now
        )
        if len(ends) < 2 or _short_of_blocks(sched, len(ends), self._pool.num_free):
            return False
        done = run_decode_stretch(sched, ends, self._buffer)
        if done == 0:
            return False
        self._step = None
        self._num_steps += done
        self._start_s = ends[done - 1]
        return True

    def _scale(self) -> tuple[float, float]:
        return (self.time_scale, self._slowdown)

    def _become_ready(self, time_s: float) -> None:
        self._load_end_s = None
        self._set_state(EngineState.READY, time_s)
        if self._sched.has_work():
            self._start_s = time_s

    def _set_state(self, state: EngineState, time_s: float) -> None:
        if state is not self.state:
            self.state = state
            self._buffer.append(StateChanged(time_s, state))

    def _scaled(self, duration_s: float) -> float:
        return duration_s * self.time_scale * self._slowdown

    def _flush(self) -> list[EngineEvent]:
        events, self._buffer = self._buffer, []
        return events


def _short_of_blocks(sched: Scheduler, num_steps: int, free: int) -> bool:
    """Whether a stretch of ``num_steps`` needs more blocks than are ``free``. Every running
    sequence holds blocks for the first step already, so it needs at most
    ``(num_steps - 1) // block_size + 2`` more; the count is taken only when that could
    exceed what is free."""
    bound = len(sched.running) * ((num_steps - 1) // sched._bs + 2)
    return free < bound and blocks_needed(sched, num_steps) > free
