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

- *Work after the embedding, in the same hop*: a caller may pass ``then``, a function of its
  vector (the semantic cache passes the nearest-neighbour scan of its tenant's index); it runs
  in the worker right after the batch's forward pass, so the event loop is not blocked by the
  scan and the caller wakes once, with both results. On a memo hit there is no hop at all:
  ``then`` runs inline.

One batch at a time, in one dedicated thread: the model already uses the core it runs on, and
a second concurrent forward would only fight it (and the event loop) for the other. A thread of
its own (not asyncio's shared default pool) keeps torch's and oneDNN's per-thread state warm,
and never waits behind other blocking work of the process.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from inferplane.cache.embedder import Embedder

Vector = npt.NDArray[np.float32]
R = TypeVar("R")
#: What a caller asks for: its text, the memo digest, its future and what to run after.
_Pending = tuple[
    str, bytes, "asyncio.Future[tuple[Vector, R | None]]", Callable[[Vector], R] | None
]


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


class EmbeddingBatcher(Generic[R]):
    """Async front of an :class:`Embedder`: LRU memo plus micro-batching in a worker thread.

    ``R``: what the callers' ``then`` functions return (the semantic cache: a scan hit).
    """

    def __init__(
        self,
        embedder: Embedder,
        memo_entries: int = 4096,
        max_batch: int = 32,
        window_s: float = 0.0,
        lead: bool = True,
    ) -> None:
        """``lead`` False sends every batch through a drain task, even a lone request's (the
        earlier design, one loop turn more; kept for ``bench/cache.py`` to compare)."""
        self.embedder = embedder
        self.lead = lead
        self.memo_entries = max(0, memo_entries)
        self.max_batch = max(1, max_batch)
        self.window_s = max(0.0, window_s)
        self.stats = BatcherStats()
        self._memo: OrderedDict[bytes, Vector] = OrderedDict()
        self._pending: list[_Pending[R]] = []
        self._worker: asyncio.Task[None] | None = None
        self._thread: ThreadPoolExecutor | None = None

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
        vector, _ = await self.embed_then(text, scope, None)
        return vector

    async def embed_then(
        self, text: str, scope: str, then: Callable[[Vector], R] | None
    ) -> tuple[Vector, R | None]:
        """:meth:`embed`, plus ``then(vector)`` run in the worker right after the forward pass
        (inline on a memo hit); None in its place when ``then`` is None. An exception raised
        by ``then`` reaches this caller only."""
        self.stats.requests += 1
        digest = text_digest(text, scope)
        vector = self._memo.get(digest)
        if vector is not None:
            self._memo.move_to_end(digest)
            self.stats.memo_hits += 1
            return vector, None if then is None else then(vector)
        future: asyncio.Future[tuple[Vector, R | None]] = asyncio.get_running_loop().create_future()
        self._pending.append((text, digest, future, then))
        if self._worker is None or self._worker.done():
            if self.window_s > 0 or not self.lead:
                self._worker = asyncio.create_task(self._drain())
            else:  # idle: this caller runs its batch itself (no task to hop through)
                await self._lead(future)
        return await future

    async def _lead(self, own: asyncio.Future[tuple[Vector, R | None]]) -> None:
        """Run the first pending batch in the caller's own task, then hand on the rest.

        One loop turn fewer than going through a drain task, which counts on a busy loop
        (every turn waits behind the other requests' callbacks).
        """
        self._worker = asyncio.current_task()
        batch = self._pending[: self.max_batch]
        del self._pending[: self.max_batch]
        try:
            await self._run(batch)
        except asyncio.CancelledError:  # the leader's caller left: the others still get theirs
            own.cancel()
            self._pending[:0] = [item for item in batch if not item[2].done()]
            raise
        finally:
            self._worker = None
            if self._pending:
                self._worker = asyncio.create_task(self._drain())

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

    def _executor(self) -> ThreadPoolExecutor:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding")
        return self._thread

    def _work(
        self, texts: list[str], thens: list[tuple[int, Callable[[Vector], R]]]
    ) -> tuple[Vector, list[R | BaseException]]:
        """In the worker: the batch's vectors, then each caller's ``then`` on its row."""
        matrix = np.asarray(self.embedder.embed(texts), dtype=np.float32)
        matrix.flags.writeable = False
        after: list[R | BaseException] = []
        for row, then in thens:
            try:
                after.append(then(matrix[row]))
            except Exception as exc:  # this caller's own failure
                after.append(exc)
        return matrix, after

    async def _run(self, batch: list[_Pending[R]]) -> None:
        texts = list(dict.fromkeys(text for text, _, _, _ in batch))  # one row per distinct text
        row_of = {text: row for row, text in enumerate(texts)}
        thens = [(row_of[text], then) for text, _, _, then in batch if then is not None]
        loop = asyncio.get_running_loop()
        try:
            matrix, after = await loop.run_in_executor(self._executor(), self._work, texts, thens)
        except Exception as exc:  # handed to every caller of this batch
            for _, _, future, _ in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        self.stats.batches += 1
        self.stats.batched_texts += len(texts)
        self.stats.largest_batch = max(self.stats.largest_batch, len(texts))
        results = iter(after)
        for text, digest, future, then in batch:
            row = matrix[row_of[text]]
            self._remember(digest, row)
            result = None if then is None else next(results)
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result((row, result))

    async def warm(self) -> None:
        """Load the model and run it once, in the worker thread (nothing is remembered)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor(), self.embedder.embed, ["warm up"])

    def close(self) -> None:
        """Let the worker thread go (a later call starts a new one)."""
        if self._thread is not None:
            self._thread.shutdown(wait=False)
            self._thread = None
