"""An opt-in compiled copy of inferplane: the call path's core and gateway modules, by mypyc.

The gateway spends most of its per-call CPU in small pure-Python steps of the policy core
(``bench/gateway_callpath.py``). mypyc, which ships with mypy (a dev dependency), compiles
type-annotated modules to C extensions with no source change. This script never touches the
working tree: it exports a commit (``git archive``, default HEAD) to ``--out`` and compiles
the listed modules there, next to their sources, so that

    PYTHONPATH=build/compiled python -m inferplane.cli serve -c fleet.yaml

runs the compiled core (``make compiled`` builds it). Compiled modules shadow their ``.py``
files, which is why it is a separate copy: a source edit in the checkout is never hidden by
a stale build. Not part of ``make test`` (a full build is minutes of C compilation on two
cores).

With the gateway's own call-path modules compiled too (``GATEWAY_MODULES``), the instances of
their classes take no monkeypatched methods or attributes of another type: tests and benches
that patch them (``bench/gateway_callpath.py``'s stage timers and in-memory engine,
``tests/gateway/test_shared_ledger.py``'s spy) run on the plain tree only; build with
``--gateway-modules ""`` for a core-only copy they accept. The rest of tests/gateway passes
on the compiled copy.

``routing`` builds since its ``ClaimSource`` Protocol is checked structurally (no longer
``@runtime_checkable``, which mypyc rejects). In the gateway, the context, error, hedging,
admission-gate, router, reliability, cache, tracing, SSE-filter modules, the front server
(``server``: its two classes built on aiohttp's, ``FrontProtocol`` and ``FrontSite``, whose
``__slots__`` a native class cannot take, are ``mypyc_attr(native_class=False)``: plain
classes whose methods are compiled), its request and the upstream client
(``server_request``, ``upstream``, ``upstream_conn``, ``upstream_response``) and the
request path's counters and histograms (``metric_series``) build too. Left out: the pydantic
config modules (``admission_config``, ``routing_config``, ``cache_config``: compiled
references to pydantic's modules do not build) and modules off the call path (autoscaler,
simulator, prefix index, semantic cache); in the gateway ``upstream_errors`` (exceptions
subclassing aiohttp's) and ``hedge_io`` (async generators).

mypyc runs a ``@dataclass``'s generated ``__init__`` interpreted (1,350 ns for a 3-field
frozen value against 63 ns written out, compiled); the call path's hot value classes therefore
write theirs out (``init=False``, f4b32f8; ``tests/core/test_explicit_init.py`` keeps each in
step with its fields): 11-12% less gateway CPU per request in
``bench/results/gateway-overhead-lead-f4b32f8.md``.

The C is split per module (``multi_file``) and compiled on every core (``build_ext -j``);
``--opt-level`` is mypyc's (3 by default).

``--worktree`` builds the working tree's files instead of a commit (``make compiled``, which
``make demo`` and ``make test`` run when a C compiler is present). The copy's
``inferplane/compiled.json`` names the compiled modules with their sources' SHA-256.

    python bench/gateway_compile.py [--out build/compiled] [--commit HEAD | --worktree]
        [--modules a,b] [--gateway-modules c,d] [--opt-level 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Pure core modules on the gateway's call path that mypyc builds (checked by building).
MODULES = (
    "predictor", "filters", "capacity", "headroom", "admission", "admission_stats",
    "admission_deadline", "admission_decisions", "quotas", "breaker", "breaker_types",
    "latency_outliers", "throttle", "accounting", "accounting_types", "spend_meter",
    "candidates", "scoring_context", "scorers", "affinity", "retry", "queueing",
    "queue_items", "cache", "prompt_reuse", "kv_claims", "slowstart", "resumption",
    "workflows", "workflow_sync", "types", "routing", "output_lengths",
)  # fmt: skip
#: Gateway modules on the call path that build too (``--gateway-modules ""``: core only).
GATEWAY_MODULES = (
    "planner", "recorder", "exchange", "relay", "proxy", "app", "tracker", "metrics",
    "request_body", "context", "context_types", "errors", "hedge", "admission_gate", "router",
    "reliability", "response_cache", "tracing", "sse_filter", "server", "server_request",
    "upstream", "upstream_conn", "upstream_response", "metric_series",
)  # fmt: skip


#: Written into the compiled copy's package: the compiled modules and their sources' SHA-256
#: (``tests/gateway/test_compiled.py`` checks them against what is imported).
MANIFEST = "inferplane/compiled.json"


def export(commit: str | None, out: Path) -> None:
    """The commit's tree (tracked files only) at ``out``, replacing what was there; with
    ``commit`` None, the working tree's files as they are now (tracked and untracked, not
    ignored: what ``make compiled`` builds, so a source edit is never hidden)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if commit is None:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"], check=True, capture_output=True,
        ).stdout  # fmt: skip
        for name in filter(None, listed.decode().split("\0")):
            src = ROOT / name
            if src.is_file() and not src.is_symlink():
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, out / name)
        return
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)


#: The build script ``compile_modules`` writes (what the ``mypyc`` command writes, plus
#: ``multi_file``: one C file per module, so ``build_ext -j`` compiles them in parallel).
SETUP = """from setuptools import setup
from mypyc.build import mypycify

setup(name="inferplane_compiled", ext_modules=mypycify({files!r}, opt_level={opt!r},
      multi_file=True))
"""


def compile_modules(out: Path, modules: list[str], opt_level: str = "3") -> float:
    """Build ``modules`` (``core/x``, ``gateway/y``) in place in ``out``; seconds taken."""
    files = [f"inferplane/{m}.py" for m in modules]
    (out / "build").mkdir(exist_ok=True)
    setup = out / "build" / "setup.py"
    setup.write_text(SETUP.format(files=files, opt=opt_level))
    jobs = str(os.cpu_count() or 1)
    start = time.monotonic()
    cmd = [sys.executable, str(setup), "build_ext", "--inplace", "-j", jobs]
    subprocess.run(cmd, cwd=out, check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(out / "build", ignore_errors=True)  # C sources and objects
    return time.monotonic() - start


def write_manifest(out: Path, modules: list[str]) -> None:
    """``MANIFEST``: each compiled module's dotted name and its source's SHA-256."""
    sources = {
        "inferplane." + m.replace("/", "."): hashlib.sha256(
            (out / "inferplane" / f"{m}.py").read_bytes()
        ).hexdigest()
        for m in modules
    }
    (out / MANIFEST).write_text(json.dumps(sources, indent=1, sort_keys=True))


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "build" / "compiled"))
    p.add_argument("--commit", default="HEAD", help="the commit to export ('' with --worktree)")
    p.add_argument("--worktree", action="store_true", help="build the working tree's files")
    p.add_argument("--modules", default=",".join(MODULES), help="core module names")
    p.add_argument("--gateway-modules", default=",".join(GATEWAY_MODULES))
    p.add_argument("--opt-level", default="3", help="mypyc's optimisation level, 0-3")
    args = p.parse_args()
    out = Path(args.out).resolve()
    if out == ROOT or out in ROOT.parents:
        raise SystemExit("--out must be a separate folder (not the checkout itself)")
    export(None if args.worktree else args.commit, out)
    core = [f"core/{m}" for m in args.modules.split(",") if m]
    gateway = [f"gateway/{m}" for m in args.gateway_modules.split(",") if m]
    took_s = compile_modules(out, core + gateway, args.opt_level)
    write_manifest(out, core + gateway)
    built = sorted(p.name for p in (out / "inferplane").glob("*/*.so"))
    print(f"compiled {len(built)} modules in {took_s:.0f} s into {out}")
    print(f"run with: PYTHONPATH={out} python -m inferplane.cli serve -c <fleet.yaml>")


if __name__ == "__main__":
    main()
