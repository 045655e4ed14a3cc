"""The router's endpoint views between syncs: built once per sync, patched per change.

Building an ``EndpointView`` for every endpoint on every call costs time linear in the fleet
per call. The live gateway does not do that either: it sees engine load as fresh as its last
scrape, plus its own in-flight counts, which it keeps current. :class:`ViewBook` does the
same in virtual time: :meth:`ViewBook.rebuild` (at a sync: engines caught up, a scrape when
due) builds every view and the pool of each model; between syncs, :meth:`ViewBook.current`
rebuilds only the views of endpoints marked changed (the fleet's ``changed`` set: an in-flight
count moved, an engine reported events, a replica started draining or stopped), replacing
them in place in the pool lists, and tells the listeners (admission's capacity book) which.

Pool lists are shared, not copied: a reader must not mutate them, and one kept past the
next change sees that change.
"""

from __future__ import annotations

from collections.abc import Callable

from inferplane.core.types import EndpointView
from inferplane.sim.fleet import Fleet

#: Told ``(model, position in its pool)`` of each view replaced between rebuilds.
PatchListener = Callable[[str, int], None]
#: Told that every view (and pool) was rebuilt.
RebuildListener = Callable[[], None]


class ViewBook:
    """Views of the live endpoints (fleet order) and per-model pools of them."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.views: list[EndpointView] = []
        self.pools: dict[str, list[EndpointView]] = {}
        #: model -> endpoint name -> position in that model's pool
        self.positions: dict[str, dict[str, int]] = {}
        self._slots: dict[int, list[tuple[str, int]]] = {}  # endpoint index -> (model, position)
        self._at: dict[int, int] = {}  # endpoint index -> position in ``views``
        self._num_endpoints = -1
        self.on_patch: list[PatchListener] = []
        self.on_rebuild: list[RebuildListener] = []

    def rebuild(self, now: float) -> None:
        """Every view anew (the fleet scrapes first when a scrape is due)."""
        fleet = self.fleet
        self.views = fleet.views(now)
        fleet.changed.clear()
        self._num_endpoints = len(fleet.endpoints)
        self.pools, self.positions, self._slots, self._at = {}, {}, {}, {}
        live = [ep for ep in fleet.endpoints if ep.stopped_s is None]
        for i, (ep, view) in enumerate(zip(live, self.views, strict=True)):
            self._at[ep.index] = i
            slots = self._slots[ep.index] = []
            for model in view.info.models:
                pool = self.pools.setdefault(model, [])
                self.positions.setdefault(model, {})[view.name] = len(pool)
                slots.append((model, len(pool)))
                pool.append(view)
        for listener in self.on_rebuild:
            listener()

    def current(self, now: float) -> list[EndpointView]:
        """The views with every changed endpoint's view rebuilt (no scrape, no catch-up)."""
        fleet = self.fleet
        if len(fleet.endpoints) != self._num_endpoints:
            self.rebuild(now)
            return self.views
        if fleet.changed:
            changed = sorted(fleet.changed)
            fleet.changed.clear()
            for index in changed:
                ep = fleet.endpoints[index]
                at = self._at.get(index)
                if ep.stopped_s is not None or at is None:  # stopped or restarted: re-list
                    self.rebuild(now)
                    return self.views
                view = self.views[at] = ep.view()
                for model, pos in self._slots[index]:
                    self.pools[model][pos] = view
                    for listener in self.on_patch:
                        listener(model, pos)
        return self.views

    def pool(self, model: str) -> list[EndpointView]:
        """The views of the endpoints serving ``model`` (shared: do not mutate)."""
        return self.pools.get(model, [])
