"""Reading engine load from Prometheus text: the few samples routing needs, by engine kind.

vLLM, SGLang and TensorRT-LLM name the same signals differently (REFERENCE.md section 1).
This module maps each kind's names onto one :class:`EngineSample` and reads a scrape line by
line, looking only at lines whose metric name it knows, so a large /metrics page (histograms,
process metrics) costs little. Pure: no I/O and no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferplane.core.types import EngineKind

_WAITING = "waiting"
_RUNNING = "running"
_KV = "kv"

#: metric name -> signal, per engine kind. Plain OpenAI servers export nothing we read.
_NAMES: dict[EngineKind, dict[str, str]] = {
    EngineKind.VLLM: {
        "vllm:num_requests_waiting": _WAITING,
        "vllm:num_requests_running": _RUNNING,
        "vllm:kv_cache_usage_perc": _KV,
        "vllm:gpu_cache_usage_perc": _KV,
    },
    EngineKind.SGLANG: {
        "sglang:num_queue_reqs": _WAITING,
        "sglang:num_running_reqs": _RUNNING,
        "sglang:token_usage": _KV,
    },
    EngineKind.TRTLLM: {
        "trtllm_num_requests_waiting": _WAITING,
        "trtllm_num_requests_running": _RUNNING,
        "trtllm_kv_cache_utilization": _KV,
    },
    EngineKind.OPENAI: {},
}


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One scrape's load signals; None where the page did not carry the signal."""

    num_waiting: int | None
    num_running: int | None
    kv_usage: float | None


def scrapes_metrics(kind: EngineKind) -> bool:
    """Whether this kind of engine exports load metrics worth polling."""
    return bool(_NAMES[kind])


def parse_engine_metrics(text: str, kind: EngineKind) -> EngineSample:
    """Sum each known signal over its label sets (e.g. several model names or DP ranks)."""
    names = _NAMES[kind]
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        cut = len(line)
        for sep in ("{", " "):
            at = line.find(sep)
            if 0 <= at < cut:
                cut = at
        signal = names.get(line[:cut])
        if signal is None:
            continue
        value = _sample_value(line)
        if value is not None:
            totals[signal] = totals.get(signal, 0.0) + value
    kv = totals.get(_KV)
    return EngineSample(
        num_waiting=_count(totals.get(_WAITING)),
        num_running=_count(totals.get(_RUNNING)),
        kv_usage=None if kv is None else min(1.0, max(0.0, kv)),
    )


def _sample_value(line: str) -> float | None:
    close = line.rfind("}")
    rest = line[close + 1 :] if close >= 0 else line.split(" ", 1)[1] if " " in line else ""
    fields = rest.split()
    if not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _count(value: float | None) -> int | None:
    return None if value is None else max(0, round(value))
