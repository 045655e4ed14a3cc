"""Learned utilisation for the autoscaler: how hot the pool's replicas may run, from the SLO.

The loop plans for ``target_utilisation`` of each replica's modelled throughput
(``GpuOption.tokens_per_s``). That model is a guess made for a generic mix of prompt and
output tokens; on a workload it prices badly (a prefill-heavy or mostly cached one) the pool
meets its SLO with fewer replicas than the model says, and the loop pays for the difference.
The fleet shows what it can serve: :func:`learn_utilisation` adapts the fraction planned for,
per window, from what the pool served and how well (sense, detect, adapt):

* **up, additively**: a window whose calls met the SLO (attainment at least halfway from
  ``slo_target`` to 1), with no backlog, while the pool carried at least ``hot_utilisation``
  of its modelled capacity (evidence at load, not idle windows), raises the fraction by
  ``utilisation_step``, up to a ceiling (at first ``max_utilisation``);
* **down, at once**: a window under ``slo_target`` returns the fraction to
  ``target_utilisation`` (the configured, safe plan) and lowers the ceiling to one step under
  the fraction that missed (never under the target), so the loop does not probe the same
  miss again (a saw-tooth of misses and scale-ups would be flapping); a window with a backlog
  does not raise it (the loop's backlog term buys its own replicas);
* a window without SLO evidence (no calls ended, ``slo_attainment`` None) leaves it as it is;
* **up, at once, on KV evidence**: a window that would raise it, whose fullest serving replica
  reported its KV cache at ``kv_use``, shows room to about ``load x kv_plan_use / kv_use`` of
  the modelled throughput (an engine's batch, and so what it serves, is bound by its KV
  cache): the fraction rises to that at once, up to ``kv_max_utilisation``. The modelled
  throughput is a batch of 48 generic calls; an engine running 168 agentic calls at full KV
  served three times it within the SLO on the emulated fleet, and the step alone learns
  that only after the burst that needed it. The extrapolation is linear in KV while an
  engine's step time grows with the context it holds, so it reads high: the cap, the plan
  use under 1 and the reset on a miss are its guards: a miss at load lowers the ceiling
  under the load that missed, and the ceiling bounds the KV jump too, so a miss is not
  probed again. The step alone never passes ``max_utilisation``.

``max_utilisation`` None (or at most the target) turns learning off: the loop plans at
``target_utilisation``. Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferplane.core.autoscale_plan import capacity

if TYPE_CHECKING:
    from inferplane.core.autoscaler import PoolPolicy, PoolSignal

__all__ = ["MIN_KV_USE", "Learned", "learn_utilisation", "learned_utilisation"]

# KV use under this (a few calls on an idle replica) is too small to extrapolate from.
MIN_KV_USE = 0.05


@dataclass(frozen=True, slots=True)
class Learned:
    """The fraction of modelled throughput planned for, and how high it may go."""

    utilisation: float = 0.0  # 0: not learned yet (the target)
    ceiling: float = 0.0  # 0: the most it may learn (kv_max_utilisation with KV evidence)


def learned_utilisation(policy: PoolPolicy, signal: PoolSignal, previous: Learned) -> Learned:
    """The fraction of modelled throughput ``policy``'s pool plans for after ``signal``'s
    window (``previous``: what was learned so far)."""
    ready = capacity(policy, signal.serving)
    return learn_utilisation(
        previous, target=policy.target_utilisation, most=policy.max_utilisation,
        step=policy.utilisation_step, slo_target=policy.slo_target,
        slo_attainment=signal.slo_attainment, backlog_tokens=signal.backlog_tokens,
        load_fraction=signal.tokens_per_s / ready if ready > 0 else 0.0,
        hot_fraction=policy.hot_utilisation, kv_use=signal.kv_use,
        kv_plan_use=policy.kv_plan_use, kv_most=policy.kv_max_utilisation,
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
    kv_use: float | None = None,
    kv_plan_use: float | None = None,
    kv_most: float = 1.0,
) -> Learned:
    """The utilisation to plan for and its ceiling after a window (0: not learned yet).

    ``load_fraction``: the window's demand over the serving replicas' modelled capacity;
    ``kv_use``: the fullest serving replica's KV-cache use (None: not reported)."""
    if most is None or most <= target:
        return Learned(target, target)
    kv_on = kv_plan_use is not None and kv_most > most
    now = learned.utilisation if learned.utilisation > 0 else target
    ceiling = learned.ceiling if learned.ceiling > 0 else (kv_most if kv_on else most)
    if slo_attainment is None:
        return Learned(now, ceiling)
    hot = load_fraction >= hot_fraction
    if slo_attainment < slo_target:
        # With KV evidence the fraction can sit far over the load that broke the SLO: the
        # ceiling goes under that load (else the next jump would probe it again, and the
        # ceiling would come down one step per miss).
        missed_at = load_fraction - step if kv_on and hot else math.inf
        return Learned(target, max(target, min(ceiling, now - step, missed_at)))
    good = slo_attainment >= slo_target + (1.0 - slo_target) / 2 and backlog_tokens <= 0
    if not (good and hot):
        return Learned(now, ceiling)
    raised = max(now, min(ceiling, most, now + step))
    if kv_on and kv_plan_use is not None and kv_use is not None and kv_use >= MIN_KV_USE:
        raised = max(raised, min(ceiling, load_fraction * kv_plan_use / kv_use))
    return Learned(raised, ceiling)
