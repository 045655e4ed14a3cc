"""One worker of ``serve --workers 2`` gets SIGTERM while it streams (issue 11, item 5).

The worker (not the supervisor) is told to stop with streams in flight: it stops accepting,
finishes every stream it holds (each client gets all 30 tokens and ``[DONE]``), and exits;
the other worker's streams are untouched and the port keeps serving. Complements
``test_workers.py``, where the supervisor itself is stopped.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from inferplane.gateway.workers import WORKER_HEADER
from tests.gateway.fakes import fake_engines, fleet_config

pytestmark = [pytest.mark.slow]

NUM_TOKENS = 30
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": NUM_TOKENS, "stream": True}  # fmt: skip


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


async def _open_stream(
    session: aiohttp.ClientSession, url: str
) -> tuple[str, aiohttp.ClientResponse, bytes]:
    resp = await session.post(url, json=BODY)
    assert resp.status == 200
    first = await resp.content.readline()
    assert first.startswith(b"data: ")
    return resp.headers[WORKER_HEADER], resp, first


async def _finish(resp: aiohttp.ClientResponse, first: bytes) -> None:
    rest = await resp.content.read()
    resp.release()
    chunks = [c for c in (first + rest).split(b"\n\n") if c.startswith(b"data: ")]
    assert chunks[-1] == b"data: [DONE]"
    assert sum(b'"content":"t' in c for c in chunks) == NUM_TOKENS  # nothing lost


async def test_a_worker_stopped_mid_stream_drains_its_streams(tmp_path: Path) -> None:
    async with fake_engines(1, num_tokens=NUM_TOKENS, token_delay_s=0.05) as engines:
        path = tmp_path / "fleet.yaml"
        cfg = fleet_config(engines, log_requests=False).model_dump(mode="json")
        path.write_text(yaml.safe_dump(cfg))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "inferplane.gateway.workers", "-c", str(path),
            "--workers", "2", "--port", "0", "--drain-timeout-s", "10",
            stderr=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stderr is not None
        try:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            found = re.search(r"http://(\S+) \(2 workers, pids 0:(\d+) 1:(\d+)\)", line)
            assert found is not None, line
            addr, pids = found.group(1), {"0": int(found.group(2)), "1": int(found.group(3))}
            url = f"http://{addr}/v1/chat/completions"
            sessions = [aiohttp.ClientSession() for _ in range(8)]  # one connection each
            try:
                streams = await asyncio.gather(*(_open_stream(s, url) for s in sessions))
                by_worker = {w for w, _, _ in streams}
                victim = next(iter(by_worker))
                os.kill(pids[victim], signal.SIGTERM)  # ~1.4 s of tokens left on each stream
                await asyncio.gather(*(_finish(r, first) for _, r, first in streams))
            finally:
                for s in sessions:
                    await s.close()
            deadline = time.monotonic() + 10
            while not _gone(pids[victim]):
                assert time.monotonic() < deadline, "the stopped worker did not exit"
                await asyncio.sleep(0.05)

            # The port keeps serving meanwhile, from the other worker (the supervisor also
            # starts a new one in the stopped worker's place; not waited for here: seconds).
            plain = {**BODY, "stream": False, "max_tokens": 2}
            async with aiohttp.ClientSession() as s, s.post(url, json=plain) as r:
                assert r.status == 200
            assert proc.returncode is None  # the supervisor kept running
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 30)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
