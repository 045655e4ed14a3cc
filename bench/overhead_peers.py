"""What each gateway costs on a trivial backend: inferplane, sglang-router, vllm-router, LiteLLM.

    python bench/overhead_peers.py [--quick] [--gateways inferplane,sglang-router,...] [--out F]

Requests/s and added latency p50/p99 (at saturation, 64 concurrent), direct and through
each gateway, streaming and not, with the scoreboard's load generator; peers from their
cache virtualenvs (installed on first use). ``bench/peers.py`` runs the same section at
the end of the scoreboard; this runs it alone. Writes bench/results/overhead-peers.json
(or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peerlib import gateways as gw
from peerlib.overhead import measure_overhead, overhead_lines

RESULTS = Path(__file__).resolve().parent / "results" / "overhead-peers.json"


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--gateways", default="inferplane,sglang-router,vllm-router,litellm")
    p.add_argument("--out", default=str(RESULTS), help="where the JSON results go")
    args = p.parse_args()
    specs = [gw.parse_spec(s) for s in args.gateways.split(",") if s]
    not_run: dict[str, str] = {}
    for spec in specs:
        try:
            gw.venv_python(spec.kind)
        except gw.PeerUnavailable as exc:
            not_run[spec.label] = str(exc)
    rows = measure_overhead(args, specs, not_run, Path(tempfile.mkdtemp(prefix="overhead-")))
    lines = overhead_lines(rows) + [f"- {k}: not run: {v}" for k, v in sorted(not_run.items())]
    print("\n".join(lines))
    out = {"rows": rows, "not_run": not_run, "table": lines}
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
