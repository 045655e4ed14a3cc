"""What each gateway costs on a trivial backend: inferplane, sglang-router, vllm-router, LiteLLM.

    python bench/overhead_peers.py [--quick] [--gateways inferplane,sglang-router,...]
        [--workers 1,2] [--rounds N] [--out F]

Requests/s and added latency p50/p99 (at saturation, 64 concurrent), direct and through
each gateway, streaming and not, with the scoreboard's load generator; peers from their
cache virtualenvs (installed on first use). ``bench/peers.py`` runs the same section at
the end of the scoreboard; this runs it alone. Writes bench/results/overhead-peers.json
(or ``--out``).

``--workers 1,2`` (the default) runs inferplane once per worker count (``inferplane serve
--workers N``; row ``inferplane workers=N``, the ``workers=N`` variant that
``peerlib.gateway_cmds`` reads, so ``bench/peers.py --gateways inferplane:workers=2`` runs it
too). The Rust routers run a thread per core, so the
like-for-like row, the one the target is judged on, has as many workers as cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peerlib import gateways as gw
from peerlib.overhead import measure_overhead, overhead_lines, overhead_verdicts

RESULTS = Path(__file__).resolve().parent / "results" / "overhead-peers.json"


def _expand(gateways: str, workers: str) -> list[gw.GatewaySpec]:
    """The specs, the plain ``inferplane`` one repeated per worker count (1: as given)."""
    specs: list[gw.GatewaySpec] = []
    for text in (s for s in gateways.split(",") if s):
        spec = gw.parse_spec(text)
        if spec.kind is not gw.GatewayKind.INFERPLANE or spec.policy is not None:
            specs.append(spec)
            continue
        for n in (int(w) for w in workers.split(",") if w):
            specs.append(spec if n == 1 else gw.GatewaySpec(spec.kind, f"{gw.WORKERS}{n}"))
    return specs


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=1, help="every gateway measured per round")
    p.add_argument("--gateways", default="inferplane,sglang-router,vllm-router,litellm")
    p.add_argument("--workers", default="1,2", help="inferplane worker counts, a row each")
    p.add_argument("--out", default=str(RESULTS), help="where the JSON results go")
    args = p.parse_args()
    specs = _expand(args.gateways, args.workers)
    not_run: dict[str, str] = {}
    for spec in specs:
        try:
            gw.venv_python(spec.kind)
        except gw.PeerUnavailable as exc:
            not_run[spec.label] = str(exc)
    rows = measure_overhead(args, specs, not_run, Path(tempfile.mkdtemp(prefix="overhead-")))
    lines = overhead_lines(rows) + overhead_verdicts(rows)
    lines += [f"- {k}: not run: {v}" for k, v in sorted(not_run.items())]
    print("\n".join(lines))
    out = {"rows": rows, "not_run": not_run, "table": lines}
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
