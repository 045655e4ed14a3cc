"""Decoding vLLM KV-event messages built by hand, exactly as REFERENCE §1 lays them out."""

from __future__ import annotations

import msgpack
import pytest

from inferplane.core.kv_events import (
    MASK_64,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventDecodeError,
    Layout,
    decode_batch,
    decode_message,
    decode_replay_frames,
    decode_seq,
    encode_batch,
    encode_seq,
    normalize_hash,
    replay_request_frames,
)

TOKENS = list(range(100, 132))  # two blocks of 16
HASH_BYTES = bytes(range(1, 33))  # a 32-byte (sha256-sized) engine hash
HASH_LOW64 = int.from_bytes(HASH_BYTES[-8:], "big")


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def stored_array(*, trailing: bool) -> list[object]:
    head: list[object] = ["BlockStored", [HASH_BYTES, 7], None, TOKENS, 16]
    if trailing:
        head += [None, "GPU", None, None, 0, "full_attention", None]
    return head


def test_array_batch_with_all_fields_and_bytes_and_int_hashes() -> None:
    payload = pack([1.5, [stored_array(trailing=True), ["BlockRemoved", [7], "GPU"]], 0])
    batch = decode_batch(payload)
    assert batch.ts == 1.5
    assert batch.data_parallel_rank == 0
    stored, removed = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == (HASH_LOW64, 7)
    assert stored.parent_block_hash is None
    assert stored.token_ids == tuple(TOKENS)
    assert stored.block_size == 16
    assert stored.medium == "GPU"
    assert stored.group_idx == 0
    assert stored.kv_cache_spec_kind == "full_attention"
    assert removed == BlockRemoved(block_hashes=(7,), medium="GPU")


def test_array_event_with_trailing_fields_missing() -> None:
    batch = decode_batch(pack([2.0, [stored_array(trailing=False), ["BlockRemoved", [5]]]]))
    stored, removed = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.medium is None and stored.lora_name is None and stored.group_idx is None
    assert removed == BlockRemoved(block_hashes=(5,))
    assert batch.data_parallel_rank is None  # the batch's third field was absent too


def test_map_encoding_matches_array_encoding() -> None:
    event = {
        "type": "BlockStored",
        "block_hashes": [HASH_BYTES, 7],
        "parent_block_hash": 9,
        "token_ids": TOKENS,
        "block_size": 16,
        "lora_id": None,
        "medium": "CPU",
        "lora_name": None,
        "some_future_field": [1, 2],
    }
    map_batch = decode_batch(
        pack({"ts": 3.0, "events": [event, {"type": "AllBlocksCleared"}], "data_parallel_rank": 1})
    )
    array_event = ["BlockStored", [HASH_BYTES, 7], 9, TOKENS, 16, None, "CPU", None]
    array_batch = decode_batch(pack([3.0, [array_event, ["AllBlocksCleared"]], 1]))
    assert map_batch == array_batch
    assert map_batch.events[0] == BlockStored(
        block_hashes=(HASH_LOW64, 7),
        parent_block_hash=9,
        token_ids=tuple(TOKENS),
        block_size=16,
        medium="CPU",
    )
    assert map_batch.events[1] == AllBlocksCleared()


def test_map_batch_in_array_batch_form_with_map_events() -> None:
    batch = decode_batch(pack([4.0, [{"type": "BlockRemoved", "block_hashes": [HASH_BYTES]}]]))
    assert batch.events == (BlockRemoved(block_hashes=(HASH_LOW64,)),)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\x01", 1),
        (bytes(8) + b"\x00\x00\x00\x00\x00\x00\x00\x2a", 42),
        ((1 << 64) + 5, 5),
        (-1, MASK_64),
        (123, 123),
    ],
)
def test_hash_normalisation(raw: bytes | int, expected: int) -> None:
    assert normalize_hash(raw) == expected


@pytest.mark.parametrize("raw", [b"", "abc", 1.5, None, True])
def test_bad_hash_rejected(raw: object) -> None:
    with pytest.raises(KVEventDecodeError):
        normalize_hash(raw)


def test_unknown_event_types_are_skipped_and_counted() -> None:
    payload = pack(
        [
            0.0,
            [["BlockPinned", [1]], {"type": "Telemetry", "x": 1}, ["AllBlocksCleared"]],
            None,
        ]
    )
    batch = decode_batch(payload)
    assert batch.events == (AllBlocksCleared(),)
    assert batch.num_unknown_events == 2


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # a reserved msgpack byte
        pack([0.0, [stored_array(trailing=False)]])[:-3],  # truncated
        pack("not a batch"),
        pack([0.0]),  # events missing
        pack(["yesterday", []]),  # ts not a number
        pack([0.0, {"a": 1}]),  # events not a list
        pack([0.0, [["BlockStored", [1], None, [1, 2]]]]),  # block_size missing
        pack([0.0, [["BlockStored", [1], None, "abc", 16]]]),  # token_ids not a list
        pack([0.0, [["BlockStored", [1], None, [1], 0]]]),  # block_size not positive
        pack([0.0, [["BlockRemoved", 5]]]),  # hashes not a list
        pack([0.0, [{"block_hashes": [1]}]]),  # map event without a type
        pack([0.0, [[]]]),  # empty event
        pack([0.0, [42]]),  # event is a scalar
        pack({"ts": 0.0}),  # map batch without events
        pack([0.0, [], "rank"]),  # rank not an int
    ],
)
def test_malformed_payloads_raise_decode_error(payload: bytes) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_batch(payload)


def test_message_frames_and_seq() -> None:
    payload = pack([1.0, [["AllBlocksCleared"]], 0])
    seq = (5).to_bytes(8, "big")
    message = decode_message([b"kv@10.0.0.1:8000@llama", seq, payload])
    assert message.topic == b"kv@10.0.0.1:8000@llama"
    assert message.seq == 5
    assert message.batch.events == (AllBlocksCleared(),)
    with pytest.raises(KVEventDecodeError):
        decode_message([seq, payload])
    with pytest.raises(KVEventDecodeError):
        decode_message([b"", b"\x00\x05", payload])


def test_replay_frames_follow_vllm() -> None:
    assert replay_request_frames(300) == [b"", (300).to_bytes(8, "big")]
    end = (-1).to_bytes(8, "big", signed=True)
    assert decode_replay_frames([b"", end, b""]) == (-1, b"")
    assert decode_replay_frames([(7).to_bytes(8, "big"), b"xy"]) == (7, b"xy")
    assert decode_seq(encode_seq(-1), signed=True) == -1
    assert decode_seq(encode_seq(2**63 + 1)) == 2**63 + 1
    with pytest.raises(KVEventDecodeError):
        decode_replay_frames([b"", b"x"])


@pytest.mark.parametrize("layout", list(Layout))
def test_encoder_round_trips_and_omits_trailing_defaults(layout: Layout) -> None:
    events = (
        BlockStored(
            block_hashes=(1, 2), parent_block_hash=None, token_ids=tuple(TOKENS), block_size=16
        ),
        BlockStored(
            block_hashes=(3,),
            parent_block_hash=2,
            token_ids=tuple(range(16)),
            block_size=16,
            medium="GPU",
            extra_keys=(None,),
            group_idx=1,
        ),
        BlockRemoved(block_hashes=(1,), medium="CPU"),
        AllBlocksCleared(),
    )
    payload = encode_batch(9.0, events, 2, layout)
    assert decode_batch(payload).events == events
    raw = msgpack.unpackb(payload, raw=False)
    first = raw[1][0] if layout is Layout.ARRAY else raw["events"][0]
    # lora_id, medium and lora_name have no default in vLLM: always sent; the rest omitted.
    assert len(first) == 8
