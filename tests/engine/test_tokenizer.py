"""The built-in tokenizer: round trip, streaming deltas, chat template, continuation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.engine.generation import TokenGenerator
from inferplane.engine.types import EOS_TOKEN_ID, FIRST_TEXT_TOKEN_ID, VOCAB_SIZE
from inferplane.tokenizer import (
    ASSISTANT_TOKEN_ID,
    END_OF_TURN_TOKEN_ID,
    USER_TOKEN_ID,
    TemplateError,
    apply_chat_template,
    get_tokenizer,
)

TEXT_IDS = st.lists(st.integers(FIRST_TEXT_TOKEN_ID, VOCAB_SIZE - 1), max_size=60)
PREV = st.one_of(st.none(), st.integers(0, VOCAB_SIZE - 1))


@settings(max_examples=150, deadline=None)
@given(TEXT_IDS)
def test_encode_of_decode_is_identity_for_text_ids(ids: list[int]) -> None:
    tok = get_tokenizer()
    assert tok.encode(tok.decode(ids)) == ids


@settings(max_examples=150, deadline=None)
@given(TEXT_IDS, PREV)
def test_stream_deltas_concatenate_to_decode(ids: list[int], prev: int | None) -> None:
    tok = get_tokenizer()
    decoder = tok.stream_decoder(prev)
    json_decoder = tok.stream_decoder(prev)
    deltas = [decoder.push(t) for t in ids]
    json_deltas = [json_decoder.push_json(t) for t in ids]
    assert "".join(deltas) == tok.decode(ids, prev_token_id=prev)
    assert b"".join(json_deltas).decode() == tok.decode(ids, prev_token_id=prev).replace(
        "\n", "\\n"
    ).replace('"', '\\"')


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_any_text_tokenizes_into_the_vocabulary_deterministically(text: str) -> None:
    tok = get_tokenizer()
    ids = tok.encode(text)
    assert all(FIRST_TEXT_TOKEN_ID <= i < VOCAB_SIZE for i in ids)
    assert ids == tok.encode(text) == tok._encode(text)  # memoised or not, the same ids
    assert (len(ids) == 0) == (text == "")


def test_english_text_runs_a_few_characters_per_token() -> None:
    text = (
        "The control plane decides, for every call, whether to admit, queue or reject it, "
        "which replica serves it, and what to do when that replica fails mid-stream."
    )
    ratio = len(text) / len(get_tokenizer().encode(text))
    assert 3.0 <= ratio <= 6.0


def test_special_tokens_decode_to_nothing_and_drop_the_next_leading_space() -> None:
    tok = get_tokenizer()
    word = tok.encode("word")[0]
    assert tok.pieces[word] == " word" or tok.pieces[word].startswith(" ")
    assert tok.decode([ASSISTANT_TOKEN_ID, word]) == tok.stripped_pieces[word]
    assert tok.decode([word], prev_token_id=word) == tok.pieces[word]
    assert tok.decode([EOS_TOKEN_ID]) == ""


def test_chat_template_marks_roles_and_generation_prompt() -> None:
    messages = [{"role": "user", "content": "hello"}]
    ids = apply_chat_template(messages)
    assert ids[1] == USER_TOKEN_ID
    assert ids[-2:] == [END_OF_TURN_TOKEN_ID, ASSISTANT_TOKEN_ID]
    without = apply_chat_template(messages, add_generation_prompt=False)
    assert without == ids[:-1]


def test_content_parts_render_like_the_joined_string() -> None:
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    as_parts = apply_chat_template([{"role": "user", "content": parts}])
    as_text = apply_chat_template([{"role": "user", "content": "first\nsecond"}])
    assert as_parts == as_text


def test_tool_calls_render_as_text() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}
    plain = apply_chat_template([{"role": "assistant", "content": None}])
    with_call = apply_chat_template([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert len(with_call) > len(plain)


@pytest.mark.parametrize(
    ("messages", "kwargs", "needle"),
    [
        ([{"role": "wizard", "content": "x"}], {}, "role"),
        ([{"role": "user", "content": 3}], {}, "content"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], {}, "text parts"),
        ([], {}, "non-empty"),
        (
            [{"role": "assistant", "content": "x"}],
            {"continue_final_message": True, "add_generation_prompt": True},
            "not compatible",
        ),
        (
            [{"role": "user", "content": "x"}],
            {"continue_final_message": True, "add_generation_prompt": False},
            "final assistant",
        ),
    ],
)
def test_bad_chats_raise_template_error(
    messages: list[dict[str, object]], kwargs: dict[str, bool], needle: str
) -> None:
    with pytest.raises(TemplateError, match=needle):
        apply_chat_template(messages, **kwargs)


def _generate(prompt: list[int], count: int) -> list[int]:
    """Greedy tokens the way the engine model draws them (no EOS here)."""
    return TokenGenerator(mean_output_tokens=100).generate(prompt, count, ignore_eos=True)


@settings(max_examples=40, deadline=None)
@given(st.text(min_size=1, max_size=80), st.integers(1, 30))
def test_continuing_a_partial_answer_renders_the_same_context(text: str, cut: int) -> None:
    tok = get_tokenizer()
    messages = [{"role": "user", "content": text}]
    prompt = tok.apply_chat_template(messages)
    generated = _generate(prompt, cut)
    partial = tok.decode(generated, prev_token_id=prompt[-1])
    continued = tok.apply_chat_template(
        [*messages, {"role": "assistant", "content": partial}],
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert continued == prompt + generated
