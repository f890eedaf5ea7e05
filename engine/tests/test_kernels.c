/* The matmul kernels (kernels.h): the scalar path against an independent statement of the documented
 * order, every SIMD path this CPU has against the scalar path bit for bit (random data, zeros,
 * subnormals, -128 weights, lengths that are not a multiple of 8 or of 8 blocks), and the Q8_0
 * activation quantisation's rules. On aarch64 (qemu in tests/test_kernel_paths.py) the same file
 * checks the NEON and sdot paths. */
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

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint32_t urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float frand(void) { return (float)((double)urand() / 2147483648.0 * 2.0 - 1.0); } /* [-1, 1) */

/* a value of one of several kinds: ordinary, zero, -0, subnormal, large */
static float fvalue(void) {
    switch (urand() % 10) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return frand() * 1e-39f; /* subnormal */
    case 3: return frand() * 1000.0f;
    default: return frand();
    }
}

static float sum8(const float l[8]) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

static int n_paths;
static bm_kernels paths[BM_KPATH_COUNT];

/* A path's kernel of `type` (the type table's, kernels.h) on one token and on nt tokens: floats x, or
 * Q8_0 blocks xq / xd. */
static float tdot(const bm_kernels *k, uint32_t type, const void *w, const float *x, const int8_t *xq, const float *xd,
                  size_t n) {
    const bm_act a = {x, xq, xd, NULL, NULL};
    return k->dot[type]((const uint8_t *)w, &a, n);
}

static void tdot_mt(const bm_kernels *k, uint32_t type, const void *w, const float *x, const int8_t *xq,
                    const float *xd, size_t n, int nt, float *out) {
    const bm_act a = {x, xq, xd, NULL, NULL};
    k->dot_mt[type]((const uint8_t *)w, &a, n, nt, out);
}

static void test_f32_f16(void) {
    enum { N = 300 };
    float a[N], x[N], ah[N];
    uint8_t h[2 * N];
    for (size_t n = 0; n <= N; n += (n < 40 ? 1 : 37)) {
        for (int rep = 0; rep < 4; rep++) {
            for (size_t i = 0; i < n; i++) {
                a[i] = fvalue();
                x[i] = fvalue();
                uint16_t v = bm_f32_to_f16(a[i]);
                if (urand() % 16 == 0) v = (uint16_t)(urand() % 0x400); /* f16 subnormal */
                put16(h + 2 * i, v);
                ah[i] = bm_f16_to_f32(v);
            }
            float l[8] = {0}, lh[8] = {0};
            for (size_t i = 0; i < n; i++) { l[i % 8] += a[i] * x[i]; lh[i % 8] += ah[i] * x[i]; }
            float ref = bm_vdot_f32_scalar(a, x, n), refh = bm_vdot_f16_scalar(h, x, n);
            CHECK(bits_of(ref) == bits_of(sum8(l)));
            CHECK(bits_of(refh) == bits_of(sum8(lh)));
            for (int p = 0; p < n_paths; p++) {
                CHECK(bits_of(paths[p].dot_f32(a, x, n)) == bits_of(ref));
                CHECK(bits_of(tdot(&paths[p], GGML_TYPE_F32, a, x, NULL, NULL, n)) == bits_of(ref));
                CHECK(bits_of(tdot(&paths[p], GGML_TYPE_F16, h, x, NULL, NULL, n)) == bits_of(refh));
            }
        }
    }
}

static void test_quantize(void) {
    float x[64];
    int8_t q[64];
    float d[2];
    /* zeros: scale 0, every q 0 */
    for (int i = 0; i < 32; i++) x[i] = (i & 1) ? -0.0f : 0.0f;
    bm_quantize_q8_0(x, 32, q, d);
    CHECK(d[0] == 0.0f);
    int nz = 0;
    for (int i = 0; i < 32; i++) nz += q[i] != 0;
    CHECK(nz == 0);
    /* amax 127: id 1, so q = x rounded to nearest exactly; ties go to even (ggml's x86 rounding) */
    for (int i = 0; i < 32; i++) x[i] = 0.0f;
    x[0] = 127.0f; x[1] = -127.0f; x[2] = 2.5f; x[3] = -2.5f; x[4] = 0.49999997f; x[5] = 1.5f; x[6] = -0.5f;
    bm_quantize_q8_0(x, 32, q, d);
    CHECK(d[0] == 1.0f);
    CHECK(q[0] == 127 && q[1] == -127 && q[2] == 2 && q[3] == -2 && q[4] == 0 && q[5] == 2 && q[6] == 0);
    /* the scale is amax / 127 rounded to f16; q uses 127 / amax (not 1 / d, which differs by an ulp
     * for some amax) */
    for (int i = 0; i < 32; i++) x[32 + i] = frand() * 3.0f;
    x[40] = 3.3f;
    bm_quantize_q8_0(x, 64, q, d);
    float amax = 0;
    for (int i = 32; i < 64; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float dd = amax / 127.0f, id = 127.0f / amax;
    CHECK(bits_of(d[1]) == bits_of(bm_f16_to_f32(bm_f32_to_f16(dd))));
    int bad = 0;
    for (int i = 32; i < 64; i++) bad += q[i] != (int8_t)rintf(x[i] * id); /* the default mode: ties to even */
    CHECK(bad == 0);
    /* NaN: the block's scale is NaN (so a NaN reaches the output), its q are 0; inf: scale inf */
    for (int i = 0; i < 32; i++) x[i] = frand();
    x[7] = NAN;
    bm_quantize_q8_0(x, 32, q, d);
    CHECK(isnan(d[0]) && q[0] == 0 && q[31] == 0);
    x[7] = INFINITY;
    bm_quantize_q8_0(x, 32, q, d);
    CHECK(isinf(d[0]) && q[0] == 0);
    /* n not a multiple of 32: only whole blocks are read and written (ASan sees any overrun) */
    float *x40 = malloc(40 * sizeof(float));
    int8_t *q40 = malloc(32);
    float *d40 = malloc(sizeof(float));
    for (int i = 0; i < 40; i++) x40[i] = frand();
    bm_quantize_q8_0(x40, 40, q40, d40);
    CHECK(d40[0] > 0.0f);
    free(x40); free(q40); free(d40);
}

/* every path's quantisation gives the scalar bytes: random values, exact ties, zeros, subnormals,
 * NaN and infinities, blocks whose amax is a tie too */
static void test_quantize_paths(void) {
    enum { NB = 24 };
    float x[NB * 32], d0[NB], d1[NB];
    int8_t q0[NB * 32], q1[NB * 32];
    for (int rep = 0; rep < 40; rep++) {
        for (int i = 0; i < NB * 32; i++) {
            switch (urand() % 12) {
            case 0: x[i] = (float)((int)(urand() % 255) - 127) * 0.5f; break; /* ties once scaled by 1 */
            case 1: x[i] = 0.0f; break;
            case 2: x[i] = frand() * 1e-40f; break;
            default: x[i] = fvalue();
            }
        }
        for (int i = 0; i < 32; i++) x[i] = (float)((int)(urand() % 255) - 127) * 0.5f; /* amax 63.5 or so */
        x[0] = 127.0f;                                                                    /* block 0: id 1 */
        if (rep % 4 == 1) x[32 * 3 + 5] = NAN;
        if (rep % 4 == 2) x[32 * 4 + 7] = INFINITY;
        if (rep % 4 == 3) x[32 * 5 + 9] = -INFINITY;
        for (int i = 32 * 6; i < 32 * 7; i++) x[i] = 0.0f;
        bm_quantize_q8_0(x, NB * 32, q0, d0);
        for (int p = 0; p < n_paths; p++) {
            memset(q1, 0x55, sizeof q1);
            paths[p].quantize_q8_0(x, NB * 32, q1, d1);
            CHECK(memcmp(q0, q1, sizeof q0) == 0);
            int same = 1;
            for (int b = 0; b < NB; b++) same &= bits_of(d0[b]) == bits_of(d1[b]) || (isnan(d0[b]) && isnan(d1[b]));
            CHECK(same);
        }
    }
}

static void test_q8_0(void) {
    enum { NB = 40 };
    uint8_t *w = malloc((size_t)NB * BMOE_Q8_0_BYTES);
    float x[NB * 32], xd[NB];
    int8_t xq[NB * 32];
    for (size_t nb = 1; nb <= NB; nb++) {
        for (int rep = 0; rep < 6; rep++) {
            size_t n = nb * 32;
            for (size_t b = 0; b < nb; b++) {
                uint8_t *blk = w + b * BMOE_Q8_0_BYTES;
                uint16_t s = bm_f32_to_f16(0.001f + 0.02f * (float)(urand() % 100) / 100.0f);
                if (urand() % 8 == 0) s = (uint16_t)(urand() % 0x400); /* subnormal or zero scale */
                if (urand() % 16 == 0) s |= 0x8000u;
                put16(blk, s);
                for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(urand() % 8 == 0 ? 0x80 : urand()); /* -128 too */
            }
            for (size_t i = 0; i < n; i++) x[i] = rep == 5 && i < 64 ? 0.0f : fvalue();
            bm_quantize_q8_0(x, n, xq, xd);
            /* the documented order, stated independently: exact block sums, lane b mod 8, the tree */
            float l[8] = {0};
            for (size_t b = 0; b < nb; b++) {
                const uint8_t *blk = w + b * BMOE_Q8_0_BYTES;
                long long s = 0;
                for (int i = 0; i < 32; i++) s += (long long)(int8_t)blk[2 + i] * xq[b * 32 + (size_t)i];
                l[b % 8] += (float)s * (bm_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)) * xd[b]);
            }
            float ref = tdot(&paths[0], GGML_TYPE_Q8_0, w, NULL, xq, xd, n);
            CHECK(bits_of(ref) == bits_of(sum8(l)));
            for (int p = 0; p < n_paths; p++) {
                float got = tdot(&paths[p], GGML_TYPE_Q8_0, w, NULL, xq, xd, n);
                if (bits_of(got) != bits_of(ref))
                    fprintf(stderr, "  %s: nb %zu rep %d: %a != %a\n", bm_kpath_name(paths[p].path), nb, rep, got, ref);
                CHECK(bits_of(got) == bits_of(ref));
            }
        }
    }
    free(w);
}

/* The multi-token functions (kernels.h, *_mt): every path, every token count 1 .. BM_MT_MAX, odd
 * lengths and block counts (tails of the 8-lane and 8-block loops), each out[t] bit for bit the
 * one-token function's value on token t, which is the scalar path's. Buffers are exactly nt rows
 * (ASan sees an overrun). */
static void test_multi_token(void) {
    enum { N = 300, NB = 40 };
    for (int nt = 1; nt <= BM_MT_MAX; nt++) {
        float *w = malloc(N * sizeof(float)), *x = malloc((size_t)nt * N * sizeof(float));
        uint8_t *h = malloc(2 * N);
        for (size_t n = 0; n <= N; n += (n < 40 ? 1 : 37)) {
            for (size_t i = 0; i < n; i++) {
                w[i] = fvalue();
                uint16_t v = bm_f32_to_f16(fvalue());
                if (urand() % 16 == 0) v = (uint16_t)(urand() % 0x400);
                put16(h + 2 * i, v);
            }
            for (size_t i = 0; i < (size_t)nt * n; i++) x[i] = fvalue();
            for (int p = 0; p < n_paths; p++) {
                float o32[BM_MT_MAX], o16[BM_MT_MAX];
                tdot_mt(&paths[p], GGML_TYPE_F32, w, x, NULL, NULL, n, nt, o32);
                tdot_mt(&paths[p], GGML_TYPE_F16, h, x, NULL, NULL, n, nt, o16);
                for (int t = 0; t < nt; t++) {
                    const float *xt = x + (size_t)t * n;
                    CHECK(bits_of(o32[t]) == bits_of(bm_vdot_f32_scalar(w, xt, n)));
                    CHECK(bits_of(o32[t]) == bits_of(paths[p].dot_f32(w, xt, n)));
                    CHECK(bits_of(o16[t]) == bits_of(bm_vdot_f16_scalar(h, xt, n)));
                    CHECK(bits_of(o16[t]) == bits_of(tdot(&paths[p], GGML_TYPE_F16, h, xt, NULL, NULL, n)));
                }
            }
        }
        free(w); free(x); free(h);

        uint8_t *wq = malloc((size_t)NB * BMOE_Q8_0_BYTES);
        float *xf = malloc((size_t)nt * NB * 32 * sizeof(float)), *xd = malloc((size_t)nt * NB * sizeof(float));
        int8_t *xq = malloc((size_t)nt * NB * 32);
        for (size_t nb = 1; nb <= NB; nb++) {
            for (int rep = 0; rep < 3; rep++) {
                size_t n = nb * 32;
                for (size_t b = 0; b < nb; b++) {
                    uint8_t *blk = wq + b * BMOE_Q8_0_BYTES;
                    uint16_t sc = bm_f32_to_f16(0.001f + 0.02f * (float)(urand() % 100) / 100.0f);
                    if (urand() % 8 == 0) sc = (uint16_t)(urand() % 0x400);
                    if (urand() % 16 == 0) sc |= 0x8000u;
                    put16(blk, sc);
                    for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(urand() % 8 == 0 ? 0x80 : urand());
                }
                for (size_t i = 0; i < (size_t)nt * n; i++) xf[i] = rep == 2 && i % n < 64 ? 0.0f : fvalue();
                /* tokens are quantised one by one, as matmul does (a block never spans two tokens) */
                for (int t = 0; t < nt; t++) bm_quantize_q8_0(xf + (size_t)t * n, n, xq + (size_t)t * n, xd + (size_t)t * nb);
                for (int p = 0; p < n_paths; p++) {
                    float o[BM_MT_MAX];
                    tdot_mt(&paths[p], GGML_TYPE_Q8_0, wq, NULL, xq, xd, n, nt, o);
                    for (int t = 0; t < nt; t++) {
                        const int8_t *qt = xq + (size_t)t * n;
                        const float *dt = xd + (size_t)t * nb;
                        float ref = tdot(&paths[0], GGML_TYPE_Q8_0, wq, NULL, qt, dt, n);
                        if (bits_of(o[t]) != bits_of(ref))
                            fprintf(stderr, "  %s mt: nt %d t %d nb %zu: %a != %a\n", bm_kpath_name(paths[p].path), nt, t,
                                    nb, o[t], ref);
                        CHECK(bits_of(o[t]) == bits_of(ref));
                        CHECK(bits_of(o[t]) == bits_of(tdot(&paths[p], GGML_TYPE_Q8_0, wq, NULL, qt, dt, n)));
                    }
                }
            }
        }
        free(wq); free(xf); free(xd); free(xq);
    }
}

/* ---- dequantisation (row_to_f32: every type's to_f32) and the dequantising kernel (BF16) ---- */

typedef struct { uint32_t type; size_t blk, bytes; const char *name; } dq_type;
static const dq_type DQ_TYPES[] = {
    {GGML_TYPE_Q4_0, 32, BMOE_Q4_0_BYTES, "q4_0"}, {GGML_TYPE_Q5_0, 32, BMOE_Q5_0_BYTES, "q5_0"},
    {GGML_TYPE_Q4_K, 256, BMOE_Q4_K_BYTES, "q4_K"}, {GGML_TYPE_Q5_K, 256, BMOE_Q5_K_BYTES, "q5_K"},
    {GGML_TYPE_Q6_K, 256, BMOE_Q6_K_BYTES, "q6_K"}, {GGML_TYPE_BF16, 1, 2, "bf16"},
};

static uint16_t rand_scale(void) {
    uint16_t s = bm_f32_to_f16(0.001f + 0.02f * (float)(urand() % 100) / 100.0f);
    if (urand() % 8 == 0) s = (uint16_t)(urand() % 0x400); /* subnormal or zero scale */
    if (urand() % 16 == 0) s |= 0x8000u;
    return s;
}

/* Random blocks of the type: random bytes with reasonable f16 scales where a type has them. */
static void fill_blocks(const dq_type *t, uint8_t *w, size_t nblk) {
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *p = w + b * t->bytes;
        for (size_t i = 0; i < t->bytes; i++) p[i] = (uint8_t)urand();
        switch (t->type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: put16(p, rand_scale()); break;
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: put16(p, rand_scale()); put16(p + 2, rand_scale()); break;
        case GGML_TYPE_Q6_K: put16(p + 208, rand_scale()); break;
        case GGML_TYPE_IQ4_NL: put16(p, rand_scale()); break;
        case GGML_TYPE_MXFP4: p[0] = (uint8_t)(100 + urand() % 40); break; /* 2^(e - 128): finite, near 1 */
        case GGML_TYPE_IQ4_XS: put16(p, rand_scale()); break;
        case GGML_TYPE_BF16: { uint32_t u = bits_of(fvalue()); put16(p, (uint16_t)(u >> 16)); break; }
        default: break;
        }
    }
}

/* ggml's dequantize_row_q4_K and _q6_K, restated here from ggml-quants.c (not from tensor.c) */
static void ref_q4_K(const uint8_t *x, float *y) {
    float d = bm_f16_to_f32((uint16_t)(x[0] | x[1] << 8)), min = bm_f16_to_f32((uint16_t)(x[2] | x[3] << 8));
    const uint8_t *s = x + 4, *q = x + 16;
    int is = 0;
    for (int j = 0; j < 256; j += 64) {
        int sc[2], m[2];
        for (int u = 0; u < 2; u++) {
            int k = is + u;
            if (k < 4) { sc[u] = s[k] & 63; m[u] = s[k + 4] & 63; }
            else { sc[u] = (s[k + 4] & 0xF) | ((s[k - 4] >> 6) << 4); m[u] = (s[k + 4] >> 4) | ((s[k] >> 6) << 4); }
        }
        float d1 = d * (float)sc[0], m1 = min * (float)m[0], d2 = d * (float)sc[1], m2 = min * (float)m[1];
        for (int l = 0; l < 32; ++l) *y++ = d1 * (float)(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * (float)(q[l] >> 4) - m2;
        q += 32;
        is += 2;
    }
}

static void ref_q6_K(const uint8_t *x, float *y) {
    const uint8_t *ql = x, *qh = x + 128;
    const int8_t *sc = (const int8_t *)(x + 192);
    float d = bm_f16_to_f32((uint16_t)(x[208] | x[209] << 8));
    for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; ++l) {
            int is = l / 16;
            int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l + 0] = d * sc[is + 0] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128; ql += 64; qh += 32; sc += 8;
    }
}

/* Dequantisation: Q4_K and Q6_K against the restatement above, every value's bits; a hand-made Q4_K
 * block whose upper sub-blocks need the packed high bits of their scale; BF16 exactly the high half. */
static void test_dequant(void) {
    uint8_t w[4 * BMOE_Q6_K_BYTES];
    float got[4 * 256], want[4 * 256];
    for (int rep = 0; rep < 200; rep++) {
        fill_blocks(&DQ_TYPES[2], w, 4);
        row_to_f32(GGML_TYPE_Q4_K, w, got, 1024);
        for (int b = 0; b < 4; b++) ref_q4_K(w + b * BMOE_Q4_K_BYTES, want + 256 * b);
        CHECK(memcmp(got, want, sizeof got) == 0);
        fill_blocks(&DQ_TYPES[4], w, 4);
        row_to_f32(GGML_TYPE_Q6_K, w, got, 1024);
        for (int b = 0; b < 4; b++) ref_q6_K(w + b * BMOE_Q6_K_BYTES, want + 256 * b);
        CHECK(memcmp(got, want, sizeof got) == 0);
    }
    /* d = 1, dmin = 0.5; sub-block 5: scale 0x3f = 0b11'1111 (low 4 bits in scales[9], high 2 in the
     * top of scales[1]), min 0x21 (low 4 bits in the high nibble of scales[9], high 2 in scales[5]) */
    uint8_t blk[BMOE_Q4_K_BYTES] = {0};
    put16(blk, 0x3c00);
    put16(blk + 2, 0x3800);
    blk[4 + 1] = 0xC0;        /* scale 1's bits 6-7 = sub-block 5's scale bits 4-5 */
    blk[4 + 5] = 0x80;        /* min 1's bits 6-7 = sub-block 5's min bits 4-5 (0b10) */
    blk[4 + 9] = 0x1F;        /* sub-block 5: scale low 0xF, min low 0x1 */
    for (int l = 0; l < 32; l++) blk[16 + 64 + l] = 0x30; /* values 160..191: high nibble 3 */
    row_to_f32(GGML_TYPE_Q4_K, blk, got, 256);
    CHECK(got[160] == 63.0f * 3.0f - 0.5f * 33.0f);
    CHECK(got[0] == 0.0f);
    uint8_t bf[4] = {0x80, 0x3f, 0x49, 0xc0}; /* 1.0, -3.140625 */
    row_to_f32(GGML_TYPE_BF16, bf, got, 2);
    CHECK(got[0] == 1.0f && got[1] == -3.140625f);
}

/* The value of each element of one block of Q4_1, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K and IQ4_XS, written
 * here element by element from the block layouts (tensor.h's table, ggml-common.h's structs), not from
 * tensor.c's loops: element i's bits are located directly, then scaled with the float steps of ggml's
 * dequantize_row_* (one product for the scale, one for the level, then the offset). */
static const int8_t KV_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t KV_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static float h2f(const uint8_t *p) { return bm_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* element i (0..31) of 16 bytes of nibbles: the low nibbles hold 0..15, the high ones 16..31 */
static int nib32(const uint8_t *qs, int i) { return i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4; }

/* element i (0..255) of the 2-bit planes of Q2_K / Q3_K: byte 32 (i / 128) + i % 32, bits 2 ((i % 128) / 32) */
static int crumb(const uint8_t *qs, int i) { return (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3; }

static float ref_value(uint32_t type, const uint8_t *x, int i) {
    switch (type) {
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_1: {
        const int five = type == GGML_TYPE_Q5_1;
        const uint32_t qh = five ? (uint32_t)x[4] | (uint32_t)x[5] << 8 | (uint32_t)x[6] << 16 | (uint32_t)x[7] << 24 : 0;
        const int q = nib32(x + (five ? 8 : 4), i) | (int)((qh >> i) & 1) << 4;
        return (float)q * h2f(x) + h2f(x + 2);
    }
    case GGML_TYPE_IQ4_NL: return h2f(x) * (float)KV_IQ4NL[nib32(x + 2, i)];
    case GGML_TYPE_MXFP4: return (float)KV_MXFP4[nib32(x + 1, i)] * ldexpf(1.0f, (int)x[0] - 128);
    case GGML_TYPE_Q2_K: {
        const uint8_t sc = x[i / 16];
        return h2f(x + 80) * (float)(sc & 0xF) * (float)crumb(x + 16, i) - h2f(x + 82) * (float)(sc >> 4);
    }
    case GGML_TYPE_Q3_K: {
        const int j = i / 16; /* the 6-bit scale: 4 low bits from a nibble of bytes 0-7, 2 high from bytes 8-11 */
        const uint8_t *s = x + 96;
        const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        const int q = crumb(x + 32, i) - ((x[i % 32] >> (i / 32)) & 1 ? 0 : 4);
        return h2f(x + 108) * (float)((lo | hi << 4) - 32) * (float)q;
    }
    default: { /* IQ4_XS: sub-block i / 32, its 6-bit scale: a nibble of scales_l, 2 bits of scales_h */
        const int ib = i / 32, sh = x[2] | x[3] << 8;
        const int ls = ((x[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | ((sh >> (2 * ib)) & 3) << 4;
        return h2f(x) * (float)(ls - 32) * (float)KV_IQ4NL[nib32(x + 8 + 16 * ib, i % 32)];
    }
    }
}

/* Every type added with the type table, against the restatements above, every value's bits, on random
 * blocks whose float fields (the table's) hold reasonable scales or random E8M0 exponents. */
static void test_dequant_types(void) {
    static const uint32_t TY[] = {GGML_TYPE_Q4_1, GGML_TYPE_Q5_1, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4,
                                  GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_IQ4_XS};
    uint8_t w[4 * 256];
    float got[4 * 256], want[4 * 256];
    for (size_t ti = 0; ti < sizeof TY / sizeof TY[0]; ti++) {
        const bm_type_traits *tt = bm_type(TY[ti]);
        CHECK(tt != NULL);
        if (!tt) continue;
        for (int rep = 0; rep < 100; rep++) {
            for (size_t i = 0; i < 4 * tt->bytes; i++) w[i] = (uint8_t)urand();
            for (int b = 0; b < 4; b++)
                for (int f = 0; f < BM_TYPE_FIELDS && tt->fields[f].fmt; f++) {
                    uint8_t *p = w + (size_t)b * tt->bytes + tt->fields[f].off;
                    if (tt->fields[f].fmt == BM_FIELD_F16) put16(p, rand_scale());
                    else p[0] = (uint8_t)(urand() % 255); /* E8M0: any byte but 0xFF */
                }
            row_to_f32(TY[ti], w, got, 4 * tt->blck);
            for (int b = 0; b < 4; b++) {
                const uint8_t *x = w + (size_t)b * tt->bytes;
                float *y = want + (size_t)b * tt->blck;
                for (int i = 0; i < (int)tt->blck; i++) y[i] = ref_value(TY[ti], x, i);
            }
            int same = memcmp(got, want, 4 * tt->blck * sizeof(float)) == 0;
            if (!same) fprintf(stderr, "  dequant %s differs from ggml's\n", tt->name);
            CHECK(same);
        }
    }
}

/* BF16, the one type the matmuls dequantise: every path's kernel, one token and several, against the
 * scalar one bit for bit, on lengths that are not a multiple of 8 or of the 256-value chunk; and the
 * scalar one against the F32 dot product of the row's values. Buffers are exactly the row and nt
 * tokens (ASan sees an overrun). */
static void test_dequantised_dots(void) {
    for (size_t ti = 0; ti < sizeof DQ_TYPES / sizeof DQ_TYPES[0]; ti++) {
        const dq_type *t = &DQ_TYPES[ti];
        if (t->type != GGML_TYPE_BF16) continue;
        size_t max_blk = t->blk == 1 ? 600 : (t->blk == 32 ? 40 : 5);
        for (size_t nblk = 1; nblk <= max_blk; nblk += (t->blk == 1 && nblk > 40 ? 37 : 1)) {
            size_t n = nblk * t->blk;
            uint8_t *w = malloc(nblk * t->bytes);
            float *dq = malloc(n * sizeof(float)), *x = malloc((size_t)BM_MT_MAX * n * sizeof(float));
            fill_blocks(t, w, nblk);
            for (size_t i = 0; i < BM_MT_MAX * n; i++) x[i] = fvalue();
            row_to_f32(t->type, w, dq, n);
            for (int nt = 1; nt <= BM_MT_MAX; nt++) {
                float ref[BM_MT_MAX];
                for (int u = 0; u < nt; u++) {
                    ref[u] = tdot(&paths[0], t->type, w, x + (size_t)u * n, NULL, NULL, n);
                    CHECK(bits_of(ref[u]) == bits_of(bm_vdot_f32_scalar(dq, x + (size_t)u * n, n)));
                }
                for (int p = 0; p < n_paths; p++) {
                    float o[BM_MT_MAX];
                    tdot_mt(&paths[p], t->type, w, x, NULL, NULL, n, nt, o);
                    for (int u = 0; u < nt; u++) {
                        float one = tdot(&paths[p], t->type, w, x + (size_t)u * n, NULL, NULL, n);
                        if (bits_of(one) != bits_of(ref[u]) || bits_of(o[u]) != bits_of(ref[u]))
                            fprintf(stderr, "  %s %s: n %zu nt %d t %d: %a / %a != %a\n", bm_kpath_name(paths[p].path),
                                    t->name, n, nt, u, one, o[u], ref[u]);
                        CHECK(bits_of(one) == bits_of(ref[u]));
                        CHECK(bits_of(o[u]) == bits_of(ref[u]));
                    }
                }
            }
            free(w); free(dq); free(x);
        }
    }
}

/* The row x token tiles (kernels.h, dot_tile) of every path that has them: Q8_0, Q4_0, Q5_0, IQ4_NL and
 * MXFP4 rows of 1 to 130 blocks (past the AVX-512 kernels' 8-block staging chunk), 1 .. BM_TILE_R rows and 2 .. BM_TILE_T
 * tokens per call, every output bit for bit the scalar one-token kernel's (a NaN input block stays
 * NaN). Buffers are exactly nr rows and nt tokens (ASan sees an overrun). */
static void test_tiles(void) {
    static const size_t NBS[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 20, 33, 64, 65, 130};
    static const dq_type TY[] = {{GGML_TYPE_Q8_0, 32, BMOE_Q8_0_BYTES, "q8_0"}, {GGML_TYPE_Q4_0, 32, BMOE_Q4_0_BYTES, "q4_0"},
                                 {GGML_TYPE_Q5_0, 32, BMOE_Q5_0_BYTES, "q5_0"},
                                 {GGML_TYPE_IQ4_NL, 32, BMOE_IQ4_NL_BYTES, "iq4_nl"},
                                 {GGML_TYPE_MXFP4, 32, BMOE_MXFP4_BYTES, "mxfp4"}};
    int tested = 0;
    for (size_t ti = 0; ti < sizeof TY / sizeof TY[0]; ti++) {
        const dq_type *t = &TY[ti];
        for (size_t ni = 0; ni < sizeof NBS / sizeof NBS[0]; ni++) {
            const size_t nb = NBS[ni], n = nb * 32, rb = nb * t->bytes;
            for (int nr = 1; nr <= BM_TILE_R; nr++) {
                for (int nt = 2; nt <= BM_TILE_T; nt += (nt < 10 && (nr == BM_TILE_R || nr == 1) ? 1 : 7)) {
                    uint8_t *w = malloc((size_t)nr * rb);
                    float *x = malloc((size_t)nt * n * sizeof(float)), *xd = malloc((size_t)nt * nb * sizeof(float));
                    int8_t *xq = malloc((size_t)nt * n);
                    fill_blocks(t, w, (size_t)nr * nb);
                    if (t->type == GGML_TYPE_Q8_0)
                        for (size_t b = 0; b < (size_t)nr * nb; b++) {
                            put16(w + b * t->bytes, rand_scale());
                            if (urand() % 4 == 0) w[b * t->bytes + 2 + urand() % 32] = 0x80; /* -128 */
                        }
                    for (size_t i = 0; i < (size_t)nt * n; i++) x[i] = fvalue();
                    if (nr == 3) x[n + 5] = NAN; /* token 1's first block */
                    for (int u = 0; u < nt; u++) bm_quantize_q8_0(x + (size_t)u * n, n, xq + (size_t)u * n, xd + (size_t)u * nb);
                    const bm_act a = {x, xq, xd, NULL, NULL};
                    for (int p = 0; p < n_paths; p++) {
                        if (!paths[p].dot_tile[t->type]) continue;
                        float o[BM_TILE_R * BM_TILE_T];
                        paths[p].dot_tile[t->type](w, rb, nr, &a, n, nt, o);
                        tested++;
                        for (int r = 0; r < nr; r++)
                            for (int u = 0; u < nt; u++) {
                                float ref = tdot(&paths[0], t->type, w + (size_t)r * rb, NULL, xq + (size_t)u * n,
                                                 xd + (size_t)u * nb, n);
                                float got = o[r * BM_TILE_T + u];
                                int same = bits_of(got) == bits_of(ref) || (isnan(got) && isnan(ref));
                                if (!same)
                                    fprintf(stderr, "  %s tile %s: nb %zu nr %d nt %d row %d token %d: %a != %a\n",
                                            bm_kpath_name(paths[p].path), t->name, nb, nr, nt, r, u, got, ref);
                                CHECK(same);
                            }
                    }
                    free(w); free(x); free(xd); free(xq);
                }
            }
        }
    }
    /* Q4_K, Q5_K, Q6_K and IQ4_XS against Q8_K super-blocks: rows of 1 to 9 super-blocks (past the 8 lane
     * classes) */
    static const dq_type KT[] = {{GGML_TYPE_Q4_K, 256, BMOE_Q4_K_BYTES, "q4_K"},
                                 {GGML_TYPE_Q5_K, 256, BMOE_Q5_K_BYTES, "q5_K"},
                                 {GGML_TYPE_Q6_K, 256, BMOE_Q6_K_BYTES, "q6_K"},
                                 {GGML_TYPE_IQ4_XS, 256, BMOE_IQ4_XS_BYTES, "iq4_xs"}};
    for (size_t nb = 1, kt = 0; kt < sizeof KT / sizeof KT[0]; nb = nb >= 9 ? (kt++, 1) : nb + (nb < 3 ? 1 : 3)) {
        const dq_type t = KT[kt];
        const size_t n = nb * 256, rb = nb * t.bytes;
        for (int nr = 1; nr <= BM_TILE_R; nr += (nr < 2 ? 1 : 3)) {
            for (int nt = 2; nt <= BM_TILE_T; nt += 5) {
                uint8_t *w = malloc((size_t)nr * rb);
                float *x = malloc((size_t)nt * n * sizeof(float));
                bm_q8k *xk = malloc((size_t)nt * nb * sizeof(bm_q8k));
                fill_blocks(&t, w, (size_t)nr * nb);
                for (size_t i = 0; i < (size_t)nt * n; i++) x[i] = fvalue();
                if (nr == 2) x[n + 7] = NAN; /* token 1's first super-block */
                for (int u = 0; u < nt; u++) bm_quantize_q8_k(x + (size_t)u * n, n, xk + (size_t)u * nb);
                const bm_act a = {x, NULL, NULL, NULL, xk};
                for (int p = 0; p < n_paths; p++) {
                    if (!paths[p].dot_tile[t.type]) continue;
                    float o[BM_TILE_R * BM_TILE_T];
                    paths[p].dot_tile[t.type](w, rb, nr, &a, n, nt, o);
                    tested++;
                    for (int r = 0; r < nr; r++)
                        for (int u = 0; u < nt; u++) {
                            const bm_act at = bm_act_token(&a, n, u);
                            float ref = paths[0].dot[t.type](w + (size_t)r * rb, &at, n), got = o[r * BM_TILE_T + u];
                            int same = bits_of(got) == bits_of(ref) || (isnan(got) && isnan(ref));
                            if (!same)
                                fprintf(stderr, "  %s tile %s: nb %zu nr %d nt %d row %d token %d: %a != %a\n",
                                        bm_kpath_name(paths[p].path), t.name, nb, nr, nt, r, u, got, ref);
                            CHECK(same);
                        }
                }
                free(w); free(x); free(xk);
            }
        }
    }
    /* every type a path has tiles for is in the lists above */
    for (int p = 0; p < n_paths; p++)
        for (uint32_t id = 0; id < GGML_TYPE_COUNT; id++) {
            int listed = 0;
            for (size_t i = 0; i < sizeof TY / sizeof TY[0]; i++) listed |= TY[i].type == id;
            for (size_t i = 0; i < sizeof KT / sizeof KT[0]; i++) listed |= KT[i].type == id;
            CHECK(!paths[p].dot_tile[id] || listed);
        }
    /* a path that has tiles is tested; on a CPU with AVX-512 VNNI that path must be there */
    if (bm_kpath_available(BM_KPATH_AVX512)) CHECK(tested > 0);
}

/* SiLU-times-u and the softmax's exponentials (kernels.h, silu_mul / exp_shift): every path gives
 * the scalar loop's bits, on values inside and outside the vectorised range (kernels_vexp.h), NaN,
 * infinities, -0, subnormals, and lengths that are not a multiple of 4; and out may be u. */
static void test_exponentials(void) {
    enum { N = 1003 };
    static float g[N], u[N], want[N], got[N], inplace[N], v[N];
    static const float special[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 700.0f, -700.0f, 700.5f, -700.5f,
                                    745.0f, -746.0f, 88.0f, -104.0f, 1e-40f, -1e-40f, 3e38f, -3e38f};
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++) {
            float s = round == 0 ? 1.0f : round == 1 ? 20.0f : round == 2 ? 200.0f : 1000.0f;
            g[i] = (i % 37 == 5) ? special[(i / 37) % (int)(sizeof special / sizeof special[0])] : frand() * s;
            u[i] = fvalue();
        }
        float mx = round == 3 ? 30.0f : 0.0f;
        bm_silu_mul_scalar(g, u, N, want);
        for (int p = 0; p < n_paths; p++) {
            for (int n = N; n >= N - 7; n--) { /* lengths with every remainder mod 8 (AVX-512: eight lanes) */
                memset(got, 0, sizeof got);
                paths[p].silu_mul(g, u, (size_t)n, got);
                int same = 1;
                for (int i = 0; i < n; i++) same &= bits_of(got[i]) == bits_of(want[i]);
                if (!same) printf("  silu_mul: path %s, n %d, round %d differs from scalar\n", bm_kpath_name(paths[p].path), n, round);
                CHECK(same);
            }
            memcpy(inplace, u, sizeof u);
            paths[p].silu_mul(g, inplace, N, inplace);
            CHECK(memcmp(inplace, want, sizeof want) == 0);
            memcpy(v, g, sizeof g);
            paths[p].exp_shift(v, N, mx);
            int same = 1;
            for (int i = 0; i < N; i++) same &= bits_of(v[i]) == bits_of((float)bm_exp((double)g[i] - (double)mx));
            if (!same) printf("  exp_shift: path %s, round %d differs from bm_exp\n", bm_kpath_name(paths[p].path), round);
            CHECK(same);
        }
    }
}

/* Attention's loops (kernels_attn.c): a query against many keys (strided rows) gives, key by key, the
 * path's dot_f32 bits, which the scalar one states independently (lane i mod 8, the tree); the
 * weighted sum of value rows gives each column's sum from 0 in increasing j. Every path, head widths
 * that are and are not a multiple of 8, key counts around the eight-key (NEON: four-key) steps. */
static void test_attention_loops(void) {
    enum { HD = 72, LD = 80, NK = 37 };
    static float q[HD], k[NK * LD], v[NK * LD], p[NK], got[NK + 8], want[NK + 8], w[LD], o[LD + 8];
    static const size_t widths[] = {8, 16, 64, 72, 5, 13};
    for (int rep = 0; rep < 6; rep++) {
        for (int i = 0; i < NK * LD; i++) k[i] = fvalue(), v[i] = fvalue();
        for (int i = 0; i < HD; i++) q[i] = fvalue();
        for (int j = 0; j < NK; j++) p[j] = rep == 0 ? 1.0f / NK : frand();
        size_t n = widths[rep];
        for (int nk = 0; nk <= NK; nk += (nk < 17 ? 1 : 10)) {
            for (int j = 0; j < nk; j++) { /* the definition: lane i mod 8, then the tree */
                float l[8] = {0};
                for (size_t i = 0; i < n; i++) l[i & 7] += q[i] * k[(size_t)j * LD + i];
                want[j] = sum8(l);
            }
            for (int pth = 0; pth < n_paths; pth++) {
                memset(got, 0xff, sizeof got);
                paths[pth].dot_f32_rows(q, k, LD, n, nk, got);
                int same = 1;
                for (int j = 0; j < nk; j++) same &= bits_of(got[j]) == bits_of(want[j]);
                for (int j = 0; j < nk; j++) same &= bits_of(got[j]) == bits_of(paths[pth].dot_f32(q, k + (size_t)j * LD, n));
                same &= bits_of(got[nk]) == 0xffffffffu; /* nothing past nk written */
                if (!same) printf("  dot_f32_rows: path %s, n %zu, nk %d differs\n", bm_kpath_name(paths[pth].path), n, nk);
                CHECK(same);
            }
            /* two queries at once (dot_f32_rows2, where a path has it): each the one-query bits */
            static float q1[HD], got1[NK + 8];
            for (int i = 0; i < HD; i++) q1[i] = fvalue();
            for (int pth = 0; pth < n_paths; pth++) {
                if (!paths[pth].dot_f32_rows2) continue;
                memset(got, 0xff, sizeof got);
                memset(got1, 0xff, sizeof got1);
                paths[pth].dot_f32_rows2(q, q1, k, LD, n, nk, got, got1);
                int same = bits_of(got[nk]) == 0xffffffffu && bits_of(got1[nk]) == 0xffffffffu;
                for (int j = 0; j < nk; j++) {
                    same &= bits_of(got[j]) == bits_of(want[j]);
                    same &= bits_of(got1[j]) == bits_of(paths[0].dot_f32(q1, k + (size_t)j * LD, n));
                }
                if (!same) printf("  dot_f32_rows2: path %s, n %zu, nk %d differs\n", bm_kpath_name(paths[pth].path), n, nk);
                CHECK(same);
            }
            size_t nv = n * 8 + (size_t)rep; /* value widths past the 32- and 16-column steps too */
            if (nv > LD) nv = LD;
            for (size_t c = 0; c < nv; c++) {
                w[c] = 0.0f;
                for (int j = 0; j < nk; j++) w[c] += p[j] * v[(size_t)j * LD + c];
            }
            for (int pth = 0; pth < n_paths; pth++) {
                memset(o, 0xff, sizeof o);
                paths[pth].weighted_rows(p, nk, v, LD, nv, o);
                int same = bits_of(o[nv]) == 0xffffffffu;
                for (size_t c = 0; c < nv; c++) same &= bits_of(o[c]) == bits_of(w[c]);
                if (!same) printf("  weighted_rows: path %s, n %zu, nj %d differs\n", bm_kpath_name(paths[pth].path), nv, nk);
                CHECK(same);
            }
            static float p1[NK], o1[LD + 8], w1[LD];
            for (int j = 0; j < nk; j++) p1[j] = frand();
            for (size_t c = 0; c < nv; c++) {
                w1[c] = 0.0f;
                for (int j = 0; j < nk; j++) w1[c] += p1[j] * v[(size_t)j * LD + c];
            }
            for (int pth = 0; pth < n_paths; pth++) {
                if (!paths[pth].weighted_rows2) continue;
                memset(o, 0xff, sizeof o);
                memset(o1, 0xff, sizeof o1);
                paths[pth].weighted_rows2(p, p1, nk, v, LD, nv, o, o1);
                int same = bits_of(o[nv]) == 0xffffffffu && bits_of(o1[nv]) == 0xffffffffu;
                for (size_t c = 0; c < nv; c++) same &= bits_of(o[c]) == bits_of(w[c]) && bits_of(o1[c]) == bits_of(w1[c]);
                if (!same) printf("  weighted_rows2: path %s, n %zu, nj %d differs\n", bm_kpath_name(paths[pth].path), nv, nk);
                CHECK(same);
            }
        }
    }
}

static void test_names(void) {
    int p;
    CHECK(bm_kpath_parse("auto", &p) == 0 && p == -1);
    CHECK(bm_kpath_parse("neon-dot", &p) == 0 && p == BM_KPATH_NEON_DOT);
    CHECK(bm_kpath_parse("avx512-vnni", &p) == 0 && p == BM_KPATH_AVX512);
    CHECK(bm_kpath_parse("AVX2", &p) == 2);
    CHECK(bm_kpath_parse("", &p) == 2);
    CHECK(bm_kpath_available(BM_KPATH_SCALAR));
    CHECK(bm_kpath_available(bm_kpath_best()));
    CHECK(strcmp(bm_kpath_name(BM_KPATH_COUNT), "?") == 0);
    bm_kernels k;
    bm_kernels_get(BM_KPATH_COUNT, &k); /* not available: the scalar path */
    CHECK(k.path == BM_KPATH_SCALAR);
}

int main(void) {
    for (int p = 0; p < BM_KPATH_COUNT; p++)
        if (bm_kpath_available((bm_kpath)p)) {
            bm_kernels_get((bm_kpath)p, &paths[n_paths]);
            printf("  path %s\n", bm_kpath_name(paths[n_paths].path));
            n_paths++;
        }
    test_names();
    test_quantize();
    test_f32_f16();
    test_quantize_paths();
    test_q8_0();
    test_multi_token();
    test_dequant();
    test_dequant_types();
    test_dequantised_dots();
    test_tiles();
    test_exponentials();
    test_attention_loops();
    return check_report("test_kernels");
}
