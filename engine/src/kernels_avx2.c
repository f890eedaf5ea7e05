/* x86_64 AVX2 kernels: the scalar path's bits (kernels.h), eight float lanes in one register.
 *
 * Only the functions below are compiled for AVX2 + F16C (a function attribute, not a whole-binary
 * flag), and they are used only after the CPU check. Multiply and add are separate instructions:
 * FMA is not enabled, and the build has -ffp-contract=off. */
#include "kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#include "gguf.h"
#include "kernels_lanes.h"

#define AVX2_FN __attribute__((target("avx2,f16c")))
#define BM_VEXP_FN AVX2_FN
#include "kernels_vexp.h"

AVX2_FN static float dot_f32_avx2(const float *a, const float *b, size_t n) {
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    float l[8];
    _mm256_storeu_ps(l, acc);
    bm_simd_tail_f32(l, a, b, i, n);
    return bm_simd_sum8(l);
}

AVX2_FN static float dot_f16_avx2(const uint8_t *w, const float *x, size_t n) {
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 wf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i))); /* exact */
        acc = _mm256_add_ps(acc, _mm256_mul_ps(wf, _mm256_loadu_ps(x + i)));
    }
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (; i < n; i++) l[i & 7] += bm_f16_to_f32(bm_rd16(w + 2 * i)) * x[i];
    return bm_simd_sum8(l);
}

/* The exact integer dot product of one block, as eight int32 partial sums. |w| (as unsigned, so
 * -128 is 128) times x * sign(w): pairs stay within int16 because |x| <= 127. */
AVX2_FN static inline __m256i block_dot(const uint8_t *blk, const int8_t *xq) {
    __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m256i xv = _mm256_loadu_si256((const __m256i *)xq);
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* The last nb mod 8 blocks (from block b), as the scalar path does them, onto the lanes acc, and the
 * lane tree. */
AVX2_FN static float q8_0_tail(__m256 acc, const uint8_t *w, const int8_t *xq, const float *xd, size_t b, size_t nb) {
    float l[8];
    _mm256_storeu_ps(l, acc);
    bm_q8_0_blocks(l, w, xq, xd, b, nb);
    return bm_simd_sum8(l);
}

/* The eight scales of blocks blk .. blk + 7 as floats (exact). */
AVX2_FN static inline __m256 q8_0_scales8(const uint8_t *w, const uint8_t *blk) {
    const size_t B = BMOE_Q8_0_BYTES;
#ifndef BMOE_FAULT_Q8_0_FIRST_SCALE
    (void)w;
    __m128i sc = _mm_set_epi16((short)bm_rd16(blk + 7 * B), (short)bm_rd16(blk + 6 * B), (short)bm_rd16(blk + 5 * B),
                               (short)bm_rd16(blk + 4 * B), (short)bm_rd16(blk + 3 * B), (short)bm_rd16(blk + 2 * B),
                               (short)bm_rd16(blk + B), (short)bm_rd16(blk));
#else
    __m128i sc = _mm_set1_epi16((short)bm_rd16(w)); /* fault: every block uses the row's first scale */
    (void)B;
    (void)blk;
#endif
    return _mm256_cvtph_ps(sc);
}

AVX2_FN static float dot_q8_0_avx2(const uint8_t *w, const int8_t *xq, const float *xd, size_t n) {
    size_t nb = n / BMOE_Q8_0_BLOCK, b = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *blk = w + b * BMOE_Q8_0_BYTES;
        const int8_t *p = xq + b * BMOE_Q8_0_BLOCK;
        bm_prefetch_ahead(blk, 8 * BMOE_Q8_0_BYTES);
        __m256i v[8];
        for (int k = 0; k < 8; k++) v[k] = block_dot(blk + (size_t)k * BMOE_Q8_0_BYTES, p + k * BMOE_Q8_0_BLOCK);
        /* lane k of s = block k's exact sum */
        __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
        __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
        __m256i h0123 = _mm256_hadd_epi32(h01, h23), h4567 = _mm256_hadd_epi32(h45, h67);
        __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                                     _mm256_permute2x128_si256(h0123, h4567, 0x31));
        __m256 dd = _mm256_mul_ps(q8_0_scales8(w, blk), _mm256_loadu_ps(xd + b));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(s), dd));
    }
    return q8_0_tail(acc, w, xq, xd, b, nb);
}

/* ---- several tokens per call (kernels.h, *_mt): each token's lanes, adds and tree are the one-token
 * function's; what is shared is loading (and converting) the weights. NT is a constant after
 * inlining, so the per-token accumulators live in registers. */

#define AVX2_MT_FN AVX2_FN __attribute__((always_inline)) static inline

AVX2_MT_FN void f32_mt(const float *w, const float *x, size_t n, const int NT, float *out) {
    __m256 acc[BM_MT_MAX];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 wv = _mm256_loadu_ps(w + i);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(wv, _mm256_loadu_ps(x + (size_t)t * n + i)));
    }
    for (int t = 0; t < NT; t++) {
        const float *xt = x + (size_t)t * n;
        float l[8];
        _mm256_storeu_ps(l, acc[t]);
        bm_simd_tail_f32(l, w, xt, i, n);
        out[t] = bm_simd_sum8(l);
    }
}

AVX2_MT_FN void f16_mt(const uint8_t *w, const float *x, size_t n, const int NT, float *out) {
    __m256 acc[BM_MT_MAX];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 wf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i))); /* exact */
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(wf, _mm256_loadu_ps(x + (size_t)t * n + i)));
    }
    for (int t = 0; t < NT; t++) {
        const float *xt = x + (size_t)t * n;
        float l[8];
        _mm256_storeu_ps(l, acc[t]);
        for (size_t j = i; j < n; j++) l[j & 7] += bm_f16_to_f32(bm_rd16(w + 2 * j)) * xt[j];
        out[t] = bm_simd_sum8(l);
    }
}

/* block_dot with the weight block already loaded (wv) and made unsigned (aw = |wv|). */
AVX2_FN static inline __m256i block_dot_w(__m256i aw, __m256i wv, const int8_t *xq) {
    __m256i xv = _mm256_loadu_si256((const __m256i *)xq);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), _mm256_set1_epi16(1));
}

AVX2_MT_FN void q8_0_mt(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, const int NT, float *out) {
    size_t nb = n / BMOE_Q8_0_BLOCK, b = 0;
    __m256 acc[BM_MT_MAX];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *blk = w + b * BMOE_Q8_0_BYTES;
        bm_prefetch_ahead(blk, 8 * BMOE_Q8_0_BYTES);
        __m256i h[2][BM_MT_MAX]; /* blocks 0-3 and 4-7: lane k of s below = block k's exact sum */
        for (int g = 0; g < 2; g++) {
            __m256i wv[4], aw[4];
            for (int k = 0; k < 4; k++) {
                wv[k] = _mm256_loadu_si256((const __m256i *)(blk + (size_t)(4 * g + k) * BMOE_Q8_0_BYTES + 2));
                aw[k] = _mm256_sign_epi8(wv[k], wv[k]);
            }
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const int8_t *p = xq + (size_t)t * n + (b + 4 * (size_t)g) * BMOE_Q8_0_BLOCK;
                __m256i v0 = block_dot_w(aw[0], wv[0], p), v1 = block_dot_w(aw[1], wv[1], p + BMOE_Q8_0_BLOCK);
                __m256i v2 = block_dot_w(aw[2], wv[2], p + 2 * BMOE_Q8_0_BLOCK);
                __m256i v3 = block_dot_w(aw[3], wv[3], p + 3 * BMOE_Q8_0_BLOCK);
                h[g][t] = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
            }
        }
        __m256 dw = q8_0_scales8(w, blk);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(h[0][t], h[1][t], 0x20),
                                         _mm256_permute2x128_si256(h[0][t], h[1][t], 0x31));
            __m256 dd = _mm256_mul_ps(dw, _mm256_loadu_ps(xd + (size_t)t * nb + b));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(s), dd));
        }
    }
    for (int t = 0; t < NT; t++) out[t] = q8_0_tail(acc[t], w, xq + (size_t)t * n, xd + (size_t)t * nb, b, nb);
}

AVX2_FN static void dot_f32_mt_avx2(const float *w, const float *x, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: f32_mt(w, x, n, 4, out); break;
    case 3: f32_mt(w, x, n, 3, out); break;
    case 2: f32_mt(w, x, n, 2, out); break;
    default: out[0] = dot_f32_avx2(w, x, n);
    }
}

AVX2_FN static void dot_f16_mt_avx2(const uint8_t *w, const float *x, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: f16_mt(w, x, n, 4, out); break;
    case 3: f16_mt(w, x, n, 3, out); break;
    case 2: f16_mt(w, x, n, 2, out); break;
    default: out[0] = dot_f16_avx2(w, x, n);
    }
}

AVX2_FN static void dot_q8_0_mt_avx2(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: q8_0_mt(w, xq, xd, n, 4, out); break;
    case 3: q8_0_mt(w, xq, xd, n, 3, out); break;
    case 2: q8_0_mt(w, xq, xd, n, 2, out); break;
    default: out[0] = dot_q8_0_avx2(w, xq, xd, n);
    }
}

/* ---- dequantised types (kernels.h): the weights become the floats bm_dequant_chunk gives (eight at a
 * time here, with the same IEEE operations per value: the integer levels convert exactly), then the
 * F32 dot product's lanes, adds and tree. */

/* Eight bytes as eight int32. */
AVX2_FN static inline __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

AVX2_FN static void dq_q4_K_avx2(const uint8_t *blk, float *y) {
    const float d = bm_f16_to_f32(bm_rd16(blk)), dmin = bm_f16_to_f32(bm_rd16(blk + 2));
    const __m256i m4 = _mm256_set1_epi32(0xF);
    for (int j = 0; j < 4; j++) {
        uint8_t sc, m;
        bm_scale_min_k4(2 * j, blk + 4, &sc, &m);
        const __m256 d1 = _mm256_set1_ps(d * (float)sc), m1 = _mm256_set1_ps(dmin * (float)m);
        bm_scale_min_k4(2 * j + 1, blk + 4, &sc, &m);
        const __m256 d2 = _mm256_set1_ps(d * (float)sc), m2 = _mm256_set1_ps(dmin * (float)m);
        const uint8_t *q = blk + 16 + 32 * j;
        for (int l = 0; l < 32; l += 8) {
            __m256i v = u8x8(q + l);
            __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, m4)), hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
            _mm256_storeu_ps(y + 64 * j + l, _mm256_sub_ps(_mm256_mul_ps(d1, lo), m1));
            _mm256_storeu_ps(y + 64 * j + 32 + l, _mm256_sub_ps(_mm256_mul_ps(d2, hi), m2));
        }
    }
}

AVX2_FN static void dq_q6_K_avx2(const uint8_t *blk, float *y) {
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = bm_f16_to_f32(bm_rd16(blk + 208));
    const __m256i m4 = _mm256_set1_epi32(0xF), m3 = _mm256_set1_epi32(3), k32 = _mm256_set1_epi32(32);
#ifndef BMOE_FAULT_Q6_K_HIGH_SHIFT
    const int s2 = 2, s3 = 4;
#else
    const int s2 = 4, s3 = 2; /* fault: as in tensor.c */
#endif
    for (int n = 0; n < 2; n++, ql += 64, qh += 32, sc += 8, y += 128) {
        for (int l = 0; l < 32; l += 8) {
            int is = l / 16;
            __m256i a = u8x8(ql + l), b = u8x8(ql + l + 32), h = u8x8(qh + l);
            __m256i q1 = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi32(_mm256_and_si256(h, m3), 4)), k32);
            __m256i q2 = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(b, m4),
                                                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(s2)), m3), 4)), k32);
            __m256i q3 = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(a, 4),
                                                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(s3)), m3), 4)), k32);
            __m256i q4 = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(b, 4), _mm256_slli_epi32(_mm256_srli_epi32(h, 6), 4)), k32);
            _mm256_storeu_ps(y + l, _mm256_mul_ps(_mm256_set1_ps(d * (float)sc[is]), _mm256_cvtepi32_ps(q1)));
            _mm256_storeu_ps(y + l + 32, _mm256_mul_ps(_mm256_set1_ps(d * (float)sc[is + 2]), _mm256_cvtepi32_ps(q2)));
            _mm256_storeu_ps(y + l + 64, _mm256_mul_ps(_mm256_set1_ps(d * (float)sc[is + 4]), _mm256_cvtepi32_ps(q3)));
            _mm256_storeu_ps(y + l + 96, _mm256_mul_ps(_mm256_set1_ps(d * (float)sc[is + 6]), _mm256_cvtepi32_ps(q4)));
        }
    }
}

AVX2_FN static void dq_q5_K_avx2(const uint8_t *blk, float *y) {
    const float d = bm_f16_to_f32(bm_rd16(blk)), dmin = bm_f16_to_f32(bm_rd16(blk + 2));
    const __m256i m4 = _mm256_set1_epi32(0xF), one = _mm256_set1_epi32(1);
    const uint8_t *qh = blk + 16;
    for (int j = 0; j < 4; j++) {
        uint8_t sc, m;
        bm_scale_min_k4(2 * j, blk + 4, &sc, &m);
        const __m256 d1 = _mm256_set1_ps(d * (float)sc), m1 = _mm256_set1_ps(dmin * (float)m);
        bm_scale_min_k4(2 * j + 1, blk + 4, &sc, &m);
        const __m256 d2 = _mm256_set1_ps(d * (float)sc), m2 = _mm256_set1_ps(dmin * (float)m);
        const uint8_t *q = blk + 48 + 32 * j;
        for (int l = 0; l < 32; l += 8) {
            __m256i v = u8x8(q + l), h = u8x8(qh + l);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4),
                                         _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * j)), one), 4));
            __m256i hi = _mm256_or_si256(_mm256_srli_epi32(v, 4),
                                         _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * j + 1)), one), 4));
            _mm256_storeu_ps(y + 64 * j + l, _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(lo)), m1));
            _mm256_storeu_ps(y + 64 * j + 32 + l, _mm256_sub_ps(_mm256_mul_ps(d2, _mm256_cvtepi32_ps(hi)), m2));
        }
    }
}

/* Q4_0 / Q5_0 blocks b0 .. b0 + nb - 1: (float)(q - 8) * d, (float)(q - 16) * d, as tensor.c. */
AVX2_FN static void dq_q4_5_0_avx2(int five, const uint8_t *w, size_t b0, size_t nb, float *y) {
    const __m256i m4 = _mm256_set1_epi32(0xF), one = _mm256_set1_epi32(1);
    const __m256i off = _mm256_set1_epi32(five ? 16 : 8), j8 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const size_t bb = five ? BMOE_Q5_0_BYTES : BMOE_Q4_0_BYTES;
    for (size_t b = 0; b < nb; b++, y += 32) {
        const uint8_t *blk = w + (b0 + b) * bb, *qs = blk + (five ? 6 : 2);
        const __m256 d = _mm256_set1_ps(bm_f16_to_f32(bm_rd16(blk)));
        __m256i qh = _mm256_setzero_si256();
        if (five)
            qh = _mm256_set1_epi32((int)((uint32_t)blk[2] | ((uint32_t)blk[3] << 8) | ((uint32_t)blk[4] << 16) |
                                         ((uint32_t)blk[5] << 24)));
        for (int g = 0; g < 2; g++) { /* values 8g .. 8g+7 (low nibbles) and 16+8g .. (high) */
            __m256i v = u8x8(qs + 8 * g);
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_srli_epi32(v, 4);
            if (five) {
                __m256i jl = _mm256_add_epi32(j8, _mm256_set1_epi32(8 * g));
                lo = _mm256_or_si256(lo, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(qh, jl), one), 4));
                __m256i jh = _mm256_add_epi32(jl, _mm256_set1_epi32(16));
                hi = _mm256_or_si256(hi, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(qh, jh), one), 4));
            }
            _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo, off)), d));
            _mm256_storeu_ps(y + 16 + 8 * g, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi, off)), d));
        }
    }
}

AVX2_FN static void dq_bf16_avx2(const uint8_t *w, size_t i0, size_t cnt, float *y) {
    size_t i = 0;
    for (; i + 8 <= cnt; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + 2 * (i0 + i))));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))); /* exact */
    }
    if (i < cnt) bm_dequant_chunk(GGML_TYPE_BF16, w, i0 + i, cnt - i, y + i);
}

AVX2_FN static inline void dq_chunk_avx2(uint32_t type, const uint8_t *w, size_t i0, size_t cnt, float *y) {
    switch (type) {
    case GGML_TYPE_Q4_K: dq_q4_K_avx2(w + i0 / BMOE_QK_K * BMOE_Q4_K_BYTES, y); break;
    case GGML_TYPE_Q5_K: dq_q5_K_avx2(w + i0 / BMOE_QK_K * BMOE_Q5_K_BYTES, y); break;
    case GGML_TYPE_Q6_K: dq_q6_K_avx2(w + i0 / BMOE_QK_K * BMOE_Q6_K_BYTES, y); break;
    case GGML_TYPE_Q4_0: dq_q4_5_0_avx2(0, w, i0 / 32, cnt / 32, y); break;
    case GGML_TYPE_Q5_0: dq_q4_5_0_avx2(1, w, i0 / 32, cnt / 32, y); break;
    case GGML_TYPE_BF16: dq_bf16_avx2(w, i0, cnt, y); break;
    default: bm_dequant_chunk(type, w, i0, cnt, y);
    }
}

/* One chunk's floats y[0..cnt) times x[0..cnt) onto the lanes acc (a tail past the last eight, only in
 * a row's last chunk, as the F32 kernel adds it). */
AVX2_FN static inline __m256 dq_acc(__m256 acc, const float *y, const float *x, size_t cnt) {
    size_t j = 0;
    for (; j + 8 <= cnt; j += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(y + j), _mm256_loadu_ps(x + j)));
    if (j < cnt) {
        float l[8];
        _mm256_storeu_ps(l, acc);
        bm_simd_tail_f32(l, y, x, j, cnt);
        acc = _mm256_loadu_ps(l);
    }
    return acc;
}

AVX2_FN static float dot_dq_avx2(uint32_t type, const uint8_t *w, const float *x, size_t n) {
    __m256 acc = _mm256_setzero_ps();
    float y[BMOE_DQ_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += BMOE_DQ_CHUNK) {
        size_t cnt = n - i0 < BMOE_DQ_CHUNK ? n - i0 : BMOE_DQ_CHUNK;
        dq_chunk_avx2(type, w, i0, cnt, y);
        acc = dq_acc(acc, y, x + i0, cnt);
    }
    float l[8];
    _mm256_storeu_ps(l, acc);
    return bm_simd_sum8(l);
}

AVX2_FN static void dot_dq_mt_avx2(uint32_t type, const uint8_t *w, const float *x, size_t n, int nt, float *out) {
    __m256 acc[BM_MT_MAX];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    float y[BMOE_DQ_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += BMOE_DQ_CHUNK) {
        size_t cnt = n - i0 < BMOE_DQ_CHUNK ? n - i0 : BMOE_DQ_CHUNK;
        dq_chunk_avx2(type, w, i0, cnt, y); /* once for every token */
        for (int t = 0; t < nt; t++) acc[t] = dq_acc(acc[t], y, x + (size_t)t * n + i0, cnt);
    }
    for (int t = 0; t < nt; t++) {
        float l[8];
        _mm256_storeu_ps(l, acc[t]);
        out[t] = bm_simd_sum8(l);
    }
}

/* bm_quantize_q8_0, eight values at a time. Every step is exact or the same IEEE operation as the
 * scalar code (max of |x|, x * id, clamp, truncation, the half-away rounding); a block with a NaN or
 * an infinity goes to the scalar code. */
AVX2_FN static void quantize_q8_0_avx2(const float *x, size_t n, int8_t *xq, float *xd) {
    const __m256 sign = _mm256_set1_ps(-0.0f), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    const __m256 half = _mm256_set1_ps(0.5f), mhalf = _mm256_set1_ps(-0.5f), one = _mm256_set1_ps(1.0f);
    for (size_t b = 0; b < n / BMOE_Q8_0_BLOCK; b++) {
        const float *v = x + b * BMOE_Q8_0_BLOCK;
        int8_t *q = xq + b * BMOE_Q8_0_BLOCK;
        __m256 x4[4];
        for (int i = 0; i < 4; i++) x4[i] = _mm256_loadu_ps(v + 8 * i);
        __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, x4[0]), _mm256_andnot_ps(sign, x4[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, x4[2]), _mm256_andnot_ps(sign, x4[3])));
        __m256 bad = _mm256_cmp_ps(a, _mm256_set1_ps(3.40282347e+38f), _CMP_NLE_UQ); /* NaN or inf */
        for (int i = 0; i < 4; i++) bad = _mm256_or_ps(bad, _mm256_cmp_ps(x4[i], x4[i], _CMP_UNORD_Q));
        if (_mm256_movemask_ps(bad)) {
            bm_quantize_q8_0(v, BMOE_Q8_0_BLOCK, q, xd + b);
            continue;
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
        float amax = _mm_cvtss_f32(m);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        xd[b] = bm_f16_to_f32(bm_f32_to_f16(d));
        __m256 idv = _mm256_set1_ps(id);
        __m256i r[4];
        for (int i = 0; i < 4; i++) {
            __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(x4[i], idv), lo), hi);
            __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __m256 fr = _mm256_sub_ps(t, tr);
            __m256 up = _mm256_and_ps(_mm256_cmp_ps(fr, half, _CMP_GE_OQ), one);
            __m256 dn = _mm256_and_ps(_mm256_cmp_ps(fr, mhalf, _CMP_LE_OQ), one);
            r[i] = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(tr, up), dn));
        }
        __m256i p16 = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
        /* the packs work per 128-bit half: put the 4-byte groups back in order */
        p16 = _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)q, p16);
    }
}

static int cpu_has_avx2_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx || !f16c) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u) return 0; /* the OS saves the ymm registers */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1;
}

int bm_kernels_avx2(bm_kernels *k) {
    if (!cpu_has_avx2_f16c()) return 0;
    k->path = BM_KPATH_AVX2;
    k->dot_f32 = dot_f32_avx2;
    k->dot_f16 = dot_f16_avx2;
    k->dot_q8_0 = dot_q8_0_avx2;
    k->quantize_q8_0 = quantize_q8_0_avx2;
    k->dot_f32_mt = dot_f32_mt_avx2;
    k->dot_f16_mt = dot_f16_mt_avx2;
    k->dot_q8_0_mt = dot_q8_0_mt_avx2;
    k->dot_dq = dot_dq_avx2;
    k->dot_dq_mt = dot_dq_mt_avx2;
    k->silu_mul = bm_vsilu_mul;
    k->exp_shift = bm_vexp_shift;
    return 1;
}

#else

int bm_kernels_avx2(bm_kernels *k) {
    (void)k;
    return 0;
}

#endif
