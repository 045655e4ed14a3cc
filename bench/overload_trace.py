"""Where a critical call's time went in the live overload bench (``bench/overload_live.py``).

Each attempt of a call is a :class:`Try` (model seconds from the run start): when it was
sent, when the gateway answered with headers (for a stream: once admission let it out of
the queue and an engine accepted it; for a refusal: at once), when the first token came
and when it ended. So a call's TTFT splits into retry back-off (attempts before the last),
gateway wait (sent to headers: admission queue and routing) and engine wait (headers to
first token: engine queue and prefill). ``critical_misses`` lists every critical call that
missed its SLO with that split per attempt; ``critical_split`` gives the split's
percentiles over all successful critical calls, to compare a miss against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferplane.core.types import PriorityClass
from inferplane.sim.records import CallRecord
from inferplane.sim.scenario import Slo
from inferplane.sim.summary import meets_slo, percentile


@dataclass
class Try:
    """One attempt, as the client saw it (model seconds from the run start)."""

    sent_s: float
    ok: bool = False
    status: int = 0
    headers_s: float | None = None
    first_s: float | None = None
    end_s: float | None = None
    retry_after_s: float = 0.0
    endpoint: str | None = None
    reason: str = ""
    max_tokens: int = 0  # the answer's length asked for
    tokens: int = 0  # stream chunks with text received

    def tpot_s(self) -> float | None:
        """Mean time per received token after the first (decode speed as the client saw it)."""
        if self.first_s is None or self.end_s is None or self.tokens < 2:
            return None
        return (self.end_s - self.first_s) / (self.tokens - 1)

    def row(self, arrival_s: float) -> dict[str, Any]:
        """The attempt relative to the call's arrival, and its gateway and engine waits."""
        gateway = None if self.headers_s is None else self.headers_s - self.sent_s
        engine = None
        if self.headers_s is not None and self.first_s is not None:
            engine = self.first_s - self.headers_s
        return {
            "sent_after_s": _r(self.sent_s - arrival_s), "status": self.status,
            "reason": self.reason, "endpoint": self.endpoint, "gateway_wait_s": _r(gateway),
            "engine_wait_s": _r(engine), "retry_after_s": self.retry_after_s,
            "ended_after_s": _r(None if self.end_s is None else self.end_s - arrival_s),
            "tokens": self.tokens, "tpot_s": _r(self.tpot_s()),
        }  # fmt: skip


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def critical_misses(
    records: list[CallRecord], tries: dict[int, list[Try]], slo: Slo
) -> list[dict[str, Any]]:
    """Every ended critical call that missed ``slo``, with its attempts (bounded: 50)."""
    out = []
    for r in records:
        if r.priority is not PriorityClass.CRITICAL or r.finish_s is None or meets_slo(r, slo):
            continue
        got = tries.get(r.call_id, [])
        out.append({
            "call_id": r.call_id, "arrival_s": _r(r.arrival_s), "outcome": r.outcome.value,
            "cause": _cause(got[0] if got else None, slo),
            "ttft_s": _r(r.ttft_s), "e2e_s": _r(r.e2e_s), "prompt_tokens": r.prompt_tokens,
            "max_tokens": got[0].max_tokens if got else None,
            "attempts": [t.row(r.arrival_s) for t in got],
        })  # fmt: skip
        if len(out) >= 50:
            break
    return out


def _cause(first: Try | None, slo: Slo) -> str:
    """Why the call's first attempt missed: where its time went."""
    if first is None:
        return "never sent"
    if first.status != 200:
        return f"refused ({first.reason or first.status})"
    if first.first_s is None:
        return f"no first token ({first.reason})"
    gateway = (first.headers_s or first.sent_s) - first.sent_s
    engine = first.first_s - (first.headers_s or first.sent_s)
    if slo.ttft_s is not None and gateway + engine > slo.ttft_s:
        return "late first token: " + ("gateway queue" if gateway > engine else "engine queue")
    return "slow decode (deadline)" if first.reason else "slow decode"


def critical_split(records: list[CallRecord], tries: dict[int, list[Try]]) -> dict[str, Any]:
    """p50/p99/max of the gateway and engine waits of successful critical calls' last try."""
    gateway: list[float] = []
    engine: list[float] = []
    retried = 0
    for r in records:
        got = tries.get(r.call_id, [])
        if r.priority is not PriorityClass.CRITICAL or not got or not got[-1].ok:
            continue
        last = got[-1]
        retried += len(got) > 1
        if last.headers_s is not None and last.first_s is not None:
            gateway.append(last.headers_s - last.sent_s)
            engine.append(last.first_s - last.headers_s)
    gateway.sort()
    engine.sort()

    def pct(xs: list[float]) -> dict[str, float | None]:
        top = xs[-1] if xs else None
        return {"p50": _r(percentile(xs, 50)), "p99": _r(percentile(xs, 99)), "max": _r(top)}

    return {"calls": len(gateway), "retried": retried, "gateway_wait_s": pct(gateway),
            "engine_wait_s": pct(engine)}  # fmt: skip
