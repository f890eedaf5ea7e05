/* --expert-substitute L: cache-aware re-ranking of one routing row (docs/policies.md).
 *
 * Pure: no I/O, no cache access, no allocation, no global state. The hook calls it at the TOPK node,
 * with the tensor the graph sorted (bmoe_moe_result.scores), its scores_are_probs flag, and a residency
 * mask over all E experts of the layer (taken once per layer and batch, after pending speculative
 * reads have settled).
 *
 * Rule (exact):
 *   key[e]   = log(scores[e]) when scores_are_probs (bm_log, double; a probability <= 0 gives -inf),
 *              otherwise (double)scores[e]. NaN stays NaN.
 *   range    = max - min of key[] over its FINITE values only (0 when fewer than two are finite)
 *   margin   = L * range
 *   adj[e]   = key[e] + (resident[e] ? margin : 0)
 *   new ids  = the k experts with the largest adj, in descending order; ties go to the lower id and
 *              NaN ranks below everything (the router's own rule, forward.c topk_row)
 *   examined = k, always; changed = the number of new ids that are not in the router's set.
 * If the new ids are the same SET as the router's ids (in any order), changed is 0 and ids[] is not
 * written at all: a re-ordering is not a substitution. Otherwise ids[] receives the new ids in their
 * adjusted rank order (a kept expert may then sit in another slot than the router gave it).
 *
 * Weights: the policy does not touch them. In forward.c the weight chain runs AFTER the TOPK node
 * (ffn_moe_weights = probs[ids]), so a substituted expert carries exactly the weight the router gives
 * that expert: its own probability (then the softmax over the selected, the norm and the scale, as the
 * gating says). subst_gather_weights() is that gather, for a graph that would compute the weights
 * before the hook edits the ids. */
#ifndef BMOE_POLICY_SUBST_H
#define BMOE_POLICY_SUBST_H

#include <stdint.h>

#define SUBST_MAX_K 256 /* widest routing row the policy handles (BMOE_MAX_EXPERT_USED) */

typedef struct subst_counts {
    int examined; /* slots looked at: k */
    int changed;  /* slots now holding an expert outside the router's set */
} subst_counts;

/* The margin this row would use: L × (max − min) of the finite keys (see above). */
double subst_margin(const float *scores, int scores_are_probs, int n_expert, double L);

/* Re-ranks one row. scores[E], resident[E] (non-zero: expert resident), ids[k] in: the router's ids in
 * rank order; out: the ids to execute. substituted[k] (may be NULL) receives 1 for a slot whose expert
 * is not in the router's set, else 0. work: scratch of at least n_expert doubles (the caller owns it;
 * no allocation here). counts (may be NULL) receives examined/changed.
 * Returns changed (>= 0), or -1 on unusable arguments (NULL arrays, k < 1, k > n_expert,
 * k > SUBST_MAX_K, L NaN, a router id outside [0, E)); nothing is written then. */
int subst_row(const float *scores, int scores_are_probs, const uint8_t *resident, int n_expert, int k,
              double L, int32_t *ids, uint8_t *substituted, double *work, subst_counts *counts);

/* w[s] = probs[ids[s]] for s < k: the router's weight for whichever expert now holds slot s. */
void subst_gather_weights(const float *probs, const int32_t *ids, int k, float *w);

#endif
