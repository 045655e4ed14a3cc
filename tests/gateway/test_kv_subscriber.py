"""The KV-event subscriber against a tiny vLLM-style publisher over real ZMQ on loopback.

The fake engine below follows REFERENCE §1 and vLLM's ZmqEventPublisher: PUB frames
``[topic, seq (8 bytes BE), msgpack([ts, events, dp_rank])]`` and a ROUTER replay socket
answering ``[identity, b"", start_seq]`` with ``(seq, payload)`` pairs, then seq -1.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable

import msgpack
import pytest
import zmq
import zmq.asyncio

from inferplane.core.prefix_index import PrefixIndex, block_keys
from inferplane.engine.kv_publisher import KVEncoding, KVEventPublisher
from inferplane.engine.types import BlockRemoved as EngineBlockRemoved
from inferplane.engine.types import BlockStored as EngineBlockStored
from inferplane.gateway.kv_subscriber import (
    KVEventSubscriber,
    KVSource,
    LinkState,
    SubscriberConfig,
    SubscriberStatus,
)
from tests.gateway.fakes import until

BS = 16


class FakeEngine:
    """Publishes hand-built KV-event batches; can drop one, restart, or serve replays."""

    def __init__(self, ctx: zmq.asyncio.Context, *, replay: bool = True, seed: int = 1) -> None:
        self.ctx = ctx
        self.seed = seed
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.replay_url: str | None = None
        self.task: asyncio.Task[None] | None = None
        if replay:
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.replay_url = (
                f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
            )
            self.task = asyncio.create_task(self._serve_replay())

    @property
    def source(self) -> KVSource:
        return KVSource("e1", f"tcp://127.0.0.1:{self.port}", self.replay_url)

    def hashes(self, tokens: list[int]) -> list[int]:
        h, out = self.seed, []
        for i in range(len(tokens) // BS):
            h = hash((self.seed, h, tuple(tokens[i * BS : (i + 1) * BS]))) & (2**64 - 1)
            out.append(h)
        return out

    def stored(self, tokens: list[int], first: int, last: int) -> list[object]:
        hashes = self.hashes(tokens)
        parent = hashes[first - 1].to_bytes(8, "big") if first else None  # bytes form
        return ["BlockStored", hashes[first:last], parent, tokens[first * BS : last * BS], BS]

    async def publish(self, events: list[object], *, drop: bool = False) -> None:
        await self.publish_raw(msgpack.packb([0.0, events, 0], use_bin_type=True), drop=drop)

    async def publish_raw(self, payload: bytes, *, drop: bool = False) -> None:
        seq, self.seq = self.seq, self.seq + 1
        self.buffer.append((seq, payload))
        if not drop:
            await self.pub.send_multipart([b"kv@test", seq.to_bytes(8, "big"), payload])

    async def restart(self, *, rebind: bool) -> None:
        """A new engine process: fresh sequence, fresh hash seed, empty replay buffer."""
        self.seq, self.buffer, self.seed = 0, [], self.seed + 100
        if rebind:
            self.pub.close(linger=0)
            self.pub = self.ctx.socket(zmq.PUB)
            self.pub.setsockopt(zmq.LINGER, 0)
            for _ in range(200):  # ZMQ closes the old listener in its I/O thread
                try:
                    self.pub.bind(f"tcp://127.0.0.1:{self.port}")
                    return
                except zmq.ZMQError:
                    await asyncio.sleep(0.01)
            raise AssertionError("could not rebind the PUB port")

    async def _serve_replay(self) -> None:
        while True:
            ident, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await self.router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            end = (-1).to_bytes(8, "big", signed=True)
            await self.router.send_multipart([ident, b"", end, b""])

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.router.close(linger=0)
        self.pub.close(linger=0)


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


def tokens_for(seed: int, num_blocks: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32_000) for _ in range(num_blocks * BS)]


async def start(
    ctx: zmq.asyncio.Context, engine: FakeEngine
) -> tuple[PrefixIndex, KVEventSubscriber]:
    index = PrefixIndex()
    subscriber = KVEventSubscriber(index, SubscriberConfig(replay_timeout_s=1.0), ctx=ctx)
    subscriber.add(engine.source)
    await until(lambda: subscriber.status()["e1"].state is LinkState.CONNECTED)
    return index, subscriber


async def prime(engine: FakeEngine, status: Callable[[], SubscriberStatus]) -> None:
    """Publish empty batches until one arrives (a SUB misses what precedes its join)."""
    while status().messages == 0:
        await engine.publish([])
        await asyncio.sleep(0.02)


async def test_stores_and_a_healed_gap_reach_the_index(ctx: zmq.asyncio.Context) -> None:
    engine = FakeEngine(ctx)
    tokens = tokens_for(1, 6)
    keys = block_keys(tokens)
    await engine.publish([engine.stored(tokens, 0, 2)])  # before the join: served by replay
    index, subscriber = await start(ctx, engine)
    await prime(engine, lambda: subscriber.status()["e1"])
    await engine.publish([engine.stored(tokens, 2, 4)], drop=True)  # lost on the wire
    await engine.publish([engine.stored(tokens, 4, 6)])
    await until(lambda: index.match(keys, ["e1"])["e1"] == 6)
    status = subscriber.status()["e1"]
    assert status.gaps == 1 and status.gaps_healed == 1 and status.messages_lost == 0
    assert status.last_seq == engine.seq - 1
    assert status.events_applied == 3
    await subscriber.close()
    await engine.close()


async def test_restart_with_seq_back_to_zero_clears(ctx: zmq.asyncio.Context) -> None:
    engine = FakeEngine(ctx)
    old, new = tokens_for(2, 3), tokens_for(3, 2)
    index, subscriber = await start(ctx, engine)
    await prime(engine, lambda: subscriber.status()["e1"])
    await engine.publish([engine.stored(old, 0, 3)])
    await until(lambda: index.match(block_keys(old), ["e1"])["e1"] == 3)
    await engine.restart(rebind=False)
    await engine.publish([engine.stored(new, 0, 2)])
    await until(lambda: index.match(block_keys(new), ["e1"])["e1"] == 2)
    assert index.match(block_keys(old), ["e1"])["e1"] == 0
    assert subscriber.status()["e1"].clears == 1
    await subscriber.remove("e1")  # the endpoint left the fleet: its blocks go too
    assert index.match(block_keys(new), ["e1"])["e1"] == 0
    await subscriber.close()
    await engine.close()


async def test_all_blocks_cleared_and_bad_payloads(ctx: zmq.asyncio.Context) -> None:
    engine = FakeEngine(ctx)
    tokens = tokens_for(4, 2)
    index, subscriber = await start(ctx, engine)
    await prime(engine, lambda: subscriber.status()["e1"])
    await engine.publish([engine.stored(tokens, 0, 2)])
    await engine.publish_raw(b"\xc1 not msgpack")
    await engine.publish([{"type": "SomethingNew"}])
    await until(lambda: subscriber.status()["e1"].unknown_events == 1)
    assert index.match(block_keys(tokens), ["e1"])["e1"] == 2
    await engine.publish([["AllBlocksCleared"]])
    await until(lambda: index.match(block_keys(tokens), ["e1"])["e1"] == 0)
    status = subscriber.status()["e1"]
    assert status.decode_errors == 1 and status.gaps == 0
    await subscriber.remove("e1")
    assert subscriber.status() == {}
    await subscriber.close()
    await engine.close()


async def test_gap_without_replay_socket_is_lost_and_clears(ctx: zmq.asyncio.Context) -> None:
    engine = FakeEngine(ctx, replay=False)
    first, second = tokens_for(5, 2), tokens_for(6, 2)
    index, subscriber = await start(ctx, engine)
    await prime(engine, lambda: subscriber.status()["e1"])
    await engine.publish([engine.stored(first, 0, 2)])
    await engine.publish([], drop=True)
    await engine.publish([engine.stored(second, 0, 2)])
    await until(lambda: index.match(block_keys(second), ["e1"])["e1"] == 2)
    status = subscriber.status()["e1"]
    assert status.messages_lost == 1 and status.clears == 1 and status.gaps_healed == 0
    assert index.match(block_keys(first), ["e1"])["e1"] == 0  # could be stale: dropped
    await subscriber.close()
    await engine.close()


async def test_reconnect_to_a_restarted_engine_resyncs(ctx: zmq.asyncio.Context) -> None:
    engine = FakeEngine(ctx)
    old, new = tokens_for(7, 2), tokens_for(8, 3)
    index, subscriber = await start(ctx, engine)
    await prime(engine, lambda: subscriber.status()["e1"])
    await engine.publish([engine.stored(old, 0, 2)])
    await until(lambda: index.match(block_keys(old), ["e1"])["e1"] == 2)
    await engine.restart(rebind=True)  # the link drops; the new process publishes before we rejoin
    await until(lambda: subscriber.status()["e1"].state is LinkState.DISCONNECTED)
    for _ in range(5):
        await engine.publish([])
    await engine.publish([engine.stored(new, 0, 3)], drop=True)
    await until(lambda: subscriber.status()["e1"].state is LinkState.CONNECTED)
    while index.match(block_keys(new), ["e1"])["e1"] != 3:
        await engine.publish([])  # the stream resumes past where it stopped
        await asyncio.sleep(0.02)
    assert index.match(block_keys(old), ["e1"])["e1"] == 0
    assert subscriber.status()["e1"].clears >= 1
    await subscriber.close()
    await engine.close()


@pytest.mark.parametrize("encoding", list(KVEncoding))
async def test_with_the_emulated_engines_publisher(
    ctx: zmq.asyncio.Context, encoding: KVEncoding
) -> None:
    """The engine's real publisher, joined late: history arrives through its replay socket."""
    publisher = KVEventPublisher("kv@test", encoding=encoding)
    await publisher.start()
    tokens = tokens_for(9, 4)
    hashes = [(0xABC0 + i) * 0x9E3779B97F4A7C15 & (2**64 - 1) for i in range(4)]
    publisher.publish(1.0, [engine_stored(hashes, tokens, 0, 2)])
    index = PrefixIndex()
    subscriber = KVEventSubscriber(index, ctx=ctx)
    assert publisher.replay_endpoint is not None
    subscriber.add(KVSource("e1", publisher.pub_endpoint, publisher.replay_endpoint))
    await until(lambda: subscriber.status()["e1"].state is LinkState.CONNECTED)
    keys = block_keys(tokens)
    while index.match(keys, ["e1"])["e1"] < 4:
        publisher.publish(2.0, [engine_stored(hashes, tokens, 2, 4)])  # until one arrives live
        await asyncio.sleep(0.02)
    publisher.publish(3.0, [EngineBlockRemoved(time_s=3.0, block_hashes=(hashes[1],))])
    await until(lambda: index.match(keys, ["e1"])["e1"] == 1)
    status = subscriber.status()["e1"]
    assert status.decode_errors == 0 and status.last_seq == publisher.next_seq - 1
    await subscriber.close()
    await publisher.close()


def engine_stored(hashes: list[int], tokens: list[int], first: int, last: int) -> EngineBlockStored:
    return EngineBlockStored(
        time_s=0.0,
        block_hashes=tuple(hashes[first:last]),
        parent_block_hash=hashes[first - 1] if first else None,
        token_ids=tuple(tokens[first * BS : last * BS]),
        block_size=BS,
    )
