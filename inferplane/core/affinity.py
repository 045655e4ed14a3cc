"""Workflow affinity: which endpoint served a workflow's previous call, for a while.

An agent's next call repeats most of its previous prompt, so the endpoint that served the
previous step probably still holds it in its KV cache. Routing gives that endpoint a soft
bonus (the ``affinity`` axis, which the hot-spot rule can withdraw). Entries expire after a
TTL (the cache is likely evicted by then) and the table is bounded, least recently used
first. Pure: ``now`` is passed in.
"""

from __future__ import annotations

from collections import OrderedDict


class AffinityTable:
    """workflow id -> (endpoint, last used), bounded LRU with a TTL."""

    def __init__(self, ttl_s: float = 300.0, max_entries: int = 100_000) -> None:
        if ttl_s <= 0 or max_entries < 1:
            raise ValueError("ttl_s and max_entries must be positive")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def record(self, workflow_id: str, endpoint: str, now: float) -> None:
        """The workflow's call was served by ``endpoint`` at ``now``."""
        self._entries[workflow_id] = (endpoint, now)
        self._entries.move_to_end(workflow_id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, workflow_id: str | None, now: float) -> str | None:
        """The workflow's endpoint if it was used within the TTL, else None."""
        if workflow_id is None:
            return None
        entry = self._entries.get(workflow_id)
        if entry is None:
            return None
        if now - entry[1] > self.ttl_s:
            del self._entries[workflow_id]
            return None
        return entry[0]

    def forget(self, workflow_id: str) -> None:
        self._entries.pop(workflow_id, None)

    def __len__(self) -> int:
        return len(self._entries)
