/* x86_64 helpers shared by the AVX2 and the AVX-512 VNNI kernels (kernels_avx2.c, kernels_avx512.c).
 * The including file defines BM_X86_FN, its functions' target attribute, and includes <immintrin.h>
 * first. Internal to the kernels. */
#ifndef BMOE_KERNELS_X86_H
#define BMOE_KERNELS_X86_H

#include <stdint.h>

#include "type_traits.h"

/* Block blk's 32 signed levels (bm_q45_0_levels) in one register: low nibbles are values 0-15, high
 * nibbles 16-31; Q5_0's fifth bits come from qh, bit i for value i. */
BM_X86_FN static inline __m256i bm_x86_q45_0_levels(uint32_t type, const uint8_t *blk) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const int five = type == GGML_TYPE_Q5_0;
    __m128i t = _mm_loadu_si128((const __m128i *)(blk + (five ? 6 : 2)));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), m4);
    if (!five) return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    uint32_t qh = (uint32_t)blk[2] | ((uint32_t)blk[3] << 8) | ((uint32_t)blk[4] << 16) | ((uint32_t)blk[5] << 24);
    /* byte i gets qh's byte i / 8, then its bit i mod 8 decides 0x10 or 0 */
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                        _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(0x10));
    return _mm256_sub_epi8(_mm256_or_si256(v, hb), _mm256_set1_epi8(16));
}

#endif
