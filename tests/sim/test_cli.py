"""`inferplane simulate`: JSON and HTML out, clear errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferplane.cli import main

from .helpers import write_scenario


@pytest.mark.slow
def test_simulate_writes_json_and_html(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, duration_s=6, drain_s=10)
    out = tmp_path / "out"
    assert main(["simulate", str(path), "--out", str(out), "--quiet", "--seed", "9"]) == 0
    doc = json.loads((out / "result.json").read_text(encoding="utf-8"))
    assert doc["seed"] == 9
    assert set(doc["policies"]) == {"inferplane", "round-robin"}
    summary = doc["policies"]["inferplane"]["summary"]
    assert summary["overall"]["calls"] > 0
    assert summary["spend_usd"] > 0
    assert set(summary["classes"]) == {"chat", "agents"}
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") >= 5
    assert "inferplane" in page


def test_simulate_policy_subset_and_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_scenario(tmp_path, duration_s=5, drain_s=5)
    out = tmp_path / "o"
    args = ["simulate", str(path), "--out", str(out), "--quiet", "--no-html"]
    assert main([*args, "--policies", "random"]) == 0
    doc = json.loads((out / "result.json").read_text(encoding="utf-8"))
    assert list(doc["policies"]) == ["random"]
    assert not (out / "report.html").exists()
    assert main([*args, "--policies", "bogus"]) == 2
    assert "bogus" in capsys.readouterr().err
    bad = write_scenario(tmp_path, faults=[{"kind": "crash", "at_s": 1, "endpoints": ["x"]}])
    assert main(["simulate", str(bad), "--out", str(out), "--quiet"]) == 2
    assert "unknown endpoints x" in capsys.readouterr().err
