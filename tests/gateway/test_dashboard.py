"""The live dashboard: served by the gateway, and in headless Chromium against ``inferplane up
--load mixed`` its numbers match ``/v1/stats`` (read just before and just after the page).

Chromium runs ``--dump-dom`` with a virtual time budget: the page's poll timers fire, its
fetches go to the real gateway over loopback, and the DOM after a few polls is printed. Every
number on the page carries ``data-field``; the test parses those and compares.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from inferplane.gateway.dashboard import DASHBOARD_PATH, dashboard_html, setup_dashboard

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
)  # fmt: skip


async def test_dashboard_is_served_as_html_without_caching() -> None:
    app = web.Application()
    setup_dashboard(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{port}{DASHBOARD_PATH}") as r,
        ):
            body = await r.read()
            assert r.headers["Content-Type"].startswith("text/html")
            assert r.headers["Cache-Control"] == "no-store"
    finally:
        await runner.cleanup()
    assert body == dashboard_html()
    text = body.decode()
    for needle in ('fetch("/v1/stats"', 'id="endpoints"', 'id="rejects"', 'id="workflows"'):
        assert needle in text


class _Fields(HTMLParser):
    """``data-field`` -> text of the element (and ``data-value`` when present)."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}
        self.values: dict[str, str] = {}
        self.body: dict[str, str] = {}
        self.last_stats = ""
        self._open: list[str | None] = []
        self._in_last = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = {k: v or "" for k, v in a.items()}
        self._in_last = tag == "script" and a.get("id") == "last-stats"
        field = a.get("data-field")
        if field is not None and a.get("data-value") is not None:
            self.values[field] = a["data-value"] or ""
        if tag in ("td", "b"):
            self._open.append(field)
            if field is not None:
                self.fields[field] = ""

    def handle_endtag(self, tag: str) -> None:
        self._in_last = False
        if tag in ("td", "b") and self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if self._in_last:
            self.last_stats += data
        if self._open and self._open[-1] is not None:
            self.fields[self._open[-1]] += data


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        data: bytes = r.read()
        return data


@contextlib.contextmanager
def _inferplane_up() -> Iterator[str]:
    cmd = [sys.executable, "-m", "inferplane.cli", "up", "--port", "0", "--load", "mixed",
           "--rate", "6", "--time-scale", "4"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"inferplane is up.*?(http://127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url is not None, "inferplane up did not start"
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def _page_url(gateway: str) -> Iterator[str]:
    """The gateway's own /dashboard; until it is wired, the same page beside a pass-through."""
    try:
        _get(gateway + DASHBOARD_PATH)
        yield gateway + DASHBOARD_PATH
        return
    except urllib.error.HTTPError:
        pass
    import asyncio
    import threading

    async def relay(request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as s, s.get(gateway + request.path) as r:
            ctype = r.headers.get("Content-Type", "application/json").split(";")[0]
            return web.Response(body=await r.read(), status=r.status, content_type=ctype)

    app = web.Application()
    setup_dashboard(app)
    app.router.add_get("/v1/stats", relay)
    app.router.add_get("/metrics", relay)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}{DASHBOARD_PATH}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def _dump_dom(url: str) -> str:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             "--virtual-time-budget=4000", "--dump-dom", url + "?every_ms=500"],
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _money(text: str) -> float:
    return float(text.lstrip("$"))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package")
def test_dashboard_in_chromium_matches_v1_stats() -> None:
    with _inferplane_up() as gateway, _page_url(gateway) as page:
        time.sleep(4.0)  # let the load produce finished tasks and spend
        before: dict[str, Any] = json.loads(_get(gateway + "/v1/stats"))
        dom = _dump_dom(page)
        after: dict[str, Any] = json.loads(_get(gateway + "/v1/stats"))
        metrics_after = _get(gateway + "/metrics").decode()
    parsed = _Fields()
    parsed.feed(dom)
    f = parsed.fields
    assert int(parsed.body.get("data-polls", "0")) >= 2, "the page did not update itself"
    # The page keeps the /v1/stats body it drew last: a real one, read between ours ...
    shown: dict[str, Any] = json.loads(parsed.last_stats)
    a0, a, a1 = before["accounting"], shown["accounting"], after["accounting"]
    assert float(parsed.body["data-at-s"]) == a["at_s"]
    assert a0["at_s"] <= a["at_s"] <= a1["at_s"]
    for key in ("num_requests", "num_rejected", "fleet_spend_usd", "gpu_seconds"):
        assert a0[key] <= a[key] <= a1[key]
    assert a0["tasks"]["success"] <= a["tasks"]["success"] <= a1["tasks"]["success"]
    assert a["tasks"]["success"] > 0, "the load produced no successful task"
    # ... and every number on the page is that body's, exactly.
    assert int(f["accounting.num_requests"]) == a["num_requests"]
    assert int(f["accounting.num_rejected"]) == a["num_rejected"]
    assert int(f["accounting.tasks.success"]) == a["tasks"]["success"]
    assert int(f["accounting.tasks.failure"]) == a["tasks"]["failure"]
    assert int(f["in_flight"]) == shown["in_flight"]
    assert f["accounting.fleet_spend_usd"] == f"${a['fleet_spend_usd']:.6f}"
    cpt = a["cost_per_successful_task_usd"]
    assert f["accounting.cost_per_successful_task_usd"] == f"${cpt:.6f}"
    # The demo fleet: six fixed engines plus the autoscaler's slots.
    assert len(shown["endpoints"]) == len(after["endpoints"]) >= 6
    for e in shown["endpoints"]:
        p = f"endpoint.{e['name']}."
        static = next(x for x in after["endpoints"] if x["name"] == e["name"])
        for key in ("gpu", "models", "price_per_hour_usd"):
            assert e[key] == static[key]
        assert f[p + "name"] == e["name"]
        assert f[p + "gpu"] == e["gpu"]
        assert f[p + "models"] == ",".join(e["models"])
        assert float(f[p + "price_per_hour_usd"]) == pytest.approx(e["price_per_hour_usd"])
        assert f[p + "state"] == e["state"]
        for key in ("in_flight", "num_running", "num_waiting"):
            assert int(f[p + key]) == e[key]
        assert float(parsed.values[p + "kv_usage"]) == e["kv_usage"]
    spend = {s["name"]: s for s in a["endpoints"]}
    for name, s in spend.items():
        assert f[f"endpoint.{name}.spend_usd"] == f"${s['spend_usd']:.6f}"
    # Top workflows by spend, in order, with their costs.
    workflows = sorted(a["top_workflows"], key=lambda w: -w["cost_usd"])
    assert workflows, "no workflow in /v1/stats"
    for w in workflows:
        assert f[f"workflow.{w['workflow_id']}.cost_usd"] == f"${w['cost_usd']:.6f}"
        assert f[f"workflow.{w['workflow_id']}.outcome"] == w["outcome"]
    # Rejects by reason never exceed what /metrics counts afterwards.
    for key, text in f.items():
        if key.startswith("rejects.") and not key.endswith(".reason"):
            reason = key[len("rejects.") :]
            m = re.search(rf'inferplane_rejects_total{{reason="{re.escape(reason)}"}} (\S+)',
                          metrics_after)  # fmt: skip
            assert m is not None and int(text) <= float(m.group(1))
