"""``inferplane serve --workers N``: N gateway processes on one port, under a supervisor.

One Python process saturates one core; the gateway's work (parsing, routing, proxying
bytes) is per request and shares nothing that must be exact except what lives in the
shared state store (quotas, the workflow ledger: ``state: backend: redis``). So each
worker is a full gateway (its own tracker, scraper and KV-event subscriber, so precise
prefix state stays exact in every worker) listening on the same port with SO_REUSEPORT;
the kernel spreads new connections across them.

The supervisor (this process) reserves the port (port 0 picks a free one), starts the
workers (``spawn``: no state inherited from the parent's threads or loop), waits until
each listens, restarts one that dies, and on SIGTERM/SIGINT passes the signal on and
waits. A worker told to stop closes its listening socket, lets in-flight requests and
streams finish (up to ``drain_timeout_s``; aiohttp's graceful shutdown), then closes its
upstream connections. Each response carries ``X-Inferplane-Worker`` (the worker index).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Any

from aiohttp import web

from inferplane.config import FleetConfig

__all__ = ["WorkerSet", "serve_workers"]

log = logging.getLogger("inferplane.gateway.workers")

_READY_TIMEOUT_S = 60.0
_RESTART_BACKOFF_S = 1.0
WORKER_HEADER = "X-Inferplane-Worker"


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket holding ``port`` (0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _worker_main(
    config: FleetConfig,
    host: str,
    port: int,
    index: int,
    drain_timeout_s: float,
    log_level: str,
    ready: Queue[tuple[int, int]],
) -> None:
    """One worker process: a full gateway on the shared port until SIGTERM, then drain."""
    from inferplane.gateway.app import Gateway
    from inferplane.gateway.cli import run_until_signalled
    from inferplane.gateway.logs import configure_logging
    from inferplane.gateway.server import FrontSite
    from inferplane.gateway.shared_ledger import setup_workflow_routes

    configure_logging(log_level)
    worker_id = str(index)

    async def tag(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[WORKER_HEADER] = worker_id  # streams too: set as headers go out

    async def main(stop: asyncio.Event) -> None:
        gateway = Gateway(config)
        app = gateway.build_app()
        setup_workflow_routes(app, gateway)
        app.on_response_prepare.append(tag)
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=drain_timeout_s
        )
        await runner.setup()
        site = FrontSite(
            runner, host, port, backlog=2048, reuse_port=True,
            front_shutdown_timeout_s=drain_timeout_s,
        )  # fmt: skip
        await site.start()
        ready.put((index, multiprocessing.current_process().pid or 0))
        orphan_watch = asyncio.create_task(_watch_parent(stop))
        try:
            await stop.wait()
            orphan_watch.cancel()
            log.info("worker draining", extra={"worker": index})
        finally:
            await runner.cleanup()  # stop accepting, finish in-flight streams, close

    run_until_signalled(main)


async def _watch_parent(stop: asyncio.Event) -> None:
    """A worker whose supervisor died (SIGKILL, OOM) stops too, draining like on SIGTERM."""
    parent = os.getppid()
    while True:
        await asyncio.sleep(1.0)
        if os.getppid() != parent:
            stop.set()
            return


class WorkerSet:
    """The supervisor's view of its workers: start, wait until ready, restart, stop."""

    def __init__(
        self,
        config: FleetConfig,
        host: str,
        port: int,
        num_workers: int,
        *,
        drain_timeout_s: float = 30.0,
        log_level: str = "info",
    ) -> None:
        if num_workers < 1:
            raise ValueError("num_workers must be at least 1")
        self._ctx = multiprocessing.get_context("spawn")
        self._reserved = reserve_port(host, port)
        self.host = host
        self.port = int(self._reserved.getsockname()[1])
        self._args = (config, host, self.port)
        self._drain_timeout_s = drain_timeout_s
        self._log_level = log_level
        self._ready: Queue[tuple[int, int]] = self._ctx.Queue()
        self.procs: list[BaseProcess | None] = [None] * num_workers
        self.pids: list[int] = [0] * num_workers  # as each worker reported when it listened
        self.restarts = 0

    def _spawn(self, index: int) -> None:
        extra = (index, self._drain_timeout_s, self._log_level, self._ready)
        proc = self._ctx.Process(
            target=_worker_main, args=(*self._args, *extra), name=f"inferplane-worker-{index}"
        )
        proc.start()
        self.procs[index] = proc

    def start(self) -> None:
        """Start every worker and wait until all listen (then release the reserved port)."""
        for i in range(len(self.procs)):
            self._spawn(i)
        self.wait_ready(len(self.procs))
        self._reserved.close()

    def wait_ready(self, count: int) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        for _ in range(count):
            left = deadline - time.monotonic()
            try:
                index, pid = self._ready.get(timeout=max(0.1, left))
            except Exception as exc:  # queue.Empty: a worker failed to start
                self.stop()
                raise RuntimeError("gateway workers did not start in time") from exc
            self.pids[index] = pid

    def check(self) -> int:
        """Restart workers that died; returns how many were restarted."""
        with contextlib.suppress(Exception):  # restarted workers that listen since: their pids
            while True:
                index, pid = self._ready.get_nowait()
                self.pids[index] = pid
        n = 0
        for i, proc in enumerate(self.procs):
            if proc is not None and not proc.is_alive():
                log.warning("worker died; restarting", extra={"worker": i, "rc": proc.exitcode})
                self._spawn(i)
                n += 1
        self.restarts += n
        return n

    def stop(self) -> list[int | None]:
        """SIGTERM every worker, wait for them to drain, kill stragglers; exit codes."""
        live = [p for p in self.procs if p is not None]
        for proc in live:
            if proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        deadline = time.monotonic() + self._drain_timeout_s + 5.0
        for proc in live:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        self._reserved.close()
        return [p.exitcode for p in live]


def serve_workers(
    config: FleetConfig,
    host: str,
    port: int,
    num_workers: int,
    *,
    drain_timeout_s: float = 30.0,
    log_level: str = "info",
) -> int:
    """Run the supervisor until SIGTERM/SIGINT; exit code 0 when every worker drained."""
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        workers = WorkerSet(
            config, host, port, num_workers, drain_timeout_s=drain_timeout_s, log_level=log_level
        )
    except OSError as exc:
        print(f"inferplane serve: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    workers.start()
    pids = " ".join(f"{i}:{pid}" for i, pid in enumerate(workers.pids))
    print(
        f"inferplane gateway listening on http://{host}:{workers.port} "
        f"({num_workers} workers, pids {pids})",
        file=sys.stderr,
        flush=True,
    )
    last_restart = 0.0
    while not stop:
        time.sleep(0.2)
        if not stop and time.monotonic() - last_restart > _RESTART_BACKOFF_S and workers.check():
            last_restart = time.monotonic()
    codes = workers.stop()
    return 0 if all(c == 0 for c in codes) else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m inferplane.gateway.workers -c fleet.yaml --workers N [--port P]``."""
    import argparse

    from inferplane.config import ConfigError, load_config
    from inferplane.gateway.logs import configure_logging

    parser = argparse.ArgumentParser(prog="inferplane-workers")
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--drain-timeout-s", type=float, default=30.0)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"inferplane serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    host = args.host or config.gateway.host
    port = config.gateway.port if args.port is None else args.port
    return serve_workers(
        config,
        host,
        port,
        max(1, args.workers),
        drain_timeout_s=args.drain_timeout_s,
        log_level=args.log_level,
    )


if __name__ == "__main__":
    raise SystemExit(main())
