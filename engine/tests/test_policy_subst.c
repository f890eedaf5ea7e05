/* Unit tests of --expert-substitute (policy_subst.c) and of its report line (policy_report.c): the
 * rule row by row from a table (L = 0, a tiny L on separated scores, L = 1, ties to the lower id, a
 * re-ordering that is not a substitution, log space for probabilities, zero probabilities, NaN), the
 * margin, refusals, agreement with the router's own top-k (forward.c topk_row) on near-ties, and a
 * randomised sweep of the invariants (only resident experts come in, only misses go out, the count is
 * the set difference, the count grows with L).
 * Built and run under AddressSanitizer + UBSan by `make -C engine test`. Each BMOE_FAULT_SUBST_*
 * switch makes at least one check here fail (docs/policies.md). */
#include "check.h"
#include "forward.h"
#include "policy_report.h"
#include "policy_subst.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define EMAX 16
#define KMAX 8

typedef struct subst_case {
    const char *name;
    int E, k, probs;
    double L;
    float scores[EMAX];
    uint8_t res[EMAX];
    int32_t router[KMAX];     /* the router's ids (rank order) */
    int32_t want[KMAX];       /* ids after the policy */
    int want_changed;
    uint8_t want_sub[KMAX];
} subst_case;

static const float LOGITS8[8] = { 5, 4, 3, 2, 1, 0, -1, -2 }; /* range 7 */

static const subst_case CASES[] = {
    /* nothing changes */
    {"L = 0", 8, 2, 0, 0.0, {5, 4, 3, 2, 1, 0, -1, -2}, {0, 0, 1, 1, 1, 1, 1, 1}, {0, 1}, {0, 1}, 0, {0, 0}},
    {"tiny L on separated scores", 8, 2, 0, 1e-6, {5, 4, 3, 2, 1, 0, -1, -2}, {0, 0, 1, 1, 1, 1, 1, 1}, {0, 1},
     {0, 1}, 0, {0, 0}},
    {"everything resident", 8, 2, 0, 1.0, {5, 4, 3, 2, 1, 0, -1, -2}, {1, 1, 1, 1, 1, 1, 1, 1}, {0, 1}, {0, 1}, 0,
     {0, 0}},
    {"nothing resident", 8, 2, 0, 1.0, {5, 4, 3, 2, 1, 0, -1, -2}, {0}, {0, 1}, {0, 1}, 0, {0, 0}},
    {"the router's set already resident", 8, 2, 0, 1.0, {5, 4, 3, 2, 1, 0, -1, -2}, {1, 1, 0, 0, 0, 0, 0, 0},
     {0, 1}, {0, 1}, 0, {0, 0}},
    {"margin just short of the gap", 8, 2, 0, 0.02, {5, 4, 3.8f, 2, 1, 0, -1, -2}, {0, 0, 1}, {0, 1}, {0, 1}, 0,
     {0, 0}},

    /* a re-ordering of the router's own set is not a substitution: ids stay as the router gave them */
    {"re-ordering is not counted", 8, 2, 0, 0.5, {5, 4, 3, 2, 1, 0, -1, -2}, {0, 1}, {0, 1}, {0, 1}, 0, {0, 0}},
    {"re-ordering, k = 3", 8, 3, 0, 1.0, {5, 4, 3, 2, 1, 0, -1, -2}, {0, 1, 1}, {0, 1, 2}, {0, 1, 2}, 0, {0, 0, 0}},
    /* the router's rank order is not the id order: nothing to substitute leaves it exactly as it is */
    {"router order is not id order", 8, 2, 0, 0.0, {-2, -1, 0, 1, 2, 3, 4, 5}, {0, 0, 0, 0, 0, 0, 0, 0}, {7, 6},
     {7, 6}, 0, {0, 0}},
    {"re-ordering in score order, not id order", 8, 3, 0, 1.0, {-2, -1, 0, 1, 2, 3, 4, 5}, {0, 0, 0, 0, 0, 1, 1, 0},
     {7, 6, 5}, {7, 6, 5}, 0, {0, 0, 0}},

    /* substitutions */
    {"L = 1: one resident takes a slot", 8, 2, 0, 1.0, {5, 4, 3, 2, 1, 0, -1, -2}, {0, 0, 0, 1}, {0, 1}, {3, 0}, 1,
     {1, 0}},
    {"L = 1: every resident wins when it can", 8, 2, 0, 1.0, {5, 4, 3, 2, 1, 0, -1, -2}, {0, 0, 0, 0, 0, 1, 1},
     {0, 1}, {5, 6}, 2, {1, 1}},
    {"L = 1: three residents for two slots", 8, 2, 0, 1.0, {5, 4, 3, 2, 1, 0, -1, -2}, {0, 0, 1, 0, 1, 0, 1},
     {0, 1}, {2, 4}, 2, {1, 1}},
    {"a kept expert moves down a slot", 8, 3, 0, 0.5, {5, 4, 3, 2, 1, 0, -1, -2}, {0, 1, 0, 1}, {0, 1, 2}, {1, 3, 0},
     1, {0, 1, 0}},
    {"margin just over the gap", 8, 2, 0, 0.03, {5, 4, 3.8f, 2, 1, 0, -1, -2}, {0, 0, 1}, {0, 1}, {0, 2}, 1, {0, 1}},

    /* ties go to the lower id, as in the router */
    {"tie: the higher-id resident loses", 3, 1, 0, 1.0, {3, 1, 0}, {0, 0, 1}, {0}, {0}, 0, {0}},
    {"tie: the lower-id resident wins", 3, 1, 0, 1.0, {0, 3, 1}, {1, 0, 0}, {1}, {0}, 1, {1}},

    /* probabilities rank in log space: log(0.3/0.15) = 0.69 < 0.2 * log(0.5/0.01) = 0.78, while in
     * linear space 0.15 + 0.2 * 0.5 < 0.3 */
    {"log space for probabilities", 8, 2, 1, 0.2, {0.5f, 0.3f, 0.15f, 0.04f, 0.01f, 0, 0, 0}, {0, 0, 1}, {0, 1},
     {0, 2}, 1, {0, 1}},
    {"the same scores read as logits", 8, 2, 0, 0.2, {0.5f, 0.3f, 0.15f, 0.04f, 0.01f, 0, 0, 0}, {0, 0, 1}, {0, 1},
     {0, 1}, 0, {0, 0}},
    {"a zero probability is -inf and never wins", 8, 2, 1, 1.0, {0.9f, 0.1f, 0, 0, 0, 0, 0, 0},
     {0, 0, 1, 1, 1, 1, 1, 1}, {0, 1}, {0, 1}, 0, {0, 0}},
    {"one finite score: no range, no margin", 4, 1, 1, 1.0, {1.0f, 0, 0, 0}, {0, 1, 1, 1}, {0}, {0}, 0, {0}},
    {"a zero probability does not widen the range", 8, 1, 1, 0.2, {0.6f, 0.3f, 0.1f, 0, 0, 0, 0, 0},
     {0, 1}, {0}, {0}, 0, {0}},
    {"... and the same row substitutes at a wider margin", 8, 1, 1, 0.5, {0.6f, 0.3f, 0.1f, 0, 0, 0, 0, 0},
     {0, 1}, {0}, {1}, 1, {1}},

    /* NaN scores are ignored by the range and never chosen */
    {"NaN score", 4, 2, 0, 1.0, {2, NAN, 1, 0}, {0, 1, 0, 1}, {0, 2}, {0, 3}, 1, {0, 1}},
};

static void run_case(const subst_case *c) {
    int32_t ids[KMAX];
    uint8_t sub[KMAX];
    double work[EMAX];
    subst_counts cnt = { -1, -1 };
    for (int s = 0; s < c->k; s++) { ids[s] = c->router[s]; sub[s] = 7; }
    int n = subst_row(c->scores, c->probs, c->res, c->E, c->k, c->L, ids, sub, work, &cnt);
    int bad = n != c->want_changed || cnt.changed != c->want_changed || cnt.examined != c->k;
    for (int s = 0; s < c->k; s++) bad |= ids[s] != c->want[s] || sub[s] != c->want_sub[s];
    if (bad) {
        fprintf(stderr, "case '%s': changed %d (want %d), examined %d; ids:", c->name, n, c->want_changed, cnt.examined);
        for (int s = 0; s < c->k; s++) fprintf(stderr, " %d/%d(want %d/%d)", ids[s], sub[s], c->want[s], c->want_sub[s]);
        fprintf(stderr, "\n");
    }
    CHECK(!bad);
}

static void test_table(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(&CASES[i]);
}

static void test_margin(void) {
    CHECK(subst_margin(LOGITS8, 0, 8, 1.0) == 7.0);
    CHECK(subst_margin(LOGITS8, 0, 8, 0.0) == 0.0);
    const float p[8] = { 0.5f, 0.3f, 0.15f, 0.04f, 0.01f, 0, 0, 0 };
    double m = subst_margin(p, 1, 8, 0.2);
    CHECK(fabs(m - 0.2 * log((double)0.5f / (double)0.01f)) < 1e-12);
    const float one[3] = { 0.7f, NAN, INFINITY };
    CHECK(subst_margin(one, 0, 3, 1.0) == 0.0);
}

static void test_refusals(void) {
    const float sc[4] = { 4, 3, 2, 1 };
    const uint8_t res[4] = { 0, 0, 1, 1 };
    double work[4];
    int32_t ids[2] = { 0, 1 };
    uint8_t sub[2] = { 9, 9 };
    subst_counts cnt = { -1, -1 };
    CHECK(subst_row(NULL, 0, res, 4, 2, 1.0, ids, sub, work, &cnt) == -1);
    CHECK(subst_row(sc, 0, NULL, 4, 2, 1.0, ids, sub, work, &cnt) == -1);
    CHECK(subst_row(sc, 0, res, 4, 2, 1.0, NULL, sub, work, &cnt) == -1);
    CHECK(subst_row(sc, 0, res, 4, 2, 1.0, ids, sub, NULL, &cnt) == -1);
    CHECK(subst_row(sc, 0, res, 4, 0, 1.0, ids, sub, work, &cnt) == -1);
    CHECK(subst_row(sc, 0, res, 4, 5, 1.0, ids, sub, work, &cnt) == -1);
    CHECK(subst_row(sc, 0, res, 4, 2, NAN, ids, sub, work, &cnt) == -1);
    ids[1] = 4;
    CHECK(subst_row(sc, 0, res, 4, 2, 1.0, ids, sub, work, &cnt) == -1);
    ids[1] = -1;
    CHECK(subst_row(sc, 0, res, 4, 2, 1.0, ids, sub, work, &cnt) == -1);
    CHECK(ids[0] == 0 && ids[1] == -1 && sub[0] == 9 && sub[1] == 9 && cnt.examined == -1 && cnt.changed == -1);
    ids[1] = 1;
    /* optional outputs; adj = {4, 3, 5, 4}: 2 first, then the tie 0/3 goes to 0 */
    CHECK(subst_row(sc, 0, res, 4, 2, 1.0, ids, NULL, work, NULL) == 1);
    CHECK(ids[0] == 2 && ids[1] == 0);
}

static void test_gather(void) {
    const float p[5] = { 0.1f, 0.2f, 0.3f, 0.15f, 0.25f };
    const int32_t ids[3] = { 2, 4, 0 };
    float w[3];
    subst_gather_weights(p, ids, 3, w);
    CHECK(w[0] == 0.3f && w[1] == 0.25f && w[2] == 0.1f);
}

static uint64_t rs = 0x2545f4914f6cdd1dull;
static double urand(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rs >> 11) / 9007199254740992.0;
}

/* With L = 0 (or everything resident) the log-space re-rank must reproduce the router's set, also on
 * probabilities one float step apart and on tiny probabilities where a float log would collide. */
static void test_router_agreement(void) {
    int bad = 0;
    for (int it = 0; it < 5000; it++) {
        int E = 2 + (int)(urand() * (EMAX - 1));
        int k = 1 + (int)(urand() * (E < KMAX ? E : KMAX));
        if (k > E) k = E;
        float p[EMAX];
        for (int e = 0; e < E; e++) {
            double x = urand();
            p[e] = it % 3 == 0 ? (float)(1e-30 * (1.0 + x)) : (float)x;
        }
        if (it % 2 == 0 && E >= 3) { /* near-ties one float step apart, and an exact tie */
            p[1] = nextafterf(p[0], 1.0f);
            p[2] = p[0];
        }
        int32_t router[KMAX], ids[KMAX];
        topk_row(p, E, k, router);
        uint8_t res[EMAX], all[EMAX];
        for (int e = 0; e < E; e++) { res[e] = urand() < 0.5; all[e] = 1; }
        double work[EMAX];
        memcpy(ids, router, sizeof(int32_t) * (size_t)k);
        if (subst_row(p, 1, res, E, k, 0.0, ids, NULL, work, NULL) != 0) bad++;
        if (memcmp(ids, router, sizeof(int32_t) * (size_t)k) != 0) bad++;
        if (subst_row(p, 1, all, E, k, 1.0, ids, NULL, work, NULL) != 0) bad++;
        if (subst_row(p, 0, all, E, k, 1.0, ids, NULL, work, NULL) != 0) bad++;
        if (memcmp(ids, router, sizeof(int32_t) * (size_t)k) != 0) bad++;
    }
    if (bad) fprintf(stderr, "router agreement: %d violations\n", bad);
    CHECK(bad == 0);
}

static int in_ids(const int32_t *ids, int k, int32_t e) {
    for (int s = 0; s < k; s++)
        if (ids[s] == e) return 1;
    return 0;
}

/* Invariants over random softmax rows: ids stay distinct and in range; an expert that comes in is
 * resident, one that goes out is a miss; changed is the set difference and matches the mask; the
 * count never falls as L grows; a tiny L on separated scores changes nothing. */
static void test_sweep(void) {
    static const double Ls[] = { 0.0, 1e-6, 0.05, 0.15, 0.3, 0.6, 1.0 };
    int bad = 0;
    long total = 0;
    for (int it = 0; it < 3000; it++) {
        int E = 8 + (int)(urand() * (EMAX - 7));
        if (E > EMAX) E = EMAX;
        int k = 1 + (int)(urand() * KMAX);
        float logit[EMAX], p[EMAX];
        double z = 0.0;
        for (int e = 0; e < E; e++) { logit[e] = (float)(6.0 * urand() - 3.0); z += exp(logit[e]); }
        for (int e = 0; e < E; e++) p[e] = (float)(exp(logit[e]) / z);
        uint8_t res[EMAX];
        for (int e = 0; e < E; e++) res[e] = urand() < 0.4;
        int32_t router[KMAX];
        topk_row(p, E, k, router);
        int prev = -1;
        for (size_t li = 0; li < sizeof Ls / sizeof Ls[0]; li++) {
            int32_t ids[KMAX];
            uint8_t sub[KMAX];
            double work[EMAX];
            subst_counts cnt;
            memcpy(ids, router, sizeof ids);
            int n = subst_row(p, 1, res, E, k, Ls[li], ids, sub, work, &cnt);
            int diff = 0;
            for (int s = 0; s < k; s++) {
                if (ids[s] < 0 || ids[s] >= E) bad++;
                for (int r = 0; r < s; r++) bad += ids[r] == ids[s];
                int incoming = !in_ids(router, k, ids[s]);
                diff += incoming;
                if (incoming && !res[ids[s]]) bad++;
                if (sub[s] != incoming) bad++;
                if (!in_ids(ids, k, router[s]) && res[router[s]]) bad++; /* a resident never goes out */
            }
            if (n != diff || cnt.changed != n || cnt.examined != k) bad++;
            if (n == 0 && memcmp(ids, router, sizeof(int32_t) * (size_t)k) != 0) bad++;
            if (n < prev) bad++;
            if (Ls[li] == 0.0 && n != 0) bad++;
            prev = n;
            total += n;
        }
    }
    if (bad) fprintf(stderr, "sweep: %d violations\n", bad);
    CHECK(bad == 0);
    CHECK(total > 1000); /* the sweep does exercise substitutions */
}

static void test_report(void) {
    char b[256];
    report_subst_line(b, sizeof b, 122, 192, 1.0);
    CHECK(strcmp(b, "moe-subst: 122/192 slots substituted (63.5%), margin 1 x range") == 0);
    report_subst_line(b, sizeof b, 0, 144, 1e-6);
    CHECK(strcmp(b, "moe-subst: 0/144 slots substituted (0.0%), margin 1e-06 x range") == 0);
    report_subst_line(b, sizeof b, 27, 100, 0.15);
    CHECK(strcmp(b, "moe-subst: 27/100 slots substituted (27.0%), margin 0.15 x range") == 0);
    report_subst_line(b, sizeof b, 0, 0, 0.0);
    CHECK(strcmp(b, "moe-subst: 0/0 slots substituted (0.0%), margin 0 x range") == 0);
}

int main(void) {
    test_table();
    test_margin();
    test_refusals();
    test_gather();
    test_router_agreement();
    test_sweep();
    test_report();
    return check_report("test_policy_subst");
}
