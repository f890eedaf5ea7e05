/* Attention's two inner loops (kernels.h: dot_f32_rows, weighted_rows), on every path.
 *
 * A score is the F32 dot product of the query and one key: element i into lane i mod 8, the lanes
 * combined by the fixed tree, exactly dot_f32's bits. A query's scores against many keys are one call:
 * the SIMD paths keep eight keys' (NEON: four keys') lane registers side by side and, instead of
 * folding each key's lanes one by one, transpose them so that one vector add per step of the tree
 * folds every key at once; each key's adds are still its own, in the tree's order. The weighted sum of
 * the values is out[c] = sum over j of p[j] * v_j[c] from 0 in increasing j, a separate multiply and
 * add per step, vectorised across c (columns are independent, so the order per column is unchanged).
 * The AVX-512 path does the same with sixteen lanes (below). */
#include "kernels.h"

#include "kernels_lanes.h"

void bm_dot_f32_rows_scalar(const float *q, const float *k, size_t ldk, size_t n, int nk, float *out) {
    for (int j = 0; j < nk; j++) out[j] = bm_vdot_f32_scalar(q, k + (size_t)j * ldk, n);
}

void bm_weighted_rows_scalar(const float *p, int nj, const float *v, size_t ldv, size_t n, float *out) {
    for (size_t c = 0; c < n; c++) out[c] = 0.0f;
    for (int j = 0; j < nj; j++) {
        const float *vj = v + (size_t)j * ldv;
        for (size_t c = 0; c < n; c++) out[c] += p[j] * vj[c];
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2,f16c")))

/* The tree over eight lane vectors c[0..7] (c[l] holds lane l of eight keys): bm_simd_sum8's adds, for
 * every key at once. */
AVX2_FN static inline __m256 tree8(const __m256 c[8]) {
#ifdef BMOE_FAULT_SIMD_LANE_ORDER
    /* fault: as bm_simd_sum8's, the usual SIMD horizontal order */
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c[0], c[4]), _mm256_add_ps(c[2], c[6])),
                         _mm256_add_ps(_mm256_add_ps(c[1], c[5]), _mm256_add_ps(c[3], c[7])));
#else
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c[0], c[1]), _mm256_add_ps(c[2], c[3])),
                         _mm256_add_ps(_mm256_add_ps(c[4], c[5]), _mm256_add_ps(c[6], c[7])));
#endif
}

/* r[0..7] rows of eight lanes -> c[l] = lane l of every row (an 8 x 8 transpose; moves only). */
AVX2_FN static inline void transpose8(const __m256 r[8], __m256 c[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    c[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    c[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    c[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    c[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    c[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    c[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    c[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    c[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

AVX2_FN static float dot1_avx2(const float *a, const float *b, size_t n) {
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    float l[8];
    _mm256_storeu_ps(l, acc);
    bm_simd_tail_f32(l, a, b, i, n);
    return bm_simd_sum8(l);
}

AVX2_FN void bm_dot_f32_rows_avx2(const float *q, const float *k, size_t ldk, size_t n, int nk, float *out) {
    int j = 0;
    if (n % 8 == 0) /* a tail past the last eight would be per key: the one-key function below does it */
        for (; j + 8 <= nk; j += 8) {
            const float *kj = k + (size_t)j * ldk;
            __m256 acc[8], c[8];
            for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
            for (size_t i = 0; i < n; i += 8) {
                __m256 qv = _mm256_loadu_ps(q + i);
                for (int r = 0; r < 8; r++)
                    acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(qv, _mm256_loadu_ps(kj + (size_t)r * ldk + i)));
            }
            transpose8(acc, c);
            _mm256_storeu_ps(out + j, tree8(c));
        }
    for (; j < nk; j++) out[j] = dot1_avx2(q, k + (size_t)j * ldk, n);
}

AVX2_FN void bm_weighted_rows_avx2(const float *p, int nj, const float *v, size_t ldv, size_t n, float *out) {
    size_t c0 = 0;
    for (; c0 + 32 <= n; c0 += 32) { /* 32 columns in four registers, over every j */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int j = 0; j < nj; j++) {
            const float *vj = v + (size_t)j * ldv + c0;
            __m256 pj = _mm256_set1_ps(p[j]);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(pj, _mm256_loadu_ps(vj)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(pj, _mm256_loadu_ps(vj + 8)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(pj, _mm256_loadu_ps(vj + 16)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(pj, _mm256_loadu_ps(vj + 24)));
        }
        _mm256_storeu_ps(out + c0, a0);
        _mm256_storeu_ps(out + c0 + 8, a1);
        _mm256_storeu_ps(out + c0 + 16, a2);
        _mm256_storeu_ps(out + c0 + 24, a3);
    }
    for (; c0 + 8 <= n; c0 += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int j = 0; j < nj; j++)
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + (size_t)j * ldv + c0)));
        _mm256_storeu_ps(out + c0, a);
    }
    if (c0 < n) bm_weighted_rows_scalar(p, nj, v + c0, ldv, n - c0, out + c0);
}

/* AVX-512 F (the avx512-vnni path): sixteen lanes, the same order. A score's lanes are still element
 * i mod 8 of one key: a 512-bit register holds two keys' eight lanes side by side (key j in the low
 * half, key j + 8 in the high half, the query's eight values in both), so one multiply and one add
 * advance two keys' lanes exactly as two 256-bit ones would; the halves then go through AVX2's
 * transpose and tree. The weighted sum's columns are independent: sixteen per register. */
#define AVX512_FN __attribute__((target("avx2,f16c,avx512f")))

/* [a | b] and the halves back, with AVX-512 F's 64-bit-lane moves (the bits move unchanged). */
AVX512_FN static inline __m512 halves(__m256 a, __m256 b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(a)), _mm256_castps_pd(b), 1));
}
AVX512_FN static inline __m256 high_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

AVX512_FN void bm_dot_f32_rows_avx512(const float *q, const float *k, size_t ldk, size_t n, int nk, float *out) {
    int j = 0;
    if (n % 8 == 0)
        for (; j + 16 <= nk; j += 16) {
            const float *kj = k + (size_t)j * ldk;
            __m512 acc[8];
            for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
            for (size_t i = 0; i < n; i += 8) {
                const __m256 q8 = _mm256_loadu_ps(q + i);
                const __m512 qv = halves(q8, q8);
                for (int r = 0; r < 8; r++) {
                    const float *kr = kj + (size_t)r * ldk + i;
                    const __m512 kv = halves(_mm256_loadu_ps(kr), _mm256_loadu_ps(kr + 8 * ldk));
                    acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(qv, kv));
                }
            }
            __m256 lo[8], hi[8], c[8];
            for (int r = 0; r < 8; r++) lo[r] = _mm512_castps512_ps256(acc[r]), hi[r] = high_half(acc[r]);
            transpose8(lo, c);
            _mm256_storeu_ps(out + j, tree8(c));
            transpose8(hi, c);
            _mm256_storeu_ps(out + j + 8, tree8(c));
        }
    if (j < nk) bm_dot_f32_rows_avx2(q, k + (size_t)j * ldk, ldk, n, nk - j, out + j);
}

/* Two queries against the same keys (two heads of one KV group at one position): a register holds
 * query 0's eight lanes of one key in its low half and query 1's in its high half, so each key is
 * loaded once (a broadcast) for both, and nothing is shuffled per key. Each query's lanes, transpose
 * and tree are the one-query function's. */
AVX512_FN void bm_dot_f32_rows2_avx512(const float *q0, const float *q1, const float *k, size_t ldk, size_t n, int nk,
                                       float *out0, float *out1) {
    int j = 0;
    if (n % 8 == 0)
        for (; j + 8 <= nk; j += 8) {
            const float *kj = k + (size_t)j * ldk;
            __m512 acc[8];
            for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
            for (size_t i = 0; i < n; i += 8) {
                const __m512 qq = halves(_mm256_loadu_ps(q0 + i), _mm256_loadu_ps(q1 + i));
                for (int r = 0; r < 8; r++) {
                    const __m512 kv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)(kj + (size_t)r * ldk + i))));
                    acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(qq, kv));
                }
            }
            __m256 lo[8], hi[8], c[8];
            for (int r = 0; r < 8; r++) lo[r] = _mm512_castps512_ps256(acc[r]), hi[r] = high_half(acc[r]);
            transpose8(lo, c);
            _mm256_storeu_ps(out0 + j, tree8(c));
            transpose8(hi, c);
            _mm256_storeu_ps(out1 + j, tree8(c));
        }
    if (j < nk) {
        bm_dot_f32_rows_avx512(q0, k + (size_t)j * ldk, ldk, n, nk - j, out0 + j);
        bm_dot_f32_rows_avx512(q1, k + (size_t)j * ldk, ldk, n, nk - j, out1 + j);
    }
}

/* Two queries' weighted sums of the same values: each value is loaded once for both. */
AVX512_FN void bm_weighted_rows2_avx512(const float *p0, const float *p1, int nj, const float *v, size_t ldv, size_t n,
                                        float *out0, float *out1) {
    size_t c0 = 0;
    for (; c0 + 64 <= n; c0 += 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (int j = 0; j < nj; j++) {
            const float *vj = v + (size_t)j * ldv + c0;
            const __m512 pa = _mm512_set1_ps(p0[j]), pb = _mm512_set1_ps(p1[j]);
            const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16), v2 = _mm512_loadu_ps(vj + 32),
                         v3 = _mm512_loadu_ps(vj + 48);
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(pa, v0));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(pa, v1));
            a2 = _mm512_add_ps(a2, _mm512_mul_ps(pa, v2));
            a3 = _mm512_add_ps(a3, _mm512_mul_ps(pa, v3));
            b0 = _mm512_add_ps(b0, _mm512_mul_ps(pb, v0));
            b1 = _mm512_add_ps(b1, _mm512_mul_ps(pb, v1));
            b2 = _mm512_add_ps(b2, _mm512_mul_ps(pb, v2));
            b3 = _mm512_add_ps(b3, _mm512_mul_ps(pb, v3));
        }
        _mm512_storeu_ps(out0 + c0, a0);
        _mm512_storeu_ps(out0 + c0 + 16, a1);
        _mm512_storeu_ps(out0 + c0 + 32, a2);
        _mm512_storeu_ps(out0 + c0 + 48, a3);
        _mm512_storeu_ps(out1 + c0, b0);
        _mm512_storeu_ps(out1 + c0 + 16, b1);
        _mm512_storeu_ps(out1 + c0 + 32, b2);
        _mm512_storeu_ps(out1 + c0 + 48, b3);
    }
    if (c0 < n) {
        bm_weighted_rows_avx512(p0, nj, v + c0, ldv, n - c0, out0 + c0);
        bm_weighted_rows_avx512(p1, nj, v + c0, ldv, n - c0, out1 + c0);
    }
}

AVX512_FN void bm_weighted_rows_avx512(const float *p, int nj, const float *v, size_t ldv, size_t n, float *out) {
    size_t c0 = 0;
    for (; c0 + 64 <= n; c0 += 64) { /* 64 columns in four registers, over every j */
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int j = 0; j < nj; j++) {
            const float *vj = v + (size_t)j * ldv + c0;
            const __m512 pj = _mm512_set1_ps(p[j]);
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(pj, _mm512_loadu_ps(vj)));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(pj, _mm512_loadu_ps(vj + 16)));
            a2 = _mm512_add_ps(a2, _mm512_mul_ps(pj, _mm512_loadu_ps(vj + 32)));
            a3 = _mm512_add_ps(a3, _mm512_mul_ps(pj, _mm512_loadu_ps(vj + 48)));
        }
        _mm512_storeu_ps(out + c0, a0);
        _mm512_storeu_ps(out + c0 + 16, a1);
        _mm512_storeu_ps(out + c0 + 32, a2);
        _mm512_storeu_ps(out + c0 + 48, a3);
    }
    if (c0 < n) bm_weighted_rows_avx2(p, nj, v + c0, ldv, n - c0, out + c0);
}

#endif

#if defined(__aarch64__)
#include <arm_neon.h>

/* l[0..7] = lane l of four keys; the tree's adds for all four. */
static inline float32x4_t tree8_neon(const float32x4_t l[8]) {
#ifdef BMOE_FAULT_SIMD_LANE_ORDER
    return vaddq_f32(vaddq_f32(vaddq_f32(l[0], l[4]), vaddq_f32(l[2], l[6])),
                     vaddq_f32(vaddq_f32(l[1], l[5]), vaddq_f32(l[3], l[7])));
#else
    return vaddq_f32(vaddq_f32(vaddq_f32(l[0], l[1]), vaddq_f32(l[2], l[3])),
                     vaddq_f32(vaddq_f32(l[4], l[5]), vaddq_f32(l[6], l[7])));
#endif
}

/* r[0..3] rows of four lanes -> c[l] = lane l of every row. */
static inline void transpose4(const float32x4_t r[4], float32x4_t c[4]) {
    float32x4_t t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
    float32x4_t t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
    c[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    c[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
    c[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    c[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

static float dot1_neon(const float *a, const float *b, size_t n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = vaddq_f32(a0, vmulq_f32(vld1q_f32(a + i), vld1q_f32(b + i)));
        a1 = vaddq_f32(a1, vmulq_f32(vld1q_f32(a + i + 4), vld1q_f32(b + i + 4)));
    }
    float l[8];
    vst1q_f32(l, a0);
    vst1q_f32(l + 4, a1);
    bm_simd_tail_f32(l, a, b, i, n);
    return bm_simd_sum8(l);
}

void bm_dot_f32_rows_neon(const float *q, const float *k, size_t ldk, size_t n, int nk, float *out) {
    int j = 0;
    if (n % 8 == 0)
        for (; j + 4 <= nk; j += 4) {
            const float *kj = k + (size_t)j * ldk;
            float32x4_t lo[4], hi[4], l[8];
            for (int r = 0; r < 4; r++) lo[r] = hi[r] = vdupq_n_f32(0.0f);
            for (size_t i = 0; i < n; i += 8) {
                float32x4_t q0 = vld1q_f32(q + i), q1 = vld1q_f32(q + i + 4);
                for (int r = 0; r < 4; r++) {
                    const float *kr = kj + (size_t)r * ldk + i;
                    lo[r] = vaddq_f32(lo[r], vmulq_f32(q0, vld1q_f32(kr)));
                    hi[r] = vaddq_f32(hi[r], vmulq_f32(q1, vld1q_f32(kr + 4)));
                }
            }
            transpose4(lo, l);
            transpose4(hi, l + 4);
            vst1q_f32(out + j, tree8_neon(l));
        }
    for (; j < nk; j++) out[j] = dot1_neon(q, k + (size_t)j * ldk, n);
}

void bm_weighted_rows_neon(const float *p, int nj, const float *v, size_t ldv, size_t n, float *out) {
    size_t c0 = 0;
    for (; c0 + 16 <= n; c0 += 16) {
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (int j = 0; j < nj; j++) {
            const float *vj = v + (size_t)j * ldv + c0;
            float32x4_t pj = vdupq_n_f32(p[j]);
            a0 = vaddq_f32(a0, vmulq_f32(pj, vld1q_f32(vj)));
            a1 = vaddq_f32(a1, vmulq_f32(pj, vld1q_f32(vj + 4)));
            a2 = vaddq_f32(a2, vmulq_f32(pj, vld1q_f32(vj + 8)));
            a3 = vaddq_f32(a3, vmulq_f32(pj, vld1q_f32(vj + 12)));
        }
        vst1q_f32(out + c0, a0);
        vst1q_f32(out + c0 + 4, a1);
        vst1q_f32(out + c0 + 8, a2);
        vst1q_f32(out + c0 + 12, a3);
    }
    if (c0 < n) bm_weighted_rows_scalar(p, nj, v + c0, ldv, n - c0, out + c0);
}

#endif
