/* x86_64 AVX-512 VNNI: prefill tiles of 8 weight rows x up to 8 tokens for the types whose blocks are 32
 * signed 8-bit levels against Q8_0 activation blocks (Q8_0, Q4_0, Q5_0), with the scalar path's bits.
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

/* Blocks whose biased activations (x + 128) are staged at once per token: 64 x 32 bytes each. */
#define TILE_CHUNK 64

/* Block blk's 32 signed levels in one register (Q8_0 as stored, Q4_0 / Q5_0 unpacked). */
VNNI_FN static inline __m256i levels32(uint32_t type, const uint8_t *blk) {
    if (type == GGML_TYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    return bm_x86_q45_0_levels(type, blk);
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
    __m256i s0[BM_TILE_T], s1[BM_TILE_T];
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

VNNI_INLINE void blk32_tile(uint32_t type, const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n,
                            const int NT, float *out) {
    const size_t nb = n / BMOE_Q8_0_BLOCK, bb = type == GGML_TYPE_Q8_0 ? BMOE_Q8_0_BYTES : bm_q45_0_bytes(type);
    const uint8_t *rows[BM_TILE_R];
    for (int r = 0; r < BM_TILE_R; r++) rows[r] = w + (size_t)(r < nr ? r : 0) * row_bytes; /* spare lanes: row 0 */
    const __m256i ones = _mm256_set1_epi8(1), bias = _mm256_set1_epi8((char)0x80);
    __m256 acc[BM_TILE_T][8];
    for (int t = 0; t < NT; t++)
        for (int c = 0; c < 8; c++) acc[t][c] = _mm256_setzero_ps();
    _Alignas(32) uint8_t xs[BM_TILE_T][TILE_CHUNK * BMOE_Q8_0_BLOCK];
    for (size_t c0 = 0; c0 < nb; c0 += TILE_CHUNK) {
        const size_t c1 = nb - c0 < TILE_CHUNK ? nb : c0 + TILE_CHUNK;
        for (int t = 0; t < NT; t++) {
            const int8_t *xq = a->q + (size_t)t * n + c0 * BMOE_Q8_0_BLOCK;
            for (size_t i = 0; i < (c1 - c0) * BMOE_Q8_0_BLOCK; i += 32)
                _mm256_store_si256((__m256i *)(xs[t] + i),
                                   _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xq + i)), bias));
        }
        for (size_t b = c0; b < c1; b++) {
            __m256i lv[BM_TILE_R], wt[8];
            uint16_t sc[BM_TILE_R];
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
            const __m256i lsum = _mm256_add_epi32(ls0, ls1);
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc)); /* exact */
            tile_block(wt, _mm256_slli_epi32(lsum, 7), dw, xs[0] + (b - c0) * BMOE_Q8_0_BLOCK, sizeof xs[0], a->d + b,
                       nb, NT, acc, (int)(b & 7));
        }
    }
    for (int t = 0; t < NT; t++) {
        float cl[8][8]; /* [lane class][row] */
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(cl[c], acc[t][c]);
        for (int r = 0; r < nr; r++) {
            float l[8];
            for (int c = 0; c < 8; c++) l[c] = cl[c][r];
            out[r * BM_TILE_T + t] = bm_simd_sum8(l);
        }
    }
}

/* nt (2 .. BM_TILE_T) as a constant, so each token count gets its unrolled body */
VNNI_INLINE void blk32_tile_nt(uint32_t type, const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n,
                               int nt, float *out) {
    switch (nt) {
    case 8: blk32_tile(type, w, row_bytes, nr, a, n, 8, out); break;
    case 7: blk32_tile(type, w, row_bytes, nr, a, n, 7, out); break;
    case 6: blk32_tile(type, w, row_bytes, nr, a, n, 6, out); break;
    case 5: blk32_tile(type, w, row_bytes, nr, a, n, 5, out); break;
    case 4: blk32_tile(type, w, row_bytes, nr, a, n, 4, out); break;
    case 3: blk32_tile(type, w, row_bytes, nr, a, n, 3, out); break;
    default: blk32_tile(type, w, row_bytes, nr, a, n, 2, out);
    }
}

VNNI_FN static void dot_tile_q8_0(const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n, int nt,
                                  float *out) {
    blk32_tile_nt(GGML_TYPE_Q8_0, w, row_bytes, nr, a, n, nt, out);
}

VNNI_FN static void dot_tile_q4_0(const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n, int nt,
                                  float *out) {
    blk32_tile_nt(GGML_TYPE_Q4_0, w, row_bytes, nr, a, n, nt, out);
}

VNNI_FN static void dot_tile_q5_0(const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n, int nt,
                                  float *out) {
    blk32_tile_nt(GGML_TYPE_Q5_0, w, row_bytes, nr, a, n, nt, out);
}

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
    k->dot_tile[GGML_TYPE_Q8_0] = dot_tile_q8_0;
    k->dot_tile[GGML_TYPE_Q4_0] = dot_tile_q4_0;
    k->dot_tile[GGML_TYPE_Q5_0] = dot_tile_q5_0;
    return 1;
}

#else

int bm_kernels_avx512(bm_kernels *k) {
    (void)k;
    return 0;
}

#endif
