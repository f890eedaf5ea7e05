/* Architecture recipes and the gating table, as data.
 *
 * A recipe is one row with named fields (designated initializers, as llama.cpp's llama-arch.cpp maps
 * its names) describing how an architecture wires the common forward pass of docs/model-math.md: the
 * FFN and its activation, routing (gating, normalisation, biases, shared expert and its gate),
 * attention (biases, norms, sinks, which layers slide and how), RoPE, the output (tied, soft-capped)
 * and the token embedding's scale. The loader and the forward pass read fields of the row; they never
 * test an architecture's name. Adding an architecture is adding a row, plus the graph pieces it needs
 * when no field says what it does (docs/adding-an-architecture.md).
 *
 * The Python side (src/bmoe_ci/recipes.py) holds the same rows; `bmoe archs` prints this table as JSON
 * and tests/test_recipes.py checks that the two agree field by field. A field left out of a row is 0:
 * every field's 0 is the plain choice (none, off, not read). */
#ifndef BMOE_ARCH_H
#define BMOE_ARCH_H

struct json_writer;

/* The expert (and dense) FFN's gated activation: out = act(gate) * up, or swiglu_oai's clamped form. */
typedef enum {
    BMOE_ACT_SILU = 0,       /* silu(g) * u */
    BMOE_ACT_GELU_TANH = 1,  /* gelu(g) * u through ggml's f16 table */
    BMOE_ACT_SWIGLU_OAI = 2, /* gpt-oss: g' = min(g, 7), u' = clamp(u, -7, 7), g' sigmoid(1.702 g') (u' + 1) */
} bmoe_act;

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

/* Whether the gating keys are part of the architecture in llama.cpp. */
typedef enum {
    BMOE_GATING_KEYS_FIXED = 0,    /* llama.cpp's graph hard-codes the recipe's gating, norm and scale 1:
                                    * a file whose keys say otherwise is refused, never silently ignored */
    BMOE_GATING_KEYS_READ = 1,     /* read; expert_gating_func is required (llama.cpp aborts without one),
                                    * expert_weights_norm defaults to false, expert_weights_scale 0 means 1 */
    BMOE_GATING_KEYS_FUNC = 2,     /* expert_gating_func is read (and required); the norm and the scale are
                                    * the recipe's, fixed as with BMOE_GATING_KEYS_FIXED (lfm2moe) */
} bmoe_gating_keys;

/* Which blocks have routed experts. */
typedef enum {
    BMOE_MOE_NONE = 0,       /* dense architecture: no router, the expert keys are not read, a router
                              * tensor is refused */
    BMOE_MOE_LEAD_DENSE = 1, /* blocks below leading_dense_block_count are dense, the rest MoE (dots1) */
    BMOE_MOE_BY_ROUTER = 2,  /* a block is MoE when it has ffn_gate_inp (gemma4) */
    BMOE_MOE_ALL = 3,        /* every block is MoE: a block without ffn_gate_inp is refused */
} bmoe_moe_layers;

/* Where the shared expert lives. */
typedef enum {
    BMOE_SHEXP_NONE = 0,
    BMOE_SHEXP_FFN = 1,     /* ffn_gate/up/down of feed_forward_length, in the norm sandwich (gemma4) */
    BMOE_SHEXP_NAMED = 2,   /* ffn_gate/up/down_shexp of expert_feed_forward_length x expert_shared_count,
                             * added to the routed sum (dots1) */
    BMOE_SHEXP_GATED = 3,   /* ffn_gate/up/down_shexp of expert_shared_feed_forward_length (default
                             * feed_forward_length), times sigmoid(ffn_gate_inp_shexp . h), added (qwen2moe) */
} bmoe_shexp;

/* A bias tensor's place in the architecture (llama.cpp's create_tensor flags). */
typedef enum {
    BMOE_BIAS_NONE = 0,      /* not part of llama.cpp's graph: a file that has it is refused */
    BMOE_BIAS_OPTIONAL = 1,  /* added when the file has it */
    BMOE_BIAS_REQUIRED = 2,  /* the file must have it */
} bmoe_bias;

/* Sliding-window attention: a local layer's position p sees keys p - n_swa + 1 .. p. */
typedef enum {
    BMOE_SWA_NONE = 0,      /* every layer global; the keys are not read */
    BMOE_SWA_REQUIRED = 1,  /* gemma4: sliding_window, a per-layer sliding_window_pattern and the _swa head
                             * sizes are required */
    BMOE_SWA_PERIODIC = 2,  /* sliding_window_pattern is a per-layer array, a period, or absent (swa_period);
                             * sliding_window optional (absent or 0: every layer global) unless
                             * swa_window_required */
} bmoe_swa;

/* The RoPE of a sliding-window layer. */
typedef enum {
    BMOE_SWA_ROPE_OWN = 0,    /* rope.freq_base_swa (default 10000), never scaled, no rope_freqs */
    BMOE_SWA_ROPE_GLOBAL = 1, /* rope.freq_base_swa defaults to rope.freq_base; scaled as the global layers */
} bmoe_swa_rope;

/* How a RoPE pair is formed. */
typedef enum {
    BMOE_ROPE_NEOX = 0,     /* (v[j], v[j + n_rot/2]) */
} bmoe_rope;

/* RoPE scaling types an architecture reads (rope.scaling.type), a bit each; 0: the keys are not read. */
enum { BMOE_ROPE_SCALING_LINEAR = 1, BMOE_ROPE_SCALING_YARN = 2 };

/* Which layers mix positions recurrently instead of attending (bmoe_layer_kind in model.h). */
typedef enum {
    BMOE_MIXER_ATTN = 0,       /* every layer attends */
    BMOE_MIXER_DELTA_NET = 1,  /* qwen35moe: attention.recurrent_layers (per layer), else every
                                * full_attention_interval-th layer (default 4) attends and the others are
                                * gated delta-net layers */
    BMOE_MIXER_SHORTCONV = 2,  /* lfm2moe: attention.head_count_kv per layer, 0 = a short-convolution layer */
} bmoe_mixer;

typedef struct bmoe_recipe {
    const char *arch;       /* general.architecture */

    /* FFN */
    bmoe_act act;
    bmoe_moe_layers moe_layers;
    int n_dense_lead;       /* default leading_dense_block_count */
    int fused_gate_up;      /* experts as ffn_gate_up_exps [d, 2f, E] instead of gate + up */

    /* routing */
    int gating;             /* default bmoe_gating_id (0: none, the file must say) */
    int norm_w;             /* default: normalise the selected weights */
    bmoe_gating_keys gating_keys; /* how llama.cpp's graph reads expert_gating_func / _weights_norm / _scale */
    int router_prescale;    /* the router reads rmsnorm(x) / sqrt(d) * ffn_gate_inp.scale (not ffn_norm's h) */
    bmoe_bias router_bias;  /* ffn_gate_inp.bias [E], added to the router logits */
    bmoe_bias expert_bias;  /* ffn_gate_exps.bias / ffn_up_exps.bias [f, E], ffn_down_exps.bias [d, E] */
    bmoe_shexp shared_expert; /* a resident shared expert beside the routed ones, its names and its gate */
    bmoe_bias expert_scale; /* ffn_down_exps.scale [E]: expert e's output times scale[e] (gemma4) */
    int probs_bias;         /* exp_probs_b.bias [E] on every MoE layer: added to the probs for the selection
                             * only, the weights stay the unbiased probs (lfm2moe) */

    /* mixers: which layers attend and which are recurrent (docs/model-math.md, "Hybrid architectures") */
    int mixer;              /* bmoe_mixer */

    /* attention */
    bmoe_bias qkv_bias;     /* attn_q.bias, attn_k.bias, attn_v.bias */
    int attn_gate;          /* attn_q holds each head's queries then as many gate values: the head's output
                             * is multiplied by sigmoid(gate) before attn_output (qwen35moe) */
    bmoe_bias out_bias;     /* attn_output.bias */
    int qk_norm;            /* attn_q_norm / attn_k_norm per head (required) */
    int v_norm;             /* v is RMS-normed per head, without a weight */
    int v_from_k;           /* attn_v may be absent: v is then k's projection (before k's norm; gemma4) */
    int attn_sinks;         /* attn_sinks.weight [H]: one extra logit per head in the softmax, no value */
    int attn_scale_one;     /* attention scores are q.k (no 1/sqrt(head dim)) */
    int attn_scale_embd_at; /* at this block_count the scores are scaled by 1/sqrt(n_embd / n_head) instead
                             * of 1/sqrt(head dim) (llama.cpp's gemma3 27B); 0: never */
    bmoe_swa swa;           /* which layers are sliding-window (local) and the keys that say so */
    int swa_period;         /* BMOE_SWA_PERIODIC: every swa_period-th layer is global when the file gives no
                             * pattern (llama.cpp's default for the architecture) */
    int swa_window_required; /* BMOE_SWA_PERIODIC: attention.sliding_window must be present and > 0 */
    bmoe_swa_rope swa_rope; /* how a sliding-window layer rotates */

    /* RoPE */
    bmoe_rope rope;
    int full_rope;          /* rope.dimension_count must equal attention.key_length (llama.cpp asserts it) */
    int rope_freqs;         /* rope_freqs.weight [head dim / 2] divides the global layers' frequencies */
    unsigned rope_scaling;  /* BMOE_ROPE_SCALING_* bits: rope.scaling.type / .factor are read */
    int rope_sections;      /* rope.dimension_sections is required: interleaved M-RoPE, for text positions a
                             * pair rotates unless it falls in the extra sector (qwen35moe) */

    /* norms and scales */
    bmoe_bias layer_scale;  /* layer_output_scale.weight [1]: the layer's output (the residual) times it */
    int post_norms;         /* post_attention_norm and the MoE norm sandwich (required) */
    const char *ffn_norm;   /* the FFN input norm's tensor (NULL: "ffn_norm"; gpt-oss "post_attention_norm") */
    const char *output_norm; /* the output norm's tensor (NULL: "output_norm"; lfm2moe "token_embd_norm") */

    /* embedding and output */
    int embd_scale;         /* token embedding multiplied by sqrt(d) */
    int output_required;    /* output.weight must be present (no tying to token_embd) */
    int final_softcap;      /* final_logit_softcapping is read (0: never soft-capped) ... */
    double softcap_default; /* ... and its value when the key is absent (llama.cpp: gemma4 30, gemma3 0 = none) */
} bmoe_recipe;

/* NULL when the architecture has no recipe. */
const bmoe_recipe *arch_recipe(const char *arch, unsigned long len);
/* The rows in table order: i in [0, arch_count()). */
int arch_count(void);
const bmoe_recipe *arch_at(int i);
/* NULL for an unknown gating id (0 is not a gating: the caller maps it to the recipe's default). */
const bmoe_gating *arch_gating(int id);
/* Writes the comma-separated names of every recipe into buf (for error messages); returns buf. */
char *arch_known(char *buf, unsigned long n);
const char *arch_act_name(bmoe_act a);
/* The FFN input norm's tensor name ("ffn_norm" unless the recipe names another). */
const char *arch_ffn_norm(const bmoe_recipe *r);
/* The output norm's tensor name without ".weight". */
const char *arch_output_norm(const bmoe_recipe *r);
/* The row as a JSON object: every field by name, enums by name (`bmoe archs`). */
void arch_write_json(struct json_writer *w, const bmoe_recipe *r);

#endif
