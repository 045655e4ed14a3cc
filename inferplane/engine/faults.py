"""Fault injection for the emulated engine: what can go wrong, set by flag or admin API.

``FaultConfig`` is the value (what is armed); ``FaultInjector`` holds it with a seeded
RNG and answers the questions the server and driver ask on their paths:

* ``slowdown`` (>= 1): a degrading GPU; every engine step takes this many times longer
  (applied to ``EngineModel.slowdown``).
* ``crash_after_tokens`` N: when any request has streamed N tokens, the engine crashes:
  every in-flight request fails (streams are cut without ``[DONE]``), the KV cache is
  cleared (``AllBlocksCleared`` is published) and the engine restarts cold, loading its
  weights again (``/health`` is 503 meanwhile). One shot: it disarms when it fires.
* ``hang``: the engine stops producing tokens but keeps connections open and accepts
  requests; clearing it resumes where it stopped (the model's clock is paused too).
* ``error_rate`` p with ``error_status`` S: each new generation request fails with
  status S (OpenAI-style error JSON) with probability p, drawn from the seeded RNG.
* ``restart``: an action rather than a state: crash now and restart cold.

Admin API (``/admin/faults``): GET returns the armed faults; POST merges a JSON object
of the fields above (``{"clear": true}`` first disarms everything) and returns them.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from typing import Any

_ERROR_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class FaultError(ValueError):
    """An admin request or flag that does not describe a valid fault."""


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """The faults armed on one engine (defaults: none)."""

    slowdown: float = 1.0
    crash_after_tokens: int | None = None
    hang: bool = False
    error_rate: float = 0.0
    error_status: int = 503

    def __post_init__(self) -> None:
        if not self.slowdown >= 1.0:
            raise FaultError("slowdown must be a number >= 1")
        if self.crash_after_tokens is not None and self.crash_after_tokens < 1:
            raise FaultError("crash_after_tokens must be an integer >= 1")
        if not 0.0 <= self.error_rate <= 1.0:
            raise FaultError("error_rate must be between 0 and 1")
        if self.error_status not in _ERROR_STATUSES:
            raise FaultError(f"error_status must be one of {sorted(_ERROR_STATUSES)}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "slowdown": (int, float),
    "crash_after_tokens": (int, type(None)),
    "hang": (bool,),
    "error_rate": (int, float),
    "error_status": (int,),
}


def merge_update(config: FaultConfig, update: dict[str, Any]) -> tuple[FaultConfig, bool]:
    """``config`` with the fields of an admin update applied, and whether to restart now."""
    unknown = set(update) - set(_FIELD_TYPES) - {"clear", "restart"}
    if unknown:
        raise FaultError(f"unknown fault fields: {sorted(unknown)}")
    for key in ("clear", "restart"):
        if not isinstance(update.get(key, False), bool):
            raise FaultError(f"'{key}' must be a boolean")
    base = FaultConfig() if update.get("clear") else config
    changes: dict[str, Any] = {}
    for key, types in _FIELD_TYPES.items():
        if key not in update:
            continue
        value = update[key]
        is_bool = isinstance(value, bool)
        if not isinstance(value, types) or (is_bool and bool not in types):
            raise FaultError(f"'{key}' has the wrong type")
        changes[key] = value
    return replace(base, **changes), bool(update.get("restart", False))


class FaultInjector:
    """The armed faults of one engine plus the seeded RNG that draws injected errors."""

    def __init__(self, config: FaultConfig | None = None, *, seed: int = 0) -> None:
        self.config = config or FaultConfig()
        self._rng = random.Random(seed)
        self.num_injected_errors = 0
        self.num_crashes = 0

    def draw_error_status(self) -> int | None:
        """The status to fail a new request with, or None to serve it."""
        rate = self.config.error_rate
        if rate <= 0.0 or self._rng.random() >= rate:
            return None
        self.num_injected_errors += 1
        return self.config.error_status

    def disarm_crash(self) -> None:
        self.config = replace(self.config, crash_after_tokens=None)
        self.num_crashes += 1
