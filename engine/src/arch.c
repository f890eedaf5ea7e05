/* Recipes and the gating table: the only place where architectures differ, and it is data.
 * Each row names its fields; a field left out is 0, the plain choice (arch.h). The rows follow what
 * llama.cpp's loader and graph do for the architecture (src/models/<arch>.cpp of the llama.cpp that
 * llama-cpp-python 0.3.36 vendors); src/bmoe_ci/recipes.py holds the same rows for the reference and
 * the fixture generator (tests/test_recipes.py compares them through `bmoe archs`). */
#include "arch.h"

#include <string.h>

#include "json.h"

static const bmoe_recipe RECIPES[] = {
    {
        .arch = "qwen3moe",
        .act = BMOE_ACT_SILU,
        .moe_layers = BMOE_MOE_ALL,
        .gating = BMOE_GATING_SOFTMAX,
        .norm_w = 1,
        .gating_keys = BMOE_GATING_KEYS_FIXED,
        .qkv_bias = BMOE_BIAS_OPTIONAL,
        .qk_norm = 1,
        .full_rope = 1,
    },
    {
        .arch = "gemma4",
        .act = BMOE_ACT_GELU_TANH,
        .moe_layers = BMOE_MOE_BY_ROUTER,
        .fused_gate_up = 1,
        .gating = BMOE_GATING_SOFTMAX,
        .norm_w = 1,
        .gating_keys = BMOE_GATING_KEYS_FIXED,
        .router_prescale = 1,
        .shared_expert = BMOE_SHEXP_FFN,
        .expert_scale = BMOE_BIAS_OPTIONAL,
        .qk_norm = 1,
        .v_norm = 1,
        .v_from_k = 1,
        .attn_scale_one = 1,
        .swa = BMOE_SWA_REQUIRED,
        .rope_freqs = 1,
        .layer_scale = BMOE_BIAS_OPTIONAL,
        .post_norms = 1,
        .embd_scale = 1,
        .final_softcap = 1,
        .softcap_default = 30.0,
    },
    {
        .arch = "dots1",
        .act = BMOE_ACT_SILU,
        .moe_layers = BMOE_MOE_LEAD_DENSE,
        .gating_keys = BMOE_GATING_KEYS_READ,
        .shared_expert = BMOE_SHEXP_NAMED,
        .qkv_bias = BMOE_BIAS_OPTIONAL,
        .qk_norm = 1,
        .full_rope = 1,
        .output_required = 1,
    },
    {
        /* dense: GELU FFN in every layer, local layers with their own RoPE base between global ones */
        .arch = "gemma3",
        .act = BMOE_ACT_GELU_TANH,
        .moe_layers = BMOE_MOE_NONE,
        .gating = BMOE_GATING_SOFTMAX,
        .norm_w = 1,
        .gating_keys = BMOE_GATING_KEYS_FIXED,
        .qkv_bias = BMOE_BIAS_OPTIONAL,
        .qk_norm = 1,
        .attn_scale_embd_at = 62,
        .swa = BMOE_SWA_PERIODIC,
        .swa_period = 6,
        .rope_scaling = BMOE_ROPE_SCALING_LINEAR,
        .post_norms = 1,
        .embd_scale = 1,
        .final_softcap = 1,
        .softcap_default = 0.0,
    },
    {
        /* src/models/qwen2moe.cpp: softmax without renormalisation, a shared expert scaled by a sigmoid
         * gate, q/k/v biases, no q/k norms, output never tied */
        .arch = "qwen2moe",
        .act = BMOE_ACT_SILU,
        .moe_layers = BMOE_MOE_ALL,
        .gating = BMOE_GATING_SOFTMAX,
        .norm_w = 0,
        .gating_keys = BMOE_GATING_KEYS_FIXED,
        .shared_expert = BMOE_SHEXP_GATED,
        .qkv_bias = BMOE_BIAS_OPTIONAL,
        .full_rope = 1,
        .output_required = 1,
    },
    {
        /* src/models/openai-moe.cpp: router and per-expert biases, softmax over the selected logits, the
         * clamped SwiGLU, attention sinks and biases, alternating sliding-window (even) and full (odd)
         * layers that share one RoPE, YaRN; the FFN norm is named post_attention_norm */
        .arch = "gpt-oss",
        .act = BMOE_ACT_SWIGLU_OAI,
        .moe_layers = BMOE_MOE_ALL,
        .gating = BMOE_GATING_SOFTMAX_SELECTED,
        .norm_w = 0,
        .gating_keys = BMOE_GATING_KEYS_FIXED,
        .router_bias = BMOE_BIAS_REQUIRED,
        .expert_bias = BMOE_BIAS_REQUIRED,
        .qkv_bias = BMOE_BIAS_OPTIONAL,
        .out_bias = BMOE_BIAS_REQUIRED,
        .attn_sinks = 1,
        .swa = BMOE_SWA_PERIODIC,
        .swa_period = 2,
        .swa_window_required = 1,
        .swa_rope = BMOE_SWA_ROPE_GLOBAL,
        .full_rope = 1,
        .rope_scaling = BMOE_ROPE_SCALING_LINEAR | BMOE_ROPE_SCALING_YARN,
        .ffn_norm = "post_attention_norm",
        .output_required = 1,
    },
    {
        /* hybrid: gated delta-net layers between gated full-attention layers (every
         * full_attention_interval-th) with partial interleaved M-RoPE; post_attention_norm is the FFN's
         * input norm; a sigmoid-gated shared expert */
        .arch = "qwen35moe",
        .act = BMOE_ACT_SILU,
        .moe_layers = BMOE_MOE_ALL,
        .gating = BMOE_GATING_SOFTMAX,
        .norm_w = 1,
        .gating_keys = BMOE_GATING_KEYS_FIXED,
        .shared_expert = BMOE_SHEXP_GATED,
        .mixer = BMOE_MIXER_DELTA_NET,
        .qk_norm = 1,
        .attn_gate = 1,
        .rope_sections = 1,
        .ffn_norm = "post_attention_norm",
    },
    {
        /* hybrid: short-convolution layers where head_count_kv is 0, attention layers elsewhere; dense
         * leading layers; sigmoid routing (the function from the file) chosen by probs + exp_probs_b */
        .arch = "lfm2moe",
        .act = BMOE_ACT_SILU,
        .moe_layers = BMOE_MOE_LEAD_DENSE,
        .norm_w = 1,
        .gating_keys = BMOE_GATING_KEYS_FUNC,
        .probs_bias = 1,
        .mixer = BMOE_MIXER_SHORTCONV,
        .qk_norm = 1,
        .output_norm = "token_embd_norm",
    },
};

#define N_RECIPES ((int)(sizeof RECIPES / sizeof RECIPES[0]))

static const bmoe_gating GATINGS[] = {
    /* id                          name                probs               w-softmax probs? */
    { BMOE_GATING_SOFTMAX,          "softmax",          BMOE_PROBS_SOFTMAX, 0,        1 },
    { BMOE_GATING_SIGMOID,          "sigmoid",          BMOE_PROBS_SIGMOID, 0,        0 },
    { BMOE_GATING_SOFTMAX_SELECTED, "softmax_selected", BMOE_PROBS_LOGITS,  1,        0 },
};

const bmoe_recipe *arch_recipe(const char *arch, unsigned long len) {
    for (int i = 0; i < N_RECIPES; i++)
        if (strlen(RECIPES[i].arch) == len && memcmp(RECIPES[i].arch, arch, len) == 0) return &RECIPES[i];
    return NULL;
}

int arch_count(void) { return N_RECIPES; }

const bmoe_recipe *arch_at(int i) { return i >= 0 && i < N_RECIPES ? &RECIPES[i] : NULL; }

const bmoe_gating *arch_gating(int id) {
    for (size_t i = 0; i < sizeof GATINGS / sizeof GATINGS[0]; i++)
        if (GATINGS[i].id == id) return &GATINGS[i];
    return NULL;
}

char *arch_known(char *buf, unsigned long n) {
    size_t used = 0;
    if (n == 0) return buf;
    buf[0] = 0;
    for (int i = 0; i < N_RECIPES; i++) {
        size_t l = strlen(RECIPES[i].arch) + (i ? 2 : 0);
        if (used + l + 1 > n) break;
        if (i) memcpy(buf + used, ", ", 2);
        memcpy(buf + used + (i ? 2 : 0), RECIPES[i].arch, strlen(RECIPES[i].arch) + 1);
        used += l;
    }
    return buf;
}

const char *arch_act_name(bmoe_act a) {
    switch (a) {
    case BMOE_ACT_SILU: return "silu";
    case BMOE_ACT_GELU_TANH: return "gelu_tanh";
    case BMOE_ACT_SWIGLU_OAI: return "swiglu_oai";
    }
    return "?";
}

const char *arch_ffn_norm(const bmoe_recipe *r) { return r->ffn_norm ? r->ffn_norm : "ffn_norm"; }

const char *arch_output_norm(const bmoe_recipe *r) { return r->output_norm ? r->output_norm : "output_norm"; }

/* ---- the row as JSON: enum values by the names src/bmoe_ci/recipes.py uses ---------------------- */

static const char *moe_layers_name(bmoe_moe_layers v) {
    static const char *const n[] = { "none", "lead_dense", "by_router", "all" };
    return (unsigned)v < sizeof n / sizeof n[0] ? n[v] : "?";
}

static const char *shexp_name(bmoe_shexp v) {
    static const char *const n[] = { "none", "ffn", "named", "gated" };
    return (unsigned)v < sizeof n / sizeof n[0] ? n[v] : "?";
}

static const char *bias_name(bmoe_bias v) {
    static const char *const n[] = { "none", "optional", "required" };
    return (unsigned)v < sizeof n / sizeof n[0] ? n[v] : "?";
}

static const char *swa_name(bmoe_swa v) {
    static const char *const n[] = { "none", "required", "periodic" };
    return (unsigned)v < sizeof n / sizeof n[0] ? n[v] : "?";
}

static const char *swa_rope_name(bmoe_swa_rope v) { return v == BMOE_SWA_ROPE_GLOBAL ? "global" : "own"; }

static const char *rope_name(bmoe_rope v) { return v == BMOE_ROPE_NEOX ? "neox" : "?"; }

static const char *gating_keys_name(bmoe_gating_keys v) {
    return v == BMOE_GATING_KEYS_READ ? "read" : v == BMOE_GATING_KEYS_FUNC ? "func" : "fixed";
}

static const char *mixer_name(bmoe_mixer v) {
    static const char *const n[] = { "attention", "delta_net", "shortconv" };
    return (unsigned)v < sizeof n / sizeof n[0] ? n[v] : "?";
}

void arch_write_json(json_writer *w, const bmoe_recipe *r) {
    const bmoe_gating *g = arch_gating(r->gating);
    json_begin_object(w, NULL);
    json_str(w, "arch", r->arch);
    json_str(w, "act", arch_act_name(r->act));
    json_str(w, "moe_layers", moe_layers_name(r->moe_layers));
    json_int(w, "n_dense_lead", r->n_dense_lead);
    json_bool(w, "fused_gate_up", r->fused_gate_up);
    if (g) json_str(w, "gating", g->name);
    else json_null(w, "gating");
    json_bool(w, "norm_w", r->norm_w);
    json_str(w, "gating_keys", gating_keys_name(r->gating_keys));
    json_bool(w, "router_prescale", r->router_prescale);
    json_str(w, "router_bias", bias_name(r->router_bias));
    json_str(w, "expert_bias", bias_name(r->expert_bias));
    json_str(w, "shared_expert", shexp_name(r->shared_expert));
    json_str(w, "expert_scale", bias_name(r->expert_scale));
    json_bool(w, "probs_bias", r->probs_bias);
    json_str(w, "mixer", mixer_name(r->mixer));
    json_str(w, "qkv_bias", bias_name(r->qkv_bias));
    json_str(w, "out_bias", bias_name(r->out_bias));
    json_bool(w, "attn_gate", r->attn_gate);
    json_bool(w, "qk_norm", r->qk_norm);
    json_bool(w, "v_norm", r->v_norm);
    json_bool(w, "v_from_k", r->v_from_k);
    json_bool(w, "attn_sinks", r->attn_sinks);
    json_bool(w, "attn_scale_one", r->attn_scale_one);
    json_int(w, "attn_scale_embd_at", r->attn_scale_embd_at);
    json_str(w, "swa", swa_name(r->swa));
    json_int(w, "swa_period", r->swa_period);
    json_bool(w, "swa_window_required", r->swa_window_required);
    json_str(w, "swa_rope", swa_rope_name(r->swa_rope));
    json_str(w, "rope", rope_name(r->rope));
    json_bool(w, "full_rope", r->full_rope);
    json_bool(w, "rope_freqs", r->rope_freqs);
    json_begin_array(w, "rope_scaling");
    if (r->rope_scaling & BMOE_ROPE_SCALING_LINEAR) json_str(w, NULL, "linear");
    if (r->rope_scaling & BMOE_ROPE_SCALING_YARN) json_str(w, NULL, "yarn");
    json_end_array(w);
    json_str(w, "layer_scale", bias_name(r->layer_scale));
    json_bool(w, "rope_sections", r->rope_sections);
    json_bool(w, "post_norms", r->post_norms);
    json_str(w, "ffn_norm", arch_ffn_norm(r));
    json_str(w, "output_norm", arch_output_norm(r));
    json_bool(w, "embd_scale", r->embd_scale);
    json_bool(w, "output_required", r->output_required);
    json_bool(w, "final_softcap", r->final_softcap);
    json_num(w, "softcap_default", r->softcap_default);
    json_end_object(w);
}
