"""Cache policy: eligibility, keys, tenant checks, semantic eligibility, ledger, entry codec."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.cache import (
    CacheEntry,
    CacheLedger,
    CacheStatus,
    PayloadKind,
    canonical_body,
    eligibility,
    entry_matches,
    exact_identity,
    exact_key,
    is_deterministic,
    semantic_query,
)
from inferplane.core.cache_config import CacheConfig, CacheRouteConfig, SemanticRouteConfig

CHAT = "/v1/chat/completions"
ROUTE = CacheRouteConfig()
SEMANTIC = CacheRouteConfig(semantic=SemanticRouteConfig(enabled=True))


def chat(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def entry(
    key: str = "k", tenant: str = "a", model: str = "m", expires_s: float = 10.0
) -> CacheEntry:
    return CacheEntry(key, tenant, model, PayloadKind.JSON, b"{}", 0.0, expires_s, 0.5, 2.0, 7)


@settings(max_examples=60, deadline=None)
@given(
    temperature=st.one_of(st.none(), st.floats(0.01, 2.0)),
    top_p=st.one_of(st.none(), st.floats(0.1, 1.0)),
)
def test_nondeterministic_requests_are_never_cached(temperature: float | None, top_p: float | None):
    body = chat(temperature=temperature, top_p=top_p)
    decision = eligibility(ROUTE, body, None)
    assert not decision.read and not decision.write
    assert decision.reason == "nondeterministic"


def test_deterministic_means_temperature_zero_or_a_seed():
    assert is_deterministic(chat(temperature=0))
    assert is_deterministic(chat(temperature=0.0))
    assert is_deterministic(chat(temperature=1.2, seed=7))
    assert not is_deterministic(chat())  # engine default temperature is 1
    assert not is_deterministic(chat(temperature=0, n=3))  # n > 1 needs sampling
    assert not is_deterministic(chat(temperature=True))
    assert not is_deterministic(chat(temperature=0.7, seed=True))


def test_route_opt_in_caches_nondeterministic_requests():
    route = CacheRouteConfig(allow_nondeterministic=True)
    assert eligibility(route, chat(temperature=0.9), None).read


def test_cache_control_no_store_and_no_cache():
    body = chat(temperature=0)
    assert eligibility(ROUTE, body, None) == eligibility(ROUTE, body, "max-age=5")
    assert eligibility(ROUTE, body, None).read
    no_store = eligibility(ROUTE, body, "No-Store")
    assert (no_store.read, no_store.write, no_store.reason) == (False, False, "no_store")
    no_cache = eligibility(ROUTE, body, "max-age=0, no-cache")
    assert (no_cache.read, no_cache.write) == (False, True)
    assert not eligibility(CacheRouteConfig(enabled=False), body, None).write


def test_key_ignores_field_order_and_answer_neutral_fields():
    a = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "x"}]}
    b = {"messages": [{"content": "x", "role": "user"}], "user": "bob", "temperature": 0}
    assert canonical_body(a) == canonical_body(b)
    assert exact_key("t", "m", CHAT, a) == exact_key("t", "m", CHAT, b)


def test_key_changes_with_tenant_model_path_sampling_and_stream_shape():
    body = chat(temperature=0)
    base = exact_key("t", "m", CHAT, body)
    assert exact_key("u", "m", CHAT, body) != base
    assert exact_key("t", "m2", CHAT, body) != base
    assert exact_key("t", "m", "/v1/completions", body) != base
    assert exact_key("t", "m", CHAT, {**body, "max_tokens": 5}) != base
    assert exact_key("t", "m", CHAT, {**body, "stream": True}) != base
    usage = {**body, "stream": True, "stream_options": {"include_usage": True}}
    assert exact_key("t", "m", CHAT, usage) != exact_key("t", "m", CHAT, {**body, "stream": True})


@settings(max_examples=60, deadline=None)
@given(a=st.text(max_size=8), b=st.text(max_size=8))
def test_tenant_and_model_framing_cannot_be_shifted(a: str, b: str):
    """("ab", "c") and ("a", "bc") must not give one key: fields are length-framed."""
    body = chat(temperature=0)
    if (a, b) != (a + b, ""):
        assert exact_key(a, b, CHAT, body) != exact_key(a + b, "", CHAT, body)


def test_entry_check_refuses_other_tenant_even_under_a_forced_collision():
    collide = lambda _data: "same"  # noqa: E731
    key_a = exact_key("tenant-a", "m", CHAT, chat("secret", temperature=0), hasher=collide)
    key_b = exact_key("tenant-b", "m", CHAT, chat("secret", temperature=0), hasher=collide)
    assert key_a == key_b == "same"
    stored = entry(key_a, tenant="tenant-a")
    assert entry_matches(stored, "tenant-a", "m", key_a)
    assert not entry_matches(stored, "tenant-b", "m", key_b)
    assert not entry_matches(stored, "tenant-a", "other-model", key_a)
    assert not entry_matches(stored, "tenant-a", "m", "other-key")
    # within a tenant, the independent fingerprint refuses a colliding different request
    _, print_a = exact_identity("tenant-a", "m", CHAT, chat("secret", temperature=0), collide)
    _, print_b = exact_identity("tenant-a", "m", CHAT, chat("other", temperature=0), collide)
    fingerprinted = CacheEntry(
        key_a, "tenant-a", "m", PayloadKind.JSON, b"{}", 0, 9, fingerprint=print_a
    )
    assert entry_matches(fingerprinted, "tenant-a", "m", key_a, print_a)
    assert not entry_matches(fingerprinted, "tenant-a", "m", key_a, print_b)


def test_semantic_is_off_by_default_and_chat_only():
    assert semantic_query(ROUTE, "t", "m", CHAT, chat())[0] is None
    assert semantic_query(SEMANTIC, "t", "m", "/v1/completions", {"prompt": "x"})[1] == "not_chat"
    query, reason = semantic_query(SEMANTIC, "t", "m", CHAT, chat("  How do I reset it? "))
    assert reason == "" and query is not None and query.text == "How do I reset it?"


def test_semantic_refuses_tool_traffic_and_long_conversations_unless_opted_in():
    tool_result = chat(
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "tool_calls": [{"id": "1"}]},
            {"role": "tool", "content": "sunny"},
            {"role": "user", "content": "so?"},
        ]
    )
    assert semantic_query(SEMANTIC, "t", "m", CHAT, tool_result)[1] == "tool_traffic"
    with_tools = chat(tools=[{"type": "function"}])
    assert semantic_query(SEMANTIC, "t", "m", CHAT, with_tools)[1] == "tool_traffic"
    turns = chat(
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    )
    assert semantic_query(SEMANTIC, "t", "m", CHAT, turns)[1] == "too_many_turns"
    roomy = CacheRouteConfig(semantic=SemanticRouteConfig(enabled=True, max_turns=3))
    assert semantic_query(roomy, "t", "m", CHAT, turns)[0] is not None
    tools_ok = CacheRouteConfig(
        semantic=SemanticRouteConfig(enabled=True, max_turns=9, allow_tools=True)
    )
    assert semantic_query(tools_ok, "t", "m", CHAT, tool_result)[0] is not None


def test_semantic_context_covers_everything_but_the_last_user_turn():
    def ctx(body: dict[str, Any], tenant: str = "t") -> str:
        query, _ = semantic_query(SEMANTIC, tenant, "m", CHAT, body)
        assert query is not None
        return query.context_hash

    base = ctx(chat("what is the refund policy?", temperature=0))
    assert ctx(chat("refund policy?", temperature=0)) == base
    assert ctx(chat("refund policy?", temperature=0), tenant="u") != base
    assert ctx(chat("refund policy?", temperature=0, max_tokens=9)) != base
    system = chat(temperature=0)
    system["messages"] = [{"role": "system", "content": "pirate"}, *system["messages"]]
    assert ctx(system) != base


def test_entry_codec_round_trips_and_rejects_garbage():
    e = entry("key", tenant="t")
    assert CacheEntry.decode(e.encode()) == e
    assert CacheEntry.decode(b"\x00garbage") is None
    assert CacheEntry.decode(b"") is None


def test_ledger_counts_avoided_work_per_tenant():
    ledger = CacheLedger(max_tenants=2)
    ledger.on_hit(entry(tenant="a"), CacheStatus.HIT_EXACT)
    ledger.on_hit(entry(tenant="a"), CacheStatus.HIT_SEMANTIC)
    ledger.on_hit(entry(tenant="b"), CacheStatus.HIT_EXACT)
    ledger.on_lookup(CacheStatus.BYPASS, "nondeterministic")
    a = ledger.by_tenant["a"]
    assert (a.hits_exact, a.hits_semantic, a.completion_tokens) == (1, 1, 14)
    assert a.cost_usd == 1.0 and a.gpu_seconds == 4.0
    assert ledger.totals().hits_exact == 2
    assert ledger.lookups == {"bypass:nondeterministic": 1}
    ledger.on_hit(entry(tenant="c"), CacheStatus.HIT_EXACT)
    assert len(ledger.by_tenant) == 2  # bounded


def test_config_routes_and_semantic_flag():
    cfg = CacheConfig(routes={"faq": SEMANTIC})
    assert cfg.route("faq").semantic.enabled and not cfg.route("other").semantic.enabled
    assert cfg.any_semantic and not CacheConfig().any_semantic
