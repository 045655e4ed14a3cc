"""Values exchanged with the engine model: requests in, events and stats out.

The engine model (``inferplane.engine.model.EngineModel``) is clock-free: callers pass
``now`` in seconds on whatever clock they own (the event loop for the emulated engine
server, the virtual clock for the simulator). Everything it reports is one of the frozen
values below, so the emulated server can turn them into SSE chunks, Prometheus samples
and ZMQ KV events, and the simulator can turn them into its own records.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: Token ids reserved by the emulated models (see ``inferplane.tokenizer``).
PAD_TOKEN_ID = 0
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
#: Ids below this are special tokens (chat template markers); text tokens start here.
FIRST_TEXT_TOKEN_ID = 16
#: Vocabulary size of every emulated model.
VOCAB_SIZE = 32_000


class EngineState(enum.Enum):
    """Lifecycle of one engine replica: weights cold, loading, ready to serve."""

    COLD = "cold"
    LOADING = "loading"
    READY = "ready"


class FinishReason(enum.Enum):
    """Why a request left the engine (OpenAI's names where they exist)."""

    STOP = "stop"  # generated EOS
    LENGTH = "length"  # reached max_tokens or the context limit
    ABORT = "abort"  # cancelled by the caller (client disconnect)
    ERROR = "error"  # the engine failed (crash, restart)


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation request as the engine sees it: token ids in, up to max_tokens out."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    priority: int = 0  # lower is served first when the scheduler runs in priority mode
    ignore_eos: bool = False  # vLLM extension: generate exactly max_tokens
    #: the chain keys of the prompt's full 16-token blocks (``core.prefix_blocks.block_keys``)
    #: when the caller has them: a 16-token-block engine salts them instead of hashing
    prompt_block_keys: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class RequestScheduled:
    """A request left the waiting queue for the first time (queue time ends here)."""

    time_s: float
    request_id: str
    num_cached_tokens: int  # prompt tokens served from the prefix cache


@dataclass(frozen=True, slots=True)
class TokensGenerated:
    """Tokens a request produced at the end of one engine step (usually one)."""

    time_s: float
    request_id: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RequestPreempted:
    """A running request lost its KV blocks and will be recomputed."""

    time_s: float
    request_id: str


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """A request left the engine; the counts are what usage reports."""

    time_s: float
    request_id: str
    reason: FinishReason
    num_prompt_tokens: int
    num_cached_tokens: int
    num_completion_tokens: int


@dataclass(frozen=True, slots=True, init=False)
class BlockStored:
    """Full KV blocks became cached (vLLM's BlockStored, one chain segment)."""

    time_s: float
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        time_s: float,
        block_hashes: tuple[int, ...],
        parent_block_hash: int | None,
        token_ids: tuple[int, ...],
        block_size: int,
    ) -> None:
        object.__setattr__(self, "time_s", time_s)
        object.__setattr__(self, "block_hashes", block_hashes)
        object.__setattr__(self, "parent_block_hash", parent_block_hash)
        object.__setattr__(self, "token_ids", token_ids)
        object.__setattr__(self, "block_size", block_size)


@dataclass(frozen=True, slots=True, init=False)
class BlockRemoved:
    """Cached KV blocks were evicted (vLLM's BlockRemoved)."""

    time_s: float
    block_hashes: tuple[int, ...]

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(self, time_s: float, block_hashes: tuple[int, ...]) -> None:
        object.__setattr__(self, "time_s", time_s)
        object.__setattr__(self, "block_hashes", block_hashes)


@dataclass(frozen=True, slots=True, init=False)
class AllBlocksCleared:
    """The whole prefix cache was dropped (restart, reset)."""

    time_s: float

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(self, time_s: float) -> None:
        object.__setattr__(self, "time_s", time_s)


@dataclass(frozen=True, slots=True)
class StateChanged:
    """The engine moved between cold, loading and ready."""

    time_s: float
    state: EngineState


RequestEvent = RequestScheduled | TokensGenerated | RequestPreempted | RequestFinished
KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
EngineEvent = RequestEvent | KVEvent | StateChanged


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of load and counters, the numbers vLLM exports on /metrics."""

    state: EngineState
    num_waiting: int
    num_running: int
    num_gpu_blocks: int
    num_used_blocks: int  # blocks held by running requests
    num_cached_free_blocks: int  # free blocks that still hold reusable prefix content
    block_size: int
    kv_usage: float  # used / total, 0..1 (vLLM's kv_cache_usage_perc)
    prefix_cache_queries_tokens: int  # cumulative prompt tokens looked up
    prefix_cache_hits_tokens: int  # cumulative prompt tokens found cached
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_steps: int
