"""Continuous batching: which sequences run in the next engine step, and with how many tokens.

The scheduler follows vLLM v1's unified token-budget design. Each step has a budget of
``max_num_batched_tokens`` shared by everything it computes:

1. running sequences first, in order: a decode costs one token, a prompt still being
   prefilled takes a chunk of whatever budget is left (chunked prefill);
2. then, if nothing was preempted, waiting sequences are admitted from the head of the
   queue (FCFS by arrival, or by (priority, arrival) in priority mode) while fewer than
   ``max_num_seqs`` run; their cached prefix blocks are reused (at least the last prompt
   token is recomputed, as in vLLM) and only the rest is prefilled. The head blocks the
   queue when it does not fit: no overtaking.

When a running sequence needs a block and none is free, the latest-arrived (in priority
mode: lowest-priority, then latest) running sequence is preempted by recompute (the
running list is kept in that service order, so the victim is always last and never one
already scheduled in this step): its
blocks are freed (their cached content stays reusable) and it returns to the front of the
queue with the tokens it already generated, to be prefilled again later.

``schedule`` returns a ``StepPlan`` (who runs, how many tokens, aggregate sizes for the
performance model); ``complete`` applies it at the step's end: KV progress, newly full
blocks cached, one token sampled per sequence whose context is fully computed, finishes.
Pure: times are arguments, nothing is read from a clock.
"""

from __future__ import annotations

import heapq
from operator import attrgetter

from inferplane.engine.generation import TokenGenerator, context_chain
from inferplane.engine.kvcache import BlockPool
from inferplane.engine.sequence import SeqStatus, Sequence, StepPlan
from inferplane.engine.types import (
    EOS_TOKEN_ID,
    VOCAB_SIZE,
    BlockRemoved,
    BlockStored,
    EngineEvent,
    EngineRequest,
    FinishReason,
    RequestFinished,
    RequestPreempted,
    RequestScheduled,
    TokensGenerated,
)

_KEY_BLOCK_TOKENS = 16  # the block size of ``EngineRequest.prompt_block_keys``


class Scheduler:
    """Waiting queue, running batch and the KV blocks they hold."""

    def __init__(
        self,
        pool: BlockPool,
        generator: TokenGenerator,
        *,
        max_model_len: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        priority_scheduling: bool = False,
        kv_events: bool = True,
        check_token_ids: bool = True,
    ) -> None:
        self._pool = pool
        self._check_token_ids = check_token_ids  # False: the caller's ids are in range
        self.kv_events = kv_events
        self._gen = generator
        self._bs = pool.block_size
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.priority_scheduling = priority_scheduling
        self.running: list[Sequence] = []  # in service order (rank), see schedule()
        self._running_unsorted = False
        self._waiting: list[
            tuple[tuple[int, int], Sequence]
        ] = []  # heap; aborted entries are stale
        self.num_waiting = 0
        self._by_id: dict[str, Sequence] = {}
        self._next_order = 0
        self.prefix_queries_tokens = 0
        self.prefix_hits_tokens = 0
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    # -- requests in and out ---------------------------------------------------------------

    def add(self, request: EngineRequest, now: float) -> None:
        """Queue a request; ValueError if it is malformed or can never run here."""
        prompt = request.prompt_token_ids
        num_prompt = len(prompt)
        capacity = self._pool.num_blocks * self._bs
        if request.request_id in self._by_id:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        if num_prompt == 0:
            raise ValueError("the prompt is empty")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {request.max_tokens}")
        if num_prompt >= self.max_model_len:
            raise ValueError(
                f"the prompt has {num_prompt} tokens; this model's maximum context length "
                f"is {self.max_model_len} tokens"
            )
        if num_prompt >= capacity:
            raise ValueError(f"the prompt of {num_prompt} tokens never fits the KV cache")
        if self._check_token_ids and (min(prompt) < 0 or max(prompt) >= VOCAB_SIZE):
            raise ValueError(f"token ids must be in [0, {VOCAB_SIZE})")
        seq = Sequence(
            request=request,
            arrival_s=now,
            order=self._next_order,
            rank=(request.priority if self.priority_scheduling else 0, self._next_order),
            token_ids=list(prompt),
            num_prompt_tokens=num_prompt,
            max_len=min(num_prompt + request.max_tokens, self.max_model_len, capacity),
            gen_chain=0 if self._gen.content_free and request.ignore_eos else context_chain(prompt),
        )
        self._next_order += 1
        self._by_id[request.request_id] = seq
        self._push_waiting(seq)

    def has_work(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    def abort(self, request_id: str, now: float) -> list[EngineEvent]:
        """Cancel a request wherever it is; nothing if it is unknown or already finished."""
        seq = self._by_id.get(request_id)
        if seq is None:
            return []
        events: list[EngineEvent] = []
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.num_waiting -= 1  # its heap entry goes stale
        self._finish(seq, FinishReason.ABORT, now, events)
        return events

    def fail_all(self, now: float) -> list[EngineEvent]:
        """Every request in flight finishes with ERROR (the caller clears the pool)."""
        events: list[EngineEvent] = []
        for seq in sorted(self._by_id.values(), key=lambda s: s.order):
            seq.block_ids = []  # the pool is cleared as a whole
            self._finish(seq, FinishReason.ERROR, now, events)
        self.running = []
        self._waiting = []
        self.num_waiting = 0
        return events

    # -- one step ----------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan | None:
        """Plan the step starting at ``now``; None when there is nothing to run."""
        plan = StepPlan(start_s=now)
        if self._running_unsorted:  # keep running in service order: victims come last
            self.running.sort(key=attrgetter("rank"))
            self._running_unsorted = False
        budget, preempted = self._schedule_running(plan, self.max_num_batched_tokens)
        if not preempted:
            self._schedule_waiting(plan, budget)
        removed = self._pool.pop_removed()
        if removed and self.kv_events:
            plan.events.append(BlockRemoved(now, tuple(removed)))
        if not plan.seqs and not plan.events:
            return None
        return plan

    def _schedule_running(self, plan: StepPlan, budget: int) -> tuple[int, bool]:
        running, pool, bs = self.running, self._pool, self._bs
        seqs, nums = plan.seqs, plan.num_new
        preempted = False
        num_decodes = decode_context = 0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed
            num_new = min(len(seq.token_ids) - computed, budget)
            if computed + num_new > len(seq.block_ids) * bs:  # needs new blocks
                need = -(-(computed + num_new) // bs) - len(seq.block_ids)
                while need > pool.num_free:
                    victim = running[-1]  # latest arrival / lowest priority, not yet run
                    self._preempt(victim, plan)
                    preempted = True
                    if victim is seq:
                        break
                if seq.status is not SeqStatus.RUNNING:
                    continue  # it preempted itself; running[i] is now the next one
                seq.block_ids.extend(pool.allocate(need))
            if num_new == 1:  # the hot path: a decode, aggregated inline
                seqs.append(seq)
                nums.append(1)
                num_decodes += 1
                decode_context += computed
            else:
                plan.add(seq, num_new)
            budget -= num_new
            i += 1
        plan.num_decode_seqs += num_decodes
        plan.decode_context_tokens += decode_context
        return budget, preempted

    def _schedule_waiting(self, plan: StepPlan, budget: int) -> None:
        pool, bs = self._pool, self._bs
        while budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self._peek_waiting()
            if seq is None:
                return
            tokens = seq.token_ids
            num_tokens = len(tokens)
            keys = seq.request.prompt_block_keys if bs == _KEY_BLOCK_TOKENS else None
            pool.extend_hashes(seq.block_hashes, tokens, num_tokens, keys)
            hit = pool.lookup(seq.block_hashes[: (num_tokens - 1) // bs])
            computed = len(hit) * bs
            num_new = min(num_tokens - computed, budget)
            need = -(-(computed + num_new) // bs) - len(hit)
            if need > pool.num_free_excluding(hit):
                return  # the head waits; nobody overtakes it
            heapq.heappop(self._waiting)
            self.num_waiting -= 1
            pool.touch(hit)
            seq.block_ids = hit + pool.allocate(need)
            seq.num_computed = computed
            seq.num_registered = len(hit)
            seq.status = SeqStatus.RUNNING
            self.prefix_queries_tokens += num_tokens
            self.prefix_hits_tokens += computed
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = computed
                plan.events.append(RequestScheduled(plan.start_s, seq.request.request_id, computed))
            if self.running and seq.rank < self.running[-1].rank:
                self._running_unsorted = True  # a resumed or higher-priority sequence
            self.running.append(seq)
            plan.add(seq, num_new)
            budget -= num_new

    def complete(self, plan: StepPlan, *, emit_tokens: bool = True) -> list[EngineEvent]:
        """Apply a planned step at its end: KV progress, caching, sampling, finishes.

        Without ``emit_tokens`` only each request's first token is reported (for TTFT).
        """
        end_s, bs, kv_events = plan.end_s, self._bs, self.kv_events
        extend = self._gen.extend
        events: list[EngineEvent] = []
        finished = False
        for seq, num_new in zip(plan.seqs, plan.num_new, strict=True):
            if seq.status is not SeqStatus.RUNNING:
                continue  # aborted or preempted after planning
            computed = seq.num_computed + num_new
            seq.num_computed = computed
            if computed // bs > seq.num_registered:
                self._register(seq, computed // bs, end_s, events, kv_events)
            tokens = seq.token_ids
            if computed < len(tokens):
                continue  # a prefill chunk, more to come
            token, seq.gen_chain = extend(seq.gen_chain, tokens, seq.request.ignore_eos)
            self.generation_tokens_total += 1
            first = not seq.prompt_done
            if first:
                seq.prompt_done = True
                self.prompt_tokens_total += seq.num_prompt_tokens
            if emit_tokens or first:
                events.append(TokensGenerated(end_s, seq.request.request_id, (token,)))
            if token == EOS_TOKEN_ID:
                self._finish(seq, FinishReason.STOP, end_s, events)
                finished = True
            elif len(tokens) >= seq.max_len:
                self._finish(seq, FinishReason.LENGTH, end_s, events)
                finished = True
        if finished:
            self.running = [s for s in self.running if s.status is SeqStatus.RUNNING]
        return events

    # -- helpers -----------------------------------------------------------------------------

    def _register(
        self, seq: Sequence, num_full: int, time_s: float, events: list[EngineEvent], emit: bool
    ) -> None:
        """Offer the newly full blocks to the prefix cache; one BlockStored per new run."""
        pool, bs, first = self._pool, self._bs, seq.num_registered
        pool.extend_hashes(seq.block_hashes, seq.token_ids, num_full * bs)
        hashes, blocks = seq.block_hashes, seq.block_ids
        if num_full == first + 1:  # one block (a decode filled it): the loop below, inlined
            if pool.register(blocks[first], hashes[first]) and emit:
                parent = hashes[first - 1] if first else None
                tokens = tuple(seq.token_ids[first * bs : num_full * bs])
                events.append(BlockStored(time_s, (hashes[first],), parent, tokens, bs))
            seq.num_registered = num_full
            return
        run_start = -1
        for i in range(seq.num_registered, num_full):
            if pool.register(blocks[i], hashes[i]):
                if run_start < 0:
                    run_start = i
            elif run_start >= 0:
                if emit:
                    events.append(self._block_stored(seq, run_start, i, time_s))
                run_start = -1
        if run_start >= 0 and emit:
            events.append(self._block_stored(seq, run_start, num_full, time_s))
        seq.num_registered = num_full

    def _block_stored(self, seq: Sequence, first: int, stop: int, time_s: float) -> BlockStored:
        bs, hashes = self._bs, seq.block_hashes
        return BlockStored(
            time_s=time_s,
            block_hashes=tuple(hashes[first:stop]),
            parent_block_hash=hashes[first - 1] if first > 0 else None,
            token_ids=tuple(seq.token_ids[first * bs : stop * bs]),
            block_size=bs,
        )

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.running.remove(seq)
        self._pool.free(seq.block_ids)
        seq.block_ids = []
        seq.num_computed = 0
        seq.num_registered = 0
        self.num_preemptions += 1
        self._push_waiting(seq)
        plan.events.append(RequestPreempted(plan.start_s, seq.request.request_id))

    def _push_waiting(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        heapq.heappush(self._waiting, (seq.rank, seq))
        self.num_waiting += 1

    def _peek_waiting(self) -> Sequence | None:
        waiting = self._waiting
        while waiting:
            seq = waiting[0][1]
            if seq.status is SeqStatus.WAITING:
                return seq
            heapq.heappop(waiting)  # stale: aborted while waiting
        return None

    def _finish(
        self, seq: Sequence, reason: FinishReason, time_s: float, events: list[EngineEvent]
    ) -> None:
        if seq.block_ids:
            self._pool.free(seq.block_ids)
            seq.block_ids = []
        seq.status = SeqStatus.FINISHED
        del self._by_id[seq.request.request_id]
        rid, cached = seq.request.request_id, max(seq.num_cached_tokens, 0)
        usage = (seq.num_prompt_tokens, cached, seq.num_output_tokens)
        events.append(RequestFinished(time_s, rid, reason, *usage))
