"""Admission's estimate of cached prompt: a workflow's next step reuses its previous context,
so its prefill (predicted TTFT, queue drain, dispatch wait) counts only the new tokens."""

from __future__ import annotations

import pytest

from inferplane.core.admission import Admit, Enqueue
from inferplane.core.prompt_reuse import ConversationReuse
from inferplane.core.types import PriorityClass
from tests.core.test_admission import IDLE, StubPredictor, adm, busy, call


def test_no_workflow_no_credit() -> None:
    reuse = ConversationReuse()
    reuse.note(call("a", prompt=1000))
    assert reuse.cached_tokens(call("b", prompt=1200)) == 0
    assert len(reuse) == 0


def test_next_step_reuses_the_previous_prompt_and_reply_capped_by_its_own_prompt() -> None:
    reuse = ConversationReuse()
    assert reuse.cached_tokens(call("s1", prompt=400, wf="w")) == 0  # first step: nothing
    reuse.note(call("s1", prompt=400, max_tokens=30, wf="w"))
    assert reuse.cached_tokens(call("s2", prompt=520, wf="w")) == 430
    assert reuse.cached_tokens(call("s2", prompt=300, wf="w")) == 300  # never above the prompt
    assert reuse.cached_tokens(call("x", prompt=520, wf="other")) == 0


def test_workflows_are_per_tenant() -> None:
    reuse = ConversationReuse()
    reuse.note(call("s1", prompt=400, max_tokens=30, wf="w", tenant="acme"))
    assert reuse.cached_tokens(call("s2", prompt=520, wf="w", tenant="acme")) == 430
    assert reuse.cached_tokens(call("s2", prompt=520, wf="w", tenant="globex")) == 0


def test_bounded_forgetting_the_oldest_workflow() -> None:
    reuse = ConversationReuse(max_workflows=2)
    for wid in ("a", "b", "c"):
        reuse.note(call(wid, prompt=100, max_tokens=0, wf=wid))
    assert len(reuse) == 2
    assert reuse.cached_tokens(call("a2", prompt=200, wf="a")) == 0
    assert reuse.cached_tokens(call("c2", prompt=200, wf="c")) == 100


def test_admission_predicts_only_the_new_prompt_of_a_continuing_step() -> None:
    a = adm(StubPredictor(wait_s=0.1))  # TTFT = 0.1 + uncached / 10k tok/s
    first = a.admit(call("s1", prompt=2000, max_tokens=20, wf="w", step=1), IDLE, 0.0)
    assert isinstance(first, Admit) and first.predicted_ttft_s == pytest.approx(0.3)
    nxt = a.admit(call("s2", prompt=2100, max_tokens=20, wf="w", step=2), IDLE, 1.0)
    assert isinstance(nxt, Admit) and nxt.predicted_ttft_s == pytest.approx(0.1 + 80 / 10_000)


def test_queue_drain_counts_only_what_queued_steps_will_prefill() -> None:
    a = adm(StubPredictor(wait_s=0.1))
    for i in range(5):  # five agents' earlier steps, each leaving 3000 tokens of context
        a.admit(call(f"w{i}-1", prompt=2980, max_tokens=20, wf=f"w{i}", step=1), IDLE, 0.0)
    for i in range(5):  # their next steps queue on a full pool: 100 new tokens each
        step = call(f"w{i}-2", prompt=3100, max_tokens=20, wf=f"w{i}", step=2)
        queued = a.admit(step, busy(5), 1.0)
        assert isinstance(queued, Enqueue) and queued.item.prefill_tokens == 100
    fresh = a.admit(call("new", prompt=3000, max_tokens=20), busy(5), 1.0)
    assert isinstance(fresh, Enqueue) and fresh.item.prefill_tokens == 3000
    ahead = a.queue.work_ahead(PriorityClass.STANDARD)
    assert ahead.num_calls == 6 and ahead.prompt_tokens == 5 * 100 + 3000
