"""The real embedding model (all-MiniLM-L6-v2, offline) behind the semantic cache.

Loads the model once for the module (seconds on this CPU), so the tests are marked slow; they
run in CI, where the ``semantic`` extra is installed.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from inferplane.cache.embedder import MINILM_DIM, MiniLmEmbedder
from inferplane.core.cache_config import CacheConfig, CacheRouteConfig, SemanticRouteConfig
from inferplane.gateway.response_cache import ResponseCache
from tests.gateway.test_response_cache import CHAT, body, context

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedder() -> MiniLmEmbedder:
    model = MiniLmEmbedder(num_threads=1)
    model.load()
    return model


def test_loads_offline_and_separates_paraphrases_from_other_questions(
    embedder: MiniLmEmbedder,
) -> None:
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    vectors = embedder.embed(
        [
            "How do I reset my password?",
            "I forgot my password, how can I change it?",
            "What are your opening hours on Sunday?",
        ]
    )
    assert vectors.shape == (3, MINILM_DIM) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    sims = vectors @ vectors.T
    assert sims[0, 1] > 0.7 > 0.3 > sims[0, 2]


async def test_real_paraphrase_hits_within_tenant_and_never_across(
    embedder: MiniLmEmbedder,
) -> None:
    route = CacheRouteConfig(semantic=SemanticRouteConfig(enabled=True, threshold=0.75))
    cache = ResponseCache(
        CacheConfig(default=route), asyncio.get_running_loop().time, embedder=embedder
    )
    question = body("How do I reset my password?", temperature=0)
    found = await cache.lookup(context("acme", CHAT, question), question, {})
    assert found.status.value == "miss"
    assert await cache.store_json(found, b'{"answer": "acme"}')
    paraphrase = body("How can I reset my password?", temperature=0)
    same = await cache.lookup(context("acme", CHAT, paraphrase), paraphrase, {})
    assert same.status.value == "hit-semantic" and same.similarity is not None
    assert same.entry is not None and same.entry.payload == b'{"answer": "acme"}'
    for probe in (question, paraphrase):  # adversarial: identical text, other tenant
        other = await cache.lookup(context("globex", CHAT, probe), probe, {})
        assert other.entry is None
    unrelated = body("Which countries do you ship to?", temperature=0)
    miss = await cache.lookup(context("acme", CHAT, unrelated), unrelated, {})
    assert miss.entry is None
