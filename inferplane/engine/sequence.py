"""The engine's per-request state and one step's plan (shared by the scheduler and the leap).

``Sequence`` is the mutable state of one request inside the engine model: its tokens, the
KV blocks it holds, how much of its context is computed. ``StepPlan`` is one engine step as
:mod:`inferplane.engine.scheduler` decides it: the sequences it computes, with how many
tokens each, and the aggregate sizes the performance model prices it by. Split out of the
scheduler so that module holds only the scheduling rules.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from inferplane.engine.types import EngineEvent, EngineRequest


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """The engine's mutable state of one request (internal to the engine model)."""

    request: EngineRequest
    arrival_s: float
    order: int  # arrival rank, unique per engine
    rank: tuple[int, int]  # service order: (priority or 0, order); lower is served first
    token_ids: list[int]  # prompt, then generated tokens
    num_prompt_tokens: int
    max_len: int  # total length at which it stops with LENGTH
    gen_chain: int  # chain over the full generation blocks of token_ids (generation)
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0  # tokens whose KV is in the cache
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of the full blocks of token_ids
    num_registered: int = 0  # leading blocks already offered to the prefix cache
    num_cached_tokens: int = -1  # prefix hit at first scheduling; -1 until then
    prompt_done: bool = False

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass(slots=True, eq=False)
class StepPlan:
    """One engine step: the sequences it computes and the aggregates that price it."""

    start_s: float
    seqs: list[Sequence] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)
    events: list[EngineEvent] = field(default_factory=list)  # decided at start_s
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0
    num_prefill_seqs: int = 0
    prefill_tokens: int = 0
    prefill_context_tokens: int = 0
    prefill_pairs: float = 0.0
    end_s: float = 0.0

    def add(self, seq: Sequence, num_new: int) -> None:
        self.seqs.append(seq)
        self.num_new.append(num_new)
        context = seq.num_computed
        if num_new == 1:
            self.num_decode_seqs += 1
            self.decode_context_tokens += context
        else:
            self.num_prefill_seqs += 1
            self.prefill_tokens += num_new
            self.prefill_context_tokens += context
            self.prefill_pairs += num_new * context + num_new * (num_new + 1) / 2.0
