/* x86_64 AVX-512 VNNI: prefill tiles of 8 weight rows x up to BM_TILE_T tokens, with the scalar path's
 * bits, for the types whose blocks are 32 signed 8-bit levels against Q8_0 activation blocks (Q8_0, Q4_0,
 * Q5_0, IQ4_NL, MXFP4) and for Q4_K, Q5_K, Q6_K and IQ4_XS against Q8_K super-blocks. A block's weights are unpacked once for all the tokens.
 *
 * The AVX2 kernels spend most of a block on turning its 32 products into one integer sum (horizontal
 * adds across lanes). Here the lanes are the 8 rows instead: for one block b, register W_j holds bytes
 * 4j .. 4j+3 of each row's block (an 8 x 8 transpose of dwords, done once per block for all tokens),
 * and one token's dword j of block b is broadcast to every lane, so eight vpdpbusd leave row r's whole
 * block sum in lane r with no horizontal step. vpdpbusd multiplies unsigned by signed bytes: the
 * activation goes in as x + 128 (a sign flip of its top bit) and 128 times the row's level sum (one more
 * vpdpbusd per block, shared by every token) is taken off again. Every step is exact integer arithmetic
 * (|sum| < 2^21), so s_b is the scalar path's integer.
 *
 * The float steps are the scalar path's, lane-wise over rows: (float)s_b * (d_w * d_x) onto the
 * accumulator of lane class b mod 8 (one register per class, its lanes the rows), in increasing b;
 * at the end row r's eight classes are the scalar path's l[0..7] and go through the same tree. Multiply
 * and add stay separate (no FMA; -ffp-contract=off). The one-token kernels are AVX2's. */
#include "kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

#include "gguf.h"
#include "kernels_lanes.h"

#define VNNI_FN __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define BM_X86_FN VNNI_FN
#include "kernels_x86.h"
#define BM_VEXP_FN VNNI_FN
#include "kernels_vexp.h"

/* Blocks whose biased activations (x + 128) are staged at once per token: 8 x 32 bytes each. */
#define TILE_CHUNK 8

/* Block blk's 32 signed levels in one register (Q8_0 as stored, Q4_0 / Q5_0 unpacked, IQ4_NL / MXFP4
 * looked up in their table: 4-bit indices, values 0-15 in the low nibbles, 16-31 in the high ones). */
VNNI_FN static inline __m256i levels32(uint32_t type, const uint8_t *blk) {
    if (type == GGML_TYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    if (type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_MXFP4) {
        const int mx = type == GGML_TYPE_MXFP4;
        const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bm_nl4_table(mx)));
        __m128i t = _mm_loadu_si128((const __m128i *)bm_nl4_qs(mx, blk));
        return _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0xF)));
    }
    return bm_x86_q45_0_levels(type, blk);
}

/* Bytes per block of the types blk32_tile takes. */
static inline size_t blk32_bytes(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q8_0: return BMOE_Q8_0_BYTES;
    case GGML_TYPE_IQ4_NL: return BMOE_IQ4_NL_BYTES;
    case GGML_TYPE_MXFP4: return BMOE_MXFP4_BYTES;
    default: return bm_q45_0_bytes(type);
    }
}

/* The 8 x 8 transpose of dwords: out[j] lane r = dword j of in[r]. */
VNNI_FN static inline void transpose8(const __m256i in[8], __m256i out[8]) {
    __m256i t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* rows 4h .. 4h + 3 */
        __m256i *a = t + 4 * h, *o = u + 4 * h;
        o[0] = _mm256_unpacklo_epi64(a[0], a[2]);
        o[1] = _mm256_unpackhi_epi64(a[0], a[2]);
        o[2] = _mm256_unpacklo_epi64(a[1], a[3]);
        o[3] = _mm256_unpackhi_epi64(a[1], a[3]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        out[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
        out[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
    }
}

#define VNNI_INLINE VNNI_FN __attribute__((always_inline)) static inline

/* One block b of the tile for NT tokens: wt its transposed levels, corr 128 times each row's level sum,
 * dw the rows' scales; xb token 0's biased activations of the block (token t's xs_stride bytes on), xd
 * token 0's scale of the block (token t's nb on). Two chains of vpdpbusd per token (dwords j even and
 * odd, added at the end: exact), the tokens' chains interleaved so that none waits on its latency. */
VNNI_INLINE void tile_block(const __m256i wt[8], __m256i corr, __m256 dw, const uint8_t *xb, size_t xs_stride,
                            const float *xd, size_t nb, const int NT, __m256 acc[][8], int cls) {
    __m256i s0[8], s1[8];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) s0[t] = s1[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 8; j += 2) {
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            int32_t q0, q1;
            memcpy(&q0, xb + (size_t)t * xs_stride + 4 * j, 4);
            memcpy(&q1, xb + (size_t)t * xs_stride + 4 * j + 4, 4);
            s0[t] = _mm256_dpbusd_epi32(s0[t], _mm256_set1_epi32(q0), wt[j]);
            s1[t] = _mm256_dpbusd_epi32(s1[t], _mm256_set1_epi32(q1), wt[j + 1]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        __m256i s = _mm256_sub_epi32(_mm256_add_epi32(s0[t], s1[t]), corr); /* lane r: row r's exact block sum */
        const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(xd[(size_t)t * nb]));
        acc[t][cls] = _mm256_add_ps(acc[t][cls], _mm256_mul_ps(_mm256_cvtepi32_ps(s), dd));
    }
}

/* tile_block for g (1 .. 8) tokens, g a constant in each case */
VNNI_INLINE void tile_block_g(const __m256i wt[8], __m256i corr, __m256 dw, const uint8_t *xb, size_t xs_stride,
                              const float *xd, size_t nb, int g, __m256 acc[][8], int cls) {
    switch (g) {
    case 8: tile_block(wt, corr, dw, xb, xs_stride, xd, nb, 8, acc, cls); break;
    case 7: tile_block(wt, corr, dw, xb, xs_stride, xd, nb, 7, acc, cls); break;
    case 6: tile_block(wt, corr, dw, xb, xs_stride, xd, nb, 6, acc, cls); break;
    case 5: tile_block(wt, corr, dw, xb, xs_stride, xd, nb, 5, acc, cls); break;
    case 4: tile_block(wt, corr, dw, xb, xs_stride, xd, nb, 4, acc, cls); break;
    case 3: tile_block(wt, corr, dw, xb, xs_stride, xd, nb, 3, acc, cls); break;
    case 2: tile_block(wt, corr, dw, xb, xs_stride, xd, nb, 2, acc, cls); break;
    default: tile_block(wt, corr, dw, xb, xs_stride, xd, nb, 1, acc, cls);
    }
}

/* The lane classes of nt tokens (acc[t][c], lanes the rows) through bm_simd_sum8's tree, lane-wise over
 * the rows (the same adds in the same order for each row; its fault too). */
VNNI_INLINE void tile_finish(__m256 acc[][8], int nr, int nt, float *out) {
    for (int t = 0; t < nt; t++) {
        const __m256 *l = acc[t];
#ifdef BMOE_FAULT_SIMD_LANE_ORDER
        __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
                                   _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])));
#else
        __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[0], l[1]), _mm256_add_ps(l[2], l[3])),
                                   _mm256_add_ps(_mm256_add_ps(l[4], l[5]), _mm256_add_ps(l[6], l[7])));
#endif
        float v[8];
        _mm256_storeu_ps(v, sum);
        for (int r = 0; r < nr; r++) out[r * BM_TILE_T + t] = v[r];
    }
}

/* A block's weights are unpacked and transposed once for all nt tokens; the tokens then go through
 * tile_block eight at a time. */
VNNI_FN static void blk32_tile(uint32_t type, const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n,
                               int nt, float *out) {
    const size_t nb = n / BMOE_Q8_0_BLOCK, bb = blk32_bytes(type);
    const uint8_t *rows[BM_TILE_R];
    for (int r = 0; r < BM_TILE_R; r++) rows[r] = w + (size_t)(r < nr ? r : 0) * row_bytes; /* spare lanes: row 0 */
    const __m256i ones = _mm256_set1_epi8(1), bias = _mm256_set1_epi8((char)0x80);
    __m256 acc[BM_TILE_T][8];
    for (int t = 0; t < nt; t++)
        for (int c = 0; c < 8; c++) acc[t][c] = _mm256_setzero_ps();
    _Alignas(32) uint8_t xs[BM_TILE_T][TILE_CHUNK * BMOE_Q8_0_BLOCK];
    for (size_t c0 = 0; c0 < nb; c0 += TILE_CHUNK) {
        const size_t c1 = nb - c0 < TILE_CHUNK ? nb : c0 + TILE_CHUNK;
        for (int t = 0; t < nt; t++) {
            const int8_t *xq = a->q + (size_t)t * n + c0 * BMOE_Q8_0_BLOCK;
            for (size_t i = 0; i < (c1 - c0) * BMOE_Q8_0_BLOCK; i += 32)
                _mm256_store_si256((__m256i *)(xs[t] + i),
                                   _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xq + i)), bias));
        }
        for (size_t b = c0; b < c1; b++) {
            __m256i lv[BM_TILE_R], wt[8];
            uint16_t sc[BM_TILE_R];
            float scf[BM_TILE_R]; /* MXFP4: 2^(e - 128), exact */
#pragma GCC unroll 8
            for (int r = 0; r < BM_TILE_R; r++) {
                const uint8_t *blk = rows[r] + b * bb;
                lv[r] = levels32(type, blk);
#ifdef BMOE_FAULT_Q8_0_FIRST_SCALE
                /* fault: every Q8_0 block uses the row's first scale */
                sc[r] = bm_rd16(type == GGML_TYPE_Q8_0 ? rows[r] : blk);
#else
                sc[r] = bm_rd16(blk);
#endif
                if (type == GGML_TYPE_MXFP4) scf[r] = bm_e8m0_half(blk[0]);
            }
            transpose8(lv, wt);
            /* lane r: the sum of row r's 32 levels (two chains, added: exact) */
            __m256i ls0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, wt[0]);
            __m256i ls1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, wt[1]);
#pragma GCC unroll 4
            for (int j = 2; j < 8; j += 2) {
                ls0 = _mm256_dpbusd_epi32(ls0, ones, wt[j]);
                ls1 = _mm256_dpbusd_epi32(ls1, ones, wt[j + 1]);
            }
            const __m256i corr = _mm256_slli_epi32(_mm256_add_epi32(ls0, ls1), 7);
            const __m256 dw = type == GGML_TYPE_MXFP4 ? _mm256_loadu_ps(scf)
                                                      : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc)); /* exact */
            for (int t0 = 0; t0 < nt; t0 += 8)
#ifndef BMOE_FAULT_MT_Q45_0_TOKEN_SCALES
                tile_block_g(wt, corr, dw, xs[t0] + (b - c0) * BMOE_Q8_0_BLOCK, sizeof xs[0], a->d + (size_t)t0 * nb + b,
                             nb, nt - t0 < 8 ? nt - t0 : 8, acc + t0, (int)(b & 7));
#else /* fault: Q4_0/Q5_0 tokens all take the first token's activation scales (a stride of 0) */
                tile_block_g(wt, corr, dw, xs[t0] + (b - c0) * BMOE_Q8_0_BLOCK, sizeof xs[0],
                             a->d + (type == GGML_TYPE_Q8_0 ? (size_t)t0 * nb : 0) + b, type == GGML_TYPE_Q8_0 ? nb : 0,
                             nt - t0 < 8 ? nt - t0 : 8, acc + t0, (int)(b & 7));
#endif
        }
    }
    tile_finish(acc, nr, nt, out);
}






/* ---- Q4_K and Q5_K against Q8_K super-blocks: the same rows-in-lanes scheme per sub-block of 32. The
 * 4-bit levels (Q5_K: 5-bit, the fifth from qh) are unsigned, so vpdpbusd takes them as they are against the signed activations (no bias).
 * Per super-block b, row r and token t (kernels.h): is = sum_j sc_j * S_j with S_j the sub-block's
 * exact sum (vpmulld of the rows' scales, exact: |is| < 2^25), im = sum_j m_j * (bsum 2j + bsum 2j+1)
 * (vpmaddwd of the rows' mins in pairs against the token's pair of sums, exact), then bm_k4_value's
 * float steps lane-wise: (float)is * (d * d_x) - (float)im * (dmin * d_x) onto lane class b mod 8. */

VNNI_INLINE void k4_tile(const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n, int NT, const int five,
                         float *out) {
    const size_t nb = n / BM_Q8K_BLOCK, bb = five ? BMOE_Q5_K_BYTES : BMOE_Q4_K_BYTES;
    const uint8_t *rows[BM_TILE_R];
    for (int r = 0; r < BM_TILE_R; r++) rows[r] = w + (size_t)(r < nr ? r : 0) * row_bytes; /* spare lanes: row 0 */
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc[BM_TILE_T][8];
    for (int t = 0; t < NT; t++)
        for (int c = 0; c < 8; c++) acc[t][c] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        _Alignas(32) int32_t scv[8][BM_TILE_R], mpv[4][BM_TILE_R];
        uint16_t dv[BM_TILE_R], dmv[BM_TILE_R];
        __m256i wt[8][8]; /* [sub-block][dword]: lane r = row r's four levels */
        for (int jj = 0; jj < 4; jj++) { /* sub-blocks 2jj (low nibbles) and 2jj + 1 (high) */
            __m256i lo[BM_TILE_R], hi[BM_TILE_R];
#pragma GCC unroll 8
            for (int r = 0; r < BM_TILE_R; r++) {
                const uint8_t *blk = rows[r] + b * bb;
                __m256i q = _mm256_loadu_si256((const __m256i *)(blk + (five ? 48 : 16) + 32 * jj));
                lo[r] = _mm256_and_si256(q, m4);
                hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (five) { /* Q5_K: value i's fifth bit is bit 2jj (low) or 2jj + 1 (high) of qh byte i */
                    const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16)), one = _mm256_set1_epi8(1);
                    lo[r] = _mm256_or_si256(lo[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * jj), one), 4));
                    hi[r] = _mm256_or_si256(hi[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * jj + 1), one), 4));
                }
            }
            transpose8(lo, wt[2 * jj]);
            transpose8(hi, wt[2 * jj + 1]);
        }
        for (int r = 0; r < BM_TILE_R; r++) {
            const uint8_t *blk = rows[r] + b * bb;
            uint8_t sc[8], m[8];
            bm_scales_mins_k4(blk + 4, sc, m);
            for (int j = 0; j < 8; j++) scv[j][r] = sc[j];
            for (int i = 0; i < 4; i++) mpv[i][r] = (int32_t)((uint32_t)m[2 * i] | (uint32_t)m[2 * i + 1] << 16);
            dv[r] = bm_rd16(blk);
            dmv[r] = bm_rd16(blk + 2);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dv)); /* exact */
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dmv));
#pragma GCC unroll 1
        for (int t = 0; t < NT; t++) {
            const bm_q8k *xb = a->k + (size_t)t * nb + b;
            __m256i is = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int k = 0; k < 8; k += 2) {
                    int32_t q0, q1;
                    memcpy(&q0, xb->q + 32 * j + 4 * k, 4);
                    memcpy(&q1, xb->q + 32 * j + 4 * k + 4, 4);
                    s0 = _mm256_dpbusd_epi32(s0, wt[j][k], _mm256_set1_epi32(q0));
                    s1 = _mm256_dpbusd_epi32(s1, wt[j][k + 1], _mm256_set1_epi32(q1));
                }
                is = _mm256_add_epi32(is, _mm256_mullo_epi32(_mm256_add_epi32(s0, s1),
                                                             _mm256_load_si256((const __m256i *)scv[j])));
            }
            __m256i im = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int32_t x0 = (int32_t)xb->bsums[4 * i] + xb->bsums[4 * i + 1];
                const int32_t x1 = (int32_t)xb->bsums[4 * i + 2] + xb->bsums[4 * i + 3];
                const __m256i xp = _mm256_set1_epi32((int32_t)(((uint32_t)x0 & 0xFFFFu) | ((uint32_t)x1 << 16)));
                im = _mm256_add_epi32(im, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)mpv[i]), xp));
            }
            const __m256 dx = _mm256_set1_ps(xb->d);
            const __m256 c = _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, dx)),
                                           _mm256_mul_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(dmin, dx)));
            acc[t][b & 7] = _mm256_add_ps(acc[t][b & 7], c);
        }
    }
    tile_finish(acc, nr, NT, out);
}



/* ---- Q6_K against Q8_K super-blocks: the 6-bit levels go in unsigned (0..63) against the signed
 * activations; per sub-block j of 16, sum_i (q_i - 32) x_i = S_j - 32 * bsum_j, so
 * is = sum_j sc_j * S_j - 32 * sum_j sc_j * bsum_j (vpmulld, and vpmaddwd of the rows' scales in pairs
 * against the token's pairs of bsums: exact, |is| < 2^29), then bm_k6_value's float steps lane-wise:
 * (float)is * (d * d_x) onto lane class b mod 8. */

VNNI_FN static void k6_tile(const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n, int NT,
                            float *out) {
    const size_t nb = n / BM_Q8K_BLOCK;
    const uint8_t *rows[BM_TILE_R];
    for (int r = 0; r < BM_TILE_R; r++) rows[r] = w + (size_t)(r < nr ? r : 0) * row_bytes; /* spare lanes: row 0 */
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    __m256 acc[BM_TILE_T][8];
    for (int t = 0; t < NT; t++)
        for (int c = 0; c < 8; c++) acc[t][c] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        _Alignas(32) int32_t scv[16][BM_TILE_R], spv[8][BM_TILE_R];
        uint16_t dv[BM_TILE_R];
        __m256i wt[8][8]; /* [value group 4h + k of 32][dword]: lane r = row r's four levels */
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) {
                __m256i q[BM_TILE_R];
#pragma GCC unroll 8
                for (int r = 0; r < BM_TILE_R; r++) {
                    const uint8_t *blk = rows[r] + b * BMOE_Q6_K_BYTES;
                    __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (k & 1)));
                    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                    __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (k >> 1)), m4);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, BM_Q6K_SHIFT(k)), m3);
                    q[r] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                }
                transpose8(q, wt[4 * h + k]);
            }
        for (int r = 0; r < BM_TILE_R; r++) {
            const uint8_t *blk = rows[r] + b * BMOE_Q6_K_BYTES;
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int j = 0; j < 16; j++) scv[j][r] = sc[j];
            for (int i = 0; i < 8; i++)
                spv[i][r] = (int32_t)(((uint32_t)(uint16_t)(int16_t)sc[2 * i]) | ((uint32_t)(uint16_t)(int16_t)sc[2 * i + 1] << 16));
            dv[r] = bm_rd16(blk + 208);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dv)); /* exact */
#pragma GCC unroll 1
        for (int t = 0; t < NT; t++) {
            const bm_q8k *xb = a->k + (size_t)t * nb + b;
            __m256i is = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) { /* values 32g .. 32g + 31: sub-blocks 2g and 2g + 1 */
                __m256i s[2];
#pragma GCC unroll 2
                for (int u = 0; u < 2; u++) {
                    int32_t q0, q1, q2, q3;
                    const int8_t *xq = xb->q + 32 * g + 16 * u;
                    memcpy(&q0, xq, 4);
                    memcpy(&q1, xq + 4, 4);
                    memcpy(&q2, xq + 8, 4);
                    memcpy(&q3, xq + 12, 4);
                    __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wt[g][4 * u], _mm256_set1_epi32(q0));
                    __m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wt[g][4 * u + 1], _mm256_set1_epi32(q1));
                    s0 = _mm256_dpbusd_epi32(s0, wt[g][4 * u + 2], _mm256_set1_epi32(q2));
                    s1 = _mm256_dpbusd_epi32(s1, wt[g][4 * u + 3], _mm256_set1_epi32(q3));
                    s[u] = _mm256_mullo_epi32(_mm256_add_epi32(s0, s1), _mm256_load_si256((const __m256i *)scv[2 * g + u]));
                }
                is = _mm256_add_epi32(is, _mm256_add_epi32(s[0], s[1]));
            }
            __m256i ib = _mm256_setzero_si256(); /* sum_j sc_j * bsum_j */
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m256i xp = _mm256_set1_epi32(
                    (int32_t)(((uint32_t)(uint16_t)xb->bsums[2 * i]) | ((uint32_t)(uint16_t)xb->bsums[2 * i + 1] << 16)));
                ib = _mm256_add_epi32(ib, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)spv[i]), xp));
            }
            is = _mm256_sub_epi32(is, _mm256_slli_epi32(ib, 5));
            const __m256 c = _mm256_mul_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, _mm256_set1_ps(xb->d)));
            acc[t][b & 7] = _mm256_add_ps(acc[t][b & 7], c);
        }
    }
    tile_finish(acc, nr, NT, out);
}


/* ---- IQ4_XS against Q8_K super-blocks: per sub-block j of 32 the Q8_0 tiles' scheme (the signed table
 * levels transposed, each token's activations biased by 128, 128 times the row's level sum of the
 * sub-block taken off), so lane r holds row r's exact S_j = sum_i kv_i x_i; is = sum_j (ls_j - 32) S_j
 * (vpmulld, exact: |is| < 2^28), then bm_k6_value's float steps lane-wise: (float)is * (d * d_x) onto
 * lane class b mod 8. */

VNNI_FN static void xs_tile(const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n, int NT, float *out) {
    const size_t nb = n / BM_Q8K_BLOCK;
    const uint8_t *rows[BM_TILE_R];
    for (int r = 0; r < BM_TILE_R; r++) rows[r] = w + (size_t)(r < nr ? r : 0) * row_bytes; /* spare lanes: row 0 */
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)BM_KVALUES_IQ4NL));
    const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi8(1), bias = _mm256_set1_epi8((char)0x80);
    __m256 acc[BM_TILE_T][8];
    for (int t = 0; t < NT; t++)
        for (int c = 0; c < 8; c++) acc[t][c] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        _Alignas(32) int32_t scv[8][BM_TILE_R];
        uint16_t dv[BM_TILE_R];
        __m256i wt[8][8], corr[8]; /* [sub-block][dword]: lane r = row r's four levels; 128 x level sums */
        for (int j = 0; j < 8; j++) {
            __m256i lv[BM_TILE_R];
#pragma GCC unroll 8
            for (int r = 0; r < BM_TILE_R; r++) {
                const __m128i q = _mm_loadu_si128((const __m128i *)(rows[r] + b * BMOE_IQ4_XS_BYTES + 8 + 16 * j));
                lv[r] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4));
            }
            transpose8(lv, wt[j]);
            __m256i ls = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) ls = _mm256_dpbusd_epi32(ls, ones, wt[j][k]);
            corr[j] = _mm256_slli_epi32(ls, 7);
        }
        for (int r = 0; r < BM_TILE_R; r++) {
            const uint8_t *blk = rows[r] + b * BMOE_IQ4_XS_BYTES;
            for (int j = 0; j < 8; j++) scv[j][r] = (int32_t)bm_iq4xs_scale(blk, j) - 32;
            dv[r] = bm_rd16(blk);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dv)); /* exact */
#pragma GCC unroll 1
        for (int t = 0; t < NT; t++) {
            const bm_q8k *xb = a->k + (size_t)t * nb + b;
            __m256i is = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                _Alignas(32) uint8_t xs[32]; /* the sub-block's activations + 128 */
                _mm256_store_si256((__m256i *)xs, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xb->q + 32 * j)), bias));
                __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int k = 0; k < 8; k += 2) {
                    int32_t q0, q1;
                    memcpy(&q0, xs + 4 * k, 4);
                    memcpy(&q1, xs + 4 * k + 4, 4);
                    s0 = _mm256_dpbusd_epi32(s0, _mm256_set1_epi32(q0), wt[j][k]);
                    s1 = _mm256_dpbusd_epi32(s1, _mm256_set1_epi32(q1), wt[j][k + 1]);
                }
                const __m256i sj = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), corr[j]); /* lane r: row r's S_j */
                is = _mm256_add_epi32(is, _mm256_mullo_epi32(sj, _mm256_load_si256((const __m256i *)scv[j])));
            }
            const __m256 c = _mm256_mul_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, _mm256_set1_ps(xb->d)));
            acc[t][b & 7] = _mm256_add_ps(acc[t][b & 7], c);
        }
    }
    tile_finish(acc, nr, NT, out);
}

/* ---- The exponentials eight lanes at a time: bm_vexp's double operations (kernels_vexp.h), in the
 * same order, on 512-bit registers, so each lane has bm_exp's bits. A group of eight with a lane
 * outside [-BM_VEXP_LIMIT, BM_VEXP_LIMIT] (or NaN) goes through the scalar loop; a tail of fewer
 * than eight through AVX2's four-lane functions. */

VNNI_FN static inline __m512d vexp8(__m512d x) {
    static const double INV_FACT[BM_EXP_DEGREE + 1] = BM_EXP_INV_FACT;
    const __m512d t = _mm512_mul_pd(x, _mm512_set1_pd(BM_EXP_INV_LN2));
    /* (int)(t < 0 ? t - 0.5 : t + 0.5), truncating */
    const __mmask8 neg = _mm512_cmp_pd_mask(t, _mm512_setzero_pd(), _CMP_LT_OQ);
    const __m256i n = _mm512_cvttpd_epi32(_mm512_add_pd(t, _mm512_mask_blend_pd(neg, _mm512_set1_pd(0.5), _mm512_set1_pd(-0.5))));
    const __m512d nd = _mm512_cvtepi32_pd(n);
    const __m512d r = _mm512_sub_pd(_mm512_sub_pd(x, _mm512_mul_pd(nd, _mm512_set1_pd(BM_EXP_LN2_HI))),
                                    _mm512_mul_pd(nd, _mm512_set1_pd(BM_EXP_LN2_LO)));
    __m512d p = _mm512_set1_pd(INV_FACT[BM_EXP_DEGREE]);
    for (int k = BM_EXP_DEGREE - 1; k >= 0; k--) p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(INV_FACT[k]));
    const __m512i bits = _mm512_slli_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(n), _mm512_set1_epi64(1023)), 52);
    return _mm512_mul_pd(p, _mm512_castsi512_pd(bits)); /* times 2^n */
}

VNNI_FN static inline int vexp8_in_range(__m512d x) {
    return (_mm512_cmp_pd_mask(x, _mm512_set1_pd(-BM_VEXP_LIMIT), _CMP_GE_OQ) &
            _mm512_cmp_pd_mask(x, _mm512_set1_pd(BM_VEXP_LIMIT), _CMP_LE_OQ)) == 0xFF;
}

/* v[i] = (float)bm_exp((double)v[i] - (double)mx) */
VNNI_FN static void vexp_shift_avx512(float *v, size_t n, float mx) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m512d x = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(v + i)), _mm512_set1_pd((double)mx));
        if (vexp8_in_range(x)) _mm256_storeu_ps(v + i, _mm512_cvtpd_ps(vexp8(x)));
        else bm_exp_shift_scalar(v + i, 8, mx);
    }
    bm_vexp_shift(v + i, n - i, mx);
}

/* out[i] = bm_silu(g[i]) * u[i] (out may be u): (float)(z / (1 + exp(-z))) * u */
VNNI_FN static void vsilu_mul_avx512(const float *g, const float *u, size_t n, float *out) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m512d z = _mm512_cvtps_pd(_mm256_loadu_ps(g + i));
        if (vexp8_in_range(z)) {
            const __m512d e = vexp8(_mm512_castsi512_pd(_mm512_xor_si512(_mm512_castpd_si512(z), _mm512_set1_epi64(INT64_MIN)))); /* -z */
            const __m256 s = _mm512_cvtpd_ps(_mm512_div_pd(z, _mm512_add_pd(_mm512_set1_pd(1.0), e)));
            _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
        } else {
            bm_silu_mul_scalar(g + i, u + i, 8, out + i);
        }
    }
    bm_vsilu_mul(g + i, u + i, n - i, out + i);
}

/* The type table's tiles of this path (kernels.h, dot_tile), one wrapper per type. */
#define VNNI_TILE(T, CALL)                                                                                 \
    VNNI_FN static void dot_tile_##T(const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n, int nt, \
                                     float *out) {                                                         \
        CALL;                                                                                              \
    }
VNNI_TILE(q8_0, blk32_tile(GGML_TYPE_Q8_0, w, row_bytes, nr, a, n, nt, out))
VNNI_TILE(q4_0, blk32_tile(GGML_TYPE_Q4_0, w, row_bytes, nr, a, n, nt, out))
VNNI_TILE(iq4_nl, blk32_tile(GGML_TYPE_IQ4_NL, w, row_bytes, nr, a, n, nt, out))
VNNI_TILE(mxfp4, blk32_tile(GGML_TYPE_MXFP4, w, row_bytes, nr, a, n, nt, out))
VNNI_TILE(q5_0, blk32_tile(GGML_TYPE_Q5_0, w, row_bytes, nr, a, n, nt, out))
VNNI_TILE(q4_K, k4_tile(w, row_bytes, nr, a, n, nt, 0, out))
VNNI_TILE(q5_K, k4_tile(w, row_bytes, nr, a, n, nt, 1, out))
VNNI_TILE(q6_K, k6_tile(w, row_bytes, nr, a, n, nt, out))
VNNI_TILE(iq4_xs, xs_tile(w, row_bytes, nr, a, n, nt, out))

/* AVX-512 F, BW, VL and VNNI, and an OS that saves the opmask and zmm state. */
static int cpu_has_avx512_vnni(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7 || !__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xE6u) != 0xE6u) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return ((b >> 16) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1) && ((c >> 11) & 1);
}

int bm_kernels_avx512(bm_kernels *k) {
    if (!cpu_has_avx512_vnni() || !bm_kernels_avx2(k)) return 0;
    k->exp_shift = vexp_shift_avx512;
    k->silu_mul = vsilu_mul_avx512;
    k->dot_tile[GGML_TYPE_Q8_0] = dot_tile_q8_0;
    k->dot_tile[GGML_TYPE_Q4_0] = dot_tile_q4_0;
    k->dot_tile[GGML_TYPE_Q5_0] = dot_tile_q5_0;
    k->dot_tile[GGML_TYPE_IQ4_NL] = dot_tile_iq4_nl;
    k->dot_tile[GGML_TYPE_MXFP4] = dot_tile_mxfp4;
    k->dot_tile[GGML_TYPE_Q4_K] = dot_tile_q4_K;
    k->dot_tile[GGML_TYPE_Q5_K] = dot_tile_q5_K;
    k->dot_tile[GGML_TYPE_Q6_K] = dot_tile_q6_K;
    k->dot_tile[GGML_TYPE_IQ4_XS] = dot_tile_iq4_xs;
    return 1;
}

#else

int bm_kernels_avx512(bm_kernels *k) {
    (void)k;
    return 0;
}

#endif
