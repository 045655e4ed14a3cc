"""The gateway's routing brain: prompt keys, profile priors, and precise prefix routing end to
end (emulated engines publishing KV events, the gateway subscribed to them)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from inferplane.config import EndpointConfig, parse_config
from inferplane.core.prefix_index import block_keys
from inferplane.core.routing_config import EndpointPrior
from inferplane.engine.fleet import EngineSpec, Fleet
from inferplane.engine.profiles import load_profile
from inferplane.engine.protocol import chat_prompt_ids, completion_prompt_ids
from inferplane.gateway.context import ApiKind
from inferplane.gateway.priors import prior_for_endpoint, prior_from_profile
from inferplane.gateway.router import GatewayRouter, prompt_token_ids
from inferplane.tokenizer import get_tokenizer
from tests.gateway.fakes import running_gateway

MODEL = "llama-3-8b"
# ~2,000 tokens shared by every call of one "tenant", then a short question of its own.
SHARED = " ".join(f"policy clause {i} says the customer record stays private" for i in range(220))


def _chat(question: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [
            {"role": "system", "content": SHARED},
            {"role": "user", "content": question},
        ],
    }


CONTINUED = [*_chat("q")["messages"], {"role": "assistant", "content": "A partial"}]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (ApiKind.CHAT, _chat("why?")),
        (ApiKind.CHAT, {**_chat("q"), "continue_final_message": True,
                        "add_generation_prompt": False, "messages": CONTINUED}),
        (ApiKind.COMPLETIONS, {"prompt": "once upon a time"}),
        (ApiKind.COMPLETIONS, {"prompt": "raw", "add_special_tokens": False}),
        (ApiKind.COMPLETIONS, {"prompt": [20, 21, 22]}),
    ],
)  # fmt: skip
def test_prompt_ids_are_the_engines_own(path: str, body: dict[str, Any]) -> None:
    tokenizer = get_tokenizer()
    engine = chat_prompt_ids if path == ApiKind.CHAT else completion_prompt_ids
    assert prompt_token_ids(path, body) == engine(body, tokenizer)


def test_prompt_ids_of_bodies_the_engine_refuses_are_none() -> None:
    assert prompt_token_ids(ApiKind.CHAT, {"messages": [{"role": "robot"}]}) is None
    assert prompt_token_ids(ApiKind.COMPLETIONS, {"prompt": [["a"], ["b"]]}) is None


def _endpoint(name: str, **extra: Any) -> dict[str, Any]:
    base = {"name": name, "url": "http://127.0.0.1:9", "models": [MODEL], "gpu": "h100"}
    return {**base, "price_per_hour_usd": 2.0, **extra}


def test_keys_only_for_models_with_a_known_tokenizer() -> None:
    fleet = parse_config(
        {
            "endpoints": [
                _endpoint("emu", emulated={"time_scale": 2.0}),
                {**_endpoint("real"), "models": ["other"]},
            ]
        }
    )
    router = GatewayRouter(fleet)
    body = _chat("hi")
    keyed = router.prompt_keys(ApiKind.CHAT, body, (MODEL,))
    ids = prompt_token_ids(ApiKind.CHAT, body)
    assert ids is not None and keyed.num_tokens == len(ids)
    assert keyed.keys == tuple(block_keys(ids, 16)) and len(keyed.keys) == len(ids) // 16
    assert router.prompt_keys(ApiKind.CHAT, body, ("other",)).keys == ()


def test_profile_prior_follows_the_hardware_and_the_time_scale() -> None:
    h100 = prior_from_profile(load_profile(MODEL, "h100"))
    a100 = prior_from_profile(load_profile(MODEL, "a100"))
    slow = prior_from_profile(load_profile(MODEL, "h100"), time_scale=4.0)
    assert a100.prefill_tokens_per_s < h100.prefill_tokens_per_s
    assert a100.decode_base_s > h100.decode_base_s
    assert slow.prefill_tokens_per_s == pytest.approx(h100.prefill_tokens_per_s / 4)
    assert slow.decode_base_s == pytest.approx(h100.decode_base_s * 4)
    # REFERENCE §2: 8B decode at batch 1 on H100 is bandwidth-bound at >= 4.8 ms a token.
    assert 0.0048 <= h100.decode_base_s < 0.02
    real = EndpointConfig.model_validate(_endpoint("real"))
    assert prior_for_endpoint(real) is None
    emulated = EndpointConfig.model_validate(_endpoint("e", emulated={"time_scale": 1.0}))
    assert isinstance(prior_for_endpoint(emulated), EndpointPrior)


def test_prefix_outcomes_say_why_a_call_left_the_blocks_holder() -> None:
    """Every keyed route is counted against the endpoint holding most of its blocks; a
    miss is explained (the holder's axes, or its state when it was filtered out)."""
    from inferplane.core.types import EndpointState
    from tests.core.routing_helpers import call, view

    fleet = parse_config({"endpoints": [_endpoint("a"), _endpoint("b")]})
    router = GatewayRouter(fleet)
    keys = tuple(range(200))
    c = call(model=MODEL, prompt=3200, keys=keys)
    idle = [view("a", model=MODEL), view("b", model=MODEL)]
    assert router.route(c, idle, 0.0).primary is not None
    router.index.record_route("a", keys, 0.0)
    assert router.route(c, idle, 0.0).primary == "a"
    hot = [view("a", model=MODEL, waiting=300, running=256), view("b", model=MODEL)]
    assert router.route(c, hot, 0.0).primary == "b"
    out = [view("a", model=MODEL, state=EndpointState.EJECTED), view("b", model=MODEL)]
    assert router.route(c, out, 0.0).primary == "b"
    stats = router.prefix_stats()
    assert stats["routed_no_holder"] == 1 and stats["routed_on_best_holder"] == 1
    assert stats["routed_holder_outscored"] == 1 and stats["routed_holder_not_candidate"] == 1
    outscored, filtered = stats["miss_samples"]
    assert (outscored["holder"], outscored["primary"]) == ("a", "b")
    assert outscored["holder_axes"]["kv_cache"][1].startswith("hot: TTFT +")
    assert outscored["blocks"] == 200 and outscored["primary_blocks"] == 0
    assert filtered == {**filtered, "holder": "a", "holder_state": "ejected", "primary": "b"}


def test_live_workflows_follow_dispatches_and_end_at_the_last_step() -> None:
    from inferplane.core.types import CallContext, PriorityClass
    from inferplane.gateway.router import LIVE_WORKFLOW_IDLE_S
    from tests.core.routing_helpers import view

    router = GatewayRouter(parse_config({"endpoints": [_endpoint("a"), _endpoint("b")]}))

    def step(workflow: str, n: int, of: int) -> CallContext:
        return CallContext("r", "t", MODEL, PriorityClass.STANDARD, 0.0, 100, 8,
                           workflow_id=workflow, workflow_step=n, workflow_steps=of)  # fmt: skip

    a, b = view("a", model=MODEL), view("b", model=MODEL)
    router.on_dispatch("1", step("w1", 1, 3), a, 0.0)
    router.on_dispatch("2", step("w2", 1, 2), a, 1.0)
    router.on_dispatch("3", step("w3", 1, 5), b, 2.0)
    assert router.live_workflows(2.0) == {"a": 2, "b": 1}
    router.on_dispatch("4", step("w1", 2, 3), b, 3.0)  # moved
    router.on_dispatch("5", step("w2", 2, 2), a, 4.0)  # its last step
    assert router.live_workflows(4.0) == {"b": 2}
    assert router.live_workflows(3.0 + LIVE_WORKFLOW_IDLE_S + 0.1) == {}  # idle: gone
    assert router.stats()["live_workflows"] == 0


def _shared_full_blocks(a: dict[str, Any], b: dict[str, Any]) -> int:
    """Tokens of the full 16-token blocks two prompts share (what a prefix cache reuses)."""
    ids_a, ids_b = prompt_token_ids(ApiKind.CHAT, a), prompt_token_ids(ApiKind.CHAT, b)
    assert ids_a is not None and ids_b is not None
    pairs = enumerate(zip(ids_a, ids_b, strict=False))
    common = next((i for i, (x, y) in pairs if x != y), min(len(ids_a), len(ids_b)))
    return common // 16 * 16


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[str, Any]:
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["X-Inferplane-Endpoint"], orjson.loads(await resp.read())


async def _get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        return orjson.loads(await resp.read()) if "json" in resp.content_type else await resp.text()


async def _until_stats(session: aiohttp.ClientSession, url: str, cond: Any) -> Any:
    for _ in range(200):
        stats = await _get(session, url + "/v1/stats")
        if cond(stats["routing"]):
            return stats["routing"]
        await asyncio.sleep(0.02)
    raise AssertionError(f"routing stats never satisfied the condition: {stats['routing']}")


async def test_shared_prefix_lands_on_the_engine_that_caches_it() -> None:
    specs = [EngineSpec(model=MODEL, count=3, time_scale=0.05, kv_events=True)]
    async with Fleet(specs) as fleet:
        config = parse_config(
            {
                "gateway": {"auth": {"mode": "anonymous"}, "log_requests": False},
                "endpoints": [e.endpoint_config() for e in fleet.engines],
            }
        )
        async with running_gateway(config) as (_, url), aiohttp.ClientSession() as session:
            routing = await _until_stats(
                session,
                url,
                lambda r: all(s["state"] == "connected" for s in r["kv_events"].values()),
            )
            assert set(routing["kv_events"]) == {e.name for e in fleet.engines}
            first, body1 = await _post(session, url, _chat("What is clause 7?"))
            assert body1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            # The engine's BlockStored events reach the index (not just the route's guess).
            routing = await _until_stats(
                session, url, lambda r: r["kv_events"][first]["events_applied"] > 0
            )
            assert routing["prefix"]["index"]["num_engine_hashes"] > 0
            second, body2 = await _post(session, url, _chat("And clause 9?"))
            assert second == first
            cached = body2["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached == _shared_full_blocks(_chat("What is clause 7?"), _chat("And clause 9?"))
            assert cached > 1500
            prefix = (await _get(session, url + "/v1/stats"))["routing"]["prefix"]
            assert prefix["calls_keyed"] == 2 and prefix["calls_on_cached_prefix"] == 1
            assert prefix["reported_cached_tokens"] == cached
            metrics = await _get(session, url + "/metrics")
            assert f'inferplane_kv_events_connected{{endpoint="{first}"}} 1.0' in metrics
            assert 'inferplane_prefix{kind="calls_on_cached_prefix"} 1.0' in metrics


def test_inferplane_up_engines_publish_kv_events() -> None:
    from inferplane.gateway.demo import demo_specs

    specs = demo_specs(4.0)
    assert specs and all(s.kv_events and s.time_scale == 4.0 for s in specs)
