/* Recipes and the gating table: the only place where architectures differ, and it is data. */
#include "arch.h"

#include <string.h>

static const bmoe_recipe RECIPES[] = {
    /* arch        act                 qk emb gating               norm fused shared            post dense
     *             gating keys              full-rope output router-prescale v-norm scale-1 rope-freqs swa
     *             softcap (default) moe swa-period wide-scale rope-scaling */
    { "qwen3moe", BMOE_ACT_SILU,      1, 0, BMOE_GATING_SOFTMAX, 1,   0,    BMOE_SHEXP_NONE,  0,   0,
                  BMOE_GATING_KEYS_FIXED,  1,        0,     0,              0,     0,      0,         BMOE_SWA_NONE,
                  0, 0.0,           1,  0,         0,         0,
                  BMOE_MIXER_ATTN, 0, 0, 0, NULL, NULL },
    { "gemma4",   BMOE_ACT_GELU_TANH, 1, 1, BMOE_GATING_SOFTMAX, 1,   1,    BMOE_SHEXP_FFN,   1,   0,
                  BMOE_GATING_KEYS_FIXED,  0,        0,     1,              1,     1,      1,         BMOE_SWA_REQUIRED,
                  1, 30.0,          1,  0,         0,         0,
                  BMOE_MIXER_ATTN, 0, 0, 0, NULL, NULL },
    { "dots1",    BMOE_ACT_SILU,      1, 0, 0,                   0,   0,    BMOE_SHEXP_NAMED, 0,   0,
                  BMOE_GATING_KEYS_READ,   1,        1,     0,              0,     0,      0,         BMOE_SWA_NONE,
                  0, 0.0,           1,  0,         0,         0,
                  BMOE_MIXER_ATTN, 0, 0, 0, NULL, NULL },
    /* dense: GELU FFN in every layer, local layers with their own RoPE base between global ones */
    { "gemma3",   BMOE_ACT_GELU_TANH, 1, 1, BMOE_GATING_SOFTMAX, 1,   0,    BMOE_SHEXP_NONE,  1,   0,
                  BMOE_GATING_KEYS_FIXED,  0,        0,     0,              0,     0,      0,         BMOE_SWA_PERIODIC,
                  1, 0.0,           0,  6,         62,        1,
                  BMOE_MIXER_ATTN, 0, 0, 0, NULL, NULL },
    /* hybrid: short-convolution layers where head_count_kv is 0, sigmoid routing chosen by probs + bias */
    { "lfm2moe",  BMOE_ACT_SILU,      1, 0, 0,                   1,   0,    BMOE_SHEXP_NONE,  0,   0,
                  BMOE_GATING_KEYS_FUNC,   0,        0,     0,              0,     0,      0,         BMOE_SWA_NONE,
                  0, 0.0,           1,  0,         0,         0,
                  BMOE_MIXER_SHORTCONV, 0, 0, 1, "token_embd_norm.weight", NULL },
    /* hybrid: gated delta-net layers between gated full-attention layers with M-RoPE; the FFN's norm is
     * post_attention_norm; a sigmoid-gated shared expert */
    { "qwen35moe", BMOE_ACT_SILU,     1, 0, BMOE_GATING_SOFTMAX, 1,   0,    BMOE_SHEXP_GATED, 0,   0,
                  BMOE_GATING_KEYS_FIXED,  0,        0,     0,              0,     0,      0,         BMOE_SWA_NONE,
                  0, 0.0,           1,  0,         0,         0,
                  BMOE_MIXER_DELTA_NET, 1, 1, 0, NULL, "post_attention_norm" },
};

static const bmoe_gating GATINGS[] = {
    /* id                          name                probs               w-softmax probs? */
    { BMOE_GATING_SOFTMAX,          "softmax",          BMOE_PROBS_SOFTMAX, 0,        1 },
    { BMOE_GATING_SIGMOID,          "sigmoid",          BMOE_PROBS_SIGMOID, 0,        0 },
    { BMOE_GATING_SOFTMAX_SELECTED, "softmax_selected", BMOE_PROBS_LOGITS,  1,        0 },
};

const bmoe_recipe *arch_recipe(const char *arch, unsigned long len) {
    for (size_t i = 0; i < sizeof RECIPES / sizeof RECIPES[0]; i++)
        if (strlen(RECIPES[i].arch) == len && memcmp(RECIPES[i].arch, arch, len) == 0) return &RECIPES[i];
    return NULL;
}

const bmoe_gating *arch_gating(int id) {
    for (size_t i = 0; i < sizeof GATINGS / sizeof GATINGS[0]; i++)
        if (GATINGS[i].id == id) return &GATINGS[i];
    return NULL;
}

char *arch_known(char *buf, unsigned long n) {
    size_t used = 0;
    if (n == 0) return buf;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof RECIPES / sizeof RECIPES[0]; i++) {
        size_t l = strlen(RECIPES[i].arch) + (i ? 2 : 0);
        if (used + l + 1 > n) break;
        if (i) memcpy(buf + used, ", ", 2);
        memcpy(buf + used + (i ? 2 : 0), RECIPES[i].arch, strlen(RECIPES[i].arch) + 1);
        used += l;
    }
    return buf;
}

const char *arch_act_name(bmoe_act a) { return a == BMOE_ACT_SILU ? "silu" : "gelu_tanh"; }
