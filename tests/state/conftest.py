"""Fixtures for the state tests: the shared Redis (must be up: a clear failure otherwise)
and private redis-servers on free ports that a test may kill and restart."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from inferplane.state.redis import RedisStore

SHARED_URL = "redis://127.0.0.1:6379/0"


def require_redis(url: str = SHARED_URL) -> None:
    """Fail (never skip) when Redis is unreachable: CI must run these tests."""
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1.0).ping()
    except redis.RedisError as exc:
        pytest.fail(
            f"Redis is not reachable at {url} ({exc}); start it with "
            "`redis-server --port 6379 --save '' --daemonize yes` (.ci/run does this)"
        )


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex[:12]}:"


@pytest.fixture
async def redis_store(prefix: str) -> AsyncIterator[RedisStore]:
    require_redis()
    store = RedisStore(SHARED_URL, prefix=prefix, op_timeout_s=2.0, connect_timeout_s=2.0)
    yield store
    await store.clear()
    await store.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server of this test's own, on a free port, that it may kill and restart."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir)]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        for _ in range(100):
            try:
                if client.ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        pytest.fail(f"private redis-server on port {self.port} did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
            self.proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.proc.send_signal(18)  # SIGCONT, in case a test paused it
    server.kill()
