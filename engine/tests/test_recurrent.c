/* The recurrent pieces (recurrent.h): the convolution's taps and state on exact values, the delta rule
 * against a float64 transcription of docs/model-math.md, prefill rows equal to single rows, every
 * kernel path equal to the scalar one, the L2 norm and the gates, and the state's positions. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "recurrent.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Taps, state and the carry between calls, on small integers (every float operation exact). */
static void test_conv(void) {
    enum { C = 3, K = 4, T = 5 };
    float w[C * K], x[T * C], y[T * C], st[C * (K - 1)];
    for (int i = 0; i < C * K; i++) w[i] = (float)(i % 5) - 2.0f;
    for (int i = 0; i < T * C; i++) x[i] = (float)((i * 7) % 11) - 5.0f;
    for (int i = 0; i < C * (K - 1); i++) st[i] = (float)(i % 3) + 1.0f;
    float st0[C * (K - 1)];
    memcpy(st0, st, sizeof st);
    rec_conv(x, C, T, w, K, st, y, C, 0, C);
    int ok = 1;
    for (int c = 0; c < C; c++)
        for (int t = 0; t < T; t++) {
            double want = 0.0;
            for (int i = 0; i < K; i++) {
                int e = t + i; /* window: 3 state values, then x */
                double xv = e < K - 1 ? st0[c * (K - 1) + e] : x[(e - (K - 1)) * C + c];
                want += (double)w[c * K + i] * xv;
            }
            ok &= y[t * C + c] == (float)want;
        }
    CHECK(ok);
    ok = 1; /* the state is the last K-1 inputs */
    for (int c = 0; c < C; c++)
        for (int e = 0; e < K - 1; e++) ok &= st[c * (K - 1) + e] == x[(T - (K - 1) + e) * C + c];
    CHECK(ok);
    /* one position at a time, and two at a time (fewer than K-1: the state shifts), give the same rows */
    float st1[C * (K - 1)], st2[C * (K - 1)], y1[T * C], y2[T * C];
    memcpy(st1, st0, sizeof st0);
    memcpy(st2, st0, sizeof st0);
    for (int t = 0; t < T; t++) rec_conv(x + t * C, C, 1, w, K, st1, y1 + t * C, C, 0, C);
    rec_conv(x, C, 2, w, K, st2, y2, C, 0, C);
    rec_conv(x + 2 * C, C, 3, w, K, st2, y2 + 2 * C, C, 0, C);
    CHECK(memcmp(y1, y, sizeof y) == 0 && memcmp(st1, st, sizeof st) == 0);
    CHECK(memcmp(y2, y, sizeof y) == 0 && memcmp(st2, st, sizeof st) == 0);
    /* a channel range touches only its channels */
    float st3[C * (K - 1)], y3[T * C];
    memcpy(st3, st0, sizeof st0);
    for (int i = 0; i < T * C; i++) y3[i] = 99.0f;
    rec_conv(x, C, T, w, K, st3, y3, C, 1, 2);
    CHECK(y3[0] == 99.0f && y3[2] == 99.0f && y3[1] == y[1] && st3[0] == st0[0] && st3[K - 1] == st[K - 1]);
}

/* The delta rule in double, written from the docs' formulas with the state as state[i][j]. */
static void delta_ref(int S, int T, const float *q, const float *k, const float *v, const float *g,
                      const float *beta, double *st, double *o) {
    for (int t = 0; t < T; t++) {
        const float *qt = q + t * S, *kt = k + t * S, *vt = v + t * S;
        double decay = exp((double)g[t]);
        for (int x = 0; x < S * S; x++) st[x] *= decay;
        for (int j = 0; j < S; j++) {
            double sk = 0.0;
            for (int i = 0; i < S; i++) sk += st[i * S + j] * kt[i];
            double d = ((double)vt[j] - sk) * beta[t];
            for (int i = 0; i < S; i++) st[i * S + j] += kt[i] * d;
        }
        for (int j = 0; j < S; j++) {
            double s = 0.0;
            for (int i = 0; i < S; i++) s += st[i * S + j] * qt[i];
            o[t * S + j] = s / sqrt((double)S);
        }
    }
}

static void test_delta(void) {
    enum { S = 12, T = 9 };
    static float q[T * S], k[T * S], v[T * S], g[T], b[T], M[S * S], o[T * S], tmp[S];
    static double st[S * S], oref[T * S];
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < S; i++) q[t * S + i] = frand(), k[t * S + i] = frand(), v[t * S + i] = frand();
        rec_l2norm(q + t * S, S, 1e-6);
        rec_l2norm(k + t * S, S, 1e-6);
        g[t] = rec_gate(frand() * 3.0f, 0.5f, -0.7f);
        b[t] = rec_beta(frand() * 2.0f);
    }
    bm_kernels scalar;
    bm_kernels_get(BM_KPATH_SCALAR, &scalar);
    memset(M, 0, sizeof M);
    rec_delta_head(&scalar, S, T, q, S, k, S, v, S, g, b, 1, M, o, S, tmp);
    memset(st, 0, sizeof st);
    delta_ref(S, T, q, k, v, g, b, st, oref);
    double worst = 0.0;
    for (int x = 0; x < T * S; x++) worst = fmax(worst, fabs(o[x] - oref[x]));
    for (int i = 0; i < S; i++)
        for (int j = 0; j < S; j++) worst = fmax(worst, fabs(M[j * S + i] - st[i * S + j]));
    CHECK(worst < 1e-5);
    /* token by token: the same bits */
    static float M1[S * S], o1[T * S];
    memset(M1, 0, sizeof M1);
    for (int t = 0; t < T; t++) rec_delta_head(&scalar, S, 1, q + t * S, S, k + t * S, S, v + t * S, S, g + t, b + t, 1, M1, o1 + t * S, S, tmp);
    CHECK(memcmp(M1, M, sizeof M) == 0 && memcmp(o1, o, sizeof o) == 0);
    /* every kernel path this CPU has: the scalar bits */
    for (int p = 1; p < BM_KPATH_COUNT; p++) {
        if (!bm_kpath_available((bm_kpath)p)) continue;
        bm_kernels kp;
        bm_kernels_get((bm_kpath)p, &kp);
        static float M2[S * S], o2[T * S];
        memset(M2, 0, sizeof M2);
        rec_delta_head(&kp, S, T, q, S, k, S, v, S, g, b, 1, M2, o2, S, tmp);
        CHECK(memcmp(M2, M, sizeof M) == 0 && memcmp(o2, o, sizeof o) == 0);
    }
}

static void test_norm_and_gates(void) {
    float x[5] = { 3.0f, 4.0f, 0.0f, 0.0f, 0.0f };
    rec_l2norm(x, 5, 0.0);
    CHECK(fabsf(x[0] - 0.6f) < 1e-7f && fabsf(x[1] - 0.8f) < 1e-7f && x[2] == 0.0f);
    float z[3] = { 0.0f, 0.0f, 0.0f };
    rec_l2norm(z, 3, 1e-6); /* eps keeps a zero row finite */
    CHECK(z[0] == 0.0f);
    CHECK(fabsf(rec_gate(0.0f, 0.0f, -1.0f) - (float)-log(2.0)) < 1e-7f);
    CHECK(rec_gate(30.0f, 0.0f, -2.0f) == -60.0f); /* softplus(x) = x above 20 */
    CHECK(fabsf(rec_gate(-5.0f, 1.0f, -1.0f) - (float)-log1p(exp(-4.0))) < 1e-7f);
    CHECK(rec_beta(0.0f) == 0.5f && fabsf(rec_beta(2.0f) - (float)(1.0 / (1.0 + exp(-2.0)))) < 1e-7f);
}

static void test_state(void) {
    rec_state s;
    CHECK(rec_state_init(&s, 4) == 0 && s.pos == 0 && s.cur[3] == 0.0f);
    CHECK(rec_seek(&s, 0) == 0);
    s.cur[1] = 5.0f, s.pos = 3;                   /* three positions absorbed */
    CHECK(rec_seek(&s, 3) == 0 && s.cur[1] == 5.0f); /* continues */
    CHECK(rec_seek(&s, 2) == -1 && rec_seek(&s, 4) == -1); /* no rewinding or skipping */
    CHECK(rec_mark(&s) == 0 && s.mark_pos == 3);
    s.cur[1] = 7.0f, s.pos = 5;
    CHECK(rec_seek(&s, 3) == 0 && s.cur[1] == 5.0f && s.pos == 3); /* back to the mark */
    s.pos = 6;
    CHECK(rec_seek(&s, 0) == 0 && s.cur[1] == 0.0f && s.pos == 0); /* a new context */
    CHECK(rec_seek(&s, 3) == 0 && s.cur[1] == 5.0f);               /* the mark survives it */
    rec_state_free(&s);
    rec_state e;
    CHECK(rec_state_init(&e, 0) == 0 && rec_seek(&e, 17) == 0 && rec_mark(&e) == 0); /* no recurrent layer */
    rec_state_free(&e);
}

int main(void) {
    test_conv();
    test_delta();
    test_norm_and_gates();
    test_state();
    return check_report("test_recurrent");
}
