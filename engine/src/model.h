/* A loaded model: hyperparameters, the recipe, every tensor bound by its llama.cpp name and checked
 * against the hyperparameters, the shard mappings, and the per-expert layout the streamer needs.
 *
 * Every problem found while loading is an error (exit code 3 for a malformed model, 4 for an I/O
 * failure) whose message names the file and the tensor or key. */
#ifndef BMOE_MODEL_H
#define BMOE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "arch.h"
#include "gguf.h"

/* A weight matrix as the matmuls read it: ne[1] rows (ne[2] experts) of ne[0] elements. */
typedef struct bmoe_weight {
    const gguf_tensor *t;    /* NULL when absent */
    const uint8_t *data;     /* shard mapping + offset; NULL when absent or the model is not mapped */
    uint32_t type;
    uint64_t ne[3];
    uint64_t row_bytes;
} bmoe_weight;

/* The parts of an expert, in the order they are listed everywhere (views, trace, layout). */
enum { BMOE_EXP_GATE = 0, BMOE_EXP_UP, BMOE_EXP_GATE_UP, BMOE_EXP_DOWN, BMOE_EXP_NPARTS };

/* One expert tensor of one MoE layer. Expert e is bytes [offset + e*stride, offset + e*stride + bytes)
 * of shard `shard`; stride == bytes (the experts are the contiguous slices of the last dimension). */
typedef struct bmoe_expert_part {
    int present;
    char name[64];           /* full tensor name, e.g. blk.3.ffn_up_exps.weight */
    uint32_t shard;
    uint64_t offset;         /* absolute file offset of expert 0 */
    uint64_t stride;
    uint64_t bytes;
    uint32_t type;
    uint64_t n_in, n_out;    /* ne[0], ne[1] of one expert */
    uint64_t row_bytes;
} bmoe_expert_part;

/* What a layer mixes positions with (docs/model-math.md, "Hybrid architectures"). */
typedef enum {
    BMOE_LAYER_ATTN = 0,      /* attention over the KV cache */
    BMOE_LAYER_DELTA = 1,     /* qwen35moe's gated delta-net (recurrent) */
    BMOE_LAYER_CONV = 2,      /* lfm2moe's short convolution (recurrent) */
} bmoe_layer_kind;

typedef struct bmoe_layer {
    int is_moe;
    int is_swa;               /* sliding-window attention (attention.sliding_window_pattern) */
    /* this layer's geometry: head counts may be per-layer arrays, and a sliding-window layer may have
     * head sizes and rotated dims of its own (gemma4's _swa keys) */
    int n_head, n_head_kv, head_dim, head_dim_v, n_rot;
    int n_ff;                 /* feed_forward_length of this layer (0: none) */
    float out_scale;          /* layer_output_scale (recipes with layer_scale; 1 without) */
    float *exp_out_s;         /* ffn_down_exps.scale [E]: expert e's output times it (NULL: none) */
    int kind;                 /* bmoe_layer_kind */
    int kv_slot;              /* attention layers: the layer's place in the KV cache; -1 for the others */
    size_t rec_off;           /* recurrent layers: the offset of the layer's state in the recurrent state */
    /* 1-D norm weights, dequantised to f32 at load (owned); NULL when absent */
    float *attn_norm, *attn_q_norm, *attn_k_norm, *post_attention_norm, *ffn_norm;
    float *pre_ffw_norm_2, *post_ffw_norm_1, *post_ffw_norm_2, *post_ffw_norm;
    bmoe_weight attn_q, attn_k, attn_v, attn_output;
    bmoe_weight ffn_gate, ffn_up, ffn_down;   /* the dense FFN, or the shared expert of a MoE layer */
    bmoe_weight ffn_gate_inp;                 /* router [d, E] */
    bmoe_weight ffn_gate_inp_shexp;           /* BMOE_SHEXP_GATED: the shared expert's gate [d] (one output) */
    float *ffn_gate_inp_s;                    /* router input scale [d] (recipes with router_prescale) */
    /* biases and other small resident vectors, f32 (owned); NULL when absent (arch.h, bmoe_bias) */
    float *attn_q_b, *attn_k_b, *attn_v_b;    /* [H*hd], [Hkv*hd], [Hkv*hdv] */
    float *attn_output_b;                     /* [d] */
    float *attn_sinks;                        /* [H]: one extra softmax logit per query head */
    float *ffn_gate_inp_b;                    /* router bias [E] */
    float *exp_gate_b, *exp_up_b, *exp_down_b; /* per-expert biases [E][f], [E][f], [E][d] (resident) */
    bmoe_weight exps[BMOE_EXP_NPARTS];        /* whole 3-D expert tensors (data may be unused) */
    bmoe_expert_part exp_part[BMOE_EXP_NPARTS];
    uint64_t expert_bytes;                    /* bytes of one expert of this layer over all its parts (each
                                               * part in its own type: layers may differ) */
    float *exp_probs_b;                       /* [E] selection-only bias of the routing (recipes with
                                               * probs_bias), else NULL */
    /* delta-net layers: attn_qkv [d, 2 Hk S + Hv S], attn_gate (z) [d, Hv S], ssm_beta / ssm_alpha [d, Hv],
     * ssm_out [Hv S, d]; f32 copies of the convolution [C][K] and of the per-head vectors */
    bmoe_weight attn_qkv, attn_z, ssm_beta, ssm_alpha, ssm_out;
    float *ssm_conv1d, *ssm_dt, *ssm_a, *ssm_norm;
    /* conv layers: shortconv.in_proj [d, 3d], shortconv.out_proj [d, d], the convolution [d][K] in f32 */
    bmoe_weight sc_in, sc_out;
    float *sc_conv;
} bmoe_layer;

typedef struct bmoe_hparams {
    int n_layer, n_ctx_train, n_embd, n_ff, n_head, n_head_kv, head_dim, head_dim_v, n_rot;
    /* n_ff is the widest layer's, n_head and n_head_kv layer 0's (bmoe_layer has each layer's); head_dim,
     * head_dim_v and n_rot are the global (full-attention) layers' */
    int head_dim_swa, head_dim_v_swa;         /* a sliding-window layer's head sizes (gemma4's _swa keys) */
    double eps, rope_base;
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp, n_dense_lead;
    int n_expert_shared;                      /* BMOE_SHEXP_NAMED: the shared expert is this many experts wide */
    int n_swa;                                /* sliding window (recipes with swa): a position of a local
                                               * layer attends to the n_swa latest positions, itself included */
    int n_rot_swa;                            /* rotated dims of a sliding-window layer */
    double rope_base_swa;                     /* RoPE base of a sliding-window layer (no rope_freqs there) */
    double rope_scale;                        /* global layers: positions multiplied by this before RoPE
                                               * (1 / rope.scaling.factor, linear scaling; 1 = none) */
    int rope_yarn;                            /* rope.scaling.type yarn: rope_scale mixed per dimension */
    int yarn_orig_ctx;                        /* rope.scaling.original_context_length */
    double yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    double attn_scale;                        /* attention scores are q.k times this */
    double softcap;                           /* final logit soft-capping c (recipes with final_softcap):
                                               * logits = c tanh(logits / c); 0 = none */
    int rope_sections[4];                     /* M-RoPE sections [t, h, w, e] (recipes with rope_sections) */
    int ssm_state, ssm_groups, ssm_heads;     /* delta-net: S, Hk (q/k heads), Hv (value heads) */
    int conv_taps;                            /* K of the recurrent layers' convolution (0: none) */
    int n_vocab;
    const bmoe_gating *gating;
    int norm_w;
    double w_scale;
} bmoe_hparams;

typedef struct bmoe_model {
    char *path;                   /* as given (the first shard) */
    char arch[64];
    const bmoe_recipe *recipe;
    bmoe_hparams hp;
    gguf_model *g;
    void **maps;                  /* per shard: the read-only mapping (NULL when not mapped) */
    uint64_t *map_len;
    uint64_t file_bytes;          /* sum of the shard sizes */
    bmoe_weight token_embd, output; /* output may alias token_embd (tied) */
    int output_tied;
    float *output_norm;
    float *rope_freqs;            /* [head_dim / 2] frequency divisors of the global layers, else NULL */
    uint8_t *swa_pattern;         /* [n_layer]: 1 = sliding-window layer (recipes with swa), else NULL */
    uint8_t *layer_kinds;         /* [n_layer]: bmoe_layer_kind of each layer */
    bmoe_layer *layers;
    int n_moe_layers;
    int *moe_layers;              /* indices of the MoE layers, ascending; layers[il].expert_bytes is
                                   * one expert of layer il (the parts' types may differ per layer) */
    int n_attn_layers;            /* layers with a KV cache (kind BMOE_LAYER_ATTN) */
    size_t rec_floats;            /* floats of recurrent state over every recurrent layer (0: none) */
} bmoe_model;

/* Opens and checks the model. `map`: map every shard read-only (needed to run; `info` does not).
 * Returns 0, or an exit code (3 malformed, 4 I/O, 1 out of memory) with one line in err. */
int model_open(const char *path, int map, bmoe_model **out, char *err, size_t errlen);
void model_close(bmoe_model *m);

/* Every dense (non-expert) weight matrix of the model that is bound, in a fixed order: the token
 * embedding, the output (unless tied), then per layer its attention or recurrent projections, its dense
 * FFN or shared expert, its router and shared-expert gate. out: room for model_dense_capacity(m). Returns
 * the count. Whoever copies or checks the dense weights walks this list, so a new weight is listed once,
 * here. */
size_t model_dense_capacity(const bmoe_model *m);
size_t model_dense_weights(bmoe_model *m, bmoe_weight **out);

#endif
