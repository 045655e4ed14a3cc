"""Engine load is read from each engine kind's own metric names."""

from __future__ import annotations

import pytest

from inferplane.core.types import EngineKind
from inferplane.gateway.exposition import parse_engine_metrics

VLLM = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 3.0
vllm:num_requests_waiting{model_name="b"} 2.0
vllm:num_requests_running{model_name="a"} 7.0
vllm:gpu_cache_usage_perc{model_name="a"} 0.5
vllm:num_requests_running_total 99
vllm:time_to_first_token_seconds_bucket{le="0.1"} 4.0
"""


@pytest.mark.parametrize(
    ("kind", "text", "want"),
    [
        (EngineKind.VLLM, VLLM, (5, 7, 0.5)),
        (
            EngineKind.SGLANG,
            'sglang:num_queue_reqs{x="1"} 4\nsglang:num_running_reqs 2\nsglang:token_usage 0.9\n',
            (4, 2, 0.9),
        ),
        (
            EngineKind.TRTLLM,
            "trtllm_num_requests_waiting 1\ntrtllm_num_requests_running 6\n"
            "trtllm_kv_cache_utilization 1.7\n",
            (1, 6, 1.0),  # KV use is clamped to [0, 1]
        ),
        (EngineKind.VLLM, 'vllm:num_requests_waiting{a="}"} NaN\n', (None, None, None)),
        (EngineKind.OPENAI, VLLM, (None, None, None)),
    ],
)
def test_parse_engine_metrics(kind: EngineKind, text: str, want: tuple[object, ...]) -> None:
    s = parse_engine_metrics(text, kind)
    assert (s.num_waiting, s.num_running, s.kv_usage) == want
