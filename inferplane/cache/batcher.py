"""Embedding requests from the event loop: remembered, coalesced, run in one worker thread.

The semantic cache embeds one user turn per request. Two things make that cheaper under load:

- *Memo*: a small LRU of recent vectors keyed by a digest of the tenant and the text (16
  bytes, however long the text; per tenant, so no timing tells one tenant what another
  asked). Agents and retries re-ask the same turn under another context (system
  prompt, sampling parameters) where the exact cache cannot help; those skip the model.
- *Micro-batching*: while one embedding runs in the worker thread, requests that arrive queue
  up and go through the model together as one batch when it finishes (one pass over the
  weights for all of them, instead of one each). A lone request is never delayed: with the
  default ``window_s`` of 0 it starts at once; a positive window waits that long for
  company first.

One batch at a time, in one thread: the model already uses the core it runs on, and a second
concurrent forward would only fight it (and the event loop) for the other.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from inferplane.cache.embedder import Embedder

Vector = npt.NDArray[np.float32]


def text_digest(text: str, scope: str = "") -> bytes:
    """16 bytes naming ``text`` within ``scope`` (a tenant: the memo is not shared across)."""
    digest = hashlib.blake2b(digest_size=16)
    scoped = scope.encode("utf-8", "surrogatepass")
    digest.update(len(scoped).to_bytes(8, "big") + scoped)
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.digest()


@dataclass(slots=True)
class BatcherStats:
    """Counters: requests, memo hits, model batches and the texts they carried."""

    requests: int = 0
    memo_hits: int = 0
    batches: int = 0
    batched_texts: int = 0
    largest_batch: int = 0


class EmbeddingBatcher:
    """Async front of an :class:`Embedder`: LRU memo plus micro-batching in a worker thread."""

    def __init__(
        self,
        embedder: Embedder,
        memo_entries: int = 4096,
        max_batch: int = 32,
        window_s: float = 0.0,
    ) -> None:
        self.embedder = embedder
        self.memo_entries = max(0, memo_entries)
        self.max_batch = max(1, max_batch)
        self.window_s = max(0.0, window_s)
        self.stats = BatcherStats()
        self._memo: OrderedDict[bytes, Vector] = OrderedDict()
        self._pending: list[tuple[str, bytes, asyncio.Future[Vector]]] = []
        self._worker: asyncio.Task[None] | None = None

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def _remember(self, digest: bytes, vector: Vector) -> None:
        if self.memo_entries == 0:
            return
        self._memo[digest] = vector
        self._memo.move_to_end(digest)
        while len(self._memo) > self.memo_entries:
            self._memo.popitem(last=False)

    async def embed(self, text: str, scope: str = "") -> Vector:
        """The unit vector of ``text`` (read-only). ``scope`` partitions the memo: the gateway
        passes the tenant, so one tenant's recent questions cannot even speed up another's."""
        self.stats.requests += 1
        digest = text_digest(text, scope)
        vector = self._memo.get(digest)
        if vector is not None:
            self._memo.move_to_end(digest)
            self.stats.memo_hits += 1
            return vector
        future: asyncio.Future[Vector] = asyncio.get_running_loop().create_future()
        self._pending.append((text, digest, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        if self.window_s > 0:
            await asyncio.sleep(self.window_s)
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            live = [item for item in batch if not item[2].done()]  # skip cancelled callers
            if not live:
                continue
            await self._run(live)

    async def _run(self, batch: list[tuple[str, bytes, asyncio.Future[Vector]]]) -> None:
        texts = list(dict.fromkeys(text for text, _, _ in batch))  # one row per distinct text
        try:
            matrix = await asyncio.to_thread(self.embedder.embed, texts)
        except Exception as exc:  # handed to every caller of this batch
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        self.stats.batches += 1
        self.stats.batched_texts += len(texts)
        self.stats.largest_batch = max(self.stats.largest_batch, len(texts))
        rows: dict[str, Vector] = {}
        for text, row in zip(texts, np.asarray(matrix, dtype=np.float32), strict=True):
            row.flags.writeable = False
            rows[text] = row
        for text, digest, future in batch:
            self._remember(digest, rows[text])
            if not future.done():
                future.set_result(rows[text])
