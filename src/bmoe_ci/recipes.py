"""The architecture recipes as named data: one row per architecture, the facts of docs/model-math.md.

The engine's table is `engine/src/arch.c` (C, designated initializers); this is the same table for the
Python side. The numpy reference (`bmoe_ci.reference`) and the fixture generator (`bmoe_ci.models`)
read an architecture's facts from here by name instead of testing its name. `bmoe archs` prints the
engine's rows as JSON, and tests/test_recipes.py checks that every field of every row agrees with
`Recipe.engine_fields()` here, so the two tables cannot drift apart. Adding an architecture is a row
in both, plus whatever graph pieces it needs (docs/adding-an-architecture.md).

Enumerations are strings, named as `bmoe archs` names them:

- `act`: "silu" | "gelu_tanh" (ggml's f16 table) | "swiglu_oai" (gpt-oss's clamped SwiGLU)
- `moe_layers`: "none" (dense) | "lead_dense" (leading_dense_block_count) | "by_router" (a block with
  ffn_gate_inp) | "all"
- `gating`: "softmax" | "sigmoid" | "softmax_selected" | None (the file must say: gating_keys "read")
- `gating_keys`: "fixed" (llama.cpp hard-codes gating, norm and scale; a contrary key is refused) |
  "read" | "func" (expert_gating_func read and required, norm and scale fixed)
- biases (`router_bias`, `expert_bias`, `qkv_bias`, `out_bias`): "none" (refused) | "optional" |
  "required"
- `shared_expert`: "none" | "ffn" (gemma4's sandwich) | "named" (dots1's ffn_*_shexp) | "gated"
  (ffn_*_shexp times sigmoid(ffn_gate_inp_shexp . h))
- `swa`: "none" | "required" (gemma4's per-layer pattern) | "periodic" (a pattern, a period or the
  recipe's `swa_period`); `swa_rope`: "own" (rope.freq_base_swa, default 10000, unscaled) | "global"
- `rope`: "neox"; `rope_scaling`: the rope.scaling.type values read ("linear", "yarn"); `rope_sections`:
  rope.dimension_sections read (interleaved M-RoPE)
- `mixer`: "attention" (every layer) | "delta_net" (qwen35moe: attention.recurrent_layers, else every
  full_attention_interval-th layer attends, the others are gated delta-net layers) | "shortconv"
  (lfm2moe: head_count_kv per layer, 0 = a short-convolution layer)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

Act = Literal["silu", "gelu_tanh", "swiglu_oai"]
MoeLayers = Literal["none", "lead_dense", "by_router", "all"]
Gating = Literal["softmax", "sigmoid", "softmax_selected"]
Bias = Literal["none", "optional", "required"]
Shexp = Literal["none", "ffn", "named", "gated"]
Mixer = Literal["attention", "delta_net", "shortconv"]
Swa = Literal["none", "required", "periodic"]

#: facts only the fixture generator needs (what llama.cpp's loader accepts, beyond what the engine computes)
GENERATOR_ONLY = ("no_gqa", "q_is_embd")

#: llama.cpp's expert_gating_func numbers
GATING_IDS: dict[str, int] = {"softmax": 1, "sigmoid": 2, "softmax_selected": 3}


@dataclass(frozen=True)
class Recipe:
    arch: str  # general.architecture
    # FFN
    act: Act = "silu"
    moe_layers: MoeLayers = "all"
    n_dense_lead: int = 0  # default leading_dense_block_count ("lead_dense")
    fused_gate_up: bool = False  # experts as ffn_gate_up_exps [d, 2f, E]
    # routing
    gating: Gating | None = None
    norm_w: bool = False  # default: normalise the selected weights
    gating_keys: Literal["fixed", "read", "func"] = "fixed"
    router_prescale: bool = False  # router input rmsnorm(x) / sqrt(d) * ffn_gate_inp.scale
    router_bias: Bias = "none"  # ffn_gate_inp.bias, added to the logits
    expert_bias: Bias = "none"  # ffn_{gate,up,down}_exps.bias, per expert
    shared_expert: Shexp = "none"
    expert_scale: Bias = "none"  # ffn_down_exps.scale [E]: expert e's output times scale[e]
    probs_bias: bool = False  # exp_probs_b.bias [E]: added to the probs for the selection only
    # mixers: which layers attend, which are recurrent
    mixer: Mixer = "attention"
    # attention
    qkv_bias: Bias = "none"
    out_bias: Bias = "none"
    attn_gate: bool = False  # attn_q holds each head's queries then its gate: output * sigmoid(gate)
    no_gqa: bool = False  # generator only: llama.cpp's loader sizes k and v by head_count (no GQA)
    q_is_embd: bool = False  # generator only: llama.cpp's loader sizes attn_q / attn_output [d, d]
    qk_norm: bool = False
    v_norm: bool = False  # v rms-normed per head, no weight
    v_from_k: bool = False  # attn_v may be absent: v is k's projection (before k's norm)
    attn_sinks: bool = False  # attn_sinks.weight [H]: an extra logit per head, no value
    attn_scale_one: bool = False  # scores q.k, not q.k / sqrt(hd)
    attn_scale_embd_at: int = 0  # at this layer count scores use 1/sqrt(d // n_head) (gemma3 27B)
    swa: Swa = "none"
    swa_period: int = 0  # "periodic" without a pattern key: layer il is global when il % period == period - 1
    swa_window_required: bool = False  # "periodic": attention.sliding_window required
    swa_rope: Literal["own", "global"] = "own"
    # RoPE
    rope: Literal["neox"] = "neox"
    full_rope: bool = False  # rope.dimension_count must equal key_length
    rope_freqs: bool = False  # rope_freqs.weight divides the global layers' frequencies
    rope_scaling: tuple[str, ...] = ()  # rope.scaling.type values read
    # norms and scales
    layer_scale: Bias = "none"  # layer_output_scale.weight [1]: the layer's output times it
    rope_sections: bool = False  # rope.dimension_sections required: interleaved M-RoPE (text positions)
    post_norms: bool = False  # post_attention_norm and the MoE norm sandwich
    ffn_norm: str = "ffn_norm"  # the FFN input norm's tensor (gpt-oss: post_attention_norm)
    output_norm: str = "output_norm"  # the output norm's tensor (lfm2moe: token_embd_norm)
    # embedding and output
    embd_scale: bool = False  # token embedding * sqrt(d)
    output_required: bool = False  # output.weight required (no tying)
    final_softcap: bool = False  # final_logit_softcapping is read ...
    softcap_default: float = 0.0  # ... and its value when absent

    @property
    def moe(self) -> bool:
        """llama.cpp's graph has routed experts."""
        return self.moe_layers != "none"

    @property
    def gating_id(self) -> int:
        """llama.cpp's expert_gating_func number of the default gating (0: none)."""
        return GATING_IDS[self.gating] if self.gating is not None else 0

    def engine_fields(self) -> dict[str, Any]:
        """The row as `bmoe archs` prints it (tuples as lists; without the generator-only fields)."""
        out = {k: v for k, v in asdict(self).items() if k not in GENERATOR_ONLY}
        out["rope_scaling"] = list(self.rope_scaling)
        return out


RECIPES: dict[str, Recipe] = {
    r.arch: r
    for r in (
        Recipe(
            arch="qwen3moe",
            act="silu",
            moe_layers="all",
            gating="softmax",
            norm_w=True,
            qkv_bias="optional",
            qk_norm=True,
            full_rope=True,
        ),
        Recipe(
            arch="gemma4",
            act="gelu_tanh",
            moe_layers="by_router",
            fused_gate_up=True,
            gating="softmax",
            norm_w=True,
            router_prescale=True,
            shared_expert="ffn",
            expert_scale="optional",
            qk_norm=True,
            v_norm=True,
            v_from_k=True,
            attn_scale_one=True,
            swa="required",
            rope_freqs=True,
            layer_scale="optional",
            post_norms=True,
            embd_scale=True,
            final_softcap=True,
            softcap_default=30.0,
        ),
        Recipe(
            arch="dots1",
            act="silu",
            moe_layers="lead_dense",
            gating_keys="read",
            shared_expert="named",
            no_gqa=True,
            qkv_bias="optional",
            qk_norm=True,
            full_rope=True,
            output_required=True,
        ),
        # dense: GELU FFN in every layer, local layers with their own RoPE base between global ones
        Recipe(
            arch="gemma3",
            act="gelu_tanh",
            moe_layers="none",
            gating="softmax",
            norm_w=True,
            qkv_bias="optional",
            qk_norm=True,
            attn_scale_embd_at=62,
            swa="periodic",
            swa_period=6,
            rope_scaling=("linear",),
            post_norms=True,
            embd_scale=True,
            final_softcap=True,
            softcap_default=0.0,
        ),
        # softmax without renormalisation, a shared expert scaled by a sigmoid gate, q/k/v biases
        Recipe(
            arch="qwen2moe",
            act="silu",
            moe_layers="all",
            gating="softmax",
            norm_w=False,
            shared_expert="gated",
            qkv_bias="optional",
            full_rope=True,
            output_required=True,
            q_is_embd=True,
        ),
        # router and per-expert biases, softmax over the selected logits, the clamped SwiGLU, attention
        # sinks and biases, alternating sliding-window and full layers sharing one RoPE, YaRN
        Recipe(
            arch="gpt-oss",
            act="swiglu_oai",
            moe_layers="all",
            gating="softmax_selected",
            norm_w=False,
            router_bias="required",
            expert_bias="required",
            qkv_bias="optional",
            out_bias="required",
            attn_sinks=True,
            swa="periodic",
            swa_period=2,
            swa_window_required=True,
            swa_rope="global",
            full_rope=True,
            rope_scaling=("linear", "yarn"),
            ffn_norm="post_attention_norm",
            output_required=True,
        ),
        # hybrid: gated delta-net layers between gated full-attention layers with partial interleaved
        # M-RoPE; post_attention_norm is the FFN's input norm; a sigmoid-gated shared expert
        Recipe(
            arch="qwen35moe",
            act="silu",
            moe_layers="all",
            gating="softmax",
            norm_w=True,
            shared_expert="gated",
            mixer="delta_net",
            qk_norm=True,
            attn_gate=True,
            rope_sections=True,
            ffn_norm="post_attention_norm",
        ),
        # hybrid: short-convolution layers where head_count_kv is 0; dense leading layers; the gating
        # function from the file, chosen by probs + exp_probs_b
        Recipe(
            arch="lfm2moe",
            act="silu",
            moe_layers="lead_dense",
            norm_w=True,
            gating_keys="func",
            probs_bias=True,
            mixer="shortconv",
            qk_norm=True,
            output_norm="token_embd_norm",
        ),
    )
}

#: the architectures, in table order
ARCHS: tuple[str, ...] = tuple(RECIPES)
#: the fields both tables have (`bmoe archs` prints these)
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Recipe) if f.name not in GENERATOR_ONLY)


def recipe(arch: str) -> Recipe:
    """The row of `arch`; KeyError names the known ones."""
    try:
        return RECIPES[arch]
    except KeyError:
        raise KeyError(f"{arch!r} has no recipe (known: {', '.join(ARCHS)})") from None
