"""The admission ledger of workflows: progress, attained service, sunk cost, retries.

Admission needs, per workflow and at the instant a call arrives: how far the task has got
(steps done of steps expected: the sunk cost a refusal would waste), how much service it
has already had (tokens: so agentic programs get fair, not greedy, service), and how many
times it has re-run a step. The accountant (:mod:`inferplane.core.accounting`) keeps a
billing view of workflows that closes them on their last step and exposes only summaries;
this ledger is the small read-mostly view admission needs, with the retry count the
accountant does not keep, and is used alike by the gateway and the simulator.

A call *retries* when its step number is one already dispatched (calls evicted or expired
from the queue never ran, so their steps do not count); a workflow keeps its
protection for ``retry_allowance`` retries and is a plain call after that. Bounded: at
most ``max_workflows`` (least recently seen idle ones dropped first), and idle ones expire
after ``idle_ttl_s``. Pure: ``now`` is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from inferplane.core.admission_config import WorkflowConfig
from inferplane.core.types import CallContext

__all__ = ["WorkflowLedger", "WorkflowRecord", "WorkflowStanding"]


@dataclass(slots=True)
class _Workflow:
    tenant: str
    first_seen_s: float
    last_seen_s: float
    steps_done: int = 0
    steps_expected: int | None = None
    max_step: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    retries_used: int = 0
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    """A snapshot of one workflow's ledger entry."""

    workflow_id: str
    tenant: str
    steps_done: int
    steps_expected: int | None
    max_step: int  # highest step number dispatched
    tokens: int  # attained service
    cost_usd: float  # sunk cost
    retries_used: int
    in_flight: int
    first_seen_s: float
    last_seen_s: float


@dataclass(frozen=True, slots=True)
class WorkflowStanding:
    """What admission weighs for a workflow call."""

    is_new: bool  # first call of a workflow the ledger does not know
    is_retry: bool  # re-runs a step already dispatched
    protected: bool  # within its retry allowance
    progress: float  # 0..1: steps done over steps expected (sunk share of the task)
    service_share: float  # 0..1: attained tokens over (attained + scale)

    @property
    def keep(self) -> float:
        """Eviction and shedding protection: progress while protected."""
        return self.progress if self.protected else 0.0


class WorkflowLedger:
    """Per-workflow progress, service, cost and retries (module docstring)."""

    def __init__(self, config: WorkflowConfig | None = None) -> None:
        self.config = config or WorkflowConfig()
        self._wfs: OrderedDict[str, _Workflow] = OrderedDict()  # least recently seen first
        self._lengths = (0.0, 0)  # sum and count of the steps of workflows seen end

    def mean_steps(self) -> float | None:
        """Mean steps of the workflows seen end or expire (None: none yet)."""
        total, count = self._lengths
        return total / count if count else None

    def _forget(self, workflow_id: str) -> bool:
        wf = self._wfs.pop(workflow_id, None)
        if wf is None:
            return False
        if wf.max_step > 0:
            total, count = self._lengths
            self._lengths = (total + wf.max_step, count + 1)
        return True

    def __len__(self) -> int:
        return len(self._wfs)

    def get(self, workflow_id: str) -> WorkflowRecord | None:
        wf = self._wfs.get(workflow_id)
        if wf is None:
            return None
        return WorkflowRecord(
            workflow_id,
            wf.tenant,
            wf.steps_done,
            wf.steps_expected,
            wf.max_step,
            wf.tokens,
            wf.cost_usd,
            wf.retries_used,
            wf.in_flight,
            wf.first_seen_s,
            wf.last_seen_s,
        )

    def standing(self, call: CallContext) -> WorkflowStanding | None:
        """How admission should weigh ``call`` (None: not part of a workflow). Read-only."""
        if call.workflow_id is None:
            return None
        cfg = self.config
        wf = self._wfs.get(call.workflow_id)
        if wf is None:
            is_new = call.workflow_step is None or call.workflow_step <= 1
            return WorkflowStanding(is_new, False, True, 0.0, 0.0)
        step = call.workflow_step
        is_retry = step is not None and step <= wf.max_step
        retries = wf.retries_used + (1 if is_retry else 0)
        expected = call.workflow_steps or wf.steps_expected
        done = float(wf.steps_done)
        if expected is not None and expected > 0:
            progress = min(1.0, done / expected)
        else:
            progress = done / (done + cfg.assumed_remaining_steps)
        share = wf.tokens / (wf.tokens + cfg.service_scale_tokens)
        return WorkflowStanding(False, is_retry, retries <= cfg.retry_allowance, progress, share)

    def on_admit(self, call: CallContext, now: float) -> None:
        """The call was admitted (to dispatch or to the queue): it is in flight."""
        if call.workflow_id is None:
            return
        wf = self._touch(call.workflow_id, call.tenant, now)
        if call.workflow_steps is not None:
            wf.steps_expected = call.workflow_steps
        wf.in_flight += 1

    def on_dispatch(self, call: CallContext, now: float) -> None:
        """The call reached an endpoint: its step is run (again, if seen: a retry)."""
        if call.workflow_id is None or call.workflow_step is None:
            return
        wf = self._touch(call.workflow_id, call.tenant, now)
        if call.workflow_step <= wf.max_step:
            wf.retries_used += 1
        wf.max_step = max(wf.max_step, call.workflow_step)

    def on_finish(
        self, workflow_id: str, now: float, *, num_tokens: int, cost_usd: float, success: bool
    ) -> None:
        """An admitted call of the workflow ended (served, failed, expired or evicted)."""
        wf = self._wfs.get(workflow_id)
        if wf is None:
            return
        wf.in_flight = max(0, wf.in_flight - 1)
        wf.tokens += max(0, num_tokens)
        wf.cost_usd += max(0.0, cost_usd)
        if success:
            wf.steps_done += 1
        wf.last_seen_s = max(wf.last_seen_s, now)
        self._wfs.move_to_end(workflow_id)

    def merge(self, record: WorkflowRecord, now: float) -> None:
        """Fold in a view of the workflow from elsewhere (the shared ledger of all replicas).

        Every counter only grows, so the merge keeps the larger of each (idempotent, in any
        order, and never losing local progress not yet shared); ``in_flight`` stays local
        (it guards this ledger's expiry, for calls this process holds). A workflow not known
        here is added as seen ``now`` (the record's times are another clock's).
        """
        wf = self._touch(record.workflow_id, record.tenant, now)
        wf.steps_done = max(wf.steps_done, record.steps_done)
        if record.steps_expected is not None:
            wf.steps_expected = record.steps_expected
        wf.max_step = max(wf.max_step, record.max_step)
        wf.tokens = max(wf.tokens, record.tokens)
        wf.cost_usd = max(wf.cost_usd, record.cost_usd)
        wf.retries_used = max(wf.retries_used, record.retries_used)

    def end(self, workflow_id: str) -> bool:
        """The client reported the task's outcome: forget it."""
        return self._forget(workflow_id)

    def expire(self, now: float) -> list[str]:
        """Forget workflows idle (nothing in flight) for longer than the TTL."""
        gone: list[str] = []
        for wid, wf in list(self._wfs.items()):
            if now - wf.last_seen_s < self.config.idle_ttl_s:
                break
            if wf.in_flight == 0:
                self._forget(wid)
                gone.append(wid)
        return gone

    def _touch(self, workflow_id: str, tenant: str, now: float) -> _Workflow:
        wf = self._wfs.get(workflow_id)
        if wf is None:
            if len(self._wfs) >= self.config.max_workflows:
                victim = next((w for w, v in self._wfs.items() if v.in_flight == 0), None)
                self._wfs.pop(victim if victim is not None else next(iter(self._wfs)))
            wf = _Workflow(tenant, now, now)
            self._wfs[workflow_id] = wf
        wf.last_seen_s = max(wf.last_seen_s, now)
        self._wfs.move_to_end(workflow_id)
        return wf
