"""The prefix index's vocabulary: its own block keys, sources, config, stats and the memory
figures they are estimated with (split from :mod:`inferplane.core.prefix_index`, which
re-exports them). Pure.
"""

from __future__ import annotations

import enum
import hashlib
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from inferplane.core.kv_events import MEDIUM_GPU

#: Measured by bench/prefix_index.py (tracemalloc): bytes per (endpoint, block) entry,
#: per distinct block key, per engine hash kept for removals, per unconfirmed entry.
BYTES_PER_ENTRY = 100
BYTES_PER_KEY = 58
BYTES_PER_ENGINE_HASH = 105
BYTES_PER_GUESS = 52  # the expiry of an unconfirmed entry


#: Entry flags: which tiers hold a block (confirmed by events), or an unconfirmed guess.
GPU = 1
CPU = 2
GUESS = 4


def tier_of(medium: str | None) -> int:
    """The entry flag of a KV event's medium (none given: GPU)."""
    return GPU if medium is None or medium.upper() == MEDIUM_GPU else CPU


def run_length(running: list[int], bit: int) -> int:
    """Leading masks of a non-increasing running AND that still hold ``bit``."""
    return bisect_left(running, True, key=lambda mask: not mask & bit)


def root_key(lora_name: str | None = None) -> int:
    """The parent key of a prompt's first block (a LoRA adapter starts its own tree)."""
    if lora_name is None:
        return 0
    digest = hashlib.blake2b(lora_name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def block_keys(token_ids: Sequence[int], block_size: int = 16, parent: int = 0) -> list[int]:
    """Own keys of the full blocks of ``token_ids``, each chained to the one before.

    A trailing partial block has no key (engines cache full blocks only).
    """
    it = iter(token_ids)
    keys: list[int] = []
    append = keys.append
    key = parent
    for block in zip(*([it] * block_size), strict=False):
        key = hash((key, block))
        append(key)
    return keys


class IndexSource(enum.Enum):
    """Where an endpoint's entries come from."""

    PRECISE = "precise"  # KV events, plus short-lived speculative entries
    APPROXIMATE = "approximate"  # only what the gateway routed there


@dataclass(frozen=True, slots=True)
class PrefixIndexConfig:
    """Bounds and weights of the index."""

    block_size: int = 16
    max_entries: int = 1_000_000
    max_engine_hashes: int = 2_000_000
    speculative_ttl_s: float = 2.0
    approximate_ttl_s: float = 600.0
    cpu_weight: float = 0.8
    #: Half-life of a routed block's weight in the endpoints' KV claims (core/kv_claims.py).
    claim_half_life_s: float = 5.0

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.max_entries <= 0 or self.max_engine_hashes <= 0:
            raise ValueError("block_size, max_entries and max_engine_hashes must be positive")
        if self.speculative_ttl_s <= 0 or self.approximate_ttl_s <= 0:
            raise ValueError("TTLs must be positive")
        if self.claim_half_life_s <= 0:
            raise ValueError("claim_half_life_s must be positive")
        if not 0.0 <= self.cpu_weight <= 1.0:
            raise ValueError("cpu_weight must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class EndpointIndexStats:
    """Counters of one endpoint, for metrics and for the subscriber's status."""

    source: IndexSource
    num_entries: int
    num_engine_hashes: int
    events_applied: int
    blocks_stored: int
    blocks_removed: int
    orphan_blocks: int  # parent unknown (events missed): not indexable
    skipped_events: int  # other block size, other KV group, multimodal extra keys
    clears: int


@dataclass(frozen=True, slots=True)
class IndexStats:
    """Size of the whole index, with an estimate of its memory."""

    num_endpoints: int
    num_entries: int
    num_keys: int
    num_engine_hashes: int
    evictions: int
    expirations: int
    estimated_bytes: int
