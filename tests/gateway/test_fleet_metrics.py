"""Fleet series at scrape time: success per dollar and utilisation agree with /v1/stats."""

from __future__ import annotations

import re

import aiohttp
import orjson

from inferplane.gateway.app import Gateway, start_server
from tests.gateway.fakes import fake_engines, fleet_config


def _value(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    assert m is not None, f"{name}{labels} missing"
    return float(m.group(1))


async def test_success_per_dollar_and_endpoint_load_are_exported() -> None:
    async with fake_engines(2) as engines:
        gateway = Gateway(fleet_config(engines))
        app = gateway.build_app()
        runner, port = await start_server(app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as s:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                for _ in range(4):
                    async with s.post(url + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200
                async with s.get(url + "/v1/stats") as r:
                    before = orjson.loads(await r.read())["accounting"]
                async with s.get(url + "/metrics") as r:
                    text = await r.text()
                async with s.get(url + "/v1/stats") as r:
                    after = orjson.loads(await r.read())["accounting"]
        finally:
            await runner.cleanup()
    # Spend only grows and no call finished in between: the scrape lies between the reads.
    spd = _value(text, "inferplane_success_per_dollar")
    assert after["success_per_dollar"] <= spd <= before["success_per_dollar"]
    assert spd > 0
    ratio = _value(text, "inferplane_utilisation_ratio")
    assert 0.0 < ratio <= 1.0
    for e in engines:
        assert 0.0 <= _value(text, "inferplane_endpoint_kv_usage", f'{{endpoint="{e.name}"}}') <= 1
        assert _value(text, "inferplane_endpoint_waiting", f'{{endpoint="{e.name}"}}') >= 0
        busy = _value(text, "inferplane_endpoint_busy_ratio", f'{{endpoint="{e.name}"}}')
        assert 0.0 <= busy <= 1.0
