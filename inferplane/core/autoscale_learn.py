"""Learned utilisation for the autoscaler: how hot the pool's replicas may run, from the SLO.

The loop plans for ``target_utilisation`` of each replica's modelled throughput
(``GpuOption.tokens_per_s``). That model is a guess made for a generic mix of prompt and
output tokens; on a workload it prices badly (a prefill-heavy or mostly cached one) the pool
meets its SLO with fewer replicas than the model says, and the loop pays for the difference.
The fleet shows what it can serve: :func:`learn_utilisation` adapts the fraction planned for,
per window, from what the pool served and how well (sense, detect, adapt):

* **up, to the evidence**: a window whose calls met the SLO (attainment at least halfway
  from ``slo_target`` to 1), with no backlog, while the pool carried at least
  ``hot_utilisation`` of its modelled capacity (evidence at load, not idle windows), raises
  the fraction by ``utilisation_step``, or to the fraction the pool carried in it where that
  is more (it was just served within the SLO), up to a ceiling (at first
  ``max_utilisation``). The ceiling may exceed 1: on agentic work whose prompts are mostly
  cached, one emulated H100 carried 2.4x its modelled throughput through a 5x burst within
  the SLO (``bench/autoscale_emulated.py`` seed 2, 2026-12-06), and a loop held under 0.9 of
  the model bought replicas that engine did not need;
* **down, at once**: a window under ``slo_target`` returns the fraction to
  ``target_utilisation`` (the configured, safe plan) and lowers the ceiling to one step under
  the fraction that missed, or under the fraction the pool carried when it missed at load if
  that is less (never under the target), so the loop does not probe the same miss again (a
  saw-tooth of misses and scale-ups would be flapping); a window with a backlog does not
  raise it (the loop's backlog term buys its own replicas);
* a window without SLO evidence (no calls ended, ``slo_attainment`` None) leaves it as it is.

``max_utilisation`` None (or at most the target) turns learning off: the loop plans at
``target_utilisation``. Pure: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferplane.core.autoscale_plan import capacity

if TYPE_CHECKING:
    from inferplane.core.autoscaler import PoolPolicy, PoolSignal

__all__ = ["Learned", "learn_utilisation", "learned_utilisation"]


@dataclass(frozen=True, slots=True)
class Learned:
    """The fraction of modelled throughput planned for, and how high it may go."""

    utilisation: float = 0.0  # 0: not learned yet (the target)
    ceiling: float = 0.0  # 0: max_utilisation


def learned_utilisation(policy: PoolPolicy, signal: PoolSignal, previous: Learned) -> Learned:
    """The fraction of modelled throughput ``policy``'s pool plans for after ``signal``'s
    window (``previous``: what was learned so far)."""
    ready = capacity(policy, signal.serving)
    return learn_utilisation(
        previous, target=policy.target_utilisation, most=policy.max_utilisation,
        step=policy.utilisation_step, slo_target=policy.slo_target,
        slo_attainment=signal.slo_attainment, backlog_tokens=signal.backlog_tokens,
        load_fraction=signal.tokens_per_s / ready if ready > 0 else 0.0,
        hot_fraction=policy.hot_utilisation,
    )  # fmt: skip


def learn_utilisation(
    learned: Learned,
    *,
    target: float,
    most: float | None,
    step: float,
    slo_target: float,
    slo_attainment: float | None,
    backlog_tokens: float,
    load_fraction: float,
    hot_fraction: float,
) -> Learned:
    """The utilisation to plan for and its ceiling after a window (0: not learned yet).

    ``load_fraction``: the window's demand over the serving replicas' modelled capacity."""
    if most is None or most <= target:
        return Learned(target, target)
    now = learned.utilisation if learned.utilisation > 0 else target
    ceiling = learned.ceiling if learned.ceiling > 0 else most
    if slo_attainment is None:
        return Learned(now, ceiling)
    at_load = load_fraction >= hot_fraction
    if slo_attainment < slo_target:
        missed_at = min(now, load_fraction) if at_load else now
        return Learned(target, max(target, min(ceiling, missed_at - step)))
    good = slo_attainment >= slo_target + (1.0 - slo_target) / 2 and backlog_tokens <= 0
    if good and at_load:
        return Learned(min(ceiling, max(now + step, load_fraction)), ceiling)
    return Learned(now, ceiling)
