"""The load generator's per-attempt headers: a retry keeps the call's deadline."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from peerlib.loadgen import attempt_headers

BASE = {"Content-Type": "application/json", "X-Priority": "standard"}


def test_first_attempt_sends_the_whole_budget() -> None:
    out = attempt_headers(BASE, deadline_s=4.0, elapsed_s=0.0, retries=0)
    assert out["X-Deadline-Ms"] == "4000"
    assert out["x-stainless-retry-count"] == "0"
    assert out["X-Priority"] == "standard" and "X-Deadline-Ms" not in BASE


def test_a_retry_sends_what_is_left_after_the_refusal_and_wait() -> None:
    out = attempt_headers(BASE, deadline_s=4.0, elapsed_s=1.25, retries=1)
    assert out["X-Deadline-Ms"] == "2750"
    assert out["x-stainless-retry-count"] == "1"


def test_a_spent_deadline_sends_the_smallest_positive_budget() -> None:
    # the gateway's header parser refuses 0 and negatives (400): the client sends 1 ms
    for elapsed in (4.0, 9.0):
        assert attempt_headers(BASE, 4.0, elapsed, 2)["X-Deadline-Ms"] == "1"
