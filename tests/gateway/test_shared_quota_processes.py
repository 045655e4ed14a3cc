"""Two real gateway processes share one tenant quota through Redis (issue 11).

The test starts emulated engines in-process, writes a fleet YAML with ``state: {backend:
redis}`` under a key prefix of its own and a tenant quota of 100 requests/min, starts two
``inferplane serve`` processes on their own ports and fires concurrent calls at both. The
two together may admit no more than the shared bucket allows: its 100 requests plus what it
refills (100/60 per second) between the first call sent and the last answer received. The
rest must be 429s naming the quota. Redis must be up: an unreachable Redis fails the test.
"""

from __future__ import annotations

import asyncio
import math
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis
import yaml

from inferplane.engine.fleet import EngineSpec, Fleet

pytestmark = [pytest.mark.slow, pytest.mark.redis]

REDIS_URL = "redis://127.0.0.1:6379/0"
QUOTA_PER_MIN = 100
NUM_CALLS = 300
TENANT = "anonymous"


def _require_redis() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1.0)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(
            f"Redis is not reachable at {REDIS_URL} ({exc}); start it with "
            "`redis-server --port 6379 --save '' --daemonize yes` (.ci/run does this)"
        )
    return client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def key_prefix() -> Iterator[str]:
    client = _require_redis()
    prefix = f"test:gwquota:{uuid.uuid4().hex[:12]}:"
    yield prefix
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
async def engines() -> AsyncIterator[Fleet]:
    async with Fleet([EngineSpec(count=2, time_scale=50.0)]) as fleet:
        yield fleet


def _write_config(path: Path, fleet: Fleet, key_prefix: str) -> None:
    config: dict[str, Any] = {
        "gateway": {"auth": {"mode": "anonymous", "anonymous_tenant": TENANT}},
        "endpoints": [e.endpoint_config() for e in fleet.engines],
        "routes": [{"name": "default", "targets": [fleet.engines[0].model_name]}],
        "state": {
            "backend": "redis",
            "redis_url": REDIS_URL,
            "key_prefix": key_prefix,
            # Generous: 150 calls arrive at once on a 2-core machine that also runs the
            # engines and the client; a timed-out op would be answered from the local bucket
            # (degraded mode), which is not what this test is about (the outage test is).
            "op_timeout_s": 5.0,
            "connect_timeout_s": 5.0,
        },
        "admission": {
            "quotas": {"tenants": {TENANT: {"requests_per_min": QUOTA_PER_MIN}}},
        },
    }
    path.write_text(yaml.safe_dump(config))


async def _wait_ready(
    session: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes]
) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            pytest.fail(f"gateway at {url} exited with {proc.returncode} before it was ready")
        try:
            async with session.get(f"{url}/ready") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    pytest.fail(f"gateway at {url} was not ready within 30 s")


def _spawn(cfg: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "inferplane.cli", "serve", "-c", str(cfg),
            "--port", str(port), "--no-request-log", "--log-level", "warning"]  # fmt: skip
    with log_path.open("wb") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
async def gateways(tmp_path: Path, engines: Fleet, key_prefix: str) -> AsyncIterator[list[str]]:
    cfg = tmp_path / "fleet.yaml"
    _write_config(cfg, engines, key_prefix)
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for i in range(2):
            port = _free_port()
            procs.append(_spawn(cfg, port, tmp_path / f"gw{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        async with aiohttp.ClientSession() as session:
            for url, proc in zip(urls, procs, strict=True):
                await _wait_ready(session, url, proc)
        yield urls
    finally:
        _stop(procs)


async def _call(
    session: aiohttp.ClientSession, url: str, model: str
) -> tuple[int, str | None, bytes]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        return resp.status, resp.headers.get("X-Inferplane-Reason"), await resp.read()


async def _degradations(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    prefix = "inferplane_state_degradations_total"
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


async def test_two_gateways_admit_at_most_the_shared_quota(
    gateways: list[str], engines: Fleet
) -> None:
    model = engines.engines[0].model_name
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.monotonic()
        results = await asyncio.gather(
            *(_call(session, gateways[i % 2], model) for i in range(NUM_CALLS))
        )
        elapsed_s = time.monotonic() - started
        degraded = [await _degradations(session, url) for url in gateways]
    # Sharing is only on trial while the store answered: a degraded gateway admits locally.
    assert degraded == [0, 0], f"shared store timed out under load: {degraded}"
    admitted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    # which gateway admits how many is a race (one may take the whole bucket); only the sum
    # is bounded, and it is the proof of sharing: two unshared buckets would admit ~200.
    by_gateway = [sum(1 for r in results[g::2] if r[0] == 200) for g in range(2)]
    # The shared bucket starts full (100) and refills 100/60 per second; nothing taken
    # before the first call was sent or after the last answer came back counts.
    allowance = math.ceil(elapsed_s * QUOTA_PER_MIN / 60.0)
    assert len(admitted) <= QUOTA_PER_MIN + allowance, (by_gateway, elapsed_s)
    # Each process alone would admit 100 from its local bucket: more than 100 + allowance
    # in total means the quota was not shared. And the quota is not refused to excess:
    assert len(admitted) >= QUOTA_PER_MIN - 5, (by_gateway, elapsed_s)
    for status, reason, body in refused:
        assert status == 429, body[:300]
        assert reason == "quota_requests_per_min", body[:300]
        error = orjson.loads(body)["error"]
        assert error["code"] == "quota_requests_per_min"
        assert TENANT in error["message"]
