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
#define BM_X86_FN AVX2_FN
#include "kernels_x86.h"
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

#define AVX2_MT_FN AVX2_FN __attribute__((always_inline)) static inline

/* block_dot with the weight block already loaded (wv) and made unsigned (aw = |wv|). */
AVX2_FN static inline __m256i block_dot_w(__m256i aw, __m256i wv, const int8_t *xq) {
    __m256i xv = _mm256_loadu_si256((const __m256i *)xq);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), _mm256_set1_epi16(1));
}

/* The last r = nb - b (1 .. 7) blocks of a row of 32-value blocks, for NT tokens at once (b a multiple
 * of 8, so block b + k goes to lane k): their signed levels wv[k] (k < r; the rest unused) and scales dw
 * (0 in lanes >= r) loaded once for every token; each block's exact integer sum as the main loop forms
 * it, then the scalar path's float step (float)s * (d_w * d_x) onto lane k in one vector step. Lanes
 * >= r keep their value (a blend, so not even a zero is added to them), which is the scalar loop's
 * result: each lane gets at most one tail block. */
AVX2_MT_FN void blk32_tail_mt(const __m256i wv[8], __m256 dw, int r, const int8_t *xq, const float *xd, size_t n,
                              size_t nb, size_t b, const int NT, __m256 acc[]) {
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i aw[8];
    for (int k = 0; k < 8; k++) aw[k] = k < r ? _mm256_sign_epi8(wv[k], wv[k]) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        const int8_t *p = xq + (size_t)t * n + b * BMOE_Q8_0_BLOCK;
        __m256i v[8];
        for (int k = 0; k < 8; k++) v[k] = k < r ? block_dot_w(aw[k], wv[k], p + k * BMOE_Q8_0_BLOCK) : _mm256_setzero_si256();
        __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
        __m256 dd = _mm256_mul_ps(dw, _mm256_maskload_ps(xd + (size_t)t * nb + b, m));
        __m256 c = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(s), dd));
        acc[t] = _mm256_blendv_ps(acc[t], c, _mm256_castsi256_ps(m));
    }
}

/* Q8_0's last nb mod 8 blocks (from block b) for NT tokens onto their lanes (blk32_tail_mt). */
AVX2_MT_FN void q8_0_tail_mt(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, size_t nb, size_t b,
                             const int NT, __m256 acc[]) {
    if (b < nb) {
        const int r = (int)(nb - b);
        const uint8_t *blk = w + b * BMOE_Q8_0_BYTES;
        __m256i wv[8];
        uint16_t sc[8] = {0};
        for (int k = 0; k < 8; k++) wv[k] = _mm256_setzero_si256();
        for (int k = 0; k < r; k++) {
            wv[k] = _mm256_loadu_si256((const __m256i *)(blk + (size_t)k * BMOE_Q8_0_BYTES + 2));
#ifndef BMOE_FAULT_Q8_0_FIRST_SCALE
            sc[k] = bm_rd16(blk + (size_t)k * BMOE_Q8_0_BYTES);
#else
            sc[k] = bm_rd16(w); /* fault: every block uses the row's first scale */
#endif
        }
        blk32_tail_mt(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc)), r, xq, xd, n, nb, b, NT, acc);
    }
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
    q8_0_tail_mt(w, xq, xd, n, nb, b, 1, &acc);
    float l[8];
    _mm256_storeu_ps(l, acc);
    return bm_simd_sum8(l);
}

/* ---- several tokens per call (kernels.h, *_mt): each token's lanes, adds and tree are the one-token
 * function's; what is shared is loading (and converting) the weights. NT is a constant after
 * inlining, so the per-token accumulators live in registers. */

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
    q8_0_tail_mt(w, xq, xd, n, nb, b, NT, acc);
    for (int t = 0; t < NT; t++) {
        float l[8];
        _mm256_storeu_ps(l, acc[t]);
        out[t] = bm_simd_sum8(l);
    }
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

/* ---- Q4_0 / Q5_0 against Q8_0 blocks (kernels.h): the Q8_0 kernel with the weights' levels unpacked
 * to signed bytes first. */


/* The eight f16 scales of blocks blk, blk + bb, ... as floats (exact). */
AVX2_FN static inline __m256 scales8_stride(const uint8_t *blk, size_t bb) {
    __m128i sc = _mm_set_epi16((short)bm_rd16(blk + 7 * bb), (short)bm_rd16(blk + 6 * bb), (short)bm_rd16(blk + 5 * bb),
                               (short)bm_rd16(blk + 4 * bb), (short)bm_rd16(blk + 3 * bb), (short)bm_rd16(blk + 2 * bb),
                               (short)bm_rd16(blk + bb), (short)bm_rd16(blk));
    return _mm256_cvtph_ps(sc);
}

AVX2_MT_FN void q45_0_mt(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n, const int NT,
                         float *out) {
    const size_t nb = n / BMOE_Q8_0_BLOCK, bb = bm_q45_0_bytes(type);
    size_t b = 0;
    __m256 acc[BM_MT_MAX];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *blk = w + b * bb;
        bm_prefetch_ahead(blk, 8 * bb);
        __m256i h[2][BM_MT_MAX]; /* blocks 0-3 and 4-7: lane k of s below = block k's exact sum */
        for (int g = 0; g < 2; g++) {
            __m256i wv[4], aw[4];
            for (int k = 0; k < 4; k++) {
                wv[k] = bm_x86_q45_0_levels(type, blk + (size_t)(4 * g + k) * bb);
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
        __m256 dw = scales8_stride(blk, bb);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(h[0][t], h[1][t], 0x20),
                                         _mm256_permute2x128_si256(h[0][t], h[1][t], 0x31));
#ifndef BMOE_FAULT_MT_Q45_0_TOKEN_SCALES
            __m256 dd = _mm256_mul_ps(dw, _mm256_loadu_ps(xd + (size_t)t * nb + b));
#else /* fault: every token of the group is scaled by the first token's activation scales */
            __m256 dd = _mm256_mul_ps(dw, _mm256_loadu_ps(xd + b));
#endif
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(s), dd));
        }
    }
    if (b < nb) { /* the last nb mod 8 blocks (a row of 20 blocks, d = 640, has four): unpacked once */
        const int r = (int)(nb - b);
        const uint8_t *blk = w + b * bb;
        __m256i wv[8];
        uint16_t sc[8] = {0};
        for (int k = 0; k < 8; k++) wv[k] = _mm256_setzero_si256();
        for (int k = 0; k < r; k++) {
            wv[k] = bm_x86_q45_0_levels(type, blk + (size_t)k * bb);
            sc[k] = bm_rd16(blk + (size_t)k * bb);
        }
        blk32_tail_mt(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc)), r, xq, xd, n, nb, b, NT, acc);
    }
    for (int t = 0; t < NT; t++) {
        float l[8];
        _mm256_storeu_ps(l, acc[t]);
        out[t] = bm_simd_sum8(l);
    }
}

AVX2_FN static float dot_q45_0_avx2(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n) {
    float o;
    q45_0_mt(type, w, xq, xd, n, 1, &o);
    return o;
}

AVX2_FN static void dot_q45_0_mt_avx2(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n,
                                      int nt, float *out) {
    switch (nt) {
    case 4: q45_0_mt(type, w, xq, xd, n, 4, out); break;
    case 3: q45_0_mt(type, w, xq, xd, n, 3, out); break;
    case 2: q45_0_mt(type, w, xq, xd, n, 2, out); break;
    default: q45_0_mt(type, w, xq, xd, n, 1, out);
    }
}

/* ---- Q4_1 / Q5_1 against Q8_1 blocks (kernels.h): unsigned levels, so maddubs takes them as they
 * are (pairs of level times activation within int16: 2 * 31 * 127); the float steps are
 * bm_q1_value's, eight blocks at a time. */

/* Block blk's 32 unsigned levels (bm_q41_levels) in one register. */
AVX2_FN static inline __m256i q41_levels(int five, const uint8_t *blk) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m128i t = _mm_loadu_si128((const __m128i *)(blk + (five ? 8 : 4)));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), m4);
    if (!five) return v;
    uint32_t qh = (uint32_t)blk[4] | ((uint32_t)blk[5] << 8) | ((uint32_t)blk[6] << 16) | ((uint32_t)blk[7] << 24);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                        _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(v, hb);
}

AVX2_MT_FN void q41_mt(int five, const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, size_t n,
                       const int NT, float *out) {
    const size_t nb = n / BMOE_Q8_0_BLOCK, bb = bm_q41_bytes(five);
    const __m256i ones = _mm256_set1_epi16(1);
    size_t b = 0;
    __m256 acc[BM_MT_MAX];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *blk = w + b * bb;
        bm_prefetch_ahead(blk, 8 * bb);
        __m256i h[2][BM_MT_MAX]; /* blocks 0-3 and 4-7: lane k of s below = block k's exact sum */
        for (int g = 0; g < 2; g++) {
            __m256i wv[4];
            for (int k = 0; k < 4; k++) wv[k] = q41_levels(five, blk + (size_t)(4 * g + k) * bb);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const int8_t *p = xq + (size_t)t * n + (b + 4 * (size_t)g) * BMOE_Q8_0_BLOCK;
                __m256i v[4];
                for (int k = 0; k < 4; k++)
                    v[k] = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(wv[k], _mm256_loadu_si256((const __m256i *)(p + k * BMOE_Q8_0_BLOCK))), ones);
                h[g][t] = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
            }
        }
        const __m256 dw = scales8_stride(blk, bb), mw = scales8_stride(blk + 2, bb);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(h[0][t], h[1][t], 0x20),
                                         _mm256_permute2x128_si256(h[0][t], h[1][t], 0x31));
            __m256 dd = _mm256_mul_ps(dw, _mm256_loadu_ps(xd + (size_t)t * nb + b));
            __m256 c = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), dd),
                                     _mm256_mul_ps(mw, _mm256_loadu_ps(xs + (size_t)t * nb + b)));
            acc[t] = _mm256_add_ps(acc[t], c);
        }
    }
    for (int t = 0; t < NT; t++) {
        float l[8];
        _mm256_storeu_ps(l, acc[t]);
        bm_q41_blocks(l, five, w, xq + (size_t)t * n, xd + (size_t)t * nb, xs + (size_t)t * nb, b, nb);
        out[t] = bm_simd_sum8(l);
    }
}

AVX2_FN static void dot_q41_mt_avx2(int five, const uint8_t *w, const bm_act *a, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: q41_mt(five, w, a->q, a->d, a->s, n, 4, out); break;
    case 3: q41_mt(five, w, a->q, a->d, a->s, n, 3, out); break;
    case 2: q41_mt(five, w, a->q, a->d, a->s, n, 2, out); break;
    default: q41_mt(five, w, a->q, a->d, a->s, n, 1, out);
    }
}

AVX2_FN static float dot_q41_avx2(int five, const uint8_t *w, const bm_act *a, size_t n) {
    float o;
    q41_mt(five, w, a->q, a->d, a->s, n, 1, &o);
    return o;
}

/* ---- IQ4_NL / MXFP4 against Q8_0 blocks (kernels.h): the levels looked up 16 at a time (pshufb on the
 * table in both 128-bit halves), then the Q8_0 block sums (|level| <= 127, so |w| times x * sign(w)
 * pairs stay within int16) and float steps. */

/* Block blk's 32 levels: indices of values 0-15 in the low nibbles, 16-31 in the high ones. */
AVX2_FN static inline __m256i nl4_levels(__m256i table, int mx, const uint8_t *blk) {
    __m128i t = _mm_loadu_si128((const __m128i *)bm_nl4_qs(mx, blk));
    __m256i idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0xF));
    return _mm256_shuffle_epi8(table, idx);
}

/* The eight scales of blocks blk, blk + bb, ... as floats (exact). */
AVX2_FN static inline __m256 nl4_scales8(int mx, const uint8_t *blk, size_t bb) {
    if (!mx) return scales8_stride(blk, bb);
    float s[8];
    for (int k = 0; k < 8; k++) s[k] = bm_e8m0_half(blk[(size_t)k * bb]);
    return _mm256_loadu_ps(s);
}

AVX2_MT_FN void nl4_mt(int mx, const uint8_t *w, const int8_t *xq, const float *xd, size_t n, const int NT, float *out) {
    const size_t nb = n / BMOE_Q8_0_BLOCK, bb = bm_nl4_bytes(mx);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bm_nl4_table(mx)));
    size_t b = 0;
    __m256 acc[BM_MT_MAX];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *blk = w + b * bb;
        bm_prefetch_ahead(blk, 8 * bb);
        __m256i h[2][BM_MT_MAX]; /* blocks 0-3 and 4-7: lane k of s below = block k's exact sum */
        for (int g = 0; g < 2; g++) {
            __m256i wv[4], aw[4];
            for (int k = 0; k < 4; k++) {
                wv[k] = nl4_levels(table, mx, blk + (size_t)(4 * g + k) * bb);
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
        __m256 dw = nl4_scales8(mx, blk, bb);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(h[0][t], h[1][t], 0x20),
                                         _mm256_permute2x128_si256(h[0][t], h[1][t], 0x31));
            __m256 dd = _mm256_mul_ps(dw, _mm256_loadu_ps(xd + (size_t)t * nb + b));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(s), dd));
        }
    }
    for (int t = 0; t < NT; t++) {
        float l[8];
        _mm256_storeu_ps(l, acc[t]);
        bm_nl4_blocks(l, mx, w, xq + (size_t)t * n, xd + (size_t)t * nb, b, nb);
        out[t] = bm_simd_sum8(l);
    }
}

AVX2_FN static void dot_nl4_mt_avx2(int mx, const uint8_t *w, const bm_act *a, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: nl4_mt(mx, w, a->q, a->d, n, 4, out); break;
    case 3: nl4_mt(mx, w, a->q, a->d, n, 3, out); break;
    case 2: nl4_mt(mx, w, a->q, a->d, n, 2, out); break;
    default: nl4_mt(mx, w, a->q, a->d, n, 1, out);
    }
}

AVX2_FN static float dot_nl4_avx2(int mx, const uint8_t *w, const bm_act *a, size_t n) {
    float o;
    nl4_mt(mx, w, a->q, a->d, n, 1, &o);
    return o;
}

/* ---- K-quants against Q8_K super-blocks (kernels.h): the exact integer sums with maddubs (unsigned
 * levels times signed activations, pairs within int16) and madd (times the sub-block's scale, into
 * int32); the float steps are the shared bm_k4_value / bm_k6_value. A super-block's weights are
 * unpacked once for all NT tokens. */

/* The sums of a's and of b's eight int32 lanes (exact, any order): is and im at once. */
AVX2_FN static inline void hsum2_i32(__m256i a, __m256i b, int32_t *sa, int32_t *sb) {
    __m256i h = _mm256_hadd_epi32(a, b); /* per half: a01 a23 b01 b23 */
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_hadd_epi32(s, s); /* a, b, a, b */
    *sa = _mm_cvtsi128_si32(s);
    *sb = _mm_extract_epi32(s, 1);
}

/* The f16 scales at p, p + 2 as floats (exact; F16C). */
AVX2_FN static inline __m128 f16x2(const uint8_t *p) {
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                                (uint32_t)p[3] << 24)));
}

/* Bit `bit` of every byte of v, moved to bit 4 (Q5_K's fifth bit). 16-bit shifts keep each byte's
 * own bits here because the mask takes one bit per byte. */
AVX2_FN static inline __m256i bit_to_16(__m256i v, int bit) {
    __m256i b = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(bit)), _mm256_set1_epi8(1));
    return _mm256_slli_epi16(b, 4);
}

AVX2_MT_FN void k4_mt(const uint8_t *w, const int five, const bm_q8k *x, size_t n, const int NT, float *out) {
    const size_t nb = n / BM_Q8K_BLOCK, bb = five ? BMOE_Q5_K_BYTES : BMOE_Q4_K_BYTES;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    float l[BM_MT_MAX][8]; /* only NT rows zeroed: gcc clears all with rep stos, 1/5 of K-quant decode */
    for (int t = 0; t < NT; t++) memset(l[t], 0, sizeof l[t]);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bb, *qs = blk + (five ? 48 : 16);
        bm_prefetch_ahead(blk, bb);
        uint32_t sc[2], mn[2];
        bm_scales_mins_k4_words(blk + 4, sc, mn);
        /* the mins, each twice (sub-block j covers bsums 2j and 2j + 1), as 16 int16 */
        __m128i m8 = _mm_set_epi32(0, 0, (int)mn[1], (int)mn[0]);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        __m256i acc[BM_MT_MAX];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int jj = 0; jj < 4; jj++) { /* sub-blocks 2jj (low nibbles) and 2jj + 1 (high) */
            __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + 32 * jj));
            __m256i lo = _mm256_and_si256(q4, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            if (five) {
                lo = _mm256_or_si256(lo, bit_to_16(qh, 2 * jj));
                hi = _mm256_or_si256(hi, bit_to_16(qh, 2 * jj + 1));
            }
            const uint32_t sw = sc[jj / 2] >> (16 * (jj % 2));
            const __m256i s1 = _mm256_set1_epi16((short)(sw & 0xFF)), s2 = _mm256_set1_epi16((short)((sw >> 8) & 0xFF));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const int8_t *xq = x[(size_t)t * nb + b].q + 64 * jj;
                __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xq)), s1);
                __m256i p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 32))), s2);
                acc[t] = _mm256_add_epi32(acc[t], _mm256_add_epi32(p1, p2));
            }
        }
        const __m128 dd = f16x2(blk); /* d, dmin */
        const float d = _mm_cvtss_f32(dd), dmin = _mm_cvtss_f32(_mm_shuffle_ps(dd, dd, 1));
        for (int t = 0; t < NT; t++) {
            const bm_q8k *xb = x + (size_t)t * nb + b;
            __m256i mp = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), mins);
            int32_t is, im;
            hsum2_i32(acc[t], mp, &is, &im);
            l[t][b & 7] += bm_k4_value(is, im, d, dmin, xb->d);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = bm_simd_sum8(l[t]);
}

AVX2_MT_FN void k6_mt(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    const size_t nb = n / BM_Q8K_BLOCK;
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    float l[BM_MT_MAX][8]; /* only NT rows zeroed: gcc clears all with rep stos, 1/5 of K-quant decode */
    for (int t = 0; t < NT; t++) memset(l[t], 0, sizeof l[t]);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * BMOE_Q6_K_BYTES;
        bm_prefetch_ahead(blk, BMOE_Q6_K_BYTES);
        const int8_t *sc = (const int8_t *)(blk + 192);
        /* the 16 scales as int16; half h's eight in both 128-bit lanes of sch[h] */
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        const __m256i sch[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00), _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        __m256i acc[BM_MT_MAX];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) { /* 128 values each */
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) { /* values 32k .. 32k + 31: sub-blocks 2k and 2k + 1 */
                __m256i lq = (k & 1) ? ql1 : ql0;
                __m256i lo = (k >> 1) ? _mm256_and_si256(_mm256_srli_epi16(lq, 4), m4) : _mm256_and_si256(lq, m4);
                __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(BM_Q6K_SHIFT(k))), m3);
                __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4)); /* 0..63 */
                /* scale 8h + 2k in the low lane (values 0-15), 8h + 2k + 1 in the high lane: words 2k, 2k + 1 */
                const char c0 = (char)(4 * k), c1 = (char)(4 * k + 1), c2 = (char)(4 * k + 2), c3 = (char)(4 * k + 3);
                const __m256i pick = _mm256_setr_epi8(c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c2,
                                                      c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3);
                __m256i scv = _mm256_shuffle_epi8(sch[h], pick);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(x[(size_t)t * nb + b].q + 128 * h + 32 * k));
                    /* pairs of q x (q unsigned): |.| <= 2 * 63 * 127, in int16; the - 32 comes below */
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), scv));
                }
            }
        }
        const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bm_rd16(blk + 208))));
        for (int t = 0; t < NT; t++) {
            const bm_q8k *xb = x + (size_t)t * nb + b;
            /* sum_j sc_j sum_i (q_i - 32) x_i = sum_j sc_j sum_i q_i x_i - 32 sum_j sc_j bsum_j, exactly */
            __m256i sb = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), sc16);
            int32_t qx, bs;
            hsum2_i32(acc[t], sb, &qx, &bs);
            l[t][b & 7] += bm_k6_value(qx - 32 * bs, d, xb->d);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = bm_simd_sum8(l[t]);
}

/* Q2_K: levels 0..3 (unsigned, maddubs takes them as they are), sub-block scale the low nibble (madd
 * with 16 scales as int16, 8 per 128-bit half), the mins' part from the bsums. */
AVX2_MT_FN void k2_mt(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    const size_t nb = n / BM_Q8K_BLOCK;
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0xF);
    float l[BM_MT_MAX][8]; /* only NT rows zeroed: gcc clears all with rep stos, 1/5 of K-quant decode */
    for (int t = 0; t < NT; t++) memset(l[t], 0, sizeof l[t]);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * BMOE_Q2_K_BYTES;
        bm_prefetch_ahead(blk, BMOE_Q2_K_BYTES);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)blk);
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, _mm256_castsi256_si128(m4)));
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm256_castsi256_si128(m4)));
        const __m256i sch[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00), _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        __m256i acc[BM_MT_MAX];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i qs = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * h));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) { /* values 128h + 32k + l: sub-blocks 8h + 2k (l < 16) and + 1 */
                const __m256i q = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * k)), m3);
                const char c0 = (char)(4 * k), c1 = (char)(4 * k + 1), c2 = (char)(4 * k + 2), c3 = (char)(4 * k + 3);
                const __m256i pick = _mm256_setr_epi8(c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c2,
                                                      c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3);
                const __m256i scv = _mm256_shuffle_epi8(sch[h], pick);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(x[(size_t)t * nb + b].q + 128 * h + 32 * k));
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), scv));
                }
            }
        }
        const __m128 dd = f16x2(blk + 80); /* d, dmin */
        const float d = _mm_cvtss_f32(dd), dmin = _mm_cvtss_f32(_mm_shuffle_ps(dd, dd, 1));
        for (int t = 0; t < NT; t++) {
            const bm_q8k *xb = x + (size_t)t * nb + b;
            __m256i mp = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), mn16);
            int32_t is, im;
            hsum2_i32(acc[t], mp, &is, &im);
            l[t][b & 7] += bm_k4_value(is, im, d, dmin, xb->d);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = bm_simd_sum8(l[t]);
}

/* Q3_K: the unsigned levels u = the two bits | the hmask bit << 2 (0..7, q = u - 4), so
 * sum (sc - 32) sum q x = sum (sc - 32) sum u x - 4 sum (sc - 32) bsum, exactly. */
AVX2_MT_FN void k3_mt(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    const size_t nb = n / BM_Q8K_BLOCK;
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    float l[BM_MT_MAX][8]; /* only NT rows zeroed: gcc clears all with rep stos, 1/5 of K-quant decode */
    for (int t = 0; t < NT; t++) memset(l[t], 0, sizeof l[t]);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * BMOE_Q3_K_BYTES;
        bm_prefetch_ahead(blk, BMOE_Q3_K_BYTES);
        int8_t scs[16];
        bm_q3k_scales(blk + 96, scs);
        const __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scs)), _mm256_set1_epi16(32));
        const __m256i sch[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00), _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        const __m256i hm = _mm256_loadu_si256((const __m256i *)blk);
        __m256i acc[BM_MT_MAX];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i qs = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * h));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
#ifndef BMOE_FAULT_Q3_K_AVX2_HMASK_HALF
                const int hbit = 4 * h + k;
#else
                const int hbit = k; /* fault: the second 128 values take the first half's hmask bits */
#endif
                const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(hbit)), one);
                const __m256i u = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * k)), m3),
                                                  _mm256_slli_epi16(hb, 2));
                const char c0 = (char)(4 * k), c1 = (char)(4 * k + 1), c2 = (char)(4 * k + 2), c3 = (char)(4 * k + 3);
                const __m256i pick = _mm256_setr_epi8(c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c2,
                                                      c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3);
                const __m256i scv = _mm256_shuffle_epi8(sch[h], pick);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(x[(size_t)t * nb + b].q + 128 * h + 32 * k));
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), scv));
                }
            }
        }
        const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bm_rd16(blk + 108))));
        for (int t = 0; t < NT; t++) {
            const bm_q8k *xb = x + (size_t)t * nb + b;
            __m256i sb = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), sc16);
            int32_t ux, bs;
            hsum2_i32(acc[t], sb, &ux, &bs);
            l[t][b & 7] += bm_k6_value(ux - 4 * bs, d, xb->d);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = bm_simd_sum8(l[t]);
}

/* IQ4_XS: each sub-block of 32 an IQ4_NL block's levels (pshufb), |w| times x * sign(w) with maddubs,
 * then madd with its scale - 32. */
AVX2_MT_FN void xs_mt(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    const size_t nb = n / BM_Q8K_BLOCK;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)BM_KVALUES_IQ4NL));
    const __m256i m4 = _mm256_set1_epi8(0xF);
    float l[BM_MT_MAX][8]; /* only NT rows zeroed: gcc clears all with rep stos, 1/5 of K-quant decode */
    for (int t = 0; t < NT; t++) memset(l[t], 0, sizeof l[t]);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * BMOE_IQ4_XS_BYTES;
        bm_prefetch_ahead(blk, BMOE_IQ4_XS_BYTES);
        __m256i acc[BM_MT_MAX];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) {
            const __m128i t16 = _mm_loadu_si128((const __m128i *)(blk + 8 + 16 * ib));
            const __m256i wv = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t16, 4), t16), m4));
            const __m256i aw = _mm256_sign_epi8(wv, wv);
            const __m256i scv = _mm256_set1_epi16((short)(bm_iq4xs_scale(blk, ib) - 32));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[(size_t)t * nb + b].q + 32 * ib));
                acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), scv));
            }
        }
        const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bm_rd16(blk))));
        for (int t = 0; t < NT; t++) {
            int32_t is, unused;
            hsum2_i32(acc[t], _mm256_setzero_si256(), &is, &unused);
            l[t][b & 7] += bm_k6_value(is, d, x[(size_t)t * nb + b].d);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = bm_simd_sum8(l[t]);
}

AVX2_MT_FN void kq_mt(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    switch (type) {
    case GGML_TYPE_Q4_K: k4_mt(w, 0, x, n, NT, out); break;
    case GGML_TYPE_Q5_K: k4_mt(w, 1, x, n, NT, out); break;
    case GGML_TYPE_Q2_K: k2_mt(w, x, n, NT, out); break;
    case GGML_TYPE_Q3_K: k3_mt(w, x, n, NT, out); break;
    case GGML_TYPE_IQ4_XS: xs_mt(w, x, n, NT, out); break;
    default: k6_mt(w, x, n, NT, out);
    }
}

AVX2_FN static float dot_kq_avx2(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n) {
    float o;
    kq_mt(type, w, x, n, 1, &o);
    return o;
}

AVX2_FN static void dot_kq_mt_avx2(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: kq_mt(type, w, x, n, 4, out); break;
    case 3: kq_mt(type, w, x, n, 3, out); break;
    case 2: kq_mt(type, w, x, n, 2, out); break;
    default: kq_mt(type, w, x, n, 1, out);
    }
}

/* ---- BF16 (kernels.h): the weights become floats, eight at a time, exactly (bm_to_f32_bf16's values),
 * then the F32 dot product's lanes, adds and tree. */

AVX2_FN static void dq_bf16_avx2(const uint8_t *w, size_t i0, size_t cnt, float *y) {
    size_t i = 0;
    for (; i + 8 <= cnt; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + 2 * (i0 + i))));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))); /* exact */
    }
    if (i < cnt) bm_to_f32_bf16(w + 2 * (i0 + i), y + i, cnt - i);
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

AVX2_FN static float dot_bf16_avx2(const uint8_t *w, const float *x, size_t n) {
    __m256 acc = _mm256_setzero_ps();
    float y[BMOE_DQ_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += BMOE_DQ_CHUNK) {
        size_t cnt = n - i0 < BMOE_DQ_CHUNK ? n - i0 : BMOE_DQ_CHUNK;
        dq_bf16_avx2(w, i0, cnt, y);
        acc = dq_acc(acc, y, x + i0, cnt);
    }
    float l[8];
    _mm256_storeu_ps(l, acc);
    return bm_simd_sum8(l);
}

AVX2_FN static void dot_bf16_mt_avx2(const uint8_t *w, const float *x, size_t n, int nt, float *out) {
    __m256 acc[BM_MT_MAX];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    float y[BMOE_DQ_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += BMOE_DQ_CHUNK) {
        size_t cnt = n - i0 < BMOE_DQ_CHUNK ? n - i0 : BMOE_DQ_CHUNK;
        dq_bf16_avx2(w, i0, cnt, y); /* once for every token */
        for (int t = 0; t < nt; t++) acc[t] = dq_acc(acc[t], y, x + (size_t)t * n + i0, cnt);
    }
    for (int t = 0; t < nt; t++) {
        float l[8];
        _mm256_storeu_ps(l, acc[t]);
        out[t] = bm_simd_sum8(l);
    }
}

/* bm_quantize_q8_0, eight values at a time. Every step is exact or the same IEEE operation as the
 * scalar code (max of |x|, x * id, clamp, rounding to nearest even); a block with a NaN or an
 * infinity, or whose 127 / amax overflows, goes to the scalar code. */
AVX2_FN static void quantize_q8_0_avx2(const float *x, size_t n, int8_t *xq, float *xd) {
    const __m256 sign = _mm256_set1_ps(-0.0f), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
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
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        if (!(id <= 3.40282347e+38f)) { /* amax subnormal: the scalar code's NaN handling */
            bm_quantize_q8_0(v, BMOE_Q8_0_BLOCK, q, xd + b);
            continue;
        }
        xd[b] = bm_f16_to_f32(bm_f32_to_f16(d));
        __m256 idv = _mm256_set1_ps(id);
        __m256i r[4];
        for (int i = 0; i < 4; i++) {
            __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(x4[i], idv), lo), hi);
            r[i] = _mm256_cvtps_epi32(_mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        __m256i p16 = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
        /* the packs work per 128-bit half: put the 4-byte groups back in order */
        p16 = _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)q, p16);
    }
}

/* ---- the type table's AVX2 kernels (type_table.c): one token and several, per type ---- */

#define AVX2_ROW(T, ONE, MT)                                                                               \
    AVX2_FN float bm_dot_##T##_avx2(const uint8_t *w, const bm_act *a, size_t n) { return ONE; }          \
    AVX2_FN void bm_dot_mt_##T##_avx2(const uint8_t *w, const bm_act *a, size_t n, int nt, float *out) {  \
        MT;                                                                                                \
    }

AVX2_ROW(f32, dot_f32_avx2((const float *)w, a->x, n), dot_f32_mt_avx2((const float *)w, a->x, n, nt, out))
AVX2_ROW(f16, dot_f16_avx2(w, a->x, n), dot_f16_mt_avx2(w, a->x, n, nt, out))
AVX2_ROW(bf16, dot_bf16_avx2(w, a->x, n), dot_bf16_mt_avx2(w, a->x, n, nt, out))
AVX2_ROW(q8_0, dot_q8_0_avx2(w, a->q, a->d, n), dot_q8_0_mt_avx2(w, a->q, a->d, n, nt, out))
AVX2_ROW(q4_0, dot_q45_0_avx2(GGML_TYPE_Q4_0, w, a->q, a->d, n),
         dot_q45_0_mt_avx2(GGML_TYPE_Q4_0, w, a->q, a->d, n, nt, out))
AVX2_ROW(q5_0, dot_q45_0_avx2(GGML_TYPE_Q5_0, w, a->q, a->d, n),
         dot_q45_0_mt_avx2(GGML_TYPE_Q5_0, w, a->q, a->d, n, nt, out))
AVX2_ROW(q4_1, dot_q41_avx2(0, w, a, n), dot_q41_mt_avx2(0, w, a, n, nt, out))
AVX2_ROW(q5_1, dot_q41_avx2(1, w, a, n), dot_q41_mt_avx2(1, w, a, n, nt, out))
AVX2_ROW(iq4_nl, dot_nl4_avx2(0, w, a, n), dot_nl4_mt_avx2(0, w, a, n, nt, out))
AVX2_ROW(mxfp4, dot_nl4_avx2(1, w, a, n), dot_nl4_mt_avx2(1, w, a, n, nt, out))
AVX2_ROW(q4_K, dot_kq_avx2(GGML_TYPE_Q4_K, w, a->k, n), dot_kq_mt_avx2(GGML_TYPE_Q4_K, w, a->k, n, nt, out))
AVX2_ROW(q5_K, dot_kq_avx2(GGML_TYPE_Q5_K, w, a->k, n), dot_kq_mt_avx2(GGML_TYPE_Q5_K, w, a->k, n, nt, out))
AVX2_ROW(q6_K, dot_kq_avx2(GGML_TYPE_Q6_K, w, a->k, n), dot_kq_mt_avx2(GGML_TYPE_Q6_K, w, a->k, n, nt, out))
AVX2_ROW(q2_K, dot_kq_avx2(GGML_TYPE_Q2_K, w, a->k, n), dot_kq_mt_avx2(GGML_TYPE_Q2_K, w, a->k, n, nt, out))
AVX2_ROW(q3_K, dot_kq_avx2(GGML_TYPE_Q3_K, w, a->k, n), dot_kq_mt_avx2(GGML_TYPE_Q3_K, w, a->k, n, nt, out))
AVX2_ROW(iq4_xs, dot_kq_avx2(GGML_TYPE_IQ4_XS, w, a->k, n), dot_kq_mt_avx2(GGML_TYPE_IQ4_XS, w, a->k, n, nt, out))

/* Q8_1: the Q8_0 blocks, then their sums (bm_q8_1_sums) */
AVX2_FN static void quantize_q8_1_avx2(const float *x, size_t n, int8_t *xq, float *xd, float *xs) {
    quantize_q8_0_avx2(x, n, xq, xd);
    bm_q8_1_sums(x, n, xq, xd, xs);
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
    k->dot_f32 = dot_f32_avx2;
    k->quantize_q8_0 = quantize_q8_0_avx2;
    k->quantize_q8_1 = quantize_q8_1_avx2;
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
