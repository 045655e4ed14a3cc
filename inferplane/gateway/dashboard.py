"""The live dashboard page: ``GET /dashboard`` serves one static HTML file (package data).

The page does all its work in the browser: it polls ``/v1/stats`` and ``/metrics`` and redraws
the fleet (each endpoint's model, GPU, state, queue, KV use), cost per successful task and
goodput over time, rejects and retries by reason and the top workflows by spend. The gateway
only serves the file, so the page costs nothing while nobody looks at it. Wiring:
``setup_dashboard(app)``.
"""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

__all__ = ["DASHBOARD_PATH", "dashboard_html", "setup_dashboard"]

DASHBOARD_PATH = "/dashboard"


@functools.cache
def dashboard_html() -> bytes:
    """The page, read once from the package."""
    return (resources.files("inferplane.gateway") / "static" / "dashboard.html").read_bytes()


async def _dashboard(request: web.Request) -> web.Response:
    return web.Response(
        body=dashboard_html(),
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )


def setup_dashboard(app: web.Application) -> None:
    """Serve the dashboard at ``/dashboard``."""
    app.router.add_get(DASHBOARD_PATH, _dashboard)
