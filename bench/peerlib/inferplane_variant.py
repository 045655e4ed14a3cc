"""``inferplane`` started with knobs its fleet config cannot express yet, for the scoreboard.

    python bench/peerlib/inferplane_variant.py speculative_ttl_s=30 serve -c fleet.yaml ...

Knobs ("+"-joined): ``speculative_ttl_s`` / ``approximate_ttl_s``, prefix-index knobs
(``PrefixIndexConfig`` is built with ``block_size`` only), for diagnostic rows, never the
scoreboard's. (The engines' batch slots need no wrapper: they reach the gateway in the
endpoint configs, ``emulated.overrides``.)
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from inferplane.core.prefix_index import PrefixIndexConfig

KNOBS = ("speculative_ttl_s", "approximate_ttl_s")


def parse_knobs(text: str) -> dict[str, float]:
    """``"speculative_ttl_s=30+approximate_ttl_s=5"`` -> {knob: value}; SystemExit if unknown."""
    out: dict[str, float] = {}
    for item in text.split("+"):
        knob, _, value = item.partition("=")
        if knob not in KNOBS:
            raise SystemExit(f"unknown knob {knob!r}; one of {KNOBS}")
        out[knob] = float(value)
    return out


def main() -> None:
    knobs = parse_knobs(sys.argv[1])
    import inferplane.gateway.router as router
    from inferplane.cli import main as cli_main

    if knobs:
        kwargs: dict[str, Any] = dict(knobs)  # the ttl knobs are floats; the model checks
        patched = functools.partial(PrefixIndexConfig, **kwargs)
        setattr(router, "PrefixIndexConfig", patched)  # noqa: B010 (a module attribute)
    sys.exit(cli_main(sys.argv[2:]))


if __name__ == "__main__":
    main()
