"""Child processes of the scoreboard: the emulated fleet and the load generator.

Both are ``bench/peers.py`` itself with another ``--role``, so each runs on its own
event loop, apart from the orchestrator and the gateway under test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from peerlib import gateways as gw
from peerlib.stats import prefix_counts

PEERS = Path(__file__).resolve().parents[1] / "peers.py"


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, own and reaped children) of process ``pid``; 0 if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is fields[0]
    ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU seconds of this process's reaped children (the load generator, once done)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stop_child(proc: subprocess.Popen[bytes]) -> None:
    """Stop a child that runs until its stdin closes: close it, then kill after 15 s."""
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class FleetProc:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        out = workdir / "fleet.json"
        out.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            str(PEERS),
            "--role",
            "fleet",
            "--out",
            str(out),
            "--engines",
            str(args.engines),
            "--time-scale",
            str(args.time_scale),
            "--seed",
            str(args.seed),
            "--max-num-seqs",
            str(args.max_num_seqs),
        ]
        log = (gw.LOGS / "fleet.log").open("ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not out.exists() or not out.read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("the emulated fleet did not start (see cache/logs/fleet.log)")
            time.sleep(0.1)
        self.endpoints: list[dict[str, Any]] = json.loads(out.read_text())

    @property
    def urls(self) -> list[str]:
        return [e["url"] for e in self.endpoints]

    def prefix_counts(self) -> tuple[float, float]:
        hits = queries = 0.0
        for url in self.urls:
            try:
                with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
                    h, q = prefix_counts(resp.read().decode())
            except OSError:
                continue
            hits, queries = hits + h, queries + q
        return hits, queries

    def stop(self) -> None:
        stop_child(self.proc)


def run_load(spec: dict[str, Any], workdir: Path, timeout_s: float) -> dict[str, Any]:
    spec_path, out_path = workdir / "load-spec.json", workdir / "load-out.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(PEERS),
        "--role",
        "load",
        "--spec",
        str(spec_path),
        "--out",
        str(out_path),
    ]
    subprocess.run(cmd, check=True, timeout=timeout_s)
    return dict(json.loads(out_path.read_text()))
