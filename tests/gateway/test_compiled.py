"""The compiled build (``make compiled``, ``bench/gateway_compile.py``) is what is imported.

A compiled copy carries ``inferplane/compiled.json``: each compiled module and its source's
SHA-256. Run inside such a copy (``make test`` runs tests/core and tests/gateway there when
a C compiler is present), every listed module must come from its C extension, built from
the very source next to it; in a pure-Python tree (no manifest) that check is skipped. The
module lists of the build script must name modules that exist, in either tree.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import json
import sys
from pathlib import Path

import pytest

import inferplane

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gateway_compile as gc  # noqa: E402

PACKAGE = Path(inferplane.__file__).resolve().parent
EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def test_the_build_lists_name_existing_modules() -> None:
    for name in gc.MODULES:
        assert (ROOT / "inferplane" / "core" / f"{name}.py").is_file(), name
    for name in gc.GATEWAY_MODULES:
        assert (ROOT / "inferplane" / "gateway" / f"{name}.py").is_file(), name
    assert "routing" in gc.MODULES  # ClaimSource is structural: routing compiles


def test_compiled_modules_are_the_ones_imported() -> None:
    manifest = PACKAGE.parent / gc.MANIFEST
    if not manifest.is_file():
        pytest.skip("pure-Python tree: no compiled build here")
    built: dict[str, str] = json.loads(manifest.read_text())
    assert len(built) == len(gc.MODULES) + len(gc.GATEWAY_MODULES)
    for name, digest in built.items():
        module = importlib.import_module(name)
        where = module.__file__ or ""
        assert where.endswith(EXTENSIONS), f"{name} imported from {where}"
        source = Path(where).with_name(name.rsplit(".", 1)[1] + ".py")
        assert hashlib.sha256(source.read_bytes()).hexdigest() == digest, f"{name} is stale"
