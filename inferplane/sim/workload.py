"""Workload generators: the calls a scenario sends, in arrival order, from their own RNG.

Each source is an iterator of arrivals (open loop) plus, for agentic tasks, a follow-up hook
the runner calls when a call ends (closed loop within a task: the next call comes one tool
pause after the previous one finishes). Every source draws from its own ``random.Random``
derived from the scenario seed, and an agentic task draws all its calls' lengths when it is
created, so the workload is the same whatever the policy under test does with it.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from inferplane.core.prefix_blocks import block_keys
from inferplane.engine.generation import fill
from inferplane.sim.prompts import KeyChain, KeySpace, segment
from inferplane.sim.scenario import (
    AgenticSource,
    ChatSource,
    CodeSource,
    Demand,
    Diurnal,
    LengthDist,
    LongContextSource,
)


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One call a client will send: who, which task and step, the prompt and output size."""

    source: str
    task_id: int  # unique within the source; a single chat call is a task of one call
    step: int  # 0-based index of the call within its task
    steps: int  # calls the task will make if all succeed
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    #: the task's prompt keys so far (its prompts extend each other); None: hash it all
    chain: KeyChain | None = field(default=None, compare=False, repr=False)

    def block_keys(self) -> tuple[int, ...]:
        """The prompt's own block keys (``core.prefix_blocks.block_keys``)."""
        if self.chain is None:
            return tuple(block_keys(self.prompt_token_ids))
        return self.chain.keys_for(self.prompt_token_ids)


class CallSource(Protocol):
    """What the runner needs from a workload source."""

    name: str

    def next_arrival(self) -> tuple[float, CallSpec] | None:
        """The next open-loop arrival (absolute time), None when the source is exhausted."""
        ...

    def follow_up(self, spec: CallSpec, succeeded: bool) -> tuple[float, CallSpec] | None:
        """After ``spec`` ended: (delay, next call of the same task), or None."""
        ...


def sample_length(dist: LengthDist, rng: random.Random, scale: float = 1.0) -> int:
    """Draw a token count from a lognormal mixture, scaled, rounded and clipped."""
    modes = dist.modes
    mode = modes[0]
    if len(modes) > 1:
        u = rng.random() * sum(m.weight for m in modes)
        for mode in modes:
            u -= mode.weight
            if u <= 0:
                break
    value = (
        mode.median if mode.sigma == 0 else rng.lognormvariate(math.log(mode.median), mode.sigma)
    )
    n = round(value * scale)
    return min(dist.max_tokens, max(dist.min_tokens, n))


def diurnal_factor(diurnal: Diurnal | None, t_s: float) -> float:
    """The rate multiplier at ``t_s`` (1 when there is no diurnal modulation)."""
    if diurnal is None:
        return 1.0
    angle = 2.0 * math.pi * (t_s + diurnal.phase_s) / diurnal.period_s
    return 1.0 + diurnal.amplitude * math.sin(angle)


def _peak(diurnal: Diurnal | None) -> float:
    return 1.0 if diurnal is None else 1.0 + diurnal.amplitude


class _PoissonClock:
    """Arrival times of a (possibly diurnally modulated) Poisson process, by thinning."""

    __slots__ = ("_diurnal", "_peak_rate", "_rng", "_stop_s", "t_s")

    def __init__(
        self,
        rate: float,
        diurnal: Diurnal | None,
        start_s: float,
        stop_s: float | None,
        rng: random.Random,
    ) -> None:
        self._peak_rate = rate * _peak(diurnal)
        self._diurnal = diurnal
        self._rng = rng
        self._stop_s = math.inf if stop_s is None else stop_s
        self.t_s = start_s

    def next(self) -> float | None:
        peak = _peak(self._diurnal)
        while True:
            self.t_s += self._rng.expovariate(self._peak_rate)
            if self.t_s >= self._stop_s:
                return None
            if self._diurnal is None:
                return self.t_s
            if self._rng.random() * peak <= diurnal_factor(self._diurnal, self.t_s):
                return self.t_s


@dataclass(slots=True)
class SourceBase:
    """Shared plumbing of the sources whose tasks are one call each."""

    name: str
    rng: random.Random
    keys: KeySpace
    demand: Demand
    context_limit_tokens: int
    count: int = 0

    def spec(self, prompt: tuple[int, ...], max_tokens: int) -> CallSpec:
        self.count += 1
        return CallSpec(self.name, self.count, 0, 1, prompt, max_tokens)

    def fresh(self, num_tokens: int) -> tuple[int, ...]:
        return segment(self.keys.fresh(), num_tokens)

    def follow_up(self, spec: CallSpec, succeeded: bool) -> tuple[float, CallSpec] | None:
        return None


class ChatCalls(SourceBase):
    """Near-Poisson chat calls with lognormal prompt and (bimodal) output lengths."""

    def __init__(self, src: ChatSource, base: SourceBase) -> None:
        super().__init__(base.name, base.rng, base.keys, base.demand, base.context_limit_tokens)
        self._src = src
        rate = src.rate_rps * base.demand.users_x
        self._clock = _PoissonClock(rate, src.diurnal, src.start_s, src.stop_s, base.rng)

    def next_arrival(self) -> tuple[float, CallSpec] | None:
        t = self._clock.next()
        if t is None:
            return None
        x = self.demand.tokens_x
        out = sample_length(self._src.output_tokens, self.rng, x)
        prompt = min(sample_length(self._src.prompt_tokens, self.rng, x), self._room(out))
        return t, self.spec(self.fresh(prompt), out)

    def _room(self, max_tokens: int) -> int:
        return max(1, self.context_limit_tokens - max_tokens)


class CodeCalls(SourceBase):
    """Bursty completions: exponential on-periods at a high rate, exponential gaps of none."""

    def __init__(self, src: CodeSource, base: SourceBase) -> None:
        super().__init__(base.name, base.rng, base.keys, base.demand, base.context_limit_tokens)
        self._src = src
        self._rate = src.burst_rate_rps * base.demand.users_x * _peak(src.diurnal)
        self._stop_s = math.inf if src.stop_s is None else src.stop_s
        self._t_s = src.start_s
        self._burst_end_s = src.start_s + base.rng.expovariate(1.0 / src.burst_s)

    def next_arrival(self) -> tuple[float, CallSpec] | None:
        src = self._src
        while True:
            self._t_s += self.rng.expovariate(self._rate)
            if self._t_s > self._burst_end_s:  # the burst is over: skip a gap, start the next
                start = self._burst_end_s + self.rng.expovariate(1.0 / src.gap_s)
                self._burst_end_s = start + self.rng.expovariate(1.0 / src.burst_s)
                self._t_s = start
                continue
            if self._t_s >= self._stop_s:
                return None
            keep = diurnal_factor(src.diurnal, self._t_s) / _peak(src.diurnal)
            if src.diurnal is None or self.rng.random() <= keep:
                break
        x = self.demand.tokens_x
        out = sample_length(src.output_tokens, self.rng, x)
        room = max(1, self.context_limit_tokens - out)
        prompt = min(sample_length(src.prompt_tokens, self.rng, x), room)
        return self._t_s, self.spec(self.fresh(prompt), out)


class LongContextCalls(SourceBase):
    """Questions over Zipf-popular shared documents: long prompts with reusable prefixes."""

    def __init__(self, src: LongContextSource, base: SourceBase) -> None:
        super().__init__(base.name, base.rng, base.keys, base.demand, base.context_limit_tokens)
        self._src = src
        rate = src.rate_rps * base.demand.users_x
        self._clock = _PoissonClock(rate, src.diurnal, src.start_s, src.stop_s, base.rng)
        weights = [1.0 / (i + 1) ** src.zipf_s for i in range(src.num_documents)]
        total = 0.0
        self._cumulative: list[float] = []
        for w in weights:
            total += w
            self._cumulative.append(total)
        self._doc_tokens: dict[int, int] = {}

    def next_arrival(self) -> tuple[float, CallSpec] | None:
        t = self._clock.next()
        if t is None:
            return None
        src, x = self._src, self.demand.tokens_x
        u = self.rng.random() * self._cumulative[-1]
        doc = min(bisect.bisect_left(self._cumulative, u), src.num_documents - 1)
        if doc not in self._doc_tokens:
            self._doc_tokens[doc] = sample_length(src.document_tokens, self.rng, x)
        out = sample_length(src.output_tokens, self.rng, x)
        room = max(2, self.context_limit_tokens - out)
        doc_len = min(self._doc_tokens[doc], room - 1)
        question = min(sample_length(src.question_tokens, self.rng, x), room - doc_len)
        prompt = segment(self.keys.named(doc), doc_len) + self.fresh(question)
        return t, self.spec(prompt, out)


_SAID = -2  # a segment's key when it holds an answer's own tokens (no key of its own)


@dataclass(slots=True)
class _Task:
    """One agent run in progress: its context as segments and the sizes of its next calls."""

    segments: list[tuple[int, int]]  # (key, num_tokens); built into token ids per call
    outputs: list[int]
    tool_results: list[int]
    pauses_s: list[float]
    num_tokens: int = 0
    prompt: tuple[int, ...] = ()  # the segments' token ids, extended as they grow
    chain: KeyChain = field(default_factory=KeyChain)  # their keys, likewise


class AgenticTasks:
    """Agent runs: N calls each, a shared system prompt, a growing context, tool pauses.

    Call k's prompt is call k-1's prompt plus its answer plus a tool result, so each call
    can reuse the previous call's cached prefix. When the context outgrows its limit the agent
    compacts it to half (a fresh summary after the system prompt), as coding agents do.
    """

    def __init__(self, src: AgenticSource, base: SourceBase) -> None:
        self.name = base.name
        self._src, self._rng, self._keys, self._demand = src, base.rng, base.keys, base.demand
        rate = src.users * base.demand.users_x * src.tasks_per_user_per_hour / 3600.0
        self._clock = _PoissonClock(rate, src.diurnal, src.start_s, src.stop_s, base.rng)
        self._limit = min(src.max_context_tokens, base.context_limit_tokens)
        system = round(src.system_prompt_tokens * base.demand.tokens_x)
        self._system = (self._keys.named(-1), min(system, self._limit // 2))
        self._tasks: dict[int, _Task] = {}
        self._count = 0

    def next_arrival(self) -> tuple[float, CallSpec] | None:
        t = self._clock.next()
        if t is None:
            return None
        src, rng, x = self._src, self._rng, self._demand.tokens_x
        lo, hi = src.calls_per_task
        n = max(1, round(rng.randint(lo, hi) * self._demand.calls_x))
        outputs = [sample_length(src.output_tokens, rng, x) for _ in range(n)]
        tools = [sample_length(src.tool_result_tokens, rng, x) for _ in range(n - 1)]
        mean = src.tool_pause_s
        pauses = [rng.expovariate(1.0 / mean) if mean > 0 else 0.0 for _ in range(n - 1)]
        first = sample_length(src.first_input_tokens, rng, x)
        self._count += 1
        system = self._system
        task = _Task([system], outputs, tools, pauses, system[1], segment(*system))
        self._append(task, first, outputs[0])
        self._tasks[self._count] = task
        return t, self._spec(self._count, 0, n, task)

    def follow_up(self, spec: CallSpec, succeeded: bool) -> tuple[float, CallSpec] | None:
        task = self._tasks.get(spec.task_id)
        if task is None:
            return None
        k = spec.step + 1
        if not succeeded or k >= spec.steps:
            del self._tasks[spec.task_id]
            return None
        answer = task.outputs[k - 1]
        # the engine's answer: the content-free generator's tokens after this prompt
        said = tuple(fill(len(task.prompt), answer)) if self._src.resend_answers else None
        self._append(task, answer, task.outputs[k], said)
        self._append(task, task.tool_results[k - 1], task.outputs[k])
        return task.pauses_s[k - 1], self._spec(spec.task_id, k, spec.steps, task)

    def open_tasks(self) -> int:
        return len(self._tasks)

    def _append(
        self, task: _Task, num_tokens: int, next_output: int, said: tuple[int, ...] | None = None
    ) -> None:
        """``num_tokens`` more context: fresh tokens, or ``said`` (the previous answer's own
        tokens, kept only while the context is not compacted)."""
        room = max(1, self._limit - next_output)
        if task.num_tokens + num_tokens > room:  # compact: system prompt + a fresh summary
            summary = max(1, min(room // 2, room - self._system[1]))
            task.segments = [self._system, (self._keys.fresh(), summary)]
            task.num_tokens = self._system[1] + summary
            task.prompt = segment(*self._system) + segment(*task.segments[1])
            task.chain = KeyChain()  # the prompt no longer extends the one before
            num_tokens = min(num_tokens, room - task.num_tokens)
            said = None  # summarised: no longer the answer's own tokens at their positions
        if said is not None and num_tokens > 0:
            task.segments.append((_SAID, num_tokens))
            task.num_tokens += num_tokens
            task.prompt += said
        elif num_tokens > 0:
            task.segments.append((key := self._keys.fresh(), num_tokens))
            task.num_tokens += num_tokens
            task.prompt += segment(key, num_tokens)

    def _spec(self, task_id: int, step: int, steps: int, task: _Task) -> CallSpec:
        out = task.outputs[step]
        return CallSpec(self.name, task_id, step, steps, task.prompt, out, task.chain)
