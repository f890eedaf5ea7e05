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

/* The block types with integer kernels, read from the type table (type_traits.h): every supported type
 * whose kernel takes a quantised activation, except Q8_0 (test_kernels.c). */
typedef struct { uint32_t type; size_t blk, bytes; const char *name; const bm_type_traits *tt; } qtype;
static qtype TYPES[GGML_TYPE_COUNT];
static size_t N_TYPES;

static void load_types(void) {
    for (uint32_t id = 0; id < GGML_TYPE_COUNT; id++) {
        const bm_type_traits *tt = bm_type(id);
        if (!tt || tt->act == BM_ACT_F32 || id == GGML_TYPE_Q8_0) continue;
        TYPES[N_TYPES++] = (qtype){id, tt->blck, tt->bytes, tt->name, tt};
    }
}

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

/* ---- Q8_1 activation quantisation ---- */

/* bm_quantize_q8_1 is Q8_0's blocks plus s = f16(d * sum q), d = amax / 127 before its own rounding
 * (ggml's x86 quantize_row_q8_1), restated here; and every path's Q8_1 quantiser gives its bytes. */
static void test_quantize_q8_1(void) {
    enum { NB = 12 };
    float x[NB * 32], xd[NB], xs[NB], xd0[NB];
    int8_t xq[NB * 32], xq0[NB * 32];
    for (int rep = 0; rep < 40; rep++) {
        for (int i = 0; i < NB * 32; i++)
            x[i] = urand() % 8 == 0 ? (float)((int)(urand() % 255) - 127) * 0.5f : frand() * (rep % 3 ? 1.0f : 500.0f);
        if (rep == 1) for (int i = 0; i < 32; i++) x[i] = 0.0f;
        bm_quantize_q8_1(x, NB * 32, xq, xd, xs);
        bm_quantize_q8_0(x, NB * 32, xq0, xd0);
        CHECK(memcmp(xq, xq0, sizeof xq) == 0 && memcmp(xd, xd0, sizeof xd) == 0);
        for (int b = 0; b < NB; b++) {
            float amax = 0.0f;
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                if (fabsf(x[32 * b + i]) > amax) amax = fabsf(x[32 * b + i]);
                sum += xq[32 * b + i];
            }
            float want = bm_f16_to_f32(bm_f32_to_f16(amax / 127.0f * (float)sum));
            CHECK(bits_of(xs[b]) == bits_of(want));
        }
        for (int p = 0; p < n_paths; p++) {
            float pd[NB], ps[NB];
            int8_t pq[NB * 32];
            paths[p].quantize_q8_1(x, NB * 32, pq, pd, ps);
            CHECK(memcmp(pq, xq, sizeof pq) == 0 && memcmp(pd, xd, sizeof pd) == 0 && memcmp(ps, xs, sizeof ps) == 0);
        }
    }
    x[40] = NAN;
    bm_quantize_q8_1(x, NB * 32, xq, xd, xs);
    CHECK(isnan(xd[1]) && isnan(xs[1]));
}

/* ---- blocks ---- */

static uint16_t rand_scale(void) {
    uint16_t s = bm_f32_to_f16(0.001f + 0.02f * (float)(urand() % 100) / 100.0f);
    if (urand() % 8 == 0) s = (uint16_t)(urand() % 0x400); /* subnormal or zero scale */
    if (urand() % 16 == 0) s |= 0x8000u;
    return s;
}

/* mode 0: random bytes and scales; 1: every byte 0xFF (largest levels, largest 6-bit scales and mins,
 * Q6_K scale -1); 2: every byte 0 (smallest levels); 3: random bytes with unit scales (f16 1, E8M0 128:
 * the exact check below). The scales are the float fields of the type's row. */
static void fill_blocks(const qtype *t, uint8_t *w, size_t nblk, int mode) {
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *p = w + b * t->bytes;
        for (size_t i = 0; i < t->bytes; i++) p[i] = mode == 1 ? 0xFF : mode == 2 ? 0 : (uint8_t)urand();
        for (int f = 0; f < BM_TYPE_FIELDS && t->tt->fields[f].fmt; f++) {
            const bm_float_field *fl = &t->tt->fields[f];
            if (fl->fmt == BM_FIELD_F16) put16(p + fl->off, mode == 3 ? 0x3c00 : rand_scale());
            else if (fl->fmt == BM_FIELD_E8M0) /* 2^(e - 128) per level: 1 at 128, 2^-8 .. 2^-3 at random */
                p[fl->off] = mode == 3 ? 128 : (uint8_t)(urand() % 16 == 0 ? urand() % 4 : 120 + urand() % 6);
        }
    }
}

/* The activations of nt tokens quantised as the type's kernel takes them. */
typedef struct { int8_t *xq; float *xd, *xs; bm_q8k *xk; } acts;

static acts acts_alloc(size_t n, int nt) {
    acts a = {malloc((size_t)nt * n), malloc((size_t)nt * (n / 32) * sizeof(float)),
              malloc((size_t)nt * (n / 32) * sizeof(float)), malloc((size_t)nt * (n / 256 + 1) * sizeof(bm_q8k))};
    return a;
}

static void acts_free(acts *a) { free(a->xq); free(a->xd); free(a->xs); free(a->xk); }

static acts quantise(const qtype *t, const float *x, size_t n, int nt) {
    acts a = acts_alloc(n, nt);
    for (int u = 0; u < nt; u++) {
        const size_t o = (size_t)u * n, ob = (size_t)u * (n / 32);
        if (t->tt->act == BM_ACT_Q8_0) bm_quantize_q8_0(x + o, n, a.xq + o, a.xd + ob);
        else if (t->tt->act == BM_ACT_Q8_1) bm_quantize_q8_1(x + o, n, a.xq + o, a.xd + ob, a.xs + ob);
        else bm_quantize_q8_k(x + o, n, a.xk + (size_t)u * (n / 256));
    }
    return a;
}

static bm_act view(const acts *a) {
    bm_act v = {NULL, a->xq, a->xd, a->xs, a->xk};
    return v;
}

static float dot_one(const bm_kernels *k, const qtype *t, const uint8_t *w, const acts *a, size_t n, int u) {
    const bm_act all = view(a), at = bm_act_token(&all, n, u);
    return k->dot[t->type](w, &at, n);
}

static void dot_mt(const bm_kernels *k, const qtype *t, const uint8_t *w, const acts *a, size_t n, int nt, float *o) {
    const bm_act all = view(a);
    k->dot_mt[t->type](w, &all, n, nt, o);
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
            acts a = acts_alloc(n, 1);
            fill_blocks(t, w, nblk, 3);
            row_to_f32(t->type, w, y, n);
            for (size_t i = 0; i < n; i++) a.xq[i] = (int8_t)((int)(urand() % 255) - 127);
            for (size_t b = 0; b < n / 32; b++) {
                a.xd[b] = 1.0f;
                int sum = 0; /* Q8_1: d * sum q, exact with d = 1 */
                for (int i = 0; i < 32; i++) sum += a.xq[32 * b + (size_t)i];
                a.xs[b] = (float)sum;
            }
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
            free(w); free(y); acts_free(&a);
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
                free(w); free(x); acts_free(&a);
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
            acts_free(&a);
            a = quantise(t, x, n, 1);
            for (int p = 0; p < n_paths; p++) CHECK(isnan(dot_one(&paths[p], t, w, &a, n, 0)));
            acts_free(&a);
        }
        free(w); free(x); free(y);
    }
}

/* The type table: the activation format of each type is the vec_dot_type ggml's CPU backend gives it
 * (ggml-cpu.c, type_traits_cpu); every supported type has a kernel on every path compiled into this
 * binary (a missing one would silently fall back to the scalar kernel), one token and several. */
static void test_table(void) {
    static const struct { uint32_t type; bm_act_kind act; uint32_t blck, bytes; } WANT[] = {
        {GGML_TYPE_F32, BM_ACT_F32, 1, 4},       {GGML_TYPE_F16, BM_ACT_F32, 1, 2},
        {GGML_TYPE_BF16, BM_ACT_F32, 1, 2},      {GGML_TYPE_Q8_0, BM_ACT_Q8_0, 32, 34},
        {GGML_TYPE_Q4_0, BM_ACT_Q8_0, 32, 18},   {GGML_TYPE_Q5_0, BM_ACT_Q8_0, 32, 22},
        {GGML_TYPE_Q4_1, BM_ACT_Q8_1, 32, 20},   {GGML_TYPE_Q5_1, BM_ACT_Q8_1, 32, 24},
        {GGML_TYPE_IQ4_NL, BM_ACT_Q8_0, 32, 18}, {GGML_TYPE_MXFP4, BM_ACT_Q8_0, 32, 17},
        {GGML_TYPE_Q2_K, BM_ACT_Q8_K, 256, 84},  {GGML_TYPE_Q3_K, BM_ACT_Q8_K, 256, 110},
        {GGML_TYPE_IQ4_XS, BM_ACT_Q8_K, 256, 136},
        {GGML_TYPE_Q4_K, BM_ACT_Q8_K, 256, 144}, {GGML_TYPE_Q5_K, BM_ACT_Q8_K, 256, 176},
        {GGML_TYPE_Q6_K, BM_ACT_Q8_K, 256, 210},
    };
    for (size_t i = 0; i < sizeof WANT / sizeof WANT[0]; i++) {
        const bm_type_traits *tt = bm_type(WANT[i].type);
        CHECK(tt && tt->act == WANT[i].act && tt->blck == WANT[i].blck && tt->bytes == WANT[i].bytes);
    }
    CHECK(bm_type(GGML_TYPE_Q8_K) == NULL && bm_type(16) == NULL && bm_type(GGML_TYPE_COUNT) == NULL);
    CHECK(strcmp(bm_type_name(GGML_TYPE_Q2_K), "q2_K") == 0 && strcmp(bm_type_name(99), "unknown") == 0);
    for (uint32_t id = 0; id < GGML_TYPE_COUNT; id++) {
        const bm_type_traits *tt = bm_type(id);
        if (!tt) continue;
        CHECK(strcmp(tt->name, bm_type_name(id)) == 0 && tt->to_f32);
        for (int p = 0; p < n_paths; p++) {
            CHECK(tt->dot[paths[p].path] != NULL && tt->dot_mt[paths[p].path] != NULL);
            CHECK(paths[p].dot[id] == tt->dot[paths[p].path] && paths[p].dot_mt[id] == tt->dot_mt[paths[p].path]);
        }
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
    load_types();
    test_table();
    test_quantize_q8_k();
    test_quantize_q8_1();
    test_scalar_order();
    test_paths();
    test_close_to_float();
    return check_report("test_kquants");
}
