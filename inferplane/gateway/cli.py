"""Gateway sub-commands: ``inferplane serve -c fleet.yaml`` and ``inferplane up`` (the demo).

Registered into the top-level parser by ``inferplane.cli``. Heavy imports happen inside the
commands so ``inferplane --help`` stays fast. A bad config ends the command with exit code 2
and the dotted path of every bad field, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferplane.config import FleetConfig


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser("serve", help="run the gateway in front of a configured fleet")
    serve.add_argument("-c", "--config", required=True, help="fleet config (YAML)")
    serve.add_argument("--host", default=None, help="bind address (default: from the config)")
    serve.add_argument("--port", type=int, default=None, help="port (default: from the config)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--no-request-log", action="store_true", help="skip the per-request JSON log line"
    )
    serve.add_argument(
        "--workers", type=int, default=1, help="worker processes sharing the port (SO_REUSEPORT)"
    )
    serve.add_argument(
        "--drain-timeout-s", type=float, default=30.0,
        help="on SIGTERM, how long calls in flight may take to finish",
    )  # fmt: skip
    serve.set_defaults(func=_serve)

    up = subparsers.add_parser(
        "up", help="the demo: gateway plus an embedded emulated fleet on loopback"
    )
    up.add_argument("--port", type=int, default=8080, help="gateway port (0 picks a free one)")
    up.add_argument("--load", choices=["chat", "agentic", "mixed"], default=None)
    up.add_argument("--rate", type=float, default=None, help="load: new tasks per second")
    up.add_argument(
        "--time-scale", type=float, default=None, help="engine speed-up vs real GPUs (default 1)"
    )
    up.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    up.add_argument("--log-level", default="warning", choices=["debug", "info", "warning"])
    up.set_defaults(func=_up)


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop)`` on uvloop when available; SIGINT/SIGTERM set ``stop``.

    ``INFERPLANE_EVENT_LOOP=asyncio`` selects the standard loop (the overhead bench compares).
    """

    async def wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await main(stop)

    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if os.environ.get("INFERPLANE_EVENT_LOOP", "uvloop") != "asyncio":
        with contextlib.suppress(ImportError):  # uvloop is a dependency on Linux
            import uvloop

            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(wrapper())


def _serve(args: argparse.Namespace) -> int:
    from inferplane.config import ConfigError, load_config
    from inferplane.gateway.app import Gateway, start_server
    from inferplane.gateway.logs import configure_logging
    from inferplane.gateway.shared_ledger import setup_workflow_routes

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"inferplane serve: {exc}", file=sys.stderr)
        return 2
    gw_cfg = config.gateway
    updates: dict[str, Any] = {}
    if args.no_request_log:
        updates["log_requests"] = False
    if updates:
        config = config.model_copy(update={"gateway": gw_cfg.model_copy(update=updates)})
    host = args.host or gw_cfg.host
    port = gw_cfg.port if args.port is None else args.port
    configure_logging(args.log_level)
    note = auth_note(config)
    if note is not None:
        print(f"inferplane serve: {note}", file=sys.stderr, flush=True)
    if args.workers < 1 or args.drain_timeout_s < 0:
        print("inferplane serve: --workers must be >= 1, --drain-timeout-s >= 0", file=sys.stderr)
        return 2
    if args.workers > 1:
        from inferplane.gateway.workers import serve_workers

        return serve_workers(
            config, host, port, args.workers,
            drain_timeout_s=args.drain_timeout_s, log_level=args.log_level,
        )  # fmt: skip

    async def main(stop: asyncio.Event) -> None:
        gateway = Gateway(config)
        try:
            app = gateway.build_app()
            setup_workflow_routes(app, gateway)
            runner, bound = await start_server(
                app, host, port, shutdown_timeout_s=args.drain_timeout_s
            )
        except OSError as exc:
            print(f"inferplane serve: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
        print(f"inferplane gateway listening on http://{host}:{bound}", file=sys.stderr, flush=True)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    run_until_signalled(main)
    return 0


def auth_note(config: FleetConfig) -> str | None:
    """What ``serve`` says about a gateway without API keys (None: it has keys). Anonymous is
    the default so that a first config runs; a config that leaves ``gateway.auth`` out is told
    what that means, one that asks for anonymous mode is reminded."""
    auth = config.gateway.auth
    if auth.mode != "anonymous":
        return None
    what = (
        f"every caller is tenant '{auth.anonymous_tenant}' (one quota, one set of workflows and "
        "cached answers for all)"
    )
    if "auth" not in config.gateway.model_fields_set:
        return (
            f"warning: no gateway.auth in the config, so no API keys: {what}; set "
            "gateway.auth.mode: api_keys with keys (key_sha256, tenant) for a shared gateway"
        )
    return f"anonymous mode (gateway.auth.mode): {what}"


def _up(args: argparse.Namespace) -> int:
    from inferplane.gateway.demo import run_demo

    return run_demo(args)
