"""The workflow routes of an in-process gateway (what ``inferplane up`` serves): the ledger is
readable at ``GET /v1/workflows/{id}``, and ``POST .../end`` closes it in the accountant and
in admission's ledger alike; a workflow id is its tenant's own (another tenant's workflow of
the same id is another workflow, which it can neither read nor end)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from inferplane.config import hash_api_key
from inferplane.core.types import scoped_workflow_id
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
            scoped = scoped_workflow_id(gw.config.gateway.auth.anonymous_tenant, "wf-1")
            assert gw.gate.core.workflows.get(scoped) is not None

            status, body = await _call(
                s, "POST", url + "/v1/workflows/wf-1/end", data=b'{"outcome": "success"}'
            )
            assert (status, body["closed"]) == (200, True)
            assert gw.gate.core.workflows.get(scoped) is None
            status, body = await _call(s, "GET", url + "/v1/workflows/wf-1")
            assert status == 404
            assert body["error"]["code"] == "workflow_not_found"
            status, _ = await _call(s, "GET", url + "/v1/workflows/never-seen")
            assert status == 404


async def test_two_tenants_with_one_workflow_id_keep_two_workflows() -> None:
    auth = {
        "mode": "api_keys",
        "keys": [
            {"key_sha256": hash_api_key("sk-acme"), "tenant": "acme"},
            {"key_sha256": hash_api_key("sk-umbrella"), "tenant": "umbrella"},
        ],
    }
    acme = {"Authorization": "Bearer sk-acme"}
    umbrella = {"Authorization": "Bearer sk-umbrella"}
    async with (
        fake_engines(1) as engines,
        running_gateway(fleet_config(engines, auth=auth)) as (gw, url),
        aiohttp.ClientSession() as s,
    ):
        for headers, steps in ((acme, 3), (umbrella, 1)):
            for step in range(steps):
                status, _ = await _call(
                    s, "POST", url + "/v1/chat/completions", data=orjson.dumps(CHAT),
                    headers={**headers, "X-Workflow-Id": "job-1", "X-Workflow-Step": str(step)},
                )  # fmt: skip
                assert status == 200
        # each tenant sees its own steps under the same id
        for headers, steps in ((acme, 3), (umbrella, 1)):
            status, body = await _call(s, "GET", url + "/v1/workflows/job-1", headers=headers)
            assert (status, body["workflow_id"]) == (200, "job-1")
            assert body["local"]["steps_done"] == steps
        # umbrella ends its own job-1; acme's stays open, in admission and in accounting
        status, body = await _call(
            s, "POST", url + "/v1/workflows/job-1/end", data=b'{"outcome": "failure"}',
            headers=umbrella,
        )  # fmt: skip
        assert (status, body["closed"]) == (200, True)
        status, body = await _call(s, "GET", url + "/v1/workflows/job-1", headers=acme)
        assert (status, body["local"]["steps_done"]) == (200, 3)
        assert gw.gate.core.workflows.get(scoped_workflow_id("acme", "job-1")) is not None
        assert gw.gate.core.workflows.get(scoped_workflow_id("umbrella", "job-1")) is None
        status, body = await _call(
            s, "POST", url + "/v1/workflows/job-1/end", data=b'{"outcome": "failure"}',
            headers=umbrella,
        )  # fmt: skip
        assert (status, body["error"]["code"]) == (404, "workflow_not_found")
        snap = gw.recorder.snapshot(gw.clock())
        assert snap.tasks["failure"] == 1  # umbrella's one-step workflow, not acme's
