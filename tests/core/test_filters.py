"""Routing filters, table-driven: each endpoint kept or refused with a reason."""

from __future__ import annotations

import pytest

from inferplane.core.filters import apply_filters, prefer_warm
from inferplane.core.types import EndpointState, EndpointView
from tests.core.routing_helpers import call, view

CASES: list[tuple[str, EndpointView, str | None]] = [
    ("ready", view("a"), None),
    ("warming", view("a", state=EndpointState.WARMING), None),
    ("other model", view("a", model="x"), "does not serve 'm'"),
    ("cold", view("a", state=EndpointState.COLD), "state cold"),
    ("draining", view("a", state=EndpointState.DRAINING), "state draining"),
    ("ejected", view("a", state=EndpointState.EJECTED), "state ejected"),
    ("context too short", view("a", max_len=1000), "exceeds context 1000"),
    ("context just fits", view("a", max_len=1001), None),
]


@pytest.mark.parametrize(("label", "endpoint", "reason"), CASES, ids=[c[0] for c in CASES])
def test_stage_one_filters(label: str, endpoint: EndpointView, reason: str | None) -> None:
    kept, refused = apply_filters(call(prompt=1000), [endpoint])
    if reason is None:
        assert [v.name for v in kept] == ["a"] and refused == []
    else:
        assert kept == []
        assert refused[0][0] == "a" and reason in refused[0][1]


def test_excluded_endpoints_are_refused() -> None:
    kept, refused = apply_filters(call(), [view("a"), view("b")], exclude={"a"})
    assert [v.name for v in kept] == ["b"]
    assert refused == [("a", "excluded (already tried)")]


WARM_CASES = [
    # (budget?, ready meets budget?, warming kept?)
    (True, True, False),
    (True, False, True),
    (False, True, True),
]


@pytest.mark.parametrize(("budget", "ready_meets", "warming_kept"), WARM_CASES)
def test_prefer_warm(budget: bool, ready_meets: bool, warming_kept: bool) -> None:
    views = [view("ready"), view("warm", state=EndpointState.WARMING)]
    c = call(ttft_budget_s=1.0 if budget else None)
    kept, refused = prefer_warm(c, views, {"ready": ready_meets, "warm": True})
    assert ("warm" in [v.name for v in kept]) is warming_kept
    assert "ready" in [v.name for v in kept]
    assert bool(refused) is not warming_kept
