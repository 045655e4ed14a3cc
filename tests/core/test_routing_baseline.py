"""The baseline least-loaded router (kept for comparison): filters and ordering."""

from __future__ import annotations

import random

from inferplane.core.routing import least_loaded as route
from inferplane.core.types import (
    CallContext,
    EndpointInfo,
    EndpointLoad,
    EndpointState,
    EndpointView,
    EngineKind,
    PriorityClass,
)


def _view(
    name: str,
    *,
    model: str = "m",
    state: EndpointState = EndpointState.READY,
    in_flight: int = 0,
    waiting: int = 0,
    max_len: int | None = None,
) -> EndpointView:
    info = EndpointInfo(
        name, f"http://{name}", EngineKind.VLLM, (model,), "h100", 2.5, "r", max_model_len=max_len
    )
    return EndpointView(info, state, EndpointLoad(num_waiting=waiting), in_flight=in_flight)


def _call(model: str = "m", prompt: int = 10) -> CallContext:
    return CallContext("r1", "t", model, PriorityClass.STANDARD, 0.0, prompt, 16)


def test_least_loaded_first_and_filters() -> None:
    views = [
        _view("busy", in_flight=5),
        _view("idle"),
        _view("other-model", model="x"),
        _view("ejected", state=EndpointState.EJECTED),
        _view("short", max_len=8),
        _view("queued", waiting=3),
    ]
    decision = route(_call(), views, 0.0, random.Random(1))
    assert decision.names() == ("idle", "queued", "busy")
    assert decision.primary == "idle"


def test_no_candidate_gives_reason() -> None:
    decision = route(_call(model="nope"), [_view("a")], 0.0, random.Random(1))
    assert decision.primary is None
    assert "nope" in decision.reason


def test_same_seed_same_tie_break() -> None:
    views = [_view(f"e{i}") for i in range(6)]
    first = route(_call(), views, 0.0, random.Random(7)).names()
    again = route(_call(), views, 0.0, random.Random(7)).names()
    assert first == again
    assert sorted(first) == sorted(v.name for v in views)
