"""The `inferplane` command: one entry point, one sub-command per body.

Each sub-command lives next to the code it runs and registers itself here through a
``register(subparsers)`` function, so this file stays a table of contents and importing
it stays cheap (sub-command modules import their heavy dependencies lazily).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Modules that contribute sub-commands, each exposing ``register(subparsers)``.
COMMAND_MODULES: tuple[str, ...] = (
    "inferplane.engine.cli",
    "inferplane.gateway.cli",
    "inferplane.sim.cli",
    "inferplane.gateway.top",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferplane", description="A unified control plane for LLM inference fleets."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise  # a missing dependency inside the module, not the module itself
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
