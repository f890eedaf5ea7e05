"""llama.cpp's choice of a type for every tensor of a mixed file type, for the fixture writer.

A port of its quantizer's type selection (`llama_tensor_get_type` and `tensor_type_fallback` in
src/llama-quant.cpp of the llama.cpp that llama-cpp-python 0.3.36 bundles), as it runs with default
parameters (no imatrix, no overrides, not `pure`), for the architectures the fixtures use (none of which
is Falcon or a 70B llama, the two llama.cpp treats apart). It covers llama.cpp's Q4_K_M, the mix the
`Q4_K_M` dtype of a fixture names:

- tensors are quantized when they have two or more dimensions, their name ends in "weight" and is not
  a norm or a router (`ffn_gate_inp`); the others keep their F32;
- the default type is Q4_K;
- output.weight (or token_embd.weight when the output is tied to it) is Q6_K, or Q8_0 when its rows
  are not a whole number of Q4_K blocks;
- attn_v is Q6_K in the `use_more_bits` layers (counted over the attn_v tensors in llama.cpp's order:
  by layer, then by name); with exactly eight experts attn_v and attn_k are Q8_0 and attn_output Q5_K;
- every ffn_down (dense, shared or routed experts) is Q6_K in the `use_more_bits` layers, Q4_K in the
  others;
- a row that is not a whole number of the chosen type's blocks falls back: Q4_K to Q5_0, Q5_K to Q5_1,
  Q6_K to Q8_0 (and, for completeness, Q2_K / Q3_K to Q4_0, IQ4_XS to IQ4_NL); a row that does not fit
  the fallback either is F16.

tests/test_mix.py checks the port against llama.cpp's own quantizer on F32 fixtures of 256-wide and of
narrower rows, tensor by tensor, where llama-cpp-python is installed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
MIXES = ("Q4_K_M",)

_BLK = re.compile(r"^blk\.(-?\d+)\.")

# tensor_type_fallback: a type whose block does not divide the row, and what it becomes
FALLBACK = {
    Q.IQ4_XS: Q.IQ4_NL,
    Q.Q2_K: Q.Q4_0,
    Q.Q3_K: Q.Q4_0,
    Q.Q4_K: Q.Q5_0,
    Q.Q5_K: Q.Q5_1,
    Q.Q6_K: Q.Q8_0,
}


def block_size(t: GGMLQuantizationType) -> int:
    return GGML_QUANT_SIZES[t][0]


def layer_of(name: str) -> int:
    """The block a tensor belongs to (`blk.N.`), -1 for the others (llama.cpp's sscanf rule)."""
    m = _BLK.match(name)
    return int(m.group(1)) if m else -1


def llama_order(names: Iterable[str]) -> list[str]:
    """The order llama.cpp's loader keeps tensors in (weight_name_comparer): by layer, the tensors outside
    the blocks first, then by name (byte order)."""
    return sorted(names, key=lambda n: (layer_of(n), n.encode()))


def category(name: str) -> str:
    """tensor_get_category: the first of these the name matches."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (
        ("attn_qkv.weight", "attn_qkv"),
        ("attn_kv_b.weight", "attn_kv_b"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if key in name:
            return cat
    return "other"


def quantizable(name: str, n_dims: int) -> bool:
    """tensor_allows_quantization, for the names the fixtures' architectures have: 2-D and 3-D weights
    but norms and the router."""
    return n_dims >= 2 and name.endswith("weight") and "_norm.weight" not in name and "ffn_gate_inp.weight" not in name


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third in between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def fallback(t: GGMLQuantizationType, ncols: int) -> GGMLQuantizationType:
    """tensor_type_fallback: the type a row of ncols values can take."""
    if ncols % block_size(t) == 0:
        return t
    f = FALLBACK.get(t)
    if f is None:
        if block_size(t) > 32:
            raise ValueError(f"llama.cpp defines no fallback for {t.name}")
        f = t
    return f if ncols % block_size(f) == 0 else Q.F16


class LlamaMix:
    """llama.cpp's type for each tensor of a file of `ftype` made from an F32 model whose tensors are
    `names`, with block_count `n_layer` and expert_count `n_expert`. The choice for one tensor depends on
    its own name and row length and on where it comes among the others (the attn_v count), so it is
    made tensor by tensor, as the writer streams them."""

    def __init__(self, ftype: str, names: Iterable[str], n_layer: int, n_expert: int) -> None:
        if ftype not in MIXES:
            raise ValueError(f"{ftype}: no port of llama.cpp's mix for this file type (have {', '.join(MIXES)})")
        order = llama_order(set(names))
        self.ftype, self.n_layer, self.n_expert = ftype, n_layer, n_expert
        self.tied = "output.weight" not in order
        # llama.cpp's running counters, as they stand when it reaches each tensor (it visits them in
        # `order`): the attn_v index, and the ffn_down index (the layer of a model without experts)
        attn_v = [n for n in order if category(n) == "attn_v"]
        ffn_down = [n for n in order if category(n) == "ffn_down"]
        self.n_attention_wv = len(attn_v)
        self.i_attention_wv = {n: i for i, n in enumerate(attn_v)}
        self.i_ffn_down = {n: i for i, n in enumerate(ffn_down)}

    def type_of(self, name: str, ne: tuple[int, ...]) -> GGMLQuantizationType | None:
        """The type of tensor `name` of shape `ne` (ggml order: ne[0] the row length); None: kept F32."""
        if not quantizable(name, len(ne)):
            return None
        cat = category(name)
        new = Q.Q4_K
        ncols = ne[0]
        if cat == "output" or (self.tied and cat == "token_embd"):
            new = Q.Q8_0 if ncols % block_size(new) else Q.Q6_K
        elif cat == "attn_v":
            if use_more_bits(self.i_attention_wv[name], self.n_attention_wv):
                new = Q.Q6_K
            if self.n_expert == 8:
                new = Q.Q8_0
        elif cat == "attn_k" and self.n_expert == 8:
            new = Q.Q8_0
        elif cat == "ffn_down":
            i_layer = layer_of(name) if max(1, self.n_expert) > 1 else self.i_ffn_down[name]
            if not 0 <= i_layer < self.n_layer:
                raise ValueError(f"{name}: layer {i_layer} is not in [0, {self.n_layer})")
            if use_more_bits(i_layer, self.n_layer):
                new = Q.Q6_K
        elif cat == "attn_output" and self.n_expert == 8:
            new = Q.Q5_K
        return fallback(new, ncols)


@dataclass(frozen=True)
class TensorShape:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length


def mix_types(
    ftype: str, tensors: Iterable[TensorShape], n_layer: int, n_expert: int
) -> dict[str, GGMLQuantizationType | None]:
    """LlamaMix's choice for every tensor at once."""
    ts = list(tensors)
    mix = LlamaMix(ftype, [t.name for t in ts], n_layer, n_expert)
    return {t.name: mix.type_of(t.name, t.ne) for t in ts}
