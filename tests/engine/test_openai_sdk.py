"""The official openai SDK against emulated engines; continuation across two engines."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from inferplane.engine.fleet import EngineSpec, FleetThread
from tests.engine.engine_helpers import MODEL, running_fleet

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Describe the sea in many words, please."},
]
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetThread]:
    with running_fleet(EngineSpec(count=2, time_scale=0.02, seed=3)) as running:
        yield running


def _client(fleet: FleetThread, index: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.engines[index].url + "/v1", api_key="x", max_retries=0)


def test_sync_chat_stream_and_non_stream_agree(fleet: FleetThread) -> None:
    client = _client(fleet)
    full = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, extra_body=NO_EOS
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_EOS,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    assert full.usage is not None and full.usage.completion_tokens == 20
    assert full.choices[0].finish_reason == "length"


def test_sync_completions_stream_and_non_stream(fleet: FleetThread) -> None:
    client = _client(fleet, 1)
    full = client.completions.create(
        model=MODEL, prompt="The sea", max_tokens=15, extra_body=NO_EOS
    )
    stream = client.completions.create(
        model=MODEL, prompt="The sea", max_tokens=15, stream=True, extra_body=NO_EOS
    )
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text == full.choices[0].text and text.startswith(" ")
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_sdk_raises_typed_errors(fleet: FleetThread) -> None:
    client = _client(fleet)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt="word " * 9000)


async def test_async_chat_stream(fleet: FleetThread) -> None:
    client = openai.AsyncOpenAI(base_url=fleet.engines[1].url + "/v1", api_key="x")
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10, stream=True, extra_body=NO_EOS
    )
    parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    await client.close()
    assert len("".join(parts).split()) >= 5


def test_continuation_on_another_engine_completes_the_same_answer(fleet: FleetThread) -> None:
    a, b = _client(fleet, 0), _client(fleet, 1)
    total, cut = 40, 13
    reference = a.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=total, extra_body=NO_EOS
    )
    expected = reference.choices[0].message.content or ""
    stream = a.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=total, stream=True, extra_body=NO_EOS
    )
    deltas: list[str] = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            deltas.append(chunk.choices[0].delta.content)
        if len(deltas) == cut:
            stream.close()  # the client walks away mid-stream
            break
    partial = "".join(deltas)
    rest = b.chat.completions.create(
        model=MODEL,
        messages=[*MESSAGES, {"role": "assistant", "content": partial}],
        max_tokens=total - cut,
        extra_body={
            **NO_EOS,
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    )
    assert partial + (rest.choices[0].message.content or "") == expected
    assert rest.usage is not None and rest.usage.completion_tokens == total - cut
