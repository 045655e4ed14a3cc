"""The embedding front of the semantic cache: memo (per tenant, bounded) and micro-batching."""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Sequence

import numpy as np
import pytest

from inferplane.cache.batcher import EmbeddingBatcher, text_digest

DIM = 8


def vector_of(text: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(text.encode()))
    v = rng.normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


class GatedEmbedder:
    """Records every batch; the first call can be held until the test releases it."""

    def __init__(self, hold_first: bool = False, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not hold_first:
            self.release.set()
        self.fail = fail

    @property
    def dim(self) -> int:
        return DIM

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        self.entered.set()
        assert self.release.wait(5.0)
        if self.fail:
            raise RuntimeError("model broke")
        return np.stack([vector_of(t) for t in texts])


async def wait_entered(model: GatedEmbedder) -> None:
    assert await asyncio.to_thread(model.entered.wait, 5.0)


async def test_requests_arriving_during_a_batch_share_the_next_one() -> None:
    model = GatedEmbedder(hold_first=True)
    batcher = EmbeddingBatcher(model)
    first = asyncio.create_task(batcher.embed("first"))
    await wait_entered(model)
    later = ["a", "b", "a", "c"]  # "a" twice: one row for both callers
    waiting = [asyncio.create_task(batcher.embed(t)) for t in later]
    await asyncio.sleep(0)
    model.release.set()
    results = await asyncio.gather(first, *waiting)
    assert model.calls == [["first"], ["a", "b", "c"]]
    for text, got in zip(["first", *later], results, strict=True):
        assert np.array_equal(got, vector_of(text))
    assert batcher.stats.batches == 2 and batcher.stats.largest_batch == 3


async def test_batches_never_exceed_max_batch() -> None:
    model = GatedEmbedder(hold_first=True)
    batcher = EmbeddingBatcher(model, max_batch=2, memo_entries=0)
    first = asyncio.create_task(batcher.embed("t0"))
    await wait_entered(model)
    rest = [asyncio.create_task(batcher.embed(f"t{i}")) for i in range(1, 6)]
    await asyncio.sleep(0)
    model.release.set()
    await asyncio.gather(first, *rest)
    assert [len(c) for c in model.calls] == [1, 2, 2, 1]


async def test_memo_skips_the_model_per_scope_and_is_bounded() -> None:
    model = GatedEmbedder()
    batcher = EmbeddingBatcher(model, memo_entries=2)
    v1 = await batcher.embed("hello", scope="acme")
    v2 = await batcher.embed("hello", scope="acme")
    assert v1 is v2 and len(model.calls) == 1 and batcher.stats.memo_hits == 1
    with pytest.raises(ValueError):
        v1[0] = 0.0  # shared with the memo: read-only
    await batcher.embed("hello", scope="globex")  # another tenant: its own memo entry
    assert len(model.calls) == 2
    await batcher.embed("other", scope="acme")  # evicts the least recent ("hello"/acme)
    await batcher.embed("hello", scope="acme")
    assert len(model.calls) == 4


def test_digest_separates_scope_from_text() -> None:
    assert text_digest("bc", "a") != text_digest("c", "ab")
    assert text_digest("x", "") != text_digest("x", "t")


async def test_a_model_error_reaches_every_caller_and_the_batcher_recovers() -> None:
    model = GatedEmbedder(hold_first=True, fail=True)
    batcher = EmbeddingBatcher(model)
    first = asyncio.create_task(batcher.embed("x"))
    await wait_entered(model)
    second = asyncio.create_task(batcher.embed("y"))
    await asyncio.sleep(0)
    model.release.set()
    results = await asyncio.gather(first, second, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    model.fail = False
    assert np.array_equal(await batcher.embed("y"), vector_of("y"))


async def test_a_cancelled_caller_does_not_disturb_the_others() -> None:
    model = GatedEmbedder(hold_first=True)
    batcher = EmbeddingBatcher(model)
    first = asyncio.create_task(batcher.embed("x"))
    await wait_entered(model)
    gone = asyncio.create_task(batcher.embed("gone"))
    kept = asyncio.create_task(batcher.embed("kept"))
    await asyncio.sleep(0)
    gone.cancel()
    model.release.set()
    assert np.array_equal(await kept, vector_of("kept"))
    assert np.array_equal(await first, vector_of("x"))
    assert gone.cancelled()
    assert ["kept"] in model.calls and all("gone" not in c for c in model.calls)


async def test_a_window_gathers_requests_before_the_first_batch() -> None:
    model = GatedEmbedder()
    batcher = EmbeddingBatcher(model, window_s=0.3)
    first = asyncio.create_task(batcher.embed("a"))
    for _ in range(3):  # a few loop turns: the first request waits for company, not running
        await asyncio.sleep(0)
    assert not model.calls
    second = asyncio.create_task(batcher.embed("b"))
    await asyncio.gather(first, second)
    assert model.calls == [["a", "b"]]


async def test_then_runs_in_the_worker_after_the_embedding_and_inline_on_a_memo_hit() -> None:
    model = GatedEmbedder()
    batcher: EmbeddingBatcher[tuple[str, float]] = EmbeddingBatcher(model)
    seen: list[np.ndarray] = []

    def then(vector: np.ndarray) -> tuple[str, float]:
        seen.append(vector)
        return threading.current_thread().name, float(vector[0])

    vector, after = await batcher.embed_then("q", "acme", then)
    assert np.array_equal(vector, vector_of("q")) and np.array_equal(seen[0], vector)
    assert after is not None and after[0].startswith("embedding") and after[1] == vector[0]
    again, after = await batcher.embed_then("q", "acme", then)  # memo: no hop, no model
    assert again is vector and len(model.calls) == 1
    assert after == (threading.current_thread().name, float(vector[0]))
    plain, nothing = await batcher.embed_then("r", "acme", None)
    assert nothing is None and np.array_equal(plain, vector_of("r"))
    batcher.close()


async def test_a_failing_then_reaches_only_its_caller() -> None:
    model = GatedEmbedder(hold_first=True)
    batcher: EmbeddingBatcher[float] = EmbeddingBatcher(model)
    first = asyncio.create_task(batcher.embed("first"))
    await wait_entered(model)

    def broken(_vector: np.ndarray) -> float:
        raise KeyError("scan broke")

    bad = asyncio.create_task(batcher.embed_then("a", "", broken))
    good = asyncio.create_task(batcher.embed_then("b", "", lambda v: float(v.sum())))
    await asyncio.sleep(0)
    model.release.set()
    await first
    with pytest.raises(KeyError):
        await bad
    vector, total = await good
    assert model.calls[1] == ["a", "b"] and total == pytest.approx(float(vector.sum()))
    assert np.array_equal(await batcher.embed("a"), vector_of("a"))  # its vector was kept


async def test_a_lone_request_runs_from_its_own_task_and_a_cancelled_leader_hands_on() -> None:
    model = GatedEmbedder(hold_first=True)
    batcher = EmbeddingBatcher(model)
    leader = asyncio.create_task(batcher.embed("lead"))
    await wait_entered(model)
    assert batcher._worker is leader  # no drain task: the caller's own task runs its batch
    follower = asyncio.create_task(batcher.embed("follow"))
    await asyncio.sleep(0)
    leader.cancel()
    await asyncio.sleep(0)
    model.release.set()
    assert np.array_equal(await follower, vector_of("follow"))
    assert leader.cancelled() and model.calls == [["lead"], ["follow"]]
    assert np.array_equal(await batcher.embed("after"), vector_of("after"))
