"""The command lines of the scoreboard's gateways: inferplane's config and variants, the
Rust routers' flags, LiteLLM's config (``gateways.start`` runs them).

inferplane variants (``--gateways inferplane:<variant>``), each a diagnostic row:
``workers=N`` (``serve --workers N``: N processes on one port, as many as cores is the
like-for-like row against the routers' thread per core), ``weights.<axis>=X`` (routing
scorer weights), ``cfg.<path>=X`` (a config leaf), a named one from ``VARIANTS``, or a
prefix-index knob (``inferplane_variant.py``); several join with ``+`` except ``workers=``,
which may lead any of them (``workers=2+cfg.admission...``).

The routers log each request at INFO by default (~50 MB per overhead run); they run at
``--log-level warn`` here (vllm-router spells it ``warning``), which does not change what
they route.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "MASTER_KEY",
    "ROUTERS",
    "VARIANTS",
    "WORKERS",
    "inferplane_cmd",
    "litellm_cmd",
    "router_cmd",
    "router_limits",
    "set_config_leaf",
    "split_workers",
]

WORKERS = "workers="
MASTER_KEY = "sk-peers-bench"

#: Named diagnostic variants of inferplane (``--gateways inferplane:fit16``).
#: fit16: slot_share 0.07/0.13 (1 / 2 of 16 slots kept for the classes above), the
#: defaults since 2026-12-01 (h2diag1: 902 vs 853 tasks in time at 0.2/0.25); the row is
#: kept for runs of older commits (0.2/0.25; before them 0.8/0.85).
_HEADROOM = "cfg.admission.headroom"
VARIANTS = {
    "fit16": f"{_HEADROOM}.slot_share.standard=0.07+{_HEADROOM}.slot_share.sheddable=0.13",
}


def split_workers(variant: str | None) -> tuple[int, str | None]:
    """``"workers=2+cfg.x=1"`` -> (2, "cfg.x=1"); no ``workers=`` lead -> (1, variant)."""
    if variant is None or not variant.startswith(WORKERS):
        return 1, variant
    head, _, rest = variant.partition("+")
    count = int(head.removeprefix(WORKERS))
    if count < 1:
        raise ValueError(f"workers must be at least 1: {variant!r}")
    return count, rest or None


def inferplane_cmd(
    engines: list[dict[str, Any]],
    port: int,
    workdir: Path,
    variant: str | None = None,
) -> list[str]:
    # Defaults, except health checks as bench/routing.py sets them for this rig: the
    # emulated engines share 2 starved CPUs with the gateway and the client, so their
    # /health answers late and 2 strikes of 1 s flapped healthy engines COLD (503
    # no_capacity). The peers have no such check to loosen (they keep routing to every
    # worker URL), so this only removes an artefact of the rig.
    gateway = {
        "host": "127.0.0.1",
        "port": port,
        "log_requests": False,
        "health_timeout_s": 5.0,
        "unhealthy_after": 3,
    }
    cfg: dict[str, Any] = {"gateway": gateway, "endpoints": engines}
    # A variant is a diagnostic row, never the scoreboard's: "weights.kv_cache=8" (routing
    # scorer weights, "+"-joined) or "speculative_ttl_s=30" (a prefix-index knob). The
    # engines' batch slots reach the gateway's priors in their endpoint configs
    # (``emulated.overrides``), as a deployer would state them.
    knobs: list[str] = []
    workers, variant = split_workers(variant)
    variant = VARIANTS.get(variant or "", variant)
    if variant is not None and variant.startswith("weights."):
        pairs = (item.removeprefix("weights.").split("=") for item in variant.split("+"))
        cfg["routing"] = {"weights": {axis: float(value) for axis, value in pairs}}
    elif variant is not None and variant.startswith("cfg."):
        for item in variant.split("+"):
            leaf, _, value = item.removeprefix("cfg.").partition("=")
            set_config_leaf(cfg, leaf.split("."), float(value))
    elif variant is not None:
        knobs.append(variant)
    head = ["-m", "inferplane.cli"]
    if knobs:
        head = [str(Path(__file__).with_name("inferplane_variant.py")), "+".join(knobs)]
    path = workdir / "inferplane.yaml"
    path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    return [
        sys.executable,
        *head,
        "serve",
        "-c",
        str(path),
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-request-log",
        *(["--workers", str(workers)] if workers > 1 else []),
    ]


def set_config_leaf(cfg: dict[str, Any], path: list[str], value: float) -> None:
    """Set ``path`` (e.g. admission.headroom.slot_share.standard) in a fleet config dict.

    The leaf's parent model is written whole, its other fields at their defaults, so a
    per-class value can be changed alone (pydantic needs all three classes)."""
    from inferplane.config import FleetConfig

    model: Any = FleetConfig.model_fields[path[0]].default
    for name in path[1:-1]:
        model = getattr(model, name)
    node = cfg
    for name in path[:-2]:
        node = node.setdefault(name, {})
    parent = node.get(path[-2])
    if parent is None:  # a model whose fields are all required (PerClass) is written whole
        whole = all(f.is_required() for f in type(model).model_fields.values())
        parent = model.model_dump() if whole else {}
    parent[path[-1]] = value
    node[path[-2]] = parent


def router_limits(policy: str) -> tuple[str, list[str]]:
    """``"cache_aware+limit=128+queue=0"`` -> ("cache_aware", [--max-concurrent-requests...]).

    The routers' own concurrency limiter (off by default): at most ``limit`` calls in
    flight, ``queue`` more waiting, the rest answered 429 at once."""
    name, *opts = policy.split("+")
    flags = {"limit": "--max-concurrent-requests", "queue": "--queue-size"}
    extra: list[str] = []
    for opt in opts:
        key, _, value = opt.partition("=")
        extra += [flags[key], str(int(value))]
    return name, extra


#: Each router's launcher and its name for the warning log level (the two spell it apart).
ROUTERS = {
    "sglang-router": ("sglang_router.launch_router", "warn"),
    "vllm-router": ("vllm_router.launch_router", "warning"),
}


def router_cmd(
    router: str, python: Path, urls: list[str], port: int, policy: str, metrics_port: int
) -> list[str]:
    """A Rust router (``router``: a key of ``ROUTERS``) on ``port``, logging warnings only."""
    module, quiet = ROUTERS[router]
    name, limits = router_limits(policy)
    return [
        str(python), "-m", module, "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *urls, "--policy", name, *limits,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--log-level", quiet,
    ]  # fmt: skip


def litellm_cmd(python: Path, urls: list[str], port: int, workdir: Path) -> list[str]:
    cfg = {
        "model_list": [
            {
                "model_name": "llama-3-8b",
                "litellm_params": {
                    "model": "openai/llama-3-8b",
                    "api_base": f"{u}/v1",
                    "api_key": "none",
                },
            }
            for u in urls
        ],
        "router_settings": {"routing_strategy": "least-busy"},
        "general_settings": {"master_key": MASTER_KEY},
    }
    path = workdir / "litellm.yaml"
    path.write_text(json.dumps(cfg, indent=1))
    litellm = python.parent / "litellm"
    return [str(litellm), "--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
