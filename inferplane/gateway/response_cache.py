"""The gateway's response caches: answer a call from cache, or keep its answer for next time.

One object per gateway. Before routing, :meth:`ResponseCache.lookup` applies the core's
policy (eligibility, tenant-bound key) and asks the backend (memory or Redis) for the exact
entry, then, where the route turns it on, embeds the last user turn and asks the per-tenant
semantic index. Every entry read is checked against the caller's tenant, model and key before
it is served, whatever the backend or the index returned. A hit is answered by
:meth:`ResponseCache.respond`: the stored JSON, or the stored SSE events replayed as a stream,
byte for byte as the engine's answer reached the first client (cost comment aside). After a
miss, the proxy's successful answer is stored: a JSON body whole (:meth:`store_json`), a stream
through a :class:`StreamCapture` the proxy feeds with every chunk it writes (:meth:`capture`,
:meth:`store_stream`). Responses say how they were served in ``X-Inferplane-Cache``
(``hit-exact``, ``hit-semantic``, ``miss``, ``bypass``) and, for a semantic hit, the cosine
similarity in ``X-Inferplane-Cache-Similarity``. Embedding runs in a worker thread,
concurrent requests batched and recent texts remembered (:mod:`inferplane.cache.batcher`); the
nearest-neighbour scan of the tenant's index runs in that same worker right after its
embedding (one hop, and the event loop never blocks on the scan), and its best row is turned
into a key back on the loop, re-checked if the index changed meanwhile
(:meth:`SemanticIndex.resolve`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from inferplane.cache.backend import CacheBackend, MemoryBackend
from inferplane.cache.batcher import EmbeddingBatcher
from inferplane.cache.embedder import Embedder, MiniLmEmbedder
from inferplane.core.cache import (
    CacheEntry,
    CacheLedger,
    CacheStatus,
    Hasher,
    PayloadKind,
    SemanticQuery,
    eligibility,
    entry_matches,
    exact_identity,
    semantic_query,
    sha256_hex,
)
from inferplane.core.cache_config import CacheBackendKind, CacheConfig
from inferplane.core.semantic_index import Neighbour, ScanHit, SemanticIndex, Vector
from inferplane.gateway.context import RequestContext

CACHE_HEADER = "X-Inferplane-Cache"
SIMILARITY_HEADER = "X-Inferplane-Cache-Similarity"
_DONE = b"data: [DONE]"
_FREE = ": inferplane cost_usd=0 cache=hit\n\n"


@dataclass(slots=True, init=False)
class CacheLookup:
    """The outcome of a lookup, and what to store after a miss (``key`` None: nothing)."""

    status: CacheStatus
    reason: str = ""
    key: str | None = None
    fingerprint: str = ""
    entry: CacheEntry | None = None
    similarity: float | None = None
    query: SemanticQuery | None = None
    vector: Vector | None = None
    tenant: str = ""
    model: str = ""
    ttl_s: float = 0.0

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        status: CacheStatus,
        reason: str = "",
        key: str | None = None,
        fingerprint: str = "",
        entry: CacheEntry | None = None,
        similarity: float | None = None,
        query: SemanticQuery | None = None,
        vector: Vector | None = None,
        tenant: str = "",
        model: str = "",
        ttl_s: float = 0.0,
    ) -> None:
        self.status = status
        self.reason = reason
        self.key = key
        self.fingerprint = fingerprint
        self.entry = entry
        self.similarity = similarity
        self.query = query
        self.vector = vector
        self.tenant = tenant
        self.model = model
        self.ttl_s = ttl_s

    @property
    def hit(self) -> bool:
        return self.entry is not None

    def headers(self) -> dict[str, str]:
        """The response headers that say how the call was served."""
        out: dict[str, str] = {CACHE_HEADER: self.status._value_}  # not the property
        if self.similarity is not None:
            out[SIMILARITY_HEADER] = f"{self.similarity:.4f}"
        return out


class StreamCapture:
    """Collects the SSE events a stream sent its client, to store them after a clean end.

    Fed the exact chunks the proxy writes; keeps ``data:`` events (comments dropped), stops at
    ``[DONE]``. A stream that carried an error event, grew past the size bound or never
    finished is not stored.
    """

    __slots__ = ("_buf", "_events", "_size", "done", "failed", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buf = b""
        self._events: list[bytes] = []
        self._size = 0
        self.done = False
        self.failed = False

    def feed(self, chunk: bytes) -> None:
        if self.done or self.failed:
            return
        parts = (self._buf + chunk).split(b"\n\n")
        self._buf = parts.pop()
        for event in parts:
            if event.startswith(_DONE):
                self.done = True
                return
            if not event.startswith(b"data:"):
                continue
            if event.startswith(b'data: {"error"') or event.startswith(b'data:{"error"'):
                self.failed = True
                return
            self._size += len(event) + 2
            if self._size > self.max_bytes:
                self.failed = True
                self._events.clear()
                return
            self._events.append(event)

    def payload(self) -> bytes | None:
        """The stream's events (``[DONE]`` included) when it finished cleanly, else None."""
        if not self.done or self.failed or not self._events:
            return None
        return b"\n\n".join([*self._events, _DONE]) + b"\n\n"


def build_backend(config: CacheConfig, clock: Callable[[], float]) -> CacheBackend:
    """The configured backend (Redis is imported only when asked for)."""
    if config.backend is CacheBackendKind.REDIS:
        from inferplane.cache.redis_backend import RedisBackend

        return RedisBackend(
            config.redis_url, config.namespace, config.max_entries, config.max_entry_bytes
        )
    return MemoryBackend(config.max_entries, config.max_bytes, config.max_entry_bytes, clock)


class ResponseCache:
    """Exact and semantic response caches for one gateway."""

    def __init__(
        self,
        config: CacheConfig,
        clock: Callable[[], float],
        backend: CacheBackend | None = None,
        embedder: Embedder | None = None,
        hasher: Hasher = sha256_hex,
        one_hop: bool = True,
    ) -> None:
        """``one_hop`` False is the earlier design, kept for ``bench/cache.py`` to compare:
        the embedding goes through the batcher's drain task and the index is scanned on the
        event loop once it returns."""
        self.config = config
        # ``config.route`` is a method of the (interpreted) pydantic model: its parts, once.
        self._routes, self._default_route = config.routes, config.default
        self.one_hop = one_hop
        self._clock = clock
        self.backend = backend if backend is not None else build_backend(config, clock)
        self._embedder = embedder
        self._batcher: EmbeddingBatcher[ScanHit | None] | None = None
        self._hasher = hasher
        self._index: SemanticIndex | None = None
        self.ledger = CacheLedger()

    # ---- semantic machinery (lazy) ---------------------------------------------------------

    def _semantic(self) -> tuple[EmbeddingBatcher[ScanHit | None], SemanticIndex]:
        if self._embedder is None:
            # One torch thread: on a busy gateway host, threaded inference fights the event
            # loop and other embeddings (measured 6x slower per sentence at 2 threads, 2 cores).
            precision = self.config.semantic_precision
            self._embedder = MiniLmEmbedder(num_threads=1, precision=precision)
        if self._batcher is None:
            self._batcher = EmbeddingBatcher(
                self._embedder,
                self.config.semantic_memo_entries,
                self.config.semantic_max_batch,
                self.config.semantic_batch_window_s,
                lead=self.one_hop,
            )
        if self._index is None:
            self._index = SemanticIndex(
                self._embedder.dim,
                self.config.semantic_max_entries_per_tenant,
                self.config.semantic_max_rows,
            )
        return self._batcher, self._index

    async def warm(self) -> None:
        """Load the embedding model now when some route uses semantic caching."""
        if self.config.any_semantic:
            batcher, _ = self._semantic()
            await batcher.warm()

    def semantic_index(self) -> SemanticIndex:
        """The per-tenant index of embedded questions (created on first use)."""
        return self._semantic()[1]

    def embedding_stats(self) -> dict[str, int]:
        """Memo hits and micro-batches of the embedding front (zeros before first use)."""
        if self._batcher is None:
            return {}
        s = self._batcher.stats
        return {"requests": s.requests, "memo_hits": s.memo_hits, "batches": s.batches,
                "batched_texts": s.batched_texts, "largest_batch": s.largest_batch}  # fmt: skip

    # ---- lookup ----------------------------------------------------------------------------

    async def lookup(
        self, ctx: RequestContext, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> CacheLookup:
        """Find a stored answer for this call, or say what to store once it is answered."""
        route = self._routes.get(ctx.model, self._default_route)  # ``config.route``
        allowed = eligibility(route, body, headers.get("Cache-Control"))
        if not allowed.write:
            self.ledger.on_lookup(CacheStatus.BYPASS, allowed.reason)
            return CacheLookup(CacheStatus.BYPASS, allowed.reason)
        key, fingerprint = exact_identity(ctx.tenant, ctx.model, ctx.path, body, self._hasher)
        found = CacheLookup(
            CacheStatus.MISS if allowed.read else CacheStatus.BYPASS,
            allowed.reason, key, fingerprint, tenant=ctx.tenant, model=ctx.model,
            ttl_s=route.ttl_s,
        )  # fmt: skip
        if allowed.read:
            entry = await self.backend.get(key)
            if entry is not None and entry_matches(entry, ctx.tenant, ctx.model, key, fingerprint):
                found.status, found.entry = CacheStatus.HIT_EXACT, entry
                return self._counted(found)
            if entry is not None:
                found.reason = "key_collision"  # another identity under this key: not served
        query, _ = semantic_query(route, ctx.tenant, ctx.model, ctx.path, body, self._hasher)
        if query is not None:
            found.query = query
            await self._semantic_lookup(found, allowed.read, route.semantic.threshold)
        return self._counted(found)

    async def _semantic_lookup(self, found: CacheLookup, read: bool, threshold: float) -> None:
        """Embed the turn and (when reading) find its nearest cached question."""
        assert found.query is not None
        batcher, index = self._semantic()
        view = index.view(found.tenant, found.query.context_hash) if read else None
        if view is None or not self.one_hop:
            found.vector = await batcher.embed(found.query.text, found.tenant)
            if read:
                near = index.nearest(
                    found.tenant, found.query.context_hash, found.vector, threshold
                )
                await self._serve_neighbour(found, near)
            return
        found.vector, hit = await batcher.embed_then(found.query.text, found.tenant, view.scan)
        await self._serve_neighbour(found, index.resolve(view, hit, found.vector, threshold))

    async def _serve_neighbour(self, found: CacheLookup, near: Neighbour | None) -> None:
        if near is None:
            return
        entry = await self.backend.get(near.key)
        if entry is not None and entry_matches(entry, found.tenant, found.model, near.key):
            found.status, found.entry = CacheStatus.HIT_SEMANTIC, entry
            found.similarity = near.similarity

    def _counted(self, found: CacheLookup) -> CacheLookup:
        self.ledger.on_lookup(found.status, "" if found.hit else found.reason)
        if found.entry is not None:
            self.ledger.on_hit(found.entry, found.status)
        return found

    # ---- answering a hit -------------------------------------------------------------------

    async def respond(
        self, request: web.Request, found: CacheLookup, request_id: str
    ) -> web.StreamResponse:
        """The client's response for a hit: stored JSON, or the stored stream replayed."""
        entry = found.entry
        if entry is None:
            raise ValueError("respond() needs a hit")
        headers = {**found.headers(), "X-Request-Id": request_id, "X-Inferplane-Cost-Usd": "0"}
        if entry.kind is PayloadKind.JSON:
            return web.Response(
                body=entry.payload, content_type="application/json", headers=headers
            )
        out = web.StreamResponse(
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await out.prepare(request)
        events = entry.payload
        if events.endswith(_DONE + b"\n\n"):
            events = events[: -len(_DONE) - 2] + _FREE.encode() + _DONE + b"\n\n"
        await out.write(events)
        await out.write_eof()
        return out

    # ---- storing after a miss --------------------------------------------------------------

    def capture(self, found: CacheLookup) -> StreamCapture | None:
        """A capture to feed with a stream's chunks, when the answer is to be stored."""
        return None if found.key is None else StreamCapture(self.config.max_entry_bytes)

    async def store_json(self, found: CacheLookup, raw: bytes, **cost: Any) -> bool:
        """Keep a successful non-streamed answer (``cost``: cost_usd, gpu_seconds, ...)."""
        return await self._store(found, PayloadKind.JSON, raw, **cost)

    async def store_stream(self, found: CacheLookup, capture: StreamCapture, **cost: Any) -> bool:
        """Keep a stream that ended cleanly."""
        payload = capture.payload()
        if payload is None:
            return False
        return await self._store(found, PayloadKind.SSE, payload, **cost)

    async def _store(
        self,
        found: CacheLookup,
        kind: PayloadKind,
        payload: bytes,
        cost_usd: float = 0.0,
        gpu_seconds: float = 0.0,
        completion_tokens: int = 0,
    ) -> bool:
        if found.key is None or found.hit or len(payload) > self.config.max_entry_bytes:
            return False
        now = self._clock()
        entry = CacheEntry(
            found.key, found.tenant, found.model, kind, payload, now, now + found.ttl_s,
            cost_usd, gpu_seconds, completion_tokens, found.fingerprint,
        )  # fmt: skip
        if not await self.backend.put(entry):
            return False
        self.ledger.stores += 1
        if found.query is not None and found.vector is not None:
            _, index = self._semantic()
            index.add(found.tenant, found.query.context_hash, found.vector, found.key)
        return True

    # ---- reporting -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Lookups by outcome, savings, backend and index sizes (for /v1/stats)."""
        saved = self.ledger.totals()
        return {
            "lookups": dict(self.ledger.lookups),
            "stores": self.ledger.stores,
            "hits_exact": saved.hits_exact,
            "hits_semantic": saved.hits_semantic,
            "bytes_served": saved.bytes_served,
            "cost_usd_saved": saved.cost_usd,
            "gpu_seconds_saved": saved.gpu_seconds,
            "completion_tokens_saved": saved.completion_tokens,
            "backend": self.backend.stats(),
            "semantic_rows": 0 if self._index is None else len(self._index),
        }

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.close()
        await self.backend.close()
