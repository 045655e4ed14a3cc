"""The prefix index: which endpoint holds which leading KV blocks of a prompt (pure).

One interface, two sources. Precise: decoded vLLM KV events
(:mod:`inferplane.core.kv_events`) per endpoint. Engines seed their block hashes per
process, so the index keys blocks by its *own* chained hash of token ids
(:func:`block_keys`) and keeps per endpoint a map engine hash -> own key, to apply a
``BlockRemoved`` and to find a child's parent. Speculative / approximate:
:meth:`PrefixIndex.record_route` inserts what the gateway just routed; with events it
lives a short TTL (a burst of siblings co-locates before the events arrive) unless a
``BlockStored`` confirms it; without events it is all there is, kept longer, LRU-bound.

:meth:`PrefixIndex.match` gives per endpoint the longest run of leading blocks present;
:meth:`PrefixIndex.kv_claims` the KV memory its recent sessions claim (every routed prompt
feeds :class:`~inferplane.core.kv_claims.KVClaims`);
:meth:`PrefixIndex.weighted_match` counts a block held only in CPU memory ``cpu_weight``.
Memory is bounded by ``max_entries`` (endpoint, block) entries (evicting the least
recently stored or routed entries of the endpoint holding the most, in batches) and
``max_engine_hashes`` (past it, the endpoint that overflowed is cleared). Pure: ``now``
is passed in; no clock, no I/O; not thread-safe (one event loop owns it).

Own keys are Python's tuple hash of ``(parent key, block token ids)``: 64-bit, the same in
every process for ints, ~15 us per 1K tokens. Not cryptographic: a crafted collision
can only mislead routing (a cache miss), never change an answer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import accumulate, repeat
from operator import and_

from inferplane.core.kv_claims import KVClaims
from inferplane.core.kv_events import AllBlocksCleared, BlockStored, KVEvent
from inferplane.core.prefix_blocks import (
    BYTES_PER_ENGINE_HASH,
    BYTES_PER_ENTRY,
    BYTES_PER_GUESS,
    BYTES_PER_KEY,
    CPU,
    GPU,
    GUESS,
    EndpointIndexStats,
    IndexSource,
    IndexStats,
    PrefixIndexConfig,
    block_keys,
    root_key,
)
from inferplane.core.prefix_blocks import run_length as _run_length
from inferplane.core.prefix_blocks import tier_of as _tier
from inferplane.core.prefix_entries import Endpoint, EntryBook

__all__ = [
    "BYTES_PER_ENGINE_HASH",
    "BYTES_PER_ENTRY",
    "BYTES_PER_GUESS",
    "BYTES_PER_KEY",
    "CPU",
    "GPU",
    "GUESS",
    "EndpointIndexStats",
    "IndexSource",
    "IndexStats",
    "PrefixIndex",
    "PrefixIndexConfig",
    "block_keys",
    "root_key",
]

_TIERS = GPU | CPU
_MATCH_CHUNK = 8  # first chunk of keys matched; each next one doubles


class PrefixIndex(EntryBook):
    """Blocks per endpoint, keyed by own chained hashes; see the module docstring."""

    def __init__(self, config: PrefixIndexConfig | None = None) -> None:
        self.config = config or PrefixIndexConfig()
        self._endpoints: dict[str, Endpoint] = {}
        # key -> bit mask of endpoints holding it. A key's first holder stores its endpoint's
        # own ``bit`` object, not a new int equal to it: at 1,000 endpoints a mask is a
        # ~90-byte int, and one per key was ~2 GiB of a simulated fleet with full caches.
        self._holders: dict[int, int] = {}
        self._free_bits: list[int] = []
        self._num_approximate = 0  # endpoints whose entries expire by age (expire() scans)
        self._num_entries = 0
        self._num_engine_hashes = 0
        self._speculative: deque[tuple[float, str, Sequence[int]]] = deque()
        self._evictions = 0
        self._expirations = 0
        self.claims = KVClaims(self.config.claim_half_life_s)

    # -- membership ---------------------------------------------------------------

    def add_endpoint(self, name: str, source: IndexSource) -> None:
        """Register an endpoint (or change its source, which drops its guesses)."""
        ep = self._endpoints.get(name)
        if ep is None:
            if not self._free_bits:
                self._free_bits.append(1 << len(self._endpoints))
            bit = self._free_bits.pop()
            self._endpoints[name] = Endpoint(name=name, bit=bit, source=source)
            self._num_approximate += source is IndexSource.APPROXIMATE
        elif ep.source is not source:
            self.clear_endpoint(name)
            self._num_approximate += 1 if source is IndexSource.APPROXIMATE else -1
            ep.source = source

    def remove_endpoint(self, name: str) -> None:
        """Forget an endpoint entirely (it left the fleet)."""
        if name in self._endpoints:
            self.clear_endpoint(name)
            ep = self._endpoints.pop(name)
            self.claims.forget(name)
            self._num_approximate -= ep.source is IndexSource.APPROXIMATE
            self._free_bits.append(ep.bit)

    def clear_endpoint(self, name: str) -> None:
        """Drop everything known about an endpoint's cache (restart, lost events)."""
        ep = self._endpoints.get(name)
        if ep is None:
            return
        for key in ep.entries:
            self._unhold(key, ep.bit)
        self._num_entries -= len(ep.entries)
        self._num_engine_hashes -= len(ep.engine)
        ep.entries.clear()
        ep.engine.clear()
        ep.tiers.clear()
        ep.expiry.clear()
        ep.counts["clears"] += 1

    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    def is_held(self, key: int) -> bool:
        """Whether any endpoint holds block ``key`` (any tier, or guessed)."""
        return key in self._holders

    def holders(self, key: int) -> list[str]:
        """The endpoints holding block ``key`` (any tier, or guessed), in registration order."""
        mask = self._holders.get(key, 0)
        return [n for n, ep in self._endpoints.items() if ep.bit & mask] if mask else []

    # -- precise source -------------------------------------------------------------

    def apply_events(self, endpoint: str, events: Iterable[KVEvent], now: float) -> None:
        """Apply one engine's decoded events, in order."""
        self.expire(now)
        self.add_endpoint(endpoint, IndexSource.PRECISE)
        ep = self._endpoints[endpoint]
        for event in events:
            ep.counts["events_applied"] += 1
            if isinstance(event, BlockStored):
                self._apply_stored(ep, event)
            elif isinstance(event, AllBlocksCleared):
                self.clear_endpoint(endpoint)
            elif event.group_idx:
                ep.counts["skipped_events"] += 1
            else:
                self._apply_removed(ep, event.block_hashes, _tier(event.medium))
            if self._num_engine_hashes > self.config.max_engine_hashes:
                self.clear_endpoint(endpoint)

    def _apply_stored(self, ep: Endpoint, event: BlockStored) -> None:
        size = self.config.block_size
        if (
            event.block_size != size
            or event.group_idx
            or len(event.token_ids) != size * len(event.block_hashes)
            or (event.extra_keys is not None and any(e is not None for e in event.extra_keys))
        ):
            ep.counts["skipped_events"] += 1
            return
        if event.parent_block_hash is None:
            parent = 0 if event.lora_name is None else root_key(event.lora_name)
        else:
            found = ep.engine.get(event.parent_block_hash)
            if found is None:
                ep.counts["orphan_blocks"] += len(event.block_hashes)
                return
            parent = found
        tier = GPU if event.medium is None else _tier(event.medium)
        keys = block_keys(event.token_ids, size, parent)
        if tier != GPU or ep.tiers:
            self._store_tiered(ep, event.block_hashes, keys, tier)
        else:  # the common case, inlined: GPU blocks, no CPU tier known on the endpoint
            engine, entries, expiry, holders = ep.engine, ep.entries, ep.expiry, self._holders
            bit, touch, known = ep.bit, entries.move_to_end, len(engine)
            num, limit = self._num_entries, self.config.max_entries
            for engine_hash, key in zip(event.block_hashes, keys, strict=True):
                engine[engine_hash] = key  # only ever adds here: new hashes = growth
                if expiry:
                    expiry.pop(key, None)
                old = entries.get(key)
                if old is None:
                    entries[key] = GPU
                    mask = holders.get(key)
                    holders[key] = bit if mask is None else mask | bit
                    num += 1
                    if num > limit:
                        self._num_entries = num
                        self._evict()
                        num = self._num_entries
                else:
                    entries[key] = (old & ~GUESS) | GPU
                    touch(key)
            self._num_entries = num
            self._num_engine_hashes += len(engine) - known
        ep.counts["blocks_stored"] += len(keys)

    def _store_tiered(
        self, ep: Endpoint, hashes: Sequence[int], keys: list[int], tier: int
    ) -> None:
        for engine_hash, key in zip(hashes, keys, strict=True):
            old = ep.engine.get(engine_hash)
            if old is None:
                self._num_engine_hashes += 1
            tiers = tier | (ep.tiers.get(engine_hash, GPU) if old == key else 0)
            ep.engine[engine_hash] = key
            if tiers == GPU:
                ep.tiers.pop(engine_hash, None)
            else:
                ep.tiers[engine_hash] = tiers
            ep.expiry.pop(key, None)
            self._set(ep, key, tier, clear=GUESS)

    def _apply_removed(self, ep: Endpoint, hashes: Sequence[int], tier: int) -> None:
        for engine_hash in hashes:
            key = ep.engine.get(engine_hash)
            if key is None:
                continue
            tiers = ep.tiers.get(engine_hash, GPU) & ~tier
            if tiers == GPU:
                ep.tiers.pop(engine_hash, None)
            elif tiers:
                ep.tiers[engine_hash] = tiers
            else:
                del ep.engine[engine_hash]
                ep.tiers.pop(engine_hash, None)
                self._num_engine_hashes -= 1
            self._unset(ep, key, tier)
            ep.counts["blocks_removed"] += 1

    # -- speculative and approximate source -------------------------------------------

    def record_route(self, endpoint: str, keys: Sequence[int], now: float) -> None:
        """The gateway sent a prompt with these block keys to ``endpoint``.

        Unknown endpoints are registered as approximate. ``keys`` is kept until its TTL
        passes, so the caller must not mutate it afterwards.
        """
        self.expire(now)
        if endpoint not in self._endpoints:
            self.add_endpoint(endpoint, IndexSource.APPROXIMATE)
        ep = self._endpoints[endpoint]
        precise = ep.source is IndexSource.PRECISE
        expires_at = now + (
            self.config.speculative_ttl_s if precise else self.config.approximate_ttl_s
        )
        entries, expiry, touch = ep.entries, ep.expiry, ep.entries.move_to_end
        holders, bit, get = self._holders, ep.bit, entries.get
        num, limit = self._num_entries, self.config.max_entries
        for key in keys:  # ``_set(ep, key, GUESS)`` inlined for a new entry
            flags = get(key)
            if flags is None:
                expiry[key] = expires_at
                entries[key] = GUESS
                mask = holders.get(key)
                holders[key] = bit if mask is None else mask | bit
                num += 1
                if num > limit:
                    self._num_entries = num
                    self._evict()
                    num = self._num_entries
                continue
            touch(key)
            if not flags & GPU:  # confirmed in GPU memory needs no guess
                entries[key] = flags | GUESS
                expiry[key] = expires_at
        self._num_entries = num
        if precise:
            self._speculative.append((expires_at, endpoint, keys))
        self.claims.touch(endpoint, keys, now)

    def expire(self, now: float) -> int:
        """Drop guesses whose TTL has passed; returns how many entries went."""
        before = self._num_entries
        queue = self._speculative
        while queue and queue[0][0] <= now:
            expires_at, name, keys = queue.popleft()
            ep = self._endpoints.get(name)
            if ep is not None:
                self._expire_guesses(ep, keys, expires_at)
        for ep in self._endpoints.values() if self._num_approximate else ():
            if ep.source is IndexSource.APPROXIMATE:
                self._expire_oldest(ep, now)
        gone = before - self._num_entries
        self._expirations += gone
        return gone

    def _expire_guesses(self, ep: Endpoint, keys: Sequence[int], expires_at: float) -> None:
        """Unset the guesses of one routed prompt that no later guess renewed."""
        expiry, entries, get = ep.expiry, ep.entries, ep.expiry.get
        for key in keys:
            if get(key) == expires_at:
                del expiry[key]
                flags = entries.get(key, 0) & ~GUESS  # ``_unset(ep, key, GUESS)`` inlined
                if flags:
                    entries[key] = flags
                elif entries.pop(key, None) is not None:
                    self._num_entries -= 1
                    self._unhold(key, ep.bit)

    def _expire_oldest(self, ep: Endpoint, now: float) -> None:
        # Approximate entries are touched exactly when their expiry is set, so the LRU
        # order is the expiry order: expire from the front.
        while ep.entries and ep.expiry.get(key := next(iter(ep.entries)), now) <= now:
            self._unset(ep, key, GUESS | _TIERS)

    # -- queries ------------------------------------------------------------------

    def match(self, keys: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        """Per endpoint, how many leading blocks of ``keys`` it holds (any tier)."""
        bits = [(n, ep.bit if (ep := self._endpoints.get(n)) else 0) for n in endpoints]
        active = 0
        for _, bit in bits:
            active |= bit
        # Running AND of the holder masks along the prompt: bits only ever drop, so an
        # endpoint's run ends where its bit first disappears (found by bisection). The
        # AND runs in C, in doubling chunks, and stops once no endpoint is left.
        running: list[int] = []
        get = self._holders.get
        start, size = 0, _MATCH_CHUNK
        while active and start < len(keys):
            chunk = keys[start : start + size]
            running += accumulate(map(get, chunk, repeat(0, len(chunk))), and_, initial=active)
            running.pop(start)  # the chunk's initial value
            active = running[-1]
            start, size = start + size, size * 2
        return {name: _run_length(running, bit) if bit else 0 for name, bit in bits}

    def kv_claims(self, endpoints: Iterable[str], now: float) -> dict[str, float]:
        """Per endpoint, the blocks its recently routed prompts claim (decayed)."""
        return self.claims.claims(endpoints, now)

    def weighted_match(self, keys: Sequence[int], endpoints: Iterable[str]) -> dict[str, float]:
        """Like :meth:`match`, but a block held only in CPU memory counts ``cpu_weight``."""
        names = list(endpoints)
        counts = self.match(keys, names)
        cpu_weight = self.config.cpu_weight
        result: dict[str, float] = {}
        for name in names:
            ep = self._endpoints.get(name)
            run = counts[name]
            if ep is None or not run:
                result[name] = 0.0
                continue
            cpu_only = list(map(ep.entries.get, keys[:run])).count(CPU)  # flags == CPU alone
            result[name] = run - cpu_only * (1.0 - cpu_weight)
        return result

    def stats(self) -> IndexStats:
        estimated = (
            self._num_entries * BYTES_PER_ENTRY
            + len(self._holders) * BYTES_PER_KEY
            + self._num_engine_hashes * BYTES_PER_ENGINE_HASH
            + sum(len(ep.expiry) for ep in self._endpoints.values()) * BYTES_PER_GUESS
        )
        return IndexStats(
            num_endpoints=len(self._endpoints),
            num_entries=self._num_entries,
            num_keys=len(self._holders),
            num_engine_hashes=self._num_engine_hashes,
            evictions=self._evictions,
            expirations=self._expirations,
            estimated_bytes=estimated,
        )

    def endpoint_stats(self, name: str) -> EndpointIndexStats | None:
        ep = self._endpoints.get(name)
        if ep is None:
            return None
        return EndpointIndexStats(
            source=ep.source,
            num_entries=len(ep.entries),
            num_engine_hashes=len(ep.engine),
            **ep.counts,
        )
