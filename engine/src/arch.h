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
    int shared_expert;      /* bmoe_shexp: a resident shared expert beside the routed ones, and its names */
    int post_norms;         /* post_attention_norm and the MoE norm sandwich (required) */
    int n_dense_lead;       /* default leading_dense_block_count */
    /* How llama.cpp's graph for the architecture reads the file (llama.cpp src/models/<arch>.cpp): */
    int gating_keys;        /* bmoe_gating_keys: are expert_gating_func / _weights_norm / _weights_scale read? */
    int full_rope;          /* rope.dimension_count must equal attention.key_length (llama.cpp asserts it) */
    int output_required;    /* output.weight must be present (no tying to token_embd) */
    int router_prescale;    /* the router reads rmsnorm(x) / sqrt(d) * ffn_gate_inp.scale (not ffn_norm's h) */
    int v_norm;             /* v is RMS-normed per head, without a weight */
    int attn_scale_one;     /* attention scores are q.k (no 1/sqrt(head dim)) */
    int rope_freqs;         /* rope_freqs.weight [head dim / 2] divides the RoPE frequencies (required) */
    int swa;                /* bmoe_swa: how the sliding-window (local) layers are told apart from global ones */
    int final_softcap;      /* final_logit_softcapping is read (0: never soft-capped) ... */
    double softcap_default; /* ... and its value when the key is absent (llama.cpp: gemma4 30, gemma3 0 = none) */
    int moe;                /* llama.cpp's graph has routed experts; 0: every layer is dense, the expert keys
                             * are not read and a router tensor is refused */
    int swa_period;         /* BMOE_SWA_PERIODIC: every swa_period-th layer is global when the file gives
                             * no pattern (llama.cpp's default for the architecture) */
    int attn_scale_embd_at; /* at this block_count the scores are scaled by 1/sqrt(n_embd / n_head) instead
                             * of 1/sqrt(head dim) (llama.cpp's gemma3 27B); 0: never */
    int rope_scaling;       /* rope.scaling.type / .factor are read: linear scaling of the global layers */
    /* hybrid architectures (docs/model-math.md, "Hybrid architectures") */
    int mixer;              /* bmoe_mixer: which layers are recurrent, and how the file says so */
    int attn_gate;          /* attn_q holds each head's queries then as many gate values: the head's output
                             * is multiplied by sigmoid(gate) before attn_output */
    int rope_sections;      /* rope.dimension_sections is required: interleaved M-RoPE (text positions) */
    int probs_bias;         /* exp_probs_b.bias [E] on every MoE layer: added to the probs for the selection
                             * only, the weights stay the unbiased probs */
    const char *output_norm; /* the output norm tensor's full name; NULL: output_norm.weight */
    const char *ffn_norm;   /* the FFN input norm of a layer (blk.N.<this>.weight); NULL: ffn_norm */
} bmoe_recipe;

/* Which layers mix positions recurrently instead of attending (bmoe_layer_kind in model.h). */
typedef enum {
    BMOE_MIXER_ATTN = 0,       /* every layer attends */
    BMOE_MIXER_DELTA_NET = 1,  /* qwen35moe: attention.recurrent_layers (per layer), else every
                                * full_attention_interval-th layer (default 4) attends and the others are
                                * gated delta-net layers */
    BMOE_MIXER_SHORTCONV = 2,  /* lfm2moe: attention.head_count_kv per layer, 0 = a short-convolution layer */
} bmoe_mixer;

/* Sliding-window attention: a local layer's position p sees keys p - n_swa + 1 .. p. */
typedef enum {
    BMOE_SWA_NONE = 0,      /* every layer global; the keys are not read */
    BMOE_SWA_REQUIRED = 1,  /* gemma4: sliding_window, a per-layer sliding_window_pattern and the _swa head
                             * sizes are required */
    BMOE_SWA_PERIODIC = 2,  /* gemma3: sliding_window optional (absent or 0: every layer global);
                             * sliding_window_pattern is a per-layer array, a period, or absent (swa_period) */
} bmoe_swa;

/* Where the shared expert lives. */
typedef enum {
    BMOE_SHEXP_NONE = 0,
    BMOE_SHEXP_FFN = 1,     /* ffn_gate/up/down of feed_forward_length, in the norm sandwich (gemma4) */
    BMOE_SHEXP_NAMED = 2,   /* ffn_gate/up/down_shexp of expert_feed_forward_length x expert_shared_count,
                             * added to the routed sum (dots1) */
    BMOE_SHEXP_GATED = 3,   /* ffn_gate/up/down_shexp of expert_shared_feed_forward_length (default
                             * feed_forward_length), times sigmoid(ffn_gate_inp_shexp . h), added (qwen35moe) */
} bmoe_shexp;

/* Whether the gating keys are part of the architecture in llama.cpp. */
typedef enum {
    BMOE_GATING_KEYS_FIXED = 0,    /* llama.cpp's graph hard-codes the recipe's gating, norm and scale 1:
                                    * a file whose keys say otherwise is refused, never silently ignored */
    BMOE_GATING_KEYS_READ = 1,     /* read; expert_gating_func is required (llama.cpp aborts without one),
                                    * expert_weights_norm defaults to false, expert_weights_scale 0 means 1 */
    BMOE_GATING_KEYS_FUNC = 2,     /* expert_gating_func is read (and required); the norm and the scale are
                                    * the recipe's, fixed as with BMOE_GATING_KEYS_FIXED (lfm2moe) */
} bmoe_gating_keys;

/* NULL when the architecture has no recipe. */
const bmoe_recipe *arch_recipe(const char *arch, unsigned long len);
/* NULL for an unknown gating id (0 is not a gating: the caller maps it to the recipe's default). */
const bmoe_gating *arch_gating(int id);
/* Writes the comma-separated names of every recipe into buf (for error messages); returns buf. */
char *arch_known(char *buf, unsigned long n);
const char *arch_act_name(bmoe_act a);

#endif
