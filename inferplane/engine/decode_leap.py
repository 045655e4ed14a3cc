"""Many pure-decode engine steps at once, with the same state, events and times as stepping.

Between arrivals and finishes an engine mostly runs *pure-decode* steps: every running
sequence decodes one token, nothing waits, nobody finishes. Such a step's end time is a
closed form of the batch (``PerfModel.decode_step_ends``), each sequence's tokens depend
only on its own context hash, and the only other work is sparse: a new KV block every
``block_size`` tokens per sequence (at a step's start, possibly evicting cached content:
``BlockRemoved``) and a newly full block offered to the prefix cache (at its end:
``BlockStored``). ``run_decode_stretch`` completes a planned step and the steps after it
doing exactly that work, in exactly the order stepping would (by step, then allocations
before registrations, then the batch's service order), so the engine's state and events
are the ones of ``Scheduler.schedule`` / ``complete`` called once per step. A companion
of the scheduler: it works on the scheduler's own state. Pure: times are arguments.
"""

from __future__ import annotations

from inferplane.engine.generation import fill, open_block
from inferplane.engine.scheduler import Scheduler
from inferplane.engine.sequence import SeqStatus, Sequence, StepPlan
from inferplane.engine.types import EOS_TOKEN_ID, BlockRemoved, EngineEvent


def stretch_steps(sched: Scheduler, step: StepPlan) -> int:
    """How many steps from ``step`` (planned, not completed) qualify: 0 if it is not a pure
    decode of the whole batch with nothing waiting, else the steps before the first length
    finish (EOS draws are found later, by ``run_decode_stretch``)."""
    running = sched.running
    if (
        step.num_prefill_seqs
        or sched.num_waiting
        or sched._running_unsorted  # the next schedule() would reorder the batch first
        or len(step.seqs) != len(running)
        or len(running) > sched.max_num_batched_tokens
    ):
        return 0
    remaining = 1 << 62
    for seq in running:
        if not seq.prompt_done or seq.status is not SeqStatus.RUNNING:
            return 0  # a first token is reported: leave that step to the general path
        left = seq.max_len - len(seq.token_ids)
        if left < remaining:
            remaining = left
    return max(0, remaining - 1)


def blocks_needed(sched: Scheduler, num_steps: int) -> int:
    """New blocks the steps after the first of a ``num_steps`` stretch allocate."""
    bs, need = sched._bs, 0
    for seq in sched.running:
        need += max(0, -(-(seq.num_computed + num_steps) // bs) - len(seq.block_ids))
    return need


def quiet_blocks(sched: Scheduler, num_steps: int, ends: list[float], now: float) -> int:
    """Blocks that running the engine to ``now`` would allocate, when all it would do is
    quiet decoding: -1 when it could do more.

    ``num_steps`` is ``stretch_steps`` of the planned step, ``ends`` the end times (``<=
    now``, at most ``num_steps``) of that step and of the pure-decode steps after it. Quiet
    means: every step ending by ``now`` is a pure decode in which nobody finishes (each
    running request runs to its length, ``ignore_eos``, and the first finish comes in a
    later step), and the steps planned by ``now`` (those ending by it, and the one it starts
    next when the last ends before ``now``) take only never-cached free blocks, so nothing
    is evicted. Such a run reports nothing but ``BlockStored`` of decoded blocks and changes
    the load only by the blocks it allocates (``num_used`` after it is ``num_used`` plus
    these).
    """
    if len(ends) >= num_steps:
        return -1  # the step where a request finishes may run (or be planned) by ``now``
    if any(not seq.request.ignore_eos for seq in sched.running):
        return -1
    planned = len(ends) + (1 if ends[-1] < now else 0)
    need = blocks_needed(sched, planned)
    return need if need <= sched._pool.num_free_uncached else -1


def run_decode_stretch(sched: Scheduler, ends: list[float], events: list[EngineEvent]) -> int:
    """Complete the planned pure-decode step of the whole batch and the steps after it
    (step ``j`` ends at ``ends[j]``), appending their events; the number of steps run
    (0: nothing was done, step normally). Stops before a step in which a sequence draws EOS.

    The caller checked ``stretch_steps`` and that the free blocks cover ``blocks_needed``.
    """
    running = list(sched.running)
    gen = sched._gen
    num_steps = len(ends)
    if gen.content_free and all(seq.request.ignore_eos for seq in running):
        for seq in running:  # no EOS, no chain: the stand-in tokens by position
            seq.token_ids += fill(len(seq.token_ids), num_steps)
        _apply_kv(sched, running, ends, events)
        return num_steps
    drawn: list[tuple[list[int], int]] = []
    for seq in running:
        block = open_block(seq.token_ids)
        tokens, chain = gen.run(seq.gen_chain, block, num_steps, seq.request.ignore_eos)
        if tokens[-1] == EOS_TOKEN_ID and len(tokens) - 1 < num_steps:
            num_steps = len(tokens) - 1  # that sequence stops in this step: end before it
            if num_steps < 2:
                return 0
        drawn.append((tokens, chain))
    for seq, (tokens, chain) in zip(running, drawn, strict=True):
        if len(tokens) > num_steps:
            block = open_block(seq.token_ids)
            tokens, chain = gen.run(seq.gen_chain, block, num_steps, seq.request.ignore_eos)
        seq.token_ids.extend(tokens)
        seq.gen_chain = chain
    _apply_kv(sched, running, ends[:num_steps], events)
    return num_steps


def _apply_kv(
    sched: Scheduler, running: list[Sequence], ends: list[float], events: list[EngineEvent]
) -> None:
    """The KV side of a stretch whose tokens are already appended: allocations at each
    step's start, registrations at its end, in stepping's order; then the counters."""
    pool, bs, emit = sched._pool, sched._bs, sched.kv_events
    num_steps = len(ends)
    allocs: dict[int, list[Sequence]] = {}
    registers: dict[int, list[Sequence]] = {}
    for seq in running:
        c0 = seq.num_computed  # before the first step
        j = len(seq.block_ids) * bs - c0  # the first later step that needs a new block
        while j < num_steps:
            allocs.setdefault(j, []).append(seq)
            j += bs
        if (c0 + 1) // bs > seq.num_registered:  # registration lags: caught up at step 0
            registers.setdefault(0, []).append(seq)
        for j in range((-(c0 + 1)) % bs, num_steps, bs):  # the steps that fill a block
            if j:
                registers.setdefault(j, []).append(seq)
    for j in sorted(allocs.keys() | registers.keys()):
        if j in allocs:
            for seq in allocs[j]:
                seq.block_ids.extend(pool.allocate(1))
            removed = pool.pop_removed()
            if removed and emit:
                events.append(BlockRemoved(ends[j - 1], tuple(removed)))
        for seq in registers.get(j, ()):
            num_full = (seq.num_computed + j + 1) // bs
            if num_full > seq.num_registered:
                sched._register(seq, num_full, ends[j], events, emit)
    for seq in running:
        seq.num_computed += num_steps
    sched.generation_tokens_total += len(running) * num_steps
