"""``inferplane up``: the whole control plane on one machine, for a newcomer's first minute.

Starts an embedded emulated fleet on loopback (two models, three GPU types at different
prices, six engines), puts the gateway in front of it in anonymous mode, prints the URL, a
curl line and an OpenAI SDK snippet, and with ``--load`` drives it with the built-in traffic
generator while printing a one-line summary every few seconds. Ctrl-C stops everything.

The engines run at ``time_scale`` x real GPU time: the default (4) keeps six emulated engines,
the gateway and the load generator within what a 2-core machine can step in real time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
from typing import Any

from rich.console import Console

from inferplane.config import FleetConfig, parse_config
from inferplane.engine.fleet import EngineSpec, Fleet
from inferplane.gateway.app import Gateway, start_server
from inferplane.gateway.autoscale import EmbeddedFleet, setup_autoscaling
from inferplane.gateway.cli import run_until_signalled
from inferplane.gateway.loadgen import LoadGenerator
from inferplane.gateway.logs import configure_logging
from inferplane.gateway.observability_config import AutoscaleConfig, PoolScaleConfig

DEFAULT_TIME_SCALE = 4.0
SMALL_MODEL = "llama-3-8b"
BIG_MODEL = "llama-3-70b"
SUMMARY_EVERY_S = 3.0


def demo_specs(time_scale: float) -> list[EngineSpec]:
    """Six engines: the 8B model on H100 and on cheaper A100, the 70B on H200 (TP2).

    Every engine publishes its KV-cache events, so the gateway routes on exactly what each
    one caches (precise prefix-aware routing)."""
    return [
        EngineSpec(model=m, gpu=g, count=2, time_scale=time_scale, kv_events=True, seed=seed)
        for m, g, seed in (
            (SMALL_MODEL, "h100", 1),
            (SMALL_MODEL, "a100", 2),
            (BIG_MODEL, "h200", 3),
        )
    ]


def demo_config(fleet: Fleet, port: int, extra: list[dict[str, Any]] | None = None) -> FleetConfig:
    return parse_config(
        {
            "gateway": {"port": port, "auth": {"mode": "anonymous"}, "log_requests": False},
            "endpoints": [e.endpoint_config() for e in fleet.engines] + (extra or []),
            "routes": [{"name": "default", "targets": [SMALL_MODEL, BIG_MODEL]}],
        },
        "<inferplane up>",
    )


def _banner(console: Console, url: str, fleet: Fleet) -> None:
    console.print(f"[bold green]inferplane is up[/] at [bold]{url}[/]  (Ctrl-C to stop)")
    for e in fleet.engines:
        console.print(
            f"  engine {e.name:<22} {e.model_name:<12} {e.spec.gpu:<5} "
            f"${e.price_per_hour_usd:.2f}/h  {e.url}"
        )
    console.print("\n[bold]curl[/]")
    console.print(
        f"  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' "
        f"""-d '{{"model": "{SMALL_MODEL}", "messages": [{{"role": "user", "content": "Hi"}}]}}'""",
        soft_wrap=True,
    )
    console.print("\n[bold]OpenAI SDK[/]")
    console.print(
        "  from openai import OpenAI\n"
        f'  client = OpenAI(base_url="{url}/v1", api_key="anything")\n'
        f'  r = client.chat.completions.create(model="{SMALL_MODEL}",\n'
        '        messages=[{"role": "user", "content": "Hi"}])\n'
        "  print(r.choices[0].message.content)",
        highlight=False,
    )
    console.print(f"\nstats: {url}/v1/stats   metrics: {url}/metrics\n")


def _summary(gateway: Gateway, load: LoadGenerator | None, elapsed_s: float) -> str:
    snap = gateway.recorder.snapshot(gateway.clock())
    ready = sum(1 for e in gateway.tracker.stats(gateway.clock()) if e["state"] == "ready")
    parts = [f"t={elapsed_s:5.0f}s", f"ready={ready}/{len(gateway.tracker.names())}"]
    if load is not None:
        s = load.stats
        ttfts = s.take_ttfts()
        p50 = f"{1e3 * statistics.median(ttfts):.0f}ms" if ttfts else "-"
        parts += [f"sent={s.sent}", f"ok={s.ok}", f"err={s.failed}", f"inflight={s.in_flight}"]
        parts += [f"ttft_p50={p50}", f"tasks={s.tasks_ok}ok/{s.tasks_failed}fail"]
    cpt = snap.cost_per_successful_task_usd
    parts.append(f"spend=${snap.fleet_spend_usd:.4f}")
    parts.append(f"busy={snap.busy_usd / snap.fleet_spend_usd:.0%}" if snap.fleet_spend_usd else "")
    parts.append("cost/task=" + ("-" if cpt is None else f"${cpt:.5f}"))
    return "  ".join(p for p in parts if p)


async def _demo(args: argparse.Namespace, stop: asyncio.Event, console: Console) -> None:
    time_scale = args.time_scale or DEFAULT_TIME_SCALE
    async with Fleet(demo_specs(time_scale)) as fleet:
        # An autoscaled pool: up to four more 8B engines on H100, one warm at start; the
        # autoscaler starts (cold) and drains them with the demand it measures.
        holder: list[Gateway] = []
        slots = EmbeddedFleet.plan(SMALL_MODEL, "h100", 4, time_scale, prefix="auto")
        auto = EmbeddedFleet(
            slots,
            lambda n, st: holder[0].tracker.set_state(n, st),
            lambda n: holder[0].tracker.in_flight(n),
        )
        extra = [auto.endpoint_config(s) for s in slots]
        gateway = Gateway(demo_config(fleet, args.port, extra))
        holder.append(gateway)
        await auto.start_slot(slots[0].name, cold=False)
        scale = AutoscaleConfig(
            enabled=True, time_scale=time_scale,
            pools=(PoolScaleConfig(model=SMALL_MODEL, gpus=("h100",), max_replicas=4),),
        )  # fmt: skip

        def build() -> Any:
            app = gateway.build_app()
            setup_autoscaling(app, gateway, scale, auto)
            return app

        try:
            runner, port = await start_server(build(), "127.0.0.1", args.port)
        except OSError:
            console.print(f"[yellow]port {args.port} is busy; using a free one[/]")
            runner, port = await start_server(build(), "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
        _banner(console, url, fleet)
        load = None
        tasks: list[asyncio.Task[Any]] = []
        if args.load:
            rate = args.rate or 4.0
            load = LoadGenerator(url, args.load, rate, [SMALL_MODEL, SMALL_MODEL, BIG_MODEL])
            console.print(f"load: {args.load} at {rate:g} calls/s (time scale {time_scale:g})")
            tasks.append(asyncio.create_task(load.run(stop)))
        if args.duration:
            tasks.append(asyncio.create_task(_stop_after(stop, args.duration)))
        try:
            start = gateway.clock()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), SUMMARY_EVERY_S)
                console.print(_summary(gateway, load, gateway.clock() - start), highlight=False)
        finally:
            stop.set()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await runner.cleanup()
    console.print("[bold]inferplane stopped[/]")


async def _stop_after(stop: asyncio.Event, seconds: float) -> None:
    await asyncio.sleep(seconds)
    stop.set()


def run_demo(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    console = Console(file=sys.stdout, soft_wrap=True)
    run_until_signalled(lambda stop: _demo(args, stop, console))
    return 0
