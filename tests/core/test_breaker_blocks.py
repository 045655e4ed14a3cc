"""``BreakerBoard.blocks`` says what ``overlay`` would do to an endpoint's view, in every
breaker state (closed, open, half-open with and without a free probe slot) and every
endpoint state, so a caller that asks about one endpoint need not build its view."""

from __future__ import annotations

from inferplane.core.breaker import BreakerBoard, BreakerConfig, BreakerState, Outcome
from inferplane.core.retry import FailureKind
from inferplane.core.types import EndpointState
from tests.core.routing_helpers import view

FAIL = Outcome(FailureKind.SERVER_ERROR)


def _agrees(board: BreakerBoard, name: str) -> None:
    for state in EndpointState:
        shown = board.overlay([view(name, state=state)])[0].state
        blocked = state.accepts_work and board.blocks(name)
        assert (shown is EndpointState.EJECTED) == (state is EndpointState.EJECTED or blocked)


def test_blocks_matches_the_overlay_through_a_breakers_life() -> None:
    board = BreakerBoard(BreakerConfig(probe_concurrency=1, max_ejected_share=0.5))
    for i in range(4):
        board.register(f"e{i}", "p")
    _agrees(board, "e0")
    assert not board.blocks("e0") and not board.blocks("unknown")
    for _ in range(5):
        board.record("e0", FAIL, 0.0)
    assert board.state("e0") is BreakerState.OPEN and board.blocks("e0")
    _agrees(board, "e0")
    board.sweep(1000.0)
    assert board.state("e0") is BreakerState.HALF_OPEN and not board.blocks("e0")
    _agrees(board, "e0")
    board.on_dispatch("e0")  # the one probe slot is taken
    assert board.blocks("e0")
    _agrees(board, "e0")
    _agrees(board, "unknown")
