"""Redis killed under two gateways mid-load, then restarted empty (issue 11).

The gateways share a redis-server of this test's own (a free port, never the machine's
6379), with a tenant quota and a workflow in it. While calls (plain and streaming) run on
both, the server is killed: every call still gets its whole answer, ``/metrics`` says the
state is degraded (by reason, with the local operations and the journal waiting). Then the
server is restarted on the same port, empty (no persistence): both gateways notice, replay
their journals and go back to shared mode, and the shared state converges: the quota
bucket holds what was admitted during the outage and the workflow's record holds every
step, seen alike by both gateways.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import aiohttp
import pytest

from inferplane.core.admission_config import AdmissionConfig, QuotaLimits, QuotasConfig
from inferplane.core.state import BucketSpec
from inferplane.state.redis import RedisStore
from tests.gateway.fakes import fake_engines
from tests.gateway.test_shared_ledger import KEY, WF, redis_config, start_gateway, step, until
from tests.state.conftest import PrivateRedis

pytestmark = [pytest.mark.slow, pytest.mark.redis]

RPM = 600.0  # requests/min: refills 10/s, far above what the test sends
PREFIX = "outage:"


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name + (f"{{{labels}}}" if labels else "")) + r" ([0-9.e+-]+)"
    found = re.search(pattern, text)
    assert found is not None, f"{name}{{{labels}}} not in /metrics"
    return float(found.group(1))


async def _metrics(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/metrics") as r:
        assert r.status == 200
        return await r.text()


async def _call(session: aiohttp.ClientSession, url: str, stream: bool) -> None:
    """One call that must succeed with the engine's whole answer."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    async with session.post(f"{url}/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        if not stream:
            data = await r.json()
            assert data["choices"][0]["message"]["content"] == "t0 t1 t2 t3 t4 "
            return
        raw = await r.read()
    chunks = [c for c in raw.split(b"\n\n") if c.startswith(b"data: ")]
    assert chunks[-1] == b"data: [DONE]"
    assert sum(b'"content":"t' in c for c in chunks) == 5


CONCURRENCY = 6  # the load's closed loops


class Load:
    """Closed-loop calls on both gateways until stopped; counts calls by when they began."""

    def __init__(self, session: aiohttp.ClientSession, urls: list[str]) -> None:
        self.session, self.urls = session, urls
        self.started: list[float] = []
        self._stop = False
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, concurrency: int) -> None:
        self._tasks = [asyncio.create_task(self._loop(i)) for i in range(concurrency)]

    async def _loop(self, i: int) -> None:
        n = 0
        while not self._stop:
            self.started.append(time.monotonic())
            await _call(self.session, self.urls[(i + n) % 2], stream=n % 3 == 0)
            n += 1

    async def stop(self) -> None:
        self._stop = True
        await asyncio.gather(*self._tasks)  # re-raises the first failed call

    def between(self, t0: float, t1: float) -> int:
        return sum(t0 <= t < t1 for t in self.started)


async def test_redis_killed_mid_load_then_restarted(tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path)
    server.start()
    quotas = QuotasConfig(default_tenant=QuotaLimits(requests_per_min=RPM))
    async with fake_engines(2, token_delay_s=0.005) as engines:
        config = redis_config(engines, server.url, PREFIX, op_timeout_s=0.5, probe_interval_s=0.1)
        config = config.model_copy(update={"admission": AdmissionConfig(quotas=quotas)})
        store = RedisStore(server.url, prefix=PREFIX, op_timeout_s=2.0, connect_timeout_s=2.0)
        gw_a, url_a, stop_a = await start_gateway(config)
        gw_b, url_b, stop_b = await start_gateway(config)
        urls = [url_a, url_b]
        timeout = aiohttp.ClientTimeout(total=30)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for n in (1, 2):
                    await step(session, url_a, WF, n, 6)
                load = Load(session, urls)
                load.start(concurrency=CONCURRENCY)
                await asyncio.sleep(0.3)

                server.kill()  # mid-load
                killed_at = time.monotonic()
                for n in (3, 4, 5, 6):  # the workflow goes on, on A, while Redis is away
                    await step(session, url_a, WF, n, 6)
                await asyncio.sleep(0.5)
                for url, gw in zip(urls, (gw_a, gw_b), strict=True):
                    text = await _metrics(session, url)
                    assert _metric(text, "inferplane_state_mode", 'mode="degraded"') == 1.0
                    assert _metric(text, "inferplane_state_mode", 'mode="shared"') == 0.0
                    assert (
                        _metric(text, "inferplane_state_degradations_total", 'reason="connection"')
                        >= 1
                    )
                    assert _metric(text, "inferplane_state_local_ops_total") > 0
                    assert _metric(text, "inferplane_state_journal_size") > 0
                    assert gw.state.mode.value == "degraded"

                restarted_at = time.monotonic()
                server.start()  # same port, empty
                await asyncio.sleep(0.3)
                await load.stop()  # every call, before, during and after, was answered

                async def reconciled() -> bool:
                    for url in urls:
                        text = await _metrics(session, url)
                        if _metric(text, "inferplane_state_mode", 'mode="shared"') != 1.0:
                            return False
                        assert _metric(text, "inferplane_state_reconciles_total") >= 1
                        assert _metric(text, "inferplane_state_journal_size") == 0
                    return True

                await until(reconciled)
                read_at = time.monotonic()

                # The quota bucket in the new server holds the calls admitted while it was
                # away (replayed), less what it refilled since the restart.
                spec = BucketSpec("q:tenant:anonymous:requests_per_min", RPM, RPM / 60.0)
                used = RPM - await store.bucket(spec, time.time())
                during = load.between(killed_at, restarted_at) + 4  # + the workflow steps
                assert during > 20
                assert used >= during - (read_at - restarted_at) * RPM / 60.0 - 1
                # Nothing invented: at most the calls begun in that time, the steps, and one
                # call per load loop begun before the kill whose quota take met the dead server
                # (journaled, then replayed).
                assert used <= load.between(killed_at, read_at) + 4 + CONCURRENCY + 1

                # The workflow's record came back whole: steps 1-2 shared, 3-6 local.
                record = await store.workflow_get(KEY, time.time())
                assert record is not None
                assert (record.steps_done, record.max_step, record.steps_expected) == (6, 6, 6)
                assert record.tokens == 6 * 15
                views = []
                for url in urls:
                    async with session.get(f"{url}/v1/workflows/{WF}") as r:
                        views.append((await r.json())["shared"])
                assert views[0] == views[1]
                assert views[0]["steps_done"] == 6
        finally:
            await stop_a()
            await stop_b()
            await store.close()
            server.kill()
