"""next_wake_time: leaping over pure-decode steps changes no timing, only how often one wakes."""

from __future__ import annotations

import random

from inferplane.engine.model import EngineModel
from inferplane.engine.profiles import load_profile
from inferplane.engine.types import EngineEvent, EngineRequest, RequestFinished, TokensGenerated

SMALL = load_profile(
    "llama-3.2-1b",
    "h100",
    overrides={"max_num_batched_tokens": 256, "max_num_seqs": 8, "mean_output_tokens": 40},
)


def _requests(seed: int, n: int, ignore_eos: bool) -> list[tuple[float, EngineRequest]]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(20.0)
        prompt = tuple(rng.randrange(16, 32_000) for _ in range(rng.randrange(8, 300)))
        out.append((t, EngineRequest(f"r{i}", prompt, rng.randrange(1, 120), 0, ignore_eos)))
    return out


def _drive(
    requests: list[tuple[float, EngineRequest]], leap: bool, num_blocks: int | None
) -> tuple[dict[str, float], dict[str, float], int]:
    """Submit at arrival times; between arrivals wake only when the engine asks to."""
    model = EngineModel(SMALL, seed=3, num_gpu_blocks=num_blocks)
    finish: dict[str, float] = {}
    first: dict[str, float] = {}
    wakes = 0

    def take(events: list[EngineEvent]) -> None:
        for ev in events:
            if isinstance(ev, RequestFinished):
                finish[ev.request_id] = ev.time_s
            elif isinstance(ev, TokensGenerated):
                first.setdefault(ev.request_id, ev.time_s)

    pending = list(requests)
    while True:
        wake = model.next_wake_time() if leap else model.next_event_time()
        if pending and (wake is None or pending[0][0] <= wake):
            t, request = pending.pop(0)
            take(model.advance(t, emit_tokens=False))
            model.submit(request, t)
        elif wake is not None:
            wakes += 1
            take(model.advance(wake, emit_tokens=False))
        else:
            return finish, first, wakes


def test_leaping_gives_the_same_finish_and_first_token_times() -> None:
    for ignore_eos, blocks in ((True, None), (True, 40), (False, None)):
        requests = _requests(7, 40, ignore_eos)
        stepped = _drive(requests, False, blocks)
        leapt = _drive(requests, True, blocks)
        assert stepped[0].keys() == leapt[0].keys() and len(stepped[0]) == 40
        for rid, t in stepped[0].items():
            assert abs(leapt[0][rid] - t) <= 1e-9
        assert stepped[1] == leapt[1]
        if ignore_eos and blocks is None:
            assert leapt[2] * 3 < stepped[2]  # far fewer wake-ups than steps


def test_no_leap_while_requests_wait_or_may_stop_early() -> None:
    model = EngineModel(SMALL, seed=1)
    prompt = tuple(range(16, 80))
    model.submit(EngineRequest("a", prompt, 50, 0, ignore_eos=False), 0.0)
    model.advance(model.next_event_time() or 0.0)
    assert model.next_wake_time() == model.next_event_time()  # EOS could come any step
    model2 = EngineModel(SMALL, seed=1)
    model2.submit(EngineRequest("b", prompt, 50, 0, ignore_eos=True), 0.0)
    model2.advance(model2.next_event_time() or 0.0)  # prefill done, now pure decode
    step_end, wake = model2.next_event_time(), model2.next_wake_time()
    assert step_end is not None and wake is not None and wake > step_end
