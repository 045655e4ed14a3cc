"""Drives one clock-free ``EngineModel`` in real time on the asyncio event loop.

The driver is the only place where the emulated engine meets a clock. One task per
engine sleeps until ``model.next_event_time()`` with a single ``call_at`` timer (woken
early when a request arrives), calls ``model.advance(now)`` and fans the events out: token
ids to the per-request ``RequestStream`` of the HTTP handler that waits for them (or, when
the handler attached a ``sink``, straight into it: a streaming handler writes each step's
chunk to its socket without a task wake-up per token), latency samples to
``EngineMetrics``, KV events (one batch per wake-up) to the publisher. A failing model
step is logged and handled as a crash, so clients never hang on a dead driver.

The model's clock is the loop clock minus the time spent hung (``hang`` pauses it), so a
hang freezes the engine instead of letting it catch up in a burst when it ends.

Lag: each timer wake-up that finds its event due records its lateness (loop time minus
the event's scheduled time). ``lag_fraction`` is the total lateness over the elapsed run
time: the share of real time for which the engine's visible output trailed the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from inferplane.engine.faults import FaultInjector
from inferplane.engine.metrics import EngineMetrics
from inferplane.engine.model import EngineModel
from inferplane.engine.types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineEvent,
    EngineRequest,
    EngineState,
    FinishReason,
    KVEvent,
    RequestFinished,
    RequestScheduled,
    StateChanged,
    TokensGenerated,
)

log = logging.getLogger("inferplane.engine")

KVSink = Callable[[float, Sequence[KVEvent]], object]
_KV_TYPES = (BlockStored, BlockRemoved, AllBlocksCleared)


class RequestStream:
    """The channel from the driver to the handler of one request."""

    __slots__ = (
        "_pending",
        "_waiter",
        "arrival_s",
        "finished",
        "last_token_s",
        "num_cached_tokens",
        "num_tokens",
        "request_id",
        "sink",
    )

    def __init__(self, request_id: str, arrival_s: float) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.num_tokens = 0
        self.num_cached_tokens = 0
        self.last_token_s: float | None = None
        self.finished: RequestFinished | None = None
        self._pending: list[int] = []
        self._waiter: asyncio.Future[None] | None = None
        #: when set, tokens go straight to it from the driver (no task wake-up per step)
        self.sink: Callable[[Sequence[int]], None] | None = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _push(self, token_ids: Sequence[int]) -> None:
        """Deliver tokens (already counted in ``num_tokens`` by the driver)."""
        if self.sink is not None:
            self.sink(token_ids)
            return
        self._pending.extend(token_ids)
        self._wake()

    def attach(self, sink: Callable[[Sequence[int]], None]) -> None:
        """Deliver tokens to ``sink`` synchronously from now on (pending ones first)."""
        pending, self._pending = self._pending, []
        if pending:
            sink(pending)
        self.sink = sink

    def _finish(self, event: RequestFinished) -> None:
        self.finished = event
        self._wake()

    async def next_tokens(self) -> list[int]:
        """Tokens produced since the last call; [] only once the request has finished."""
        while not self._pending and self.finished is None:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        tokens, self._pending = self._pending, []
        return tokens


class EngineDriver:
    """Runs ``model`` on the running loop; see the module docstring."""

    def __init__(
        self,
        model: EngineModel,
        *,
        metrics: EngineMetrics | None = None,
        kv_sink: KVSink | None = None,
        faults: FaultInjector | None = None,
        wall_clock_offset_s: float = 0.0,
    ) -> None:
        self.model = model
        self.metrics = metrics
        self.kv_sink = kv_sink
        self.faults = faults or FaultInjector()
        self.wall_clock_offset_s = wall_clock_offset_s  # epoch seconds minus loop time
        self._streams: dict[str, RequestStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused_since: float | None = None
        self._offset_s = 0.0  # loop time minus model time (time spent hung)
        self._crash_pending = False
        self._started_s = 0.0
        self.num_wakeups = 0
        self.num_due_wakeups = 0  # wake-ups that found a model event due (not early kicks)
        self.num_late_wakeups = 0
        self.total_lateness_s = 0.0
        self.max_lateness_s = 0.0

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._started_s = self._loop.time()
        self.model.slowdown = self.faults.config.slowdown
        if self.model.state is EngineState.COLD:
            self._dispatch(self.model.start_loading(self.model_now()))
        if self.faults.config.hang:
            self._paused_since = self._loop.time()
        self._task = asyncio.create_task(self._run(), name="engine-driver")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def state(self) -> EngineState:
        return self.model.state

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def loop_time(self) -> float:
        assert self._loop is not None, "driver not started"
        return self._loop.time()

    def model_now(self) -> float:
        """The model's clock: loop time minus the time spent hung."""
        now = self.loop_time()
        if self._paused_since is not None:
            now = self._paused_since
        return now - self._offset_s

    def wall_time_s(self) -> float:
        """Epoch seconds, derived from the loop clock (for ``created`` and KV batches)."""
        return self.loop_time() + self.wall_clock_offset_s

    def lag_fraction(self) -> float:
        elapsed = self.loop_time() - self._started_s
        return self.total_lateness_s / elapsed if elapsed > 0 else 0.0

    # -- requests ---------------------------------------------------------------------

    def submit(self, request: EngineRequest) -> RequestStream:
        """Queue ``request`` in the model (ValueError if it cannot fit) and stream it."""
        self.model.submit(request, self.model_now())
        stream = RequestStream(request.request_id, self.loop_time())
        self._streams[request.request_id] = stream
        self._kick()
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request (client went away); its KV blocks return to the pool."""
        if request_id in self._streams:
            self._dispatch(self.model.abort(request_id, self.model_now()))
            self._streams.pop(request_id, None)
            self._kick()

    # -- faults -----------------------------------------------------------------------

    def set_slowdown(self, factor: float) -> None:
        self.model.slowdown = factor

    def set_hang(self, hang: bool) -> None:
        now = self.loop_time()
        if hang and self._paused_since is None:
            self._paused_since = now
        elif not hang and self._paused_since is not None:
            self._offset_s += now - self._paused_since
            self._paused_since = None
        self._kick()

    def restart(self) -> None:
        """Crash and restart cold: in-flight requests fail, KV cleared, weights reload.

        Every request still streaming fails, even one the model completed while catching
        up to ``now`` (those tokens are dropped with ``_crash_pending`` set): once the
        engine dies nothing it had not yet sent reaches a client.
        """
        self._crash_pending = True
        now = self.model_now()
        self._dispatch(self.model.reset(now, cold=True))
        for stream in list(self._streams.values()):
            failed = RequestFinished(now, stream.request_id, FinishReason.ERROR, 0, 0, 0)
            self._on_finished(failed, self.loop_time())
        self._streams.clear()
        self._crash_pending = False
        self._dispatch(self.model.start_loading(now))
        self._kick()

    # -- the loop ---------------------------------------------------------------------

    def _kick(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _sleep_until(self, when: float | None) -> None:
        assert self._loop is not None
        self._waiter = self._loop.create_future()
        handle = None if when is None else self._loop.call_at(when, self._kick)
        try:
            await self._waiter
        finally:
            if handle is not None:
                handle.cancel()
            self._waiter = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = None if self._paused_since is not None else self.model.next_event_time()
            due_real = None if due is None else due + self._offset_s
            if due_real is None or due_real > loop.time():
                await self._sleep_until(due_real)
            else:
                await asyncio.sleep(0)  # behind schedule: still let the handlers run
            if self._paused_since is not None:
                continue
            now = loop.time()
            self.num_wakeups += 1
            if due_real is not None and now >= due_real:
                lateness = now - due_real
                self.num_due_wakeups += 1
                self.total_lateness_s += lateness
                self.max_lateness_s = max(self.max_lateness_s, lateness)
                self.num_late_wakeups += lateness > 0.001
            try:
                self._dispatch(self.model.advance(now - self._offset_s))
            except Exception:  # a model bug must not leave clients hanging forever
                log.exception("engine step failed; restarting the engine")
                self._crash_pending = True
            if self._crash_pending:
                self.faults.disarm_crash()
                self.restart()

    def _dispatch(self, events: Sequence[EngineEvent]) -> None:
        """Fan ``events`` out; tokens are delivered once per stream at the end, so a driver
        that caught up several steps at once writes one chunk per stream, not one per step."""
        kv_events: list[KVEvent] = []
        streams = self._streams
        metrics = self.metrics
        offset = self._offset_s
        batch: dict[str, tuple[RequestStream, list[int]]] = {}
        for event in events:
            kind = type(event)
            if self._crash_pending and kind in (TokensGenerated, RequestFinished):
                continue  # the engine died at the crash point: later results never happen
            if kind is TokensGenerated:
                assert isinstance(event, TokensGenerated)
                self._on_tokens(event, event.time_s + offset, batch)
            elif kind is RequestFinished:
                assert isinstance(event, RequestFinished)
                self._on_finished(event, event.time_s + offset)
            elif kind is RequestScheduled:
                assert isinstance(event, RequestScheduled)
                stream = streams.get(event.request_id)
                if stream is not None:
                    stream.num_cached_tokens = event.num_cached_tokens
                    if metrics is not None:
                        metrics.queue_time.observe(event.time_s + offset - stream.arrival_s)
            elif isinstance(event, _KV_TYPES):
                kv_events.append(event)
            elif kind is StateChanged:
                pass  # the state is read from the model when asked
        for stream, tokens in batch.values():
            stream._push(tokens)
        if kv_events and self.kv_sink is not None:
            self.kv_sink(self.wall_time_s(), kv_events)

    def _on_tokens(
        self, event: TokensGenerated, when: float, batch: dict[str, tuple[RequestStream, list[int]]]
    ) -> None:
        stream = self._streams.get(event.request_id)
        if stream is None:
            return
        metrics = self.metrics
        if metrics is not None:
            if stream.last_token_s is None:
                metrics.ttft.observe(when - stream.arrival_s)
            else:
                metrics.inter_token.observe(when - stream.last_token_s)
        stream.last_token_s = when
        tokens = event.token_ids
        limit = self.faults.config.crash_after_tokens
        if limit is not None and stream.num_tokens + len(tokens) >= limit:
            tokens = tokens[: max(0, limit - stream.num_tokens)]
            self._crash_pending = True
        stream.num_tokens += len(tokens)
        entry = batch.get(event.request_id)
        if entry is None:
            batch[event.request_id] = (stream, list(tokens))
        else:
            entry[1].extend(tokens)

    def _on_finished(self, event: RequestFinished, when: float) -> None:
        stream = self._streams.pop(event.request_id, None)
        if self.metrics is not None:
            self.metrics.on_finished(event.reason)
            if stream is not None:
                self.metrics.e2e.observe(when - stream.arrival_s)
        if stream is not None:
            stream._finish(event)
