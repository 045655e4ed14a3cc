"""The scoreboard's gateway command lines: inferplane's ``workers=N`` variant, the routers'."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from peerlib import gateway_cmds as cmds
from peerlib import gateways as gw

ENGINES = [{"name": "e-0", "url": "http://127.0.0.1:1"}]


def test_split_workers_reads_a_leading_workers_count() -> None:
    assert cmds.split_workers(None) == (1, None)
    assert cmds.split_workers("fit16") == (1, "fit16")
    assert cmds.split_workers("workers=2") == (2, None)
    assert cmds.split_workers("workers=3+cfg.a.b=1") == (3, "cfg.a.b=1")
    with pytest.raises(ValueError):
        cmds.split_workers("workers=0")


def test_workers_variant_runs_n_workers_with_the_plain_config(tmp_path: Path) -> None:
    plain = gw._inferplane_cmd(ENGINES, 9000, tmp_path)
    plain_cfg = json.loads((tmp_path / "inferplane.yaml").read_text())
    two = gw._inferplane_cmd(ENGINES, 9000, tmp_path, "workers=2")
    assert json.loads((tmp_path / "inferplane.yaml").read_text()) == plain_cfg
    assert "--workers" not in plain
    assert two == [*plain, "--workers", "2"]


def test_workers_variant_combines_with_a_config_leaf(tmp_path: Path) -> None:
    leaf = "cfg.admission.headroom.slot_share.standard=0.5"
    cmd = gw._inferplane_cmd(ENGINES, 9000, tmp_path, f"workers=2+{leaf}")
    cfg = json.loads((tmp_path / "inferplane.yaml").read_text())
    assert cfg["admission"]["headroom"]["slot_share"]["standard"] == 0.5
    assert cmd[-2:] == ["--workers", "2"]


def test_workers_spec_parses_and_labels_as_its_own_row() -> None:
    spec = gw.parse_spec("inferplane:workers=2")
    assert spec.kind is gw.GatewayKind.INFERPLANE and spec.policy == "workers=2"
    assert spec.label == "inferplane workers=2"


@pytest.mark.parametrize(
    ("router", "level"), [("sglang-router", "warn"), ("vllm-router", "warning")]
)
def test_routers_run_quiet_and_keep_their_policy(router: str, level: str) -> None:
    # The level names are the ones each launcher's --help lists (sglang-router: debug, info,
    # warn, error; vllm-router: debug, info, warning, error, critical).
    cmd = gw._router_cmd(gw.parse_spec(router), Path("python"), ["http://a", "http://b"], 9000)
    assert cmd[cmd.index("--log-level") + 1] == level
    assert cmd[cmd.index("--policy") + 1] == "cache_aware"
    i = cmd.index("--worker-urls")
    assert cmd[i + 1 : i + 3] == ["http://a", "http://b"]
