"""What one proxied call is: the Exchange record filled in as it goes, and its candidates.

Shared by the proxy (which fills the record), the response writers (``relay``), the SSE
filter and the recorder (which accounts for it when the call is over).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from inferplane.core.predictor import LatencyEstimate

__all__ = ["FALLBACK_HEADER", "MODEL_HEADER", "Candidate", "Exchange", "Finisher"]

#: The model that served the call (a route's fallback target when it fell back).
MODEL_HEADER = "X-Inferplane-Model"
#: Present when a fallback model served the call: the route's first target it replaced.
FALLBACK_HEADER = "X-Inferplane-Fallback"


@dataclass(slots=True, init=False)
class Exchange:
    """What happened to one call, filled in as it goes (owned by one handler)."""

    endpoint: str | None = None
    status: int = 0
    reason: str = ""
    attempts: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    chunks: int = 0
    first_token_s: float | None = None
    last_chunk_s: float | None = None
    completed: bool = False
    tbt_s: list[float] | None = None
    #: Called once with the time the first token arrived (the predictor learns TTFT).
    on_first_token: Callable[[float], None] | None = None
    #: Called with every SSE chunk just before it is written to the client (cache fill).
    tap: Callable[[bytes], None] | None = None
    #: Headers added to the client's response on both paths (JSON and SSE).
    extra_headers: dict[str, str] = field(default_factory=dict)
    #: Prompt tokens an engine computed for a stream that broke and was resumed elsewhere.
    wasted_prefill_tokens: int = 0
    #: Streams resumed on another endpoint after a break.
    resumptions: int = 0
    #: The prediction routing tracked the current attempt against (set at dispatch, taken
    #: by the proxy for the breaker, so one attempt is predicted once).
    dispatch_estimate: LatencyEstimate | None = None
    #: The model each candidate endpoint serves the call as (a route may fall back).
    model_of: dict[str, str] = field(default_factory=dict)
    #: The route's first target model; serving another one is a fallback.
    primary_model: str = ""

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        endpoint: str | None = None,
        status: int = 0,
        reason: str = "",
        attempts: int = 0,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        completion_tokens: int = 0,
        chunks: int = 0,
        first_token_s: float | None = None,
        last_chunk_s: float | None = None,
        completed: bool = False,
        tbt_s: list[float] | None = None,
        on_first_token: Callable[[float], None] | None = None,
        tap: Callable[[bytes], None] | None = None,
        extra_headers: dict[str, str] | None = None,
        wasted_prefill_tokens: int = 0,
        resumptions: int = 0,
        dispatch_estimate: LatencyEstimate | None = None,
        model_of: dict[str, str] | None = None,
        primary_model: str = "",
    ) -> None:
        self.endpoint = endpoint
        self.status = status
        self.reason = reason
        self.attempts = attempts
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.completion_tokens = completion_tokens
        self.chunks = chunks
        self.first_token_s = first_token_s
        self.last_chunk_s = last_chunk_s
        self.completed = completed
        self.tbt_s = tbt_s
        self.on_first_token = on_first_token
        self.tap = tap
        self.extra_headers = dict() if extra_headers is None else extra_headers
        self.wasted_prefill_tokens = wasted_prefill_tokens
        self.resumptions = resumptions
        self.dispatch_estimate = dispatch_estimate
        self.model_of = dict() if model_of is None else model_of
        self.primary_model = primary_model

    def served_model(self) -> str | None:
        """The model the call was (or is being) served as, once an endpoint took it."""
        return None if self.endpoint is None else self.model_of.get(self.endpoint)

    def route_headers(self) -> dict[str, str]:
        """``X-Inferplane-Model`` (the model that served) and, when that is not the route's
        first target, ``X-Inferplane-Fallback`` (the model it fell back from)."""
        served = self.served_model()
        if served is None:
            return {}
        if self.primary_model and served != self.primary_model:
            return {MODEL_HEADER: served, FALLBACK_HEADER: self.primary_model}
        return {MODEL_HEADER: served}

    def first_token(self, now: float) -> None:
        self.first_token_s = now
        if self.on_first_token is not None:
            self.on_first_token(now)

    def tpot_s(self) -> float | None:
        """Mean time per output token after the first, when measurable.

        Usage gives the token count; a stream cut before its usage chunk (a client timeout
        on a slow engine) still tells its decode speed through the token chunks it carried.
        """
        num_tokens = self.completion_tokens or self.chunks
        if self.first_token_s is None or self.last_chunk_s is None or num_tokens < 2:
            return None
        span_s = self.last_chunk_s - self.first_token_s
        return span_s / (num_tokens - 1) if span_s > 0 else None


#: Called once when the call is over; returns its cost in USD (None when unknown).
Finisher = Callable[[Exchange], float | None]


@dataclass(frozen=True, slots=True, init=False)
class Candidate:
    """One endpoint to try and the exact bytes to send it."""

    endpoint: str
    url: str
    body: bytes

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(self, endpoint: str, url: str, body: bytes) -> None:
        object.__setattr__(self, "endpoint", endpoint)
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "body", body)
