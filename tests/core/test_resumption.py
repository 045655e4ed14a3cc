"""Stream resumption: continuation planning (table) and stitching (one stream, one usage)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.resumption import (
    ResumeAction,
    StreamKind,
    StreamProgress,
    plan_resumption,
)
from inferplane.core.retry import FailureKind
from inferplane.core.stitcher import StreamStitcher

CHAT, COMPLETION = StreamKind.CHAT, StreamKind.COMPLETION
RESET = FailureKind.RESET


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj)


def _engine(
    kind: StreamKind,
    rid: str,
    pieces: list[str],
    *,
    finish: str | None = "stop",
    usage: tuple[int, int, int] | None = None,
) -> list[bytes]:
    """The events an engine streams (vLLM's shapes), without [DONE]."""
    head = {"id": rid, "created": len(rid), "model": f"model-of-{rid}"}
    if kind is CHAT:
        head["object"] = "chat.completion.chunk"

        def choice(text: str | None, fr: str | None, role: bool = False) -> dict[str, Any]:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if role:
                delta = {"role": "assistant", "content": ""}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": fr}

        out = [_sse({**head, "choices": [choice(None, None, role=True)]})]
    else:
        head["object"] = "text_completion"

        def choice(text: str | None, fr: str | None, role: bool = False) -> dict[str, Any]:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": fr}

        out = []
    out += [_sse({**head, "choices": [choice(p, None)]}) for p in pieces]
    if finish is not None:
        out.append(_sse({**head, "choices": [choice(None, finish)]}))
    if usage is not None:
        prompt, completion, cached = usage
        body = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        out.append(_sse({**head, "choices": [], "usage": body}))
    return out


def _client_view(kind: StreamKind, events: list[bytes]) -> dict[str, Any]:
    objs = [orjson.loads(e[5:]) for e in events]
    text, roles, finishes, usages = [], 0, [], []
    for o in objs:
        for c in o["choices"]:
            if kind is CHAT:
                roles += "role" in c["delta"]
                text.append(c["delta"].get("content") or "")
            else:
                text.append(c["text"])
            if c["finish_reason"]:
                finishes.append(c["finish_reason"])
        if o.get("usage"):
            usages.append(o["usage"])
    heads = {(o["id"], o["created"], o["model"], o["object"]) for o in objs}
    return {
        "text": "".join(text),
        "roles": roles,
        "finishes": finishes,
        "usages": usages,
        "heads": heads,
    }


def _run(
    kind: StreamKind,
    pieces: list[str],
    breaks: list[int],
    *,
    prompt: int = 100,
    cached: int = 0,
    wants_usage: bool = True,
) -> tuple[dict[str, Any], StreamStitcher]:
    """Stream ``pieces``, breaking after each count in ``breaks``; resume each time."""
    stitcher = StreamStitcher(kind, client_wants_usage=wants_usage)
    body: dict[str, Any] = (
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000}
        if kind is CHAT
        else {"model": "m", "prompt": "once upon", "max_tokens": 1000}
    )
    sent_out: list[bytes] = []
    start = 0
    bounds = [*breaks, len(pieces)]
    for seg, end in enumerate(bounds):
        last = seg == len(bounds) - 1
        # the engine of this segment would produce everything left; it breaks at ``end``
        events = _engine(
            kind,
            f"r{seg}",
            pieces[start:end],
            finish="stop" if last else None,
            usage=(prompt + start, end - start, cached) if last else None,
        )
        for ev in events:
            out = stitcher.feed(ev)
            if out is not None:
                sent_out.append(out)
        if last:
            break
        progress = stitcher.progress()
        assert progress.text == "".join(pieces[:end])
        assert progress.num_tokens == end
        plan = plan_resumption(kind, body, progress, RESET, resumptions_made=seg, max_resumptions=9)
        assert plan.action is ResumeAction.CONTINUE, plan.reason
        assert plan.max_tokens_left == 1000 - end
        stitcher.start_continuation()
        start = end
    return _client_view(kind, sent_out), stitcher


@pytest.mark.parametrize("kind", [CHAT, COMPLETION])
def test_one_break_gives_one_seamless_stream(kind: StreamKind) -> None:
    pieces = ["The", " quick", " brown", " fox", " jumps", "."]
    view, stitcher = _run(kind, pieces, [3], prompt=100, cached=60)
    assert view["text"] == "".join(pieces)
    assert view["roles"] == (1 if kind is CHAT else 0)
    assert view["finishes"] == ["stop"]
    assert len(view["heads"]) == 1 and next(iter(view["heads"]))[0] == "r0"
    (usage,) = view["usages"]
    assert usage["prompt_tokens"] == 100  # the original prompt, not the continuation's
    assert usage["completion_tokens"] == 6
    assert usage["total_tokens"] == 106
    # the continuation's prompt was 100 + 3 tokens, 60 of them cached: 43 recomputed
    assert stitcher.wasted_prefill_tokens == 43
    assert stitcher.segments == 2


def test_usage_is_kept_for_accounting_when_the_client_did_not_ask() -> None:
    view, stitcher = _run(CHAT, ["a", "b", "c", "d"], [1, 2], wants_usage=False)
    assert view["usages"] == []
    assert view["text"] == "abcd"
    assert stitcher.usage()["completion_tokens"] == 4
    assert stitcher.usage()["prompt_tokens"] == 100


@settings(max_examples=50, deadline=None)
@given(
    kind=st.sampled_from([CHAT, COMPLETION]),
    pieces=st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=30),
    data=st.data(),
)
def test_stitched_text_is_prefix_plus_continuation(
    kind: StreamKind, pieces: list[str], data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(pieces)), max_size=3, unique=True))
    view, stitcher = _run(kind, pieces, sorted(cuts))
    assert view["text"] == "".join(pieces)  # nothing missing, nothing twice
    assert len(view["usages"]) == 1
    assert view["usages"][0]["completion_tokens"] == len(pieces)
    assert view["roles"] == (1 if kind is CHAT else 0)
    assert view["finishes"] == ["stop"]
    assert len(view["heads"]) == 1
    assert stitcher.segments == len(cuts) + 1


def _progress(text: str = "abc", n: int = 3, **kw: Any) -> StreamProgress:
    return StreamProgress(text=text, num_tokens=n, **kw)


CHAT_BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 10,
    "min_tokens": 5,
    "stream": True,
}


def test_chat_continuation_body() -> None:
    original = {**CHAT_BODY, "messages": list(CHAT_BODY["messages"])}
    original["stream_options"] = {"continuous_usage_stats": False}
    plan = plan_resumption(CHAT, original, _progress(), RESET, prompt_tokens=50)
    assert plan.action is ResumeAction.CONTINUE
    body = plan.body
    assert body is not None
    assert body["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "abc"},
    ]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 7 and body["min_tokens"] == 2
    assert body["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert plan.recompute_tokens_estimate == 53
    assert original["messages"] == CHAT_BODY["messages"]  # the original is not mutated
    assert original["stream_options"] == {"continuous_usage_stats": False}


def test_chat_that_was_already_continuing_appends_to_its_message() -> None:
    original = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Sure"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_completion_tokens": 8,
        "max_tokens": 100,
    }
    plan = plan_resumption(CHAT, original, _progress(", here"), RESET)
    assert plan.body is not None
    assert plan.body["messages"][-1] == {"role": "assistant", "content": "Sure, here"}
    assert len(plan.body["messages"]) == 2
    assert plan.body["max_completion_tokens"] == 5  # the newer key wins


def test_nothing_sent_yet_replays_the_original_messages() -> None:
    plan = plan_resumption(CHAT, CHAT_BODY, _progress("", 0), RESET)
    assert plan.body is not None and plan.body["messages"] == CHAT_BODY["messages"]
    assert "continue_final_message" not in plan.body


@pytest.mark.parametrize(
    ("prompt", "ids", "expected"),
    [
        ("Once", None, "Once upon"),
        (["Once"], None, ["Once upon"]),
        ([5, 6], [7, 8], [5, 6, 7, 8]),
        ([[5, 6]], [7, 8], [5, 6, 7, 8]),
    ],
)
def test_completion_continuation_prompt(prompt: Any, ids: list[int] | None, expected: Any) -> None:
    original = {"prompt": prompt, "max_tokens": 4}
    plan = plan_resumption(
        COMPLETION, original, _progress(" upon", 2), RESET, generated_token_ids=ids
    )
    assert plan.action is ResumeAction.CONTINUE and plan.body is not None
    assert plan.body["prompt"] == expected
    assert plan.body["max_tokens"] == 2


@pytest.mark.parametrize(
    ("body", "progress", "failure", "made", "action", "why"),
    [
        (CHAT_BODY, _progress(), FailureKind.CLIENT_ERROR, 0, ResumeAction.GIVE_UP, "not resumed"),
        (CHAT_BODY, _progress(), FailureKind.CANCELLED, 0, ResumeAction.GIVE_UP, "not resumed"),
        (CHAT_BODY, _progress(), RESET, 2, ResumeAction.GIVE_UP, "as often as allowed"),
        ({**CHAT_BODY, "n": 2}, _progress(), RESET, 0, ResumeAction.GIVE_UP, "choices"),
        ({"prompt": "x", "echo": True}, _progress(), RESET, 0, ResumeAction.GIVE_UP, "echo"),
        (
            {**CHAT_BODY, "response_format": {"type": "json_object"}},
            _progress(),
            RESET,
            0,
            ResumeAction.GIVE_UP,
            "structured",
        ),
        (CHAT_BODY, _progress(has_tool_calls=True), RESET, 0, ResumeAction.GIVE_UP, "tool"),
        (CHAT_BODY, _progress(overflowed=True), RESET, 0, ResumeAction.GIVE_UP, "too long"),
        ({"prompt": [1, 2]}, _progress(), RESET, 0, ResumeAction.GIVE_UP, "token ids"),
        (CHAT_BODY, _progress("x" * 10, 10), RESET, 0, ResumeAction.FINISH, "allowed"),
        (CHAT_BODY, _progress(finish_reason="stop"), RESET, 0, ResumeAction.FINISH, "finished"),
        (
            CHAT_BODY,
            _progress(usage_seen=True),
            FailureKind.CLIENT_ERROR,
            0,
            ResumeAction.FINISH,
            "",
        ),
        (CHAT_BODY, _progress(), FailureKind.TIMEOUT, 1, ResumeAction.CONTINUE, "timeout"),
        (CHAT_BODY, _progress(), FailureKind.SERVER_ERROR, 0, ResumeAction.CONTINUE, "server"),
    ],
)
def test_plan_table(
    body: dict[str, Any],
    progress: StreamProgress,
    failure: FailureKind,
    made: int,
    action: ResumeAction,
    why: str,
) -> None:
    kind = COMPLETION if "prompt" in body else CHAT
    plan = plan_resumption(kind, body, progress, failure, resumptions_made=made, max_resumptions=2)
    assert plan.action is action
    assert why in plan.reason
    assert (plan.body is not None) is (action is ResumeAction.CONTINUE)


def test_finish_plan_closes_the_stream_with_length_and_usage() -> None:
    stitcher = StreamStitcher(CHAT, client_wants_usage=True, prompt_tokens=40)
    for ev in _engine(CHAT, "r0", ["a", "b", "c"], finish=None):
        assert stitcher.feed(ev) == ev  # the first segment passes through untouched
    plan = plan_resumption(CHAT, {**CHAT_BODY, "max_tokens": 3}, stitcher.progress(), RESET)
    assert plan.action is ResumeAction.FINISH and plan.finish_reason == "length"
    view = _client_view(CHAT, stitcher.closing_events(plan.finish_reason))
    assert view["finishes"] == ["length"]
    assert view["usages"] == [{"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43}]
    assert view["heads"] == {("r0", 2, "model-of-r0", "chat.completion.chunk")}
    assert stitcher.closing_events("stop") == []  # already closed


def test_break_after_finish_only_adds_the_missing_usage() -> None:
    stitcher = StreamStitcher(COMPLETION, client_wants_usage=True)
    for ev in _engine(COMPLETION, "r0", ["x", "y"], finish="stop"):
        stitcher.feed(ev)
    plan = plan_resumption(COMPLETION, {"prompt": "p"}, stitcher.progress(), RESET)
    assert plan.action is ResumeAction.FINISH
    view = _client_view(COMPLETION, stitcher.closing_events(plan.finish_reason))
    assert view["finishes"] == [] and view["usages"][0]["completion_tokens"] == 2


def test_continuation_errors_and_comments_pass_through() -> None:
    stitcher = StreamStitcher(CHAT, client_wants_usage=True)
    stitcher.start_continuation()
    err = _sse({"error": {"message": "boom", "type": "server_error", "param": None, "code": 500}})
    assert stitcher.feed(err) == err
    assert stitcher.feed(b": keep-alive") == b": keep-alive"


def test_recording_is_bounded() -> None:
    stitcher = StreamStitcher(COMPLETION, client_wants_usage=False, max_events=5)
    for ev in _engine(COMPLETION, "r0", list("abcdefgh"), finish=None):
        stitcher.feed(ev)
    progress = stitcher.progress()
    assert progress.overflowed and progress.num_tokens == 5
    plan = plan_resumption(COMPLETION, {"prompt": "p"}, progress, RESET)
    assert plan.action is ResumeAction.GIVE_UP


@pytest.mark.parametrize("kind", [CHAT, COMPLETION])
@pytest.mark.parametrize("cut", [1, 7, 19])
def test_continuation_resumes_the_emulated_engine_token_for_token(
    kind: StreamKind, cut: int
) -> None:
    """The planned body, parsed by the emulated engine, is the original context plus the
    tokens already sent, so the deterministic engine continues exactly where it broke."""
    from inferplane.engine.generation import TokenGenerator
    from inferplane.engine.protocol import ApiKind, parse_generation
    from inferplane.tokenizer import get_tokenizer

    tok = get_tokenizer()
    api = ApiKind.CHAT if kind is CHAT else ApiKind.COMPLETION
    original: dict[str, Any] = {"model": "m", "max_tokens": 24, "stream": True}
    if kind is CHAT:
        original["messages"] = [{"role": "user", "content": "Tell me about the sea, please."}]
    else:
        original["prompt"] = "The sea, at dawn, is"

    def prompt_ids(body: dict[str, Any]) -> list[int]:
        req = parse_generation(body, api, served_model="m", max_model_len=4096, tokenizer=tok)
        return list(req.prompt_token_ids)

    first = prompt_ids(original)
    full = TokenGenerator(10_000).generate(first, 24, ignore_eos=True)
    decoder = tok.stream_decoder(first[-1])
    pieces = [decoder.push(t) for t in full[:cut]]
    progress = StreamProgress(text="".join(pieces), num_tokens=cut)
    plan = plan_resumption(kind, original, progress, RESET)
    assert plan.action is ResumeAction.CONTINUE and plan.body is not None
    resumed = prompt_ids(dict(plan.body))
    assert resumed == first + full[:cut]
    rest = TokenGenerator(10_000).generate(resumed, plan.body["max_tokens"], ignore_eos=True)
    assert rest == full[cut:]
