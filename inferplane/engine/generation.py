"""Deterministic greedy generation: the next token is a pure function of the context.

An emulated model has no weights, yet its output must behave like greedy decoding: the
same context gives the same continuation on every replica. That property is what makes
mid-stream failover testable: a request whose prompt is the original prompt plus the first
N generated tokens must produce exactly the remaining tokens of the uninterrupted run.

The context is hashed in blocks of ``GEN_BLOCK_TOKENS`` tokens, each full block chained on
the one before (``chain' = hash((chain, block))``: CPython's tuple hash, the same in every
process, run in C), and the tokens after the last full block are folded into the chain one
at a time (``h' = mix(h, token)``). A context built in one piece (a prompt) therefore hashes
exactly like one built token by token (a prompt plus generated tokens), extending it costs
O(1) per token, and a whole prompt costs one tuple hash per block instead of Python
arithmetic per token (a 1,000-token prompt: ~30 us instead of ~300 us, the simulator's
largest per-call cost). The next token and the EOS decision are drawn from a finaliser of
the hash. The hash does not depend on the engine's KV-cache seed, so two engines agree.

A generation state is ``(chain, h)``: the chain over the full blocks and the hash of the
whole context; ``h == chain`` when the context ends on a block boundary.
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
#: Tokens per chained block of the context hash (independent of the KV cache's block size).
GEN_BLOCK_TOKENS = 16


def empty_context_hash() -> int:
    return _SEED


def mix(context_hash: int, token_id: int) -> int:
    """The hash of a context extended by one token that does not complete a block."""
    h = ((context_hash ^ token_id) * _MUL_FOLD + token_id + 1) & _MASK64
    return h ^ (h >> 31)


def chain_block(chain: int, block: Sequence[int]) -> int:
    """The chain after one more full block of ``GEN_BLOCK_TOKENS`` token ids."""
    return hash((chain, tuple(block))) & _MASK64


def context_state(token_ids: Sequence[int]) -> tuple[int, int]:
    """``(chain, h)`` of a whole context: the chain over its full blocks, and its hash."""
    size = GEN_BLOCK_TOKENS
    full = len(token_ids) - len(token_ids) % size
    chain = _SEED
    for start in range(0, full, size):
        chain = hash((chain, tuple(token_ids[start : start + size]))) & _MASK64
    h = chain
    for token_id in token_ids[full:]:
        h = ((h ^ token_id) * _MUL_FOLD + token_id + 1) & _MASK64
        h ^= h >> 31
    return chain, h


def context_hash(token_ids: Sequence[int]) -> int:
    """The hash of a whole context (what the next token is drawn from)."""
    return context_state(token_ids)[1]


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
        """The greedy next token after the context whose hash is ``context_hash``."""
        z = _finalise(context_hash)
        if not ignore_eos and (z >> 32) < self._eos_threshold:
            return EOS_TOKEN_ID
        return FIRST_TEXT_TOKEN_ID + (z & 0xFFFFFFFF) % _NUM_TEXT_TOKENS

    def extend(
        self, chain: int, context_hash: int, tokens: list[int], ignore_eos: bool
    ) -> tuple[int, int, int]:
        """Draw the next token after ``tokens`` (the whole context, in state ``(chain,
        context_hash)``), append it, and return it with the new state (the hot path)."""
        h = context_hash
        z = ((h ^ (h >> 30)) * _MUL_A) & _MASK64
        z = ((z ^ (z >> 27)) * _MUL_B) & _MASK64
        z ^= z >> 31
        if not ignore_eos and (z >> 32) < self._eos_threshold:
            token = EOS_TOKEN_ID
        else:
            token = FIRST_TEXT_TOKEN_ID + (z & 0xFFFFFFFF) % _NUM_TEXT_TOKENS
        tokens.append(token)
        if len(tokens) % GEN_BLOCK_TOKENS:
            h = ((h ^ token) * _MUL_FOLD + token + 1) & _MASK64
            return token, chain, h ^ (h >> 31)
        chain = hash((chain, tuple(tokens[-GEN_BLOCK_TOKENS:]))) & _MASK64
        return token, chain, chain

    def run(
        self, chain: int, context_hash: int, tail: Sequence[int], num_tokens: int, ignore_eos: bool
    ) -> tuple[list[int], int, int]:
        """Up to ``num_tokens`` successive tokens after a context in state ``(chain,
        context_hash)`` whose tokens after its last full block are ``tail``; the tokens and
        the state after the last. Stops after an EOS (included). One call for a sequence's
        stretch of decode steps: the same tokens and state as ``extend`` one at a time."""
        threshold = -1 if ignore_eos else self._eos_threshold
        size = GEN_BLOCK_TOKENS
        h = context_hash
        block = list(tail)
        out: list[int] = []
        for _ in range(num_tokens):
            z = ((h ^ (h >> 30)) * _MUL_A) & _MASK64
            z = ((z ^ (z >> 27)) * _MUL_B) & _MASK64
            z ^= z >> 31
            if (z >> 32) < threshold:
                token = EOS_TOKEN_ID
            else:
                token = FIRST_TEXT_TOKEN_ID + (z & 0xFFFFFFFF) % _NUM_TEXT_TOKENS
            out.append(token)
            block.append(token)
            if len(block) == size:
                h = chain = hash((chain, tuple(block))) & _MASK64
                block = []
            else:
                h = ((h ^ token) * _MUL_FOLD + token + 1) & _MASK64
                h ^= h >> 31
            if token == EOS_TOKEN_ID:
                break
        return out, chain, h

    def generate(
        self, prompt_token_ids: Iterable[int], max_tokens: int, *, ignore_eos: bool = False
    ) -> list[int]:
        """The whole greedy output for a prompt (EOS included when drawn), for tests/tools."""
        tokens = list(prompt_token_ids)
        chain, h = context_state(tokens)
        start = len(tokens)
        while len(tokens) - start < max_tokens:
            token, chain, h = self.extend(chain, h, tokens, ignore_eos)
            if token == EOS_TOKEN_ID:
                break
        return tokens[start:]


def tail_of(token_ids: Sequence[int]) -> Sequence[int]:
    """The tokens of a context after its last full block (what ``TokenGenerator.run`` takes)."""
    return token_ids[len(token_ids) - len(token_ids) % GEN_BLOCK_TOKENS :]
