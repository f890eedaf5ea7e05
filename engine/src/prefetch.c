/* Temporal prefetch planning (see prefetch.h). */
#include "prefetch.h"

#include <stdlib.h>

struct bmoe_prefetch {
    int n_layers, n_expert, k, depth;
    int32_t *last;   /* [n_layers][k], -1 = nothing */
};

bmoe_prefetch *prefetch_create(int n_layers, int n_expert, int top_k, int depth) {
    if (n_layers < 1 || n_expert < 1 || top_k < 1 || depth < 1) return NULL;
    bmoe_prefetch *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_layers = n_layers;
    p->n_expert = n_expert;
    p->k = top_k;
    p->depth = depth < n_layers ? depth : n_layers;
    p->last = malloc((size_t)n_layers * (size_t)top_k * sizeof *p->last);
    if (!p->last) {
        free(p);
        return NULL;
    }
    for (size_t i = 0; i < (size_t)n_layers * (size_t)top_k; i++) p->last[i] = -1;
    return p;
}

void prefetch_destroy(bmoe_prefetch *p) {
    if (!p) return;
    free(p->last);
    free(p);
}

void prefetch_record(bmoe_prefetch *p, int li, const int32_t *ids, int k) {
    if (li < 0 || li >= p->n_layers) return;
    int32_t *dst = p->last + (size_t)li * (size_t)p->k;
    for (int s = 0; s < p->k; s++) dst[s] = (s < k && ids[s] >= 0 && ids[s] < p->n_expert) ? ids[s] : -1;
}

int prefetch_plan(const bmoe_prefetch *p, int li, int *layers, int *experts, int cap) {
    int n = 0;
    if (li < 0 || li >= p->n_layers) return 0;
#ifdef BMOE_FAULT_PREFETCH_DEPTH_OFF_BY_ONE
    for (int d = 1; d < p->depth; d++) { /* fault: plans one layer short of the depth (depth 1: nothing) */
#else
    for (int d = 1; d <= p->depth; d++) {
#endif
        int lj = (li + d) % p->n_layers;
        const int32_t *ids = p->last + (size_t)lj * (size_t)p->k;
        for (int s = 0; s < p->k && n < cap; s++) {
            if (ids[s] < 0) continue;
            int dup = 0;
            for (int r = 0; r < s; r++) dup |= ids[r] == ids[s];
            if (dup) continue;
            layers[n] = lj;
            experts[n] = ids[s];
            n++;
        }
    }
    return n;
}

int prefetch_depth(const bmoe_prefetch *p) { return p->depth; }
