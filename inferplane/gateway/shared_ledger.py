"""The workflow ledger shared by gateway workers and replicas through the state store.

Behind a load balancer, the calls of one agentic workflow land on different gateways; each
must weigh the workflow's whole history (steps done, sunk cost, retries used), not just the
calls it happened to see. With ``state: backend: redis`` the admission ledger of every
gateway is a :class:`~inferplane.core.workflow_sync.SyncedLedger`, and this module keeps
it in step with the shared record (``StateStore.workflow_update``, one atomic script):

* **writes** (every admit, dispatch and finish queues a delta) go out from a background
  flusher, never on the request path, ``flush_delay_s`` (5 ms) after the first queued
  change: the outbox is coalesced (an admit and its dispatch are one update, and so is a
  whole call that ended within the delay) and sent in order per workflow, a few workflows
  at a time; the record the store answers with is merged back into the local ledger;
* **reads** (hydration) are read-through on the request path, bounded: a workflow call
  whose workflow was not synced within ``fresh_s`` reads the shared record first, waiting
  at most ``read_timeout_s`` (by default the store's own per-call deadline, ``state:
  op_timeout_s``), concurrently with the shared quota take, which waits as long, so it adds
  a round trip to no call; on a timeout or an error the call is judged on the local view.
  A gateway that has never seen a workflow thus admits its step 7 knowing the 6 steps and
  the money spent elsewhere.

The merge is a per-field maximum (every counter only grows), so replays, duplicates and
reorderings converge. When Redis is down the resilient store answers from local memory
and journals the deltas; they reach Redis when it returns (``ResilientStore.maintain``).
``GET /v1/workflows/{id}`` shows the shared record next to this gateway's view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from inferplane.core.admission import Admission
from inferplane.core.state import StateStore, WorkflowDelta
from inferplane.core.types import CallContext, scoped_workflow_id
from inferplane.core.workflow_sync import SyncedLedger, coalesce
from inferplane.core.workflows import WorkflowRecord
from inferplane.gateway.errors import ApiError

if TYPE_CHECKING:
    from inferplane.gateway.app import Gateway

__all__ = ["LedgerSyncStats", "SharedLedger", "setup_workflow_routes"]

log = logging.getLogger("inferplane.gateway.shared_ledger")

_DEFAULT_READ_TIMEOUT_S = 0.05
# deltas wait this long before a flush, so a short call's admit, dispatch and finish go out
# as one update, and the deltas of many workflows go out in one batch (pipelined)
_FLUSH_DELAY_S = 0.005
_PARALLEL_WORKFLOWS = 16  # store updates in flight at once (each workflow's stay in order)
_ROUTES_KEY = web.AppKey("inferplane.workflow_routes", bool)


@dataclass(frozen=True, slots=True)
class LedgerSyncStats:
    """Counters of the ledger sync, for /v1/stats."""

    hydrations: int  # shared records read into the local ledger on the request path
    hydration_misses: int  # reads that found nothing (a new workflow)
    hydration_timeouts: int  # reads given up after read_timeout_s (judged locally)
    hydration_errors: int
    updates: int  # deltas the store took
    update_errors: int  # deltas lost to a store error
    pending: int  # deltas waiting for the flusher
    dropped: int  # deltas dropped from a full outbox


class SharedLedger:
    """Keeps an admission controller's workflow ledger in step with the shared store."""

    def __init__(
        self,
        store: StateStore,
        core: Admission,
        clock: Callable[[], float],
        *,
        fresh_s: float = 0.5,
        flush_delay_s: float = _FLUSH_DELAY_S,
        read_timeout_s: float | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.ttl_s = core.config.workflows.idle_ttl_s
        self.fresh_s = fresh_s
        self.flush_delay_s = flush_delay_s
        if read_timeout_s is None:  # the store's own deadline (the quota take's too)
            read_timeout_s = float(getattr(store, "op_timeout_s", _DEFAULT_READ_TIMEOUT_S))
        self.read_timeout_s = read_timeout_s
        self._clock = clock
        self._wall = wall_clock
        self._wake = asyncio.Event()
        self.ledger = SyncedLedger(core.config.workflows, on_change=self._wake.set)
        core.workflows = self.ledger  # admission now queues a delta per change
        self._synced: OrderedDict[str, float] = OrderedDict()  # workflow -> when (clock)
        self._max_synced = core.config.workflows.max_workflows
        self._counts = dict.fromkeys(
            ("hydrations", "misses", "timeouts", "errors", "updates", "update_errors"), 0
        )
        self._flushing: asyncio.Task[None] | None = None

    # ---- reads (request path, bounded) -----------------------------------------------------

    async def hydrate(self, call: CallContext) -> None:
        """Fold the shared record of ``call``'s workflow into the local ledger, unless it
        was synced within ``fresh_s``; give up after ``read_timeout_s``."""
        wid = call.workflow_id
        if wid is None:
            return
        now = self._clock()
        synced = self._synced.get(wid)
        if synced is not None and now - synced < self.fresh_s:
            return
        c = self._counts
        try:
            async with asyncio.timeout(self.read_timeout_s):
                record = await self.store.workflow_get(wid, self._wall())
        except TimeoutError:
            c["timeouts"] += 1
            return
        except Exception:  # a plain (not resilient) store failed: judge locally
            c["errors"] += 1
            return
        if record is None:
            c["misses"] += 1
        else:
            c["hydrations"] += 1
            self.ledger.merge(record, self._clock())
        self._mark(wid)

    def _mark(self, workflow_id: str) -> None:
        self._synced[workflow_id] = self._clock()
        self._synced.move_to_end(workflow_id)
        while len(self._synced) > self._max_synced:
            self._synced.popitem(last=False)

    # ---- writes (background) ---------------------------------------------------------------

    async def run(self) -> None:
        """Send queued deltas whenever there are some, until cancelled (then a last,
        bounded flush, so a draining gateway leaves its ledger in the store)."""
        try:
            while True:
                await self._wake.wait()
                if self.flush_delay_s > 0:
                    await asyncio.sleep(self.flush_delay_s)
                self._wake.clear()
                await self.flush()
        finally:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.flush(), 1.0)

    async def flush(self) -> None:
        """Send every queued delta now (in order per workflow)."""
        while self.ledger.outbox:
            by_workflow: dict[str, list[WorkflowDelta]] = {}
            for wid, delta in coalesce(self.ledger.drain()):
                by_workflow.setdefault(wid, []).append(delta)
            items = list(by_workflow.items())
            for i in range(0, len(items), _PARALLEL_WORKFLOWS):
                batch = items[i : i + _PARALLEL_WORKFLOWS]
                if len(batch) == 1:  # the common case: no task to spawn
                    await self._send(*batch[0])
                else:
                    await asyncio.gather(*(self._send(wid, deltas) for wid, deltas in batch))

    async def _send(self, workflow_id: str, deltas: list[WorkflowDelta]) -> None:
        record: WorkflowRecord | None = None
        for delta in deltas:
            try:
                record = await self.store.workflow_update(
                    workflow_id, delta, self._wall(), self.ttl_s
                )
                self._counts["updates"] += 1
            except Exception:  # the resilient store never raises; a plain one may
                self._counts["update_errors"] += 1
                log.warning("workflow ledger update failed", exc_info=True)
        if record is not None:
            self.ledger.merge(record, self._clock())
            self._mark(workflow_id)

    async def end(self, workflow_id: str) -> bool:
        """The workflow is over: forget it here and in the store."""
        local = self.ledger.end(workflow_id)
        self._synced.pop(workflow_id, None)
        try:
            shared = await self.store.workflow_end(workflow_id)
        except Exception:
            log.warning("workflow end not shared", exc_info=True)
            shared = False
        return local or shared

    async def view(self, workflow_id: str) -> dict[str, Any]:
        """The shared record and this gateway's view of one workflow."""
        try:
            shared = await asyncio.wait_for(
                self.store.workflow_get(workflow_id, self._wall()), max(0.5, self.read_timeout_s)
            )
        except Exception:
            shared = None
        if shared is not None:
            self.ledger.merge(shared, self._clock())
        return {
            "workflow_id": workflow_id,
            "shared": None if shared is None else _record_json(shared),
            "local": _local_json(self.ledger.get(workflow_id)),
            "store": self.store.mode.value,
        }

    def stats(self) -> LedgerSyncStats:
        c = self._counts
        return LedgerSyncStats(
            c["hydrations"], c["misses"], c["timeouts"], c["errors"], c["updates"],
            c["update_errors"], len(self.ledger.outbox), self.ledger.dropped,
        )  # fmt: skip


def _record_json(record: WorkflowRecord) -> dict[str, Any]:
    return asdict(record)


def _local_json(record: WorkflowRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    out = asdict(record)
    del out["first_seen_s"], out["last_seen_s"]  # the gateway's loop clock: meaningless outside
    return out


# ---- HTTP ------------------------------------------------------------------------------------


def setup_workflow_routes(app: web.Application, gw: Gateway) -> None:
    """``GET /v1/workflows/{id}``: the workflow's ledger, shared and as this gateway sees it
    (the caller's tenant's workflows only: another tenant's read as unknown, 404).

    Idempotent (the serve commands and ``Gateway.build_app`` may both call it).
    """
    if app.get(_ROUTES_KEY):
        return
    app[_ROUTES_KEY] = True

    async def show(request: web.Request) -> web.Response:
        tenant = gw._auth.caller(request.headers).tenant
        workflow_id = request.match_info["workflow_id"]
        scoped = scoped_workflow_id(tenant, workflow_id)  # the caller's own workflow only
        sync = gw.gate.ledger_sync
        if sync is not None:
            body = await sync.view(scoped)
        else:
            local = gw.gate.core.workflows.get(scoped)
            body = {"shared": None, "local": _local_json(local), "store": gw.state.mode.value}
        body["workflow_id"] = workflow_id  # as the client named it
        owner = body["shared"] or body["local"]
        if owner is None or owner["tenant"] != tenant:  # another tenant's: not shown
            raise ApiError(
                404, f"workflow '{workflow_id[:128]}' is not known", code="workflow_not_found"
            )
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    app.router.add_get("/v1/workflows/{workflow_id}", show)
