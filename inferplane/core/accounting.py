"""Accounting: what every request, task and idle second of the fleet cost.

The mission's figure is cost per successful task, so spend has to be counted where it is
spent, including the replicas that sit idle or are still loading their weights. The model
is exact by construction rather than estimated:

* every configured endpoint accrues ``price_per_hour_usd / 3600`` dollars (and
  ``tensor_parallel`` GPU-seconds) per second of wall time from ``start_s``, whatever its
  state: idle, warming and cold replicas cost money too;
* while ``n >= 1`` requests are in flight on an endpoint, each is charged an equal ``1/n``
  share of that spend. A cumulative integral of ``1/n dt`` per endpoint makes a request's
  charge ``integral(end) - integral(start)``, O(1) per event;
* spend while ``n == 0`` is idle spend, or warming spend when the endpoint is cold or warming.

Hence (charged requests) + (accrued on requests still in flight) + (idle) + (warming)
equals the fleet's spend exactly, up to floating-point rounding. Tasks: a call without a
workflow id is a task of one call; a workflow is a task of many calls that ends in success
(reported, or its last step succeeded), failure (reported) or abandonment (idle past the
TTL, or evicted when too many are open). Pure: no clock, no I/O; ``now`` is an argument and
timestamps that run backwards are clamped to the last one seen.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from inferplane.core.accounting_types import (
    AccountingSnapshot,
    EndpointSpend,
    RequestCost,
    RequestRecord,
    TaskOutcome,
    UsageTotals,
    WorkflowSummary,
)
from inferplane.core.spend_meter import SpendMeter
from inferplane.core.types import EndpointInfo, EndpointState, client_workflow_id

__all__ = [
    "Accountant",
    "AccountingSnapshot",
    "EndpointSpend",
    "RequestCost",
    "RequestRecord",
    "TaskOutcome",
    "UsageTotals",
    "WorkflowSummary",
]

_WARMING_STATES = (EndpointState.COLD, EndpointState.WARMING)
_OTHER_KEY = "(other)"
TOP_WORKFLOWS = 10


@dataclass(slots=True, init=False)
class _Open:
    endpoint: str
    start_share_s: float
    carried_usd: float = 0.0  # earlier attempts of the same request (failover)
    carried_gpu_s: float = 0.0
    workflow_id: str | None = None

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        endpoint: str,
        start_share_s: float,
        carried_usd: float = 0.0,
        carried_gpu_s: float = 0.0,
        workflow_id: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.start_share_s = start_share_s
        self.carried_usd = carried_usd
        self.carried_gpu_s = carried_gpu_s
        self.workflow_id = workflow_id


@dataclass(slots=True)
class _Workflow:
    workflow_id: str
    tenant: str
    first_seen_s: float
    last_seen_s: float
    steps_done: int = 0
    steps_expected: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def summary(self, outcome: TaskOutcome) -> WorkflowSummary:
        return WorkflowSummary(
            client_workflow_id(self.tenant, self.workflow_id),
            self.tenant,
            outcome.value,
            self.steps_done,
            self.steps_expected,
            self.prompt_tokens,
            self.completion_tokens,
            self.cost_usd,
            self.first_seen_s,
            self.last_seen_s,
        )


class _Totals:
    """Per-key usage counters, bounded: keys beyond the cap share one "(other)" bucket."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self.rows: dict[str, list[float]] = {}

    def add(self, key: str, record: RequestRecord, cost: RequestCost, rejected: bool) -> None:
        row = self.rows.get(key)
        if row is None:
            if len(self.rows) >= self.max_keys:
                key = _OTHER_KEY
            row = self.rows.setdefault(key, [0.0] * 9)
        # Unrolled (once per request per key): requests, failed, rejected, prompt, cached,
        # completion tokens, USD, GPU seconds, fallbacks.
        row[0] += 1
        if not record.success:
            row[1] += 1
        if rejected:
            row[2] += 1
        row[3] += record.prompt_tokens
        row[4] += record.cached_tokens
        row[5] += record.completion_tokens
        row[6] += cost.usd
        row[7] += cost.gpu_seconds
        if record.fallback_from is not None:
            row[8] += 1

    def values(self) -> tuple[UsageTotals, ...]:
        return tuple(
            UsageTotals(
                k,
                int(r[0]),
                int(r[1]),
                int(r[2]),
                int(r[3]),
                int(r[4]),
                int(r[5]),
                r[6],
                r[7],
                int(r[8]),
            )
            for k, r in sorted(self.rows.items())
        )


class Accountant:
    """Counts spend per endpoint, request, model, tenant and task. See the module docstring."""

    def __init__(
        self,
        endpoints: Sequence[EndpointInfo],
        start_s: float,
        workflow_idle_ttl_s: float = 300.0,
        *,
        max_open_workflows: int = 10_000,
        max_keys: int = 1_000,
        initial_state: EndpointState = EndpointState.COLD,
    ) -> None:
        if workflow_idle_ttl_s <= 0 or max_open_workflows < 1 or max_keys < 1:
            raise ValueError("ttl, max_open_workflows and max_keys must be positive")
        self._start_s = start_s
        self._meters = {
            e.name: SpendMeter.for_endpoint(e, start_s, initial_state) for e in endpoints
        }
        self._infos = {e.name: e for e in endpoints}
        self._ttl_s = workflow_idle_ttl_s
        self._max_open = max_open_workflows
        self._open: dict[str, _Open] = {}
        self._wf_in_flight: dict[str, int] = {}
        self._workflows: OrderedDict[str, _Workflow] = OrderedDict()  # oldest activity first
        self._top_closed: list[tuple[float, str, WorkflowSummary]] = []  # min-heap, bounded
        self._tasks = dict.fromkeys(TaskOutcome, 0)
        self._by_model = _Totals(max_keys)
        self._by_tenant = _Totals(max_keys)
        self._charged_usd = 0.0
        self._charged_gpu_s = 0.0
        self._wasted_usd = 0.0
        self._retry_usd = 0.0
        self._carried_usd = 0.0  # earlier attempts of requests still in flight
        self._num_requests = 0
        self._num_failed = 0
        self._num_rejected = 0
        self._num_fallbacks = 0

    # -- endpoints and requests ---------------------------------------------------------

    def on_endpoint_state(self, name: str, state: EndpointState, now: float) -> None:
        """Record a state change; spend before ``now`` keeps the old state's label."""
        meter = self._meters.get(name)
        if meter is None:
            return
        meter.advance(now)
        meter.state = state

    def on_request_start(
        self, request_id: str, endpoint: str, now: float, *, workflow_id: str | None = None
    ) -> bool:
        """A request (or a new attempt of it, after failover) starts on ``endpoint``.

        Starting a request id that is already in flight closes its previous attempt; that
        attempt's cost is carried into the request and counted as retry spend. Returns False
        (and counts nothing) for an endpoint not in the configuration.
        """
        meter = self._meters.get(endpoint)
        if meter is None:
            return False
        carried_usd = carried_gpu_s = 0.0
        previous = self._open.pop(request_id, None)
        if previous is not None:
            cost = self._close_attempt(previous, now)
            carried_usd = previous.carried_usd + cost.usd
            carried_gpu_s = previous.carried_gpu_s + cost.gpu_seconds
            self._retry_usd += cost.usd
            self._carried_usd += cost.usd
            workflow_id = workflow_id or previous.workflow_id
            self._release(previous.workflow_id)
        meter.advance(now)
        start = meter.begin()
        self._open[request_id] = _Open(endpoint, start, carried_usd, carried_gpu_s, workflow_id)
        if workflow_id is not None:
            self._wf_in_flight[workflow_id] = self._wf_in_flight.get(workflow_id, 0) + 1
            self._touch_workflow(workflow_id, None, now)
        return True

    def on_request_end(self, record: RequestRecord, now: float) -> RequestCost:
        """A request finished (successfully or not); returns what it cost, all attempts."""
        cost = RequestCost(0.0, 0.0)
        opened = self._open.pop(record.request_id, None)
        if opened is not None:
            last = self._close_attempt(opened, now)
            self._release(opened.workflow_id)
            self._carried_usd -= opened.carried_usd
            cost = RequestCost(
                last.gpu_seconds + opened.carried_gpu_s, last.usd + opened.carried_usd
            )
        self._charged_usd += cost.usd
        self._charged_gpu_s += cost.gpu_seconds
        self._count(record, cost, rejected=False, now=now)
        return cost

    def on_request_rejected(self, record: RequestRecord, now: float) -> None:
        """A request that never reached an endpoint (rejected, or no endpoint could take it):
        counted, costs nothing; a call outside a workflow is a failed task."""
        failed = dataclasses.replace(record, success=False)
        self._count(failed, RequestCost(0.0, 0.0), rejected=True, now=now)

    def end_workflow(self, workflow_id: str, outcome: TaskOutcome, now: float) -> bool:
        """The client reports a workflow's outcome; False if the workflow is not open."""
        wf = self._workflows.pop(workflow_id, None)
        if wf is None:
            return False
        wf.last_seen_s = max(wf.last_seen_s, now)
        self._close_workflow(wf, outcome)
        return True

    def expire(self, now: float) -> list[str]:
        """Close workflows idle for longer than the TTL as abandoned; returns their ids."""
        expired: list[str] = []
        while self._workflows:
            wf = next(iter(self._workflows.values()))
            if now - wf.last_seen_s < self._ttl_s:
                break
            if self._wf_in_flight.get(wf.workflow_id, 0) > 0:  # busy, not idle
                self._touch_workflow(wf.workflow_id, None, now)
                continue
            self._workflows.popitem(last=False)
            self._close_workflow(wf, TaskOutcome.ABANDONED)
            expired.append(wf.workflow_id)
        return expired

    # -- internals ----------------------------------------------------------------------

    def _close_attempt(self, opened: _Open, now: float) -> RequestCost:
        meter = self._meters[opened.endpoint]
        meter.advance(now)
        share = meter.end(opened.start_share_s)
        return RequestCost(share * meter.gpus, share * meter.price_per_s)

    def _release(self, workflow_id: str | None) -> None:
        if workflow_id is None:
            return
        left = self._wf_in_flight.pop(workflow_id, 0) - 1
        if left > 0:
            self._wf_in_flight[workflow_id] = left

    def _count(
        self, record: RequestRecord, cost: RequestCost, *, rejected: bool, now: float
    ) -> None:
        self._num_requests += 1
        if not record.success:
            self._num_failed += 1
            self._wasted_usd += cost.usd
        if rejected:
            self._num_rejected += 1
        if record.fallback_from is not None:
            self._num_fallbacks += 1
        self._by_model.add(record.model, record, cost, rejected)
        self._by_tenant.add(record.tenant, record, cost, rejected)
        if record.workflow_id is None:
            self._tasks[TaskOutcome.SUCCESS if record.success else TaskOutcome.FAILURE] += 1
            return
        wf = self._touch_workflow(record.workflow_id, record.tenant, now)
        wf.steps_done += 1
        wf.prompt_tokens += record.prompt_tokens
        wf.completion_tokens += record.completion_tokens
        wf.cost_usd += cost.usd
        if record.workflow_steps is not None:
            wf.steps_expected = record.workflow_steps
        last_step = record.workflow_step is not None and wf.steps_expected is not None
        if record.success and last_step and record.workflow_step == wf.steps_expected:
            self._workflows.pop(wf.workflow_id, None)
            self._close_workflow(wf, TaskOutcome.SUCCESS)

    def _touch_workflow(self, workflow_id: str, tenant: str | None, now: float) -> _Workflow:
        wf = self._workflows.get(workflow_id)
        if wf is None:
            while len(self._workflows) >= self._max_open:
                _, oldest = self._workflows.popitem(last=False)
                self._close_workflow(oldest, TaskOutcome.ABANDONED)
            wf = _Workflow(workflow_id, tenant or "", now, now)
            self._workflows[workflow_id] = wf
        else:
            self._workflows.move_to_end(workflow_id)
            wf.last_seen_s = max(wf.last_seen_s, now)
        if tenant and not wf.tenant:
            wf.tenant = tenant
        return wf

    def _close_workflow(self, wf: _Workflow, outcome: TaskOutcome) -> None:
        self._tasks[outcome] += 1
        item = (wf.cost_usd, wf.workflow_id, wf.summary(outcome))
        if len(self._top_closed) < TOP_WORKFLOWS:
            heapq.heappush(self._top_closed, item)
        elif item[:2] > self._top_closed[0][:2]:
            heapq.heapreplace(self._top_closed, item)

    # -- snapshot -----------------------------------------------------------------------

    def snapshot(self, now: float) -> AccountingSnapshot:
        """Totals up to ``now`` (read-only: counts pending time without advancing)."""
        end_s = max(now, self._start_s)
        rows = [self._endpoint_row(name, m, end_s) for name, m in self._meters.items()]
        fleet = math.fsum(r.spend_usd for r in rows)
        accrued = [m.open_share_s(end_s) * m.price_per_s for m in self._meters.values()]
        in_flight_usd = math.fsum([*accrued, self._carried_usd]) if self._open else 0.0
        successes = self._tasks[TaskOutcome.SUCCESS]
        tasks = {o.value: c for o, c in self._tasks.items()}
        tasks["open"] = len(self._workflows)
        return AccountingSnapshot(
            at_s=end_s,
            window_s=end_s - self._start_s,
            fleet_spend_usd=fleet,
            busy_usd=math.fsum(r.busy_usd for r in rows),
            idle_usd=math.fsum(r.idle_usd for r in rows),
            warming_usd=math.fsum(r.warming_usd for r in rows),
            charged_usd=self._charged_usd,
            in_flight_usd=in_flight_usd,
            wasted_usd=self._wasted_usd,
            retry_usd=self._retry_usd,
            gpu_seconds=math.fsum(m.gpus * (end_s - self._start_s) for m in self._meters.values()),
            charged_gpu_seconds=self._charged_gpu_s,
            num_requests=self._num_requests,
            num_failed=self._num_failed,
            num_rejected=self._num_rejected,
            num_in_flight=len(self._open),
            tasks=tasks,
            cost_per_successful_task_usd=fleet / successes if successes else None,
            success_per_dollar=successes / fleet if fleet > 0 else None,
            endpoints=tuple(rows),
            models=self._by_model.values(),
            tenants=self._by_tenant.values(),
            top_workflows=self._top_workflows(),
            num_fallbacks=self._num_fallbacks,
        )

    def _endpoint_row(self, name: str, m: SpendMeter, end_s: float) -> EndpointSpend:
        busy_dt, unbusy_dt = m.pending(end_s)
        unbusy = dict(m.unbusy_s)
        unbusy[m.state] += unbusy_dt
        warming_s = sum(unbusy[s] for s in _WARMING_STATES)
        idle_s = sum(v for s, v in unbusy.items() if s not in _WARMING_STATES)
        busy_s = m.busy_s + busy_dt
        window_s = end_s - self._start_s
        return EndpointSpend(
            name=name,
            gpu=self._infos[name].gpu,
            state=m.state.value,
            in_flight=m.n,
            spend_usd=window_s * m.price_per_s,
            busy_usd=busy_s * m.price_per_s,
            idle_usd=idle_s * m.price_per_s,
            warming_usd=warming_s * m.price_per_s,
            busy_share=busy_s / window_s if window_s > 0 else 0.0,
        )

    def _top_workflows(self) -> tuple[WorkflowSummary, ...]:
        items = [
            (wf.cost_usd, wf.workflow_id, wf.summary(TaskOutcome.OPEN))
            for wf in self._workflows.values()
        ]
        items.extend(self._top_closed)
        best = heapq.nlargest(TOP_WORKFLOWS, items, key=lambda i: (i[0], i[1]))
        return tuple(i[2] for i in best)
