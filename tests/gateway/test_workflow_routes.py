"""The workflow routes of an in-process gateway (what ``inferplane up`` serves): the ledger is
readable at ``GET /v1/workflows/{id}``, and ``POST .../end`` closes it in the accountant and
in admission's ledger alike."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from tests.gateway.fakes import fake_engines, fleet_config, running_gateway

CHAT = {"model": "m", "messages": [{"role": "user", "content": "step"}]}


async def _call(s: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with s.request(method, url, **kw) as r:
        return r.status, orjson.loads(await r.read())


async def test_workflow_is_shown_and_ended_everywhere() -> None:
    async with fake_engines(1) as engines, running_gateway(fleet_config(engines)) as (gw, url):
        headers = {"X-Workflow-Id": "wf-1", "X-Workflow-Steps": "5"}
        async with aiohttp.ClientSession() as s:
            for step in (1, 2):
                status, _ = await _call(
                    s, "POST", url + "/v1/chat/completions", data=orjson.dumps(CHAT),
                    headers={**headers, "X-Workflow-Step": str(step)},
                )  # fmt: skip
                assert status == 200
            status, body = await _call(s, "GET", url + "/v1/workflows/wf-1")
            assert status == 200
            assert body["local"]["steps_done"] == 2
            assert gw.gate.core.workflows.get("wf-1") is not None

            status, body = await _call(
                s, "POST", url + "/v1/workflows/wf-1/end", data=b'{"outcome": "success"}'
            )
            assert (status, body["closed"]) == (200, True)
            assert gw.gate.core.workflows.get("wf-1") is None
            status, body = await _call(s, "GET", url + "/v1/workflows/wf-1")
            assert status == 404
            assert body["error"]["code"] == "workflow_not_found"
            status, _ = await _call(s, "GET", url + "/v1/workflows/never-seen")
            assert status == 404
