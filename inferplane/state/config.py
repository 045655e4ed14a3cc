"""Configuration of the shared state, and the factory that builds the configured store.

``backend: memory`` (the default) keeps everything in the process; ``backend: redis``
shares it through Redis, wrapped in :class:`~inferplane.state.resilient.ResilientStore` so
the gateway keeps serving while Redis is away.
"""

from __future__ import annotations

import enum
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferplane.core.state import StateStore
from inferplane.state.resilient import ModeListener

__all__ = ["StateBackend", "StateConfig", "build_store"]


class StateBackend(enum.Enum):
    MEMORY = "memory"
    REDIS = "redis"


class StateConfig(BaseModel):
    """``state:`` section of a fleet config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: StateBackend = StateBackend.MEMORY
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(default="inferplane:", min_length=1, max_length=64)
    op_timeout_s: float = Field(default=0.05, gt=0, le=5)
    connect_timeout_s: float = Field(default=0.2, gt=0, le=10)
    probe_interval_s: float = Field(default=1.0, gt=0, le=60)
    #: share of each quota a replica may admit on its own while Redis is away
    #: (1/N for N replicas keeps the total within the quota; 1.0 favours availability)
    degraded_share: float = Field(default=1.0, gt=0, le=1)
    max_journal: int = Field(default=100_000, ge=100)

    @model_validator(mode="after")
    def _url_scheme(self) -> Self:
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis_url must start with redis://, rediss:// or unix://")
        return self


def build_store(config: StateConfig, on_mode: ModeListener | None = None) -> StateStore:
    """The configured store (nothing connects until the first call)."""
    from inferplane.state.memory import MemoryStore

    if config.backend is StateBackend.MEMORY:
        return MemoryStore()
    from inferplane.state.redis import RedisStore
    from inferplane.state.resilient import ResilientStore

    shared = RedisStore(
        config.redis_url,
        prefix=config.key_prefix,
        op_timeout_s=config.op_timeout_s,
        connect_timeout_s=config.connect_timeout_s,
    )
    return ResilientStore(
        shared,
        op_timeout_s=config.op_timeout_s,
        degraded_share=config.degraded_share,
        max_journal=config.max_journal,
        on_mode=on_mode,
    )
