"""A workflow ledger that also says what changed, so replicas can share one ledger.

Admission (:mod:`inferplane.core.admission`) keeps a :class:`WorkflowLedger` and updates it
at admit, dispatch and finish. Behind a load balancer the calls of one workflow land on
different gateways, and each must weigh the workflow's whole history (sunk cost, steps
done, retries), not only the calls it happened to see. :class:`SyncedLedger` is the same
ledger, plus an outbox of :class:`~inferplane.core.state.WorkflowDelta` (one per change,
in order) that the gateway sends to the shared store, and :meth:`WorkflowLedger.merge` to
fold the store's record back in. :func:`coalesce` packs the outbox into fewer store
updates without changing what the store ends up holding.

Pure: no I/O; the owner drains the outbox and is told of new entries by ``on_change``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inferplane.core.admission_config import WorkflowConfig
from inferplane.core.state import WorkflowDelta
from inferplane.core.types import CallContext
from inferplane.core.workflows import WorkflowLedger

__all__ = ["SyncedLedger", "coalesce"]

Change = tuple[str, WorkflowDelta]


class SyncedLedger(WorkflowLedger):
    """A :class:`WorkflowLedger` whose every change is also queued as a delta."""

    def __init__(
        self,
        config: WorkflowConfig | None = None,
        on_change: Callable[[], None] | None = None,
        max_outbox: int = 100_000,
    ) -> None:
        super().__init__(config)
        self.outbox: list[Change] = []
        self.dropped = 0  # deltas dropped because the outbox was full
        self._on_change = on_change
        self._max_outbox = max_outbox

    def drain(self) -> list[Change]:
        """The deltas queued so far, oldest first; the outbox is empty after."""
        out, self.outbox = self.outbox, []
        return out

    def on_admit(self, call: CallContext, now: float) -> None:
        super().on_admit(call, now)
        if call.workflow_id is not None:
            delta = WorkflowDelta(call.tenant, steps_expected=call.workflow_steps, in_flight=1)
            self._queue(call.workflow_id, delta)

    def on_dispatch(self, call: CallContext, now: float) -> None:
        super().on_dispatch(call, now)
        if call.workflow_id is not None and call.workflow_step is not None:
            delta = WorkflowDelta(call.tenant, dispatched_step=call.workflow_step)
            self._queue(call.workflow_id, delta)

    def on_finish(
        self, workflow_id: str, now: float, *, num_tokens: int, cost_usd: float, success: bool
    ) -> None:
        record = self.get(workflow_id)
        super().on_finish(
            workflow_id, now, num_tokens=num_tokens, cost_usd=cost_usd, success=success
        )
        if record is None:  # not (or no longer) known here: nothing was admitted to finish
            return
        delta = WorkflowDelta(
            record.tenant,
            in_flight=-1,
            tokens=max(0, num_tokens),
            cost_usd=max(0.0, cost_usd),
            steps_done=1 if success else 0,
        )
        self._queue(workflow_id, delta)

    def _queue(self, workflow_id: str, delta: WorkflowDelta) -> None:
        if len(self.outbox) >= self._max_outbox:
            self.outbox.pop(0)
            self.dropped += 1
        self.outbox.append((workflow_id, delta))
        if self._on_change is not None:
            self._on_change()


def coalesce(changes: Sequence[Change]) -> list[Change]:
    """Fewer deltas with the same effect on the store: per workflow, consecutive deltas
    merge until a second ``dispatched_step`` (each dispatch may count a retry, in order).

    Sums and the latest ``steps_expected`` commute; ``in_flight`` is clamped at zero only
    after the sum, which matches applying them one by one as long as each finish follows
    its admit (the ledger queues them in that order). Workflows keep their first-seen order.
    """
    merged: dict[str, list[WorkflowDelta]] = {}
    for workflow_id, delta in changes:
        runs = merged.setdefault(workflow_id, [])
        both = runs and runs[-1].dispatched_step is not None and delta.dispatched_step is not None
        if runs and not both:
            runs[-1] = _merge(runs[-1], delta)
        else:
            runs.append(delta)
    return [(wid, d) for wid, runs in merged.items() for d in runs]


def _merge(a: WorkflowDelta, b: WorkflowDelta) -> WorkflowDelta:
    return WorkflowDelta(
        tenant=a.tenant,
        steps_expected=a.steps_expected if b.steps_expected is None else b.steps_expected,
        in_flight=a.in_flight + b.in_flight,
        dispatched_step=a.dispatched_step if b.dispatched_step is None else b.dispatched_step,
        tokens=a.tokens + b.tokens,
        cost_usd=a.cost_usd + b.cost_usd,
        steps_done=a.steps_done + b.steps_done,
    )
