"""The ``inferplane engine`` sub-command: run one emulated engine server.

    inferplane engine --model llama-3-8b --gpu h100 --port 8000 --time-scale 10 \\
        --kv-events-port 5557 --kv-replay-port 5558 --kv-encoding map --cold-start \\
        --slowdown 2 --crash-after-tokens 50 --error-rate 0.1 --error-status 503

Heavy imports happen inside the command so that ``inferplane --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "engine",
        help="run an emulated vLLM-like engine (OpenAI API, /metrics, KV events)",
        description="An emulated engine: a clock-free GPU model served in real time.",
    )
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--tensor-parallel", "--tp", type=int, default=None)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="10 = ten times slower than the modelled GPU")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-events-port", type=int, default=None,
                        help="publish vLLM KV-cache events on this ZMQ PUB port")  # fmt: skip
    parser.add_argument("--kv-replay-port", type=int, default=None)
    parser.add_argument("--kv-encoding", choices=("array", "map"), default="array")
    parser.add_argument("--cold-start", action="store_true",
                        help="start cold and load the weights (health 503 meanwhile)")  # fmt: skip
    faults = parser.add_argument_group("faults")
    faults.add_argument("--slowdown", type=float, default=1.0)
    faults.add_argument("--crash-after-tokens", type=int, default=None)
    faults.add_argument("--hang", action="store_true")
    faults.add_argument("--error-rate", type=float, default=0.0)
    faults.add_argument("--error-status", type=int, default=503)
    parser.set_defaults(func=run)


def _config(args: argparse.Namespace) -> Any:
    from inferplane.engine.faults import FaultConfig
    from inferplane.engine.kv_publisher import KVEncoding
    from inferplane.engine.server import EngineConfig

    faults = FaultConfig(
        slowdown=args.slowdown,
        crash_after_tokens=args.crash_after_tokens,
        hang=args.hang,
        error_rate=args.error_rate,
        error_status=args.error_status,
    )
    return EngineConfig(
        model=args.model,
        gpu=args.gpu,
        tensor_parallel=args.tensor_parallel,
        served_model_name=args.served_model_name,
        time_scale=args.time_scale,
        seed=args.seed,
        host=args.host,
        port=args.port,
        kv_events=args.kv_events_port is not None,
        kv_events_port=args.kv_events_port or 0,
        kv_replay_port=args.kv_replay_port,
        kv_encoding=KVEncoding(args.kv_encoding),
        cold_start=args.cold_start,
        faults=faults,
    )


async def _serve(config: Any) -> None:
    import asyncio
    import logging

    from inferplane.engine.server import EngineServer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        server = EngineServer(config)
    except (KeyError, ValueError) as exc:
        raise SystemExit(f"inferplane engine: {exc}") from None
    await server.start()
    log = logging.getLogger("inferplane.engine")
    log.info("serving %s on %s (time scale %s)", config.model_name, server.url, config.time_scale)
    if server.publisher is not None:
        pub = server.publisher
        log.info("KV events on %s (replay %s), topic %s", pub.pub_endpoint,
                 pub.replay_endpoint, pub.topic)  # fmt: skip
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


def run(args: argparse.Namespace) -> int:
    from inferplane.engine.fleet import new_event_loop

    try:
        config = _config(args)
    except ValueError as exc:
        raise SystemExit(f"inferplane engine: {exc}") from None

    loop = new_event_loop()
    try:
        loop.run_until_complete(_serve(config))
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()
    return 0
