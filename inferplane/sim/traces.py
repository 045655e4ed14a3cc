"""Trace replay: the Azure LLM inference CSV and the Mooncake JSONL formats (REFERENCE §3).

Azure 2023 traces are CSV with ``TIMESTAMP,ContextTokens,GeneratedTokens`` (the timestamp a
date-time with up to 7 fractional digits; plain seconds are accepted too). Mooncake traces
are JSON lines ``{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}``,
where equal ``hash_ids`` mean equal prompt blocks (512 tokens by default), the common way to
describe prefix sharing. Both parse lazily into ``TraceRecord`` values with times relative to
the first record; a bad line fails with its line number.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from inferplane.sim.prompts import KeySpace, segment
from inferplane.sim.scenario import Demand, TraceSource
from inferplane.sim.workload import CallSpec


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the line."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace, its time relative to the trace's first request."""

    time_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


def _parse_time_s(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if "." in text:  # datetime takes at most 6 fractional digits; Azure writes 7
        head, frac = text.rsplit(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _count(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{field} must be a number")
    n = int(float(value))
    if n < 0 or n != float(value):
        raise ValueError(f"{field} must be a non-negative integer")
    return n


def parse_azure_csv(lines: Iterable[str], source: str = "<azure csv>") -> Iterator[TraceRecord]:
    """Records of an Azure LLM inference trace (CSV with a header row)."""
    reader = csv.DictReader(lines)
    need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
    if reader.fieldnames is None or not need.issubset(reader.fieldnames):
        raise TraceError(f"{source}: header must have {', '.join(sorted(need))}")
    first_s: float | None = None
    for row in reader:
        try:
            t = _parse_time_s(row["TIMESTAMP"])
            prompt = _count(row["ContextTokens"], "ContextTokens")
            output = _count(row["GeneratedTokens"], "GeneratedTokens")
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{source}:{reader.line_num}: {exc}") from None
        first_s = t if first_s is None else first_s
        yield TraceRecord(max(0.0, t - first_s), prompt, output)


def parse_mooncake_jsonl(
    lines: Iterable[str], source: str = "<mooncake jsonl>"
) -> Iterator[TraceRecord]:
    """Records of a Mooncake trace (one JSON object per line, timestamps in ms)."""
    first_ms: float | None = None
    for line_num, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("each line must be a JSON object")
            t_ms = float(obj["timestamp"])
            prompt = _count(obj["input_length"], "input_length")
            output = _count(obj["output_length"], "output_length")
            raw = obj.get("hash_ids", [])
            if not isinstance(raw, list):
                raise ValueError("hash_ids must be a list")
            hash_ids = tuple(_count(h, "hash_ids") for h in raw)
        except KeyError as exc:
            raise TraceError(f"{source}:{line_num}: missing field {exc}") from None
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{source}:{line_num}: {exc}") from None
        first_ms = t_ms if first_ms is None else first_ms
        yield TraceRecord(max(0.0, (t_ms - first_ms) / 1000.0), prompt, output, hash_ids)


def read_trace(path: Path, fmt: str) -> Iterator[TraceRecord]:
    """Records of a trace file, read lazily."""
    try:
        with path.open(encoding="utf-8", newline="") as f:
            if fmt == "azure_csv":
                yield from parse_azure_csv(f, str(path))
            else:
                yield from parse_mooncake_jsonl(f, str(path))
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None


def prompt_for(record: TraceRecord, block_tokens: int, keys: KeySpace) -> tuple[int, ...]:
    """Prompt token ids: one named segment per hash id (shared), else one fresh segment."""
    if not record.hash_ids:
        return segment(keys.fresh(), max(1, record.prompt_tokens))
    out: list[int] = []
    last = len(record.hash_ids) - 1
    for i, h in enumerate(record.hash_ids):
        n = block_tokens if i < last else record.prompt_tokens - block_tokens * last
        out.extend(segment(keys.named(h), max(1, min(block_tokens, n))))
    return tuple(out)


class TraceCalls:
    """Replays a trace file as open-loop arrivals (shifted by start_s, sped up by speedup)."""

    def __init__(
        self,
        src: TraceSource,
        base_dir: Path,
        keys: KeySpace,
        demand: Demand,
        context_limit_tokens: int,
    ) -> None:
        self.name = src.name
        self._src, self._keys, self._demand = src, keys, demand
        self._limit = context_limit_tokens
        self._records = read_trace(base_dir / src.path, src.format)
        self._count = 0

    def next_arrival(self) -> tuple[float, CallSpec] | None:
        record = next(self._records, None)
        if record is None:
            return None
        t = self._src.start_s + record.time_s / self._src.speedup
        if self._src.stop_s is not None and t >= self._src.stop_s:
            return None
        out = max(1, round(record.output_tokens * self._demand.tokens_x))
        prompt = prompt_for(record, self._src.block_tokens, self._keys)
        room = max(1, self._limit - out)
        self._count += 1
        return t, CallSpec(self.name, self._count, 0, 1, prompt[:room], out)

    def follow_up(self, spec: CallSpec, succeeded: bool) -> tuple[float, CallSpec] | None:
        return None
