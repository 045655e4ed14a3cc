"""Response-cache policy: what may be served from cache, under which key, and who may read it.

Pure decisions over a parsed request body, shared by the gateway (which stores entries in
memory or Redis) and the simulator (which models hit rates):

- *Eligibility*: only deterministic requests (temperature 0, or a fixed seed) unless the route
  opts in; ``Cache-Control: no-store`` neither reads nor writes, ``no-cache`` skips the read
  but refreshes the entry; only successful answers are stored.
- *Key*: a strong hash (SHA-256 by default, injectable so tests can force collisions) of the
  tenant, the model and the canonical request: the body with sorted keys, fields that do not
  change the answer dropped. The tenant is part of the key AND stored in the entry and checked
  on every read (:func:`entry_matches`), so even a colliding key never crosses tenants. An
  exact entry also keeps a second, independent fingerprint of the request (BLAKE2b), checked
  on exact reads, so a key collision cannot even swap answers within one tenant.
- *Semantic eligibility*: the last user turn of a short chat, without tool traffic, when the
  route turns it on. Its *context hash* covers everything but that turn (system prompt, model,
  sampling parameters), so a semantic match only ever swaps one paraphrased question.
- *Ledger*: hits, bytes and GPU-seconds saved, per tenant, as avoided cost.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import orjson

from inferplane.core.cache_config import CacheRouteConfig

#: A key function: bytes to a hex digest. SHA-256 unless a test injects a weaker one.
Hasher = Callable[[bytes], str]

#: Body fields that do not change the answer (and so stay out of the key).
_IGNORED_FIELDS = frozenset({"user", "metadata", "store", "service_tier", "stream_options"})
_TOOL_ROLES = frozenset({"tool", "function", "ipython"})
_TURN_ROLES = frozenset({"user", "assistant"})
_ENTRY_VERSION = 1


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class CacheStatus(enum.Enum):
    """How a response was (or was not) served from cache; the X-Inferplane-Cache value."""

    HIT_EXACT = "hit-exact"
    HIT_SEMANTIC = "hit-semantic"
    MISS = "miss"
    BYPASS = "bypass"


class PayloadKind(enum.Enum):
    """What an entry holds: one JSON body, or the SSE events of a stream."""

    JSON = "json"
    SSE = "sse"


@dataclass(frozen=True, slots=True, init=False)
class Eligibility:
    """Whether a request may be read from / written to the exact cache, and why not."""

    read: bool
    write: bool
    reason: str

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(self, read: bool, write: bool, reason: str) -> None:
        object.__setattr__(self, "read", read)
        object.__setattr__(self, "write", write)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One stored answer, with the identity it was stored under (checked on every read)."""

    key: str
    tenant: str
    model: str
    kind: PayloadKind
    payload: bytes
    created_s: float
    expires_s: float
    cost_usd: float = 0.0
    gpu_seconds: float = 0.0
    completion_tokens: int = 0
    fingerprint: str = ""  # independent digest of the request (exact reads check it)

    @property
    def num_bytes(self) -> int:
        return len(self.payload) + len(self.key) + len(self.tenant) + len(self.model) + 64

    def encode(self) -> bytes:
        """Bytes for a shared store (msgpack; versioned)."""
        packed: bytes = msgpack.packb(
            [_ENTRY_VERSION, self.key, self.tenant, self.model, self.kind.value, self.payload,
             self.created_s, self.expires_s, self.cost_usd, self.gpu_seconds,
             self.completion_tokens, self.fingerprint],
        )  # fmt: skip
        return packed

    @staticmethod
    def decode(raw: bytes) -> CacheEntry | None:
        """The entry in ``raw``, or None when it is not one (corrupt, other version)."""
        try:
            f = msgpack.unpackb(raw)
            if not isinstance(f, list) or len(f) != 12 or f[0] != _ENTRY_VERSION:
                return None
            return CacheEntry(
                key=str(f[1]), tenant=str(f[2]), model=str(f[3]), kind=PayloadKind(f[4]),
                payload=bytes(f[5]), created_s=float(f[6]), expires_s=float(f[7]),
                cost_usd=float(f[8]), gpu_seconds=float(f[9]), completion_tokens=int(f[10]),
                fingerprint=str(f[11]),
            )  # fmt: skip
        except (ValueError, TypeError, msgpack.UnpackException):
            return None


def entry_matches(
    entry: CacheEntry, tenant: str, model: str, key: str, fingerprint: str | None = None
) -> bool:
    """The read-side identity check: same tenant, model and key (and fingerprint, if given).

    Freshness is the store's business (the LRU store checks ``expires_s`` against its clock,
    Redis expires keys itself), since replicas do not share a monotonic clock.
    """
    same = entry.tenant == tenant and entry.model == model and entry.key == key
    return same and (fingerprint is None or entry.fingerprint == fingerprint)


def _cache_directives(cache_control: str | None) -> frozenset[str]:
    if not cache_control:
        return frozenset()
    return frozenset(p.split("=", 1)[0].strip().lower() for p in cache_control.split(","))


def is_deterministic(body: Mapping[str, Any]) -> bool:
    """Temperature 0, or a fixed integer seed (the engine then samples reproducibly)."""
    seed = body.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return True
    temperature = body.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        return False  # absent means the engine default (1.0): not deterministic
    n = body.get("n")
    return temperature == 0 and (n is None or n == 1)


def eligibility(
    route: CacheRouteConfig, body: Mapping[str, Any], cache_control: str | None
) -> Eligibility:
    """May this request be read from and written to the exact cache?"""
    if not route.enabled:
        return Eligibility(False, False, "route_disabled")
    directives = _cache_directives(cache_control)
    if "no-store" in directives:
        return Eligibility(False, False, "no_store")
    if not route.allow_nondeterministic and not is_deterministic(body):
        return Eligibility(False, False, "nondeterministic")
    if "no-cache" in directives:
        return Eligibility(False, True, "no_cache")
    return Eligibility(True, True, "")


def canonical_body(body: Mapping[str, Any]) -> bytes:
    """The request as the key sees it: sorted keys, answer-neutral fields dropped.

    ``stream`` stays in (a stream is stored as its events), and so does ``include_usage``
    (it changes the events a client receives).
    """
    kept = {k: v for k, v in body.items() if k not in _IGNORED_FIELDS and k != "model"}
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        kept["__include_usage"] = True
    return orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)


def _framed(*parts: bytes) -> bytes:
    """Length-prefixed concatenation: no two different part lists give the same bytes."""
    return b"".join(len(p).to_bytes(8, "big") + p for p in parts)


def exact_key(
    tenant: str, model: str, path: str, body: Mapping[str, Any], hasher: Hasher = sha256_hex
) -> str:
    """The exact-cache key of a request (tenant and model always part of it)."""
    return exact_identity(tenant, model, path, body, hasher)[0]


def exact_identity(
    tenant: str, model: str, path: str, body: Mapping[str, Any], hasher: Hasher = sha256_hex
) -> tuple[str, str]:
    """(key, fingerprint) of a request: the key by ``hasher``, the fingerprint by BLAKE2b."""
    framed = _framed(b"exact", tenant.encode(), model.encode(), path.encode(), canonical_body(body))
    return hasher(framed), hashlib.blake2b(framed, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class SemanticQuery:
    """What the semantic cache compares: the last user turn, within one exact context."""

    text: str
    context_hash: str


def _is_tool_message(msg: Mapping[str, Any]) -> bool:
    if msg.get("role") in _TOOL_ROLES or msg.get("tool_calls") or msg.get("function_call"):
        return True
    content = msg.get("content")
    if isinstance(content, list):
        return any(isinstance(p, dict) and "tool" in str(p.get("type", "")) for p in content)
    return False


def _text_of(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        if texts and all(isinstance(t, str) for t in texts):
            return "\n".join(t for t in texts if isinstance(t, str))
    return None


def semantic_query(
    route: CacheRouteConfig,
    tenant: str,
    model: str,
    path: str,
    body: Mapping[str, Any],
    hasher: Hasher = sha256_hex,
) -> tuple[SemanticQuery | None, str]:
    """The semantic query of a chat request, or None and the reason it is not eligible."""
    sem = route.semantic
    if not sem.enabled:
        return None, "semantic_off"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not path.endswith("/chat/completions"):
        return None, "not_chat"
    if not all(isinstance(m, dict) for m in messages):
        return None, "bad_messages"
    if not sem.allow_tools and (body.get("tools") or any(_is_tool_message(m) for m in messages)):
        return None, "tool_traffic"
    if sum(1 for m in messages if m.get("role") in _TURN_ROLES) > sem.max_turns:
        return None, "too_many_turns"
    last = messages[-1]
    text = _text_of(last.get("content")) if last.get("role") == "user" else None
    if not text or not text.strip():
        return None, "no_user_turn"
    rest = dict(body)
    rest["messages"] = [*messages[:-1], {"role": "user"}]
    context = hasher(
        _framed(b"semantic", tenant.encode(), model.encode(), path.encode(), canonical_body(rest))
    )
    return SemanticQuery(text.strip(), context), ""


@dataclass(slots=True)
class TenantSavings:
    """What one tenant's cache hits avoided."""

    hits_exact: int = 0
    hits_semantic: int = 0
    bytes_served: int = 0
    cost_usd: float = 0.0
    gpu_seconds: float = 0.0
    completion_tokens: int = 0


@dataclass(slots=True)
class CacheLedger:
    """Counts lookups by outcome and the work hits avoided (per tenant, bounded)."""

    max_tenants: int = 10_000
    lookups: dict[str, int] = field(default_factory=dict)
    stores: int = 0
    by_tenant: dict[str, TenantSavings] = field(default_factory=dict)

    def on_lookup(self, status: CacheStatus, reason: str = "") -> None:
        name = status.value if not reason else f"{status.value}:{reason}"
        self.lookups[name] = self.lookups.get(name, 0) + 1

    def on_hit(self, entry: CacheEntry, status: CacheStatus) -> None:
        saved = self.by_tenant.get(entry.tenant)
        if saved is None:
            if len(self.by_tenant) >= self.max_tenants:
                self.by_tenant.pop(next(iter(self.by_tenant)))
            saved = self.by_tenant[entry.tenant] = TenantSavings()
        if status is CacheStatus.HIT_SEMANTIC:
            saved.hits_semantic += 1
        else:
            saved.hits_exact += 1
        saved.bytes_served += len(entry.payload)
        saved.cost_usd += entry.cost_usd
        saved.gpu_seconds += entry.gpu_seconds
        saved.completion_tokens += entry.completion_tokens

    def totals(self) -> TenantSavings:
        out = TenantSavings()
        for s in self.by_tenant.values():
            out.hits_exact += s.hits_exact
            out.hits_semantic += s.hits_semantic
            out.bytes_served += s.bytes_served
            out.cost_usd += s.cost_usd
            out.gpu_seconds += s.gpu_seconds
            out.completion_tokens += s.completion_tokens
        return out
