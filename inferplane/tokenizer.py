"""The built-in deterministic tokenizer of the emulated models.

Emulated engines need a tokenizer that behaves like a real one where it matters to a
control plane (token counts, prefix sharing, a chat template, exact continuation of a
partial answer) without shipping a vocabulary file. This one is word-level:

* Ids ``0..15`` are special (``FIRST_TEXT_TOKEN_ID`` in ``engine/types.py``): pad, bos,
  eos, role markers ``<|system|> <|user|> <|assistant|> <|tool|>`` and ``<|end|>``
  (end of a turn). They decode to nothing (like ``skip_special_tokens=True``).
* Ids ``16..VOCAB_SIZE-1`` are text pieces generated once from a fixed seed: a dozen
  punctuation marks and a newline (no leading space), then about 32K lower-case words,
  each with a leading space (``" word"``, like BPE's ``Ġword``), at most 8 letters.
* ``encode(text)`` splits text with one regular expression into runs of letters or
  digits (with an optional leading space), single whitespace characters and single
  other characters; a piece in the vocabulary maps to its id, any other piece to an id
  chosen by a stable hash (blake2b), so every text tokenizes. Letter runs longer than 8
  are cut into 5-letter chunks, so English runs about 4-5 characters per token.
* Like SentencePiece, the first piece of a text (and of a message) takes an implicit
  leading space, and the leading space of a word is dropped when it follows a special
  token or starts the text. Hence ``encode(decode(ids)) == ids`` for every sequence of
  text ids: generated text re-tokenizes to the very ids that produced it, which is what
  makes continuing a partial answer on another engine exact.
* Streaming: ``StreamDecoder`` turns tokens into text deltas whose concatenation equals
  ``decode`` of all of them given the same preceding token.

Chat template: ``<bos>`` then, per message, a role marker, the encoded content and
``<|end|>``; ``add_generation_prompt`` appends ``<|assistant|>``; with
``continue_final_message`` the last (assistant) message is left open (no ``<|end|>``), so
the model continues it. Content is a string or a list of ``{"type": "text"}`` parts
(joined by newlines); tool calls are rendered as text.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from inferplane.engine.types import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    FIRST_TEXT_TOKEN_ID,
    PAD_TOKEN_ID,
    VOCAB_SIZE,
)

SYSTEM_TOKEN_ID = 3
USER_TOKEN_ID = 4
ASSISTANT_TOKEN_ID = 5
TOOL_TOKEN_ID = 6
END_OF_TURN_TOKEN_ID = 7

SPECIAL_TOKENS: dict[int, str] = {
    PAD_TOKEN_ID: "<pad>",
    BOS_TOKEN_ID: "<s>",
    EOS_TOKEN_ID: "</s>",
    SYSTEM_TOKEN_ID: "<|system|>",
    USER_TOKEN_ID: "<|user|>",
    ASSISTANT_TOKEN_ID: "<|assistant|>",
    TOOL_TOKEN_ID: "<|tool|>",
    END_OF_TURN_TOKEN_ID: "<|end|>",
}

ROLE_TOKEN_IDS: dict[str, int] = {
    "system": SYSTEM_TOKEN_ID,
    "developer": SYSTEM_TOKEN_ID,
    "user": USER_TOKEN_ID,
    "assistant": ASSISTANT_TOKEN_ID,
    "tool": TOOL_TOKEN_ID,
    "function": TOOL_TOKEN_ID,
}

_PUNCTUATION = ("\n", ".", ",", "!", "?", ":", ";", "'", "-", "(", ")", '"')
_COMMON_WORDS_TEXT = (
    "the of and to in is it that for on with as was be at by this are or from not but "
    "have an they which one you were all we can her has there been if more when will "
    "would who so no time way about many then them some these two like other into"
)
_ONSETS_TEXT = "b c d f g h j k l m n p r s t v w z br ch cl dr fl gr pl pr sh st th tr"
_VOWELS_TEXT = "a e i o u ai ea ou"
_COMMON_WORDS = tuple(_COMMON_WORDS_TEXT.split())
_ONSETS = tuple(_ONSETS_TEXT.split())
_VOWELS = tuple(_VOWELS_TEXT.split())
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
_MAX_WORD_LETTERS = 8
_CHUNK_LETTERS = 5
_VOCAB_SEED = 20_240_601
_PIECE_RE = re.compile(r" ?[A-Za-z]+| ?[0-9]+|\s|[^\sA-Za-z0-9]")
_NUM_TEXT_TOKENS = VOCAB_SIZE - FIRST_TEXT_TOKEN_ID
_UNKNOWN_CACHE_SIZE = 100_000
_MEMO_ENTRIES = 512
_MEMO_MAX_CHARS = 32_768


class TemplateError(ValueError):
    """A chat request that cannot be rendered (bad role, content shape or flags)."""


def _generate_words(count: int) -> list[str]:
    """Unique pronounceable words, drawn from a fixed seed so every process agrees."""
    rng = random.Random(_VOCAB_SEED)
    words: list[str] = []
    seen: set[str] = set()
    for word in _COMMON_WORDS:
        if word not in seen:
            seen.add(word)
            words.append(word)
    while len(words) < count:
        syllables = rng.choice((1, 2, 2, 2, 3))
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
        word += rng.choice(_CODAS)
        if len(word) <= _MAX_WORD_LETTERS and word not in seen:
            seen.add(word)
            words.append(word)
    return words


def _stable_hash(piece: str) -> int:
    return int.from_bytes(hashlib.blake2b(piece.encode(), digest_size=8).digest(), "big")


class Tokenizer:
    """The word-level tokenizer described in the module docstring (build it once)."""

    def __init__(self) -> None:
        num_words = _NUM_TEXT_TOKENS - len(_PUNCTUATION)
        pieces = [""] * FIRST_TEXT_TOKEN_ID
        pieces += list(_PUNCTUATION)
        pieces += [" " + word for word in _generate_words(num_words)]
        self.vocab_size = VOCAB_SIZE
        self.bos_token_id = BOS_TOKEN_ID
        self.eos_token_id = EOS_TOKEN_ID
        self.pieces: tuple[str, ...] = tuple(pieces)
        #: the piece without its leading space (used after a special token / at start)
        self.stripped_pieces: tuple[str, ...] = tuple(p[1:] if p[:1] == " " else p for p in pieces)
        #: JSON-escaped UTF-8 of each piece (no quotes), for building SSE chunks quickly
        self.json_pieces: tuple[bytes, ...] = tuple(orjson.dumps(p)[1:-1] for p in pieces)
        self.json_stripped_pieces: tuple[bytes, ...] = tuple(
            orjson.dumps(p)[1:-1] for p in self.stripped_pieces
        )
        self._piece_to_id = {p: i for i, p in enumerate(pieces) if i >= FIRST_TEXT_TOKEN_ID}
        self._unknown_cache: dict[str, int] = {}
        self._memo = functools.lru_cache(maxsize=_MEMO_ENTRIES)(self._encode_tuple)

    # -- encoding ---------------------------------------------------------------------

    def _unknown_id(self, piece: str) -> int:
        cached = self._unknown_cache.get(piece)
        if cached is None:
            cached = FIRST_TEXT_TOKEN_ID + _stable_hash(piece) % _NUM_TEXT_TOKENS
            if len(self._unknown_cache) < _UNKNOWN_CACHE_SIZE:
                self._unknown_cache[piece] = cached
        return cached

    def _split(self, text: str) -> list[str]:
        pieces: list[str] = _PIECE_RE.findall(text)
        if not pieces or max(map(len, pieces)) <= _MAX_WORD_LETTERS + 1:
            return pieces  # the common case: nothing to cut
        step = _CHUNK_LETTERS
        out: list[str] = []
        for piece in pieces:
            letters = len(piece) - (piece[0] == " ")
            if letters > _MAX_WORD_LETTERS and piece[-1].isalpha():
                first = len(piece) - letters + step
                out.append(piece[:first])
                out.extend(piece[i : i + step] for i in range(first, len(piece), step))
            else:
                out.append(piece)
        return out

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; the first word takes an implicit leading space.

        ``add_special_tokens`` prepends ``<bos>`` (what vLLM does for a raw prompt).
        Texts up to 32K characters are memoised (bounded LRU): chat histories and system
        prompts come back with every turn.
        """
        memo = len(text) <= _MEMO_MAX_CHARS
        ids = list(self._memo(text)) if memo else self._encode(text)
        return [BOS_TOKEN_ID, *ids] if add_special_tokens else ids

    def _encode_tuple(self, text: str) -> tuple[int, ...]:
        return tuple(self._encode(text))

    def _encode(self, text: str) -> list[int]:
        pieces = self._split(text)
        if pieces and pieces[0][0].isalnum():
            pieces[0] = " " + pieces[0]
        known = self._piece_to_id.get
        unknown = self._unknown_id
        # known ids are >= FIRST_TEXT_TOKEN_ID, never 0, so `or` only falls through on None
        return [known(p) or unknown(p) for p in pieces]

    # -- decoding ---------------------------------------------------------------------

    def check_ids(self, ids: Iterable[int]) -> None:
        """Raise ValueError unless every id is an int inside the vocabulary."""
        for token_id in ids:
            if type(token_id) is not int or not 0 <= token_id < VOCAB_SIZE:
                raise ValueError(f"token id {token_id!r} is outside [0, {VOCAB_SIZE})")

    def piece(self, token_id: int, prev_token_id: int | None) -> str:
        """Text of ``token_id`` after ``prev_token_id`` (None: at the start of the text)."""
        if prev_token_id is None or prev_token_id < FIRST_TEXT_TOKEN_ID:
            return self.stripped_pieces[token_id]
        return self.pieces[token_id]

    def decode(self, ids: Iterable[int], *, prev_token_id: int | None = None) -> str:
        """Text of ``ids`` (special tokens skipped), as if they followed ``prev_token_id``."""
        parts: list[str] = []
        prev = prev_token_id
        for token_id in ids:
            parts.append(self.piece(token_id, prev))
            prev = token_id
        return "".join(parts)

    def stream_decoder(self, prev_token_id: int | None) -> StreamDecoder:
        return StreamDecoder(self, prev_token_id)

    # -- chat -------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Token ids of a chat (see the module docstring); TemplateError on bad input."""
        if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
            raise TemplateError("'messages' must be a non-empty list of messages")
        if continue_final_message and add_generation_prompt:
            raise TemplateError(
                "continue_final_message and add_generation_prompt are not compatible; "
                "set add_generation_prompt to false to continue the final message"
            )
        ids = [BOS_TOKEN_ID]
        last = len(messages) - 1
        for index, message in enumerate(messages):
            role_id, text = self._render_message(message, index)
            ids.append(role_id)
            ids.extend(self.encode(text))
            if index == last and continue_final_message:
                if role_id != ASSISTANT_TOKEN_ID:
                    raise TemplateError("continue_final_message needs a final assistant message")
                continue
            ids.append(END_OF_TURN_TOKEN_ID)
        if add_generation_prompt:
            ids.append(ASSISTANT_TOKEN_ID)
        return ids

    def _render_message(self, message: Mapping[str, Any], index: int) -> tuple[int, str]:
        if not isinstance(message, Mapping):
            raise TemplateError(f"messages[{index}] must be an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLE_TOKEN_IDS:
            raise TemplateError(f"messages[{index}].role must be one of {sorted(ROLE_TOKEN_IDS)}")
        text = _content_text(message.get("content"), index)
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            text += _tool_calls_text(tool_calls, index)
        return ROLE_TOKEN_IDS[role], text


class StreamDecoder:
    """Incremental detokenizer: one text delta per token, concatenating to ``decode``."""

    __slots__ = ("_prev", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, prev_token_id: int | None) -> None:
        self._tokenizer = tokenizer
        self._prev = prev_token_id

    def push(self, token_id: int) -> str:
        delta = self._tokenizer.piece(token_id, self._prev)
        self._prev = token_id
        return delta

    def push_json(self, token_id: int) -> bytes:
        """The delta of ``push`` as JSON-escaped UTF-8 without quotes (for SSE chunks)."""
        prev = self._prev
        self._prev = token_id
        tok = self._tokenizer
        if prev is None or prev < FIRST_TEXT_TOKEN_ID:
            return tok.json_stripped_pieces[token_id]
        return tok.json_pieces[token_id]


def _content_text(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise TemplateError(f"messages[{index}].content: only text parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise TemplateError(f"messages[{index}].content: a text part needs a 'text' string")
            texts.append(text)
        return "\n".join(texts)
    raise TemplateError(f"messages[{index}].content must be a string or a list of parts")


def _tool_calls_text(tool_calls: object, index: int) -> str:
    if not isinstance(tool_calls, list):
        raise TemplateError(f"messages[{index}].tool_calls must be a list")
    lines: list[str] = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise TemplateError(f"messages[{index}].tool_calls entries need a 'function' object")
        lines.append(f"\ncall {function.get('name', '')} {function.get('arguments', '')}")
    return "".join(lines)


@functools.cache
def get_tokenizer() -> Tokenizer:
    """The process-wide tokenizer (built on first use, ~0.1 s)."""
    return Tokenizer()


def encode(text: str, *, add_special_tokens: bool = False) -> list[int]:
    return get_tokenizer().encode(text, add_special_tokens=add_special_tokens)


def decode(ids: Iterable[int], *, prev_token_id: int | None = None) -> str:
    return get_tokenizer().decode(ids, prev_token_id=prev_token_id)


def apply_chat_template(
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> list[int]:
    return get_tokenizer().apply_chat_template(
        messages,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
    )
