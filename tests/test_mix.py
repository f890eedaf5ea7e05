"""llama.cpp's Q4_K_M mix as the fixture writer ports it (bmoe_ci.models.mix):

* the rules on their own: use_more_bits, the narrow-row fallbacks, the eight-expert attention types;
* against llama.cpp's own quantizer (llama_cpp.llama_model_quantize of llama-cpp-python, skipped when it
  is not installed): F32 versions of fixtures of every architecture, with rows of 256, of 64/128 and
  of 84 values (F16 fallback), a dense model and one of 16 layers and 4 experts, quantized to Q4_K_M by
  llama.cpp; every tensor has the type the port gives it. On qwen3moe-q4k the Q6_K and Q8_0 tensors
  llama.cpp writes are byte for byte the project's (kquant.py, gguf.quants).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from bmoe_ci.models import load_specs
from bmoe_ci.models.mix import LlamaMix, TensorShape, fallback, llama_order, mix_types, use_more_bits
from bmoe_ci.models.spec import FixtureSpec
from bmoe_ci.models.writer import write

Q = GGMLQuantizationType


def test_use_more_bits() -> None:
    # llama.cpp: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2, integer division
    assert [i for i in range(4) if use_more_bits(i, 4)] == [2, 3]
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [i for i in range(48) if use_more_bits(i, 48)][:6] == [0, 1, 2, 3, 4, 5]


def test_fallbacks() -> None:
    assert fallback(Q.Q4_K, 256) == Q.Q4_K and fallback(Q.Q4_K, 128) == Q.Q5_0
    assert fallback(Q.Q5_K, 128) == Q.Q5_1 and fallback(Q.Q6_K, 64) == Q.Q8_0
    assert fallback(Q.IQ4_XS, 96) == Q.IQ4_NL and fallback(Q.Q3_K, 32) == Q.Q4_0
    assert fallback(Q.Q6_K, 84) == Q.F16 and fallback(Q.Q8_0, 84) == Q.F16  # no 32-block fits either


def test_order_is_llama_cpps() -> None:
    names = ["blk.10.attn_v.weight", "output.weight", "blk.2.attn_v.weight", "blk.2.attn_k.weight", "token_embd.weight"]
    assert llama_order(names) == [
        "output.weight",
        "token_embd.weight",
        "blk.2.attn_k.weight",
        "blk.2.attn_v.weight",
        "blk.10.attn_v.weight",
    ]


def test_the_mix_on_its_own() -> None:
    names = [f"blk.{i}.{t}.weight" for i in range(4) for t in ("attn_v", "attn_k", "attn_output", "ffn_down_exps")]
    names += ["token_embd.weight", "blk.0.ffn_gate_inp.weight", "blk.0.attn_norm.weight"]
    mix = LlamaMix("Q4_K_M", names, n_layer=4, n_expert=4)
    two, three = (256, 256), (256, 256, 4)
    assert mix.tied  # no output.weight: the embedding takes the output's type
    assert mix.type_of("token_embd.weight", two) == Q.Q6_K
    assert mix.type_of("token_embd.weight", (64, 256)) == Q.Q8_0
    assert [mix.type_of(f"blk.{i}.attn_v.weight", two) for i in range(4)] == [Q.Q4_K, Q.Q4_K, Q.Q6_K, Q.Q6_K]
    assert [mix.type_of(f"blk.{i}.ffn_down_exps.weight", three) for i in range(4)] == [Q.Q4_K, Q.Q4_K, Q.Q6_K, Q.Q6_K]
    assert mix.type_of("blk.0.ffn_down_exps.weight", (128, 256, 4)) == Q.Q5_0
    assert mix.type_of("blk.3.ffn_down_exps.weight", (128, 256, 4)) == Q.Q8_0
    assert mix.type_of("blk.0.attn_k.weight", two) == mix.type_of("blk.0.attn_output.weight", two) == Q.Q4_K
    assert mix.type_of("blk.0.ffn_gate_inp.weight", (256, 4)) is None
    assert mix.type_of("blk.0.attn_norm.weight", (256,)) is None
    eight = LlamaMix("Q4_K_M", names, n_layer=4, n_expert=8)
    assert {eight.type_of(f"blk.{i}.attn_v.weight", two) for i in range(4)} == {Q.Q8_0}
    assert eight.type_of("blk.1.attn_k.weight", two) == Q.Q8_0
    assert eight.type_of("blk.1.attn_output.weight", two) == Q.Q5_K
    assert eight.type_of("blk.1.attn_output.weight", (128, 256)) == Q.Q5_1
    with pytest.raises(ValueError, match=r"no port of llama\.cpp's mix"):
        LlamaMix("Q3_K_M", names, 4, 8)


# -- against llama.cpp's quantizer ----------------------------------------------------------------------


def _variant(base: str, name: str, **dims: int) -> FixtureSpec:
    s = load_specs().specs[base]
    assert isinstance(s, FixtureSpec)
    return s.model_copy(update={"name": name, "dtype": "F32", "dims": s.dims.model_copy(update=dims)})


#: F32 models llama.cpp quantizes: every architecture, rows of 256 (qwen3moe-q4k), 64 and 128 (qwen3moe),
#: 84 (wide: no 32-value block fits, F16), a shared expert (dots1), the fused gate_up (gemma4), a dense
#: model (gemma3, where ffn_down's layer is llama.cpp's running count), and 16 layers of 4 experts
#: (use_more_bits' pattern beyond the first and last eighth; attn_v by its own count, no Q8_0 rule)
VARIANTS = {
    "q4k": ("qwen3moe-q4k", {}),
    "narrow": ("qwen3moe", {}),
    "wide": ("wide", {}),
    "dots1": ("qwen3moe-nonorm", {}),
    "gemma4": ("gemma4", {}),
    "gemma3": ("gemma3", {}),
    "deep": ("qwen3moe-q4k", {"layers": 16, "experts": 4, "expert_ffn": 128}),
}


def _llama_quantize(src: Path, dst: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install '.[bench]')")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize({src}) returned {rc}"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[FixtureSpec, Path, Path]]:
    """variant -> (its F32 spec, the F32 file, llama.cpp's Q4_K_M of it)."""
    out = tmp_path_factory.mktemp("mix")
    got = {}
    for key, (base, dims) in VARIANTS.items():
        spec = _variant(base, f"mix-{key}", **dims)
        (src,) = write(spec, out)
        dst = out / f"mix-{key}-Q4_K_M.gguf"
        _llama_quantize(src, dst)
        got[key] = (spec, src, dst)
    return got


@pytest.mark.parametrize("key", list(VARIANTS))
def test_the_mix_is_llama_cpps(quantized: dict, key: str) -> None:
    spec, src, dst = quantized[key]
    shapes = [TensorShape(t.name, tuple(int(n) for n in t.shape)) for t in GGUFReader(str(src)).tensors]
    mine = mix_types("Q4_K_M", shapes, spec.dims.layers, spec.dims.experts)
    theirs = {t.name: t.tensor_type for t in GGUFReader(str(dst)).tensors}
    assert set(theirs) == set(mine)
    wrong = {n: (t, theirs[n]) for n, t in mine.items() if (Q.F32 if t is None else t) != theirs[n]}
    assert not wrong, f"{key}: port vs llama.cpp: {wrong}"
    assert len({t for t in theirs.values()}) >= 3  # a mix, not one type


def test_the_fixtures_bytes_are_llama_cpps(quantized: dict, fixtures: dict[str, Path]) -> None:
    """qwen3moe-q4k as the project writes it against llama.cpp's Q4_K_M of the same F32 weights: the
    same type for every tensor, and every tensor byte for byte the same (the Q4_K, Q5_K and Q6_K ones
    kquant.py writes, the Q8_0 ones gguf.quants writes, the F32 norms and router)."""
    _, _, dst = quantized["q4k"]
    ours = {t.name: t for t in GGUFReader(str(fixtures["qwen3moe-q4k"])).tensors}
    theirs = {t.name: t for t in GGUFReader(str(dst)).tensors}
    assert {n: t.tensor_type for n, t in ours.items()} == {n: t.tensor_type for n, t in theirs.items()}
    assert {Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0} <= {t.tensor_type for t in ours.values()}
    differ = [n for n, t in ours.items() if np.asarray(t.data).tobytes() != np.asarray(theirs[n].data).tobytes()]
    assert not differ, f"{len(differ)} of {len(ours)} tensors differ from llama.cpp's, first {differ[:4]}"
