"""Deterministic greedy generation: the next token is a pure function of the context.

An emulated model has no weights, yet its output must behave like greedy decoding: the
same context gives the same continuation on every replica. That property is what makes
mid-stream failover testable: a request whose prompt is the original prompt plus the first
N generated tokens must produce exactly the remaining tokens of the uninterrupted run.

The context is folded into a 64-bit rolling hash, one token at a time
(``h' = mix(h, token)``), so extending a context by one token costs O(1) and a context
built in one piece (a prompt) hashes exactly like one built token by token (a prompt plus
generated tokens). The next token and the EOS decision are drawn from a finaliser of that
hash. The hash does not depend on the engine's KV-cache seed, so two engines agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from inferplane.engine.types import EOS_TOKEN_ID, FIRST_TEXT_TOKEN_ID, VOCAB_SIZE

_MASK64 = (1 << 64) - 1
_SEED = 0x243F6A8885A308D3  # the hash of the empty context (pi's fractional bits)
_MUL_FOLD = 0x9E3779B97F4A7C15  # golden-ratio odd constant
_MUL_A = 0xBF58476D1CE4E5B9  # splitmix64 finaliser constants
_MUL_B = 0x94D049BB133111EB
_NUM_TEXT_TOKENS = VOCAB_SIZE - FIRST_TEXT_TOKEN_ID


def empty_context_hash() -> int:
    return _SEED


def mix(context_hash: int, token_id: int) -> int:
    """The rolling hash of a context extended by one token."""
    h = ((context_hash ^ token_id) * _MUL_FOLD + token_id + 1) & _MASK64
    return h ^ (h >> 31)


def context_hash(token_ids: Iterable[int], start: int = _SEED) -> int:
    """The rolling hash of a whole context (same as folding ``mix`` over it)."""
    h = start
    for token_id in token_ids:
        h = ((h ^ token_id) * _MUL_FOLD + token_id + 1) & _MASK64
        h ^= h >> 31
    return h


#: Prompts are folded in chunks of this many tokens through a memo (see ``prompt_hash``).
PROMPT_CHUNK_TOKENS = 256
_MEMO_MAX_ENTRIES = 8192  # ~16 MiB of chunk tuples at most; oldest entries go first
_chunk_memo: dict[tuple[int, tuple[int, ...]], int] = {}


def prompt_hash(token_ids: Sequence[int]) -> int:
    """``context_hash(token_ids)``, memoised per chunk of ``PROMPT_CHUNK_TOKENS`` tokens.

    Agentic calls resend a growing context and chat calls share system prompts, so most of
    a prompt was folded before (on this engine or another in the process). The memo maps
    (hash before a chunk, the chunk's token ids) to the hash after it: a dict key compares
    the tokens themselves on a hit, so a lookup is exact (no collision can change a token),
    and only the chunks never seen are folded token by token. A cache of a pure function:
    results never depend on what it holds.
    """
    memo, size = _chunk_memo, PROMPT_CHUNK_TOKENS
    h = _SEED
    full = len(token_ids) - len(token_ids) % size
    for start in range(0, full, size):
        chunk = tuple(token_ids[start : start + size])
        key = (h, chunk)
        after = memo.get(key)
        if after is None:
            after = context_hash(chunk, h)
            if len(memo) >= _MEMO_MAX_ENTRIES:
                del memo[next(iter(memo))]
            memo[key] = after
        h = after
    return context_hash(token_ids[full:], h) if full < len(token_ids) else h


def _finalise(context_hash: int) -> int:
    z = ((context_hash ^ (context_hash >> 30)) * _MUL_A) & _MASK64
    z = ((z ^ (z >> 27)) * _MUL_B) & _MASK64
    return z ^ (z >> 31)


class TokenGenerator:
    """Draws the next token from a context hash; EOS with probability 1/mean_output_tokens."""

    __slots__ = ("_eos_threshold",)

    def __init__(self, mean_output_tokens: int) -> None:
        if mean_output_tokens < 1:
            raise ValueError(f"mean_output_tokens must be >= 1, got {mean_output_tokens}")
        self._eos_threshold = (1 << 32) // mean_output_tokens

    def next_token(self, context_hash: int, *, ignore_eos: bool = False) -> int:
        """The greedy next token after the context whose rolling hash is ``context_hash``."""
        z = _finalise(context_hash)
        if not ignore_eos and (z >> 32) < self._eos_threshold:
            return EOS_TOKEN_ID
        return FIRST_TEXT_TOKEN_ID + (z & 0xFFFFFFFF) % _NUM_TEXT_TOKENS

    def step(self, context_hash: int, ignore_eos: bool) -> tuple[int, int]:
        """``next_token`` and the context hash extended by it, in one call (the hot path)."""
        z = ((context_hash ^ (context_hash >> 30)) * _MUL_A) & _MASK64
        z = ((z ^ (z >> 27)) * _MUL_B) & _MASK64
        z ^= z >> 31
        if not ignore_eos and (z >> 32) < self._eos_threshold:
            token = EOS_TOKEN_ID
        else:
            token = FIRST_TEXT_TOKEN_ID + (z & 0xFFFFFFFF) % _NUM_TEXT_TOKENS
        h = ((context_hash ^ token) * _MUL_FOLD + token + 1) & _MASK64
        return token, h ^ (h >> 31)

    def run(self, context_hash: int, num_tokens: int, ignore_eos: bool) -> tuple[list[int], int]:
        """Up to ``num_tokens`` successive ``step`` tokens and the hash after the last.

        Stops after an EOS (included). One call for a sequence's stretch of decode steps.
        """
        threshold = -1 if ignore_eos else self._eos_threshold
        h = context_hash
        out: list[int] = []
        for _ in range(num_tokens):
            z = ((h ^ (h >> 30)) * _MUL_A) & _MASK64
            z = ((z ^ (z >> 27)) * _MUL_B) & _MASK64
            z ^= z >> 31
            if (z >> 32) < threshold:
                token = EOS_TOKEN_ID
            else:
                token = FIRST_TEXT_TOKEN_ID + (z & 0xFFFFFFFF) % _NUM_TEXT_TOKENS
            h = ((h ^ token) * _MUL_FOLD + token + 1) & _MASK64
            h ^= h >> 31
            out.append(token)
            if token == EOS_TOKEN_ID:
                break
        return out, h

    def generate(
        self, prompt_token_ids: Iterable[int], max_tokens: int, *, ignore_eos: bool = False
    ) -> list[int]:
        """The whole greedy output for a prompt (EOS included when drawn), for tests/tools."""
        h = context_hash(prompt_token_ids)
        out: list[int] = []
        while len(out) < max_tokens:
            token = self.next_token(h, ignore_eos=ignore_eos)
            out.append(token)
            if token == EOS_TOKEN_ID:
                break
            h = mix(h, token)
        return out
