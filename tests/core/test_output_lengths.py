"""The learned output length: the prior until calls finish, the natural mean recovered from
calls cut at their caps (censored samples), capped means, decay and bounds; admission's
completion test uses it."""

from __future__ import annotations

import random

import pytest

from inferplane.core.admission import Admit, Reject
from inferplane.core.output_lengths import OutputLengths
from tests.core.test_admission import IDLE, StubPredictor, adm, call


def _geometric(rng: random.Random, mean: float) -> int:
    """A length with P(stop) = 1/mean per token (the emulated engine's EOS rule)."""
    n = 1
    while rng.random() >= 1.0 / mean:
        n += 1
    return n


def test_the_prior_cut_at_a_cap_is_its_geometric_mean_not_the_min() -> None:
    lengths = OutputLengths(256)
    assert lengths.natural_mean("m") == 256
    assert lengths.expected("m", 128) == 101  # 256 x (1 - (255/256)^128), not 128
    assert lengths.expected("m", 100_000) == 256
    assert lengths.expected("m", 1) == 1 and lengths.expected("m", 0) == 1


@pytest.mark.parametrize("true_mean", [40.0, 400.0])
def test_censored_calls_teach_the_natural_mean(true_mean: float) -> None:
    """Calls capped at 128 tokens: averaging what was seen would learn ~101 for a 400-token
    mean; the censored estimate recovers the mean (within 15%) and each cap's average."""
    rng = random.Random(7)
    lengths = OutputLengths(256, decay=1.0)
    seen = [min(128, _geometric(rng, true_mean)) for _ in range(3000)]
    for n in seen:
        lengths.note("m", n, 128)
    assert lengths.natural_mean("m") == pytest.approx(true_mean, rel=0.15)
    assert lengths.expected("m", 128) == pytest.approx(sum(seen) / len(seen), rel=0.1)
    assert lengths.natural_mean("other") == 256  # per model


def test_decay_follows_a_shift_and_models_are_bounded() -> None:
    lengths = OutputLengths(256, max_models=1)
    for _ in range(2000):
        lengths.note("m", 300, 1000)
    for _ in range(2000):
        lengths.note("m", 30, 1000)
    assert lengths.natural_mean("m") == pytest.approx(30, rel=0.05)
    lengths.note("n", 5, 1000)  # over the bound: keeps the prior
    assert lengths.natural_mean("n") == 256
    for _ in range(5000):  # every call cut at its cap: the mean runs away, the cap holds
        lengths.note("m", 64, 64)
    assert lengths.natural_mean("m") > 1e6 and lengths.expected("m", 64) == 64
    with pytest.raises(ValueError):
        OutputLengths(0)


def test_admission_predicts_completion_with_the_learned_length() -> None:
    """A 1.0 s deadline at TPOT 10 ms: refused while a call is expected to write the prior's
    256 tokens (2.75 s), admitted once finished calls showed ~20-token answers."""
    a = adm(StubPredictor(wait_s=0.1, tpot_s=0.01))
    before = a.admit(call("before", max_tokens=1000, deadline_s=1.0), IDLE, 0.0)
    assert isinstance(before, Reject) and before.code == "deadline_unreachable"
    for i in range(300):
        done = call(f"d{i}", max_tokens=1000)
        a.on_finish(done, 0.0, num_tokens=1020, num_output_tokens=20)
    a.on_finish(
        call("failed", max_tokens=1000), 0.0, num_tokens=0, success=False, num_output_tokens=900
    )  # fmt: skip  (a failure teaches nothing)
    assert a.outputs.natural_mean("m") == pytest.approx(20, rel=0.1)
    after = a.admit(call("after", max_tokens=1000, deadline_s=1.0), IDLE, 0.0)
    assert isinstance(after, Admit)
