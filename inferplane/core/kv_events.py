"""vLLM KV-cache events: the wire format, decoded into typed values (pure, no I/O).

vLLM publishes prefix-cache changes over ZMQ PUB as 3-frame messages
``[topic, seq, payload]``: ``seq`` is an 8-byte big-endian counter from 0 and
``payload`` is msgpack of an event batch. The batch and its events come in two
encodings, because vLLM switched msgspec layouts between releases:

* array ("array_like"): batch ``[ts, events, dp_rank]``, event
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, ...]`` in field order;
* map: batch ``{"ts", "events", "data_parallel_rank"}``, event
  ``{"type": "BlockStored", "block_hashes": ..., ...}``.

Both omit trailing fields that hold their default, and newer releases append fields,
so fields past the required ones are optional and unknown extra fields are ignored.
A block hash is ``bytes`` (low 64 bits, big-endian) or an int; both become an unsigned
64-bit int here so the prefix index can key on one type. Unknown event types are
skipped and counted (a newer engine must not stop the gateway); structurally broken
payloads raise :class:`KVEventDecodeError` so the caller can count them and move on.

The replay protocol (vLLM's ROUTER socket) lives here as pure frame helpers too:
a request is ``[b"", start_seq]`` from a DEALER, each answer ``[b"", seq, payload]``,
and the end marker carries seq -1 (signed).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

MASK_64 = (1 << 64) - 1
#: The replay socket's end-of-stream marker: seq -1 as 8 signed big-endian bytes.
REPLAY_END_SEQ = -1
SEQ_NUM_BYTES = 8
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


class KVEventDecodeError(ValueError):
    """A ZMQ KV-event message that cannot be decoded (bad frames, msgpack or fields)."""


class Layout(enum.Enum):
    """How a batch and its events are laid out in msgpack (vLLM's two msgspec modes)."""

    ARRAY = "array"
    MAP = "map"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks entered an engine's prefix cache: one chain segment.

    ``token_ids`` holds ``block_size`` tokens per hash, in order; the first block's
    parent is ``parent_block_hash`` (None for a prompt's first block).
    """

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left an engine's cache on one medium (GPU when ``medium`` is None)."""

    block_hashes: tuple[int, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One decoded payload: the events in order, plus how many were of unknown type."""

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None
    num_unknown_events: int = 0


@dataclass(frozen=True, slots=True)
class KVMessage:
    """One decoded PUB message: ``[topic, seq, payload]``."""

    topic: bytes
    seq: int
    batch: EventBatch


# Field order of each event type in the array encoding (after the type tag), with the
# number of leading fields that must be present.
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
_STORED_REQUIRED = 4
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_REMOVED_REQUIRED = 1
_BATCH_FIELDS = ("ts", "events", "data_parallel_rank")
_TAG_KEY = "type"


def normalize_hash(value: object) -> int:
    """An engine block hash as an unsigned 64-bit int (bytes: low 64 bits, big-endian)."""
    if isinstance(value, bytes | bytearray):
        if not value:
            raise KVEventDecodeError("empty block hash")
        return int.from_bytes(value, "big") & MASK_64
    if isinstance(value, int) and not isinstance(value, bool):
        return value & MASK_64
    raise KVEventDecodeError(f"block hash must be bytes or int, got {type(value).__name__}")


def decode_seq(frame: bytes, *, signed: bool = False) -> int:
    """An 8-byte big-endian sequence number (signed for replay answers, where -1 ends)."""
    if len(frame) != SEQ_NUM_BYTES:
        raise KVEventDecodeError(f"seq frame must be {SEQ_NUM_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=signed)


def encode_seq(seq: int) -> bytes:
    """The 8-byte big-endian frame for ``seq`` (-1 encodes as the replay end marker)."""
    return seq.to_bytes(SEQ_NUM_BYTES, "big", signed=seq < 0)


def decode_message(frames: Sequence[bytes]) -> KVMessage:
    """Decode one PUB message ``[topic, seq, payload]``."""
    if len(frames) != 3:
        raise KVEventDecodeError(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    topic, seq_frame, payload = frames
    return KVMessage(topic=bytes(topic), seq=decode_seq(seq_frame), batch=decode_batch(payload))


def decode_replay_frames(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """One replay answer as a DEALER reads it: ``[b"", seq, payload]`` -> (seq, payload).

    The leading empty delimiter is optional (a REQ socket strips it).
    """
    parts = list(frames)
    if len(parts) == 3 and not parts[0]:
        parts = parts[1:]
    if len(parts) != 2:
        raise KVEventDecodeError(f"expected replay frames [seq, payload], got {len(frames)}")
    return decode_seq(parts[0], signed=True), bytes(parts[1])


def replay_request_frames(start_seq: int) -> list[bytes]:
    """What a DEALER sends to vLLM's replay ROUTER to get every batch from ``start_seq``."""
    return [b"", encode_seq(start_seq)]


def decode_batch(payload: bytes) -> EventBatch:
    """Decode a msgpack event batch in either encoding."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as exc:
        raise KVEventDecodeError(f"payload is not valid msgpack: {exc}") from exc
    except Exception as exc:  # msgpack raises a few bare exception types on odd input
        raise KVEventDecodeError(f"payload is not valid msgpack: {exc!r}") from exc
    fields = _fields(raw, _BATCH_FIELDS, required=2, what="event batch")
    ts = fields["ts"]
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise KVEventDecodeError("event batch ts must be a number")
    events_raw = fields["events"]
    if not isinstance(events_raw, list):
        raise KVEventDecodeError("event batch events must be a list")
    rank = _opt_int(fields.get("data_parallel_rank"), "data_parallel_rank")
    events: list[KVEvent] = []
    num_unknown = 0
    for raw_event in events_raw:
        event = _decode_event(raw_event)
        if event is None:
            num_unknown += 1
        else:
            events.append(event)
    return EventBatch(
        ts=float(ts), events=tuple(events), data_parallel_rank=rank, num_unknown_events=num_unknown
    )


def _decode_event(raw: object) -> KVEvent | None:
    """One tagged event, or None when its type is unknown."""
    body: object
    if isinstance(raw, list) and raw:
        tag, body = raw[0], raw[1:]
    elif isinstance(raw, dict):
        tag, body = raw.get(_TAG_KEY), raw
    else:
        raise KVEventDecodeError("an event must be a non-empty array or a map")
    if tag == "BlockStored":
        return _decode_stored(_fields(body, _STORED_FIELDS, _STORED_REQUIRED, "BlockStored"))
    if tag == "BlockRemoved":
        fields = _fields(body, _REMOVED_FIELDS, _REMOVED_REQUIRED, "BlockRemoved")
        return BlockRemoved(
            block_hashes=_hashes(fields["block_hashes"]),
            medium=_opt_str(fields.get("medium"), "medium"),
            group_idx=_opt_int(fields.get("group_idx"), "group_idx"),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if isinstance(tag, str | bytes):
        return None
    raise KVEventDecodeError("an event's type tag must be a string")


def _decode_stored(fields: Mapping[str, Any]) -> BlockStored:
    hashes = _hashes(fields["block_hashes"])
    parent_raw = fields["parent_block_hash"]
    parent = None if parent_raw is None else normalize_hash(parent_raw)
    tokens = fields["token_ids"]
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise KVEventDecodeError("BlockStored token_ids must be a list of ints")
    block_size = fields["block_size"]
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise KVEventDecodeError("BlockStored block_size must be a positive int")
    extra = fields.get("extra_keys")
    if extra is not None and not isinstance(extra, list):
        raise KVEventDecodeError("BlockStored extra_keys must be a list or nil")
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tuple(tokens),
        block_size=block_size,
        lora_id=_opt_int(fields.get("lora_id"), "lora_id"),
        medium=_opt_str(fields.get("medium"), "medium"),
        lora_name=_opt_str(fields.get("lora_name"), "lora_name"),
        extra_keys=None if extra is None else tuple(_freeze(e) for e in extra),
        group_idx=_opt_int(fields.get("group_idx"), "group_idx"),
        kv_cache_spec_kind=_opt_str(fields.get("kv_cache_spec_kind"), "kv_cache_spec_kind"),
        kv_cache_spec_sliding_window=_opt_int(
            fields.get("kv_cache_spec_sliding_window"), "kv_cache_spec_sliding_window"
        ),
    )


def _fields(body: object, names: Sequence[str], required: int, what: str) -> dict[str, Any]:
    """Named fields from an array (positional) or a map body; trailing ones optional."""
    if isinstance(body, list):
        if len(body) < required:
            raise KVEventDecodeError(f"{what} needs {required} fields, got {len(body)}")
        return dict(zip(names, body, strict=False))
    if isinstance(body, dict):
        missing = [n for n in names[:required] if n not in body]
        if missing:
            raise KVEventDecodeError(f"{what} is missing {', '.join(missing)}")
        return {n: body[n] for n in names if n in body}
    raise KVEventDecodeError(f"{what} must be an array or a map")


def _hashes(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise KVEventDecodeError("block_hashes must be a list")
    return tuple(normalize_hash(h) for h in value)


def _opt_int(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise KVEventDecodeError(f"{name} must be an int or nil")


def _opt_str(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise KVEventDecodeError(f"{name} must be a string or nil")


def _freeze(value: object) -> Any:
    """Lists inside extra_keys as tuples, so events stay hashable values."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def encode_event(event: KVEvent, layout: Layout = Layout.ARRAY) -> Any:
    """An event as vLLM lays it out before msgpack (trailing defaults omitted)."""
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"] if layout is Layout.ARRAY else {_TAG_KEY: "AllBlocksCleared"}
    names: tuple[str, ...]
    if isinstance(event, BlockStored):
        names, required, tag = _STORED_FIELDS, _STORED_REQUIRED, "BlockStored"
    else:
        names, required, tag = _REMOVED_FIELDS, _REMOVED_REQUIRED, "BlockRemoved"
    values = [_wire_value(getattr(event, n)) for n in names]
    # vLLM's msgspec structs give defaults to the trailing fields only; drop those at None.
    keep = len(values)
    while keep > max(required, _num_without_default(tag)) and values[keep - 1] is None:
        keep -= 1
    if layout is Layout.ARRAY:
        return [tag, *values[:keep]]
    return {_TAG_KEY: tag, **dict(zip(names[:keep], values[:keep], strict=True))}


def _num_without_default(tag: str) -> int:
    # BlockStored: up to lora_name (7 fields) have no default; BlockRemoved: 2.
    return 7 if tag == "BlockStored" else 2


def _wire_value(value: object) -> object:
    if isinstance(value, tuple):
        return [_wire_value(v) for v in value]
    return value


def encode_batch(
    ts: float,
    events: Sequence[KVEvent],
    data_parallel_rank: int | None = 0,
    layout: Layout = Layout.ARRAY,
) -> bytes:
    """Msgpack payload of one event batch, as vLLM's publisher would send it."""
    wire_events = [encode_event(e, layout) for e in events]
    body: Any
    if layout is Layout.ARRAY:
        body = [ts, wire_events, data_parallel_rank]
    else:
        body = {"ts": ts, "events": wire_events, "data_parallel_rank": data_parallel_rank}
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed
