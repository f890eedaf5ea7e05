/* The integer kernels of the block types against quantised activations (kernels.h): Q4_0 / Q5_0
 * against Q8_0 blocks, Q4_K / Q5_K / Q6_K against Q8_K super-blocks.
 *
 *   - bm_quantize_q8_k against a restatement of ggml's quantize_row_q8_K, and its edge cases;
 *   - the scalar kernels against the documented order computed here from the dequantised weights
 *     (row_to_f32, itself checked against ggml's dequantisers in test_kernels.c) with unit scales, so
 *     every block's contribution is an exact integer;
 *   - every path this CPU has (one token and nt = 1..4) against the scalar path bit for bit, on random
 *     blocks, subnormal / zero / negative scales, extreme levels and activations, and row lengths of 1
 *     to 9 (super-)blocks so lanes wrap and the 8-block groups leave tails.
 * On aarch64 (qemu, tests/test_kernel_paths.py) the same file checks NEON and NEON-dot. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gguf.h"
#include "kernels.h"
#include "tensor.h"

static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float frand(void) { return (float)((double)urand() / 2147483648.0 * 2.0 - 1.0); } /* [-1, 1) */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

static int n_paths;
static bm_kernels paths[BM_KPATH_COUNT];

typedef struct { uint32_t type; size_t blk, bytes; const char *name; } qtype;
static const qtype TYPES[] = {
    {GGML_TYPE_Q4_0, 32, BMOE_Q4_0_BYTES, "q4_0"}, {GGML_TYPE_Q5_0, 32, BMOE_Q5_0_BYTES, "q5_0"},
    {GGML_TYPE_Q4_K, 256, BMOE_Q4_K_BYTES, "q4_K"}, {GGML_TYPE_Q5_K, 256, BMOE_Q5_K_BYTES, "q5_K"},
    {GGML_TYPE_Q6_K, 256, BMOE_Q6_K_BYTES, "q6_K"},
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

/* ---- Q8_K activation quantisation ---- */

/* ggml's quantize_row_q8_K, restated: nearest_int is round half to even. */
static void ref_q8_k(const float *x, bm_q8k *y) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < 256; j++)
        if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); mx = x[j]; }
    memset(y, 0, sizeof *y);
    if (amax == 0.0f) return;
    const float is = -127.0f / mx;
    for (int j = 0; j < 256; j++) {
        float v = is * x[j];
        int r = (int)lrintf(v); /* the default rounding mode: to nearest, ties to even */
        y->q[j] = (int8_t)(r > 127 ? 127 : r);
    }
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += y->q[16 * j + i];
        y->bsums[j] = (int16_t)s;
    }
    y->d = 1.0f / is;
}

static void test_quantize_q8_k(void) {
    enum { NB = 6 };
    float x[NB * 256];
    bm_q8k got[NB], want;
    for (int rep = 0; rep < 60; rep++) {
        for (int i = 0; i < NB * 256; i++) {
            switch (urand() % 8) {
            case 0: x[i] = (float)((int)(urand() % 255) - 127) * 0.5f; break; /* ties after scaling */
            case 1: x[i] = 0.0f; break;
            case 2: x[i] = frand() * 1e-40f; break;
            default: x[i] = frand() * (rep % 3 ? 1.0f : 300.0f);
            }
        }
        x[0] = 127.0f; /* block 0: scale -1, so the halves above are exact ties */
        for (int i = 256; i < 512; i++) x[i] = frand();
        x[256 + 3] = -2.0f, x[256 + 9] = 2.0f; /* block 1: |max| tie, the first (negative) one wins */
        for (int i = 512; i < 768; i++) x[i] = 0.0f; /* block 2: all zero */
        bm_quantize_q8_k(x, NB * 256, got);
        for (int b = 0; b < NB; b++) {
            ref_q8_k(x + 256 * b, &want);
            CHECK(bits_of(got[b].d) == bits_of(want.d));
            CHECK(memcmp(got[b].q, want.q, 256) == 0 && memcmp(got[b].bsums, want.bsums, sizeof want.bsums) == 0);
        }
        CHECK(got[1].d > 0.0f); /* max -2 -> scale 127/2 > 0, d = 2/127 */
        CHECK(got[1].q[3] == -127 && got[1].q[9] == 127);
        CHECK(got[2].d == 0.0f && got[2].q[0] == 0 && got[2].bsums[15] == 0);
    }
    /* one NaN or infinity makes the super-block's scale NaN (the output NaN), not a crash or garbage */
    for (int i = 0; i < 256; i++) x[i] = frand();
    x[17] = NAN;
    bm_quantize_q8_k(x, 256, got);
    CHECK(isnan(got[0].d) && got[0].q[0] == 0 && got[0].bsums[0] == 0);
    x[17] = -INFINITY;
    bm_quantize_q8_k(x, 256, got);
    CHECK(isnan(got[0].d));
    /* a largest value of 1e30 still rounds (the scale is tiny, not zero) */
    x[17] = 1e30f;
    bm_quantize_q8_k(x, 256, got);
    CHECK(got[0].q[17] == -127 && got[0].d < 0.0f);
}

/* ---- blocks ---- */

static uint16_t rand_scale(void) {
    uint16_t s = bm_f32_to_f16(0.001f + 0.02f * (float)(urand() % 100) / 100.0f);
    if (urand() % 8 == 0) s = (uint16_t)(urand() % 0x400); /* subnormal or zero scale */
    if (urand() % 16 == 0) s |= 0x8000u;
    return s;
}

/* mode 0: random bytes and scales; 1: every byte 0xFF (largest levels, largest 6-bit scales and mins,
 * Q6_K scale -1); 2: every byte 0 (smallest levels); 3: random bytes with scales d = dmin = 1 (the exact
 * check below) */
static void fill_blocks(const qtype *t, uint8_t *w, size_t nblk, int mode) {
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *p = w + b * t->bytes;
        for (size_t i = 0; i < t->bytes; i++) p[i] = mode == 1 ? 0xFF : mode == 2 ? 0 : (uint8_t)urand();
        uint16_t d = mode == 3 ? 0x3c00 : rand_scale(), m = mode == 3 ? 0x3c00 : rand_scale();
        switch (t->type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: put16(p, d); break;
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: put16(p, d); put16(p + 2, m); break;
        default: put16(p + 208, d); break;
        }
    }
}

/* The activations of nt tokens quantised as the type's kernel takes them. */
typedef struct { int8_t *xq; float *xd; bm_q8k *xk; } acts;

static acts quantise(const qtype *t, const float *x, size_t n, int nt) {
    acts a = {malloc((size_t)nt * n), malloc((size_t)nt * (n / 32) * sizeof(float)),
              malloc((size_t)nt * (n / 256 + 1) * sizeof(bm_q8k))};
    for (int u = 0; u < nt; u++) {
        if (t->blk == 32) bm_quantize_q8_0(x + (size_t)u * n, n, a.xq + (size_t)u * n, a.xd + (size_t)u * (n / 32));
        else bm_quantize_q8_k(x + (size_t)u * n, n, a.xk + (size_t)u * (n / 256));
    }
    return a;
}

static float dot_one(const bm_kernels *k, const qtype *t, const uint8_t *w, const acts *a, size_t n, int u) {
    if (t->blk == 32) return k->dot_q45_0(t->type, w, a->xq + (size_t)u * n, a->xd + (size_t)u * (n / 32), n);
    return k->dot_kq(t->type, w, a->xk + (size_t)u * (n / 256), n);
}

static void dot_mt(const bm_kernels *k, const qtype *t, const uint8_t *w, const acts *a, size_t n, int nt, float *o) {
    if (t->blk == 32) k->dot_q45_0_mt(t->type, w, a->xq, a->xd, n, nt, o);
    else k->dot_kq_mt(t->type, w, a->xk, n, nt, o);
}

/* The scalar kernel with unit weight scales and activation scale 1 (the activations set directly): each
 * (super-)block's contribution is the exact integer sum of dequantised weight times level, computed
 * here in double from row_to_f32, added to lane b mod 8 and combined by the tree (kernels.h). */
static void test_scalar_order(void) {
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const qtype *t = &TYPES[ti];
        for (size_t nblk = 1; nblk <= 10; nblk++) {
            size_t n = nblk * t->blk;
            uint8_t *w = malloc(nblk * t->bytes);
            float *y = malloc(n * sizeof(float));
            acts a = {malloc(n), malloc((n / 32) * sizeof(float)), malloc((n / 256 + 1) * sizeof(bm_q8k))};
            fill_blocks(t, w, nblk, 3);
            row_to_f32(t->type, w, y, n);
            for (size_t i = 0; i < n; i++) a.xq[i] = (int8_t)((int)(urand() % 255) - 127);
            for (size_t b = 0; b < n / 32; b++) a.xd[b] = 1.0f;
            for (size_t b = 0; b < n / 256; b++) {
                a.xk[b].d = 1.0f;
                memcpy(a.xk[b].q, a.xq + 256 * b, 256);
                for (int j = 0; j < 16; j++) {
                    int s = 0;
                    for (int i = 0; i < 16; i++) s += a.xk[b].q[16 * j + i];
                    a.xk[b].bsums[j] = (int16_t)s;
                }
            }
            float l[8] = {0};
            for (size_t b = 0; b < nblk; b++) {
                double s = 0.0;
                for (size_t i = b * t->blk; i < (b + 1) * t->blk; i++) s += (double)y[i] * (double)a.xq[i];
                CHECK(s == floor(s) && fabs(s) < 16777216.0); /* an integer, exact as a float */
                l[b & 7] += (float)s;
            }
            float want = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
            float got = dot_one(&paths[0], t, w, &a, n, 0);
            if (bits_of(got) != bits_of(want)) fprintf(stderr, "  %s n %zu: %a != %a\n", t->name, n, got, want);
            CHECK(bits_of(got) == bits_of(want));
            free(w); free(y); free(a.xq); free(a.xd); free(a.xk);
        }
    }
}

/* Every path, one token and nt tokens, against the scalar path bit for bit. Buffers are exactly the
 * row and the tokens (ASan sees an overrun). */
static void test_paths(void) {
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const qtype *t = &TYPES[ti];
        size_t max_blk = t->blk == 32 ? 40 : 9;
        for (size_t nblk = 1; nblk <= max_blk; nblk++) {
            for (int mode = 0; mode < 3; mode++) {
                if (mode && nblk % 4 != 1) continue; /* extremes on a few lengths */
                size_t n = nblk * t->blk;
                uint8_t *w = malloc(nblk * t->bytes);
                float *x = malloc((size_t)BM_MT_MAX * n * sizeof(float));
                fill_blocks(t, w, nblk, mode);
                for (size_t i = 0; i < BM_MT_MAX * n; i++)
                    x[i] = mode == 0 ? frand() * (urand() % 4 ? 1.0f : 1e-3f) : (mode == 1 ? 1.0f : -1.0f);
                acts a = quantise(t, x, n, BM_MT_MAX);
                for (int nt = 1; nt <= BM_MT_MAX; nt++) {
                    float ref[BM_MT_MAX];
                    for (int u = 0; u < nt; u++) ref[u] = dot_one(&paths[0], t, w, &a, n, u);
                    for (int p = 1; p < n_paths; p++) {
                        float o[BM_MT_MAX];
                        dot_mt(&paths[p], t, w, &a, n, nt, o);
                        for (int u = 0; u < nt; u++) {
                            float one = dot_one(&paths[p], t, w, &a, n, u);
                            if (bits_of(one) != bits_of(ref[u]) || bits_of(o[u]) != bits_of(ref[u]))
                                fprintf(stderr, "  %s %s: n %zu mode %d nt %d t %d: %a / %a != %a\n",
                                        bm_kpath_name(paths[p].path), t->name, n, mode, nt, u, one, o[u], ref[u]);
                            CHECK(bits_of(one) == bits_of(ref[u]));
                            CHECK(bits_of(o[u]) == bits_of(ref[u]));
                        }
                    }
                    float o[BM_MT_MAX];
                    dot_mt(&paths[0], t, w, &a, n, nt, o);
                    for (int u = 0; u < nt; u++) CHECK(bits_of(o[u]) == bits_of(ref[u]));
                }
                free(w); free(x); free(a.xq); free(a.xd); free(a.xk);
            }
        }
    }
}

/* The integer kernels approximate the float dot product of the dequantised row and the activations:
 * the error is the activations' rounding (a few per cent at most on random data), never garbage. A
 * NaN activation gives a NaN. */
static void test_close_to_float(void) {
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const qtype *t = &TYPES[ti];
        size_t n = 1024;
        uint8_t *w = malloc(n / t->blk * t->bytes);
        float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        for (int rep = 0; rep < 20; rep++) {
            fill_blocks(t, w, n / t->blk, 3);
            row_to_f32(t->type, w, y, n);
            double exact = 0.0, mag = 0.0;
            for (size_t i = 0; i < n; i++) {
                x[i] = frand();
                exact += (double)y[i] * x[i];
                mag += fabs((double)y[i] * x[i]);
            }
            acts a = quantise(t, x, n, 1);
            float got = dot_one(&paths[0], t, w, &a, n, 0);
            CHECK(fabs((double)got - exact) <= 0.02 * mag);
            x[5] = NAN;
            free(a.xq); free(a.xd); free(a.xk);
            a = quantise(t, x, n, 1);
            for (int p = 0; p < n_paths; p++) CHECK(isnan(dot_one(&paths[p], t, w, &a, n, 0)));
            free(a.xq); free(a.xd); free(a.xk);
        }
        free(w); free(x); free(y);
    }
}

int main(void) {
    for (int p = 0; p < BM_KPATH_COUNT; p++)
        if (bm_kpath_available((bm_kpath)p)) {
            bm_kernels_get((bm_kpath)p, &paths[n_paths]);
            printf("  path %s\n", bm_kpath_name(paths[n_paths].path));
            n_paths++;
        }
    CHECK(n_paths >= 1 && paths[0].path == BM_KPATH_SCALAR);
    CHECK(bm_act_of(GGML_TYPE_Q4_K) == BM_ACT_Q8_K && bm_act_of(GGML_TYPE_Q6_K) == BM_ACT_Q8_K);
    CHECK(bm_act_of(GGML_TYPE_Q4_0) == BM_ACT_Q8_0 && bm_act_of(GGML_TYPE_Q8_0) == BM_ACT_Q8_0);
    CHECK(bm_act_of(GGML_TYPE_BF16) == BM_ACT_F32 && bm_act_of(GGML_TYPE_F32) == BM_ACT_F32);
    test_quantize_q8_k();
    test_scalar_order();
    test_paths();
    test_close_to_float();
    return check_report("test_kquants");
}
