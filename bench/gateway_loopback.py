"""The whole gateway's CPU per call in one process: front server, upstream client, sockets.

``bench/gateway_callpath.py`` drives ``Gateway._generate`` with an in-memory request and
engine: the policy alone. This adds what it leaves out: the lean front server, the upstream
client and the kernel's loopback TCP work. One event loop runs three parties on loopback
sockets: a raw HTTP/1.1 client (``--conns`` keep-alive connections, each sending the next
call when its answer is in), the gateway (``start_server``: the front server answers) and a
raw backend answering the overhead bench's JSON. The raw client and backend are a few lines
of asyncio Protocol each, so their share is small and is measured too: the same client
against the backend directly.

- through: CPU seconds (``time.process_time``, user + system of the one process) per call
  through the gateway, the minimum over ``--reps`` runs of ``--calls`` calls;
- direct: the same without the gateway; gateway = through - direct.

Being CPU time of one process it is less sensitive to other processes than the overhead
bench's throughput (no bench lock needed), but it does not see what crossing processes costs
(wake-ups, cache refills): compare trees with it, and confirm with the overhead bench.

    python bench/gateway_callpath.py --sockets [--calls 15000] [--reps 3] [--conns 64]
        [--baseline-src DIR]
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from gateway_callpath import ANSWER, BODY, CHAT, CONFIG

_ANSWER_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
RESPONSE = _ANSWER_HEAD % len(ANSWER) + ANSWER
#: The overhead bench's load generator (aiohttp's client) sends these headers.
REQUEST = (
    b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n"
    b"Accept-Encoding: gzip, deflate\r\nUser-Agent: Python/3.11 aiohttp/3.14\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)
) + BODY


def _messages(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete HTTP/1.1 messages (head + Content-Length body) in ``buf``, and the rest."""
    out = []
    while (end := buf.find(b"\r\n\r\n")) >= 0:
        head = buf[:end].lower()
        at = head.find(b"content-length:")
        stop = head.find(b"\r\n", at)
        size = int(head[at + 15 : stop if stop > 0 else None]) if at >= 0 else 0
        if len(buf) < end + 4 + size:
            break
        out.append(head)
        buf = buf[end + 4 + size :]
    return out, buf


class _Backend(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        heads, self.buf = _messages(self.buf + data)
        for _ in heads:
            self.transport.write(RESPONSE)


class _Run:
    """Calls left to send, answers in, and when all connections are done."""

    def __init__(self, calls: int, conns: int, done: asyncio.Future[None]) -> None:
        self.left, self.conns, self.idle, self.ok, self.bad = calls, conns, 0, 0, 0
        self.done = done


class _Client(asyncio.Protocol):
    def __init__(self, run: _Run) -> None:
        self.run = run
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self._send()

    def _send(self) -> None:
        run = self.run
        if run.left > 0:
            run.left -= 1
            self.transport.write(REQUEST)
            return
        run.idle += 1
        if run.idle == run.conns:
            run.done.set_result(None)

    def data_received(self, data: bytes) -> None:
        heads, self.buf = _messages(self.buf + data)
        for head in heads:
            self.run.ok += head.startswith(b"http/1.1 200")
            self.run.bad += not head.startswith(b"http/1.1 200")
            self._send()


async def _drive(port: int, calls: int, conns: int) -> float:
    """CPU seconds per call of ``calls`` calls over ``conns`` connections to ``port``."""
    loop = asyncio.get_running_loop()
    run = _Run(calls, conns, loop.create_future())
    start = time.process_time()
    transports = []
    for _ in range(conns):
        transport, _ = await loop.create_connection(lambda: _Client(run), "127.0.0.1", port)
        transports.append(transport)
    await run.done
    spent = time.process_time() - start
    for transport in transports:
        transport.close()
    if run.bad or run.ok != calls:
        raise RuntimeError(f"{run.bad} failed calls, {run.ok} of {calls} answered")
    return spent / calls


async def measure_sockets(calls: int, reps: int, conns: int) -> dict[str, Any]:
    from inferplane.config import parse_config
    from inferplane.core.types import EndpointState
    from inferplane.gateway.app import Gateway
    from inferplane.gateway.server import start_server

    loop = asyncio.get_running_loop()
    backend = await loop.create_server(_Backend, "127.0.0.1", 0)
    backend_port = backend.sockets[0].getsockname()[1]
    config = json.loads(json.dumps(CONFIG))
    config["endpoints"][0]["url"] = f"http://127.0.0.1:{backend_port}"
    gw = Gateway(parse_config(config))
    runner, port = await start_server(gw.build_app(), "127.0.0.1", 0)
    try:
        gw.tracker.set_state("b0", EndpointState.READY)
        await _drive(port, 3000, conns)  # warm-up: connections, caches, label children
        direct = min([await _drive(backend_port, calls, conns) for _ in range(reps)])
        through = min([await _drive(port, calls, conns) for _ in range(reps)])
    finally:
        await runner.cleanup()
        backend.close()
    return {
        "us_per_call": 1e6 * (through - direct),
        "through_us": 1e6 * through,
        "direct_us": 1e6 * direct,
    }
