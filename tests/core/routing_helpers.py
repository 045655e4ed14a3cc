"""Builders shared by the routing tests: endpoint views and calls with sensible defaults."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from inferplane.core.types import (
    CallContext,
    EndpointInfo,
    EndpointLoad,
    EndpointState,
    EndpointView,
    EngineKind,
    PriorityClass,
)


def view(
    name: str,
    *,
    model: str = "m",
    state: EndpointState = EndpointState.READY,
    in_flight: int = 0,
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.0,
    price: float = 2.0,
    gpu: str = "h100",
    max_len: int | None = None,
    since_s: float = 0.0,
) -> EndpointView:
    info = EndpointInfo(
        name, f"http://{name}", EngineKind.VLLM, (model,), gpu, price, "r", max_model_len=max_len
    )
    load = EndpointLoad(num_waiting=waiting, num_running=running, kv_usage=kv, observed_at_s=0.0)
    return EndpointView(info, state, load, in_flight=in_flight, state_since_s=since_s)


def call(
    *,
    model: str = "m",
    prompt: int = 1000,
    max_tokens: int = 64,
    priority: PriorityClass = PriorityClass.STANDARD,
    ttft_budget_s: float | None = None,
    deadline_s: float | None = None,
    workflow_id: str | None = None,
    keys: Sequence[int] = (),
) -> CallContext:
    return CallContext(
        "req",
        "tenant",
        model,
        priority,
        0.0,
        prompt,
        max_tokens,
        deadline_s=deadline_s,
        ttft_budget_s=ttft_budget_s,
        workflow_id=workflow_id,
        prompt_block_keys=tuple(keys),
    )


class FixedMatcher:
    """A prefix index stand-in: fixed leading-block counts per endpoint."""

    def __init__(self, blocks: dict[str, int]) -> None:
        self.blocks = blocks
        self.calls = 0

    def match(self, keys: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        self.calls += 1
        return {e: min(len(keys), self.blocks.get(e, 0)) for e in endpoints}
