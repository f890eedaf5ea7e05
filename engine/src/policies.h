/* The lossy knobs (docs/design.md, the seam and the lossy knobs) as a routing policy for the streaming hook (stream_hook.h).
 *
 * Glue only: the decisions are the pure modules' (policy_subst.c, policy_drop.c; docs/policies.md).
 * This file turns the run configuration into a `bmoe_route_policy`:
 *
 *   at_topk      --expert-substitute L: subst_row() on every row of a DECODE batch, with the residency
 *                the hook took over all E experts of the layer (after pending speculative reads
 *                settled), before the hook takes residency for the load and before any drop
 *   at_terminal  --drop-cold-experts F: drop_row() on every row at the layer's terminal weight node
 *                (the hook defers the load there once weight_chain.c knows the layer's shape), with a
 *                per-slot residency built from the same per-expert residency; decode only unless
 *                --drop-in-prefill
 *
 * The threshold's width is the EFFECTIVE top-k, which is the row width the hook hands over
 * (bmoe_moe_result.n_cols); the model's own top-k is passed only for the MODEL_TOPK fault build.
 *
 * Measurement counters (bmoe_counters.weight_routed / weight_dropped), exact definition: over every
 * row drop_row() examined (a row of a batch whose phase the drop applies to, at the terminal node of
 * a layer whose shape is learned), weight_routed += the sum of the row's k final weights and
 * weight_dropped += the sum of the final weights of the slots it dropped, both as the weights were
 * BEFORE the edit (so before zeroing and renormalisation), each float widened to double and summed
 * in (layer pass, row, slot) order. Rows the rule never examined (dropping off, prefill without
 * --drop-in-prefill, a layer shape not learned yet) add nothing. weight_dropped / weight_routed is
 * the share of the examined router weight mass the policy discarded. */
#ifndef BMOE_POLICIES_H
#define BMOE_POLICIES_H

#include "result.h"
#include "stream_hook.h"

typedef struct bmoe_policies bmoe_policies;

/* From the lossy knobs' options (engine.c fills them from the command line): k_effective is the routing width at run time (after --n-expert-used),
 * k_model the model's own top-k, n_expert E, max_batch the widest batch the hook will see.
 * Refuses (exit 2, the validate() message) a knob without the expert cache or with --mmap, so no
 * caller that bypasses validate() can arm one where it cannot be cache-aware.
 * *out is NULL (and 0 returned) when neither knob is armed: nothing to plug in. */
typedef struct bmoe_policy_opts {
    int drop_set;            /* --drop-cold-experts given */
    double drop;             /* its F */
    int drop_no_renorm;      /* --drop-no-renorm */
    int drop_in_prefill;     /* --drop-in-prefill */
    int subst_set;           /* --expert-substitute given */
    double subst;            /* its L */
    int mmap;                /* --mmap: nothing is streamed (refused with a knob) */
    int cache_mb;            /* --cache-mb (a knob needs the cache) */
} bmoe_policy_opts;

int policies_create(bmoe_policies **out, const bmoe_policy_opts *cfg, int k_effective, int k_model, int n_expert,
                    int max_batch, bmoe_error *err);
void policies_destroy(bmoe_policies *p); /* NULL is fine */

/* The policy to give stream_hook_set_policy (self = p). */
bmoe_route_policy policies_route_policy(bmoe_policies *p);

#endif
