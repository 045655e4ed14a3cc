"""``inferplane top``: a frame from a real gateway shows its endpoints, totals and rejects."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import aiohttp
import pytest
from rich.console import Console

from inferplane.gateway import top
from tests.gateway.fakes import fake_engines, fleet_config, running_gateway


def _text(frame: top.Frame) -> str:
    console = Console(record=True, width=220, color_system=None)
    console.print(top.render(frame))
    return console.export_text()


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    top.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


async def test_frame_from_a_live_gateway(capsys: pytest.CaptureFixture[str]) -> None:
    async with fake_engines(2) as engines, running_gateway(fleet_config(engines)) as (_, url):
        async with aiohttp.ClientSession() as s:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            for _ in range(3):
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200
            async with s.post(url + "/v1/chat/completions", json={**body, "model": "nope"}) as r:
                assert r.status == 404
        stats, metrics = await asyncio.to_thread(top.fetch, url, None)
        assert await asyncio.to_thread(_run_cli, ["top", "--url", url, "--once"]) == 0
    text = _text(top.Frame(stats, metrics))
    for e in stats["endpoints"]:
        assert e["name"] in text
    a = stats["accounting"]
    assert a["num_requests"] >= 3 and f"${a['fleet_spend_usd']:.6f}" in text
    assert top.reason_counts(metrics, "inferplane_rejects") == {"model_not_found": 1.0}
    assert "model_not_found" in text
    out = capsys.readouterr().out
    assert "endpoints" in out and stats["endpoints"][0]["name"] in out


def test_goodput_is_successes_per_second_between_frames() -> None:
    def stats(at: float, ok: int) -> dict[str, Any]:
        return {
            "in_flight": 0,
            "endpoints": [],
            "accounting": {
                "at_s": at, "fleet_spend_usd": 1.0, "num_requests": ok, "num_rejected": 0,
                "tasks": {"success": ok}, "cost_per_successful_task_usd": None,
            },
        }  # fmt: skip

    first = top.Frame(stats(10.0, 4), "")
    second = top._next(first, stats(12.0, 10), "")
    assert second.goodput_tasks_per_s == pytest.approx(3.0)
    assert "3.000" in _text(second)


def test_unreachable_gateway_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run_cli(["top", "--url", "http://127.0.0.1:9", "--once"]) == 1
    assert "cannot read" in capsys.readouterr().err
