"""Critical calls are never routed to an endpoint predicted to miss their budget while
another meets it (core/filters.py ``prefer_meeting_budget``, wired in core/routing.py).

The live overload bench traced critical misses to long answers sent to the slower, cheaper
A100 replica (it won on cost and load with a latency score of 0), where they decoded past
their 30 s deadline while the H100 would have met it.
"""

from __future__ import annotations

import random

from inferplane.core.filters import prefer_meeting_budget
from inferplane.core.predictor import LatencyPredictor
from inferplane.core.routing import route
from inferplane.core.routing_config import EndpointPrior, PredictorConfig
from inferplane.core.types import PriorityClass
from tests.core.routing_helpers import call, view

CRIT, STD = PriorityClass.CRITICAL, PriorityClass.STANDARD


def test_only_critical_latency_bound_calls_drop_missing_endpoints() -> None:
    views = [view("fast"), view("slow")]
    meets = {"fast": True, "slow": False}
    kept, refused = prefer_meeting_budget(call(priority=CRIT, deadline_s=30.0), views, meets)
    assert [v.name for v in kept] == ["fast"]
    assert refused and refused[0][0] == "slow" and "misses the budget" in refused[0][1]
    for c in (call(priority=STD, deadline_s=30.0), call(priority=CRIT)):  # standard; no budget
        assert [v.name for v in prefer_meeting_budget(c, views, meets)[0]] == ["fast", "slow"]
    none_meet = {"fast": False, "slow": False}  # nothing meets: rank them all, best effort
    kept, refused = prefer_meeting_budget(call(priority=CRIT, deadline_s=30.0), views, none_meet)
    assert len(kept) == 2 and refused == []
    uses: dict[str, float | None] = {"fast": 1.1, "slow": 2.0}  # ...or the least late
    kept, _ = prefer_meeting_budget(call(priority=CRIT, deadline_s=30.0), views, none_meet, uses)
    assert [v.name for v in kept] == ["fast"]


def _predictor() -> LatencyPredictor:
    priors = {
        "h100": EndpointPrior(decode_base_s=0.02, decode_per_seq_s=0.0, decode_full_kv_s=0.0),
        "a100": EndpointPrior(decode_base_s=0.06, decode_per_seq_s=0.0, decode_full_kv_s=0.0),
    }
    return LatencyPredictor(PredictorConfig(priors=priors))


def test_a_long_critical_answer_goes_where_it_meets_its_deadline() -> None:
    # 600 tokens: 12 s on the H100, 36 s on the cheaper, idle A100 (deadline 30 s).
    fast = view("fast", gpu="h100", price=12.0, running=20, in_flight=20)
    slow = view("slow", gpu="a100", price=1.0)
    pred = _predictor()
    crit = call(priority=CRIT, deadline_s=30.0, max_tokens=600)
    decision = route(crit, [fast, slow], 0.0, random.Random(0), predictor=pred)
    assert [r.name for r in decision.ranked] == ["fast"]
    std = call(priority=STD, deadline_s=30.0, max_tokens=600)
    decision = route(std, [fast, slow], 0.0, random.Random(0), predictor=pred)
    assert {r.name for r in decision.ranked} == {"fast", "slow"}  # standard: ranked as before


def test_critical_calls_go_only_near_the_best_prediction() -> None:
    views = [view("fast"), view("slow"), view("close")]
    meets = {"fast": True, "slow": True, "close": True}
    uses: dict[str, float | None] = {"fast": 0.5, "slow": 0.9, "close": 0.59}
    c = call(priority=CRIT, deadline_s=30.0)
    kept, refused = prefer_meeting_budget(c, views, meets, uses)
    assert [v.name for v in kept] == ["fast", "close"]  # 0.59 <= 1.2 x 0.5 < 0.9
    assert [r[0] for r in refused] == ["slow"]
    std = call(priority=STD, deadline_s=30.0)
    assert len(prefer_meeting_budget(std, views, meets, uses)[0]) == 3
