"""Configuration of the response caches: what may be cached, for how long, and how much.

Frozen pydantic models with working defaults, so ``CacheConfig()`` is a usable cache and a
fleet YAML names only what it changes. The exact cache is on (for deterministic requests
only); the semantic cache is off unless a route turns it on. Per-route settings (by the model
name the client asks for) replace the default route's settings whole. Unknown keys are errors,
as in the rest of the configuration tree. Mounted as ``cache: CacheConfig = CacheConfig()``.
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CacheBackendKind(enum.Enum):
    """Where exact entries live: this process, or a Redis shared by gateway replicas."""

    MEMORY = "memory"
    REDIS = "redis"


class SemanticRouteConfig(_Frozen):
    """The semantic cache of one route: off by default, and narrow when on."""

    enabled: bool = False
    #: Cosine similarity of the last user turns at or above which a stored answer is reused.
    threshold: float = Field(default=0.92, gt=0.0, le=1.0)
    #: Most conversation turns (user + assistant messages, system prompts aside) a request may
    #: have: on long agent contexts the last turn alone does not say what is being asked.
    max_turns: int = Field(default=1, ge=1)
    #: Requests carrying tool results or tool definitions are refused unless this is set.
    allow_tools: bool = False


class CacheRouteConfig(_Frozen):
    """Caching for one route (model name as clients send it)."""

    enabled: bool = True
    ttl_s: float = Field(default=600.0, gt=0)
    #: Cache non-deterministic requests too (temperature > 0 without a seed): an opt-in,
    #: for routes where any plausible answer will do.
    allow_nondeterministic: bool = False
    semantic: SemanticRouteConfig = SemanticRouteConfig()


class CacheConfig(_Frozen):
    """The response caches of a gateway."""

    backend: CacheBackendKind = CacheBackendKind.MEMORY
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: Every Redis key starts with this (shared Redis instances stay tidy).
    namespace: str = Field(default="inferplane:cache", min_length=1, max_length=64)
    #: Bounds of the whole store (memory backend: entries and bytes; Redis: entries).
    max_entries: int = Field(default=10_000, ge=1)
    max_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    #: Answers larger than this are not cached at all.
    max_entry_bytes: int = Field(default=1024 * 1024, ge=1)
    #: Semantic index bounds: rows per tenant (oldest replaced first) and rows in all (least
    #: recently used tenants dropped first); 50,000 rows of 384 floats are about 77 MB.
    semantic_max_entries_per_tenant: int = Field(default=10_000, ge=1)
    semantic_max_rows: int = Field(default=50_000, ge=1)
    #: Recent user-turn vectors remembered by text digest (0: none), and the embedding
    #: micro-batch: at most this many texts per model pass, waiting up to ``window_s`` for
    #: company (0: a lone request starts at once; requests arriving meanwhile are batched).
    semantic_memo_entries: int = Field(default=4096, ge=0)
    semantic_max_batch: int = Field(default=32, ge=1)
    semantic_batch_window_s: float = Field(default=0.0, ge=0.0, le=0.1)
    #: How the embedding model multiplies: None picks fp16-packed weights where the CPU has
    #: them (float32 otherwise); "bf16" is ~10-20% faster on CPUs with native bfloat16
    #: (similarities move by up to ~3e-3, FAQ tables unchanged); "int8" is lossy (~0.02):
    #: re-tune thresholds first. See ``inferplane.cache.minilm``.
    semantic_precision: Literal["fp32", "fp16-weights", "bf16", "int8"] | None = None
    default: CacheRouteConfig = CacheRouteConfig()
    routes: dict[str, CacheRouteConfig] = Field(default_factory=dict)

    def route(self, model: str) -> CacheRouteConfig:
        """The settings for a model name (the default route's when it has none of its own)."""
        return self.routes.get(model, self.default)

    @property
    def any_semantic(self) -> bool:
        """Whether some route uses the semantic cache (so the embedding model is needed)."""
        return self.default.semantic.enabled or any(
            r.semantic.enabled for r in self.routes.values()
        )
