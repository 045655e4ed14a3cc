"""What the gateway reports about itself: the ``/metrics`` scrape and the ``/v1/stats`` body.

Both read the live components (tracker, router, recorder, admission gate, response cache,
shared state) at request time, so the request path pays nothing for them. Kept apart from
the app so the app stays about calls.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from inferplane.core.state import StoreMode
from inferplane.state.resilient import ResilientStore

if TYPE_CHECKING:
    from inferplane.gateway.app import Gateway

__all__ = ["render_metrics", "state_stats", "stats_body"]


def render_metrics(gw: Gateway) -> bytes:
    """Refresh the scrape-time gauges, then render the registry."""
    now = gw.clock()
    t = gw.tracker
    metrics = gw.recorder.metrics
    metrics.refresh_endpoints((n, t.state(n), t.in_flight(n)) for n in t.names())
    metrics.refresh_routing(gw.router.kv_event_status(), gw.router.prefix_stats())
    metrics.refresh_admission(gw.gate.depth())
    metrics.refresh_cache(gw.cache.stats())
    st = state_stats(gw)
    metrics.refresh_state(
        st["mode"],
        (m.value for m in StoreMode),
        st["degradations"],
        (st["local_ops"], st["reconciles"], st["journal_size"]),
    )
    gw.recorder.refresh_spend(now)
    gw.gate.poll()  # a scrape is a moment to let queued calls in, too
    return metrics.render()


def state_stats(gw: Gateway) -> dict[str, Any]:
    """The shared state's mode and counters (zeros for the in-process store)."""
    store = gw.state
    if isinstance(store, ResilientStore):
        s = store.stats()
        return {
            "backend": gw.config.state.backend.value,
            "mode": s.mode.value,
            "degradations": dict(s.degradations),
            "local_ops": s.local_ops,
            "reconciles": s.reconciles,
            "replayed": s.replayed,
            "journal_size": s.journal_size,
            "journal_dropped": s.journal_dropped,
        }
    return {
        "backend": gw.config.state.backend.value,
        "mode": store.mode.value,
        "degradations": {},
        "local_ops": 0,
        "reconciles": 0,
        "replayed": 0,
        "journal_size": 0,
        "journal_dropped": 0,
    }


def stats_body(gw: Gateway) -> dict[str, Any]:
    now = gw.clock()
    return {
        "in_flight": gw.in_flight,
        "endpoints": gw.tracker.stats(now),
        "routing": gw.router.stats(),
        # A plain dict, not the dataclass: orjson reads a dataclass's fields from its
        # ``__dict__``/slots, which a mypyc-compiled core (bench/gateway_compile.py) lacks.
        "accounting": dataclasses.asdict(gw.recorder.snapshot(now)),
        "admission": gw.gate.snapshot(),
        "cache": gw.cache.stats(),
        "state": state_stats(gw),
        "reliability": gw.proxy.reliability.stats(),
    }
