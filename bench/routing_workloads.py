"""The workloads of the routing benchmark (``bench/routing.py``) and their oracle hit rate.

Two seeded workloads, pure functions of their parameters (no I/O, no clock), so every
routing policy replays the very same calls:

- ``prefix``: the llm-d shape (REFERENCE §6): many tenants, each with a long shared system
  prompt, short questions, Poisson arrivals (open loop);
- ``agentic``: multi-turn agent sessions (Poisson session starts, closed loop inside a
  session). A session is a chain of calls whose context only grows: a system prompt shared
  by every agent of its kind (instructions and tool definitions), the session's task, then
  per step the model's answer (the tool call it chose) and the tool's result, after a tool
  pause. Call k+1's prompt is call k's prompt plus call k's answer plus a tool result, so a
  replica that served call k holds most of call k+1 in its KV cache.

The oracle hit rate is what one infinite shared cache would hit on the prompts sent: the
fraction of prompt tokens in full blocks whose chained prefix was already in the cache,
where a call leaves its prompt *and its answer* behind (engines cache generated tokens
too). No router can beat it.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

BLOCK_TOKENS = 16  # the emulated engines' KV block size (profiles.yaml)
_WORDS = ("policy", "record", "customer", "clause", "account", "region", "ledger", "audit")
_TOOLS = ("search", "read_file", "run_tests", "grep", "list_dir", "fetch_url", "sql_query")


def words_text(seed: str, num_words: int) -> str:
    """Deterministic filler text (about 2 tokens a word), its own words per ``seed``."""
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(_WORDS)}{rng.randrange(1000)}" for _ in range(num_words))


# ---- prefix: many tenants, each a long shared system prompt ---------------------------------


def tenant_prompt(tenant: int, num_words: int) -> str:
    """A tenant's long system prompt: its own deterministic words."""
    return words_text(f"tenant-{tenant}", num_words)


def prefix_calls(
    seed: int, rate_per_s: float, duration_s: float, tenants: int
) -> list[tuple[float, int, str]]:
    """(arrival offset s, tenant, question) for every call: Poisson arrivals, tenants uniform."""
    rng = random.Random(seed)
    calls: list[tuple[float, int, str]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            return calls
        calls.append((t, rng.randrange(tenants), f"question {rng.randrange(10**6)}?"))


def prefix_messages(prompt: str, question: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": prompt}, {"role": "user", "content": question}]


# ---- agentic: multi-turn sessions whose context grows ---------------------------------------


@dataclass(frozen=True, slots=True)
class AgentShape:
    """The knobs of the agentic workload."""

    session_rate_per_s: float  # Poisson session starts over the run
    duration_s: float  # sessions start within [0, duration_s); the last ones run past it
    kinds: int  # distinct agent system prompts (shared across sessions of a kind)
    system_words: int  # words of each kind's system prompt (~2 tokens a word)
    min_steps: int
    max_steps: int
    tool_words: tuple[int, int]  # a tool result's length in words, uniform in [lo, hi]
    tool_pause_mean_s: float  # exponential pause between an answer and the next call


@dataclass(frozen=True, slots=True)
class AgentSession:
    """One agent run: its calls (``len(tool_results) + 1``) and the pauses between them."""

    session_id: str
    start_s: float
    kind: int
    task: str
    tool_results: tuple[str, ...]  # the tool message appended before call 2, 3, ...
    pauses_s: tuple[float, ...]  # the tool pause before call 2, 3, ...

    @property
    def num_steps(self) -> int:
        return len(self.tool_results) + 1


def agent_system_prompt(kind: int, num_words: int) -> str:
    """An agent kind's system prompt: instructions plus its tool definitions."""
    tools = " ".join(f"tool {name}: {words_text(f'{kind}-{name}', 12)}." for name in _TOOLS)
    return f"You are agent {kind}. {words_text(f'agent-{kind}', num_words)} Tools: {tools}"


def agent_sessions(seed: int, shape: AgentShape) -> list[AgentSession]:
    """Every session of the run, in start order (seeded)."""
    rng = random.Random(f"agentic-{seed}")
    sessions: list[AgentSession] = []
    t = 0.0
    while True:
        t += rng.expovariate(shape.session_rate_per_s)
        if t >= shape.duration_s:
            return sessions
        index = len(sessions)
        num_steps = rng.randint(shape.min_steps, shape.max_steps)
        results = tuple(
            f"{_TOOLS[rng.randrange(len(_TOOLS))]} returned: "
            + words_text(f"{seed}-{index}-{step}", rng.randint(*shape.tool_words))
            for step in range(1, num_steps)
        )
        pauses = tuple(rng.expovariate(1.0 / shape.tool_pause_mean_s) for _ in results)
        task = f"Task {index}: " + words_text(f"task-{seed}-{index}", 20)
        kind = rng.randrange(shape.kinds)
        sessions.append(AgentSession(f"agent-{seed}-{index}", t, kind, task, results, pauses))


def agent_first_messages(session: AgentSession, system_prompt: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": session.task}]


def tool_message(session: AgentSession, step: int, result: str) -> dict[str, Any]:
    """The tool result appended before call ``step`` (2-based: the first call has none)."""
    return {"role": "tool", "tool_call_id": f"{session.session_id}-{step - 1}", "content": result}


# ---- oracle ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SentCall:
    """One call as sent: its messages and the answer text it got (None: it failed), and
    when it was sent and answered (any common clock; only the order matters)."""

    messages: Sequence[dict[str, Any]]
    answer: str | None
    sent_s: float = 0.0
    done_s: float = 0.0


def _chain(ids: Sequence[int]) -> Iterable[int]:
    """The chained hash of every full block of ``ids``."""
    chain = 0
    for end in range(BLOCK_TOKENS, len(ids) + 1, BLOCK_TOKENS):
        chain = hash((chain, tuple(ids[end - BLOCK_TOKENS : end])))
        yield chain


def oracle_hit_rate(calls: Iterable[SentCall]) -> float:
    """Hit rate of one infinite cache over ``calls`` in order (see the module docstring).

    Sessions may be given one after another rather than interleaved in time: blocks they
    share (a system prompt) miss exactly once either way, and the rest is their own.
    """
    from inferplane.tokenizer import apply_chat_template

    seen: set[int] = set()
    hit_tokens = total_tokens = 0
    for call in calls:
        ids = apply_chat_template(call.messages)
        total_tokens += len(ids)
        for chain in _chain(ids):
            if chain in seen:
                hit_tokens += BLOCK_TOKENS
            seen.add(chain)
        if call.answer is not None:
            seen.update(_chain(_answered_ids(call)))
    return hit_tokens / total_tokens if total_tokens else 0.0


def _answered_ids(call: SentCall) -> list[int]:
    """Prompt plus generated tokens (the closing <|end|> was never computed)."""
    from inferplane.tokenizer import apply_chat_template

    answered = [*call.messages, {"role": "assistant", "content": call.answer}]
    return apply_chat_template(answered, add_generation_prompt=False)[:-1]


def lru_hit_rate(calls: Iterable[SentCall], capacity_blocks: int) -> float:
    """Hit rate of one LRU prefix cache of ``capacity_blocks`` blocks (the whole fleet's KV
    memory as if it were one engine) over ``calls`` in time order: a prompt is looked up
    when sent (leading run of cached blocks), an answer cached when it completes. Like an
    engine, a prompt's blocks are touched tail first, so a prefix outlives its suffix. Not a
    bound, a reference: what a router that never splits a prefix across replicas and never
    lets KV sit idle could hope for with this much memory."""
    from inferplane.tokenizer import apply_chat_template

    listed = list(calls)
    events = sorted(
        [(c.sent_s, 0, i, c) for i, c in enumerate(listed)]
        + [(c.done_s, 1, i, c) for i, c in enumerate(listed) if c.answer is not None],
        key=lambda e: e[:3],
    )  # fmt: skip
    cache: OrderedDict[int, None] = OrderedDict()
    hit_tokens = total_tokens = 0
    for _, kind, _, call in events:
        ids = apply_chat_template(call.messages) if kind == 0 else _answered_ids(call)
        chains = list(_chain(ids))
        if kind == 0:
            total_tokens += len(ids)
            leading = next((n for n, c in enumerate(chains) if c not in cache), len(chains))
            hit_tokens += leading * BLOCK_TOKENS
        for chain in reversed(chains):
            cache[chain] = None
            cache.move_to_end(chain)
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return hit_tokens / total_tokens if total_tokens else 0.0
