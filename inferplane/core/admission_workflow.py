"""Task-aware admission of new workflows: refuse at step 0 an agent unlikely to finish.

An agent's task succeeds only when every one of its steps is served in time; a workflow
abandoned at step 12 wasted the eleven steps already served (sunk cost) and the pool
capacity they took from work that could have finished. So a NEW workflow (its first
call) is weighed by the work it commits the pool to: its expected number of steps
(``X-Workflow-Steps``, else the mean length of the workflows the ledger has seen end,
else ``assumed_remaining_steps``) against the hazard that a workflow of its class dies
per step now: workflows that went silent for ``abandon_after_s`` with steps still to
go (or, when they never said how many, after a refused step) over the steps served to
workflows of the class, both time-decayed (:class:`WorkflowOutcomes`). A workflow whose
step is refused counts as dead at once, and alive again if it comes back (its retry), so
the hazard follows refusals without waiting out the silence. With
hazard ``h`` and ``n`` steps to come the workflow finishes with odds about
``(1 - h) ** n``; below ``min_finish_share`` it is refused at once, with nothing sunk. A
long agent is refused before a short one at the same hazard, agents keep being admitted
while committed ones finish (``h`` near 0), and once refusals stop committed workflows
dying, ``h`` decays and new workflows are let in again (a negative feedback on the load
committed to workflows).

Deaths, not refused attempts, are counted: a refused step retried (Retry-After) and then
served costs its workflow nothing, and a step served too late to be useful kills it
without any refusal. The hazard starts from ``step_prior_calls`` pseudo-steps served, so
a few early deaths do not close the gate. Critical workflows are never refused by this
rule (the class is never shed while lower classes hold capacity). Bounded: at most
``max_workflows`` open workflows are watched (the oldest dropped first). Pure: ``now``
is passed in.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from inferplane.core.admission_config import WorkflowConfig
from inferplane.core.types import CallContext, PriorityClass

__all__ = ["FinishOdds", "WorkflowGate", "WorkflowOutcomes"]


@dataclass(slots=True)
class _Decayed:
    deaths: float = 0.0
    served: float = 0.0
    at_s: float = 0.0


@dataclass(slots=True)
class _Open:
    """A workflow being watched: its class, length if known, progress, last activity."""

    priority: PriorityClass
    steps: int | None
    max_step: int = 0
    last_s: float = 0.0
    last_failed: bool = False
    open_calls: int = 0  # admitted or queued, not yet ended: it is alive
    doomed_at_s: float | None = None  # counted dead when a step was refused (undone if back)


class WorkflowOutcomes:
    """Per class, time-decayed workflow deaths and continuation steps served."""

    def __init__(self, config: WorkflowConfig) -> None:
        self._half_life_s = config.step_outcome_half_life_s
        self._prior = config.step_prior_calls
        self._after_s = config.abandon_after_s
        self._max_open = config.max_workflows
        self._by_class: dict[PriorityClass, _Decayed] = {}
        self._open: OrderedDict[str, _Open] = OrderedDict()  # least recently active first

    def __len__(self) -> int:
        return len(self._open)

    def _decayed(self, prio: PriorityClass, now: float) -> _Decayed:
        d = self._by_class.get(prio)
        if d is None:
            d = self._by_class[prio] = _Decayed(at_s=now)
        elif now > d.at_s:
            keep = math.exp2(-(now - d.at_s) / self._half_life_s)
            d.deaths *= keep
            d.served *= keep
            d.at_s = now
        return d

    def _seen(self, wid: str, now: float) -> _Open | None:
        wf = self._open.get(wid)
        if wf is not None:
            wf.last_s = max(wf.last_s, now)
            self._open.move_to_end(wid)
        return wf

    def opened(self, call: CallContext, now: float) -> None:
        """A call of a workflow was admitted or queued: watched from now until it ends."""
        wid = call.workflow_id
        if wid is None:
            return
        self.sweep(now)
        wf = self._seen(wid, now)
        if wf is not None:
            self._revive(wf, now)
        else:
            wf = self._open[wid] = _Open(call.priority, call.workflow_steps, last_s=now)
            if len(self._open) > self._max_open:
                self._open.popitem(last=False)
        if call.workflow_steps is not None:
            wf.steps = call.workflow_steps
        wf.open_calls += 1

    def decided(self, call: CallContext, failed: bool, now: float) -> None:
        """A call of a workflow was served (admitted or dispatched) or failed (refused,
        expired or evicted from the queue)."""
        wf = None if call.workflow_id is None else self._seen(call.workflow_id, now)
        if wf is None:
            return  # never admitted (a refused first call) or long forgotten: nothing sunk
        self._revive(wf, now)
        wf.last_failed = failed
        step = call.workflow_step
        if failed:
            if wf.steps is None or wf.max_step < wf.steps:  # dead unless it comes back
                self._decayed(wf.priority, now).deaths += 1.0
                wf.doomed_at_s = now
        elif step is not None:
            wf.max_step = max(wf.max_step, step)
            if step > 1:
                self._decayed(wf.priority, now).served += 1.0

    def _revive(self, wf: _Open, now: float) -> None:
        """The workflow came back after a refused step: it was not dead after all."""
        if wf.doomed_at_s is None:
            return
        d = self._decayed(wf.priority, now)
        d.deaths = max(0.0, d.deaths - math.exp2(-(now - wf.doomed_at_s) / self._half_life_s))
        wf.doomed_at_s = None

    def closed(self, call: CallContext, now: float) -> None:
        """An admitted or queued call ended (served, failed, expired or evicted)."""
        wf = None if call.workflow_id is None else self._seen(call.workflow_id, now)
        if wf is not None:
            wf.open_calls = max(0, wf.open_calls - 1)

    def sweep(self, now: float) -> None:
        """Resolve workflows silent for ``abandon_after_s`` with no call open: dead if
        steps were left (or, length unknown, its last call failed)."""
        while self._open:
            wid, wf = next(iter(self._open.items()))
            if now - wf.last_s < self._after_s:
                return
            if wf.open_calls > 0:  # a call in flight or queued: alive
                self._seen(wid, now)
                continue
            del self._open[wid]
            left = wf.last_failed if wf.steps is None else wf.max_step < wf.steps
            if left and wf.doomed_at_s is None:  # died abandon_after_s after it was last
                # seen (a step served too late, no refusal): aged from then
                died_s = wf.last_s + self._after_s
                self._decayed(wf.priority, now).deaths += math.exp2(
                    -max(0.0, now - died_s) / self._half_life_s
                )

    def hazard(self, prio: PriorityClass, now: float) -> float:
        """Deaths per continuation step of the class, with ``step_prior_calls`` served."""
        self.sweep(now)
        d = self._decayed(prio, now)
        seen = d.served + d.deaths + self._prior
        return d.deaths / seen if seen > 0 else 0.0


@dataclass(frozen=True, slots=True)
class FinishOdds:
    """What the gate weighed for a new workflow."""

    steps_left: float  # continuation steps expected after this first call
    hazard: float  # workflows of its class dying per continuation step now
    finish_share: float  # (1 - hazard) ** steps_left


class WorkflowGate:
    """Refuses new workflows whose odds of finishing are low (module docstring)."""

    def __init__(self, config: WorkflowConfig) -> None:
        self.config = config
        self.outcomes = WorkflowOutcomes(config)

    def opened(self, call: CallContext, now: float) -> None:
        self.outcomes.opened(call, now)

    def decided(self, call: CallContext, failed: bool, now: float) -> None:
        self.outcomes.decided(call, failed, now)

    def closed(self, call: CallContext, now: float) -> None:
        self.outcomes.closed(call, now)

    def odds(self, call: CallContext, mean_steps: float | None, now: float) -> FinishOdds:
        """The odds a new workflow starting with ``call`` finishes (``mean_steps``: the
        learned length of workflows seen end, used when the call does not say)."""
        cfg = self.config
        if call.workflow_steps is not None and call.workflow_steps > 0:
            total = float(call.workflow_steps)
        elif mean_steps is not None:
            total = mean_steps
        else:
            total = 1.0 + cfg.assumed_remaining_steps
        left = max(0.0, total - 1.0)
        h = self.outcomes.hazard(call.priority, now)
        return FinishOdds(left, h, (1.0 - h) ** left)

    def refusal(self, call: CallContext, mean_steps: float | None, now: float) -> str | None:
        """Why the new workflow starting with ``call`` is refused; None: it may start."""
        cfg = self.config
        if not cfg.finish_gate or call.priority is PriorityClass.CRITICAL:
            return None
        odds = self.odds(call, mean_steps, now)
        if odds.finish_share >= cfg.min_finish_share:
            return None
        return (
            f"new {call.priority.value} workflow unlikely to finish: {odds.steps_left:.0f} "
            f"steps to go at a hazard of {odds.hazard:.1%} per step in its class, odds "
            f"{odds.finish_share:.2f} < {cfg.min_finish_share:.2f}"
        )
