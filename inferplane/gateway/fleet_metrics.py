"""Fleet-level Prometheus series computed at scrape time from the accountant and the tracker.

``inferplane_success_per_dollar``, ``inferplane_utilisation_ratio`` (busy spend over fleet
spend) and per-endpoint load as the gateway last scraped it (``inferplane_endpoint_waiting``,
``..._running``, ``..._kv_usage``, ``..._busy_ratio``). A custom collector reads one snapshot
per scrape, so nothing is added to the request path. Wiring: ``setup_fleet_metrics(app,
gateway)`` registers it in the gateway's registry when the app starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from inferplane.gateway.app import Gateway

__all__ = ["FleetCollector", "setup_fleet_metrics"]


class FleetCollector(Collector):
    """Yields the fleet series from the gateway's state at collection time."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gw = self._gateway
        now = gw.clock()
        snap = gw.recorder.snapshot(now)
        yield GaugeMetricFamily(
            "inferplane_success_per_dollar",
            "Successful tasks per USD of fleet spend since start.",
            value=snap.success_per_dollar or 0.0,
        )
        spend = snap.fleet_spend_usd
        yield GaugeMetricFamily(
            "inferplane_utilisation_ratio",
            "Busy spend over fleet spend (idle and warming replicas lower it).",
            value=snap.busy_usd / spend if spend > 0 else 0.0,
        )
        families = {
            key: GaugeMetricFamily(f"inferplane_endpoint_{key}", text, labels=["endpoint"])
            for key, text in (
                ("waiting", "Calls waiting at the engine (last scrape)."),
                ("running", "Calls running at the engine (last scrape)."),
                ("kv_usage", "KV-cache use 0..1 (last scrape)."),
                ("busy_ratio", "Share of time with at least one call in flight."),
            )
        }
        for row in gw.tracker.stats(now):
            name = str(row["name"])
            families["waiting"].add_metric([name], float(row["num_waiting"]))  # type: ignore[arg-type]
            families["running"].add_metric([name], float(row["num_running"]))  # type: ignore[arg-type]
            families["kv_usage"].add_metric([name], float(row["kv_usage"]))  # type: ignore[arg-type]
        for ep in snap.endpoints:
            families["busy_ratio"].add_metric([ep.name], ep.busy_share)
        yield from families.values()


def setup_fleet_metrics(app: web.Application, gateway: Gateway) -> None:
    """Register the collector in the gateway's registry once the gateway has started."""

    async def on_startup(app: web.Application) -> None:
        gateway.recorder.metrics.registry.register(FleetCollector(gateway))

    app.on_startup.append(on_startup)
