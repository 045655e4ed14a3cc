"""The baseline least-loaded router: filters and ordering."""

from __future__ import annotations

import random

from inferplane.core.routing import least_loaded as route
from inferplane.core.types import EndpointState
from tests.core.routing_helpers import call, view


def test_least_loaded_first_and_filters() -> None:
    views = [
        view("busy", in_flight=5),
        view("idle"),
        view("other-model", model="x"),
        view("ejected", state=EndpointState.EJECTED),
        view("short", max_len=8),
        view("queued", waiting=3),
    ]
    decision = route(call(prompt=10), views, 0.0, random.Random(1))
    assert decision.names() == ("idle", "queued", "busy")
    assert decision.primary == "idle"


def test_no_candidate_gives_reason() -> None:
    decision = route(call(model="nope"), [view("a")], 0.0, random.Random(1))
    assert decision.primary is None
    assert "nope" in decision.reason


def test_same_seed_same_tie_break() -> None:
    views = [view(f"e{i}") for i in range(6)]
    first = route(call(), views, 0.0, random.Random(7)).names()
    again = route(call(), views, 0.0, random.Random(7)).names()
    assert first == again
    assert sorted(first) == sorted(v.name for v in views)
