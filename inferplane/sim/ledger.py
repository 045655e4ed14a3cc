"""The book of a simulated run: calls in progress, their records, task outcomes and spend.

The runner decides *when* a call ends; the ledger writes down *how*: one ``CallRecord`` per
call, the call's request record for the core's ``Accountant`` (fed exactly as the gateway
feeds it: a request start per attempt, one end per call, workflow ids for multi-call tasks),
rejections counted per attempt and by reason, and tasks counted as succeeded, failed or cut
short by the end of the run.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferplane.core.accounting import Accountant
from inferplane.core.accounting_types import RequestRecord, TaskOutcome
from inferplane.core.types import CallContext, EndpointInfo, EndpointState
from inferplane.sim.fleet import SimEndpoint
from inferplane.sim.records import CallRecord, Outcome
from inferplane.sim.sources import SourceInfo
from inferplane.sim.workload import CallSpec


class Call:
    """A call in progress (mutable until it becomes a ``CallRecord``)."""

    __slots__ = (
        "arrival_s",
        "attempt",
        "cached",
        "call_id",
        "completion",
        "ctx",
        "dispatch_s",
        "endpoint",
        "engine_id",
        "first_token_s",
        "info",
        "keys",
        "queue_s",
        "source",
        "spec",
        "started",
    )

    def __init__(self, call_id: int, spec: CallSpec, source: int, info: SourceInfo, t: float):
        self.call_id = call_id
        self.spec = spec
        self.source = source  # index of its workload source
        self.info = info
        self.arrival_s = t
        self.attempt = 0
        self.engine_id = ""  # the engine request id of the current attempt
        self.endpoint: SimEndpoint | None = None  # of the latest attempt that reached one
        self.first_token_s: float | None = None
        self.started = False  # some attempt reached an engine
        self.cached = self.completion = 0
        self.keys: tuple[int, ...] | None = None  # prompt block keys, when a policy needs them
        self.ctx: CallContext | None = None  # what admission and routing saw, this attempt
        self.queue_s = 0.0  # waiting: admission queue plus engine queue, all attempts
        self.dispatch_s = 0.0  # when the current attempt reached its engine

    @property
    def request_id(self) -> str:
        return f"c{self.call_id}"

    @property
    def workflow_id(self) -> str | None:
        """Multi-call tasks are workflows; a single call is a task of its own."""
        return f"{self.info.name}/{self.spec.task_id}" if self.spec.steps > 1 else None


class Ledger:
    """Records, task outcomes, rejections and the accountant of one run."""

    def __init__(self, endpoints: Sequence[EndpointInfo], workflow_ttl_s: float) -> None:
        self.accountant = Accountant(
            endpoints, 0.0, workflow_ttl_s, initial_state=EndpointState.READY
        )
        self.records: list[CallRecord] = []
        self.rejections: dict[str, int] = {}
        self.tasks = {"success": 0, "failure": 0, "cut": 0}

    def reject(self, reason: str) -> None:
        self.rejections[reason] = self.rejections.get(reason, 0) + 1

    def start(self, call: Call, endpoint: str, now: float) -> None:
        """An attempt reached an engine (a retry closes the previous attempt's share)."""
        call.started = True
        self.accountant.on_request_start(
            call.request_id, endpoint, now, workflow_id=call.workflow_id
        )

    def close(self, call: Call, now: float, outcome: Outcome, reason: str) -> None:
        """The call's last word: its record, and its request record for the accountant."""
        spec, ok = call.spec, outcome is Outcome.SUCCESS
        endpoint = call.endpoint.name if call.endpoint is not None else None
        self.records.append(
            CallRecord(
                call.call_id, call.info.name, call.info.priority, spec.task_id, spec.step,
                spec.steps, call.arrival_s, call.first_token_s if ok else None,
                now if ok else None, len(spec.prompt_token_ids), call.cached, call.completion,
                endpoint, outcome, call.attempt, reason, call.queue_s,
            )
        )  # fmt: skip
        if outcome is Outcome.UNFINISHED:
            self.tasks["cut"] += 1
            return  # still in flight for the accountant, as in the gateway
        record = RequestRecord(
            call.request_id, call.info.tenant, call.info.targets[0], endpoint,
            call.info.priority, call.workflow_id, spec.step + 1, len(spec.prompt_token_ids),
            call.cached, call.completion, ok, reason, spec.steps,
        )  # fmt: skip
        if call.started:
            self.accountant.on_request_end(record, now)
        else:
            self.accountant.on_request_rejected(record, now)

    def task_ended(self, call: Call, now: float, *, cut: bool) -> None:
        """The call was its task's last: the task succeeded, failed or was cut short."""
        if cut:
            self.tasks["cut"] += 1
        elif self.records[-1].outcome is Outcome.SUCCESS:
            self.tasks["success"] += 1
        else:
            self.tasks["failure"] += 1
            if call.workflow_id is not None:
                self.accountant.end_workflow(call.workflow_id, TaskOutcome.FAILURE, now)
