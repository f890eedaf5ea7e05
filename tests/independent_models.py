"""Tiny models of the architectures apps ship, written without the project's generator: llama.cpp's own
writer (gguf-py's GGUFWriter), its tensor names (gguf.constants.TENSOR_NAMES) and metadata keys
(gguf.Keys), shapes as llama.cpp's loaders create them (src/models/<arch>.cpp), seeded numpy weights.

Nothing here imports bmoe_ci: a mistake the generator and the engine share (a tensor name, a key, a
transposed shape) does not carry over. tests/test_independent_models.py runs them in llama.cpp and in the
engine. The vocabulary is byte-level: the 256 GPT-2 byte images, five merges and one end token.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import MODEL_TENSOR, TENSOR_NAMES, GGUFWriter, Keys

D = 64  # embedding width of every model here
#: a few merges over the byte images (U+0120 is the space's image), their tokens after the 256 bytes
MERGES = ["\u0120 t", "h e", "\u0120t he", "o w", "r o"]
N_VOCAB = 256 + len(MERGES) + 1  # and one end token
#: the gemma4 model's vocabulary (tokenizer.ggml.model gemma4)
_G4_CHARS = ["\u2581", *"Thequickbrownfox"]
GEMMA4_MERGES = ["\u2581 q", "\u2581 b", "\u2581 f", "T h", "Th e", "o w", "u i", "\u2581q ui"]
GEMMA4_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    *(f"<0x{b:02X}>" for b in range(256)),
    *dict.fromkeys(_G4_CHARS),
    *(m.replace(" ", "") for m in GEMMA4_MERGES),
]


def byte_images() -> list[str]:
    """GPT-2's byte-to-unicode table (the published bytes_to_unicode), in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def _name(t: MODEL_TENSOR, bid: int | None = None, suffix: str = "weight") -> str:
    base = TENSOR_NAMES[t]
    return (base.format(bid=bid) if bid is not None else base) + f".{suffix}"


class _Model:
    def __init__(self, arch: str, seed: int, pre: str) -> None:
        self.arch, self.pre = arch, pre
        self.rng = np.random.default_rng(seed)
        self.tensors: dict[str, np.ndarray] = {}
        self.kv: list[tuple[str, object]] = []

    def key(self, template: str, value: object) -> None:
        self.kv.append((template.format(arch=self.arch), value))

    def mat(self, name: str, *shape: int, scale: float = 1.0) -> None:
        """A numpy-order [..., rows, cols] matrix (ggml's {cols, rows, ...}), std scale / sqrt(cols)."""
        self.tensors[name] = (self.rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    def vec(self, name: str, n: int, mean: float = 0.0, std: float = 0.1) -> None:
        self.tensors[name] = (mean + std * self.rng.standard_normal(n)).astype(np.float32)

    def write(self, path: Path) -> Path:
        w = GGUFWriter(str(path), arch=self.arch)
        for key, value in self.kv:
            if isinstance(value, bool):
                w.add_bool(key, value)
            elif isinstance(value, int):
                w.add_uint32(key, value)
            elif isinstance(value, float):
                w.add_float32(key, value)
            elif isinstance(value, str):
                w.add_string(key, value)
            else:
                w.add_array(key, list(value))  # type: ignore[call-overload]
        if self.pre == "gemma4":
            # BPE over UTF-8 with U+2581 for spaces: specials, the 256 byte-fallback tokens <0xXX>, the
            # characters the merges start from, the merged tokens
            w.add_tokenizer_model("gemma4")
            w.add_token_list(GEMMA4_TOKENS)
            w.add_token_types([3, 3, 3, 2] + [6] * 256 + [1] * (len(GEMMA4_TOKENS) - 260))
            w.add_token_merges(GEMMA4_MERGES)
            w.add_pad_token_id(0)
            w.add_eos_token_id(1)
            w.add_bos_token_id(2)
            w.add_unk_token_id(3)
            w.add_add_bos_token(True)
        else:
            w.add_tokenizer_model("gpt2")
            w.add_tokenizer_pre(self.pre)
            w.add_token_list([*byte_images(), *(m.replace(" ", "") for m in MERGES), "<|endoftext|>"])
            w.add_token_types([1] * (N_VOCAB - 1) + [3])
            w.add_token_merges(MERGES)
            w.add_eos_token_id(N_VOCAB - 1)
            w.add_bos_token_id(N_VOCAB - 1)
            w.add_add_bos_token(False)
        for name, t in self.tensors.items():
            w.add_tensor(name, t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    def common(self, n_layer: int, n_head: int, n_head_kv: int | list[int], ctx: int = 256) -> None:
        L = Keys.LLM
        self.key(L.BLOCK_COUNT, n_layer)
        self.key(L.CONTEXT_LENGTH, ctx)
        self.key(L.EMBEDDING_LENGTH, D)
        self.key(Keys.Attention.HEAD_COUNT, n_head)
        self.key(Keys.Attention.HEAD_COUNT_KV, n_head_kv)
        self.key(Keys.Attention.LAYERNORM_RMS_EPS, 1e-6)
        self.mat(_name(MODEL_TENSOR.TOKEN_EMBD), N_VOCAB, D, scale=np.sqrt(D))

    def experts(self, bid: int, n_expert: int, n_ff: int) -> None:
        self.mat(_name(MODEL_TENSOR.FFN_GATE_INP, bid), n_expert, D, scale=2.0)
        self.mat(_name(MODEL_TENSOR.FFN_GATE_EXP, bid), n_expert, n_ff, D)
        self.mat(_name(MODEL_TENSOR.FFN_UP_EXP, bid), n_expert, n_ff, D)
        self.mat(_name(MODEL_TENSOR.FFN_DOWN_EXP, bid), n_expert, D, n_ff)

    def qkvo(self, bid: int, q: int, kv: int, o_in: int, bias: bool) -> None:
        self.mat(_name(MODEL_TENSOR.ATTN_Q, bid), q, D)
        self.mat(_name(MODEL_TENSOR.ATTN_K, bid), kv, D)
        self.mat(_name(MODEL_TENSOR.ATTN_V, bid), kv, D)
        self.mat(_name(MODEL_TENSOR.ATTN_OUT, bid), D, o_in)
        if bias:
            self.vec(_name(MODEL_TENSOR.ATTN_Q, bid, "bias"), q)
            self.vec(_name(MODEL_TENSOR.ATTN_K, bid, "bias"), kv)
            self.vec(_name(MODEL_TENSOR.ATTN_V, bid, "bias"), kv)


def qwen2moe(path: Path) -> Path:
    """Qwen1.5-MoE's layout (llama.cpp src/models/qwen2moe.cpp): q/k/v biases, softmax over 8 experts,
    top-2 unnormalised, a shared expert gated by sigmoid(ffn_gate_inp_shexp . h)."""
    m = _Model("qwen2moe", 2801, "qwen2")
    n_layer, E, F, S = 2, 8, 32, 48
    m.common(n_layer, 4, 2)
    m.key(Keys.LLM.FEED_FORWARD_LENGTH, 4 * D)
    m.key(Keys.LLM.EXPERT_COUNT, E)
    m.key(Keys.LLM.EXPERT_USED_COUNT, 2)
    m.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, F)
    m.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, S)
    m.key(Keys.Rope.FREQ_BASE, 1000000.0)
    for i in range(n_layer):
        m.vec(_name(MODEL_TENSOR.ATTN_NORM, i), D, 1.0)
        m.qkvo(i, D, 2 * 16, D, bias=True)
        m.vec(_name(MODEL_TENSOR.FFN_NORM, i), D, 1.0)
        m.experts(i, E, F)
        m.vec(_name(MODEL_TENSOR.FFN_GATE_INP_SHEXP, i), D, 0.0, 0.2)
        m.mat(_name(MODEL_TENSOR.FFN_GATE_SHEXP, i), S, D)
        m.mat(_name(MODEL_TENSOR.FFN_UP_SHEXP, i), S, D)
        m.mat(_name(MODEL_TENSOR.FFN_DOWN_SHEXP, i), D, S)
    m.vec(_name(MODEL_TENSOR.OUTPUT_NORM), D, 1.0)
    m.mat(_name(MODEL_TENSOR.OUTPUT), N_VOCAB, D, scale=4.0)
    return m.write(path)


def gpt_oss(path: Path, sinks: float = 1.0) -> Path:
    """gpt-oss's layout (llama.cpp src/models/openai-moe.cpp): head width 16 x 4 heads unlike d, q/k/v/o
    biases, attention sinks, sliding-window layers by llama.cpp's default period 2, YaRN, router and
    per-expert biases, top-4 of 8 (softmax over the selected), the clamped SwiGLU. `sinks` scales the
    attention sinks (a wrong model for the test's own check)."""
    m = _Model("gpt-oss", 2802, "gpt-4o")
    n_layer, E, F, H, KV, HD = 4, 8, 32, 4, 2, 16
    m.common(n_layer, H, KV)
    m.key(Keys.LLM.FEED_FORWARD_LENGTH, F)
    m.key(Keys.LLM.EXPERT_COUNT, E)
    m.key(Keys.LLM.EXPERT_USED_COUNT, 4)
    m.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, F)
    m.key(Keys.Attention.KEY_LENGTH, HD)
    m.key(Keys.Attention.VALUE_LENGTH, HD)
    m.key(Keys.Attention.SLIDING_WINDOW, 4)
    m.key(Keys.Rope.FREQ_BASE, 150000.0)
    m.key(Keys.Rope.SCALING_TYPE, "yarn")
    m.key(Keys.Rope.SCALING_FACTOR, 8.0)
    m.key(Keys.Rope.SCALING_ORIG_CTX_LEN, 32)
    for i in range(n_layer):
        m.vec(_name(MODEL_TENSOR.ATTN_NORM, i), D, 1.0)
        m.qkvo(i, H * HD, KV * HD, H * HD, bias=True)
        m.vec(_name(MODEL_TENSOR.ATTN_OUT, i, "bias"), D)
        m.vec(_name(MODEL_TENSOR.ATTN_SINKS, i), H, 0.0, 1.0)
        m.tensors[_name(MODEL_TENSOR.ATTN_SINKS, i)] *= np.float32(sinks)
        m.vec(_name(MODEL_TENSOR.ATTN_POST_NORM, i), D, 1.0)
        m.experts(i, E, F)
        m.vec(_name(MODEL_TENSOR.FFN_GATE_INP, i, "bias"), E, 0.0, 0.5)
        for t, n in ((MODEL_TENSOR.FFN_GATE_EXP, F), (MODEL_TENSOR.FFN_UP_EXP, F), (MODEL_TENSOR.FFN_DOWN_EXP, D)):
            m.tensors[_name(t, i, "bias")] = (0.1 * m.rng.standard_normal((E, n))).astype(np.float32)
    m.vec(_name(MODEL_TENSOR.OUTPUT_NORM), D, 1.0)
    m.mat(_name(MODEL_TENSOR.OUTPUT), N_VOCAB, D, scale=4.0)
    return m.write(path)


def lfm2moe(path: Path) -> Path:
    """LFM2-MoE's layout (llama.cpp src/models/lfm2moe.cpp): short-convolution layers where
    head_count_kv is 0, attention layers with q/k norms elsewhere, one dense first layer, sigmoid
    routing whose exp_probs_b only selects, token_embd_norm as the output norm, the output tied."""
    m = _Model("lfm2moe", 2803, "lfm2")
    n_layer, E, F = 4, 8, 32
    kv = [0, 2, 0, 2]
    m.common(n_layer, 4, kv)
    m.key(Keys.LLM.FEED_FORWARD_LENGTH, 96)
    m.key(Keys.LLM.EXPERT_COUNT, E)
    m.key(Keys.LLM.EXPERT_USED_COUNT, 2)
    m.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, F)
    m.key(Keys.LLM.EXPERT_GATING_FUNC, 2)
    m.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 1)
    m.key(Keys.ShortConv.L_CACHE, 3)
    m.key(Keys.Rope.FREQ_BASE, 1000000.0)
    for i in range(n_layer):
        m.vec(_name(MODEL_TENSOR.ATTN_NORM, i), D, 1.0)
        if kv[i]:
            m.vec(_name(MODEL_TENSOR.ATTN_Q_NORM, i), 16, 1.0)
            m.vec(_name(MODEL_TENSOR.ATTN_K_NORM, i), 16, 1.0)
            m.qkvo(i, D, kv[i] * 16, D, bias=False)
        else:
            m.mat(_name(MODEL_TENSOR.SHORTCONV_CONV, i), D, 3, scale=1.0)
            m.mat(_name(MODEL_TENSOR.SHORTCONV_INPROJ, i), 3 * D, D)
            m.mat(_name(MODEL_TENSOR.SHORTCONV_OUTPROJ, i), D, D)
        m.vec(_name(MODEL_TENSOR.FFN_NORM, i), D, 1.0)
        if i == 0:
            m.mat(_name(MODEL_TENSOR.FFN_GATE, i), 96, D)
            m.mat(_name(MODEL_TENSOR.FFN_UP, i), 96, D)
            m.mat(_name(MODEL_TENSOR.FFN_DOWN, i), D, 96)
        else:
            m.experts(i, E, F)
            m.vec(_name(MODEL_TENSOR.FFN_EXP_PROBS_B, i, "bias"), E, 0.0, 0.1)
    m.vec(_name(MODEL_TENSOR.TOKEN_EMBD_NORM), D, 1.0)
    for name in m.tensors:  # the sublayers outweigh the tied embedding (else it repeats one token)
        if name.endswith(("attn_output.weight", "out_proj.weight", "ffn_down.weight", "ffn_down_exps.weight")):
            m.tensors[name] *= np.float32(3.0)
    return m.write(path)


def qwen35moe(path: Path) -> Path:
    """Qwen3.5 / 3.6 MoE's layout (llama.cpp src/models/qwen35moe.cpp): gated delta-net blocks
    (attn_qkv, attn_gate, ssm_conv1d, ssm_a, ssm_dt, ssm_alpha, ssm_beta, ssm_norm, ssm_out) but every
    full_attention_interval-th, which attends with q and its gate in attn_q, q/k norms and partial
    M-RoPE; experts and a sigmoid-gated shared expert in every block; post_attention_norm before the FFN."""
    m = _Model("qwen35moe", 2804, "qwen35")
    n_layer, E, F, SH, H, KV, HD = 4, 8, 32, 32, 4, 2, 16
    S, HK, HV, TAPS = 16, 2, 4, 4
    conv = 2 * HK * S + HV * S
    m.common(n_layer, H, KV)
    m.key(Keys.LLM.FEED_FORWARD_LENGTH, F)
    m.key(Keys.LLM.EXPERT_COUNT, E)
    m.key(Keys.LLM.EXPERT_USED_COUNT, 2)
    m.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, F)
    m.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, SH)
    m.key(Keys.Attention.KEY_LENGTH, HD)
    m.key(Keys.Attention.VALUE_LENGTH, HD)
    m.key(Keys.Rope.DIMENSION_COUNT, 8)
    m.key(Keys.Rope.DIMENSION_SECTIONS, [2, 1, 1, 0])
    m.key(Keys.Rope.FREQ_BASE, 1000000.0)
    m.key(Keys.LLM.FULL_ATTENTION_INTERVAL, 2)
    m.key(Keys.SSM.CONV_KERNEL, TAPS)
    m.key(Keys.SSM.STATE_SIZE, S)
    m.key(Keys.SSM.GROUP_COUNT, HK)
    m.key(Keys.SSM.TIME_STEP_RANK, HV)
    m.key(Keys.SSM.INNER_SIZE, HV * S)
    for i in range(n_layer):
        m.vec(_name(MODEL_TENSOR.ATTN_NORM, i), D, 1.0)
        m.vec(_name(MODEL_TENSOR.ATTN_POST_NORM, i), D, 1.0)
        if (i + 1) % 2 == 0:
            m.mat(_name(MODEL_TENSOR.ATTN_Q, i), 2 * H * HD, D)
            m.mat(_name(MODEL_TENSOR.ATTN_K, i), KV * HD, D)
            m.mat(_name(MODEL_TENSOR.ATTN_V, i), KV * HD, D)
            m.mat(_name(MODEL_TENSOR.ATTN_OUT, i), D, H * HD)
            m.vec(_name(MODEL_TENSOR.ATTN_Q_NORM, i), HD, 1.0)
            m.vec(_name(MODEL_TENSOR.ATTN_K_NORM, i), HD, 1.0)
        else:
            m.mat(_name(MODEL_TENSOR.ATTN_QKV, i), conv, D)
            m.mat(_name(MODEL_TENSOR.ATTN_GATE, i), HV * S, D)
            m.mat(_name(MODEL_TENSOR.SSM_CONV1D, i), conv, TAPS)
            m.vec(_name(MODEL_TENSOR.SSM_DT, i, "bias"), HV, 0.0, 0.5)
            m.tensors[TENSOR_NAMES[MODEL_TENSOR.SSM_A].format(bid=i)] = (
                -np.exp(0.5 * m.rng.standard_normal(HV))
            ).astype(np.float32)
            m.mat(_name(MODEL_TENSOR.SSM_BETA, i), HV, D)
            m.mat(_name(MODEL_TENSOR.SSM_ALPHA, i), HV, D)
            m.vec(_name(MODEL_TENSOR.SSM_NORM, i), S, 1.0)
            m.mat(_name(MODEL_TENSOR.SSM_OUT, i), D, HV * S)
        m.experts(i, E, F)
        m.vec(_name(MODEL_TENSOR.FFN_GATE_INP_SHEXP, i), D, 0.0, 0.2)
        m.mat(_name(MODEL_TENSOR.FFN_GATE_SHEXP, i), SH, D)
        m.mat(_name(MODEL_TENSOR.FFN_UP_SHEXP, i), SH, D)
        m.mat(_name(MODEL_TENSOR.FFN_DOWN_SHEXP, i), D, SH)
    m.vec(_name(MODEL_TENSOR.OUTPUT_NORM), D, 1.0)
    m.mat(_name(MODEL_TENSOR.OUTPUT), N_VOCAB, D, scale=4.0)
    return m.write(path)


def gemma4(path: Path) -> Path:
    """Gemma 4 as its released files are (llama.cpp src/models/gemma4.cpp): the gemma4 tokenizer, head
    counts per layer (head_count_kv an array), head size 16 on sliding layers against 32 on the full one,
    no attn_v on the full layer (v is k), rope_freqs of 1e30 past half its pairs, layer_output_scale,
    ffn_down_exps.scale, fused ffn_gate_up_exps, a shared FFN beside the experts, the output tied."""
    m = _Model("gemma4", 2808, "gemma4")  # seed: no near-tie in 12 greedy steps (see the test)
    n_layer, E, F, FF, H = 4, 8, 32, 48, 4
    swa, kv = [True, True, True, False], [2, 2, 2, 1]
    hd = [16 if w else 32 for w in swa]
    n_vocab = len(GEMMA4_TOKENS)
    L, A = Keys.LLM, Keys.Attention
    m.key(L.BLOCK_COUNT, n_layer)
    m.key(L.CONTEXT_LENGTH, 256)
    m.key(L.EMBEDDING_LENGTH, D)
    m.key(L.FEED_FORWARD_LENGTH, FF)
    m.key(A.HEAD_COUNT, H)
    m.key(A.HEAD_COUNT_KV, kv)
    m.key(A.LAYERNORM_RMS_EPS, 1e-6)
    m.key(A.KEY_LENGTH, 32)
    m.key(A.VALUE_LENGTH, 32)
    m.key(A.KEY_LENGTH_SWA, 16)
    m.key(A.VALUE_LENGTH_SWA, 16)
    m.key(A.SLIDING_WINDOW, 8)
    m.key(A.SLIDING_WINDOW_PATTERN, swa)
    m.key(L.EMBD_LENGTH_PER_LAYER_INP, 0)
    m.key(L.FINAL_LOGIT_SOFTCAPPING, 30.0)
    m.key(L.EXPERT_COUNT, E)
    m.key(L.EXPERT_USED_COUNT, 2)
    m.key(L.EXPERT_FEED_FORWARD_LENGTH, F)
    m.key(Keys.Rope.DIMENSION_COUNT, 32)
    m.key(Keys.Rope.DIMENSION_COUNT_SWA, 16)
    m.key(Keys.Rope.FREQ_BASE, 1000000.0)
    m.key(Keys.Rope.FREQ_BASE_SWA, 10000.0)
    m.mat(_name(MODEL_TENSOR.TOKEN_EMBD), n_vocab, D, scale=np.sqrt(D) / 4)
    m.tensors[_name(MODEL_TENSOR.ROPE_FREQS)] = np.array([1.0] * 8 + [1e30] * 8, dtype=np.float32)
    for i in range(n_layer):
        m.vec(_name(MODEL_TENSOR.ATTN_NORM, i), D, 1.0)
        m.mat(_name(MODEL_TENSOR.ATTN_Q, i), H * hd[i], D)
        m.mat(_name(MODEL_TENSOR.ATTN_K, i), kv[i] * hd[i], D)
        if swa[i]:
            m.mat(_name(MODEL_TENSOR.ATTN_V, i), kv[i] * hd[i], D)
        m.mat(_name(MODEL_TENSOR.ATTN_OUT, i), D, H * hd[i])
        m.vec(_name(MODEL_TENSOR.ATTN_Q_NORM, i), hd[i], 1.0)
        m.vec(_name(MODEL_TENSOR.ATTN_K_NORM, i), hd[i], 1.0)
        m.vec(_name(MODEL_TENSOR.ATTN_POST_NORM, i), D, 8.0, 0.5)  # the sublayers outweigh the embedding
        m.tensors[_name(MODEL_TENSOR.LAYER_OUT_SCALE, i)] = np.array([0.5 + 0.25 * i], dtype=np.float32)
        m.vec(_name(MODEL_TENSOR.FFN_PRE_NORM, i), D, 1.0)
        m.mat(_name(MODEL_TENSOR.FFN_GATE, i), FF, D)
        m.mat(_name(MODEL_TENSOR.FFN_UP, i), FF, D)
        m.mat(_name(MODEL_TENSOR.FFN_DOWN, i), D, FF)
        m.vec(_name(MODEL_TENSOR.FFN_POST_NORM, i), D, 8.0, 0.5)
        m.mat(_name(MODEL_TENSOR.FFN_GATE_INP, i), E, D, scale=2.0)
        m.vec(_name(MODEL_TENSOR.FFN_GATE_INP, i, "scale"), D, 1.0)
        m.vec(_name(MODEL_TENSOR.FFN_PRE_NORM_2, i), D, 1.0)
        m.vec(_name(MODEL_TENSOR.FFN_POST_NORM_1, i), D, 1.0)
        m.vec(_name(MODEL_TENSOR.FFN_POST_NORM_2, i), D, 1.0)
        m.mat(_name(MODEL_TENSOR.FFN_GATE_UP_EXP, i), E, 2 * F, D)
        m.mat(_name(MODEL_TENSOR.FFN_DOWN_EXP, i), E, D, F)
        m.vec(_name(MODEL_TENSOR.FFN_DOWN_EXP, i, "scale"), E, 1.0, 0.3)
    m.vec(_name(MODEL_TENSOR.OUTPUT_NORM), D, 1.0)
    return m.write(path)


MODELS: dict[str, Callable[[Path], Path]] = {
    "qwen2moe": qwen2moe,
    "gpt-oss": gpt_oss,
    "lfm2moe": lfm2moe,
    "qwen35moe": qwen35moe,
    "gemma4": gemma4,
}
