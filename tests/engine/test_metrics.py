"""/metrics: vLLM names, parseable by prometheus_client, counting what happened."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from inferplane.engine.fleet import EngineSpec
from inferplane.engine.metrics import LatencyHistogram
from tests.engine.engine_helpers import MODEL, running_fleet

GAUGES = {
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:cache_config_info",
}
COUNTERS = {
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
}


def test_histogram_buckets_are_cumulative_with_le_semantics() -> None:
    hist = LatencyHistogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 2.0):
        hist.observe(value)
    assert hist.cumulative_buckets() == [("0.1", 2.0), ("1.0", 3.0), ("+Inf", 4.0)]
    assert hist.count == 4 and abs(hist.sum - 2.65) < 1e-9


async def test_metrics_parse_and_count_requests() -> None:
    with running_fleet(EngineSpec(time_scale=0.05)) as fleet:
        url = fleet.engines[0].url
        body = {"model": MODEL, "prompt": "alpha " * 40, "max_tokens": 10, "ignore_eos": True}
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
            async with session.get(url + "/metrics") as resp:
                assert resp.headers["Content-Type"].startswith("text/plain")
                text = await resp.text()
    samples = {}
    labels = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, sample.value)
            labels.setdefault(sample.name, sample.labels)
    names = set(samples)
    assert names >= GAUGES and names >= COUNTERS
    assert {h + "_count" for h in HISTOGRAMS} <= names
    assert all(labels[n]["model_name"] == MODEL for n in GAUGES | COUNTERS)
    info = labels["vllm:cache_config_info"]
    assert info["block_size"] == "16" and int(info["num_gpu_blocks"]) > 1000
    assert samples["vllm:generation_tokens_total"] == 30
    assert samples["vllm:prefix_cache_hits_total"] > 0  # requests 2 and 3 reuse the prompt
    assert samples["vllm:time_to_first_token_seconds_count"] == 3
    assert samples["vllm:inter_token_latency_seconds_count"] == 27
    assert samples["vllm:e2e_request_latency_seconds_count"] == 3
    assert samples["vllm:num_requests_running"] == 0
