/* --expert-substitute L for one routing row. The rule is specified in policy_subst.h and
 * docs/policies.md; this file is that text as code, in a fixed order, with no state. Everything is
 * computed in double from the float scores, and the logarithm is the engine's portable bm_log, so the
 * same inputs give the same ids on every target. */
#include "policy_subst.h"

#include <math.h>
#include <stddef.h>

#include "tensor.h"

static double key_of(float v, int scores_are_probs) {
    if (isnan(v)) return (double)NAN;
    if (!scores_are_probs) return (double)v;
    if (!(v > 0.0f)) return -HUGE_VAL; /* 0, -0 (and an impossible negative probability): never chosen over a positive one */
    return bm_log((double)v);
}

/* max - min over the finite entries of key[0..n-1]; 0 when fewer than two are finite */
static double finite_range(const double *key, int n) {
    double lo = 0.0, hi = 0.0;
    int seen = 0;
    for (int e = 0; e < n; e++) {
        if (!isfinite(key[e])) continue;
        if (!seen || key[e] < lo) lo = key[e];
        if (!seen || key[e] > hi) hi = key[e];
        seen++;
    }
    return seen >= 2 ? hi - lo : 0.0;
}

double subst_margin(const float *scores, int scores_are_probs, int n_expert, double L) {
    if (!scores || n_expert < 1 || isnan(L)) return 0.0;
    double lo = 0.0, hi = 0.0;
    int seen = 0;
    for (int e = 0; e < n_expert; e++) {
        double v = key_of(scores[e], scores_are_probs);
        if (!isfinite(v)) continue;
        if (!seen || v < lo) lo = v;
        if (!seen || v > hi) hi = v;
        seen++;
    }
    return seen >= 2 ? L * (hi - lo) : 0.0;
}

/* The router's selection rule on doubles: descending, ties to the lower id, NaN below everything. */
static void topk_adjusted(const double *adj, int n, int k, int32_t *out) {
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int r = 0; r < s && !taken; r++) taken = out[r] == e;
            if (taken) continue;
            if (best < 0 || adj[e] > adj[best] || (isnan(adj[best]) && !isnan(adj[e]))) best = e;
        }
        out[s] = best;
    }
}

static int in_set(const int32_t *set, int k, int32_t id) {
    for (int s = 0; s < k; s++)
        if (set[s] == id) return 1;
    return 0;
}

int subst_row(const float *scores, int scores_are_probs, const uint8_t *resident, int n_expert, int k,
              double L, int32_t *ids, uint8_t *substituted, double *work, subst_counts *counts) {
    if (!scores || !resident || !ids || !work || k < 1 || n_expert < 1 || k > n_expert || k > SUBST_MAX_K ||
        isnan(L))
        return -1;
    for (int s = 0; s < k; s++)
        if (ids[s] < 0 || ids[s] >= n_expert) return -1;

    if (counts) { counts->examined = k; counts->changed = 0; }
    if (substituted)
        for (int s = 0; s < k; s++) substituted[s] = 0;
#ifdef BMOE_FAULT_SUBST_INERT
    /* fault: the policy examines the routing and never changes it */
    return 0;
#endif

    for (int e = 0; e < n_expert; e++) work[e] = key_of(scores[e], scores_are_probs);
    double margin = L * finite_range(work, n_expert);
#ifdef BMOE_FAULT_SUBST_MARGIN_HALF
    margin *= 0.5; /* fault: the margin is L/2 x range (a "half-width" band): it still fires, only less */
#endif
    if (margin != 0.0 && !isnan(margin))
        for (int e = 0; e < n_expert; e++)
#ifndef BMOE_FAULT_SUBST_PREFER_MISS
            if (resident[e]) work[e] += margin; /* -inf stays -inf, NaN stays NaN */
#else
            if (!resident[e]) work[e] += margin; /* fault: the misses are raised, not the resident experts */
#endif

    int32_t fresh[SUBST_MAX_K];
    topk_adjusted(work, n_expert, k, fresh);

    int changed = 0;
    for (int s = 0; s < k; s++) changed += !in_set(ids, k, fresh[s]);
#ifdef BMOE_FAULT_SUBST_COUNT_REORDER
    /* fault: the re-ranked set is written back in expert-id order instead of score order and compared
     * with the router's ids slot by slot, so a plain re-ordering of the router's own set is counted
     * (and written) as substitutions */
    for (int s = 1; s < k; s++)
        for (int r = s; r > 0 && fresh[r - 1] > fresh[r]; r--) {
            int32_t x = fresh[r];
            fresh[r] = fresh[r - 1];
            fresh[r - 1] = x;
        }
    changed = 0;
    for (int s = 0; s < k; s++) changed += fresh[s] != ids[s];
    if (changed) {
        for (int s = 0; s < k; s++)
            if (substituted) substituted[s] = fresh[s] != ids[s];
        for (int s = 0; s < k; s++) ids[s] = fresh[s];
    }
    if (counts) counts->changed = changed;
    return changed;
#endif
    if (changed == 0) return 0; /* the router's own set: leave its ids and order untouched */

    if (substituted)
        for (int s = 0; s < k; s++) substituted[s] = (uint8_t)!in_set(ids, k, fresh[s]);
    for (int s = 0; s < k; s++) ids[s] = fresh[s];
    if (counts) counts->changed = changed;
    return changed;
}

void subst_gather_weights(const float *probs, const int32_t *ids, int k, float *w) {
    for (int s = 0; s < k; s++) w[s] = probs[ids[s]];
}
