/* The forward pass of docs/model-math.md over a batch of T positions.
 *
 * Prefill runs the whole prompt as one batch; decode runs one token. Each MoE layer hands its named
 * results to the seam's hook in order (LOGITS, PROBS, TOPK, WEIGHTS, then WEIGHTS_SOFTMAX /
 * WEIGHTS_NORM / WEIGHTS_SCALED as the gating says, then EXPERTS) and reads expert weights only
 * through the seam's expert source. This file knows nothing of caches, streaming or policies. */
#ifndef BMOE_FORWARD_H
#define BMOE_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "model.h"
#include "seam.h"
#include "threads.h"

typedef struct bmoe_forward bmoe_forward;

/* n_ctx: KV cache positions; max_batch: the largest T forward_eval will get; top_k: the effective
 * top-k (1..n_expert). Returns 0 or an exit code (1 memory, 2 a bad size) with err set. */
int forward_create(bmoe_forward **out, const bmoe_model *m, bmoe_pool *pool, const bmoe_seam *seam, int n_ctx,
                   int max_batch, int top_k, char *err, size_t errlen);
void forward_free(bmoe_forward *f);

/* The kernel path the matmuls and attention use (kernels.h); forward_create picks the fastest one
 * this CPU has. Every path gives the same bits. Returns 0, or 2 when the path is not available here. */
int forward_set_kernels(bmoe_forward *f, bm_kpath path);
bm_kpath forward_kernels(const bmoe_forward *f);

/* Evaluates tokens[0..T) at positions pos0..pos0+T-1. phase 0 prefill / 1 decode, step = decode step
 * (both only label the hook's results). Writes logits: all T rows [T, V] when all_logits, else only
 * the last row [V]. Returns 0, or an exit code with err set (a hook's or expert source's code). */
int forward_eval(bmoe_forward *f, const int32_t *tokens, int T, int pos0, int phase, int step, int all_logits,
                 float *logits, char *err, size_t errlen);

/* Remembers the recurrent state (recurrent.h) at the current position, so that a later pass at that
 * position continues from it (--ppl-choices: every option after the same context). 0, or 1 out of
 * memory; a no-op for a model without recurrent layers. */
int forward_mark(bmoe_forward *f);

/* Routed slots seen so far (every MoE layer, every token, before any hook edits): T * top_k per layer. */
uint64_t forward_experts_routed(const bmoe_forward *f);

/* ids[0..k) = the indices of the k largest p[0..n), descending; ties go to the lower index; NaN
 * never beats a number. */
void topk_row(const float *p, int n, int k, int32_t *ids);
/* The first index of the maximum (greedy sampling). */
int argmax_first(const float *v, int n);

#endif
