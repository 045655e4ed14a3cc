"""The request path's own counters and histograms expose exactly what prometheus-client's
``Counter`` and ``Histogram`` expose for the same observations (``_created`` aside)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from inferplane.gateway.metric_series import CounterSeries, HistogramSeries

BUCKETS = (0.005, 0.01, 0.025, 0.1, 1.0, 2.5, 60.0)
LABELS = ("model", "priority")
label_values = st.tuples(st.sampled_from(["m", "llama"]), st.sampled_from(["standard", "x"]))
amounts = st.floats(min_value=0.0, max_value=200.0, allow_nan=False)


def _exposition(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(label_values, amounts), max_size=40))
def test_histogram_exposition_matches_prometheus_client(
    observations: list[tuple[tuple[str, str], float]],
) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("x_seconds", "Doc.", LABELS, buckets=BUCKETS, registry=theirs)
    series = HistogramSeries("x_seconds", "Doc.", LABELS, BUCKETS, ours)
    for values, amount in observations:
        reference.labels(*values).observe(amount)
        series.labels(*values).observe(amount)
    assert _exposition(ours) == _exposition(theirs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(label_values, st.integers(min_value=0, max_value=10_000)), max_size=40))
def test_counter_exposition_matches_prometheus_client(
    increments: list[tuple[tuple[str, str], int]],
) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Counter("x_tokens", "Doc.", LABELS, registry=theirs)
    series = CounterSeries("x_tokens", "Doc.", LABELS, ours)
    for values, n in increments:
        reference.labels(*values).inc(n)
        series.labels(*values).inc(n)
    assert _exposition(ours) == _exposition(theirs)
    samples = {
        (s.name, tuple(s.labels.values())): s.value
        for metric in ours.collect()
        for s in metric.samples
    }
    for values, _ in increments:
        expected = sum(n for v, n in increments if v == values)
        assert math.isclose(samples[("x_tokens_total", values)], expected)


def test_a_bucket_bound_counts_as_le_and_above_the_top_goes_to_inf() -> None:
    registry = CollectorRegistry()
    series = HistogramSeries("lat_seconds", "Doc.", ("model",), (0.1, 1.0), registry)
    child = series.labels("m")
    for amount in (0.1, 0.5, 1.0, 7.0):
        child.observe(amount)
    assert child.counts == [1, 2, 1]
    assert registry.get_sample_value("lat_seconds_bucket", {"model": "m", "le": "0.1"}) == 1
    assert registry.get_sample_value("lat_seconds_bucket", {"model": "m", "le": "+Inf"}) == 4
    assert registry.get_sample_value("lat_seconds_sum", {"model": "m"}) == pytest.approx(8.6)


def test_bad_uses_are_refused() -> None:
    registry = CollectorRegistry()
    counter = CounterSeries("c", "Doc.", ("a", "b"), registry)
    with pytest.raises(ValueError):
        counter.labels("only-one")
    with pytest.raises(ValueError):
        counter.labels("x", "y").inc(-1)
    with pytest.raises(ValueError):
        HistogramSeries("h", "Doc.", (), (1.0, 0.5), registry)
    with pytest.raises(ValueError):  # the same name twice in one registry
        CounterSeries("c", "Doc.", ("a", "b"), registry)
