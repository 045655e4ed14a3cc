"""Trace parsers (Azure CSV, Mooncake JSONL) and replay with shared prefixes."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferplane.sim.prompts import KeySpace
from inferplane.sim.scenario import Demand, TraceSource
from inferplane.sim.traces import (
    TraceCalls,
    TraceError,
    TraceRecord,
    parse_azure_csv,
    parse_mooncake_jsonl,
    prompt_for,
)

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000000,879,0
"""

MOONCAKE = """{"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 3]}

{"timestamp": 250, "input_length": 1030, "output_length": 20, "hash_ids": [1, 2, 4]}
{"timestamp": 1250, "input_length": 40, "output_length": 5, "hash_ids": [9]}
"""


def test_azure_csv() -> None:
    records = list(parse_azure_csv(AZURE.splitlines(keepends=True)))
    assert [r.prompt_tokens for r in records] == [374, 396, 879]
    assert [r.output_tokens for r in records] == [44, 109, 0]
    assert records[0].time_s == 0.0
    assert records[1].time_s == pytest.approx(4.314579, abs=1e-6)
    assert records[2].time_s == pytest.approx(4.3194100, abs=1e-6)


def test_azure_csv_errors_name_the_line() -> None:
    with pytest.raises(TraceError, match="header"):
        list(parse_azure_csv(["a,b\n", "1,2\n"]))
    bad = AZURE + "2023-11-16 18:15:52,-3,1\n"
    with pytest.raises(TraceError, match=":5: ContextTokens"):
        list(parse_azure_csv(bad.splitlines(keepends=True)))


def test_mooncake_jsonl() -> None:
    records = list(parse_mooncake_jsonl(MOONCAKE.splitlines()))
    assert [r.time_s for r in records] == [0.0, 0.25, 1.25]
    assert records[1].hash_ids == (1, 2, 4)
    with pytest.raises(TraceError, match=":1: missing field 'output_length'"):
        list(parse_mooncake_jsonl(['{"timestamp": 0, "input_length": 5}']))
    with pytest.raises(TraceError, match=":2:"):
        list(parse_mooncake_jsonl([MOONCAKE.splitlines()[0], "not json"]))


def test_hash_ids_become_shared_blocks() -> None:
    records = list(parse_mooncake_jsonl(MOONCAKE.splitlines()))
    keys = KeySpace(0)
    a, b = (prompt_for(r, 512, keys) for r in records[:2])
    assert len(a) == 1100 and len(b) == 1030
    assert a[:1024] == b[:1024]  # blocks 1 and 2 shared
    assert a[1024:1030] != b[1024:1030]
    plain = prompt_for(TraceRecord(0.0, 300, 5), 512, keys)
    assert len(plain) == 300 and plain[:16] != a[:16]


def test_trace_replay_source(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(MOONCAKE, encoding="utf-8")
    src = TraceSource.model_validate(
        {"name": "m", "kind": "trace", "path": "t.jsonl", "format": "mooncake_jsonl",
         "speedup": 2.0, "start_s": 10.0}
    )  # fmt: skip
    calls = TraceCalls(src, tmp_path, KeySpace(1), Demand(tokens_x=2.0), 1000)
    out = []
    while (nxt := calls.next_arrival()) is not None:
        out.append(nxt)
    assert [t for t, _ in out] == [10.0, 10.125, 10.625]
    assert [s.max_tokens for _, s in out] == [20, 40, 10]
    assert all(len(s.prompt_token_ids) + s.max_tokens <= 1000 for _, s in out)
