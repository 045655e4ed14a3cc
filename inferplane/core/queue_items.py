"""The admission queue's values: what waits in it, how a call leaves, what lies ahead.

Split from :mod:`inferplane.core.queueing` (the queue itself) so the values that
admission, the gateway and the simulator pass around stand apart from the queue's
ordering machinery. Frozen dataclasses and one enum; pure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from inferplane.core.types import CallContext, PriorityClass

__all__ = ["ExitKind", "PushResult", "QueueExit", "QueueItem", "WorkAhead"]


class ExitKind(enum.Enum):
    """How a call left the queue."""

    DISPATCHED = "dispatched"
    EVICTED = "evicted"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class QueueItem:
    """One waiting call and what the queue needs to order, bound and account it."""

    call: CallContext
    order_key_s: float  # lower leaves first within its (class, tenant, model) flow
    expires_at_s: float  # past this, dispatching cannot meet the call's deadline
    num_output_tokens: int  # expected output (service and drain estimates)
    size_bytes: int = 0
    keep: float = 0.0  # eviction protection (workflow progress); higher is evicted later
    #: prompt tokens its prefill is expected to run (None: the whole prompt, none cached)
    num_prefill_tokens: int | None = None

    @property
    def request_id(self) -> str:
        return self.call.request_id

    @property
    def priority(self) -> PriorityClass:
        return self.call.priority

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens left to prefill (the drain estimate's prompt work)."""
        n = self.num_prefill_tokens
        return self.call.num_prompt_tokens if n is None else n

    @property
    def service_tokens(self) -> int:
        return self.call.num_prompt_tokens + self.num_output_tokens


@dataclass(frozen=True, slots=True)
class QueueExit:
    """A call leaving the queue, and why."""

    item: QueueItem
    kind: ExitKind
    waited_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class PushResult:
    """``accepted``: the call waits; ``evicted``: calls pushed out to make room for it."""

    accepted: bool
    evicted: tuple[QueueExit, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class WorkAhead:
    """Queued work that will be served before a call of some class."""

    num_calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
