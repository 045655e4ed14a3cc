"""Synthetic prompt token ids that share exactly the prefixes a workload says they share.

The engine model's prefix cache hashes full blocks in a chain, so two prompts share cached
blocks only up to the first block where their tokens differ. A workload therefore describes a
prompt as a list of *segments* (a shared system prompt, a document, one task's history, one
call's fresh input), each named by an integer key: equal keys give equal tokens, different
keys differ in their first tokens. The tail of every segment is one shared pattern sliced to
length, so building a 100K-token prompt is a tuple slice and a concatenation, not 100K draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from inferplane.core.prefix_blocks import block_keys
from inferplane.engine.types import FIRST_TEXT_TOKEN_ID, VOCAB_SIZE

_SPAN = VOCAB_SIZE - FIRST_TEXT_TOKEN_ID
_HEADER_TOKENS = 4  # a key is written in base _SPAN: unique for keys below _SPAN**4 (~2**59)
MAX_KEY = _SPAN**_HEADER_TOKENS - 1
_PAD_STRIDE = 7919  # a prime, so the tail does not repeat within a block


@lru_cache(maxsize=8)
def _pad(length: int) -> tuple[int, ...]:
    return tuple(FIRST_TEXT_TOKEN_ID + (i * _PAD_STRIDE) % _SPAN for i in range(length))


def _pad_of(length: int) -> tuple[int, ...]:
    size = 1 << 16
    while size < length:
        size <<= 1
    return _pad(size)[:length]


def segment(key: int, num_tokens: int) -> tuple[int, ...]:
    """``num_tokens`` token ids identified by ``key`` (same key and length: same tokens)."""
    if not 0 <= key <= MAX_KEY:
        raise ValueError(f"segment key {key} out of range")
    if num_tokens <= 0:
        return ()
    header = []
    k = key
    for _ in range(_HEADER_TOKENS):
        header.append(FIRST_TEXT_TOKEN_ID + k % _SPAN)
        k //= _SPAN
    if num_tokens <= _HEADER_TOKENS:
        return tuple(header[:num_tokens])
    return tuple(header) + _pad_of(num_tokens - _HEADER_TOKENS)


class KeySpace:
    """Hands out segment keys that never collide across the sources of one run."""

    __slots__ = ("_next", "_prefix")

    def __init__(self, source_index: int) -> None:
        if not 0 <= source_index < 1 << 12:
            raise ValueError("too many workload sources")
        self._prefix = source_index << 46
        self._next = 0

    def fresh(self) -> int:
        """A key no other call of this run has used."""
        self._next += 1
        return self._prefix | (1 << 45) | self._next

    def named(self, index: int) -> int:
        """A stable key for a shared thing (document ``index``, the system prompt: -1)."""
        return self._prefix | ((index + 1) & ((1 << 45) - 1))


class KeyChain:
    """The index's own block keys (``block_keys``, 16-token blocks) of one growing prompt.

    An agent task's every prompt extends the one before it (until the task compacts its
    context, which starts a new chain), so each step hashes only its new full blocks.
    Every prompt asked about must extend every prompt asked about before.
    """

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: list[int] = []

    def keys_for(self, prompt: Sequence[int]) -> tuple[int, ...]:
        """``tuple(block_keys(prompt))``, hashing only what the chain has not seen."""
        full, known = len(prompt) // 16, len(self._keys)
        if full > known:
            parent = self._keys[-1] if known else 0
            self._keys += block_keys(prompt[known * 16 : full * 16], 16, parent)
        return tuple(self._keys[:full])
