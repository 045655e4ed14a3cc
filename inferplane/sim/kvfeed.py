"""The engine models' KV events, fed into the policy core's prefix index in virtual time.

In the live fleet each vLLM engine publishes ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared`` over ZMQ and the gateway's subscriber applies them to a
:class:`~inferplane.core.prefix_index.PrefixIndex`. In the simulator the engine models
return the same events from ``advance()``; this module converts them to the core's
decoded event values (the ones the ZMQ decoder produces) and applies them per endpoint
at once (no network delay), so the router's KV-cache axis sees what each engine holds.
The simulator sizes the index to every block its fleet can cache, entries and engine hashes
alike, so the engines' own LRU decides what goes (their ``BlockRemoved``), never the index's
bounds (past ``max_engine_hashes`` the index clears the endpoint that overflowed it).
Prompt block keys come from :func:`inferplane.core.prefix_index.block_keys`, the index's
own hash, the same one the gateway computes.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferplane.core import kv_events as core
from inferplane.core.prefix_index import IndexSource, PrefixIndex, PrefixIndexConfig
from inferplane.engine.types import AllBlocksCleared, BlockRemoved, BlockStored, EngineEvent

KV_EVENT_TYPES = (BlockStored, BlockRemoved, AllBlocksCleared)


def to_core(event: EngineEvent) -> core.KVEvent | None:
    """The core's value for an engine KV event (None for other engine events)."""
    kind = type(event)
    if kind is BlockStored:
        assert isinstance(event, BlockStored)
        return core.BlockStored(
            event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size
        )
    if kind is BlockRemoved:
        assert isinstance(event, BlockRemoved)
        return core.BlockRemoved(event.block_hashes)
    if kind is AllBlocksCleared:
        return core.AllBlocksCleared()
    return None


def split(events: Sequence[EngineEvent]) -> tuple[list[core.KVEvent], list[EngineEvent]]:
    """An engine's events as the core's KV events and the others, each list in engine order
    (the KV events are most of them: sorted here, compiled, not in the runner's loop)."""
    kv: list[core.KVEvent] = []
    others: list[EngineEvent] = []
    for event in events:
        kind = type(event)
        if kind is BlockStored:
            assert isinstance(event, BlockStored)
            kv.append(
                core.BlockStored(
                    event.block_hashes, event.parent_block_hash, event.token_ids,
                    event.block_size,
                )
            )  # fmt: skip
        elif kind is BlockRemoved:
            assert isinstance(event, BlockRemoved)
            kv.append(core.BlockRemoved(event.block_hashes))
        elif kind is AllBlocksCleared:
            kv.append(core.AllBlocksCleared())
        else:
            others.append(event)
    return kv, others


class KVFeed:
    """One prefix index over the simulated fleet, kept current from engine events."""

    def __init__(
        self, block_size: int = 16, max_entries: int = 1_000_000, max_engine_hashes: int = 2_000_000
    ) -> None:
        config = PrefixIndexConfig(
            block_size=block_size, max_entries=max_entries, max_engine_hashes=max_engine_hashes
        )
        self.index = PrefixIndex(config)
        self.events_applied = 0

    def add_endpoint(self, name: str) -> None:
        self.index.add_endpoint(name, IndexSource.PRECISE)

    def apply(self, endpoint: str, events: Sequence[core.KVEvent], now: float) -> None:
        """Apply one endpoint's batch of decoded events (in engine order)."""
        if events:
            self.index.apply_events(endpoint, events, now)
            self.events_applied += len(events)

    def routed(self, endpoint: str, keys: Sequence[int], now: float) -> None:
        """The router sent a prompt there: a short-lived guess until BlockStored confirms it."""
        if keys:
            self.index.record_route(endpoint, keys, now)
