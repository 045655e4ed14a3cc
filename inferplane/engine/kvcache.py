"""The paged KV cache: a pool of fixed-size blocks with ref counts and a prefix cache.

Like vLLM's block pool, memory is cut into blocks of ``block_size`` tokens. A request
holds a list of block ids; a full block whose tokens are known is *cached* under a
chained hash (the hash of its parent block's hash and its own token ids), so the same
prefix in a later request maps to the same blocks and is not recomputed.

Design notes (why it looks like this):
* Block ids are plain ints and the per-block state lives in two flat lists (ref count,
  hash), so the hot path touches no per-block objects.
* Free blocks are kept in three places: blocks never used yet (just a counter: handed out
  in id order, so a pool costs nothing per block to create), emptied blocks (a stack, reused
  first) and blocks that still hold cached content (an LRU). Allocation takes empty
  blocks first and evicts cached content only when it must, least recently freed first; a
  request frees its blocks tail first, so a prefix outlives its suffix.
* The LRU is a doubly linked list threaded through two flat ``array('i')`` of block ids
  (previous, next), 8 bytes a block, not an ``OrderedDict`` (~160 bytes an entry: 4 GiB of
  a 1,000-engine simulation once every cache is full); the same order, O(1) per operation.
* Hashes are seeded per pool (per engine instance, like vLLM's per-process seed): two
  engines give different hashes to the same tokens, as real ones do. A block's hash is its
  *unsalted* chain key, ``hash((parent key, block token ids))`` from 0 (Python's tuple hash
  of ints: deterministic across processes, fast, 64-bit; the gateway's own prefix-index
  key, ``core.prefix_blocks.block_keys``), made unsigned and XORed with the pool's salt: a
  bijection, so equal hashes mean equal chains exactly as before. A caller that already
  knows a prompt's keys (the simulator's router computed them) passes them to
  ``extend_hashes`` and saves the pool hashing the prompt again.
* A hash is cached by at most one block: a duplicate computed concurrently stays uncached,
  so the stored/removed events replay into exactly the set of cached hashes.
* Evicted hashes are queued for the caller, which turns them into ``BlockRemoved`` events
  stamped with its own time. Pure data structure: no clock, no I/O.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

_MASK64 = (1 << 64) - 1
_WRAP = 1 << 64
_MAX_SIGNED = (1 << 63) - 1
_NO_HASH = -1  # a block without cached content (hashes are unsigned, never negative)
_NIL = -1  # the end of the LRU list


class BlockPool:
    """``num_blocks`` KV blocks of ``block_size`` tokens with an LRU prefix cache."""

    __slots__ = (
        "_cached",
        "_free_empty",
        "_hash",
        "_lru_head",
        "_lru_len",
        "_lru_next",
        "_lru_prev",
        "_lru_tail",
        "_next_fresh",
        "_ref",
        "_removed",
        "_salt",
        "_seed",
        "block_size",
        "num_blocks",
    )

    def __init__(self, num_blocks: int, block_size: int, seed: int = 0) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks, block_size >= 1; got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._seed = seed
        self._salt = hash(("inferplane-kv-root", seed)) & _MASK64
        self._ref = [0] * num_blocks
        self._hash = [_NO_HASH] * num_blocks
        self._cached: dict[int, int] = {}  # hash -> block id
        self._free_empty: list[int] = []  # emptied blocks, reused last-freed first
        self._next_fresh = 0  # blocks >= this were never used: taken in id order, after those
        self._lru_reset()
        self._removed: list[int] = []

    # -- hashing ---------------------------------------------------------------------------

    def hash_block(self, parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
        """The chained hash of a full block: salted chain key of (parent, token ids)."""
        parent = 0 if parent_hash is None else self._key(parent_hash)
        return (hash((parent, token_ids)) & _MASK64) ^ self._salt

    def _key(self, block_hash: int) -> int:
        """The unsalted, signed chain key behind a block hash."""
        key = block_hash ^ self._salt
        return key - _WRAP if key > _MAX_SIGNED else key

    def extend_hashes(
        self,
        hashes: list[int],
        token_ids: Sequence[int],
        num_tokens: int,
        keys: Sequence[int] | None = None,
    ) -> None:
        """Append the chained hashes of the full blocks of ``token_ids[:num_tokens]``.

        ``keys``: the chain keys (``block_keys`` with this pool's block size) of the leading
        full blocks of ``token_ids``, when the caller has them: those are salted, not hashed.
        """
        size, salt = self.block_size, self._salt
        start = len(hashes)
        stop = num_tokens // size
        if stop <= start:
            return
        if keys is not None and len(keys) > start:
            known = min(stop, len(keys))
            hashes += [(k & _MASK64) ^ salt for k in keys[start:known]]
            start = known
            if start == stop:
                return
        parent = self._key(hashes[-1]) if hashes else 0
        if stop - start == 1:  # one block (a decode filled it): no iterator to set up
            block = tuple(token_ids[start * size : stop * size])
            hashes.append((hash((parent, block)) & _MASK64) ^ salt)
            return
        append = hashes.append
        blocks = iter(token_ids[start * size : stop * size])
        for block in zip(*([blocks] * size), strict=False):  # C-made tuples
            parent = hash((parent, block))
            append((parent & _MASK64) ^ salt)

    # -- prefix cache ----------------------------------------------------------------------

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest run of leading ``hashes`` that are cached."""
        cached = self._cached
        found: list[int] = []
        for h in hashes:
            block = cached.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def register(self, block_id: int, block_hash: int) -> bool:
        """Cache a held, full block under ``block_hash``; False if the hash is already cached."""
        if block_hash in self._cached:
            return False
        self._cached[block_hash] = block_id
        self._hash[block_id] = block_hash
        return True

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def cached_hashes(self) -> frozenset[int]:
        return frozenset(self._cached)

    # -- allocation ------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free_empty) + self.num_blocks - self._next_fresh + self._lru_len

    @property
    def num_free_uncached(self) -> int:
        """Free blocks holding no cached content: allocating up to these evicts nothing."""
        return len(self._free_empty) + self.num_blocks - self._next_fresh

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached_free(self) -> int:
        return self._lru_len

    def num_free_excluding(self, block_ids: Iterable[int]) -> int:
        """Free blocks left if ``block_ids`` (a prefix hit) were taken into use first."""
        ref = self._ref
        return self.num_free - sum(1 for b in block_ids if ref[b] == 0)

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference to cached blocks (a prefix hit); free ones leave the LRU."""
        ref = self._ref
        for b in block_ids:
            if ref[b] == 0:
                self._lru_remove(b)
            ref[b] += 1

    def allocate(self, num_blocks: int) -> list[int]:
        """``num_blocks`` blocks, empty ones first, else evicting LRU cached content.

        The caller checks ``num_free`` first; asking for more raises ValueError.
        """
        if num_blocks > self.num_free:
            raise ValueError(f"asked for {num_blocks} blocks, {self.num_free} free")
        ref, empty = self._ref, self._free_empty
        out: list[int] = []
        for _ in range(num_blocks):
            if empty:
                b = empty.pop()
            elif self._next_fresh < self.num_blocks:
                b = self._next_fresh
                self._next_fresh = b + 1
            else:
                b = self._lru_head
                self._lru_remove(b)
                h = self._hash[b]
                del self._cached[h]
                self._hash[b] = _NO_HASH
                self._removed.append(h)
            ref[b] = 1
            out.append(b)
        return out

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference to each block, tail first; cached content stays reusable."""
        ref, hashes = self._ref, self._hash
        for b in reversed(block_ids):
            ref[b] -= 1
            if ref[b] == 0:
                if hashes[b] == _NO_HASH:
                    self._free_empty.append(b)
                else:
                    self._lru_append(b)

    # -- the LRU of free blocks with cached content ----------------------------------------

    def _lru_reset(self) -> None:
        self._lru_prev = array("i", [_NIL]) * self.num_blocks
        self._lru_next = array("i", [_NIL]) * self.num_blocks
        self._lru_head = _NIL  # the least recently freed
        self._lru_tail = _NIL  # the most recently freed
        self._lru_len = 0

    def _lru_append(self, b: int) -> None:
        tail = self._lru_tail
        self._lru_prev[b] = tail
        self._lru_next[b] = _NIL
        if tail == _NIL:
            self._lru_head = b
        else:
            self._lru_next[tail] = b
        self._lru_tail = b
        self._lru_len += 1

    def _lru_remove(self, b: int) -> None:
        prev, nxt = self._lru_prev[b], self._lru_next[b]
        if prev == _NIL:
            self._lru_head = nxt
        else:
            self._lru_next[prev] = nxt
        if nxt == _NIL:
            self._lru_tail = prev
        else:
            self._lru_prev[nxt] = prev
        self._lru_len -= 1

    def pop_removed(self) -> list[int]:
        """Hashes evicted since the last call (for ``BlockRemoved`` events)."""
        removed, self._removed = self._removed, []
        return removed

    def clear(self) -> None:
        """Free every block and forget all cached content (engine reset; holders are gone)."""
        self._ref = [0] * self.num_blocks
        self._hash = [_NO_HASH] * self.num_blocks
        self._cached.clear()
        self._free_empty = []
        self._next_fresh = 0
        self._lru_reset()
        self._removed.clear()

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def block_hash(self, block_id: int) -> int | None:
        h = self._hash[block_id]
        return None if h == _NO_HASH else h
