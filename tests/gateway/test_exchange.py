"""The per-call record: time per output token with and without usage."""

from __future__ import annotations

import pytest

from inferplane.gateway.exchange import Exchange


def test_tpot_from_usage() -> None:
    ex = Exchange(completion_tokens=11, chunks=11, first_token_s=1.0, last_chunk_s=2.0)
    assert ex.tpot_s() == pytest.approx(0.1)


def test_tpot_from_chunks_when_the_stream_broke_before_usage() -> None:
    ex = Exchange(chunks=5, first_token_s=1.0, last_chunk_s=1.4)
    assert ex.tpot_s() == pytest.approx(0.1)


@pytest.mark.parametrize(
    "ex",
    [
        Exchange(chunks=1, first_token_s=1.0, last_chunk_s=1.0),
        Exchange(completion_tokens=5),
        Exchange(completion_tokens=5, first_token_s=1.0, last_chunk_s=1.0),
    ],
)
def test_tpot_unknown(ex: Exchange) -> None:
    assert ex.tpot_s() is None
