"""STUB (contract only): the clock-free engine model. Replaced by the real implementation.

Public API (stable; the emulated server and the simulator code against it):

    model = EngineModel(profile, time_scale=1.0, seed=0, start_state=EngineState.READY, now=0.0)
    model.submit(EngineRequest(...), now)          # queue a request (ValueError if it cannot fit)
    events = model.advance(now)                    # run every step that ends at or before `now`
    t = model.next_event_time()                    # when the next step ends / loading completes
    events = model.abort(request_id, now)          # cancel (RequestFinished ABORT + freed blocks)
    events = model.reset(now, cold=True)           # crash/restart: in-flight fail with ERROR,
                                                   # AllBlocksCleared, state COLD
    events = model.start_loading(now)              # COLD -> LOADING; READY after load time
    model.slowdown = 5.0                           # degrading GPU: every step 5x slower
    model.stats() -> EngineStats
    model.max_model_len, model.profile, model.state, model.time_scale
"""

from __future__ import annotations

from inferplane.engine.profiles import EngineProfile
from inferplane.engine.types import EngineEvent, EngineRequest, EngineState, EngineStats


class EngineModel:
    def __init__(
        self,
        profile: EngineProfile,
        *,
        time_scale: float = 1.0,
        seed: int = 0,
        start_state: EngineState = EngineState.READY,
        now: float = 0.0,
        priority_scheduling: bool = False,
    ) -> None:
        self.profile = profile
        self.time_scale = time_scale
        self.slowdown = 1.0
        self.state = start_state
        self.max_model_len = profile.model.max_model_len

    def submit(self, request: EngineRequest, now: float) -> None:
        raise NotImplementedError

    def advance(self, now: float, *, emit_tokens: bool = True) -> list[EngineEvent]:
        raise NotImplementedError

    def next_event_time(self) -> float | None:
        raise NotImplementedError

    def abort(self, request_id: str, now: float) -> list[EngineEvent]:
        raise NotImplementedError

    def reset(self, now: float, *, cold: bool = True) -> list[EngineEvent]:
        raise NotImplementedError

    def start_loading(self, now: float) -> list[EngineEvent]:
        raise NotImplementedError

    def stats(self) -> EngineStats:
        raise NotImplementedError
