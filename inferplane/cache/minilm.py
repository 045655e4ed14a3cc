"""A compact forward pass of all-MiniLM-L6-v2 for one-sentence-at-a-time embedding on a CPU.

The semantic cache embeds one short user turn per request (about a dozen tokens). At that size
the generic ``transformers`` BERT forward spends its time not on arithmetic but on streaming
42 MB of float32 weights through the caches for every sentence, repacking them on each matrix
product, and on Python dispatch over ~40 modules. This module runs the same network (BERT:
6 layers, 12 heads, hidden 384, exact GELU, mean pooling over the attention mask, L2
normalisation) from the model's own ``model.safetensors``, with:

- weights packed once for fbgemm's half-precision GEMM (torch's built-in dynamic float16
  quantisation of ``Linear``): half the bytes per product and no repacking; activations and
  accumulation stay float32, so vectors match the float32 model to ~1e-4 in cosine (checked
  in tests). Plain float32 where fbgemm is missing (e.g. ARM builds); int8 only on request
  (:class:`Precision`);
- on CPUs with native bfloat16 dot products (AVX512-BF16, AMX), the option of bfloat16 matrix
  products through oneDNN with packed weights and the feed-forward GELU fused into its product
  (``Precision.BF16``, opt-in): its products ~1.5x faster, the whole sentence ~10-20%
  (attention, norms and dispatch are the rest); inputs are rounded to bfloat16 at each
  product, accumulation, norms, softmax and residuals stay float32: vectors within ~6e-5
  cosine of float32, pairwise similarities within ~3e-3 (fp16 weights: 1.5e-4), the FAQ hit
  and false-hit tables unchanged at every threshold (``bench/cache.py``);
- the query, key and value projections fused into one product per layer;
- no token-type lookup (always type 0: its row is folded into the position table), no pooler,
  no dropout, and no attention mask at all when no token is padding;
- the whole forward compiled by TorchScript and frozen (no Python dispatch per operator);
  eager execution when that is unavailable.

Callers run it under ``torch.inference_mode``. No I/O beyond reading the weights.
"""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

NUM_LAYERS = 6
NUM_HEADS = 12
HIDDEN = 384
INTERMEDIATE = 1536
LAYER_NORM_EPS = 1e-12

#: The compiled (or eager) encoder: (ids, attention) -> unit vectors.
Encoder = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def fp16_gemm_available() -> bool:
    """Whether this torch build has fbgemm's packed half-precision linear (x86 builds do)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    try:
        packed = torch.ops.quantized.linear_prepack_fp16(torch.zeros(2, 2), None)
        torch.ops.quantized.linear_dynamic_fp16(torch.zeros(1, 2), packed)
    except (RuntimeError, AttributeError):
        return False
    return True


def _dense(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    return layer


class _Layer(nn.Module):
    """One transformer layer (post-norm BERT), query/key/value fused."""

    __constants__: ClassVar[list[str]] = ["heads", "head_dim", "hidden"]

    def __init__(self, w: Mapping[str, torch.Tensor], prefix: str) -> None:
        super().__init__()
        self.heads, self.head_dim, self.hidden = NUM_HEADS, HIDDEN // NUM_HEADS, HIDDEN
        a = f"{prefix}attention."
        self.qkv: nn.Module = _dense(
            torch.cat([w[f"{a}self.{n}.weight"] for n in ("query", "key", "value")]),
            torch.cat([w[f"{a}self.{n}.bias"] for n in ("query", "key", "value")]),
        )
        self.out: nn.Module = _dense(w[f"{a}output.dense.weight"], w[f"{a}output.dense.bias"])
        self.ln1 = nn.LayerNorm(HIDDEN, eps=LAYER_NORM_EPS)
        self.ffn_in: nn.Module = _dense(
            w[f"{prefix}intermediate.dense.weight"], w[f"{prefix}intermediate.dense.bias"]
        )
        self.act: nn.Module = nn.GELU()  # an identity once fused into ffn_in (bfloat16)
        self.ffn_out: nn.Module = _dense(
            w[f"{prefix}output.dense.weight"], w[f"{prefix}output.dense.bias"]
        )
        self.ln2 = nn.LayerNorm(HIDDEN, eps=LAYER_NORM_EPS)
        with torch.no_grad():
            norms = ((self.ln1, f"{a}output.LayerNorm"), (self.ln2, f"{prefix}output.LayerNorm"))
            for norm, name in norms:
                norm.weight.copy_(w[f"{name}.weight"])
                norm.bias.copy_(w[f"{name}.bias"])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, batch: int) -> torch.Tensor:
        """``x``: (batch * tokens, hidden); ``mask``: additive (batch, 1, 1, tokens) or None."""
        tokens = x.shape[0] // batch
        heads = self.qkv(x).view(batch, tokens, 3, self.heads, self.head_dim)
        qkv = heads.permute(2, 0, 3, 1, 4)
        context = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)
        merged = context.transpose(1, 2).reshape(batch * tokens, self.hidden)
        x = self.ln1(x + self.out(merged))
        out: torch.Tensor = self.ln2(x + self.ffn_out(self.act(self.ffn_in(x))))
        return out


class MiniLmModule(nn.Module):
    """Token ids (+ a 1/0 attention row per sentence) to unit sentence vectors."""

    __constants__: ClassVar[list[str]] = ["hidden"]

    def __init__(self, weights: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self.hidden = HIDDEN
        w = {k.removeprefix("bert."): v.float() for k, v in weights.items()}
        self.word = nn.Parameter(w["embeddings.word_embeddings.weight"], requires_grad=False)
        position = w["embeddings.position_embeddings.weight"]
        position = position + w["embeddings.token_type_embeddings.weight"][0]  # type 0 always
        self.position = nn.Parameter(position, requires_grad=False)
        self.ln = nn.LayerNorm(HIDDEN, eps=LAYER_NORM_EPS)
        with torch.no_grad():
            self.ln.weight.copy_(w["embeddings.LayerNorm.weight"])
            self.ln.bias.copy_(w["embeddings.LayerNorm.bias"])
        self.layers = nn.ModuleList([_Layer(w, f"encoder.layer.{i}.") for i in range(NUM_LAYERS)])

    def forward(self, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """``ids``: (batch, tokens) int64; ``attention``: same shape, 1 for real tokens."""
        batch, tokens = ids.shape[0], ids.shape[1]
        x = self.ln(F.embedding(ids, self.word) + self.position[:tokens])
        x = x.reshape(batch * tokens, self.hidden)
        padded = not bool(attention.all())
        mask: torch.Tensor | None = None
        if padded:
            keep = attention.to(torch.bool).view(batch, 1, 1, tokens)
            mask = torch.zeros(keep.shape, dtype=torch.float32).masked_fill(~keep, -math.inf)
        for layer in self.layers:
            x = layer(x, mask, batch)
        hidden = x.view(batch, tokens, self.hidden)
        if padded:
            weight = attention.to(torch.float32).view(batch, tokens, 1)
            mean = (hidden * weight).sum(dim=1) / weight.sum(dim=1).clamp(min=1e-9)
        else:
            mean = hidden.mean(dim=1)
        return F.normalize(mean, p=2.0, dim=1)


class Precision(enum.Enum):
    """How the matrix products run: float32, fp16-packed weights, or int8 (opt-in, lossy)."""

    FP32 = "fp32"
    FP16_WEIGHTS = "fp16-weights"
    #: Dynamic int8 (per-channel weights, per-call activation scale): about twice as fast
    #: again, but similarities move by ~0.02 on average (0.1 at worst) from the reference,
    #: so thresholds tuned on the float model no longer mean the same. Measure before use.
    INT8 = "int8"
    #: bfloat16 products through oneDNN (CPUs with AVX512-BF16 or AMX; see the module doc).
    BF16 = "bf16"


def bf16_gemm_available() -> bool:
    """Whether oneDNN runs bfloat16 products natively here (AVX512-BF16 or AMX)."""
    try:
        if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
            return False
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        x = torch.zeros(2, 4, dtype=torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(3, 4, dtype=torch.bfloat16))
        torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (RuntimeError, AttributeError):
        return False
    return True


class _Bf16Linear(nn.Module):
    """A Linear as one oneDNN bfloat16 product (weights packed once), optionally + GELU.

    Takes float32 or bfloat16 rows; returns float32, or bfloat16 when ``bf16_out`` (for a
    product whose only reader is another bfloat16 product).
    """

    __constants__: ClassVar[list[str]] = ["attr", "bf16_out"]

    def __init__(self, linear: nn.Module, gelu: bool = False, bf16_out: bool = False) -> None:
        super().__init__()
        assert isinstance(linear, nn.Linear)
        weight = linear.weight.detach().to(torch.bfloat16)
        self.weight = nn.Parameter(
            torch.ops.mkldnn._reorder_linear_weight(weight), requires_grad=False
        )
        self.bias = nn.Parameter(linear.bias.detach().to(torch.bfloat16), requires_grad=False)
        self.attr = "gelu" if gelu else "none"
        self.bf16_out = bf16_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x.to(torch.bfloat16), self.weight, self.bias, self.attr, [], "none"
        )
        return y if self.bf16_out else y.float()


def _bf16(module: MiniLmModule) -> MiniLmModule:
    """``module`` with every Linear a packed bfloat16 product, the GELU fused into ffn_in."""
    for layer in module.layers:
        assert isinstance(layer, _Layer)
        layer.qkv = _Bf16Linear(layer.qkv)
        layer.out = _Bf16Linear(layer.out)
        layer.ffn_in = _Bf16Linear(layer.ffn_in, gelu=True, bf16_out=True)
        layer.act = nn.Identity()
        layer.ffn_out = _Bf16Linear(layer.ffn_out)
    return module


def _quantised(module: MiniLmModule, precision: Precision) -> nn.Module:
    """``module`` with its Linear layers swapped for torch's dynamic-quantised ones."""
    if precision is Precision.FP32:
        return module
    if precision is Precision.BF16:
        return _bf16(module)
    with warnings.catch_warnings():  # torch.ao.quantization warns that torchao is its future
        warnings.simplefilter("ignore")
        from torch.ao.quantization import (
            float16_dynamic_qconfig,
            per_channel_dynamic_qconfig,
            quantize_dynamic,
        )

        qconfig = (
            float16_dynamic_qconfig
            if precision is Precision.FP16_WEIGHTS
            else per_channel_dynamic_qconfig
        )
        out: nn.Module = quantize_dynamic(  # type: ignore[no-untyped-call]
            module, {nn.Linear: qconfig}
        )
    return out


def _compiled(module: nn.Module) -> Encoder | None:
    """TorchScript-compiled and frozen, or None when this torch cannot do it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            frozen: Any = torch.jit.freeze(torch.jit.script(module.eval()))
    except Exception:  # any compiler failure: run eagerly instead
        return None
    encoder: Encoder = frozen
    return encoder


def default_precision() -> Precision:
    return Precision.FP16_WEIGHTS if fp16_gemm_available() else Precision.FP32


def build_encoder(
    weights: Mapping[str, torch.Tensor], precision: Precision | None = None, compile: bool = True
) -> tuple[Encoder, int, str]:
    """(encoder, max tokens, a short description of how it runs) from the model's weights.

    ``precision`` None: fp16-packed weights where fbgemm has them, else float32.
    """
    module = MiniLmModule(weights).eval()
    max_tokens = int(module.position.shape[0])
    chosen = default_precision() if precision is None else precision
    model = _quantised(module, chosen)
    kind = chosen.value
    encoder = _compiled(model) if compile else None
    if encoder is None:
        eager: Encoder = model
        return eager, max_tokens, f"{kind}, eager"
    return encoder, max_tokens, f"{kind}, torchscript"


def load_encoder(
    model_dir: Path, precision: Precision | None = None, compile: bool = True
) -> tuple[Encoder, int, str]:
    """:func:`build_encoder` over ``model_dir/model.safetensors``."""
    from safetensors.torch import load_file

    return build_encoder(load_file(str(model_dir / "model.safetensors")), precision, compile)
