"""Deterministic greedy generation: the next token is a pure function of the context.

An emulated model has no weights, yet its output must behave like greedy decoding: the
same context gives the same continuation on every replica. That property is what makes
mid-stream failover testable: a request whose prompt is the original prompt plus the first
N generated tokens must produce exactly the remaining tokens of the uninterrupted run. Any
rule that draws the next token from the context alone has it; this one is chosen so that
neither a prompt nor an answer costs Python arithmetic per token (the simulator's largest
per-call costs were folding prompts and drawing answers token by token).

The context is cut into blocks of ``GEN_BLOCK_TOKENS`` tokens. Full blocks are chained,
``chain' = hash((chain, block))`` (CPython's tuple hash of ints: the same in every process,
run in C), so a 1,000-token prompt costs ~60 tuple hashes. Each chain value owns one *block
draw*: ``GEN_BLOCK_TOKENS`` uniform 64-bit values from SHAKE-128 of the chain, one C call.
The next token after a context whose open block (the tokens after its last full block) is
the first ``r`` tokens the chain's draw spells (always so after a block boundary) is spelled
by draw ``r``; after any other open block (a prompt that ends mid-block, and the tokens
generated until that block fills) it comes from the splitmix64 finaliser of
``hash((chain, open block))``. A draw ``z`` spells EOS when EOS is allowed and its high 32
bits fall under ``2**32 / mean_output_tokens`` (EOS with probability 1 / mean per token),
else text token ``FIRST_TEXT_TOKEN_ID + (z mod 2**32) mod (text tokens)``. The rule does not
depend on the engine's KV-cache seed, so two engines agree.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

from inferplane.engine.types import EOS_TOKEN_ID, FIRST_TEXT_TOKEN_ID, VOCAB_SIZE

_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
_SEED = 0x243F6A8885A308D3  # the chain of the empty context (pi's fractional bits)
_MUL_A = 0xBF58476D1CE4E5B9  # splitmix64 finaliser constants
_MUL_B = 0x94D049BB133111EB
_NUM_TEXT_TOKENS = VOCAB_SIZE - FIRST_TEXT_TOKEN_ID
#: Tokens per chained block of the context (independent of the KV cache's block size).
GEN_BLOCK_TOKENS = 16
_UNPACK = struct.Struct(f"<{2 * GEN_BLOCK_TOKENS}I").unpack
_DRAW_MEMO_MAX = 1 << 14  # block draws kept (~23 MiB at most): a cache of a pure function
_draw_memo: dict[int, tuple[list[int], tuple[int, ...]]] = {}


def empty_chain() -> int:
    return _SEED


def chain_block(chain: int, block: Sequence[int]) -> int:
    """The chain after one more full block of ``GEN_BLOCK_TOKENS`` token ids."""
    return hash((chain, tuple(block))) & _MASK64


def context_chain(token_ids: Sequence[int]) -> int:
    """The chain over the full blocks of a context (its open block is ``open_block``)."""
    size = GEN_BLOCK_TOKENS
    chain = _SEED
    for start in range(0, len(token_ids) - size + 1, size):
        chain = hash((chain, tuple(token_ids[start : start + size]))) & _MASK64
    return chain


def open_block(token_ids: Sequence[int]) -> Sequence[int]:
    """The tokens of a context after its last full block (fewer than a block)."""
    return token_ids[len(token_ids) - len(token_ids) % GEN_BLOCK_TOKENS :]


def block_draw(chain: int) -> tuple[list[int], tuple[int, ...]]:
    """The chain's draw: the text token each of its values spells, and their high halves
    (the EOS test). Memoised; the lists are shared, do not mutate them."""
    found = _draw_memo.get(chain)
    if found is None:
        words = _UNPACK(hashlib.shake_128(chain.to_bytes(8, "little")).digest(8 * GEN_BLOCK_TOKENS))
        texts = [FIRST_TEXT_TOKEN_ID + w % _NUM_TEXT_TOKENS for w in words[0::2]]
        found = (texts, words[1::2])
        if len(_draw_memo) >= _DRAW_MEMO_MAX:
            _draw_memo.clear()
        _draw_memo[chain] = found
    return found


def _off_draw(chain: int, block: Sequence[int]) -> tuple[int, int]:
    """(text token, high half) after an open block that is not the chain's own draw."""
    h = hash((chain, tuple(block))) & _MASK64
    z = ((h ^ (h >> 30)) * _MUL_A) & _MASK64
    z = ((z ^ (z >> 27)) * _MUL_B) & _MASK64
    z ^= z >> 31
    return FIRST_TEXT_TOKEN_ID + (z & _MASK32) % _NUM_TEXT_TOKENS, z >> 32


class TokenGenerator:
    """Draws the next token of a context; EOS with probability 1/mean_output_tokens."""

    __slots__ = ("_eos_threshold",)

    #: Whether the tokens are the greedy rule's (False) or a stand-in (``ContentFreeGenerator``).
    content_free = False

    def __init__(self, mean_output_tokens: int) -> None:
        if mean_output_tokens < 1:
            raise ValueError(f"mean_output_tokens must be >= 1, got {mean_output_tokens}")
        self._eos_threshold = (1 << 32) // mean_output_tokens

    def next_token(self, chain: int, block: Sequence[int], *, ignore_eos: bool = False) -> int:
        """The greedy next token after a context with ``chain`` and open ``block``."""
        texts, highs = block_draw(chain)
        r = len(block)
        if list(block) == texts[:r]:
            text, high = texts[r], highs[r]
        else:
            text, high = _off_draw(chain, block)
        return EOS_TOKEN_ID if not ignore_eos and high < self._eos_threshold else text

    def extend(self, chain: int, tokens: list[int], ignore_eos: bool) -> tuple[int, int]:
        """Draw the next token after ``tokens`` (the whole context; ``chain`` over its full
        blocks), append it, and return it with the chain after it (the stepping path)."""
        token = self.next_token(chain, open_block(tokens), ignore_eos=ignore_eos)
        tokens.append(token)
        if len(tokens) % GEN_BLOCK_TOKENS:
            return token, chain
        return token, hash((chain, tuple(tokens[-GEN_BLOCK_TOKENS:]))) & _MASK64

    def run(
        self, chain: int, block: Sequence[int], num_tokens: int, ignore_eos: bool
    ) -> tuple[list[int], int]:
        """Up to ``num_tokens`` successive tokens after a context with ``chain`` and open
        ``block``, and the chain after the last; stops after an EOS (included). The same
        tokens as ``extend`` one at a time, a block draw at a time where it can."""
        threshold = -1 if ignore_eos else self._eos_threshold
        size = GEN_BLOCK_TOKENS
        current = list(block)
        out: list[int] = []
        ended = False
        while len(out) < num_tokens and not ended:
            texts, highs = block_draw(chain)
            r = len(current)
            if current == texts[:r]:  # the chain's own draw spells the rest of the block
                stop = min(size, r + num_tokens - len(out))
                if threshold >= 0:
                    for i in range(r, stop):
                        if highs[i] < threshold:  # EOS: the draw up to it, then EOS
                            stop, ended = i, True
                            break
                current += texts[r:stop]
                out += texts[r:stop]
                if ended:
                    current.append(EOS_TOKEN_ID)
                    out.append(EOS_TOKEN_ID)
            else:
                text, high = _off_draw(chain, current)
                token = EOS_TOKEN_ID if high < threshold else text
                ended = token == EOS_TOKEN_ID
                current.append(token)
                out.append(token)
            if len(current) == size:
                chain = hash((chain, tuple(current))) & _MASK64
                current = []
        return out, chain

    def generate(
        self, prompt_token_ids: Iterable[int], max_tokens: int, *, ignore_eos: bool = False
    ) -> list[int]:
        """The whole greedy output for a prompt (EOS included when drawn), for tests/tools."""
        tokens = list(prompt_token_ids)
        chain = context_chain(tokens)
        out, _ = self.run(chain, open_block(tokens), max_tokens, ignore_eos)
        return out


#: The content-free generator's tokens: token ``L % GEN_BLOCK_TOKENS`` of this follows a
#: context of ``L`` tokens (16 text tokens, from the chain of the empty context's draw).
_FILL = block_draw(_SEED)[0][:GEN_BLOCK_TOKENS]


class ContentFreeGenerator(TokenGenerator):
    """A :class:`TokenGenerator` for callers that never read the answer (the simulator).

    A request with ``ignore_eos`` stops by length alone, so what it generates changes no
    time; only its KV blocks matter, and those are told apart by their chained hashes,
    which already differ wherever the contexts do. Its tokens are therefore a fixed
    pattern by position (:data:`_FILL`): still a pure function of the context (the same
    context, the same answer, so duplicate blocks stay duplicates), at no hashing cost.
    Requests without ``ignore_eos`` are generated as :class:`TokenGenerator` does.
    """

    __slots__ = ()

    content_free = True

    def extend(self, chain: int, tokens: list[int], ignore_eos: bool) -> tuple[int, int]:
        if not ignore_eos:
            return super().extend(chain, tokens, ignore_eos)
        token = _FILL[len(tokens) % GEN_BLOCK_TOKENS]
        tokens.append(token)
        return token, chain

    def run(
        self, chain: int, block: Sequence[int], num_tokens: int, ignore_eos: bool
    ) -> tuple[list[int], int]:
        if not ignore_eos:
            return super().run(chain, block, num_tokens, ignore_eos)
        return fill(len(block), num_tokens), chain


def fill(context_tokens: int, num_tokens: int) -> list[int]:
    """``ContentFreeGenerator``'s ``num_tokens`` tokens after a context of that length."""
    r = context_tokens % GEN_BLOCK_TOKENS
    return (_FILL * ((r + num_tokens) // GEN_BLOCK_TOKENS + 1))[r : r + num_tokens]
