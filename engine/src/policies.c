/* The lossy knobs plugged into the streaming hook (policies.h). The rules are the pure modules'; this
 * file only walks the rows of a batch, builds the inputs those modules take and adds their counts. */
#include "policies.h"

#include <stdlib.h>
#include <string.h>

#include "policy_drop.h"
#include "policy_subst.h"

struct bmoe_policies {
    int subst_on, drop_on;
    double L;
    drop_params dp;
    int k, E, max_batch;
    double *work;       /* [E] scratch of subst_row */
    uint8_t *res_k;     /* [k] residency of each slot's expert */
    float *w0;          /* [k] the row's weights before the drop edits them */
};

int policies_create(bmoe_policies **out, const bmoe_policy_opts *cfg, int k_effective, int k_model, int n_expert,
                    int max_batch, bmoe_error *err) {
    *out = NULL;
    int subst_on = cfg->subst_set, drop_on = cfg->drop_set;
    if (!subst_on && !drop_on) return 0;
    /* validate() already refuses these (engine_open runs it on every config); kept here so that the
     * policies can never run without the cache they consult, whoever builds the engine */
    const char *flag = drop_on ? "--drop-cold-experts" : "--expert-substitute";
    if (cfg->mmap) return err_set(err, 2, "config", "%s: not available with --mmap (nothing is streamed)", flag);
    if (cfg->cache_mb <= 0) return err_set(err, 2, "config", "%s: needs the expert cache (--cache-mb > 0)", flag);
    if ((drop_on && !(cfg->drop >= 0.0 && cfg->drop <= 1.0)) || (subst_on && !(cfg->subst >= 0.0 && cfg->subst <= 1.0)))
        return err_set(err, 2, "config", "%s: %s", flag, "outside [0, 1] or NaN");
    if (k_effective < 1 || n_expert < k_effective || max_batch < 1)
        return err_set(err, 1, NULL, "internal: routing policies for a top-%d of %d experts", k_effective, n_expert);

    bmoe_policies *p = calloc(1, sizeof *p);
    if (!p) return err_set(err, 1, NULL, "out of memory");
    p->subst_on = subst_on;
    p->drop_on = drop_on;
    p->L = cfg->subst;
    p->dp.F = cfg->drop;
    p->dp.k_effective = k_effective;
    p->dp.k_model = k_model;
    p->dp.renorm = !cfg->drop_no_renorm;
    p->dp.in_prefill = cfg->drop_in_prefill;
    p->k = k_effective;
    p->E = n_expert;
    p->max_batch = max_batch;
    p->work = malloc((size_t)n_expert * sizeof *p->work);
    p->res_k = malloc((size_t)k_effective);
    p->w0 = malloc((size_t)k_effective * sizeof *p->w0);
    if (!p->work || !p->res_k || !p->w0) {
        policies_destroy(p);
        return err_set(err, 1, NULL, "out of memory");
    }
    *out = p;
    return 0;
}

void policies_destroy(bmoe_policies *p) {
    if (!p) return;
    free(p->work);
    free(p->res_k);
    free(p->w0);
    free(p);
}

/* The rows the hook hands over must be the ones this policy was built for. */
static int shape_ok(const bmoe_policies *p, const bmoe_moe_result *r) {
    return r->n_cols == p->k && r->n_expert == p->E && r->n_tokens >= 1 && r->n_tokens <= p->max_batch && r->ids;
}

/* --expert-substitute at ffn_moe_topk: re-rank every row toward the resident experts. */
static int at_topk(void *self, bmoe_moe_result *r, const uint8_t *resident, uint8_t *changed, bmoe_counters *c) {
    bmoe_policies *p = self;
    if (!shape_ok(p, r) || !r->scores) return 1;
    if (r->phase != 1) return 0; /* decode routings only (the hook does not call it in prefill either) */
    int k = p->k, E = p->E;
    for (int t = 0; t < r->n_tokens; t++) {
        subst_counts sc = {0, 0};
        int rc = subst_row(r->scores + (size_t)t * E, r->scores_are_probs, resident, E, k, p->L,
                           r->ids + (size_t)t * k, changed + (size_t)t * k, p->work, &sc);
        if (rc < 0) return 1;
        c->subst_examined += (uint64_t)sc.examined;
    }
    return 0;
}

/* --drop-cold-experts at the layer's terminal weight node: the final weights are in r->weights. */
static int at_terminal(void *self, bmoe_moe_result *r, const uint8_t *resident, uint8_t *dropped, bmoe_counters *c) {
    bmoe_policies *p = self;
    if (!shape_ok(p, r) || !r->weights) return 1;
    if (!drop_applies(&p->dp, r->phase)) return 0;
    int k = p->k;
    for (int t = 0; t < r->n_tokens; t++) {
        int32_t *ids = r->ids + (size_t)t * k;
        float *w = r->weights + (size_t)t * k;
        for (int s = 0; s < k; s++) {
            if (ids[s] < 0 || ids[s] >= p->E) return 1;
            p->res_k[s] = resident[ids[s]] ? 1 : 0;
            p->w0[s] = w[s];
        }
        int n = drop_row(&p->dp, ids, w, p->res_k, dropped + (size_t)t * k);
        if (n < 0) return 1;
        double routed = 0.0, gone = 0.0;
        for (int s = 0; s < k; s++) {
            routed += (double)p->w0[s];
            if (dropped[(size_t)t * k + (size_t)s]) gone += (double)p->w0[s];
        }
#ifdef BMOE_FAULT_WEIGHT_ROUTED_KEPT
        routed -= gone; /* fault: the routed mass leaves out what was dropped */
#endif
        c->weight_routed += routed;
        c->weight_dropped += gone;
    }
    return 0;
}

bmoe_route_policy policies_route_policy(bmoe_policies *p) {
    bmoe_route_policy rp;
    memset(&rp, 0, sizeof rp);
    rp.self = p;
    if (p && p->subst_on) rp.at_topk = at_topk;
    if (p && p->drop_on) rp.at_terminal = at_terminal;
    rp.topk_in_prefill = 0;                              /* substitution: decode routings only */
    rp.terminal_in_prefill = p && p->dp.in_prefill;      /* dropping: decode unless --drop-in-prefill */
    return rp;
}
