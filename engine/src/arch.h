/* Architecture recipes and the gating table, as data.
 *
 * A recipe is one row describing how an architecture wires the common forward pass of
 * docs/model-math.md: activation, q/k norm, embedding scale, gating defaults, the fused gate+up
 * expert tensor, the shared expert and the norm sandwich. The forward pass reads flags from the
 * row; it never tests an architecture's name. Adding an architecture that fits the template is
 * adding a row. */
#ifndef BMOE_ARCH_H
#define BMOE_ARCH_H

typedef enum { BMOE_ACT_SILU = 0, BMOE_ACT_GELU_TANH = 1 } bmoe_act;

/* llama.cpp's expert_gating_func numbering (0 = "none": use the recipe's default). */
typedef enum { BMOE_GATING_SOFTMAX = 1, BMOE_GATING_SIGMOID = 2, BMOE_GATING_SOFTMAX_SELECTED = 3 } bmoe_gating_id;

/* What the router's probs node holds, per gating. */
typedef enum { BMOE_PROBS_SOFTMAX = 0, BMOE_PROBS_SIGMOID = 1, BMOE_PROBS_LOGITS = 2 } bmoe_probs_kind;

typedef struct bmoe_gating {
    int id;                 /* bmoe_gating_id */
    const char *name;       /* "softmax", "sigmoid", "softmax_selected" */
    bmoe_probs_kind probs;  /* how ffn_moe_probs is computed from the logits */
    int weights_softmax;    /* softmax over the selected weights (ffn_moe_weights_softmax) */
    int scores_are_probs;   /* the sorted tensor holds softmax probabilities (rank in log space) */
} bmoe_gating;

typedef struct bmoe_recipe {
    const char *arch;       /* general.architecture */
    bmoe_act act;
    int qk_norm;            /* attn_q_norm / attn_k_norm per head (required) */
    int embd_scale;         /* token embedding multiplied by sqrt(d) */
    int gating;             /* default bmoe_gating_id */
    int norm_w;             /* default: normalise the selected weights */
    int fused_gate_up;      /* experts as ffn_gate_up_exps [d, 2f, E] instead of gate + up */
    int shared_expert;      /* a resident shared expert (ffn_gate/up/down) beside the routed ones */
    int post_norms;         /* post_attention_norm and the MoE norm sandwich (required) */
    int n_dense_lead;       /* default leading_dense_block_count */
} bmoe_recipe;

/* NULL when the architecture has no recipe. */
const bmoe_recipe *arch_recipe(const char *arch, unsigned long len);
/* NULL for an unknown gating id (0 is not a gating: the caller maps it to the recipe's default). */
const bmoe_gating *arch_gating(int id);
/* Writes the comma-separated names of every recipe into buf (for error messages); returns buf. */
char *arch_known(char *buf, unsigned long n);
const char *arch_act_name(bmoe_act a);

#endif
