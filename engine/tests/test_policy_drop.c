/* Unit tests of --drop-cold-experts (policy_drop.c) and of its report lines (policy_report.c): the rule
 * row by row from a table (misses below the bound, residents kept, the pinned top, ties, k = 1, F = 0,
 * F = 1 at the bound, equal weights, scaled and unnormalised rows, the effective vs the model top-k,
 * NaN), the edits (zeroed weight, renormalised mass, repointed id, untouched rows), a randomised sweep
 * of the invariants, and the exact moe-drop line and narrow-routing warning.
 * Built and run under AddressSanitizer + UBSan by `make -C engine test`. Each BMOE_FAULT_* switch of
 * policy_drop.c / policy_report.c makes at least one check here fail (docs/policies.md). */
#include "check.h"
#include "policy_drop.h"
#include "policy_report.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KMAX 8
#define NA (-1.0f) /* "expected weight not given": only the mass and ratio checks apply */

typedef struct drop_case {
    const char *name;
    int k, k_model;
    double F;
    int renorm;
    float w[KMAX];
    uint8_t res[KMAX];
    uint8_t want_dropped[KMAX];
    int32_t want_ids[KMAX];  /* ids start as 10, 11, 12, ... (slot s holds expert 10 + s) */
    float want_w[KMAX];      /* NA: not checked one by one */
} drop_case;

static const drop_case CASES[] = {
    /* nothing to drop */
    {"all resident", 2, 2, 1.0, 1, {0.7f, 0.3f}, {1, 1}, {0, 0}, {10, 11}, {0.7f, 0.3f}},
    {"miss above the bound", 2, 2, 0.5, 1, {0.7f, 0.3f}, {1, 0}, {0, 0}, {10, 11}, {0.7f, 0.3f}},
    {"F = 0 drops nothing", 2, 2, 0.0, 1, {0.6f, 0.4f}, {0, 0}, {0, 0}, {10, 11}, {0.6f, 0.4f}},
    {"k = 1, normalised", 1, 2, 1.0, 1, {1.0f}, {0}, {0}, {10}, {1.0f}},
    {"k = 1, unnormalised (only the pin protects it)", 1, 2, 1.0, 1, {0.3f}, {0}, {0}, {10}, {0.3f}},
    {"equal weights sit on the bound at F = 1", 4, 4, 1.0, 1, {0.25f, 0.25f, 0.25f, 0.25f}, {0, 0, 0, 0},
     {0, 0, 0, 0}, {10, 11, 12, 13}, {0.25f, 0.25f, 0.25f, 0.25f}},
    {"resident below the bound is kept", 3, 3, 1.0, 1, {0.6f, 0.3f, 0.1f}, {0, 1, 1}, {0, 0, 0}, {10, 11, 12},
     {0.6f, 0.3f, 0.1f}},

    /* drops */
    {"one miss below the bound", 2, 2, 1.0, 1, {0.75f, 0.25f}, {1, 0}, {0, 1}, {10, 10}, {1.0f, 0.0f}},
    {"no-renorm leaves survivors", 3, 3, 1.0, 0, {0.5f, 0.3f, 0.2f}, {1, 0, 0}, {0, 1, 1}, {10, 10, 10},
     {0.5f, 0.0f, 0.0f}},
    {"renorm to the original mass", 3, 3, 1.0, 1, {0.5f, 0.25f, 0.25f}, {1, 1, 0}, {0, 0, 1}, {10, 11, 10},
     {0.6666667f, 0.33333334f, 0.0f}},
    {"top is a miss and pinned", 3, 3, 1.0, 1, {0.8f, 0.15f, 0.05f}, {0, 1, 0}, {0, 0, 1}, {10, 11, 10}, {NA}},
    {"top below the bound is still pinned", 2, 2, 1.0, 1, {0.25f, 0.125f}, {0, 0}, {0, 1}, {10, 10},
     {0.375f, 0.0f}},
    {"top in the middle of the rank order", 3, 3, 1.0, 1, {0.125f, 0.5f, 0.125f}, {0, 0, 0}, {1, 0, 1},
     {11, 11, 11}, {0.0f, 0.75f, 0.0f}},
    {"tie for top: the first maximum is pinned", 3, 3, 1.0, 1, {0.0625f, 0.25f, 0.25f}, {0, 0, 0}, {1, 0, 1},
     {11, 11, 11}, {0.0f, 0.5625f, 0.0f}},
    {"equal unnormalised weights: all but slot 0", 4, 4, 1.0, 1, {0.125f, 0.125f, 0.125f, 0.125f}, {0, 0, 0, 0},
     {0, 1, 1, 1}, {10, 10, 10, 10}, {0.5f, 0.0f, 0.0f, 0.0f}},
    {"scaled row (mass 1.25)", 2, 2, 1.0, 1, {1.0f, 0.25f}, {1, 0}, {0, 1}, {10, 10}, {1.25f, 0.0f}},
    {"strictly below: 0.24 < 1/4 but 0.25 is not", 4, 4, 1.0, 1, {0.26f, 0.25f, 0.25f, 0.24f}, {0, 0, 0, 0},
     {0, 0, 0, 1}, {10, 11, 12, 10}, {NA}},
    {"wide row, F = 0.75", 8, 8, 0.75, 1, {0.3f, 0.2f, 0.15f, 0.1f, 0.09f, 0.08f, 0.05f, 0.03f},
     {0, 0, 1, 0, 0, 1, 0, 0}, {0, 0, 0, 0, 1, 0, 1, 1}, {10, 11, 12, 13, 10, 15, 10, 10}, {NA}},

    /* the width is the effective top-k, never the model's */
    {"effective 4 of a top-2 model", 4, 2, 1.0, 1, {0.4f, 0.3f, 0.2f, 0.1f}, {0, 0, 0, 0}, {0, 0, 1, 1},
     {10, 11, 10, 10}, {NA}},
    {"effective 2 of a top-8 model", 2, 8, 1.0, 1, {0.75f, 0.25f}, {0, 0}, {0, 1}, {10, 10}, {1.0f, 0.0f}},

    /* NaN is never dropped and never spread */
    {"NaN weight", 3, 3, 1.0, 1, {0.6f, NAN, 0.1f}, {0, 0, 0}, {0, 0, 1}, {10, 11, 10}, {NA}},
};

static int ulps_close(float a, float b, int ulps) {
    if (a == b) return 1;
    return fabsf(a - b) <= (float)ulps * FLT_EPSILON * fmaxf(fabsf(a), fabsf(b));
}

static void run_case(const drop_case *c) {
    drop_params p = { .F = c->F, .k_effective = c->k, .k_model = c->k_model, .renorm = c->renorm };
    int32_t ids[KMAX];
    float w[KMAX], w0[KMAX];
    uint8_t dropped[KMAX];
    for (int s = 0; s < c->k; s++) { ids[s] = 10 + s; w[s] = w0[s] = c->w[s]; dropped[s] = 7; }
    int n = drop_row(&p, ids, w, c->res, dropped);

    int want_n = 0, bad = 0;
    for (int s = 0; s < c->k; s++) want_n += c->want_dropped[s];
    if (n != want_n) bad = 1;
    for (int s = 0; s < c->k; s++) {
        if (dropped[s] != c->want_dropped[s]) bad = 1;
        if (ids[s] != c->want_ids[s]) bad = 1;
        if (c->want_dropped[s] && w[s] != 0.0f) bad = 1;
        if (c->want_w[0] != NA && !(isnan(c->want_w[s]) ? isnan(w[s]) : ulps_close(w[s], c->want_w[s], 1))) bad = 1;
        if (isnan(w[s]) && !isnan(w0[s])) bad = 1; /* no NaN introduced */
    }
    if (want_n == 0 && memcmp(w, w0, sizeof(float) * (size_t)c->k) != 0) bad = 1; /* untouched, bit for bit */
    if (bad) {
        fprintf(stderr, "case '%s': n=%d (want %d); slot: dropped id w\n", c->name, n, want_n);
        for (int s = 0; s < c->k; s++)
            fprintf(stderr, "  %d: %d %d %.9g (want %d %d %.9g)\n", s, dropped[s], ids[s], w[s], c->want_dropped[s],
                    c->want_ids[s], c->want_w[0] != NA ? c->want_w[s] : -1.0f);
    }
    CHECK(!bad);
}

static double mass(const float *w, int k) {
    double m = 0.0;
    for (int s = 0; s < k; s++) m += (double)w[s];
    return m;
}

static void test_table(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(&CASES[i]);
}

/* Renormalisation keeps the routing's mass to float rounding: |new - orig| <= k/2 ulp of the mass. */
static void test_renorm_mass(void) {
    drop_params p = { .F = 1.0, .k_effective = 3, .k_model = 3, .renorm = 1 };
    int32_t ids[3] = { 4, 5, 6 };
    float w[3] = { 0.55f, 0.3f, 0.15f };
    uint8_t res[3] = { 1, 1, 0 };
    double before = mass(w, 3);
    CHECK(drop_row(&p, ids, w, res, NULL) == 1);
    CHECK(fabs(mass(w, 3) - before) <= 1.5 * FLT_EPSILON * before);
    CHECK(w[2] == 0.0f && ids[2] == 4);
    /* the ratio of the survivors is the router's */
    CHECK(fabs((double)w[0] / (double)w[1] - 0.55 / 0.3) < 1e-6);

    /* no-renorm: the mass drops by exactly the dropped weight */
    float v[3] = { 0.55f, 0.3f, 0.15f };
    int32_t ids2[3] = { 4, 5, 6 };
    p.renorm = 0;
    CHECK(drop_row(&p, ids2, v, res, NULL) == 1);
    CHECK(v[0] == 0.55f && v[1] == 0.3f && v[2] == 0.0f);
}

/* Edge inputs: nothing written on refusal, drop_applies, the threshold itself. */
static void test_edges(void) {
    drop_params p = { .F = 1.0, .k_effective = 2, .k_model = 2, .renorm = 1 };
    int32_t ids[2] = { 1, 2 };
    float w[2] = { 0.9f, 0.1f };
    uint8_t res[2] = { 0, 0 }, d[2] = { 9, 9 };
    CHECK(drop_row(NULL, ids, w, res, d) == -1);
    CHECK(drop_row(&p, NULL, w, res, d) == -1);
    CHECK(drop_row(&p, ids, NULL, res, d) == -1);
    CHECK(drop_row(&p, ids, w, NULL, d) == -1);
    p.k_effective = 0;
    CHECK(drop_row(&p, ids, w, res, d) == -1);
    p.k_effective = 2;
    p.F = NAN;
    CHECK(drop_row(&p, ids, w, res, d) == -1);
    CHECK(ids[0] == 1 && ids[1] == 2 && w[0] == 0.9f && w[1] == 0.1f && d[0] == 9 && d[1] == 9);
    p.F = 1.0;
    CHECK(drop_row(&p, ids, w, res, NULL) == 1); /* a NULL mask is fine */
    CHECK(ids[1] == 1 && w[1] == 0.0f && w[0] == 1.0f);

    drop_params q = { .F = 0.75, .k_effective = 2, .k_model = 8 };
    CHECK(drop_threshold(&q) == 0.375);
    q.k_effective = 8;
    CHECK(drop_threshold(&q) == 0.09375);
    CHECK(drop_applies(&q, 1) == 1);
    CHECK(drop_applies(&q, 0) == 0);
    q.in_prefill = 1;
    CHECK(drop_applies(&q, 0) == 1);

    float t1[3] = { 0.2f, 0.5f, 0.5f }, t2[2] = { NAN, NAN }, t3[3] = { NAN, 0.1f, 0.2f };
    CHECK(drop_top_slot(t1, 3) == 1);
    CHECK(drop_top_slot(t2, 2) == 0);
    CHECK(drop_top_slot(t3, 3) == 2);

    /* all-zero row: the top is pinned, the others are dropped, and nothing is divided by zero */
    drop_params z = { .F = 1.0, .k_effective = 3, .k_model = 3, .renorm = 1 };
    int32_t zi[3] = { 3, 4, 5 };
    float zw[3] = { 0.0f, 0.0f, 0.0f };
    uint8_t zr[3] = { 0, 0, 0 };
    CHECK(drop_row(&z, zi, zw, zr, NULL) == 2);
    CHECK(zw[0] == 0.0f && zw[1] == 0.0f && zw[2] == 0.0f && !isnan(zw[0]));
    CHECK(zi[0] == 3 && zi[1] == 3 && zi[2] == 3);
}

/* Randomised sweep of the invariants over softmax rows: the dropped set is exactly the rule's, the top
 * slot survives, dropped ids point at the top expert, the mass is kept, no NaN or Inf appears, and a
 * row with nothing dropped is bit-identical. */
static uint64_t rs = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rs >> 11) / 9007199254740992.0;
}

static void test_sweep(void) {
    static const double Fs[] = { 0.0, 1e-6, 0.25, 0.5, 0.75, 1.0 };
    int bad = 0, rows = 0, total_dropped = 0;
    for (int it = 0; it < 20000; it++) {
        int k = 1 + (int)(urand() * KMAX);
        double F = Fs[it % 6];
        float w[KMAX], w0[KMAX];
        int32_t ids[KMAX], ids0[KMAX];
        uint8_t res[KMAX], d[KMAX];
        double sum = 0.0;
        for (int s = 0; s < k; s++) { w[s] = (float)exp(4.0 * urand()); sum += w[s]; }
        for (int s = 0; s < k; s++) {
            w[s] = (float)(w[s] / sum);
            w0[s] = w[s];
            ids[s] = ids0[s] = (int32_t)(s * 3 + 1);
            res[s] = urand() < 0.5;
        }
        drop_params p = { .F = F, .k_effective = k, .k_model = 8, .renorm = it % 5 != 0 };
        int n = drop_row(&p, ids, w, res, d);
        rows++;
        total_dropped += n;
        int top = drop_top_slot(w0, k);
        int cnt = 0;
        for (int s = 0; s < k; s++) {
            int want = s != top && !res[s] && (double)w0[s] < F / k;
            if (d[s] != want) bad++;
            cnt += want;
            if (!isfinite(w[s])) bad++;
            if (want && (w[s] != 0.0f || ids[s] != ids0[top])) bad++;
            if (!want && ids[s] != ids0[s]) bad++;
        }
        if (n != cnt || d[top]) bad++;
        if (n == 0 && memcmp(w, w0, sizeof(float) * (size_t)k) != 0) bad++;
        if (n > 0 && p.renorm && fabs(mass(w, k) - mass(w0, k)) > 0.5 * k * FLT_EPSILON * mass(w0, k)) bad++;
        if (k == 1 && n != 0) bad++;
        if (F == 0.0 && n != 0) bad++;
    }
    if (bad) fprintf(stderr, "sweep: %d violations in %d rows\n", bad, rows);
    CHECK(bad == 0);
    CHECK(total_dropped > 1000); /* the sweep does exercise drops */
}

/* ---- policy_report: moe-drop line and the narrow-routing warning ---- */

static void test_report(void) {
    char b[512];
    report_drop_line(b, sizeof b, 3, 10, 0.75);
    CHECK(strcmp(b, "moe-drop: 3/10 routed experts dropped (30.0%), threshold 0.75 x uniform") == 0);
    report_drop_line(b, sizeof b, 0, 0, 1e-6);
    CHECK(strcmp(b, "moe-drop: 0/0 routed experts dropped (0.0%), threshold 1e-06 x uniform") == 0);
    report_drop_line(b, sizeof b, 2, 3, 1.0);
    CHECK(strcmp(b, "moe-drop: 2/3 routed experts dropped (66.7%), threshold 1 x uniform") == 0);
    report_drop_line(b, sizeof b, 1, 16, 0.5);
    CHECK(strcmp(b, "moe-drop: 1/16 routed experts dropped (6.3%), threshold 0.5 x uniform") == 0);
    report_drop_line(b, sizeof b, 192, 192, 1.0);
    CHECK(strcmp(b, "moe-drop: 192/192 routed experts dropped (100.0%), threshold 1 x uniform") == 0);

    CHECK(report_pct_tenths(1, 2000) == 1);  /* 0.05% rounds half up */
    CHECK(report_pct_tenths(1, 2001) == 0);
    CHECK(report_pct_tenths(UINT64_MAX, UINT64_MAX) == 1000);
    CHECK(report_pct_tenths(UINT64_MAX / 2, UINT64_MAX) == 500);
    CHECK(report_pct_tenths(5, 0) == 0);

    /* a short buffer is truncated, terminated, and the full length is returned */
    char s[16];
    int need = report_drop_line(s, sizeof s, 3, 10, 0.75);
    CHECK(need > (int)sizeof s - 1 && strlen(s) == sizeof s - 1);

    /* the warning: F/k here against F/8, both from F */
    CHECK(report_narrow_warning(b, sizeof b, 1, 0.75, 2) == 1);
    CHECK(strcmp(b, "bmoe: WARNING drop-cold-experts=0.75 with top-k 2: the threshold is 37.5% of the routing here, "
                    "against 9.4% at the top-k 8 this was measured on; a miss loses a far larger share of each "
                    "routing at this width, which nothing here has measured, so verify output quality on your workload") == 0);
    CHECK(strchr(b, '\n') == NULL);
    CHECK(report_narrow_warning(b, sizeof b, 1, 0.75, 4) == 1);
    CHECK(strstr(b, "with top-k 4: ") && strstr(b, " is 18.8% of the routing ") && strstr(b, "against 9.4% at the top-k 8"));
    CHECK(report_narrow_warning(b, sizeof b, 1, 1.0, 1) == 1);
    CHECK(strstr(b, "=1 with top-k 1: ") && strstr(b, " is 100.0% of ") && strstr(b, "against 12.5% at the top-k 8"));
    CHECK(report_narrow_warning(b, sizeof b, 1, 0.5, 3) == 1);
    CHECK(strstr(b, " is 16.7% of ") && strstr(b, "against 6.3% at the top-k 8"));
    CHECK(report_narrow_warning(b, sizeof b, 1, 0.25, 2) == 1);
    CHECK(strstr(b, " is 12.5% of ") && strstr(b, "against 3.1% at the top-k 8")); /* 3.125 → 3.1 */
    CHECK(report_narrow_warning(b, sizeof b, 1, 0.0, 2) == 1); /* armed is armed, even inert */
    CHECK(strstr(b, " is 0.0% of ") && strstr(b, "against 0.0% at the top-k 8"));

    /* not due: top-k above 4, dropping off, nonsense inputs; the buffer is left empty */
    b[0] = 'x';
    CHECK(report_narrow_warning(b, sizeof b, 1, 0.75, 8) == 0 && b[0] == 0);
    CHECK(report_narrow_warning(b, sizeof b, 1, 0.75, 5) == 0 && b[0] == 0);
    CHECK(report_narrow_warning(b, sizeof b, 0, 0.75, 2) == 0 && b[0] == 0);
    CHECK(report_narrow_warning(b, sizeof b, 1, NAN, 2) == 0);
    CHECK(report_narrow_warning(b, sizeof b, 1, 0.75, 0) == 0);
    CHECK(report_narrow_warning(NULL, 0, 1, 0.75, 2) == 1); /* "is it due" without formatting */

    CHECK(report_share_tenths(0.75, 2) == 375);
    CHECK(report_share_tenths(0.75, 4) == 188);
    CHECK(report_share_tenths(0.75, 8) == 94);
    CHECK(report_share_tenths(INFINITY, 2) == -1);
}

int main(void) {
    test_table();
    test_renorm_mass();
    test_edges();
    test_sweep();
    test_report();
    return check_report("test_policy_drop");
}
