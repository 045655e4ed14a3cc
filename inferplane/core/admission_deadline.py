"""Admission's deadline test: can the call still meet its TTFT budget and deadline?

The prediction is the TTFT at the pool's best endpoint plus the drain of the gateway queue
the call waits behind (EDF: the work due before it, plus the share of later work it does
not overtake, ``AdmissionConfig.edf_overtake_share``), and TPOT for its expected output.

A call that finds every endpoint full does not wait at an engine: it waits in the gateway
queue and leaves it, late-bound, when any endpoint frees a slot. So when the plain test
misses, :func:`queued_miss` tries once more with that model: the queue ahead drains, one
slot turns over at the pool's rate when none is free for the class, then TTFT and TPOT on
the best endpoint as it will be with a free slot
(:func:`~inferplane.core.capacity.ready_estimate`). Only that second miss refuses. On the
peers' 16-slot engines the plain test charged each full engine's own slot wait from the
predictor's prior (a slot held 256 output tokens: 1.8 s per call beyond the slots, where
calls decode 8-128 tokens), and refused calls predicted at 1.0-1.45x the time left that
finished, when admitted, at a median 0.36-0.49 of their deadline
(peers-2026-12-01-h1-diag-head, -h1-diag-cascade). Pure.
"""

from __future__ import annotations

from inferplane.core.capacity import PoolCapacity
from inferplane.core.predictor import LatencyEstimate
from inferplane.core.queueing import WorkAhead
from inferplane.core.types import CallContext

__all__ = ["deadline_miss", "overtaken", "queued_miss"]


def deadline_miss(
    call: CallContext,
    best: LatencyEstimate | None,
    ttft_s: float,
    now: float,
    num_output: int,
    slack: float,
) -> str | None:
    """Why the call cannot meet its TTFT budget or deadline (None: it can, or has none),
    at ``ttft_s`` and ``best``'s TPOT for ``num_output`` tokens, with ``slack`` x the time left."""
    assert best is not None
    if call.ttft_budget_s is not None:
        left_s = call.ttft_budget_s - max(0.0, now - call.arrival_s)
        if ttft_s > left_s * slack:
            return f"predicted TTFT {ttft_s:.2f}s exceeds the {max(0.0, left_s):.2f}s left"
    if call.deadline_s is not None:
        e2e_s = ttft_s + best.tpot_s * max(0, num_output - 1)
        left_s = call.deadline_s - now
        if e2e_s > left_s * slack:
            return (
                f"predicted completion {e2e_s:.2f}s exceeds the {max(0.0, left_s):.2f}s left"
                f" ({_parts(best, ttft_s, num_output)})"
            )
    return None


def _parts(best: LatencyEstimate, ttft_s: float, num_output: int) -> str:
    """The prediction's parts, for the refusal's message: TTFT = gateway queue + engine
    wait + prefill, then TPOT per further token."""
    queue_s = max(0.0, ttft_s - best.ttft_s)
    return (
        f"TTFT {ttft_s:.2f}s = queue {queue_s:.2f}s + engine wait {best.wait_s:.2f}s"
        f" + prefill {best.prefill_s:.2f}s; {max(0, num_output - 1)} x TPOT {best.tpot_s:.3f}s"
    )


def queued_miss(
    call: CallContext,
    cap: PoolCapacity,
    ready: LatencyEstimate | None,
    first: WorkAhead,
    now: float,
    num_output: int,
    slack: float,
) -> str | None:
    """The deadline test for a call that waits in the gateway queue for a slot (module doc);
    ``ready``: its estimate once it holds one; ``first``: the queued work served before it."""
    if ready is None:
        return "no endpoint accepts work"
    wait_s = cap.drain_s(first) if first.num_calls else 0.0
    if cap.free_slots <= 0:
        wait_s += cap.drain_s(WorkAhead(1, 0, num_output))
    return deadline_miss(call, ready, ready.ttft_s + wait_s, now, num_output, slack)


def overtaken(whole: WorkAhead, due_first: WorkAhead, share: float) -> WorkAhead:
    """The work a call waits for: ``due_first`` (EDF) plus the ``1 - share`` of the rest of
    its class it does not overtake (``AdmissionConfig.edf_overtake_share``)."""
    keep = 1.0 - share
    if keep <= 0.0:
        return due_first
    return WorkAhead(
        due_first.num_calls + round(keep * (whole.num_calls - due_first.num_calls)),
        due_first.prompt_tokens + round(keep * (whole.prompt_tokens - due_first.prompt_tokens)),
        due_first.output_tokens + round(keep * (whole.output_tokens - due_first.output_tokens)),
    )
