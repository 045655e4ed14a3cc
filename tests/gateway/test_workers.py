"""``serve --workers N``: N processes share one port (SO_REUSEPORT) and a SIGTERM drains
streams in flight: the client gets every token, then the port closes and the exit is clean."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from inferplane.gateway.workers import WORKER_HEADER, reserve_port
from tests.gateway.fakes import fake_engines, fleet_config


def test_reserved_port_can_be_shared_by_listeners() -> None:
    held = reserve_port("127.0.0.1", 0)
    port = held.getsockname()[1]
    second = reserve_port("127.0.0.1", port)  # what each worker does on the same port
    second.listen()
    assert second.getsockname()[1] == port
    second.close()
    held.close()


async def _start(config: Path, workers: int) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferplane.gateway.workers", "-c", str(config),
        "--workers", str(workers), "--port", "0", "--drain-timeout-s", "10",
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    line = await asyncio.wait_for(proc.stderr.readline(), 60)
    assert b"listening on" in line, line
    return proc, line.split(b"http://")[1].split()[0].decode()


@pytest.mark.slow
async def test_workers_share_the_port_and_drain_streams_on_sigterm(tmp_path: Path) -> None:
    async with fake_engines(1, num_tokens=30, token_delay_s=0.05) as engines:
        cfg = fleet_config(engines, log_requests=False).model_dump(mode="json")
        path = tmp_path / "fleet.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc, addr = await _start(path, 2)
        try:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 30}  # fmt: skip

            async def one() -> str:  # a new connection each time: the kernel spreads them
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(f"http://{addr}/v1/chat/completions", json=body) as r,
                ):
                    assert r.status == 200
                    return r.headers[WORKER_HEADER]

            seen = set(await asyncio.gather(*(one() for _ in range(24))))
            assert seen == {"0", "1"}

            async with aiohttp.ClientSession() as s:
                url = f"http://{addr}/v1/chat/completions"
                async with s.post(url, json={**body, "stream": True}) as r:
                    assert r.status == 200
                    first = await r.content.readline()
                    assert first.startswith(b"data: ")
                    os.kill(proc.pid, signal.SIGTERM)  # mid-stream: about 1.5 s left
                    rest = await r.content.read()
            chunks = [c for c in (first + rest).split(b"\n\n") if c.startswith(b"data: ")]
            assert chunks[-1] == b"data: [DONE]"
            assert sum(b'"content":"t' in c for c in chunks) == 30  # every token arrived
            rc = await asyncio.wait_for(proc.wait(), 30)
            assert rc == 0
            with pytest.raises(aiohttp.ClientConnectionError):
                async with aiohttp.ClientSession() as s, s.get(f"http://{addr}/health"):
                    pass
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
