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
