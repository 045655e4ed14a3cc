"""The fast all-MiniLM-L6-v2 forward gives the vectors the plain transformers forward gives.

The semantic cache's thresholds were chosen on the reference model's similarities, so the
fast path (fp16-packed weights, fused projections, TorchScript, own padding) must not move
them: every vector within 1e-3 cosine of the reference, every pairwise similarity within
1e-3. Loads the model three ways (seconds), so marked slow.
"""

from __future__ import annotations

import numpy as np
import pytest

from inferplane.cache.embedder import MINILM_DIM, MiniLmEmbedder
from inferplane.cache.embedder_reference import ReferenceMiniLmEmbedder
from inferplane.cache.minilm import bf16_gemm_available, fp16_gemm_available

pytestmark = pytest.mark.slow

TEXTS = [
    "How do I reset my password?",
    "I forgot my password, how can I reset it?",
    "Which ways can I pay?",
    "How do I disable two-factor authentication?",
    "Is it possible to edit the delivery address on an order I already placed?",
    "What is the meaning of life?",
    "ok",
    "Ünïcödé, emoji 🚀 and   odd   spacing\tin one line.",
]
LONG = " ".join(f"word{i} and more text" for i in range(400))  # far past 256 tokens


@pytest.fixture(scope="module")
def reference() -> ReferenceMiniLmEmbedder:
    model = ReferenceMiniLmEmbedder(num_threads=1)
    model.load()
    return model


@pytest.fixture(scope="module")
def fast() -> MiniLmEmbedder:
    model = MiniLmEmbedder(num_threads=1)
    model.load()
    return model


def one_by_one(model: MiniLmEmbedder | ReferenceMiniLmEmbedder, texts: list[str]) -> np.ndarray:
    return np.concatenate([model.embed([t]) for t in texts])


def test_fast_vectors_match_the_reference(
    fast: MiniLmEmbedder, reference: ReferenceMiniLmEmbedder
) -> None:
    if fp16_gemm_available():  # x86 builds: the fast path is the one under test
        assert "fp16-weights, torchscript" in fast.description
    got, want = one_by_one(fast, TEXTS), one_by_one(reference, TEXTS)
    assert got.shape == (len(TEXTS), MINILM_DIM) and got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert float((got * want).sum(axis=1).min()) > 0.999
    assert float(np.abs(got @ got.T - want @ want.T).max()) < 1e-3


def test_a_padded_batch_equals_one_sentence_at_a_time(fast: MiniLmEmbedder) -> None:
    batch = fast.embed(TEXTS)  # mixed lengths: padded to the longest, masked
    assert np.allclose(batch, one_by_one(fast, TEXTS), atol=1e-5)


def test_long_text_is_truncated_at_the_model_limit(
    fast: MiniLmEmbedder, reference: ReferenceMiniLmEmbedder
) -> None:
    got, want = fast.embed([LONG])[0], reference.embed([LONG])[0]
    assert float(got @ want) > 0.999
    # only the first 256 tokens count: more text after them changes nothing
    assert np.allclose(fast.embed([LONG + " tail words"])[0], got, atol=1e-6)


def test_float32_eager_fallback_matches_the_reference(reference: ReferenceMiniLmEmbedder) -> None:
    plain = MiniLmEmbedder(num_threads=1, precision="fp32", compile=False)
    plain.load()
    assert "fp32, eager" in plain.description
    got, want = plain.embed(TEXTS), reference.embed(TEXTS)
    assert np.allclose(got, want, atol=1e-5)
    assert plain.embed([]).shape == (0, MINILM_DIM)


@pytest.mark.skipif(not bf16_gemm_available(), reason="no native bfloat16 products on this CPU")
def test_bfloat16_products_stay_close_to_the_reference(reference: ReferenceMiniLmEmbedder) -> None:
    """bf16 rounds each product's inputs: looser than fp16 weights, still far below the
    thresholds' resolution (bench/cache.py shows the FAQ tables unchanged)."""
    bf16 = MiniLmEmbedder(num_threads=1, precision="bf16")
    bf16.load()
    assert "bf16, torchscript" in bf16.description
    texts = [*TEXTS, LONG]
    got, want = one_by_one(bf16, texts), one_by_one(reference, texts)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert float((got * want).sum(axis=1).min()) > 0.9995
    assert float(np.abs(got @ got.T - want @ want.T).max()) < 1e-2
    assert np.allclose(bf16.embed(texts), got, atol=5e-3)  # padded batch vs one at a time
