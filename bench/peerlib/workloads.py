"""The five seeded workloads of the peer scoreboard, as plain values (pure, no I/O).

A workload is a list of tasks that arrive as a Poisson process over ``duration_s``; a
task is one chat call or an agent run of many calls that share a conversation (each
call appends a tool result, the previous reply is appended by the load generator), plus
the client's behaviour (retries, Retry-After, timeouts) and the faults to inject.

Offered load is expressed against the fleet's measured capacity in OUTPUT tokens per
second (``capacity_tok_s``, measured once per run with the chat mix straight at the
engines): a load of 1.5 sends tasks at 1.5 x capacity / expected output tokens per task.
Deadlines are written in modelled GPU seconds and multiplied by the engines' time scale,
so the same workload stays meaningful at another scale. Same arguments, same tasks:
every gateway gets byte-identical prompts.
"""

from __future__ import annotations

import dataclasses
import json
import random
import string
from dataclasses import dataclass
from enum import StrEnum


class WorkloadKind(StrEnum):
    SHARED_PREFIX = "shared_prefix"
    AGENTIC = "agentic"
    OVERLOAD = "overload"
    CASCADE = "cascade"
    CRASH = "crash"


PRIORITIES = ("critical", "standard", "sheddable")


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a task: the messages it appends, its budget and the pause before it."""

    messages: tuple[tuple[str, str], ...]  # (role, content) appended to the conversation
    max_tokens: int
    pause_s: float  # tool pause before sending (after the previous call ended)
    deadline_s: float  # end-to-end budget of this call, wall seconds


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str
    tenant: str
    kind: str  # "chat" or "agent"
    priority: str
    start_s: float
    calls: tuple[Call, ...]
    #: False: the task cannot end by the cut-off even on a fleet at capacity (an agent that
    #: starts late in the window); it still runs and loads the fleet, but counts for no one.
    counted: bool = True


@dataclass(frozen=True, slots=True)
class ClientPolicy:
    """How the clients behave when a call fails."""

    max_attempts: int = 1
    honour_retry_after: bool = False
    retry_on_timeout: bool = False
    timeout_factor: float | None = None  # per-attempt timeout = factor x deadline
    max_retry_after_s: float = 5.0
    backoff_s: float = 0.2


# The OpenAI SDKs' default: 2 retries of 408/409/429/5xx, Retry-After honoured.
SDK_CLIENT = ClientPolicy(max_attempts=3, honour_retry_after=True)


@dataclass(frozen=True, slots=True)
class Fault:
    """POST ``body`` (JSON) to engine ``engine_index``'s /admin/faults at ``at_s``."""

    at_s: float
    engine_index: int
    body: str


@dataclass(frozen=True, slots=True)
class Workload:
    name: WorkloadKind
    title: str
    duration_s: float
    load: float  # offered load as a multiple of the fleet's output-token capacity
    tasks: tuple[Task, ...]
    client: ClientPolicy
    faults: tuple[Fault, ...] = ()
    drain_s: float | None = None  # after the window, until the cut-off (None: the bench's)


@dataclass(frozen=True, slots=True)
class Scale:
    """What sizes a run: wall duration, capacity, engine time scale, quick mode."""

    duration_s: float
    capacity_tok_s: float
    time_scale: float
    engines: int = 8
    quick: bool = False
    ttft_at_capacity_s: float | None = None  # p90 TTFT of the capacity probe (wall s)
    tbt_at_capacity_s: float | None = None  # median time per output token there (wall s)


#: The cascade's load: the issue's 70%. Chat alone did not cascade at 0.7x or 0.9x (best
#: peer 97.6% / 97.4%: single calls are balanced off the slow engine). What cascades in
#: production is a conversation pinned to the replica holding its prefix: every later step
#: of a session that started there lands on the slowed engine, each step misses its
#: deadline, and the client's retry on timeout comes too late for the task. So the
#: cascade mixes sessions (``CASCADE_SESSION_SHARE`` of tasks) into the chat.
CASCADE_LOAD = 0.7
CASCADE_SESSION_SHARE = 0.3
DEADLINE_SLACK = 2.0  # a call's deadline: twice what it takes on a fleet at capacity
PROBE_PROMPT_TOKENS = 300  # the capacity probe's chat prompts, roughly
# Modelled seconds per uncached prompt token (the engines' perf model: llama-3-8b on an H100
# prefills 2000 tokens in 68 ms, 0.034 ms each; the earlier 0.4 ms was 12x that, so long
# prompts and late agent steps had deadlines of tens of seconds that nothing could miss).
PREFILL_S_PER_TOKEN = 0.00004


def _vocabulary(size: int = 8192) -> tuple[str, ...]:
    rng = random.Random("peers-vocabulary")
    return tuple(
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 7))) for _ in range(size)
    )


VOCABULARY = _vocabulary()


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choices(VOCABULARY, k=count))


def _deadline_s(scale: Scale, prompt_tokens: int, max_tokens: int) -> float:
    """Twice what the call takes on the fleet at capacity (wall seconds).

    At capacity (the probe's load) a call waits ``ttft_at_capacity_s`` for its first
    token and ``tbt_at_capacity_s`` per further token; a longer prompt than the probe's
    adds its uncached prefill (``PREFILL_S_PER_TOKEN``). Without probe figures (unit tests), a
    budget in modelled seconds of a loaded engine, scaled to wall time.
    """
    if scale.ttft_at_capacity_s is None or scale.tbt_at_capacity_s is None:
        modelled = 0.5 + 0.0004 * prompt_tokens + 0.04 * max_tokens
        return round(modelled * scale.time_scale, 3)
    extra_tokens = max(0, prompt_tokens - PROBE_PROMPT_TOKENS)
    prefill_s = PREFILL_S_PER_TOKEN * extra_tokens * scale.time_scale
    at_capacity = scale.ttft_at_capacity_s + prefill_s + scale.tbt_at_capacity_s * max_tokens
    return round(DEADLINE_SLACK * at_capacity, 3)


def _arrivals(rng: random.Random, rate_per_s: float, duration_s: float) -> list[float]:
    out: list[float] = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        out.append(round(t, 4))
        t += rng.expovariate(rate_per_s)
    return out


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _chat(rng: random.Random, scale: Scale, out_range: tuple[int, int]) -> tuple[Call, ...]:
    system = _words(rng, rng.randint(50, 200))
    user = _words(rng, rng.randint(20, 100))
    max_tokens = rng.randint(*out_range)
    deadline = _deadline_s(scale, 300, max_tokens)
    return (Call((("system", system), ("user", user)), max_tokens, 0.0, deadline),)


def _agent(rng: random.Random, scale: Scale) -> tuple[Call, ...]:
    steps = rng.randint(10, 20) if scale.quick else rng.randint(10, 50)
    calls = []
    context = 400
    for step in range(steps):
        msgs: tuple[tuple[str, str], ...]
        if step == 0:
            msgs = (("system", _words(rng, 300)), ("user", _words(rng, 60)))
            pause = 0.0
        else:
            size = rng.randint(20, 120)
            msgs = (("user", "tool result: " + _words(rng, size)),)
            pause = round(rng.uniform(0.1, 0.5), 3)
            context += size + 24
        max_tokens = rng.randint(8, 32)
        calls.append(Call(msgs, max_tokens, pause, _deadline_s(scale, context, max_tokens)))
    return tuple(calls)


def _tasks(
    name: WorkloadKind, scale: Scale, seed: int, load: float, agent_share: float
) -> tuple[Task, ...]:
    rng = random.Random(f"{seed}:{name}:arrivals")
    chat_out = (64, 256) if name is WorkloadKind.CRASH else (16, 128)
    agent_steps = 15.0 if scale.quick else 30.0
    mean_out = (1 - agent_share) * sum(chat_out) / 2 + agent_share * agent_steps * 20
    rate = load * scale.capacity_tok_s / mean_out
    chat_prio = {"critical": 0.3, "standard": 0.5, "sheddable": 0.2}
    agent_prio = {"standard": 0.5, "sheddable": 0.5}
    tasks = []
    for i, start in enumerate(_arrivals(rng, rate, scale.duration_s)):
        trng = random.Random(f"{seed}:{name}:{i}")
        is_agent = trng.random() < agent_share
        if name is WorkloadKind.AGENTIC:
            prio = _pick(trng, agent_prio if is_agent else chat_prio)
        elif name is WorkloadKind.OVERLOAD:
            prio = _pick(trng, chat_prio)
        else:
            prio = "standard"
        calls = _agent(trng, scale) if is_agent else _chat(trng, scale, chat_out)
        tenant = f"tenant-{trng.randrange(8)}"
        kind = "agent" if is_agent else "chat"
        tasks.append(Task(f"{name}-{i}", tenant, kind, prio, start, calls))
    return tuple(tasks)


def _nominal_s(call: Call) -> float:
    """Wall seconds a call takes on a fleet at capacity, its tool pause included."""
    return call.pause_s + call.deadline_s / DEADLINE_SLACK


def tokens_in_window(task: Task, window_s: float) -> int:
    """Output tokens ``task`` asks for before ``window_s`` when every call takes what it
    takes on a fleet at capacity (an agent sends a step only after the previous one)."""
    t, total = task.start_s, 0
    for call in task.calls:
        t += call.pause_s
        if t >= window_s:
            break
        total += call.max_tokens
        t += call.deadline_s / DEADLINE_SLACK
    return total


def agentic_drain_s(scale: Scale) -> float:
    """Time after the window for agents to finish: a long agent at capacity pace (quick: less)."""
    return 20.0 if scale.quick else 60.0


def _agentic_tasks(
    scale: Scale,
    seed: int,
    load: float,
    cutoff_s: float,
    name: WorkloadKind = WorkloadKind.AGENTIC,
    agent_share: float = 0.1,
) -> tuple[Task, ...]:
    """Agents and chat at ``load`` x capacity of output tokens asked for INSIDE the window.

    An agent issues its ~600 tokens over a minute or more of sequential calls and tool
    pauses, so sizing by its whole output (as the other workloads do) offered the fleet far
    less than ``load`` inside the window (the peers ran at 72% of capacity). The rate is
    scaled until the tokens asked for before the window ends, at the pace of a fleet at
    capacity, are ``load`` x capacity x window. Tasks that could not end by ``cutoff_s``
    even at that pace are not counted (they run, for everyone, but score for no one).
    """
    target = load * scale.capacity_tok_s * scale.duration_s
    rate_load = load
    tasks: tuple[Task, ...] = ()
    for _ in range(4):  # offered tokens are ~proportional to the rate: a fixed point
        tasks = _tasks(name, scale, seed, rate_load, agent_share)
        offered = sum(tokens_in_window(t, scale.duration_s) for t in tasks)
        if offered <= 0 or abs(offered / target - 1) < 0.01:
            break
        rate_load *= target / offered
    return tuple(
        dataclasses.replace(t, counted=t.start_s + sum(map(_nominal_s, t.calls)) <= cutoff_s)
        for t in tasks
    )


def _shared_prefix_tasks(scale: Scale, seed: int, load: float) -> tuple[Task, ...]:
    """Many customers, each a long system prompt shared by its questions (llm-d style)."""
    rng = random.Random(f"{seed}:shared_prefix:arrivals")
    customers = 12 if scale.quick else 32
    prefix_words = 2000
    prefixes = [_words(random.Random(f"{seed}:prefix:{c}"), prefix_words) for c in range(customers)]
    out_range = (16, 64)
    rate = load * scale.capacity_tok_s / (sum(out_range) / 2)
    tasks = []
    for i, start in enumerate(_arrivals(rng, rate, scale.duration_s)):
        trng = random.Random(f"{seed}:shared_prefix:{i}")
        customer = trng.randrange(customers)
        max_tokens = trng.randint(*out_range)
        msgs = (("system", prefixes[customer]), ("user", _words(trng, trng.randint(10, 40))))
        call = Call(msgs, max_tokens, 0.0, _deadline_s(scale, prefix_words + 40, max_tokens))
        tasks.append(
            Task(f"shared_prefix-{i}", f"customer-{customer}", "chat", "standard", start, (call,))
        )
    return tuple(tasks)


def build(name: WorkloadKind, scale: Scale, seed: int) -> Workload:
    """The workload ``name`` at ``scale``; deterministic in its arguments."""
    d = scale.duration_s
    if name is WorkloadKind.SHARED_PREFIX:
        return Workload(
            name,
            "multi-tenant shared prefixes, 0.7x capacity",
            d,
            0.7,
            _shared_prefix_tasks(scale, seed, 0.7),
            SDK_CLIENT,
        )
    if name is WorkloadKind.AGENTIC:
        drain = agentic_drain_s(scale)
        tasks = _agentic_tasks(scale, seed, 1.5, d + drain)
        title = "agents + chat, 3 priority classes, 1.5x inside the window"
        return Workload(name, title, d, 1.5, tasks, SDK_CLIENT, drain_s=drain)
    if name is WorkloadKind.OVERLOAD:
        tasks = _tasks(name, scale, seed, 3.0, agent_share=0.0)
        client = ClientPolicy(max_attempts=4, honour_retry_after=True)
        return Workload(name, "overload 3x, clients honour Retry-After", d, 3.0, tasks, client)
    if name is WorkloadKind.CASCADE:
        drain = agentic_drain_s(scale)
        tasks = _agentic_tasks(
            scale, seed, CASCADE_LOAD, d + drain, name, agent_share=CASCADE_SESSION_SHARE
        )
        client = ClientPolicy(max_attempts=3, retry_on_timeout=True, timeout_factor=1.0)
        fault = Fault(round(0.25 * d, 3), 0, json.dumps({"slowdown": 5.0}))
        title = (
            f"one engine slows 5x at {CASCADE_LOAD:g}x load (sessions and chat), clients "
            "retry on timeout"
        )
        return Workload(name, title, d, CASCADE_LOAD, tasks, client, (fault,), drain_s=drain)
    tasks = _tasks(name, scale, seed, 0.5, agent_share=0.0)
    faults = (
        Fault(round(0.3 * d, 3), 0, json.dumps({"restart": True})),
        Fault(round(0.6 * d, 3), 3 % scale.engines, json.dumps({"restart": True})),
    )
    return Workload(
        name,
        "engine crashes mid-stream, 0.5x load, no client retry",
        d,
        0.5,
        tasks,
        ClientPolicy(),
        faults,
    )


def expected_output_tokens(workload: Workload) -> int:
    return sum(c.max_tokens for t in workload.tasks for c in t.calls)


def to_json(workload: Workload) -> dict[str, object]:
    """A JSON-ready form for the load generator process."""
    return {
        "name": str(workload.name),
        "duration_s": workload.duration_s,
        "drain_s": workload.drain_s,
        "client": {
            "max_attempts": workload.client.max_attempts,
            "honour_retry_after": workload.client.honour_retry_after,
            "retry_on_timeout": workload.client.retry_on_timeout,
            "timeout_factor": workload.client.timeout_factor,
            "max_retry_after_s": workload.client.max_retry_after_s,
            "backoff_s": workload.client.backoff_s,
        },
        "faults": [
            {"at_s": f.at_s, "engine_index": f.engine_index, "body": f.body}
            for f in workload.faults
        ],
        "tasks": [
            {
                "task_id": t.task_id,
                "tenant": t.tenant,
                "kind": t.kind,
                "priority": t.priority,
                "start_s": t.start_s,
                "counted": t.counted,
                "calls": [
                    {
                        "messages": [list(m) for m in c.messages],
                        "max_tokens": c.max_tokens,
                        "pause_s": c.pause_s,
                        "deadline_s": c.deadline_s,
                    }
                    for c in t.calls
                ],
            }
            for t in workload.tasks
        ],
    }
