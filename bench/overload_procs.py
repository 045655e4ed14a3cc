"""Child processes of the live overload bench: the emulated fleet and the gateway.

``bench/overload_live.py`` drives the clients in its own process; the engines run in a
second process (this file with ``fleet``) and the gateway in a third (``inferplane serve``
on the fleet's endpoint configs), each on its own event loop, so none of them steals the
others' loop: on a shared machine a late token then comes from a busy CPU, not from a
client or gateway coroutine that happened to run first.

    python bench/overload_procs.py fleet --out fleet.json --time-scale 2 --seed 3 \
        --engine h100:11.96 --engine a100:7.16      # runs until stdin closes
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from peerlib.procs import stop_child

HERE = Path(__file__).resolve()
LOGS = Path(tempfile.gettempdir()) / "inferplane-overload-live"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(check: Any, proc: subprocess.Popen[bytes], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the {what} did not start (logs: {LOGS})")
        time.sleep(0.1)


class FleetProc:
    """The emulated engines in a child process; ``endpoints`` are their gateway configs."""

    def __init__(
        self, model: str, tp: int, gpus: tuple[tuple[str, float], ...], time_scale: float,
        seed: int,
    ) -> None:  # fmt: skip
        LOGS.mkdir(parents=True, exist_ok=True)
        out = LOGS / f"fleet-{os.getpid()}.json"
        out.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            str(HERE),
            "fleet",
            "--out",
            str(out),
            "--model",
            model,
            "--tp",
            str(tp),
            "--time-scale",
            str(time_scale),
            "--seed",
            str(seed),
        ]
        for gpu, price in gpus:
            cmd += ["--engine", f"{gpu}:{price}"]  # fmt: skip
        log = (LOGS / "fleet.log").open("ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=log)
        try:
            _wait_for(lambda: out.exists() and out.read_text(), self.proc, "fleet", 60)
        except RuntimeError:
            self.stop()
            raise
        self.endpoints: list[dict[str, Any]] = json.loads(out.read_text())

    def stop(self) -> None:
        stop_child(self.proc)


class GatewayProc:
    """``inferplane serve`` on a config (a dict) in a child process, on a free port."""

    def __init__(self, config: dict[str, Any]) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        path = LOGS / f"gateway-{os.getpid()}.json"
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        cmd = [sys.executable, "-m", "inferplane.cli", "serve", "-c", str(path),
               "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
               "--no-request-log", "--drain-timeout-s", "1"]  # fmt: skip
        log = (LOGS / "gateway.log").open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log)
        self.url = f"http://127.0.0.1:{self.port}"
        try:
            _wait_for(self._ready, self.proc, "gateway", 60)
        except RuntimeError:
            self.stop()
            raise

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stats(self) -> dict[str, Any]:
        """The gateway's ``/v1/stats`` body ({} when it does not answer)."""
        try:
            with urllib.request.urlopen(self.url + "/v1/stats", timeout=10) as resp:
                return dict(json.loads(resp.read()))
        except OSError:
            return {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __enter__(self) -> GatewayProc:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def role_fleet(args: argparse.Namespace) -> None:
    """Run the engines until stdin closes; write their endpoint configs to ``--out``."""
    from inferplane.engine.fleet import EngineSpec, serve_until_stdin_closes

    specs = []
    for item in args.engine:
        gpu, price = item.split(":")
        specs.append(EngineSpec(model=args.model, gpu=gpu, tensor_parallel=args.tp,
                                time_scale=args.time_scale, price_per_hour_usd=float(price),
                                name_prefix=gpu, seed=args.seed))  # fmt: skip

    serve_until_stdin_closes(specs, Path(args.out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["fleet"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", action="append", default=[], help="gpu:price_per_hour")
    args = parser.parse_args()
    role_fleet(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
