"""The emulated engine's HTTP face: shapes, bad input, cancellation, prefix caching."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from inferplane.engine.fleet import EngineSpec, FleetThread
from inferplane.engine.types import EngineState, FinishReason
from tests.engine.engine_helpers import MODEL, running_fleet, sse_payloads, stream_text, wait_for

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetThread]:
    with running_fleet(EngineSpec(time_scale=0.2)) as running:
        yield running


async def _post(url: str, body: Any = None, *, data: bytes | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        kwargs: dict[str, Any] = {"data": data} if data is not None else {"json": body}
        async with session.post(url, **kwargs) as resp:
            return resp.status, await resp.json(content_type=None)


def _user(text: str = "hello there") -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_chat_completion_shape_and_usage(fleet: FleetThread) -> None:
    url = fleet.engines[0].url
    status, body = await _post(url + CHAT, {"model": MODEL, "messages": _user(), "max_tokens": 8})
    assert status == 200
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 8
    assert choice["finish_reason"] in ("stop", "length")


async def test_streaming_completion_with_usage_chunk(fleet: FleetThread) -> None:
    url = fleet.engines[0].url
    body = {
        "model": MODEL,
        "prompt": "once upon a time",
        "max_tokens": 12,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + COMPLETIONS, json=body) as resp,
    ):
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        payloads, done = sse_payloads(await resp.read())
    assert done
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 12
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"
    assert all(p["object"] == "text_completion" for p in payloads)
    assert len({p["id"] for p in payloads}) == 1
    status, plain = await _post(
        url + COMPLETIONS, {**body, "stream": False, "stream_options": None}
    )
    assert status == 200
    assert stream_text(payloads) == plain["choices"][0]["text"]


async def test_token_id_prompt_matches_the_text_prompt(fleet: FleetThread) -> None:
    url = fleet.engines[0].url
    _, tokenized = await _post(url + "/tokenize", {"model": MODEL, "prompt": "abc def"})
    base = {"model": MODEL, "max_tokens": 6, "ignore_eos": True}
    _, by_text = await _post(url + COMPLETIONS, {**base, "prompt": "abc def"})
    _, by_ids = await _post(url + COMPLETIONS, {**base, "prompt": tokenized["tokens"]})
    assert by_text["choices"][0]["text"] == by_ids["choices"][0]["text"]
    assert tokenized["count"] == len(tokenized["tokens"]) == by_ids["usage"]["prompt_tokens"]


async def test_tokenize_render_and_detokenize_agree(fleet: FleetThread) -> None:
    url = fleet.engines[0].url
    _, tok = await _post(url + "/tokenize", {"model": MODEL, "messages": _user()})
    _, render = await _post(url + CHAT + "/render", {"model": MODEL, "messages": _user()})
    assert tok["tokens"] == render["token_ids"]
    _, rendered = await _post(url + COMPLETIONS + "/render", {"model": MODEL, "prompt": "the way"})
    _, detok = await _post(
        url + "/detokenize", {"model": MODEL, "tokens": rendered[0]["token_ids"]}
    )
    assert detok["prompt"] == "the way"


async def test_repeated_prefix_reports_cached_tokens(fleet: FleetThread) -> None:
    url = fleet.engines[0].url
    system = " ".join(f"w{i}" for i in range(200))
    messages = [{"role": "system", "content": system}, *_user("first question")]
    body = {"model": MODEL, "messages": messages, "max_tokens": 2}
    _, first = await _post(url + CHAT, body)
    messages[-1] = {"role": "user", "content": "second question"}
    _, second = await _post(url + CHAT, body)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cached >= 16 * (first["usage"]["prompt_tokens"] // 16) - 16
    assert cached > 0


async def test_stop_string_truncates_and_finishes_with_stop(fleet: FleetThread) -> None:
    url = fleet.engines[0].url
    base = {"model": MODEL, "prompt": "tell me", "max_tokens": 20, "ignore_eos": True}
    _, full = await _post(url + COMPLETIONS, base)
    text = full["choices"][0]["text"]
    stop = text.split()[3]
    _, stopped = await _post(url + COMPLETIONS, {**base, "stop": [stop]})
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["text"] == text[: text.index(stop)]


BAD_INPUTS: list[tuple[str, Any, int, str | None]] = [
    (CHAT, b"{not json", 400, None),
    (CHAT, b"[1, 2]", 400, None),
    (CHAT, {"messages": _user()}, 400, "model"),
    (CHAT, {"model": MODEL}, 400, "messages"),
    (CHAT, {"model": MODEL, "messages": "hi"}, 400, "messages"),
    (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    (CHAT, {"model": MODEL, "messages": _user(), "max_tokens": "ten"}, 400, "max_tokens"),
    (CHAT, {"model": MODEL, "messages": _user(), "max_tokens": 0}, 400, "max_tokens"),
    (CHAT, {"model": MODEL, "messages": _user(), "max_tokens": 10**9}, 400, "messages"),
    (CHAT, {"model": MODEL, "messages": _user(), "n": 2}, 400, "n"),
    (CHAT, {"model": MODEL, "messages": _user(), "stream": "yes"}, 400, "stream"),
    (CHAT, {"model": MODEL, "messages": _user(), "stream_options": {}}, 400, "stream"),
    (CHAT, {"model": MODEL, "messages": _user(), "temperature": 7}, 400, "temperature"),
    (CHAT, {"model": "gpt-17", "messages": _user()}, 404, "model"),
    (COMPLETIONS, {"model": MODEL}, 400, "prompt"),
    (COMPLETIONS, {"model": MODEL, "prompt": [1, 99_999_999]}, 400, "prompt"),
    (COMPLETIONS, {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
    (COMPLETIONS, {"model": MODEL, "prompt": "x " * 9000}, 400, "messages"),
    (COMPLETIONS, {"model": MODEL, "prompt": "x", "stop": 3}, 400, "stop"),
    ("/detokenize", {"tokens": ["a"]}, 400, "tokens"),
    ("/admin/faults", {"slowdown": "fast"}, 400, None),
    ("/admin/faults", {"explode": True}, 400, None),
    ("/v1/nothing", {}, 404, None),
    (COMPLETIONS, b'{"prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}', 413, None),
]


@pytest.mark.parametrize(("path", "payload", "status", "param"), BAD_INPUTS)
async def test_bad_input_gets_openai_error_json(
    fleet: FleetThread, path: str, payload: Any, status: int, param: str | None
) -> None:
    url = fleet.engines[0].url + path
    raw = payload if isinstance(payload, bytes) else None
    got_status, body = await _post(url, payload if raw is None else None, data=raw)
    assert got_status == status
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    if status == 404 and path == CHAT:
        assert error["code"] == "model_not_found"
    status_ok, _ = await _post(
        fleet.engines[0].url + CHAT, {"model": MODEL, "messages": _user(), "max_tokens": 1}
    )
    assert status_ok == 200


async def test_context_length_error_names_the_limit(fleet: FleetThread) -> None:
    url = fleet.engines[0].url
    status, body = await _post(url + COMPLETIONS, {"model": MODEL, "prompt": "y " * 9000})
    assert status == 400
    assert "maximum context length is 8192 tokens" in body["error"]["message"]


async def test_in_flight_requests_are_bounded() -> None:
    with running_fleet(EngineSpec(time_scale=1.0)) as fleet:
        server = fleet.engines[0].server
        fleet.call(lambda: setattr(server, "max_in_flight", 1))
        body = {
            "model": MODEL,
            "prompt": "x",
            "max_tokens": 500,
            "ignore_eos": True,
            "stream": True,
        }
        async with aiohttp.ClientSession() as session:
            first = await session.post(fleet.engines[0].url + COMPLETIONS, json=body)
            await first.content.readline()
            status, error = await _post(fleet.engines[0].url + COMPLETIONS, body)
            first.close()
        assert status == 503 and error["error"]["code"] == "engine_overloaded"


async def test_models_and_health(fleet: FleetThread) -> None:
    url = fleet.engines[0].url
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/v1/models") as resp:
            models = await resp.json()
        async with session.get(url + "/health") as resp:
            assert resp.status == 200
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == 8192


async def test_client_disconnect_aborts_the_request_and_frees_blocks() -> None:
    with running_fleet(EngineSpec(time_scale=1.0)) as fleet:
        server = fleet.engines[0].server
        body = {
            "model": MODEL,
            "prompt": "a long story " * 50,
            "max_tokens": 4000,
            "ignore_eos": True,
            "stream": True,
        }
        async with aiohttp.ClientSession() as session:
            resp = await session.post(fleet.engines[0].url + COMPLETIONS, json=body)
            await resp.content.readline()
            assert fleet.call(lambda: server.model.stats().num_running) == 1
            resp.close()
        freed = await wait_for(
            lambda: fleet.call(lambda: server.model.stats().num_used_blocks) == 0
        )
        stats = fleet.call(server.model.stats)
        assert freed and stats.num_running == 0 and stats.num_waiting == 0
        assert fleet.call(lambda: server.driver.num_in_flight) == 0
        assert fleet.call(lambda: server.metrics.finished[FinishReason.ABORT]) == 1


async def test_health_is_503_while_loading_then_ready() -> None:
    with running_fleet(EngineSpec(time_scale=0.005, cold_start=True)) as fleet:
        url = fleet.engines[0].url
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/health") as resp:
                assert resp.status == 503
            status, body = await _post(url + CHAT, {"model": MODEL, "messages": _user()})
            assert status == 503 and body["error"]["code"] == "engine_not_ready"
            server = fleet.engines[0].server
            assert await wait_for(lambda: server.model.state is EngineState.READY, 10.0)
            async with session.get(url + "/health") as resp:
                assert resp.status == 200


async def test_a_chat_stream_opens_with_its_first_output_not_on_arrival() -> None:
    """As vLLM's and SGLang's: a call waiting for a batch slot shows nothing, not even the
    role delta, until it is scheduled. One slot: while A decodes, B has written nothing."""
    spec = EngineSpec(time_scale=0.2, profile_overrides=(("max_num_seqs", 1),))
    body = {"model": MODEL, "messages": _user(), "max_tokens": 200, "ignore_eos": True}
    body["stream"] = True
    with running_fleet(spec) as one_slot:
        url = one_slot.engines[0].url + CHAT
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as first:
            a_events = await _events(first, 1)  # A holds the slot
            async with session.post(url, json=body) as second:  # B's headers: it arrived
                opening = asyncio.ensure_future(second.content.readline())
                a_events += await _events(first, 20)  # A is 180 steps from its end
                assert not opening.done()
                a_payloads, a_done = sse_payloads(b"".join(a_events) + await first.read())
                b_payloads, b_done = sse_payloads(await opening + await second.read())
    assert a_done and b_done and len(stream_text(b_payloads)) > 0
    assert b_payloads[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len(a_payloads) >= 200


async def _events(resp: aiohttp.ClientResponse, count: int) -> list[bytes]:
    """The next ``count`` SSE events of ``resp``, as lines (blank separators kept)."""
    lines: list[bytes] = []
    while sum(line.startswith(b"data: ") for line in lines) < count:
        line = await resp.content.readline()
        assert line, "the stream ended early"
        lines.append(line)
    return lines
