"""Property-based fuzzing of the front door: malformed requests get clean OpenAI errors.

Thousands of requests with broken bodies, wrong field types, odd headers and content types;
each must come back with an expected status and, when refused, OpenAI's error JSON. Never a
500 from the gateway's own code; and after all of it the gateway is healthy with nothing left
in flight.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferplane.config import hash_api_key
from inferplane.core.types import PriorityClass
from tests.gateway.fakes import BackgroundLoop, fake_engines, fleet_config, running_gateway

ALLOWED = {200, 400, 401, 404, 405, 413, 415, 422, 429, 502, 503, 504}
KEY = "sk-fuzz"


class Live:
    def __init__(self) -> None:
        self.bg = BackgroundLoop()
        self._engines_cm = fake_engines(1, num_tokens=2)
        engines = self.bg.run(self._engines_cm.__aenter__())
        auth = {"mode": "api_keys", "keys": [{"key_sha256": hash_api_key(KEY), "tenant": "t"}]}
        cfg = fleet_config(engines, auth=auth, max_body_bytes=4096, log_requests=False)
        self._gw_cm = running_gateway(cfg)
        self.gateway, url = self.bg.run(self._gw_cm.__aenter__())
        self.port = int(url.rsplit(":", 1)[1])
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        self.engine = engines[0]
        _assert_healthy(self)  # one good call first: what exists afterwards is the baseline
        self.baseline_tasks = self.num_tasks()

    def num_tasks(self) -> int:
        """Tasks alive on the gateway's loop (its background loops, the servers' handlers)."""

        async def count() -> int:
            return len(asyncio.all_tasks())

        return self.bg.run(count()) - 1  # not counting the counter itself

    def request(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        for _ in range(2):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        raise AssertionError("gateway connection kept failing")

    def close(self) -> None:
        self.conn.close()
        self.bg.run(self._gw_cm.__aexit__(None, None, None))
        self.bg.run(self._engines_cm.__aexit__(None, None, None))
        self.bg.close()


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    g = Live()
    yield g
    g.close()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = ["model", "messages", "prompt", "stream", "stream_options", "max_tokens", "n",
          "temperature", "max_completion_tokens"]  # fmt: skip


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "json", "mutated", "big"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    if kind == "big":
        return b'{"model": "m", "prompt": "' + b"a" * draw(st.integers(4000, 9000)) + b'"}'
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        body[name] = draw(json_values)
    return json.dumps(body).encode()


header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=0, max_size=16)


@st.composite
def headers(draw: st.DrawFn) -> dict[str, str]:
    out: dict[str, str] = {}
    auth = draw(st.sampled_from(["good", "bad", "none"]))
    if auth == "good":
        out["Authorization"] = f"Bearer {KEY}"
    elif auth == "bad":
        out["Authorization"] = draw(header_text)
    names = ["X-Priority", "X-Deadline-Ms", "X-TTFT-Budget-Ms", "X-Workflow-Id",
             "X-Workflow-Step", "X-Workflow-Steps", "Content-Type", "X-Session-Id"]  # fmt: skip
    for name in draw(st.lists(st.sampled_from(names), max_size=3, unique=True)):
        out[name] = draw(header_text | st.sampled_from(["critical", "10", "multipart/form-data"]))
    return out


def _check(live: Live, method: str, path: str, body: bytes, hdrs: dict[str, str]) -> None:
    status, raw = live.request(method, path, body, hdrs)
    assert status in ALLOWED, (status, raw[:200])
    if status != 200:
        err = json.loads(raw)["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert set(err) == {"message", "type", "param", "code"}


def _assert_healthy(live: Live) -> None:
    status, _ = live.request("GET", "/health", b"", {})
    assert status == 200
    good = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    auth = {"Authorization": f"Bearer {KEY}"}
    status, _ = live.request("POST", "/v1/chat/completions", good, auth)
    assert status == 200
    gw = live.gateway
    assert gw.tracker.in_flight("e0") == 0
    assert gw.recorder.snapshot(gw.clock()).num_in_flight == 0
    # every engine connection is back in the pool (none left mid-answer), the engine holds no
    # request, and the admission gate neither queued nor holds one
    assert gw.upstream.num_open == gw.upstream.num_idle()
    assert live.engine.active == 0
    assert all(gw.gate.core.queue.depth(p) == 0 for p in PriorityClass)


def _assert_no_leaked_tasks(live: Live) -> None:
    """No task outlives its request: the loop holds what it held after the first good call,
    give or take the client connections' handlers (the fuzz client reconnects)."""
    for _ in range(50):  # a handler of a connection the client just closed may still be ending
        if live.num_tasks() <= live.baseline_tasks + 2:
            return
        time.sleep(0.02)
    raise AssertionError(f"{live.num_tasks()} tasks on the loop, {live.baseline_tasks} at start")


REQUESTS = {
    "method": st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]),
    "path": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/nope"]),
    "body": bodies(),
    "hdrs": headers(),
}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(**REQUESTS)
def test_malformed_requests_get_clean_errors(
    live: Live, method: str, path: str, body: bytes, hdrs: dict[str, str]
) -> None:
    _check(live, method, path, body, hdrs)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(**REQUESTS)
def test_thousands_of_malformed_requests(
    live: Live, method: str, path: str, body: bytes, hdrs: dict[str, str]
) -> None:
    _check(live, method, path, body, hdrs)


def test_gateway_healthy_after_fuzz(live: Live) -> None:
    """Runs after the fuzz tests of this module (same gateway): nothing leaked."""
    _assert_healthy(live)
    _assert_no_leaked_tasks(live)
