"""``inferplane`` started with knobs its fleet config cannot express yet, for the scoreboard.

    python bench/peerlib/inferplane_variant.py max_num_seqs=16 serve -c fleet.yaml ...
    python bench/peerlib/inferplane_variant.py speculative_ttl_s=30+max_num_seqs=16 serve ...

Knobs ("+"-joined):
* ``max_num_seqs=N``: the emulated engines run with N batch slots (vLLM's --max-num-seqs;
  the scoreboard's engines use a small one so the fleet, not this machine's CPUs, is the
  bottleneck). The gateway reads an emulated endpoint's latency prior (batch slots
  included) off the engine profile, and ``EmulatedConfig`` has no field for profile
  overrides, so this patches the profile loader that ``inferplane.gateway.priors`` binds:
  the gateway then knows the slots the engines really have, as a deployer would tell it.
  The scoreboard's inferplane row uses only this knob.
* ``speculative_ttl_s`` / ``approximate_ttl_s``: prefix-index knobs (``PrefixIndexConfig``
  is built with ``block_size`` only), for diagnostic rows, never the scoreboard's.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from inferplane.core.prefix_index import PrefixIndexConfig

INDEX_KNOBS = ("speculative_ttl_s", "approximate_ttl_s")
KNOBS = (*INDEX_KNOBS, "max_num_seqs")


def parse_knobs(text: str) -> dict[str, float]:
    """``"max_num_seqs=16+speculative_ttl_s=30"`` -> {knob: value}; SystemExit if unknown."""
    out: dict[str, float] = {}
    for item in text.split("+"):
        knob, _, value = item.partition("=")
        if knob not in KNOBS:
            raise SystemExit(f"unknown knob {knob!r}; one of {KNOBS}")
        out[knob] = float(value)
    return out


def main() -> None:
    knobs = parse_knobs(sys.argv[1])
    import inferplane.gateway.priors as priors
    import inferplane.gateway.router as router
    from inferplane.cli import main as cli_main
    from inferplane.engine.profiles import load_profile

    index: dict[str, Any] = {k: v for k, v in knobs.items() if k in INDEX_KNOBS}
    if index:
        patched = functools.partial(PrefixIndexConfig, **index)
        setattr(router, "PrefixIndexConfig", patched)  # noqa: B010 (a module attribute)
    if "max_num_seqs" in knobs:
        slots = int(knobs["max_num_seqs"])

        def sized(model: str, gpu: str, tp: int | None = None, **kw: Any) -> Any:
            overrides = {**(kw.get("overrides") or {}), "max_num_seqs": slots}
            return load_profile(model, gpu, tp, overrides=overrides)

        setattr(priors, "load_profile", sized)  # noqa: B010 (a module attribute, patched)
    sys.exit(cli_main(sys.argv[2:]))


if __name__ == "__main__":
    main()
