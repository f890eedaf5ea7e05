/* Unit tests of the glue between the config and the hook (policies.c): what is armed, the refusals
 * that back validate() up, decode-only substitution, the drop's per-slot residency, its phase rule,
 * and the weight_routed / weight_dropped counters exactly as policies.h defines them.
 * Built and run under AddressSanitizer + UBSan by `make -C engine test`. */
#include "check.h"
#include "policies.h"

#include <string.h>

#define E 8
#define K 2

static bmoe_policy_opts cfg_with(double drop, int drop_set, double subst, int subst_set) {
    bmoe_policy_opts c = {0};
    c.cache_mb = 2;
    c.drop = drop;
    c.drop_set = drop_set;
    c.subst = subst;
    c.subst_set = subst_set;
    return c;
}

static void test_create(void) {
    bmoe_policies *p = (bmoe_policies *)1;
    bmoe_error err = {0};
    bmoe_policy_opts c = cfg_with(0, 0, 0, 0);
    CHECK(policies_create(&p, &c, K, K, E, 4, &err) == 0 && p == NULL); /* nothing armed */

    c = cfg_with(0.5, 1, 0, 0);
    c.cache_mb = 0;
    CHECK(policies_create(&p, &c, K, K, E, 4, &err) == 2 && p == NULL);
    CHECK(strcmp(err.msg, "--drop-cold-experts: needs the expert cache (--cache-mb > 0)") == 0);
    c = cfg_with(0, 0, 0.5, 1);
    c.cache_mb = 0;
    c.mmap = 1;
    CHECK(policies_create(&p, &c, K, K, E, 4, &err) == 2 && p == NULL);
    CHECK(strcmp(err.msg, "--expert-substitute: not available with --mmap (nothing is streamed)") == 0);
    c = cfg_with(1.5, 1, 0, 0);
    CHECK(policies_create(&p, &c, K, K, E, 4, &err) == 2 && p == NULL);

    c = cfg_with(0, 0, 0.5, 1);
    CHECK(policies_create(&p, &c, K, K, E, 4, &err) == 0 && p != NULL);
    bmoe_route_policy rp = policies_route_policy(p);
    CHECK(rp.self == p && rp.at_topk != NULL && rp.at_terminal == NULL && rp.topk_in_prefill == 0);
    policies_destroy(p);

    c = cfg_with(0.5, 1, 0, 0);
    c.drop_in_prefill = 1;
    CHECK(policies_create(&p, &c, K, K, E, 4, &err) == 0 && p != NULL);
    rp = policies_route_policy(p);
    CHECK(rp.at_topk == NULL && rp.at_terminal != NULL && rp.terminal_in_prefill == 1);
    policies_destroy(p);
}

static void test_subst(void) {
    bmoe_error err = {0};
    bmoe_policy_opts c = cfg_with(0, 0, 1.0, 1);
    bmoe_policies *p = NULL;
    CHECK(policies_create(&p, &c, K, K, E, 2, &err) == 0 && p);
    if (!p) return;
    bmoe_route_policy rp = policies_route_policy(p);
    float scores[2 * E] = { 5, 4, 3, 2, 1, 0, -1, -2, 5, 4, 3, 2, 1, 0, -1, -2 };
    int32_t ids[2 * K] = { 0, 1, 0, 1 };
    uint8_t resident[E] = { 0, 0, 0, 1, 0, 0, 0, 0 }; /* expert 3: 2 + 7 > 4 */
    uint8_t changed[2 * K] = {0};
    bmoe_counters k = {0};
    bmoe_moe_result r = { .node = BMOE_NODE_TOPK, .layer = 0, .n_tokens = 2, .n_cols = K, .n_expert = E,
                          .phase = 0, .ids = ids, .scores = scores };
    CHECK(rp.at_topk(rp.self, &r, resident, changed, &k) == 0); /* prefill: untouched */
    CHECK(k.subst_examined == 0 && ids[1] == 1 && changed[1] == 0);
    r.phase = 1;
    CHECK(rp.at_topk(rp.self, &r, resident, changed, &k) == 0);
    CHECK(k.subst_examined == 4 && ids[0] == 3 && ids[1] == 0 && changed[0] == 1 && changed[1] == 0);
    CHECK(ids[2] == 3 && ids[3] == 0 && changed[2] == 1);
    r.n_cols = 3; /* not the width it was built for */
    CHECK(rp.at_topk(rp.self, &r, resident, changed, &k) == 1);
    policies_destroy(p);
}

static void test_drop(void) {
    bmoe_error err = {0};
    bmoe_policy_opts c = cfg_with(1.0, 1, 0, 0);
    bmoe_policies *p = NULL;
    CHECK(policies_create(&p, &c, K, 4, E, 2, &err) == 0 && p); /* effective 2 of a top-4 model */
    if (!p) return;
    bmoe_route_policy rp = policies_route_policy(p);
    int32_t ids[2 * K] = { 5, 6, 2, 7 };
    float w[2 * K] = { 0.625f, 0.375f, 0.75f, 0.25f };
    uint8_t resident[E] = { 0, 0, 1, 0, 0, 0, 1, 0 };
    uint8_t dropped[2 * K] = {0};
    bmoe_counters k = {0};
    bmoe_moe_result r = { .node = BMOE_NODE_WEIGHTS_NORM, .layer = 0, .n_tokens = 2, .n_cols = K, .n_expert = E,
                          .phase = 0, .ids = ids, .weights = w };
    CHECK(rp.at_terminal(rp.self, &r, resident, dropped, &k) == 0); /* prefill without --drop-in-prefill */
    CHECK(k.weight_routed == 0.0 && dropped[3] == 0 && w[3] == 0.25f);
    r.phase = 1;
    CHECK(rp.at_terminal(rp.self, &r, resident, dropped, &k) == 0);
    /* row 0: 6 is resident, kept although 0.375 < 1/2; row 1: 7 is a miss below 1/2 (the effective
     * width, not the model's 4): dropped, repointed at 2, survivors renormalised */
    CHECK(dropped[0] == 0 && dropped[1] == 0 && ids[1] == 6 && w[1] == 0.375f);
    CHECK(dropped[2] == 0 && dropped[3] == 1 && ids[3] == 2 && w[3] == 0.0f && w[2] == 1.0f);
    CHECK(k.weight_routed == 2.0 && k.weight_dropped == 0.25);
    policies_destroy(p);
}

int main(void) {
    test_create();
    test_subst();
    test_drop();
    return check_report("test_policies");
}
