"""The admission queue: strict bands, EDF within, weighted fair share, bounds, conservation."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.admission_config import QueueConfig
from inferplane.core.queueing import ExitKind, QueueItem, RequestQueue
from inferplane.core.types import CallContext, PriorityClass

CRIT, STD, SHED = PriorityClass.CRITICAL, PriorityClass.STANDARD, PriorityClass.SHEDDABLE


def item(
    rid: str,
    *,
    prio: PriorityClass = STD,
    tenant: str = "t",
    model: str = "m",
    key: float = 0.0,
    expires: float = 1e9,
    size: int = 0,
    prompt: int = 100,
    out: int = 0,
    keep: float = 0.0,
) -> QueueItem:
    call = CallContext(rid, tenant, model, prio, 0.0, prompt, 16)
    return QueueItem(call, key, expires, out, size, keep)


def drain(q: RequestQueue, now: float = 0.0) -> list[QueueItem]:
    out = []
    while (ex := q.pop_next(now)) is not None:
        assert ex.kind is ExitKind.DISPATCHED
        out.append(ex.item)
    return out


def test_bands_are_strict_and_edf_within() -> None:
    q = RequestQueue()
    for i, (prio, key) in enumerate([(SHED, 1), (STD, 5), (CRIT, 9), (STD, 2), (CRIT, 3)]):
        assert q.push(item(f"r{i}", prio=prio, key=key), 0.0).accepted
    order = [(i.priority, i.order_key_s) for i in drain(q)]
    assert order == [(CRIT, 3), (CRIT, 9), (STD, 2), (STD, 5), (SHED, 1)]


def test_full_queue_evicts_lowest_class_newest_first() -> None:
    q = RequestQueue(QueueConfig(max_items=3))
    for rid, prio in [("s1", SHED), ("s2", SHED), ("d1", STD)]:
        assert q.push(item(rid, prio=prio), 0.0).accepted
    res = q.push(item("d2", prio=STD), 1.0)
    assert res.accepted and [e.item.request_id for e in res.evicted] == ["s2"]
    assert res.evicted[0].kind is ExitKind.EVICTED and res.evicted[0].waited_s == 1.0
    # A sheddable call would itself be the first victim: refused, nothing evicted.
    refused = q.push(item("s3", prio=SHED), 2.0)
    assert not refused.accepted and refused.evicted == () and "s1" in q
    # Same class and keep: the newcomer is newest, so it is the one refused.
    q2 = RequestQueue(QueueConfig(max_items=1))
    q2.push(item("a", prio=STD), 0.0)
    assert not q2.push(item("b", prio=STD), 0.0).accepted


def test_keep_protects_within_a_class() -> None:
    q = RequestQueue(QueueConfig(max_items=2))
    q.push(item("old_wf", prio=STD, keep=0.8), 0.0)
    q.push(item("new", prio=STD, keep=0.0), 1.0)
    res = q.push(item("mid_wf", prio=STD, keep=0.5), 2.0)
    assert [e.item.request_id for e in res.evicted] == ["new"]
    assert not q.push(item("plain", prio=STD), 3.0).accepted


def test_byte_bound_evicts_enough_and_refuses_oversize() -> None:
    q = RequestQueue(QueueConfig(max_bytes=1000))
    for i in range(4):
        q.push(item(f"s{i}", prio=SHED, size=250), float(i))
    res = q.push(item("big", prio=CRIT, size=600), 5.0)
    assert res.accepted and {e.item.request_id for e in res.evicted} == {"s3", "s2", "s1"}
    assert q.num_bytes == 850
    assert not q.push(item("huge", prio=CRIT, size=1001), 6.0).accepted


def test_blocked_model_does_not_block_others_work_conserving() -> None:
    q = RequestQueue()
    q.push(item("a1", model="a", key=1), 0.0)
    q.push(item("b1", model="b", key=2), 0.0)
    q.push(item("a2", model="a", key=3), 0.0)
    out = q.pop_next(0.0, lambda it: it.call.model == "b")
    assert out is not None and out.item.request_id == "b1"
    assert q.pop_next(0.0, lambda it: it.call.model == "b") is None  # a1 is not overtaken
    assert [i.request_id for i in drain(q)] == ["a1", "a2"]


def test_expired_calls_are_never_dispatched_and_are_reported() -> None:
    q = RequestQueue()
    assert q.next_expiry_s() is None
    q.push(item("late", key=0, expires=5.0), 0.0)
    q.push(item("ok", key=1, expires=50.0), 0.0)
    assert q.next_expiry_s() == 5.0
    out = q.pop_next(10.0)
    assert out is not None and out.item.request_id == "ok"
    expired = q.expire(10.0)
    assert [(e.item.request_id, e.kind) for e in expired] == [("late", ExitKind.EXPIRED)]
    assert q.next_expiry_s() is None
    assert len(q) == 0 and q.expire(11.0) == []


def test_idle_tenant_banks_no_credit() -> None:
    """A tenant arriving after another was served alone does not then monopolise service."""
    q = RequestQueue(QueueConfig(service_half_life_s=1e9))
    for i in range(50):
        q.push(item(f"a{i}", tenant="a", prompt=100), 0.0)
    for _ in range(40):
        q.pop_next(0.0)
    for i in range(20):
        q.push(item(f"b{i}", tenant="b", prompt=100), 0.0)
    first = [i.call.tenant for i in drain(q)][:10]
    assert 3 <= first.count("a") <= 7  # alternation, not ten of b's first


def test_cancel_and_work_ahead() -> None:
    q = RequestQueue()
    q.push(item("c", prio=CRIT, prompt=10, out=5), 0.0)
    q.push(item("s", prio=STD, prompt=20, out=7), 0.0)
    q.push(item("x", prio=SHED, prompt=40, out=9), 0.0)
    ahead = q.work_ahead(STD)
    assert (ahead.num_calls, ahead.prompt_tokens, ahead.output_tokens) == (2, 30, 12)
    ex = q.cancel("s", 3.0)
    assert ex is not None and ex.kind is ExitKind.CANCELLED and q.cancel("s", 3.0) is None
    assert q.work_ahead(SHED).num_calls == 2
    assert not q.push(item("c", prio=SHED), 4.0).accepted  # duplicate id


def test_work_ahead_of_an_order_key_counts_its_band_up_to_that_key() -> None:
    q = RequestQueue()
    q.push(item("c", prio=CRIT, key=9.0, prompt=10, out=5), 0.0)
    for rid, key in (("s1", 1.0), ("s2", 2.0), ("s3", 3.0), ("s4", 3.0)):
        q.push(item(rid, key=key, prompt=20, out=8), 0.0)
    ahead = q.work_ahead(STD, 2.5)  # the critical call, whatever its key, and s1, s2
    assert (ahead.num_calls, ahead.prompt_tokens, ahead.output_tokens) == (3, 50, 21)
    assert q.work_ahead(STD, 3.0).num_calls == 5  # ties count as ahead (FIFO among equals)
    assert q.work_ahead(STD, 0.5).num_calls == 1
    q.cancel("s2", 1.0)
    popped = [q.pop_next(1.0), q.pop_next(1.0)]
    assert [x.item.request_id for x in popped if x is not None] == ["c", "s1"]
    assert q.work_ahead(STD, 2.5).num_calls == 0 and q.work_ahead(STD, 3.0).num_calls == 2


# -- properties ------------------------------------------------------------------------

_ops = st.lists(
    st.tuples(
        st.sampled_from(["push", "push", "push", "pop", "expire", "cancel"]),
        st.sampled_from(list(PriorityClass)),
        st.sampled_from(["t1", "t2", "t3"]),
        st.sampled_from(["m1", "m2"]),
        st.integers(0, 100),  # key / size / expiry offset
    ),
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(_ops, st.integers(1, 12), st.integers(0, 2**16))
def test_every_call_leaves_exactly_once_and_memory_is_bounded(
    ops: list[tuple[str, PriorityClass, str, str, int]], max_items: int, seed: int
) -> None:
    rng = random.Random(seed)
    q = RequestQueue(QueueConfig(max_items=max_items, max_bytes=400))
    fate: Counter[str] = Counter()
    pushed: list[str] = []
    now = 0.0
    for n, (op, prio, tenant, model, x) in enumerate(ops):
        now += rng.random()
        if op == "push":
            rid = f"r{n}"
            pushed.append(rid)
            res = q.push(
                item(
                    rid, prio=prio, tenant=tenant, model=model, key=x, expires=now + x / 10, size=x
                ),
                now,
            )
            fate.update(e.item.request_id for e in res.evicted)
            if not res.accepted:
                fate[rid] += 1
        elif op == "pop":
            ex = q.pop_next(now, lambda it: rng.random() < 0.7)
            if ex is not None:
                fate[ex.item.request_id] += 1
        elif op == "expire":
            fate.update(e.item.request_id for e in q.expire(now))
        elif pushed:
            ex = q.cancel(rng.choice(pushed), now)
            if ex is not None:
                fate[ex.item.request_id] += 1
        assert len(q) <= max_items and q.num_bytes <= 400
        heaps = sum(
            len(f.heap) for b in q._bands.values() for fl in b.flows.values() for f in fl.values()
        )
        assert heaps <= 2 * len(q) + 64 * (len(q) + 1) and len(q._expiry) <= 2 * len(q) + 64
    fate.update(e.item.request_id for e in q.expire(now))
    fate.update(i.request_id for i in drain(q, now))
    fate.update(e.item.request_id for e in q.expire(1e12))
    assert len(q) == 0 and q.num_bytes == 0
    assert sorted(fate) == sorted(pushed) and set(fate.values()) <= {1}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(list(PriorityClass)), st.floats(0, 100)), min_size=1, max_size=60
    )
)
def test_edf_within_a_class_and_bands_in_order(calls: list[tuple[PriorityClass, float]]) -> None:
    q = RequestQueue()
    for n, (prio, key) in enumerate(calls):
        q.push(item(f"r{n}", prio=prio, key=key), 0.0)
    out = [(i.priority.rank, i.order_key_s) for i in drain(q)]
    assert out == sorted(out)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**16), st.floats(0.2, 0.8))
def test_critical_never_starved_by_a_flood_of_lower_classes(seed: int, p_crit: float) -> None:
    """Critical calls go first whenever one waits, and are never evicted for lower ones."""
    rng = random.Random(seed)
    q = RequestQueue(QueueConfig(max_items=50))
    for n in range(300):
        prio = CRIT if rng.random() < p_crit * 0.2 else rng.choice([STD, SHED])
        res = q.push(item(f"r{n}", prio=prio, tenant=rng.choice("abc")), float(n))
        assert res.accepted or prio is not CRIT  # lower classes make room for it
        assert all(e.item.priority is not CRIT for e in res.evicted)
        if rng.random() < 0.5:  # capacity for half the arrivals
            waiting_critical = q.depth(CRIT)
            ex = q.pop_next(float(n))
            assert ex is not None
            assert (ex.item.priority is CRIT) == (waiting_critical > 0)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**16), st.lists(st.integers(1, 4), min_size=2, max_size=4))
def test_fair_share_converges_to_weights(seed: int, weights: list[int]) -> None:
    """Backlogged tenants with random arrivals and sizes get service in their weights' ratio."""
    rng = random.Random(seed)
    tenants = [f"t{i}" for i in range(len(weights))]
    shares = {t: float(w) for t, w in zip(tenants, weights, strict=True)}
    q = RequestQueue(QueueConfig(tenant_weights=shares, service_half_life_s=30.0))
    served: Counter[str] = Counter()
    backlog: Counter[str] = Counter()
    n = 0
    for step in range(1000):
        now = step * 0.1
        for t in tenants:
            for _ in range(rng.randint(0, 1) if backlog[t] >= 3 else 3):
                n += 1
                backlog[t] += 1
                q.push(item(f"r{n}", tenant=t, prompt=rng.randint(50, 500)), now)
        ex = q.pop_next(now)
        assert ex is not None
        backlog[ex.item.call.tenant] -= 1
        if step >= 200:  # after warm-up
            served[ex.item.call.tenant] += ex.item.service_tokens
    total, wsum = sum(served.values()), sum(weights)
    for t, w in zip(tenants, weights, strict=True):
        assert abs(served[t] / total - w / wsum) < 0.05, (served, weights)
