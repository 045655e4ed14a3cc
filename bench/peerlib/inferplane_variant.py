"""``inferplane`` with one prefix-index knob changed, for diagnostic rows of the scoreboard.

    python bench/peerlib/inferplane_variant.py speculative_ttl_s=30 serve -c fleet.yaml ...

The gateway builds its prefix index with ``PrefixIndexConfig(block_size=...)`` and no way
to set the other fields from the fleet config, so a diagnostic row (``--gateways
inferplane:speculative_ttl_s=30``) patches the class the router module binds before the
CLI starts. It is never the scoreboard's inferplane row: that one runs the plain CLI.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from inferplane.core.prefix_index import PrefixIndexConfig

KNOBS = ("speculative_ttl_s", "approximate_ttl_s")


def main() -> None:
    knob, _, value = sys.argv[1].partition("=")
    if knob not in KNOBS:
        raise SystemExit(f"unknown knob {knob!r}; one of {KNOBS}")
    import inferplane.gateway.router as router
    from inferplane.cli import main as cli_main

    changes: dict[str, Any] = {knob: float(value)}
    patched = functools.partial(PrefixIndexConfig, **changes)
    setattr(router, "PrefixIndexConfig", patched)  # noqa: B010 (a module attribute, patched)
    sys.exit(cli_main(sys.argv[2:]))


if __name__ == "__main__":
    main()
