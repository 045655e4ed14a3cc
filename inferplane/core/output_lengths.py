"""How many tokens a call will generate, learned per model from the calls that finished.

Admission predicts a call's completion (TTFT plus TPOT per output token) and the drain of
the queue ahead (prompt and output tokens at the pool's rates) from its expected output.
A fixed guess (``AdmissionConfig.expected_output_tokens``, capped by the call's
``max_tokens``) is wrong in both directions: agents' tool calls stop after a few dozen
tokens, long answers run to their cap. The gateway sees every finished call's completion
tokens, so it learns them.

A call cut at its ``max_tokens`` says only that its natural length was at least that: the
sample is censored. Averaging outputs as seen learns a length biased toward the caps of
the calls seen (calls capped at 128 would teach a mean under 128 to a call allowed 2,048).
So the natural mean is the censored-data estimate of an exponential length: all tokens
generated over the calls that stopped by themselves (a call that used all its
``max_tokens`` counts as cut), both sums decayed so the estimate follows the workload,
seeded with ``prior_calls`` pseudo-calls at the configured prior (decayed like the rest).
A call's expected output is the mean of that length cut at its own cap: for a geometric
length of mean ``m``, ``m * (1 - (1 - 1/m) ** max_tokens)`` (the plain ``min`` overstates
it: a 128-token cap on a 256-token mean averages ~101 tokens, not 128).

Pure: no clock; bounded by the number of models fed (the gateway's configured models).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["OutputLengths"]


@dataclass(slots=True)
class _Sums:
    tokens: float  # decayed tokens generated, all calls
    stopped: float  # decayed count of calls that ended before their cap


class OutputLengths:
    """Per-model natural output length (censored exponential estimate) and capped means."""

    def __init__(
        self,
        prior_tokens: float,
        *,
        prior_calls: float = 4.0,
        decay: float = 0.995,
        max_models: int = 1024,
    ) -> None:
        if prior_tokens < 1 or prior_calls <= 0 or not 0 < decay <= 1 or max_models < 1:
            raise ValueError("prior_tokens >= 1, prior_calls > 0, decay in (0, 1], max_models >= 1")
        self.prior_tokens = float(prior_tokens)
        self.prior_calls = prior_calls
        self.decay = decay
        self.max_models = max_models
        self._sums: dict[str, _Sums] = {}

    def note(self, model: str, num_output_tokens: int, max_tokens: int) -> None:
        """A call of ``model`` allowed ``max_tokens`` finished with ``num_output_tokens``."""
        sums = self._sums.get(model)
        if sums is None:
            if len(self._sums) >= self.max_models:
                return  # bounded: models past the cap keep the prior
            k = self.prior_calls  # the prior as pseudo-calls, fading as the real ones come
            sums = self._sums[model] = _Sums(k * self.prior_tokens, k)
        sums.tokens = sums.tokens * self.decay + max(0, num_output_tokens)
        sums.stopped = sums.stopped * self.decay + (num_output_tokens < max_tokens)

    def natural_mean(self, model: str) -> float:
        """The estimated mean output length of ``model``'s calls, were none capped."""
        sums = self._sums.get(model)
        if sums is None:
            return self.prior_tokens
        # all cut (none stopped yet): at least the tokens per call seen; floor 1e-9 calls
        return max(1.0, sums.tokens / max(sums.stopped, 1e-9))

    def expected(self, model: str, max_tokens: int) -> int:
        """Expected output tokens of a call of ``model`` capped at ``max_tokens`` (>= 1)."""
        cap = max(1, max_tokens)
        mean = self.natural_mean(model)
        if mean <= 1.0:
            return 1
        # mean x (1 - (1 - 1/mean) ** cap), stable for means far over the cap
        capped = -mean * math.expm1(cap * math.log1p(-1.0 / mean))
        return max(1, min(cap, round(capped)))
