"""What a simulated run leaves behind: one record per call, periodic samples, totals.

Records are values (frozen dataclasses) so the report can summarise them any way it likes
and two runs can be compared field by field. Every call that a workload generated ends in
exactly one record (conservation): success, failure, timeout, rejection, or unfinished when
the run stopped with the call still in flight.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from inferplane.core.accounting_types import AccountingSnapshot
from inferplane.core.types import PriorityClass


class Outcome(enum.Enum):
    """How a call ended, after all its attempts."""

    SUCCESS = "success"
    FAILED = "failed"  # the engine failed it (crash) on the last attempt
    TIMEOUT = "timeout"  # the client gave up on the last attempt
    REJECTED = "rejected"  # never reached an engine on the last attempt
    UNFINISHED = "unfinished"  # still in flight (or waiting to retry) when the run ended


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One call, as its client saw it (times in simulated seconds)."""

    call_id: int
    source: str
    priority: PriorityClass
    task_id: int
    step: int  # 0-based within the task
    steps: int
    arrival_s: float  # first attempt
    first_token_s: float | None  # first token of the last attempt
    finish_s: float | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    endpoint: str | None  # of the last attempt that reached one
    outcome: Outcome
    attempts: int
    reason: str = ""  # why it failed or was rejected
    queue_s: float = 0.0  # waiting for service: gateway queue plus engine queue, all attempts

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet at one instant: queues, KV use, spend so far."""

    time_s: float
    num_waiting: int  # engine queues, summed
    num_running: int
    num_in_flight: int  # calls the clients are waiting on
    kv_usage: tuple[float, ...]  # per endpoint, in fleet order (0 for not-yet-added)
    spend_usd: float
    successful_tasks: int


@dataclass(frozen=True, slots=True)
class RunResult:
    """Everything one policy's run produced."""

    policy: str
    end_s: float
    endpoints: tuple[str, ...]
    records: tuple[CallRecord, ...]
    samples: tuple[Sample, ...]
    accounting: AccountingSnapshot
    extra_spend_usd: float  # replicas added by scale-out (outside the accountant's fleet)
    rejections: dict[str, int]  # per attempt, by reason
    tasks: dict[str, int]  # by outcome: success, failure, cut (stopped by the run's end)
    counters: dict[str, int] = field(default_factory=dict)  # events, retries, ...
