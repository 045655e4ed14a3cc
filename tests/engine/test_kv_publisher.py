"""KV-cache events over real ZMQ: framing, both encodings, cache agreement, replay."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from inferplane.core import kv_events as wire
from inferplane.engine.fleet import EngineHandle, EngineSpec
from inferplane.engine.kv_publisher import (
    END_SEQ,
    KVEncoding,
    KVEventPublisher,
    encode_event,
)
from inferplane.engine.types import AllBlocksCleared, BlockRemoved, BlockStored
from tests.engine.engine_helpers import MODEL, running_fleet


def test_event_field_order_matches_vllm() -> None:
    stored = BlockStored(0.0, (1, 2), None, tuple(range(32)), 16)
    array = encode_event(stored, KVEncoding.ARRAY)
    assert isinstance(array, list)
    assert array[:6] == ["BlockStored", [1, 2], None, list(range(32)), 16, None]
    assert array[6] == "GPU" and len(array) == 12
    mapped = encode_event(stored, KVEncoding.MAP)
    assert isinstance(mapped, dict)
    assert mapped["type"] == "BlockStored" and mapped["block_hashes"] == [1, 2]
    assert list(mapped)[1:5] == ["block_hashes", "parent_block_hash", "token_ids", "block_size"]
    removed = encode_event(BlockRemoved(0.0, (7,)), KVEncoding.ARRAY)
    assert removed == ["BlockRemoved", [7], "GPU", 0]
    assert encode_event(AllBlocksCleared(0.0), KVEncoding.MAP) == {"type": "AllBlocksCleared"}


def _apply(cache: set[int], events: list[Any]) -> None:
    for event in events:
        tag = event[0] if isinstance(event, list) else event["type"]
        hashes = event[1] if isinstance(event, list) else event.get("block_hashes")
        if tag == "BlockStored":
            cache.update(hashes)
        elif tag == "BlockRemoved":
            cache.difference_update(hashes)
        else:
            cache.clear()


async def _drive_requests(url: str, count: int) -> None:
    shared = " ".join(f"token{i}" for i in range(100))
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            messages = [{"role": "user", "content": f"{shared} question {i} " * (1 + i % 3)}]
            body = {"model": MODEL, "messages": messages, "max_tokens": 40, "ignore_eos": True}
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200


async def _subscribe(ctx: zmq.asyncio.Context, handle: EngineHandle) -> zmq.asyncio.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    endpoint = handle.kv_events_endpoint
    assert endpoint is not None
    sub.connect(endpoint)
    await asyncio.sleep(0.3)  # ZMQ's slow joiner: let the subscription reach the PUB socket
    return sub


async def _drain(sub: zmq.asyncio.Socket, into: list[list[bytes]], idle_s: float = 0.3) -> None:
    while await sub.poll(int(idle_s * 1000)):
        into.append(await sub.recv_multipart())


@pytest.mark.parametrize("encoding", [KVEncoding.ARRAY, KVEncoding.MAP])
async def test_events_arrive_in_order_and_rebuild_the_cache(encoding: KVEncoding) -> None:
    spec = EngineSpec(time_scale=0.05, kv_events=True, kv_encoding=encoding)
    with running_fleet(spec) as fleet:
        handle = fleet.engines[0]
        ctx = zmq.asyncio.Context()
        sub = await _subscribe(ctx, handle)
        messages: list[list[bytes]] = []
        try:
            await _drive_requests(handle.url, 6)
            await _drain(sub, messages)
        finally:
            sub.close(linger=0)
            ctx.term()
        assert messages and all(len(m) == 3 for m in messages)
        assert {m[0] for m in messages} == {handle.topic.encode()}
        seqs = [int.from_bytes(m[1], "big") for m in messages]
        assert seqs == list(range(len(messages)))
        cache: set[int] = set()
        for _, _, payload in messages:
            ts, events, rank = msgpack.unpackb(payload, strict_map_key=False)
            assert isinstance(ts, float) and rank is None and events
            assert all(
                isinstance(e, list if encoding is KVEncoding.ARRAY else dict) for e in events
            )
            _apply(cache, events)
            assert wire.decode_batch(payload).events  # the gateway's decoder reads it too
        expected = fleet.call(lambda: handle.server.model.cached_block_hashes())
        assert cache == set(expected) and cache


async def _replay(endpoint: str, start_seq: int) -> list[tuple[int, bytes]]:
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    out: list[tuple[int, bytes]] = []
    try:
        await dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
        while True:
            empty, seq, payload = await asyncio.wait_for(dealer.recv_multipart(), 5.0)
            assert empty == b""
            if seq == END_SEQ:
                assert payload == b""
                return out
            out.append((int.from_bytes(seq, "big"), payload))
    finally:
        dealer.close(linger=0)
        ctx.term()


async def test_replay_returns_buffered_batches_then_the_end_marker() -> None:
    with running_fleet(EngineSpec(time_scale=0.05, kv_events=True)) as fleet:
        handle = fleet.engines[0]
        ctx = zmq.asyncio.Context()
        sub = await _subscribe(ctx, handle)
        live: list[list[bytes]] = []
        try:
            await _drive_requests(handle.url, 3)
            await _drain(sub, live)
        finally:
            sub.close(linger=0)
            ctx.term()
        endpoint = handle.kv_replay_endpoint
        assert endpoint is not None
        everything = await _replay(endpoint, 0)
        assert everything == [(int.from_bytes(m[1], "big"), m[2]) for m in live]
        tail = await _replay(endpoint, 2)
        assert tail == everything[2:]
        assert await _replay(endpoint, 10**6) == []


async def test_restart_publishes_all_blocks_cleared() -> None:
    with running_fleet(EngineSpec(time_scale=0.005, kv_events=True)) as fleet:
        handle = fleet.engines[0]
        ctx = zmq.asyncio.Context()
        sub = await _subscribe(ctx, handle)
        messages: list[list[bytes]] = []
        try:
            await _drive_requests(handle.url, 1)
            async with aiohttp.ClientSession() as session:
                await session.post(handle.url + "/admin/faults", json={"restart": True})
            await _drain(sub, messages)
        finally:
            sub.close(linger=0)
            ctx.term()
        last_events = msgpack.unpackb(messages[-1][2])[1]
        assert last_events[-1] == ["AllBlocksCleared"]
        assert fleet.call(lambda: handle.server.model.cached_block_hashes()) == frozenset()


async def test_replay_buffer_is_bounded() -> None:
    publisher = KVEventPublisher("kv@test", buffer_batches=3)
    await publisher.start()
    try:
        for i in range(5):
            publisher.publish(float(i), [BlockRemoved(0.0, (i,))])
        assert publisher.replay_endpoint is not None
        replayed = await _replay(publisher.replay_endpoint, 0)
        assert [seq for seq, _ in replayed] == [2, 3, 4]
        assert publisher.publish(0.0, []) is None and publisher.next_seq == 5
    finally:
        await publisher.close()
