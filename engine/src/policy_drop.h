/* --drop-cold-experts F: the decision for one routing row (docs/policies.md).
 *
 * Pure: no I/O, no cache access, no allocation, no global state. The hook passes the row's final
 * weights (the terminal node of the layer's weight chain, weight_chain.h) and, per slot, whether that
 * slot's expert is resident; the function edits the row in place and says which slots it dropped.
 *
 * Rule (exact):
 *   threshold = F / k_effective                       (double; k_effective is the row width)
 *   top       = the first slot, in rank order, holding the largest non-NaN weight (slot 0 if all NaN)
 *   slot s is dropped  iff  s != top  &&  !resident[s]  &&  (double)w[s] < threshold
 * Edits, only when at least one slot is dropped (a row with nothing dropped is not written at all):
 *   1. w[s] = 0 for every dropped slot;
 *   2. renorm (default): orig = sum of all k weights, kept = sum of the survivors' weights, both in
 *      double in slot order, taken before step 1; if orig and kept are finite and kept > 0, every
 *      survivor becomes (float)((double)w[s] * (orig / kept)), in slot order. Otherwise the survivors
 *      are left as they are (no division by zero, no NaN introduced);
 *   3. ids[s] = ids[top] for every dropped slot (so the matmul reads an expert that is loaded and
 *      multiplies it by exactly zero).
 * A NaN weight compares false and is never dropped; F = 0 drops nothing; k = 1 drops nothing. */
#ifndef BMOE_POLICY_DROP_H
#define BMOE_POLICY_DROP_H

#include <stdint.h>

typedef struct drop_params {
    double F;          /* --drop-cold-experts, validated to [0, 1] */
    int k_effective;   /* the routing's width at run time (after --n-expert-used): the row has this many slots */
    int k_model;       /* the model's own top-k (expert_used_count); read only under BMOE_FAULT_MODEL_TOPK */
    int renorm;        /* 1 unless --drop-no-renorm */
    int in_prefill;    /* --drop-in-prefill */
} drop_params;

/* 1 when the policy applies to a batch of this phase (0 prefill, 1 decode): decode always, prefill
 * only with --drop-in-prefill. */
int drop_applies(const drop_params *p, int phase);

/* The weight bound F × 1/k_effective (the fault build uses k_model). */
double drop_threshold(const drop_params *p);

/* The slot whose weight is the largest (first in rank order on ties; NaN ignored; 0 if all NaN). */
int drop_top_slot(const float *w, int k);

/* Decides and edits one row of k = p->k_effective slots: ids[k] (rank order), w[k] (final weights),
 * resident[k] (non-zero: that slot's expert is a cache hit). dropped[k] (may be NULL) receives 1 for a
 * dropped slot, 0 otherwise. Returns the number of slots dropped (0..k-1), or -1 if the arguments are
 * unusable (NULL arrays, k < 1, F NaN), in which case nothing is written. */
int drop_row(const drop_params *p, int32_t *ids, float *w, const uint8_t *resident, uint8_t *dropped);

#endif
