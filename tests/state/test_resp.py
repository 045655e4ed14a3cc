"""The lean RESP client: replies parsed from any split of the byte stream, and against real
Redis servers: pipelines, transactions, scripts reloaded after a restart, callers that give
up without putting the connection out of step, and a lost or frozen server failing fast."""

from __future__ import annotations

import asyncio
import signal
import uuid
from typing import Any

import pytest
import redis

from inferplane.state.resp import (
    Address,
    ReplyError,
    RespClient,
    Script,
    _Connection,
    _Incomplete,
    pack_command,
    parse_reply,
)
from tests.state.conftest import SHARED_URL, PrivateRedis, require_redis

STREAM = (
    b"+OK\r\n:-42\r\n$5\r\nhe\r\no\r\n$-1\r\n*-1\r\n*0\r\n$0\r\n\r\n"
    b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n-ERR inner\r\n-NOSCRIPT gone\r\n"
)
WANT: list[Any] = [b"OK", -42, b"he\r\no", None, None, [], b"", [1, [b"a", None], "ERR inner"]]


def test_pack_command_writes_bulk_strings() -> None:
    assert pack_command(["GET", b"k\r\n", 7, 0.1]) == (
        b"*4\r\n$3\r\nGET\r\n$3\r\nk\r\n\r\n$1\r\n7\r\n$3\r\n0.1\r\n"
    )


def test_parse_reply_reads_each_type_and_reports_incomplete() -> None:
    pos, got = 0, []
    while pos < len(STREAM):
        reply, pos = parse_reply(STREAM, pos)
        got.append(reply)
    assert got[:7] == WANT[:7] and got[7][:2] == WANT[7][:2]
    assert isinstance(got[7][2], ReplyError) and str(got[7][2]) == "ERR inner"
    assert isinstance(got[8], ReplyError) and str(got[8]).startswith("NOSCRIPT")
    with pytest.raises(_Incomplete):
        parse_reply(b"*2\r\n:1\r\n", 0)
    with pytest.raises(_Incomplete):
        parse_reply(b"$5\r\nabc", 0)


class _FakeTransport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
async def test_replies_split_anywhere_reach_their_callers_in_order(chunk: int) -> None:
    conn = _Connection(RespClient())
    conn.transport = _FakeTransport()  # type: ignore[assignment]
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(9)]
    futs[2].cancel()  # a caller that gave up: its reply is dropped, the others stay in step
    conn.pending.extend((f, 0.0) for f in futs)
    for i in range(0, len(STREAM), chunk):
        conn.data_received(STREAM[i : i + chunk])
    assert [f.result() for f in futs[:7] if not f.cancelled()] == WANT[:2] + WANT[3:7]
    assert futs[7].result()[:2] == WANT[7][:2]
    assert isinstance(futs[8].exception(), ReplyError) and not conn.pending
    conn.data_received(b":1\r\n")  # nobody asked: out of step, the connection is dropped
    assert conn.transport is None


def test_address_from_url() -> None:
    assert Address.from_url("redis://127.0.0.1:6380/2") == Address(port=6380, db=2)
    a = Address.from_url("rediss://u:p%40ss@cache.svc:6390")
    assert (a.host, a.port, a.tls, a.username, a.password, a.db) == (
        "cache.svc", 6390, True, "u", "p@ss", 0,
    )  # fmt: skip
    u = Address.from_url("unix:///run/redis.sock?db=5")
    assert (u.path, u.db) == ("/run/redis.sock", 5)
    with pytest.raises(ValueError, match="redis://"):
        Address.from_url("http://x")


@pytest.mark.redis
async def test_commands_pipelines_and_transactions_on_real_redis() -> None:
    require_redis()
    key = f"test:resp:{uuid.uuid4().hex}"
    client = RespClient(SHARED_URL.replace("/0", "/3"), op_timeout_s=2.0)
    try:
        assert await client.execute("SET", key, b"\x00\xff", "PX", 60_000) == b"OK"
        assert await client.execute("GET", key) == b"\x00\xff"
        assert redis.Redis(db=3).get(key) == b"\x00\xff"  # SELECT 3 was sent on connect
        got = await client.pipeline([("INCR", key + "n"), ("INCRBY", key + "n", 5), ("PING",)])
        assert got == [1, 6, b"PONG"]
        assert await client.transaction([("INCR", key + "n"), ("GET", key + "n")]) == [7, b"7"]
        with pytest.raises(ReplyError, match="WRONGTYPE"):
            await client.pipeline([("LPUSH", key, "x"), ("PING",)])
        assert await client.execute("PING") == b"PONG"  # the stream is still in step
        await asyncio.gather(*(client.execute("INCR", key + "c") for _ in range(200)))
        assert await client.execute("GET", key + "c") == b"200"
        big = bytes(range(256)) * 16_384  # 4 MiB: many reads, one reply
        await client.execute("SET", key + "big", big, "PX", 60_000)
        got_big, pong = await client.pipeline([("GET", key + "big"), ("PING",)])
        assert got_big == big and pong == b"PONG"
        assert client.connects == 1  # one connection served every concurrent caller
    finally:
        await client.execute("DEL", key, key + "n", key + "c", key + "big")
        await client.close()


@pytest.mark.redis
async def test_a_caller_that_times_out_leaves_the_connection_in_step() -> None:
    require_redis()
    client = RespClient(SHARED_URL, op_timeout_s=0.05)
    try:
        with pytest.raises(TimeoutError):  # Redis blocks this connection for 0.2 s
            await client.execute("BLPOP", f"test:resp:{uuid.uuid4().hex}", "0.2")
        client.op_timeout_s = 2.0
        assert await client.execute("ECHO", "after") == b"after"  # not BLPOP's late nil
        assert client.connects == 1
    finally:
        await client.close()


@pytest.mark.redis
async def test_server_killed_then_restarted_empty(private_redis: PrivateRedis) -> None:
    client = RespClient(private_redis.url, op_timeout_s=0.5)
    script = Script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    try:
        assert await client.run_script(script, ["k"], [2]) == 2
        assert await client.run_script(script, ["k"], [3]) == 5  # by SHA now
        private_redis.kill()
        with pytest.raises(ConnectionError):
            await client.execute("PING")
        assert not client.connected
        with pytest.raises(ConnectionError):  # refused: nothing listens
            await client.execute("PING")
        private_redis.start()
        assert await client.run_script(script, ["k"], [4]) == 4  # reloaded by EVAL
        assert client.connects == 2
    finally:
        await client.close()


@pytest.mark.redis
async def test_a_frozen_server_fails_fast_then_recovers(private_redis: PrivateRedis) -> None:
    client = RespClient(private_redis.url, op_timeout_s=0.05, stale_s=0.2)
    assert private_redis.proc is not None
    try:
        assert await client.execute("PING") == b"PONG"
        private_redis.proc.send_signal(signal.SIGSTOP)
        with pytest.raises(TimeoutError):
            await client.execute("PING")
        await asyncio.sleep(0.25)  # the unanswered PING is now overdue
        with pytest.raises(ConnectionError, match="not answering"):
            await client.execute("PING")
        private_redis.proc.send_signal(signal.SIGCONT)
        client.op_timeout_s = 2.0
        assert await client.execute("PING") == b"PONG"
        assert client.connects == 2
    finally:
        private_redis.proc.send_signal(signal.SIGCONT)
        await client.close()
