"""The sensor: windows of arrivals and outcomes become signals, and restart each tick."""

from __future__ import annotations

import pytest

from inferplane.core.autoscale_sensor import PoolSensor


def test_window_counts_become_a_signal_and_restart() -> None:
    sensor = PoolSensor()
    first = sensor.signal("m", 0.0, serving={"h100": 1})
    assert first.tokens == 0 and first.slo_attainment is None and first.window_s == 15.0
    for tokens in (1000, 500, 1500):
        sensor.on_arrival("m", tokens)
    sensor.on_arrival("other", 99)
    for ok in (True, True, True, False):
        sensor.on_finish("m", ok)
    s = sensor.signal("m", 10.0, serving={"h100": 2}, starting={"a100": 1}, backlog_tokens=7)
    assert s.window_s == pytest.approx(10.0)
    assert s.tokens == 3000 and s.requests == 3 and s.tokens_per_s == pytest.approx(300.0)
    assert s.slo_attainment == pytest.approx(0.75)
    assert s.replicas() == {"h100": 2, "a100": 1} and s.backlog_tokens == 7
    again = sensor.signal("m", 15.0, serving={"h100": 2})
    assert again.tokens == 0 and again.window_s == pytest.approx(5.0)
    assert sensor.signal("other", 15.0, serving={}).tokens == 99
