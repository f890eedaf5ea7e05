/* --drop-cold-experts F for one routing row. The rule and the edits are specified in policy_drop.h and
 * docs/policies.md; this file is that text as code, in a fixed order, with no state. */
#include "policy_drop.h"

#include <math.h>
#include <stddef.h>

int drop_applies(const drop_params *p, int phase) {
    return p && (phase == 1 || p->in_prefill);
}

double drop_threshold(const drop_params *p) {
    int k = p->k_effective;
#ifdef BMOE_FAULT_MODEL_TOPK
    /* fault: the width is the model's own top-k, not the one the routing runs at */
    k = p->k_model;
#endif
    if (k < 1) k = 1;
#ifdef BMOE_FAULT_DROP_F_TIMES_K
    return p->F * (double)k; /* fault: the threshold scales the wrong way with the width */
#endif
    return p->F / (double)k;
}

/* Strictly below: a weight exactly at the threshold (two tied experts of a normalised top-2 at F = 1
 * weigh exactly F/k) is kept. */
static int below_threshold(float w, double thr) {
#ifdef BMOE_FAULT_DROP_AT_THRESHOLD
    return (double)w <= thr; /* fault: a weight exactly at the threshold is dropped too */
#else
    return (double)w < thr;
#endif
}

int drop_top_slot(const float *w, int k) {
    int top = -1;
    for (int s = 0; s < k; s++) {
        if (isnan(w[s])) continue;
        if (top < 0 || w[s] > w[top]) top = s; /* strict '>': the first maximum in rank order */
    }
    return top < 0 ? 0 : top;
}

int drop_row(const drop_params *p, int32_t *ids, float *w, const uint8_t *resident, uint8_t *dropped) {
    if (!p || !ids || !w || !resident || p->k_effective < 1 || isnan(p->F)) return -1;
    int k = p->k_effective;
    double thr = drop_threshold(p);
    int top = drop_top_slot(w, k);

    int n = 0;
    double orig = 0.0, kept = 0.0;
    for (int s = 0; s < k; s++) {
        int pinned = s == top;
#ifdef BMOE_FAULT_NO_PIN
        pinned = 0; /* fault: the top-weighted expert is as droppable as any other */
#endif
        int d = !pinned && !resident[s] && below_threshold(w[s], thr);
#ifdef BMOE_FAULT_DROP_RESIDENT
        d = !pinned && resident[s] && below_threshold(w[s], thr); /* fault: drops the hits instead of the misses */
#endif
        if (dropped) dropped[s] = (uint8_t)d;
        orig += (double)w[s];
        if (d) n++;
        else kept += (double)w[s];
    }
    if (n == 0) return 0; /* nothing dropped: the row is not written at all */

    int rescale = p->renorm && isfinite(orig) && isfinite(kept) && kept > 0.0;
#ifndef BMOE_FAULT_RENORM_INVERTED
    double scale = rescale ? orig / kept : 1.0;
#else
    double scale = rescale ? kept / orig : 1.0; /* fault: the survivors are scaled by the inverse ratio */
#endif
    int32_t top_id = ids[top];
    for (int s = 0; s < k; s++) {
        int pinned = s == top;
#ifdef BMOE_FAULT_NO_PIN
        pinned = 0;
#endif
        int d = !pinned && !resident[s] && below_threshold(w[s], thr);
#ifdef BMOE_FAULT_DROP_RESIDENT
        d = !pinned && resident[s] && below_threshold(w[s], thr);
#endif
        if (d) {
            w[s] = 0.0f;
#ifndef BMOE_FAULT_NO_REPOINT
            ids[s] = top_id;
#else
            (void)top_id; /* fault: the dropped slot keeps the id of an expert that was never loaded */
#endif
        } else if (rescale) {
            w[s] = (float)((double)w[s] * scale);
        }
    }
    return n;
}
