"""An independent numpy forward pass, written from docs/model-math.md (not from the C engine).

It reads a GGUF model (a single file or the first shard of a llama.cpp split model) with gguf's
GGUFReader, dequantizes every weight type the engine computes with (bmoe_ci.weight_types) with
gguf.quants, and computes in float64, except that the input of every matmul with quantised weights is
first quantised exactly as the engine does it (docs/model-math.md, "Activation quantisation": that step
is part of the model the engine computes), to the activation format weight_types gives the type: Q8_0
blocks (Q8_0, Q4_0, Q5_0) or Q8_K super-blocks (the K-quants). It gives the logits of every position
of a token sequence and greedy generations, and records the routing it took (for checks that
fixtures route every expert, and to tell a real mismatch from a near-tie).

    model = Model.load(path)
    logits = model.logits(tokens)                 # [len(tokens), V]
    as_ggml = Model.load(path, ggml_half_inputs=True)   # llama.cpp's rounding of F16/BF16 matmul inputs
    gen = model.generate(prompt_tokens, n=24)     # gen.tokens, gen.logits, gen.routes, margins

Nothing here imports the generator (bmoe_ci.models): the two share only the GGUF format and the list
of weight types (bmoe_ci.weight_types).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from bmoe_ci.recipes import RECIPES
from bmoe_ci.weight_types import supported, weight_type

from .eog import EOG_TEXTS, FIM_KINDS, eog_ids, retyped
from .recurrent import DeltaNetDims, delta_net, mrope_rotated, short_conv
from .tokenizer import Tokenizer

__all__ = ["Generation", "HParams", "Model", "ModelError", "Route", "shard_paths"]


class ModelError(ValueError):
    """The file is not a model this reference can run (names the key or tensor)."""


_SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_paths(path: Path | str) -> list[Path]:
    """The files of a model: [path], or every shard when path is the first one of a split model."""
    path = Path(path)
    m = _SPLIT_RE.match(path.name)
    if not m:
        return [path]
    if int(m["no"]) != 1:
        raise ModelError(f"{path.name}: give the first shard (-00001-of-...)")
    count = int(m["count"])
    return [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


@dataclass(frozen=True)
class HParams:
    arch: str
    n_layer: int
    n_ctx_train: int
    d: int
    n_ff: int | None
    n_head: int
    n_head_kv: int
    hd: int
    hdv: int
    eps: float
    rope_base: float
    n_rot: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int | None
    n_dense: int
    gating: int
    norm_w: bool
    w_scale: float
    swa: tuple[bool, ...] = ()  # per layer: sliding-window attention (gemma4)
    n_swa: int = 0  # a sliding-window position sees the n_swa latest positions, itself included
    n_rot_swa: int = 0
    rope_base_swa: float = 10000.0
    softcap: float = 0.0  # final logit soft-capping: logits = c tanh(logits / c); 0 = none
    rope_scale: float = 1.0  # global layers rotate by position * rope_scale (1 / rope.scaling.factor)
    swa_scaled: bool = False  # the sliding-window layers are scaled too (recipe swa_rope "global")
    yarn: tuple[int, float] | None = None  # rope.scaling.type yarn: (original context, attn_factor)
    attn_scale: float = 0.0  # scores = q.k * attn_scale
    #: per layer: "attention", "delta_net" or "shortconv" (hybrid architectures; empty: every layer attends)
    mixers: tuple[str, ...] = ()
    delta: DeltaNetDims | None = None  # qwen35moe's delta-net sizes
    conv_taps: int = 0  # lfm2moe's short convolution
    rope_sections: tuple[int, ...] = ()  # interleaved M-RoPE sections [t, h, w, e] (qwen35moe)

    #: per layer (head_count, head_count_kv and feed_forward_length may be arrays); empty: the scalars
    heads: tuple[int, ...] = ()
    heads_kv: tuple[int, ...] = ()
    ffs: tuple[int, ...] = ()
    hd_swa: int = 0  # a sliding-window layer's head sizes (gemma4's _swa keys; 0: the global ones)
    hdv_swa: int = 0

    def is_swa(self, il: int) -> bool:
        return bool(self.swa) and self.swa[il]

    def geometry(self, il: int) -> tuple[int, int, int, int]:
        """Layer il's (query heads, KV heads, q/k head size, v head size)."""
        H = self.heads[il] if self.heads else self.n_head
        Hkv = self.heads_kv[il] if self.heads_kv else self.n_head_kv
        if self.is_swa(il) and self.hd_swa:
            return H, Hkv, self.hd_swa, self.hdv_swa
        return H, Hkv, self.hd, self.hdv

    def ff(self, il: int) -> int | None:
        return self.ffs[il] if self.ffs else self.n_ff

    def mixer(self, il: int) -> str:
        return self.mixers[il] if self.mixers else "attention"


@dataclass(frozen=True)
class _Quant:
    """The positions of the rows a forward step quantises, and where their margins go (optional)."""

    pos: np.ndarray
    margins: dict[int, float] | None

    def note(self, margin: np.ndarray) -> None:
        """margin: one per row (a 0-d array for a single row)."""
        if self.margins is None:
            return
        for p, m in zip(self.pos.reshape(-1), np.atleast_1d(margin).reshape(-1), strict=True):
            self.margins[int(p)] = min(self.margins.get(int(p), 0.5), float(m))

    def row(self, i: int) -> _Quant:
        return _Quant(self.pos[i : i + 1], self.margins)


@dataclass(frozen=True)
class Route:
    pos: int
    layer: int
    ids: tuple[int, ...]
    weights: tuple[float, ...]
    margin: float  # probs at rank k-1 minus rank k (how close the selection was to changing)


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int]  # generated; an end-of-generation token is the last one
    logits: np.ndarray  # [len(prompt) + len(tokens) - 1, V]: every position that was run
    routes: list[Route] = field(default_factory=list)
    stopped_at_eog: bool = False
    #: per position run: the smallest distance (in quantisation steps) of any of its matmul inputs'
    #: scaled values to a rounding boundary; 0.5 where nothing was quantised (see min_quant_margin)
    quant_margins: list[float] = field(default_factory=list)

    @property
    def min_quant_margin(self) -> float:
        """Smallest distance (in quantisation steps) of a scaled matmul input to a rounding boundary, over
        every position run: below ~1e-4 the engine's f32 activations may round to the other side than
        these float64 ones, and every later position may then differ by a whole step's effect."""
        return min(self.quant_margins, default=0.5)

    @property
    def min_logit_margin(self) -> float:
        """Smallest gap between the best and second-best logit over the rows that chose a token."""
        rows = self.logits[len(self.prompt) - 1 :]
        top2 = np.sort(rows, axis=1)[:, -2:]
        return float(np.min(top2[:, 1] - top2[:, 0])) if len(rows) else math.inf

    @property
    def min_route_margin(self) -> float:
        return min((r.margin for r in self.routes), default=math.inf)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """x [..., n], n a multiple of 32 -> the values the engine multiplies Q8_0 weights with (float64).

    Per block of 32, in float32 as the engine (docs/model-math.md): amax = max |x|, d = amax / 127,
    id = 127 / amax (0 when amax is 0), q = round-half-to-even(clamp(x * id, -127, 127)); the scale kept
    is d rounded to f16. The result is q * f16(d), exact in float64. A NaN block stays NaN."""
    return _q8_0(x)[0]


def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """x [..., n], n a multiple of 256 -> the values the engine multiplies K-quant weights with (float64).

    Per super-block of 256, in float32 (docs/model-math.md): m = the first value of largest magnitude;
    a zero block stays zero; else s = -127 / m, q = min(127, round-half-to-even(s * x)) and the scale is
    d = 1 / s, kept as a float32. The result is q * d, exact in float64. A block with a NaN or an
    infinity becomes NaN."""
    return _q8_k(x)[0]


def _margin(t: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Per row of `shape` (the input's leading axes): the smallest distance of a scaled value t to a
    rounding boundary (an odd multiple of 1/2), in quantisation steps; 0.5 is the most there is."""
    t64 = t.astype(np.float64)
    dist = np.abs(np.abs(t64 - np.floor(t64)) - 0.5)
    dist = np.where(np.isfinite(dist), dist, 0.5)
    return dist.reshape(*shape[:-1], -1).min(axis=-1)


def _q8_0_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]]:
    """x's Q8_0 blocks as the engine forms them: (q [..., nb, 32] as float32 integers, d = amax / 127
    [..., nb, 1] in float32 before its f16 rounding, the scaled values t, x's shape)."""
    x32 = np.asarray(x, dtype=np.float32)
    shape = x32.shape
    if shape[-1] % 32:
        raise ValueError(f"quantize_q8_0: {shape[-1]} values are not whole blocks of 32")
    b = x32.reshape(*shape[:-1], shape[-1] // 32, 32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = np.max(np.abs(b), axis=-1, keepdims=True)  # NaN when the block has one
        d = amax / np.float32(127)
        nz = amax != 0
        inv = np.where(nz, np.float32(127) / np.where(nz, amax, np.float32(1)), np.float32(0)).astype(np.float32)
        t = np.clip(b * inv, np.float32(-127), np.float32(127))
        t = np.where(np.isnan(t), np.float32(0), t)
        q = np.rint(t)  # ties to even
    return q, d, t, shape


def _q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q, d, t, shape = _q8_0_blocks(x)
    scale = d.astype(np.float16).astype(np.float64)
    return (q.astype(np.float64) * scale).reshape(shape), _margin(t, shape)


def _q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x's Q8_1 blocks (docs/model-math.md): Q8_0's values, and per block the difference between the
    block sum the dot product uses, s = f16(d * sum q) (d before its own f16 rounding, as ggml's x86
    quantize_row_q8_1), and the values' exact sum f16(d) * sum q: a Q4_1 / Q5_1 weight block's minimum m
    multiplies s, so its matmul is values @ W.T + diff @ M.T. The margin includes how close d * sum q
    came to an f16 rounding boundary (in f16 ulps), where the engine's f32 inputs could round it the
    other way."""
    q, d, t, shape = _q8_0_blocks(x)
    scale = d.astype(np.float16).astype(np.float64)
    sq = q.sum(axis=-1, keepdims=True)  # exact in float32 (|sum| <= 4064)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (d * sq).astype(np.float32)
        s = v.astype(np.float16).astype(np.float64)
        diff = (s - scale * sq.astype(np.float64))[..., 0]
        ulp = np.spacing(np.abs(v).astype(np.float16)).astype(np.float64)
        frac = np.where((ulp > 0) & np.isfinite(v), v.astype(np.float64) / np.where(ulp > 0, ulp, 1.0), 0.0)
        s_margin = np.abs(np.abs(frac - np.floor(frac)) - 0.5)
    s_margin = np.where(np.isfinite(s_margin), s_margin, 0.5).reshape(*shape[:-1], -1).min(axis=-1)
    return (q.astype(np.float64) * scale).reshape(shape), diff, np.minimum(_margin(t, shape), s_margin)


def _q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x32 = np.asarray(x, dtype=np.float32)
    shape = x32.shape
    if shape[-1] % 256:
        raise ValueError(f"quantize_q8_k: {shape[-1]} values are not whole super-blocks of 256")
    b = x32.reshape(-1, 256)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = b[np.arange(len(b)), np.argmax(np.abs(b), axis=1)]  # argmax: the first of equal magnitudes
        s = (np.float32(-127) / m).astype(np.float32)
        t = b * s[:, None]
        q = np.minimum(np.rint(t), np.float32(127))  # rint: ties to even
        d = (np.float32(1) / s).astype(np.float32)
        out = q.astype(np.float64) * d.astype(np.float64)[:, None]
    out[m == 0] = 0.0
    out[~np.all(np.isfinite(b), axis=1)] = np.nan
    return out.reshape(shape), _margin(t, shape)


@dataclass(frozen=True)
class _QIn:
    """A matmul's input as the weights multiply it: the (rounded) values, and for Q8_1 inputs the per
    block difference between the activation sum the kernel uses and the values' own (see _q8_1)."""

    x: np.ndarray
    diff: np.ndarray | None = None

    def times(self, w: np.ndarray, mins: np.ndarray | None) -> np.ndarray:
        """x @ w.T, plus diff @ mins.T where the weights are a Q8_1 type (mins: their block minima,
        [rows, blocks])."""
        y = self.x @ w.T
        if self.diff is not None and mins is not None:
            y = y + self.diff @ mins.T
        return y


#: ggml's half-precision weight types and the format its CPU dot products round their f32 input to
HALF_TYPES = {GGMLQuantizationType.F16: "f16", GGMLQuantizationType.BF16: "bf16"}


def _round_half(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(x as f32 rounded to f16 or bf16, nearest with ties to even as ggml converts, back in float64;
    each row's smallest distance to a rounding boundary in units of the target's spacing, as _margin)."""
    f = np.asarray(x, dtype=np.float32)
    bits = 10 if kind == "f16" else 7  # the stored mantissa bits
    mant, exp = np.frexp(np.abs(f).astype(np.float64))  # |x| = mant * 2^exp, mant in [0.5, 1)
    t = mant * 2.0 ** (bits + 1)  # |x| in units of its binade's spacing
    if kind == "f16":  # below 2^-14, f16's spacing stays 2^-24 (subnormals)
        t = np.where(exp - 1 < -14, np.abs(f) * 2.0**24, t)
        y = f.astype(np.float16).astype(np.float64)
    else:
        u = f.view(np.uint32).astype(np.uint64)
        kept = ((u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)) << np.uint64(16)
        y = kept.astype(np.uint32).view(np.float32).astype(np.float64)
    return y, _margin(t, f.shape)


def _rmsnorm(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _silu(z: np.ndarray) -> np.ndarray:
    return z / (1.0 + np.exp(-z))


def _gelu(z: np.ndarray) -> np.ndarray:
    """GELU (tanh form) as ggml's CPU backend computes it (docs/model-math.md): from a table indexed by
    the input rounded to f16, holding the result rounded to f16; z <= -10 gives 0, z >= 10 gives z."""
    z16 = np.asarray(z, dtype=np.float64).astype(np.float16).astype(np.float64)
    g = 0.5 * z16 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z16 + 0.044715 * z16**3)))
    g = g.astype(np.float16).astype(np.float64)
    return np.where(z <= -10.0, 0.0, np.where(z >= 10.0, z, g))


def _swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gpt-oss's clamped SwiGLU (docs/model-math.md): g = min(gate, 7), u = clamp(up, -7, 7),
    g sigmoid(1.702 g) (u + 1)."""
    g = np.minimum(gate, 7.0)
    u = np.clip(up, -7.0, 7.0)
    return g / (1.0 + np.exp(-1.702 * g)) * (u + 1.0)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


FIM_TEXTS = frozenset(t for _, texts in FIM_KINDS for t in texts)


class Model:
    def __init__(
        self,
        hp: HParams,
        tensors: dict[str, np.ndarray],
        vocab: list[str],
        token_types: list[int],
        eos: int | None,
        add_bos: bool,
        bos: int | None,
        q8_0: frozenset[str] = frozenset(),
        q8_k: frozenset[str] = frozenset(),
        eog: frozenset[int] | None = None,
        q8_1: frozenset[str] = frozenset(),
        mins: dict[str, np.ndarray] | None = None,
        tokenizer: Tokenizer | None = None,
        half: dict[str, str] | None = None,
    ) -> None:
        self.hp = hp
        # the tensors whose matmuls quantise their input (bmoe_ci.weight_types, activation): to Q8_0
        # blocks, to Q8_1 blocks, to Q8_K super-blocks
        self.q8_0 = q8_0
        self.q8_1 = q8_1
        self.q8_k = q8_k
        self.mins = mins or {}  # Q8_1 tensors: their blocks' minima m (numpy order, [..., rows, blocks])
        # tensors whose matmul input is rounded to "f16" / "bf16" (only with ggml_half_inputs, see load)
        self.half = half or {}
        self.recipe = RECIPES[hp.arch]
        self.t = tensors
        self.vocab = vocab
        self.token_types = token_types
        self.eos = eos
        # the tokens that end generation (eog.py); without metadata to read, the EOS alone
        self.eog = eog if eog is not None else frozenset(() if eos is None else (eos,))
        self.bos = bos
        self.add_bos = add_bos
        self.n_vocab = len(vocab)
        self.tokenizer = tokenizer
        self._out_name = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        self._out = tensors[self._out_name]
        if self._out.shape != (self.n_vocab, hp.d):
            raise ModelError(f"output.weight: shape {self._out.shape}, expected {(self.n_vocab, hp.d)}")

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: Path | str, ggml_half_inputs: bool = False) -> Model:
        """The model of a GGUF file (or of a split model's first shard). ggml_half_inputs: round the input
        of every F16 / BF16 matmul to that type first, as ggml's CPU backend does (its dot products of
        those types take both operands in the weight's type); the engine keeps such inputs f32, so only
        a comparison with llama.cpp asks for this."""
        paths = shard_paths(path)
        readers = [GGUFReader(p) for p in paths]
        fields = readers[0].fields

        def get(key: str, default: Any = ModelError) -> Any:
            f = fields.get(key)
            if f is None:
                if default is ModelError:
                    raise ModelError(f"{paths[0].name}: missing required key {key}")
                return default
            return f.contents()

        if len(paths) > 1:
            if get("split.count") != len(paths):
                raise ModelError(f"split.count {get('split.count')} != {len(paths)} shard names")
            for i, r in enumerate(readers):
                no = r.fields["split.no"].contents()
                if no != i:
                    raise ModelError(f"{paths[i].name}: split.no {no}, expected {i}")
        arch = get("general.architecture")
        if arch not in RECIPES:
            raise ModelError(f"general.architecture: {arch!r} is not one of {sorted(RECIPES)}")
        recipe = RECIPES[arch]
        d = int(get(f"{arch}.embedding_length"))
        n_layer = int(get(f"{arch}.block_count"))

        def per_layer(key: str, default: Any = ModelError) -> tuple[int, ...]:
            """A key llama.cpp reads as one value or one per layer."""
            v = get(key, default)
            if isinstance(v, list):
                if len(v) != n_layer:
                    raise ModelError(f"{key}: {len(v)} entries, {n_layer} layers")
                return tuple(int(x) for x in v)
            return tuple(int(v) for _ in range(n_layer))

        heads = per_layer(f"{arch}.attention.head_count")
        n_head = heads[0]
        has_kv = get(f"{arch}.attention.head_count_kv", None) is not None
        heads_kv = per_layer(f"{arch}.attention.head_count_kv") if has_kv else heads
        ffs = per_layer(f"{arch}.feed_forward_length", 0)
        hd = int(get(f"{arch}.attention.key_length", d // n_head))
        n_ff = max(ffs) if any(ffs) else None
        gating = int(get(f"{arch}.expert_gating_func", 0)) if recipe.moe else 0
        norm_key = get(f"{arch}.expert_weights_norm", None)
        scale_key = float(get(f"{arch}.expert_weights_scale", 0.0))
        if recipe.gating_keys in ("fixed", "func"):
            # "func": the function is the file's (required), the norm and scale the recipe's
            fixed = recipe.gating_id if recipe.gating_keys == "fixed" else gating
            if gating not in (0, fixed) or norm_key not in (None, recipe.norm_w) or scale_key not in (0, 1):
                raise ModelError(f"{arch}: the gating keys contradict the architecture's fixed gating")
            if fixed == 0 and recipe.moe:
                raise ModelError(f"{arch}.expert_gating_func: required for this architecture")
            gating, norm_key, scale_key = fixed, recipe.norm_w, 1.0
        elif gating == 0:
            raise ModelError(f"{arch}.expert_gating_func: required for this architecture")
        if recipe.shared_expert == "named":
            n_ff_shexp: int | None = int(get(f"{arch}.expert_feed_forward_length")) * int(
                get(f"{arch}.expert_shared_count")
            )
        elif recipe.shared_expert == "ffn":
            n_ff_shexp = None if n_ff is None else int(n_ff)
        elif recipe.shared_expert == "gated":  # expert_shared_feed_forward_length, else feed_forward_length
            sf = get(f"{arch}.expert_shared_feed_forward_length", None) or n_ff
            n_ff_shexp = None if sf is None else int(sf)
        else:
            n_ff_shexp = None
        n_rot = int(get(f"{arch}.rope.dimension_count", hd))
        swa: tuple[bool, ...] = ()
        n_swa, n_rot_swa, base_swa, hd_swa, hdv_swa = 0, 0, 10000.0, 0, 0
        if recipe.swa == "periodic":
            swa, n_swa = _periodic_swa(get, arch, n_layer, recipe.swa_period, recipe.swa_window_required)
            n_rot_swa = n_rot
            # a local layer's base defaults to 10000 ("own") or to the global base ("global")
            own = recipe.swa_rope == "own"
            base_swa = float(
                get(f"{arch}.rope.freq_base_swa", 10000.0 if own else get(f"{arch}.rope.freq_base", 10000.0))
            )
        if recipe.swa == "required":  # gemma4: sliding-window layers; per-layer inputs are not modelled
            swa = tuple(bool(v) for v in get(f"{arch}.attention.sliding_window_pattern"))
            n_swa = int(get(f"{arch}.attention.sliding_window"))
            hd_swa = int(get(f"{arch}.attention.key_length_swa"))
            hdv_swa = int(get(f"{arch}.attention.value_length_swa"))
            n_rot_swa = int(
                get(f"{arch}.rope.dimension_count_swa", min(hd_swa, int(get(f"{arch}.rope.dimension_count", hd))))
            )
            base_swa = float(get(f"{arch}.rope.freq_base_swa", 10000.0))
            if int(get(f"{arch}.embedding_length_per_layer_input")) != 0:
                raise ModelError(f"{arch}: per-layer inputs are not modelled")
        # llama.cpp's default when the key is absent is 30 (llama_hparams), not "none"; 0 turns it off
        softcap = float(get(f"{arch}.final_logit_softcapping", recipe.softcap_default)) if recipe.final_softcap else 0.0
        if softcap < 0 or not math.isfinite(softcap):
            raise ModelError(f"{arch}.final_logit_softcapping: {softcap} is not a finite value >= 0")
        rope_scale, yarn = _rope_scale(get, arch, recipe.rope_scaling) if recipe.rope_scaling else (1.0, None)
        if recipe.attn_scale_one:
            attn_scale = 1.0
        elif recipe.attn_scale_embd_at and n_layer == recipe.attn_scale_embd_at:
            attn_scale = 1.0 / math.sqrt(d // n_head)
        else:
            attn_scale = 1.0 / math.sqrt(hd)

        mixers, n_head_kv, delta, conv_taps, sections = _mixers(get, arch, recipe.mixer, n_layer, n_head)
        if recipe.mixer == "shortconv":  # head_count_kv said which layers attend: they share one KV count
            heads_kv = tuple(n_head_kv for _ in range(n_layer))

        def expert_key(key: str) -> int:
            if not recipe.moe:
                return 0
            vals = set(per_layer(f"{arch}.{key}"))
            if len(vals) != 1:
                raise ModelError(f"{arch}.{key}: differs between layers (not modelled)")
            return vals.pop()

        hp = HParams(
            arch=arch,
            n_layer=n_layer,
            n_ctx_train=int(get(f"{arch}.context_length")),
            d=d,
            n_ff=None if n_ff is None else int(n_ff),
            n_head=n_head,
            n_head_kv=heads_kv[0],
            hd=hd,
            hdv=int(get(f"{arch}.attention.value_length", hd)),
            eps=float(get(f"{arch}.attention.layer_norm_rms_epsilon")),
            rope_base=float(get(f"{arch}.rope.freq_base", 10000.0)),
            n_rot=n_rot,
            n_expert=expert_key("expert_count"),
            n_expert_used=expert_key("expert_used_count"),
            n_ff_exp=expert_key("expert_feed_forward_length"),
            n_ff_shexp=n_ff_shexp,
            # the key as written; only a "lead_dense" recipe's graph goes by it (_is_dense)
            n_dense=int(get(f"{arch}.leading_dense_block_count", recipe.n_dense_lead)),
            gating=gating,
            norm_w=bool(recipe.norm_w if norm_key is None else norm_key),
            w_scale=1.0 if scale_key == 0.0 else scale_key,
            swa=swa,
            n_swa=n_swa,
            n_rot_swa=n_rot_swa,
            heads=heads,
            heads_kv=heads_kv,
            ffs=ffs,
            hd_swa=hd_swa,
            hdv_swa=hdv_swa,
            rope_base_swa=base_swa,
            softcap=softcap,
            rope_scale=rope_scale,
            swa_scaled=recipe.swa_rope == "global",
            yarn=yarn,
            attn_scale=attn_scale,
            mixers=mixers,
            delta=delta,
            conv_taps=conv_taps,
            rope_sections=sections,
        )
        if hp.gating not in (1, 2, 3):
            raise ModelError(f"{arch}.expert_gating_func: {hp.gating} is not 1, 2 or 3")
        for il in range(n_layer):
            if heads[il] % heads_kv[il]:
                raise ModelError(
                    f"{arch}.attention.head_count_kv: {heads_kv[il]} does not divide {heads[il]} (layer {il})"
                )
        tensors: dict[str, np.ndarray] = {}
        q8_0: set[str] = set()
        q8_1: set[str] = set()
        q8_k: set[str] = set()
        mins: dict[str, np.ndarray] = {}
        half: dict[str, str] = {}
        for p, r in zip(paths, readers, strict=True):
            for t in r.tensors:
                if t.name in tensors:
                    raise ModelError(f"{p.name}: duplicate tensor {t.name}")
                tensors[t.name] = _to_f64(t)
                wt = weight_type(t.tensor_type)
                if wt.activation == "q8_0":
                    q8_0.add(t.name)
                elif wt.activation == "q8_1":
                    q8_1.add(t.name)
                    mins[t.name] = _block_mins(t, wt.block, wt.block_bytes, wt.min_offset or 0)
                elif wt.activation == "q8_K":
                    q8_k.add(t.name)
                elif ggml_half_inputs and t.tensor_type in HALF_TYPES:
                    half[t.name] = HALF_TYPES[t.tensor_type]
        if len(paths) > 1 and int(get("split.tensors.count")) != len(tensors):
            raise ModelError(f"split.tensors.count {get('split.tensors.count')} != {len(tensors)} tensors")
        vocab = list(get("tokenizer.ggml.tokens"))
        types = list(get("tokenizer.ggml.token_type", [1] * len(vocab)))
        eos = get("tokenizer.ggml.eos_token_id", None)
        bos = get("tokenizer.ggml.bos_token_id", None)
        eog = eog_ids(vocab, get)
        by_text = frozenset(i for i in eog if vocab[i] in EOG_TEXTS or vocab[i] in FIM_TEXTS)
        tokenizer = Tokenizer.from_metadata(get, by_text, retyped(vocab, eog))
        model = cls(
            hp,
            tensors,
            vocab,
            types,
            None if eos is None else int(eos),
            tokenizer.add_bos,
            None if bos is None else int(bos),
            frozenset(q8_0),
            frozenset(q8_k),
            eog,
            q8_1=frozenset(q8_1),
            mins=mins,
            tokenizer=tokenizer,
            half=half,
        )
        model._check_shapes()
        return model

    def _check_shapes(self) -> None:
        hp, r = self.hp, self.recipe
        d, V, E, f = hp.d, self.n_vocab, hp.n_expert, hp.n_ff_exp

        def need(name: str, shape: tuple[int, ...]) -> None:
            if name not in self.t:
                raise ModelError(f"missing tensor {name}")
            if self.t[name].shape != shape:
                raise ModelError(f"{name}: numpy shape {self.t[name].shape}, expected {shape}")

        need("token_embd.weight", (V, d))
        need(r.output_norm + ".weight", (d,))
        for i in range(hp.n_layer):
            b = f"blk.{i}."
            need(b + "attn_norm.weight", (d,))
            if hp.mixer(i) == "delta_net":
                dn = hp.delta
                assert dn is not None
                C, Z = dn.conv_channels, dn.Hv * dn.S
                for name, shape in (
                    ("attn_qkv.weight", (C, d)),
                    ("attn_gate.weight", (Z, d)),
                    ("ssm_conv1d.weight", (C, dn.K)),
                    ("ssm_dt.bias", (dn.Hv,)),
                    ("ssm_a", (dn.Hv,)),
                    ("ssm_beta.weight", (dn.Hv, d)),
                    ("ssm_alpha.weight", (dn.Hv, d)),
                    ("ssm_norm.weight", (dn.S,)),
                    ("ssm_out.weight", (d, Z)),
                ):
                    need(b + name, shape)
            elif hp.mixer(i) == "shortconv":
                need(b + "shortconv.in_proj.weight", (3 * d, d))
                need(b + "shortconv.conv.weight", (d, hp.conv_taps))
                need(b + "shortconv.out_proj.weight", (d, d))
            else:
                H, Hkv, hd, hdv = hp.geometry(i)
                need(b + "attn_q.weight", (H * hd * (2 if r.attn_gate else 1), d))
                need(b + "attn_k.weight", (Hkv * hd, d))
                if not (r.v_from_k and b + "attn_v.weight" not in self.t):
                    need(b + "attn_v.weight", (Hkv * hdv, d))
                need(b + "attn_output.weight", (d, H * hdv))
                if r.qk_norm:
                    need(b + "attn_q_norm.weight", (hd,))
                    need(b + "attn_k_norm.weight", (hd,))
                if hd != hdv:
                    raise ModelError(f"{hp.arch}: layer {i}: value_length {hdv} differs from key_length {hd}")
                biases = {
                    "attn_q": (r.qkv_bias, H * hd),
                    "attn_k": (r.qkv_bias, Hkv * hd),
                    "attn_v": (r.qkv_bias, Hkv * hdv),
                    "attn_output": (r.out_bias, d),
                }
                for name, (kind, n) in biases.items():
                    if kind == "none" and b + name + ".bias" in self.t:
                        raise ModelError(f"{b}{name}.bias: not part of {hp.arch}'s graph")
                    if kind == "required" or (kind == "optional" and b + name + ".bias" in self.t):
                        need(b + name + ".bias", (n,))
                if r.attn_sinks:
                    need(b + "attn_sinks.weight", (H,))
            if b + "layer_output_scale.weight" in self.t:
                if r.layer_scale == "none":
                    raise ModelError(f"{b}layer_output_scale.weight: not part of {hp.arch}'s graph")
                need(b + "layer_output_scale.weight", (1,))
            need(b + r.ffn_norm + ".weight", (d,))
            if not r.moe and b + "ffn_gate_inp.weight" in self.t:
                raise ModelError(f"{b}ffn_gate_inp.weight: {hp.arch} has no routed experts")
            if r.post_norms:
                need(b + "post_attention_norm.weight", (d,))
            if self._is_dense(i):
                ff = hp.ff(i)
                if not ff:
                    raise ModelError(f"{hp.arch}.feed_forward_length: required by dense layer {i}")
                need(b + "ffn_gate.weight", (ff, d))
                need(b + "ffn_up.weight", (ff, d))
                need(b + "ffn_down.weight", (d, ff))
                if r.post_norms:
                    need(b + "post_ffw_norm.weight", (d,))
                continue
            need(b + "ffn_gate_inp.weight", (E, d))
            if r.probs_bias:
                need(b + "exp_probs_b.bias", (E,))
            if r.shared_expert == "gated":
                need(b + "ffn_gate_inp_shexp.weight", (d,))
            if r.fused_gate_up:
                need(b + "ffn_gate_up_exps.weight", (E, 2 * f, d))
            else:
                need(b + "ffn_gate_exps.weight", (E, f, d))
                need(b + "ffn_up_exps.weight", (E, f, d))
            need(b + "ffn_down_exps.weight", (E, d, f))
            if r.router_prescale:
                need(b + "ffn_gate_inp.scale", (d,))
            if b + "ffn_down_exps.scale" in self.t:
                if r.expert_scale == "none":
                    raise ModelError(f"{b}ffn_down_exps.scale: not part of {hp.arch}'s graph")
                need(b + "ffn_down_exps.scale", (E,))
            if r.shared_expert != "none":
                sf = hp.ff(i) if r.shared_expert == "ffn" else hp.n_ff_shexp
                if sf is None:
                    raise ModelError(f"{hp.arch}: the shared expert's width is not given")
                sx = "_shexp" if r.shared_expert in ("named", "gated") else ""
                need(f"{b}ffn_gate{sx}.weight", (sf, d))
                need(f"{b}ffn_up{sx}.weight", (sf, d))
                need(f"{b}ffn_down{sx}.weight", (d, sf))
            if r.shared_expert == "gated":
                need(b + "ffn_gate_inp_shexp.weight", (d,))
            if r.router_bias == "required":
                need(b + "ffn_gate_inp.bias", (E,))
            if r.expert_bias == "required":
                need(b + "ffn_gate_exps.bias", (E, f))
                need(b + "ffn_up_exps.bias", (E, f))
                need(b + "ffn_down_exps.bias", (E, d))
            if r.shared_expert == "ffn":
                for norm in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2", "post_ffw_norm"):
                    need(f"{b}{norm}.weight", (d,))
        if r.rope_freqs and not all(hp.swa):
            need("rope_freqs.weight", (hp.hd // 2,))

    def _is_dense(self, il: int) -> bool:
        """Which blocks are MoE, as the recipe's moe_layers says (docs/model-math.md)."""
        rule = self.recipe.moe_layers
        if rule == "by_router":
            return f"blk.{il}.ffn_gate_inp.weight" not in self.t
        return rule == "none" or (rule == "lead_dense" and il < self.hp.n_dense)

    # ---------------------------------------------------------------- tokens
    def tokenize(self, text: str | bytes, parse_special: bool = True) -> list[int]:
        """The text's ids as `-p` gives them (specials parsed, BOS/EOS as the model asks); a scored text
        (`--ppl`, `--ppl-step`, `--ppl-choices`) reads special-token texts as plain text:
        parse_special=False (docs/engine-flags.md, scoring)."""
        if self.tokenizer is None:
            raise ModelError("the model has no tokenizer metadata the reference models")
        return self.tokenizer.tokenize(text, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """What the generated tokens print (llama.cpp's token_to_piece without specials)."""
        if self.tokenizer is None:
            raise ModelError("the model has no tokenizer metadata the reference models")
        return self.tokenizer.detokenize(tokens)

    # ---------------------------------------------------------------- forward
    def new_cache(self) -> dict[str, Any]:
        """A context: the KV cache of the attention layers and the recurrent layers' state (each layer's
        dict filled by its first position)."""
        n = self.hp.n_layer
        return {"pos": 0, "k": [None] * n, "v": [None] * n, "rec": [{} for _ in range(n)]}

    def forward(
        self,
        tokens: Sequence[int],
        cache: dict[str, Any] | None = None,
        routes: list[Route] | None = None,
        qmargins: dict[int, float] | None = None,
    ) -> np.ndarray:
        """Runs the positions cache.pos .. cache.pos+len(tokens)-1; returns their logits [n, V].
        qmargins, when given, gets each position's quantisation margin (Generation.quant_margins)."""
        hp, r, t = self.hp, self.recipe, self.t
        cache = cache if cache is not None else self.new_cache()
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) == 0:
            raise ValueError("tokens: expected a non-empty 1-d sequence")
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise ValueError(f"tokens: ids must be in [0, {self.n_vocab})")
        p0, n = cache["pos"], len(toks)
        pos = np.arange(p0, p0 + n)
        qz = _Quant(pos, qmargins)
        x = t["token_embd.weight"][toks].copy()
        if r.embd_scale:
            x *= math.sqrt(hp.d)
        for il in range(hp.n_layer):
            b = f"blk.{il}."
            h = _rmsnorm(x, hp.eps) * t[b + "attn_norm.weight"]
            mixer = hp.mixer(il)

            def mm(rows: np.ndarray, name: str) -> np.ndarray:
                return self._mm(rows, name, qz)

            if mixer == "delta_net":
                assert hp.delta is not None
                o = delta_net(h, b, t, hp.delta, hp.eps, cache["rec"][il], mm)
            elif mixer == "shortconv":
                o = short_conv(h, b, t, cache["rec"][il], mm)
            else:
                o = self._attention(il, h, qz, cache)
            if r.post_norms:
                o = _rmsnorm(o, hp.eps) * t[b + "post_attention_norm.weight"]
            x = x + o
            x = x + self._ffn(il, x, qz, routes)
            if b + "layer_output_scale.weight" in t:  # gemma4: the layer's output, residual included, scaled
                x = x * t[b + "layer_output_scale.weight"][0]
        cache["pos"] = p0 + n
        y = _rmsnorm(x, hp.eps) * t[r.output_norm + ".weight"]
        logits = self._q(y, self._out_name, qz).times(self._out, self.mins.get(self._out_name))
        if hp.softcap:
            logits = hp.softcap * np.tanh(logits / hp.softcap)
        return logits

    def _q(self, x: np.ndarray, name: str, qz: _Quant) -> _QIn:
        """The input of a matmul with tensor `name` (rows at qz.pos), quantised as its weight type asks."""
        diff = None
        if name in self.q8_0:
            y, margin = _q8_0(x)
        elif name in self.q8_1:
            y, diff, margin = _q8_1(x)
        elif name in self.q8_k:
            y, margin = _q8_k(x)
        elif name in self.half:
            y, margin = _round_half(x, self.half[name])
        else:
            return _QIn(x)
        qz.note(margin)
        return _QIn(y, diff)

    def _m(self, name: str, e: int | None = None) -> np.ndarray | None:
        """A Q8_1 tensor's block minima (expert e's), or None."""
        m = self.mins.get(name)
        return m if m is None or e is None else m[e]

    def _mm(self, x: np.ndarray, name: str, qz: _Quant, bias: str | None = None) -> np.ndarray:
        """x times tensor `name`, plus the tensor `bias` when the model has it."""
        y = self._q(x, name, qz).times(self.t[name], self._m(name))
        return y + self.t[bias] if bias is not None and bias in self.t else y

    def _rope(self, v: np.ndarray, pos: np.ndarray, swa: bool = False) -> np.ndarray:
        """NeoX pairing on the first n_rot dims of the last axis; v is [n, heads, hd]. A sliding-window
        layer rotates n_rot_swa dims with its own base and no rope_freqs."""
        nrot = self.hp.n_rot_swa if swa else self.hp.n_rot
        half = nrot // 2
        j = np.arange(half)
        base = self.hp.rope_base_swa if swa else self.hp.rope_base
        freq = base ** (-2.0 * j / nrot)
        if self.recipe.rope_freqs and not swa:
            freq = freq / self.t["rope_freqs.weight"][:half]
        mscale = 1.0
        if not swa or self.hp.swa_scaled:  # the scaling: global layers, and local ones where the recipe says
            if self.hp.yarn is not None:
                mul, mscale = yarn_factors(nrot, base, self.hp.rope_scale, *self.hp.yarn)
                freq = freq * mul
            else:
                pos = pos * self.hp.rope_scale  # linear RoPE scaling
        if self.hp.rope_sections:  # interleaved M-RoPE: a pair of the extra sector has position 0
            freq = np.where(mrope_rotated(nrot, self.hp.rope_sections), freq, 0.0)
        theta = pos[:, None] * freq  # [n, half]
        cos, sin = mscale * np.cos(theta)[:, None, :], mscale * np.sin(theta)[:, None, :]
        out = v.copy()
        a, b_ = v[..., :half], v[..., half:nrot]
        out[..., :half] = a * cos - b_ * sin
        out[..., half:nrot] = a * sin + b_ * cos
        return out

    def _attention(self, il: int, h: np.ndarray, qz: _Quant, cache: dict[str, Any]) -> np.ndarray:
        hp, t, b, pos = self.hp, self.t, f"blk.{il}.", qz.pos
        n = h.shape[0]
        H, Hkv, hd, hdv = hp.geometry(il)
        gate = None
        if self.recipe.attn_gate:  # per head: hd queries, then hd gate values
            qg = self._mm(h, b + "attn_q.weight", qz, b + "attn_q.bias").reshape(n, H, 2, hd)
            q, gate = qg[:, :, 0, :], qg[:, :, 1, :]
        else:
            q = self._mm(h, b + "attn_q.weight", qz, b + "attn_q.bias").reshape(n, H, hd)
        k = self._mm(h, b + "attn_k.weight", qz, b + "attn_k.bias").reshape(n, Hkv, hd)
        if b + "attn_v.weight" in t:
            v = self._mm(h, b + "attn_v.weight", qz, b + "attn_v.bias").reshape(n, Hkv, hdv)
        else:  # gemma4 without attn_v: v is k's projection, before k's norm
            v = k.copy()
        if self.recipe.qk_norm:
            q = _rmsnorm(q, hp.eps) * t[b + "attn_q_norm.weight"]
            k = _rmsnorm(k, hp.eps) * t[b + "attn_k_norm.weight"]
        if self.recipe.v_norm:
            v = _rmsnorm(v, hp.eps)
        swa = hp.is_swa(il)
        q, k = self._rope(q, pos, swa), self._rope(k, pos, swa)
        if cache["k"][il] is None:
            cache["k"][il], cache["v"][il] = k, v
        else:
            cache["k"][il] = np.concatenate([cache["k"][il], k])
            cache["v"][il] = np.concatenate([cache["v"][il], v])
        K, Vv = cache["k"][il], cache["v"][il]  # [p0+n, Hkv, *]
        group = H // Hkv
        out = np.empty((n, H, hdv))
        for hh in range(H):
            g = hh // group
            s = (q[:, hh, :] @ K[:, g, :].T) * hp.attn_scale  # [n, p0+n]
            mask = np.arange(K.shape[0])[None, :] > pos[:, None]
            if swa:  # the window: key position j is visible from p when p - j < n_swa
                mask |= pos[:, None] - np.arange(K.shape[0])[None, :] >= hp.n_swa
            s = np.where(mask, -np.inf, s)
            if self.recipe.attn_sinks:  # one more logit per head, without a value: it only takes weight
                sink = t[b + "attn_sinks.weight"][hh]
                mx = np.maximum(np.max(s, axis=-1, keepdims=True), sink)
                e = np.exp(s - mx)
                p = e / (np.sum(e, axis=-1, keepdims=True) + np.exp(sink - mx))
            else:
                p = _softmax(s)
            out[:, hh, :] = p @ Vv[:, g, :]
        if gate is not None:
            out = out / (1.0 + np.exp(-gate))  # times sigmoid(gate)
        return self._mm(out.reshape(n, H * hdv), b + "attn_output.weight", qz, b + "attn_output.bias")

    def _glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """The gated activation of an FFN's hidden layer (docs/model-math.md, Activations)."""
        if self.recipe.act == "silu":
            return _silu(gate) * up
        if self.recipe.act == "gelu_tanh":
            return _gelu(gate) * up
        return _swiglu_oai(gate, up)

    def _mlp(
        self,
        h: np.ndarray,
        gate: np.ndarray,
        up: np.ndarray,
        down: np.ndarray,
        names: tuple[str, str, str],
        qz: _Quant,
        biases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        down_scale: float = 1.0,
        mins: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None] = (None, None, None),
    ) -> np.ndarray:
        """names: the tensors gate, up and down come from: each matmul quantises its input as its own
        weight type asks (gate and up of one layer can differ, as in llama.cpp's mixes); biases (gate, up,
        down) are added after each matmul when given (gpt-oss's per-expert biases); down_scale multiplies
        the output (gemma4's expert scale); mins: gate's, up's and down's block minima where they are a
        Q8_1 type."""
        hg = self._q(h, names[0], qz)
        hu = hg if names[1] == names[0] else self._q(h, names[1], qz)
        g, u = hg.times(gate, mins[0]), hu.times(up, mins[1])
        if biases is not None:
            g, u = g + biases[0], u + biases[1]
        y = self._q(self._glu(g, u), names[2], qz).times(down, mins[2]) * down_scale
        return y + biases[2] if biases is not None else y

    def _mins3(self, b: str, suffix: str = "") -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        return tuple(self._m(f"{b}ffn_{p}{suffix}.weight") for p in ("gate", "up", "down"))  # type: ignore[return-value]

    def _ffn(self, il: int, x: np.ndarray, qz: _Quant, routes: list[Route] | None) -> np.ndarray:
        hp, r, t, b = self.hp, self.recipe, self.t, f"blk.{il}."
        h = _rmsnorm(x, hp.eps) * t[b + r.ffn_norm + ".weight"]
        if self._is_dense(il):
            y = self._mlp(
                h,
                t[b + "ffn_gate.weight"],
                t[b + "ffn_up.weight"],
                t[b + "ffn_down.weight"],
                (b + "ffn_gate.weight", b + "ffn_up.weight", b + "ffn_down.weight"),
                qz,
                mins=self._mins3(b),
            )
            if b + "post_ffw_norm.weight" in t:
                y = _rmsnorm(y, hp.eps) * t[b + "post_ffw_norm.weight"]
            return y
        h_moe = _rmsnorm(x, hp.eps) * t[b + "pre_ffw_norm_2.weight"] if r.shared_expert == "ffn" else h
        router_in = h
        if r.router_prescale:
            router_in = _rmsnorm(x, hp.eps) / math.sqrt(hp.d) * t[b + "ffn_gate_inp.scale"]
        moe = self._moe(il, router_in, h_moe, qz, routes)
        if r.shared_expert == "gated":  # times sigmoid(ffn_gate_inp_shexp . h), one number per position
            g = self._mm(h, b + "ffn_gate_inp_shexp.weight", qz)
            return (
                moe
                + self._mlp(
                    h,
                    t[b + "ffn_gate_shexp.weight"],
                    t[b + "ffn_up_shexp.weight"],
                    t[b + "ffn_down_shexp.weight"],
                    (b + "ffn_gate_shexp.weight", b + "ffn_up_shexp.weight", b + "ffn_down_shexp.weight"),
                    qz,
                    mins=self._mins3(b, "_shexp"),
                )
                / (1.0 + np.exp(-g))[:, None]
            )
        if r.shared_expert == "named":
            return moe + self._mlp(
                h,
                t[b + "ffn_gate_shexp.weight"],
                t[b + "ffn_up_shexp.weight"],
                t[b + "ffn_down_shexp.weight"],
                (b + "ffn_gate_shexp.weight", b + "ffn_up_shexp.weight", b + "ffn_down_shexp.weight"),
                qz,
                mins=self._mins3(b, "_shexp"),
            )
        if r.shared_expert != "ffn":
            return moe
        sh = self._mlp(
            h,
            t[b + "ffn_gate.weight"],
            t[b + "ffn_up.weight"],
            t[b + "ffn_down.weight"],
            (b + "ffn_gate.weight", b + "ffn_up.weight", b + "ffn_down.weight"),
            qz,
            mins=self._mins3(b),
        )
        z = (
            _rmsnorm(sh, hp.eps) * t[b + "post_ffw_norm_1.weight"]
            + _rmsnorm(moe, hp.eps) * t[b + "post_ffw_norm_2.weight"]
        )
        return _rmsnorm(z, hp.eps) * t[b + "post_ffw_norm.weight"]

    def route(self, logits: np.ndarray, bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
        """One position's gating: (ids in rank order, final weights, selection margin). `bias` (recipes
        with probs_bias: the layer's exp_probs_b) is added to the probs for the selection only."""
        hp, k = self.hp, self.hp.n_expert_used
        if hp.gating == 1:
            probs = _softmax(logits)
        elif hp.gating == 2:
            probs = 1.0 / (1.0 + np.exp(-logits))
        else:
            probs = logits.copy()
        sel = probs if bias is None else probs + bias
        order = np.argsort(-sel, kind="stable")  # descending; ties keep the lower id first
        ids = order[:k]
        margin = float(sel[order[k - 1]] - sel[order[k]]) if k < len(probs) else math.inf
        w = probs[ids].copy()
        if hp.gating == 3:
            w = _softmax(w)
        if hp.norm_w:
            w = w / np.sum(w)
        if hp.w_scale != 1.0:
            w = w * hp.w_scale
        return ids, w, margin

    def _moe(self, il: int, h: np.ndarray, h_moe: np.ndarray, qz: _Quant, routes: list[Route] | None) -> np.ndarray:
        hp, r, t, b, pos = self.hp, self.recipe, self.t, f"blk.{il}.", qz.pos
        f = hp.n_ff_exp
        logits = self._mm(h, b + "ffn_gate_inp.weight", qz, b + "ffn_gate_inp.bias")  # [n, E], biased (gpt-oss)
        out = np.zeros_like(h_moe)
        down = t[b + "ffn_down_exps.weight"]
        bias = t[b + "exp_probs_b.bias"] if r.probs_bias else None
        for row in range(h.shape[0]):
            ids, w, margin = self.route(logits[row], bias)
            if routes is not None:
                routes.append(Route(int(pos[row]), il, tuple(int(i) for i in ids), tuple(float(v) for v in w), margin))
            acc = np.zeros(hp.d)
            for e, we in zip(ids, w, strict=True):
                if r.fused_gate_up:
                    gname = uname = b + "ffn_gate_up_exps.weight"
                    gu, gum = t[gname][e], self._m(gname, e)
                    gate, up = gu[:f], gu[f:]
                    mg, mu = (None, None) if gum is None else (gum[:f], gum[f:])
                else:
                    gname, uname = b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight"
                    gate, up = t[gname][e], t[uname][e]
                    mg, mu = self._m(gname, e), self._m(uname, e)
                dname = b + "ffn_down_exps.weight"
                names = (gname, uname, dname)
                mins = (mg, mu, self._m(dname, e))
                biases = None
                if r.expert_bias != "none":
                    biases = (
                        t[b + "ffn_gate_exps.bias"][e],
                        t[b + "ffn_up_exps.bias"][e],
                        t[b + "ffn_down_exps.bias"][e],
                    )
                # gemma4: each expert's output times its scale (ffn_down_exps.scale), before any down bias
                sc = float(t[b + "ffn_down_exps.scale"][e]) if b + "ffn_down_exps.scale" in t else 1.0
                acc += we * self._mlp(h_moe[row], gate, up, down[e], names, qz.row(row), biases, sc, mins)
            out[row] = acc
        return out

    # ---------------------------------------------------------------- drivers
    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits of every position of `tokens`, run as one batch from position 0."""
        return self.forward(tokens)

    def generate(self, prompt: Sequence[int], n: int, stop_at_eog: bool = True) -> Generation:
        """Greedy: prefill the prompt, then take the first index of the maximum logit, n times, stopping
        after an end-of-generation token (eog.py), which is the last token of the output and is not
        evaluated, as the engine does (docs/engine.md, the result object)."""
        cache = self.new_cache()
        routes: list[Route] = []
        qm: dict[int, float] = {}
        rows = [self.forward(prompt, cache, routes, qm)]
        cur = rows[0][-1]
        out: list[int] = []
        stopped = False
        while len(out) < n:
            tok = int(np.argmax(cur))
            out.append(tok)
            if stop_at_eog and tok in self.eog:
                stopped = True
                break
            if len(out) == n:
                break
            step = self.forward([tok], cache, routes, qm)
            rows.append(step)
            cur = step[-1]
        logits = np.vstack(rows)
        margins = [qm.get(p, 0.5) for p in range(len(logits))]
        return Generation(list(prompt), out, logits, routes, stopped, margins)


def _mixers(
    get: Any, arch: str, mixer: str, n_layer: int, n_head: int
) -> tuple[tuple[str, ...], int, DeltaNetDims | None, int, tuple[int, ...]]:
    """The hybrid architectures' layer kinds (docs/model-math.md, "Hybrid architectures"), with the KV
    head count, the delta-net sizes, the convolution's taps and the M-RoPE sections."""
    kv = get(f"{arch}.attention.head_count_kv", n_head)
    if mixer == "attention":  # (per-layer KV heads, if the key is an array, are HParams.heads_kv)
        return (), int(kv[0] if isinstance(kv, list) else kv), None, 0, ()
    if mixer == "shortconv":  # head_count_kv per layer: 0 is a conv layer
        per = [int(v) for v in kv] if isinstance(kv, list) else [int(kv)] * n_layer
        if len(per) != n_layer:
            raise ModelError(f"{arch}.attention.head_count_kv: {len(per)} entries, {n_layer} layers")
        heads = {v for v in per if v}
        if len(heads) > 1:
            raise ModelError(f"{arch}.attention.head_count_kv: attention layers with different KV heads {heads}")
        kinds = tuple("shortconv" if v == 0 else "attention" for v in per)
        return kinds, heads.pop() if heads else n_head, None, int(get(f"{arch}.shortconv.l_cache")), ()
    rec = get(f"{arch}.attention.recurrent_layers", None)
    if rec is not None:
        if len(rec) != n_layer:
            raise ModelError(f"{arch}.attention.recurrent_layers: {len(rec)} entries, {n_layer} layers")
        kinds = tuple("delta_net" if v else "attention" for v in rec)
    else:
        every = int(get(f"{arch}.full_attention_interval", 4))
        kinds = tuple("attention" if (il + 1) % every == 0 else "delta_net" for il in range(n_layer))
    S, Hv = int(get(f"{arch}.ssm.state_size")), int(get(f"{arch}.ssm.time_step_rank"))
    dims = DeltaNetDims(S=S, Hk=int(get(f"{arch}.ssm.group_count")), Hv=Hv, K=int(get(f"{arch}.ssm.conv_kernel")))
    if int(get(f"{arch}.ssm.inner_size")) != Hv * S or Hv % dims.Hk:
        raise ModelError(f"{arch}.ssm.*: inner_size must be time_step_rank x state_size, a multiple of group_count")
    sections = tuple(int(v) for v in get(f"{arch}.rope.dimension_sections"))
    if len(sections) != 4:
        raise ModelError(f"{arch}.rope.dimension_sections: {len(sections)} entries, expected 4")
    return kinds, int(kv[0] if isinstance(kv, list) else kv), dims, 0, sections


def _periodic_swa(get: Any, arch: str, n_layer: int, period: int, required: bool) -> tuple[tuple[bool, ...], int]:
    """gemma3's and gpt-oss's local layers (docs/model-math.md): no window key (or 0) means every layer
    global (gpt-oss requires the key); else the pattern key is a per-layer list (true = local), a period,
    or absent (the recipe's period)."""
    n_swa = int(get(f"{arch}.attention.sliding_window", ModelError if required else 0))
    if n_swa == 0:
        if required:
            raise ModelError(f"{arch}.attention.sliding_window: must be > 0")
        return (), 0
    pattern = get(f"{arch}.attention.sliding_window_pattern", period)
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise ModelError(f"{arch}.attention.sliding_window_pattern: {len(pattern)} entries, {n_layer} layers")
        return tuple(bool(v) for v in pattern), n_swa
    p = int(pattern)
    return tuple(p == 0 or il % p < p - 1 for il in range(n_layer)), n_swa


def _rope_scale(get: Any, arch: str, kinds: tuple[str, ...]) -> tuple[float, tuple[int, float] | None]:
    """1 / rope.scaling.factor (absent or 0: 1; type "none": 1), and for YaRN its original context
    (default context_length) and attn_factor (default 1); a type the recipe does not read is refused."""
    kind = str(get(f"{arch}.rope.scaling.type", "linear"))
    if kind != "none" and kind not in kinds:
        raise ModelError(f"{arch}.rope.scaling.type: {kind!r} is not modelled for {arch} ({', '.join(kinds)})")
    factor = float(get(f"{arch}.rope.scaling.factor", 0.0)) or float(get(f"{arch}.rope.scale_linear", 0.0))
    scale = 1.0 if factor == 0.0 or kind == "none" else 1.0 / factor
    if kind != "yarn":
        return scale, None
    orig = int(get(f"{arch}.rope.scaling.original_context_length", get(f"{arch}.context_length")))
    return scale, (orig, float(get(f"{arch}.rope.scaling.attn_factor", 1.0)))


def yarn_factors(n_rot: int, base: float, scale: float, orig_ctx: int, attn_factor: float) -> tuple[np.ndarray, float]:
    """YaRN as llama.cpp applies it (docs/model-math.md): per dimension pair j the angle's multiplier
    scale (1 - r_j) + r_j, with r_j 1 below the correction range and 0 above it (linear in between),
    and the factor every cos and sin is multiplied by."""

    def corr(beta: float) -> float:  # the dimension that turns beta times over the original context
        return n_rot * math.log(orig_ctx / (beta * 2 * math.pi)) / (2 * math.log(base))

    lo = max(0.0, math.floor(corr(32.0)))
    hi = min(n_rot - 1.0, math.ceil(corr(1.0)))
    j = np.arange(n_rot // 2, dtype=np.float64)
    ramp = 1.0 - np.clip((j - lo) / max(0.001, hi - lo), 0.0, 1.0)
    return scale * (1.0 - ramp) + ramp, attn_factor * (1.0 + 0.1 * math.log(1.0 / scale))


def _block_mins(t: Any, block: int, block_bytes: int, offset: int) -> np.ndarray:
    """A Q8_1-type tensor's per-block f16 minimum m (at `offset` in each block), float64, numpy order:
    [..., rows, blocks per row]."""
    shape = tuple(int(s) for s in reversed([int(x) for x in t.shape]))
    raw = np.ascontiguousarray(np.asarray(t.data, dtype=np.uint8).reshape(-1, block_bytes)[:, offset : offset + 2])
    return raw.view("<f2").astype(np.float64).reshape(*shape[:-1], shape[-1] // block)


def _to_f64(t: Any) -> np.ndarray:
    """A reader tensor as float64 in numpy order (GGUF ne reversed)."""
    shape = tuple(int(s) for s in reversed([int(x) for x in t.shape]))
    if t.tensor_type == GGMLQuantizationType.F32:
        arr = np.asarray(t.data, dtype=np.float32)
    elif supported(t.tensor_type):
        arr = dequantize(np.asarray(t.data), t.tensor_type)
    else:
        raise ModelError(f"{t.name}: type {t.tensor_type.name} is not a weight type the engine computes with")
    return np.asarray(arr, dtype=np.float64).reshape(shape)
