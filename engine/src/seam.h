/* The seam between the compute core and everything that streams or edits routing.
 *
 * The forward pass (forward.c) produces each MoE layer's named intermediate results in a fixed order
 * (llama.cpp's names, see docs/model-math.md) and hands each one to the hook before anything
 * downstream reads it. The hook may edit the result in place. Streaming, the expert cache and the
 * lossy policies live behind the hook; forward.c knows nothing of them. Expert weights are reached
 * only through the expert source. By the time BMOE_NODE_EXPERTS fires the hook has committed them and
 * issued their reads; a view returns once that expert's reads have landed, so asking for each
 * expert's view right before its matmul lets the later experts' reads overlap the earlier matmuls. */
#ifndef BMOE_SEAM_H
#define BMOE_SEAM_H

#include <stdint.h>

typedef enum {
    BMOE_NODE_LOGITS = 0,      /* ffn_moe_logits-<il>          f32 [T, E] */
    BMOE_NODE_PROBS,           /* ffn_moe_probs-<il>           f32 [T, E] (the tensor top-k sorts) */
    BMOE_NODE_TOPK,            /* ffn_moe_topk-<il>            i32 [T, k] selected ids, rank order */
    BMOE_NODE_WEIGHTS,         /* ffn_moe_weights-<il>         f32 [T, k] */
    BMOE_NODE_WEIGHTS_SOFTMAX, /* ffn_moe_weights_softmax-<il> f32 [T, k] */
    BMOE_NODE_WEIGHTS_NORM,    /* ffn_moe_weights_norm-<il>    f32 [T, k] */
    BMOE_NODE_WEIGHTS_SCALED,  /* ffn_moe_weights_scaled-<il>  f32 [T, k] */
    BMOE_NODE_EXPERTS,         /* the expert matmuls are next: ids and final weights, read-only from here */
    BMOE_NODE_COUNT
} bmoe_node;

const char *bmoe_node_name(bmoe_node n); /* "ffn_moe_topk" ... (without the -<il> suffix) */

typedef struct bmoe_moe_result {
    bmoe_node node;
    int layer;            /* il */
    int n_tokens;         /* T: rows of this batch */
    int n_cols;           /* E for LOGITS/PROBS, k (effective top-k) otherwise */
    int n_expert;         /* E */
    int phase;            /* 0 prefill, 1 decode */
    int step;             /* decode step (0-based) or 0 in prefill */
    int pos0;             /* position of the batch's first row */
    float *f32;           /* the result for float nodes (mutable), NULL for TOPK */
    int32_t *ids;         /* selected ids [T, k] (mutable at TOPK and at the weight nodes) */
    float *weights;       /* current weights [T, k] at weight nodes, NULL before WEIGHTS */
    const float *scores;  /* at TOPK: the tensor the ids were sorted from [T, E] */
    int scores_are_probs; /* at TOPK: 1 when scores are softmax probabilities (rank in log space) */
} bmoe_moe_result;

/* Returns 0 to continue; non-zero aborts the forward pass with that error code (engine exit codes). */
typedef int (*bmoe_hook_fn)(void *user, bmoe_moe_result *r);

/* One expert's weight tensors as the matmuls read them (rows of the GGUF slice; NULL if absent). */
typedef struct bmoe_expert_view {
    const void *gate, *up, *gate_up, *down;
} bmoe_expert_view;

typedef struct bmoe_expert_source {
    void *self;
    /* Weights of expert `e` of layer `il`. In streaming mode the hook has committed them before the
     * EXPERTS node and this waits for their reads (call it from the eval thread); calling this for an
     * expert that is not loaded returns memory that faults. */
    int (*view)(void *self, int il, int e, bmoe_expert_view *out);
} bmoe_expert_source;

typedef struct bmoe_seam {
    bmoe_hook_fn hook;   /* may be NULL */
    void *hook_user;
    bmoe_expert_source experts;
} bmoe_seam;

#endif
