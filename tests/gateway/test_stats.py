"""/metrics and /v1/stats of a live gateway: every exported series is documented, and the
admission, cache and state sections are present."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import orjson

from tests.gateway.fakes import fake_engines, fleet_config, running_gateway

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_every_gateway_metric_is_documented_and_stats_have_sections() -> None:
    async with (
        fake_engines(1) as engines,
        running_gateway(fleet_config(engines)) as (_, url),
        aiohttp.ClientSession() as s,
    ):
        async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
        async with s.get(url + "/metrics") as r:
            text = await r.text()
        async with s.get(url + "/v1/stats") as r:
            stats = orjson.loads(await r.read())
    names = set(re.findall(r"^# TYPE (inferplane_\w+) (\w+)", text, re.MULTILINE))
    documented = DOCS.read_text()
    missing = sorted(
        n for n, _ in names
        if not n.endswith("_created")
        and f"`{n}`" not in documented and f"`{n}_total`" not in documented
    )  # fmt: skip
    assert len(names) > 20 and not missing, missing
    assert 'inferplane_state_mode{mode="local"} 1.0' in text
    assert stats["admission"]["admitted"]["standard"] == 1
    assert stats["cache"]["lookups"] and stats["state"]["backend"] == "memory"
