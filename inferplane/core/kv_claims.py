"""KV claims: how much KV memory the sessions an endpoint serves are likely to come back for.

An agent session's next call repeats its whole context, so the endpoint that served it
must keep that context cached through the tool pause. What an endpoint holds for live
sessions is its *working set*: the distinct blocks routed to it recently. The claim is
that working set with each block weighted by how recently it was routed there, decaying
with half-life ``half_life_s`` (a session that stopped calling releases its claim; one in
a tool pause still holds most of it). A block shared by many sessions (an agent's system
prompt) is claimed once.

Routing places a *new* session on the endpoint whose claim, plus what the session would
add there (its uncached blocks), is smallest: sessions spread before engines fill, and a
session joins an engine that already holds its shared prefix rather than copying that
prefix to one more engine (on the agentic bench four 1.2K-token system prompts on every
engine took 53% of each engine's KV cache).

A new session also *reserves* what it will grow to: its first calls are a shared prefix and
a short task, but the calls that follow add their answers and tool results, so without a
reservation a burst of new sessions all lands on the endpoint that claims least right now
(on the agentic bench four sessions in 0.2 s onto one engine, each adding ~7 blocks). A
routed prompt is a session's *follow-up* when it contains the last block of a prompt routed
before (a tip), else a *new* session. The expected growth of a session is learned online:
the blocks follow-ups added past their tip over the sessions begun, both decayed sums
(``growth_half_life_s``). A new session adds that growth to its endpoint's reservation; a
follow-up consumes what it adds from its endpoint's reservation; reservations decay with
``reserve_half_life_s`` (sessions that end early). The claim is working set + reservation.

Bookkeeping is O(1) amortised per routed block: the decayed sum is kept in a moving frame
(``_sum`` as of ``_at``) and updated by each touch; blocks idle for ``horizon_half_lives``
half-lives (weight < 2^-horizon) leave the working set from the front of an LRU. Pure:
``now`` is passed in.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class _WorkingSet:
    touched: OrderedDict[int, float] = field(default_factory=OrderedDict)  # key -> when
    decayed: float = 0.0  # sum of 2^(-(at - touched) / half-life) over ``touched``
    at: float = 0.0
    reserved: float = 0.0  # growth reserved by new sessions, as of ``reserved_at``
    reserved_at: float = 0.0


@dataclass(slots=True, eq=False)
class _Decayed:
    """A sum that decays with a half-life (as of ``at``)."""

    value: float = 0.0
    at: float = 0.0

    def at_time(self, now: float, rate: float) -> float:
        if now > self.at:
            self.value *= math.exp(-rate * (now - self.at))
            self.at = now
        return self.value


class KVClaims:
    """Per endpoint, the decayed count of distinct blocks routed to it (see module doc)."""

    def __init__(
        self,
        half_life_s: float = 5.0,
        horizon_half_lives: float = 6.0,
        max_blocks_per_endpoint: int = 200_000,
        reserve_half_life_s: float = 10.0,
        growth_half_life_s: float = 60.0,
        reserve_growth: bool = True,
    ) -> None:
        if min(half_life_s, horizon_half_lives, reserve_half_life_s, growth_half_life_s) <= 0:
            raise ValueError("half-lives and the horizon must be positive")
        if max_blocks_per_endpoint < 1:
            raise ValueError("max_blocks_per_endpoint must be positive")
        self.half_life_s = half_life_s
        self._rate = math.log(2.0) / half_life_s
        self._horizon_s = horizon_half_lives * half_life_s
        self._max_blocks = max_blocks_per_endpoint
        self._sets: dict[str, _WorkingSet] = {}
        self._reserve = reserve_growth
        self._reserve_rate = math.log(2.0) / reserve_half_life_s
        self._growth_rate = math.log(2.0) / growth_half_life_s
        self._tips: OrderedDict[int, float] = OrderedDict()  # last block of a routed prompt
        self._grown = _Decayed()  # blocks follow-ups added past their tip
        self._begun = _Decayed()  # sessions begun

    def touch(self, endpoint: str, keys: Sequence[int], now: float) -> None:
        """``keys`` were routed to ``endpoint`` at ``now`` (each now weighs 1)."""
        ws = self._sets.get(endpoint)
        if ws is None:
            ws = self._sets[endpoint] = _WorkingSet(at=now)
        self._advance(ws, now)
        touched, rate, get, to_end = ws.touched, self._rate, ws.touched.get, ws.touched.move_to_end
        kept = 0.0  # the weight the re-touched blocks already had
        weight_at: dict[float, float] = {}  # one exp per earlier call, not per block
        for key in keys:
            before = get(key)
            if before is not None:
                weight = weight_at.get(before)
                if weight is None:
                    weight = weight_at[before] = math.exp(-rate * max(0.0, now - before))
                kept += weight
                to_end(key)
            touched[key] = now
        ws.decayed += len(keys) - kept
        while len(touched) > self._max_blocks:
            self._drop_oldest(ws)
        if self._reserve and keys:
            self._session(ws, keys, now)

    def _session(self, ws: _WorkingSet, keys: Sequence[int], now: float) -> None:
        """Reserve a new session's growth on its endpoint, or count a follow-up's growth
        and take it from the reservation (module docstring)."""
        tips, grown, begun = self._tips, self._grown, self._begun
        depth = next((i + 1 for i in range(len(keys) - 1, -1, -1) if keys[i] in tips), 0)
        reserved = self.reserved_blocks_of(ws, now)
        if depth:
            added = len(keys) - depth
            grown.value = grown.at_time(now, self._growth_rate) + added
            ws.reserved = max(0.0, reserved - added)
        else:
            ws.reserved = reserved + self.expected_growth_blocks(now)
            begun.value = begun.at_time(now, self._growth_rate) + 1.0
        tips[keys[-1]] = now
        tips.move_to_end(keys[-1])
        oldest = now - self._horizon_s
        while tips and (len(tips) > self._max_blocks or next(iter(tips.values())) < oldest):
            tips.popitem(last=False)

    def expected_growth_blocks(self, now: float) -> float:
        """Blocks a session adds after its first call, on average (0 before any is seen)."""
        begun = self._begun.at_time(now, self._growth_rate)
        return self._grown.at_time(now, self._growth_rate) / begun if begun > 0 else 0.0

    def reserved_blocks_of(self, ws: _WorkingSet, now: float) -> float:
        if now > ws.reserved_at:
            ws.reserved *= math.exp(-self._reserve_rate * (now - ws.reserved_at))
            ws.reserved_at = now
        return ws.reserved

    def claim_blocks(self, endpoint: str, now: float) -> float:
        """The endpoint's decayed working set plus its sessions' reserved growth at
        ``now``, in blocks (0 if unknown)."""
        ws = self._sets.get(endpoint)
        if ws is None:
            return 0.0
        self._advance(ws, now)
        return max(0.0, ws.decayed) + self.reserved_blocks_of(ws, now)

    def claims(self, endpoints: Iterable[str], now: float) -> dict[str, float]:
        return {name: self.claim_blocks(name, now) for name in endpoints}

    def working_set_size(self, endpoint: str) -> int:
        """Blocks still tracked for ``endpoint`` (within the horizon)."""
        ws = self._sets.get(endpoint)
        return 0 if ws is None else len(ws.touched)

    def forget(self, endpoint: str) -> None:
        self._sets.pop(endpoint, None)

    def _advance(self, ws: _WorkingSet, now: float) -> None:
        """Decay the sum to ``now`` and drop blocks past the horizon (never back in time)."""
        if now > ws.at:
            ws.decayed *= math.exp(-self._rate * (now - ws.at))
            ws.at = now
        touched, oldest = ws.touched, ws.at - self._horizon_s
        while touched and next(iter(touched.values())) < oldest:
            self._drop_oldest(ws)
        if not touched:
            ws.decayed = 0.0  # no rounding drift survives an empty set

    def _drop_oldest(self, ws: _WorkingSet) -> None:
        _, when = ws.touched.popitem(last=False)
        ws.decayed -= math.exp(-self._rate * max(0.0, ws.at - when))
