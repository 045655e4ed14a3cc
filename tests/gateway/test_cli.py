"""`inferplane serve` refuses a bad config with the field path and no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_serve_bad_config_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "endpoints:\n"
        "  - {name: a, url: 'http://127.0.0.1:1', gpu: h100, price_per_hour_usd: -3, models: [m]}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "inferplane.cli", "serve", "-c", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "endpoints.0.price_per_hour_usd" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_missing_config_is_a_clean_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "inferplane.cli", "serve", "-c", str(tmp_path / "none.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "cannot read configuration" in proc.stderr and "Traceback" not in proc.stderr


ENDPOINT = "  - {name: a, url: 'http://127.0.0.1:1', gpu: h100, price_per_hour_usd: 2, models: [m]}"


def test_serve_says_what_no_api_keys_means(tmp_path: Path) -> None:
    from inferplane.config import hash_api_key, load_config
    from inferplane.gateway.cli import auth_note

    implicit, explicit, keyed = (tmp_path / f"{n}.yaml" for n in ("implicit", "anon", "keys"))
    implicit.write_text("endpoints:\n" + ENDPOINT + "\n")
    explicit.write_text("gateway: {auth: {mode: anonymous}}\nendpoints:\n" + ENDPOINT + "\n")
    keyed.write_text(
        "gateway: {auth: {mode: api_keys, keys: [{key_sha256: '"
        + hash_api_key("sk-1")
        + "', tenant: acme}]}}\nendpoints:\n"
        + ENDPOINT
        + "\n"
    )
    left_out = auth_note(load_config(implicit))
    assert left_out is not None and left_out.startswith("warning: no gateway.auth")
    asked = auth_note(load_config(explicit))
    assert asked is not None and asked.startswith("anonymous mode") and "anonymous" in asked
    assert auth_note(load_config(keyed)) is None
