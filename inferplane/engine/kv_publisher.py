"""vLLM-compatible KV-cache events over ZMQ: a PUB socket and a replay ROUTER socket.

Wire format (REFERENCE §1, vLLM's ``ZmqEventPublisher``):

* every message on the PUB socket has three frames ``[topic, seq, payload]``; ``seq`` is
  an 8-byte big-endian counter starting at 0; ``payload`` is msgpack of an EventBatch
  ``[ts, events, data_parallel_rank]`` (``ts`` in epoch seconds, rank ``None``);
* an event is either an array ``["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx,
  kv_cache_spec_kind, kv_cache_spec_sliding_window]`` (older vLLM, ``array`` encoding)
  or a map ``{"type": "BlockStored", "block_hashes": ..., ...}`` (newer vLLM, ``map``);
  ``BlockRemoved`` carries ``block_hashes, medium, group_idx``; ``AllBlocksCleared``
  nothing. Hashes are unsigned 64-bit integers; the medium is ``"GPU"``;
* replay: a client sends ``[identity, b"", start_seq]`` (8 bytes big-endian) to the
  ROUTER socket (a REQ or DEALER socket does that) and receives, for each buffered batch
  with ``seq >= start_seq``, ``[identity, b"", seq, payload]``, then an end marker
  ``[identity, b"", (-1 as 8 signed bytes), b""]``. The buffer is bounded.

The engine publishes the KV events of one engine step as one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from inferplane.engine.types import BlockRemoved, BlockStored, KVEvent

MEDIUM_GPU = "GPU"
KV_CACHE_SPEC_KIND = "full_attention"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
DEFAULT_BUFFER_BATCHES = 10_000
_HASH_MASK = (1 << 64) - 1


class KVEncoding(enum.Enum):
    """How events are laid out inside a batch: vLLM's array_like structs or maps."""

    ARRAY = "array"
    MAP = "map"


def encode_event(event: KVEvent, encoding: KVEncoding) -> list[Any] | dict[str, Any]:
    """One event as vLLM lays it out (see the module docstring for the field order)."""
    if isinstance(event, BlockStored):
        parent = None if event.parent_block_hash is None else event.parent_block_hash & _HASH_MASK
        fields: list[tuple[str, Any]] = [
            ("block_hashes", [h & _HASH_MASK for h in event.block_hashes]),
            ("parent_block_hash", parent),
            ("token_ids", list(event.token_ids)),
            ("block_size", event.block_size),
            ("lora_id", None),
            ("medium", MEDIUM_GPU),
            ("lora_name", None),
            ("extra_keys", None),
            ("group_idx", 0),
            ("kv_cache_spec_kind", KV_CACHE_SPEC_KIND),
            ("kv_cache_spec_sliding_window", None),
        ]
        tag = "BlockStored"
    elif isinstance(event, BlockRemoved):
        fields = [
            ("block_hashes", [h & _HASH_MASK for h in event.block_hashes]),
            ("medium", MEDIUM_GPU),
            ("group_idx", 0),
        ]
        tag = "BlockRemoved"
    else:
        fields = []
        tag = "AllBlocksCleared"
    if encoding is KVEncoding.ARRAY:
        return [tag, *(value for _, value in fields)]
    return {"type": tag, **dict(fields)}


def encode_batch(
    ts: float,
    events: Sequence[KVEvent],
    encoding: KVEncoding,
    data_parallel_rank: int | None = None,
) -> bytes:
    """msgpack bytes of an EventBatch ``[ts, events, data_parallel_rank]``."""
    body = [ts, [encode_event(e, encoding) for e in events], data_parallel_rank]
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def decode_batch(payload: bytes) -> tuple[float, list[Any], int | None]:
    """Inverse of ``encode_batch`` up to encoding (tests and debugging tools)."""
    ts, events, rank = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    return float(ts), list(events), rank


class KVEventPublisher:
    """Publishes event batches on a PUB socket and serves replays from a bounded buffer.

    Use from one asyncio loop: ``await start()``, ``publish(ts, events)`` (never blocks:
    a slow subscriber loses messages at the high-water mark, as with vLLM), ``await
    close()``. Port 0 binds a free port; the bound ports are in ``pub_port`` and
    ``replay_port`` (``None`` when replay is off).
    """

    def __init__(
        self,
        topic: str,
        *,
        host: str = "127.0.0.1",
        pub_port: int = 0,
        replay_port: int | None = 0,
        encoding: KVEncoding = KVEncoding.ARRAY,
        buffer_batches: int = DEFAULT_BUFFER_BATCHES,
    ) -> None:
        self.topic = topic
        self.encoding = encoding
        self._topic_bytes = topic.encode()
        self._host = host
        self._want_pub_port = pub_port
        self._want_replay_port = replay_port
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_batches)
        self._next_seq = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._sync_ctx: zmq.Context[Any] | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.pub_port = 0
        self.replay_port: int | None = None

    @property
    def pub_endpoint(self) -> str:
        return f"tcp://{self._host}:{self.pub_port}"

    @property
    def replay_endpoint(self) -> str | None:
        return None if self.replay_port is None else f"tcp://{self._host}:{self.replay_port}"

    @property
    def next_seq(self) -> int:
        return self._next_seq

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        # The PUB socket is a plain one: sends never wait (NOBLOCK) and so need no
        # asyncio wrapper (and none of its per-send futures).
        self._sync_ctx = zmq.Context()
        self._pub = self._sync_ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self.pub_port = _bind(self._pub, self._host, self._want_pub_port)
        if self._want_replay_port is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self.replay_port = _bind(self._replay, self._host, self._want_replay_port)
            self._replay_task = asyncio.create_task(self._serve_replay())

    def publish(self, ts: float, events: Sequence[KVEvent]) -> int | None:
        """Send one batch; returns its seq (None when there was nothing to send)."""
        if not events or self._pub is None:
            return None
        seq = self._next_seq
        self._next_seq += 1
        payload = encode_batch(ts, events, self.encoding)
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.ZMQError):
            self._pub.send_multipart(
                (self._topic_bytes, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK
            )
        return seq

    async def _serve_replay(self) -> None:
        sock = self._replay
        assert sock is not None
        while True:
            try:
                frames = await sock.recv_multipart()
            except (asyncio.CancelledError, zmq.ZMQError):
                return
            if len(frames) != 3 or len(frames[2]) != 8:
                continue  # malformed request: ignore it, as vLLM does
            identity, start_seq = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await sock.send_multipart((identity, b"", seq.to_bytes(8, "big"), payload))
            await sock.send_multipart((identity, b"", END_SEQ, b""))

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
            self._replay_task = None
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        for ctx in (self._ctx, self._sync_ctx):
            if ctx is not None:
                ctx.term()
        self._ctx = self._sync_ctx = None


def _bind(sock: zmq.Socket[Any], host: str, port: int) -> int:
    if port == 0:
        bound: int = sock.bind_to_random_port(f"tcp://{host}")
        return bound
    sock.bind(f"tcp://{host}:{port}")
    return port
