"""The gateway's KV-event subscriber: one ZMQ SUB per engine, feeding the prefix index.

Each engine with ``--kv-events-config`` publishes ``[topic, seq, payload]`` on a PUB
socket and keeps recent batches for replay behind a ROUTER socket. Per endpoint this
module keeps one asyncio task that

* tracks the sequence: the next expected ``seq`` is applied; one already applied (an
  overlap after a replay) is skipped; a jump is a gap, healed by asking the replay socket
  for everything from the first missing ``seq`` (a DEALER sends ``[b"", start]`` and reads
  ``[b"", seq, payload]`` until seq -1);
* clears the endpoint in the index when the engine restarted: the live ``seq`` went
  backwards, or the connection dropped and the stream does not continue where it
  stopped, or a gap cannot be healed (those events are gone for good); it then rebuilds
  from whatever the replay buffer still holds, as it does when it first joins mid-stream;
* recreates its sockets after a ZMQ error (ZMQ itself reconnects a dropped TCP link);
* counts what happened, for /metrics, in :meth:`KVEventSubscriber.status`.

Decoding is :mod:`inferplane.core.kv_events`; the index (:class:`KVEventSink`) gets
``now`` from the event loop's clock, the one the gateway passes to ``record_route``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from inferplane.core.kv_events import (
    REPLAY_END_SEQ,
    KVEvent,
    KVEventDecodeError,
    decode_batch,
    decode_replay_frames,
    decode_seq,
    replay_request_frames,
)

log = logging.getLogger(__name__)


class KVEventSink(Protocol):
    """What the subscriber feeds: the prefix index implements it."""

    def apply_events(self, endpoint: str, events: Sequence[KVEvent], now: float) -> None: ...

    def clear_endpoint(self, endpoint: str) -> None: ...


@dataclass(frozen=True, slots=True)
class KVSource:
    """Where one endpoint publishes: its PUB address, optional replay ROUTER, topic prefix."""

    endpoint: str
    pub_url: str
    replay_url: str | None = None
    topic: str = ""


@dataclass(frozen=True, slots=True)
class SubscriberConfig:
    """Timeouts and bounds of the subscriber."""

    replay_timeout_s: float = 1.0  # longest wait for the next replayed message
    max_replay_messages: int = 100_000
    max_message_bytes: int = 64 << 20
    rcv_hwm: int = 100_000
    retry_backoff_s: float = 0.5  # after a socket error, before recreating the socket
    reconnect_ivl_ms: int = 100
    reconnect_ivl_max_ms: int = 2_000


class LinkState(enum.Enum):
    """The subscriber's view of one publisher."""

    CONNECTING = "connecting"
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class SubscriberStatus:
    """Counters of one endpoint's subscription (a snapshot)."""

    endpoint: str
    state: LinkState
    last_seq: int | None  # last sequence number applied
    messages: int  # batches applied (live or replayed)
    events_applied: int
    unknown_events: int
    decode_errors: int
    duplicates: int  # already applied, skipped
    gaps: int
    gaps_healed: int
    messages_lost: int  # never applied: no replay socket, or gone from its buffer
    replays: int
    replay_failures: int
    clears: int  # restarts detected and unhealable gaps


class _Link:
    """One endpoint's subscription: sockets, sequence state and counters."""

    def __init__(
        self,
        source: KVSource,
        sink: KVEventSink,
        ctx: zmq.asyncio.Context,
        config: SubscriberConfig,
        clock: Callable[[], float],
    ) -> None:
        self.source = source
        self.sink = sink
        self.ctx = ctx
        self.config = config
        self.clock = clock
        self.state = LinkState.CONNECTING
        self.last_applied: int | None = None
        self.last_live: int | None = None
        self.resync = False  # the link dropped: the next message must continue the stream
        self.counts = dict.fromkeys(
            (
                "messages",
                "events_applied",
                "unknown_events",
                "decode_errors",
                "duplicates",
                "gaps",
                "gaps_healed",
                "messages_lost",
                "replays",
                "replay_failures",
                "clears",
            ),
            0,
        )

    def status(self) -> SubscriberStatus:
        return SubscriberStatus(
            endpoint=self.source.endpoint,
            state=self.state,
            last_seq=self.last_applied,
            **self.counts,
        )

    async def run(self) -> None:
        """Subscribe, and recreate the sockets after an error, until cancelled."""
        try:
            while True:
                try:
                    await self._subscribe()
                except (zmq.ZMQError, OSError) as exc:
                    log.warning("kv events %s: %s; resubscribing", self.source.endpoint, exc)
                    self.state = LinkState.DISCONNECTED
                    self.resync = True
                    await asyncio.sleep(self.config.retry_backoff_s)
        finally:
            self.state = LinkState.STOPPED

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        sock.setsockopt(zmq.RECONNECT_IVL, self.config.reconnect_ivl_ms)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, self.config.reconnect_ivl_max_ms)
        return sock

    async def _subscribe(self) -> None:
        sub = self._socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, self.config.rcv_hwm)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode("utf-8"))
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(self.source.pub_url)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    self._on_monitor(parse_monitor_message(await monitor.recv_multipart()))
                if sub in ready:
                    await self._drain(sub)
        finally:
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    def _on_monitor(self, event: Mapping[str, object]) -> None:
        if event.get("event") == zmq.EVENT_CONNECTED:
            self.state = LinkState.CONNECTED
        elif event.get("event") == zmq.EVENT_DISCONNECTED:
            self.state = LinkState.DISCONNECTED
            self.resync = True

    async def _drain(self, sub: zmq.asyncio.Socket) -> None:
        """Handle every message already queued (bounded), without a poll between them."""
        for _ in range(1_000):
            try:
                frames = await sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            await self.on_message(frames)

    async def on_message(self, frames: Sequence[bytes]) -> None:
        """One live message: sequence it, heal a gap before it, apply it."""
        try:
            if len(frames) != 3:
                raise KVEventDecodeError(f"expected 3 frames, got {len(frames)}")
            seq = decode_seq(frames[1])
        except KVEventDecodeError as exc:
            self._decode_error(exc)
            return
        if self.last_live is not None and seq <= self.last_live:
            self._clear(f"seq went back from {self.last_live} to {seq}: engine restarted")
        elif self.resync and self.last_applied is not None and seq != self.last_applied + 1:
            self._clear(f"link dropped and the stream resumed at {seq}")
        self.resync = False
        self.last_live = seq
        expected = 0 if self.last_applied is None else self.last_applied + 1
        if seq < expected:
            self.counts["duplicates"] += 1
            return
        if seq > expected:
            await self._heal(expected, seq)
            if self.last_applied is not None and seq <= self.last_applied:
                return
        self._apply(seq, frames[2])

    def _apply(self, seq: int, payload: bytes) -> None:
        self.last_applied = seq
        try:
            batch = decode_batch(payload)
        except KVEventDecodeError as exc:
            self._decode_error(exc)
            return
        self.sink.apply_events(self.source.endpoint, batch.events, self.clock())
        self.counts["messages"] += 1
        self.counts["events_applied"] += len(batch.events)
        self.counts["unknown_events"] += batch.num_unknown_events

    def _decode_error(self, exc: Exception) -> None:
        self.counts["decode_errors"] += 1
        log.warning("kv events %s: undecodable message: %s", self.source.endpoint, exc)

    def _clear(self, reason: str) -> None:
        log.info("kv events %s: clearing the index: %s", self.source.endpoint, reason)
        self.sink.clear_endpoint(self.source.endpoint)
        self.counts["clears"] += 1
        self.last_applied = None
        self.last_live = None

    async def _heal(self, start: int, seen: int) -> None:
        """Fill [start, seen) from the replay socket; clear if it cannot be filled."""
        joining = self.last_applied is None
        if not joining:
            self.counts["gaps"] += 1
        if self.source.replay_url is None or not await self._replay(start, joining):
            if not joining:
                self.counts["messages_lost"] += seen - start
                self._clear(f"{seen - start} messages lost before seq {seen}")
            return
        if not joining and self.last_applied is not None and self.last_applied >= seen - 1:
            self.counts["gaps_healed"] += 1

    async def _replay(self, start: int, joining: bool) -> bool:
        """Apply replayed batches from ``start``; False when the replay failed."""
        assert self.source.replay_url is not None
        self.counts["replays"] += 1
        dealer = self._socket(zmq.DEALER)
        timeout_ms = int(self.config.replay_timeout_s * 1000)
        try:
            dealer.connect(self.source.replay_url)
            await dealer.send_multipart(replay_request_frames(start))
            for _ in range(self.config.max_replay_messages):
                if not await dealer.poll(timeout_ms):
                    break
                seq, payload = decode_replay_frames(await dealer.recv_multipart())
                if seq == REPLAY_END_SEQ:
                    return True
                self._replayed(seq, payload, start, joining)
        except (KVEventDecodeError, zmq.ZMQError) as exc:
            log.warning("kv events %s: replay from %d failed: %s", self.source.endpoint, start, exc)
        finally:
            dealer.close(linger=0)
        self.counts["replay_failures"] += 1
        return False

    def _replayed(self, seq: int, payload: bytes, start: int, joining: bool) -> None:
        expected = start if self.last_applied is None else self.last_applied + 1
        if seq < expected:
            self.counts["duplicates"] += 1
            return
        if seq > expected and not joining:
            # The buffer no longer holds what we missed: start over from what it has.
            self.counts["messages_lost"] += seq - expected
            self._clear(f"replay resumed at {seq}, {seq - expected} messages gone")
        self._apply(seq, payload)


class KVEventSubscriber:
    """Subscribes to every engine's KV events and applies them to one sink (the index).

    Use from inside the gateway's event loop: :meth:`add` starts a task per endpoint.
    """

    def __init__(
        self,
        sink: KVEventSink,
        config: SubscriberConfig | None = None,
        ctx: zmq.asyncio.Context | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.sink = sink
        self.config = config or SubscriberConfig()
        self._owns_ctx = ctx is None
        self._ctx = ctx or zmq.asyncio.Context()
        self._clock = clock
        self._links: dict[str, tuple[_Link, asyncio.Task[None]]] = {}

    def add(self, source: KVSource) -> None:
        """Start subscribing to ``source`` (replacing an earlier source of that endpoint)."""
        if source.endpoint in self._links:
            self._stop(source.endpoint)
        clock = self._clock or asyncio.get_running_loop().time
        link = _Link(source, self.sink, self._ctx, self.config, clock)
        task = asyncio.create_task(link.run(), name=f"kv-events-{source.endpoint}")
        self._links[source.endpoint] = (link, task)

    async def remove(self, endpoint: str) -> None:
        """Stop subscribing to ``endpoint`` and forget its blocks."""
        task = self._stop(endpoint)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.sink.clear_endpoint(endpoint)

    def _stop(self, endpoint: str) -> asyncio.Task[None] | None:
        entry = self._links.pop(endpoint, None)
        if entry is None:
            return None
        entry[1].cancel()
        return entry[1]

    async def close(self) -> None:
        """Stop every subscription (the index keeps what it has) and the ZMQ context."""
        tasks = [self._stop(name) for name in list(self._links)]
        for task in tasks:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._owns_ctx:
            self._ctx.term()

    def status(self) -> dict[str, SubscriberStatus]:
        """Per endpoint: link state, last seq applied, gaps healed, errors."""
        return {name: link.status() for name, (link, _) in self._links.items()}
