"""The gateways of the scoreboard: how each is installed, configured and started.

Peers install from PyPI, each into its own virtualenv under ``bench/results/cache/venvs``
(git-ignored; never a dependency of inferplane). A peer that cannot be installed or
started is reported as "not run: <reason>" instead of failing the run. Every gateway
binds 127.0.0.1 on a free port and logs to ``bench/results/cache/logs``.

Settings (the peers' best documented ones for this fleet):
* inferplane: ``inferplane serve`` with the engines' KV events (precise prefix index),
  request log off, health checks 5 s x 3 strikes (as bench/routing.py: the CPU-starved
  emulated engines answer /health late), everything else at its defaults;
* inferplane ``workers=N`` (variant): the same with ``serve --workers N``;
* sglang-router / vllm-router: ``--policy cache_aware`` (their recommended policy for
  prefix reuse; defaults for its thresholds), plus extra rows for other policies, and
  warnings only (at INFO they log every request: ~50 MB per overhead run);
* LiteLLM proxy: one model name over all engines, ``routing_strategy: least-busy``,
  default retries, master key set, local cost map.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from peerlib.gateway_cmds import (
    MASTER_KEY,
    VARIANTS,
    WORKERS,
    inferplane_cmd,
    litellm_cmd,
    router_cmd,
    set_config_leaf,
)

__all__ = ["MASTER_KEY", "VARIANTS", "WORKERS", "set_config_leaf"]  # re-exported (their old home)

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "bench" / "results" / "cache"
VENVS = CACHE / "venvs"
LOGS = CACHE / "logs"


class GatewayKind(StrEnum):
    INFERPLANE = "inferplane"
    SGLANG = "sglang-router"
    VLLM = "vllm-router"
    LITELLM = "litellm"


PACKAGES: dict[GatewayKind, tuple[str, ...]] = {
    GatewayKind.SGLANG: ("sglang-router",),
    GatewayKind.VLLM: ("vllm-router",),
    # 1.106.12: the newest release whose proxy extra resolves from this machine's index
    # (1.108 and later need the separate litellm-proxy package, which is not published there).
    GatewayKind.LITELLM: ("litellm[proxy]==1.106.12", "prometheus_client"),
}


class PeerUnavailable(RuntimeError):
    """A peer that could not be installed or started; the message is the reason."""


@dataclass(frozen=True, slots=True)
class GatewaySpec:
    kind: GatewayKind
    policy: str | None = None

    @property
    def label(self) -> str:
        return self.kind.value if self.policy is None else f"{self.kind.value} {self.policy}"


def parse_spec(text: str) -> GatewaySpec:
    """``"sglang-router:round_robin"`` -> GatewaySpec; the routers default to cache_aware."""
    kind_text, _, policy = text.partition(":")
    kind = GatewayKind(kind_text)
    if kind in (GatewayKind.SGLANG, GatewayKind.VLLM):
        return GatewaySpec(kind, policy or "cache_aware")
    return GatewaySpec(kind, policy or None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def venv_python(kind: GatewayKind) -> Path:
    """The peer's virtualenv python, installing it on first use."""
    if kind is GatewayKind.INFERPLANE:
        return Path(sys.executable)
    venv = VENVS / kind.value
    stamp = venv / ".installed"
    python = venv / "bin" / "python"
    if stamp.exists():
        return python
    VENVS.mkdir(parents=True, exist_ok=True)
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PACKAGES[kind]],
            check=True,
            timeout=1200,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or "").strip().splitlines()[-1:] or ["pip failed"]
        raise PeerUnavailable(f"install failed: {tail[0][:200]}") from None
    except (subprocess.TimeoutExpired, OSError) as exc:
        raise PeerUnavailable(f"install failed: {exc}") from None
    stamp.write_text("ok\n")
    return python


def _inferplane_cmd(
    engines: list[dict[str, Any]], port: int, workdir: Path, variant: str | None = None
) -> list[str]:
    """inferplane's command line (``gateway_cmds.inferplane_cmd``; ``workers=N`` runs N)."""
    return inferplane_cmd(engines, port, workdir, variant)


def _router_cmd(spec: GatewaySpec, python: Path, urls: list[str], port: int) -> list[str]:
    policy = spec.policy or "cache_aware"
    return router_cmd(spec.kind.value, python, urls, port, policy, free_port())


@dataclass(slots=True)
class Running:
    spec: GatewaySpec
    proc: subprocess.Popen[bytes]
    url: str  # the chat completions URL
    api_key: str | None
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


GATEWAY_COUNTERS = (
    "inferplane_retries",
    "inferplane_rejects",
    "inferplane_requests",
    "inferplane_prefix",
    "inferplane_admission_decisions",
    "inferplane_kv_events",
    "inferplane_fallbacks",
)


def gateway_counters(run: Running) -> list[str]:
    """inferplane's own counters (retries, rejects, prefix routing...) at the end of a cell."""
    if run.spec.kind is not GatewayKind.INFERPLANE:
        return []
    url = run.url.removesuffix("/v1/chat/completions") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode(errors="replace")
    except OSError as exc:
        return [f"# scrape failed: {exc}"]
    return [
        line
        for line in text.splitlines()
        if line.startswith(GATEWAY_COUNTERS)
        and not line.endswith(" 0.0")
        and "_created" not in line
    ]


def gateway_prefix(run: Running) -> dict[str, Any]:
    """inferplane's prefix-routing stats (``/v1/stats``): how each keyed call's primary
    compared with the best prefix holder, with a few explained misses."""
    if run.spec.kind is not GatewayKind.INFERPLANE:
        return {}
    url = run.url.removesuffix("/v1/chat/completions") + "/v1/stats"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            stats = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}
    prefix: dict[str, Any] = stats.get("routing", {}).get("prefix", {})
    return prefix


def _wait_ready(run: Running, health: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.proc.poll() is not None:
            tail = run.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise PeerUnavailable(f"exited at start ({run.proc.returncode}): {' | '.join(tail)}")
        try:
            with urllib.request.urlopen(health, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    raise PeerUnavailable(f"not healthy within {timeout_s:.0f} s ({health})")


def _wait_serving(run: Running, model: str, timeout_s: float) -> None:
    """Until one small call through the gateway answers 200 (endpoints discovered)."""
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    ).encode()
    headers = {"Content-Type": "application/json"}
    if run.api_key:
        headers["Authorization"] = f"Bearer {run.api_key}"
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        req = urllib.request.Request(run.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise PeerUnavailable(f"no successful call within {timeout_s:.0f} s ({last})")


def start(
    spec: GatewaySpec,
    engines: list[dict[str, Any]],
    workdir: Path,
    model: str = "llama-3-8b",
) -> Running:
    """Start ``spec`` in front of ``engines`` (endpoint configs); wait until it is healthy."""
    python = venv_python(spec.kind)
    port = free_port()
    urls = [e["url"] for e in engines]
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    api_key: str | None = None
    if spec.kind is GatewayKind.INFERPLANE:
        cmd = _inferplane_cmd(engines, port, workdir, spec.policy)
        health = f"{base}/ready"
    elif spec.kind is GatewayKind.LITELLM:
        cmd, health = litellm_cmd(python, urls, port, workdir), f"{base}/health/liveliness"
        # Offline machine: without these, LiteLLM retries a tokenizer download from the
        # model hub for ~20 s on every call whose model name looks like llama-3.
        env.update(
            LITELLM_MASTER_KEY=MASTER_KEY,
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            LITELLM_LOG="ERROR",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        api_key = MASTER_KEY
    else:
        cmd, health = _router_cmd(spec, python, urls, port), f"{base}/v1/models"
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{spec.label.replace(' ', '-')}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    run = Running(spec, proc, f"{base}/v1/chat/completions", api_key, log)
    try:
        _wait_ready(run, health, 90.0)
        _wait_serving(run, model, 30.0)
    except BaseException:
        run.stop()
        raise
    return run
