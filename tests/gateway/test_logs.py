"""Request logs are JSON lines with the request's identity and no prompt text."""

from __future__ import annotations

import json
import logging

import pytest

from inferplane.gateway.logs import JsonFormatter
from tests.gateway.fakes import fake_engines, fleet_config, running_gateway
from tests.gateway.test_app import CHAT, _post


async def test_request_log_line(caplog: pytest.LogCaptureFixture) -> None:
    secret = "my secret prompt text"
    body = {**CHAT, "messages": [{"role": "user", "content": secret}]}
    async with fake_engines(1) as engines, running_gateway(fleet_config(engines)) as (_, url):
        with caplog.at_level(logging.INFO, logger="inferplane.gateway.request"):
            status, headers, _ = await _post(
                url + "/v1/chat/completions", body, {"X-Request-Id": "req-42"}
            )
    assert status == 200
    records = [r for r in caplog.records if r.name == "inferplane.gateway.request"]
    assert len(records) == 1
    line = json.loads(JsonFormatter().format(records[0]))
    assert line["request_id"] == "req-42" == headers["X-Request-Id"]
    assert line["tenant"] == "anonymous" and line["endpoint"] == "e0"
    assert line["status"] == 200 and line["route"]
    assert line["cost_usd"] == pytest.approx(float(headers["X-Inferplane-Cost-Usd"]))
    assert secret not in json.dumps(line)
