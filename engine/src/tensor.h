/* Numeric helpers: f16 conversion, row dequantisation, and the few transcendental functions the
 * forward pass needs. The matmul dot products are in kernels.h.
 *
 * Determinism: every function here has one fixed evaluation order, uses only IEEE +,-,*,/ and sqrt
 * (the build has -ffp-contract=off, so no fused multiply-add), and nothing depends on the thread
 * count. exp/log/sin/cos are computed here, not by libm, because glibc and musl (and their versions)
 * differ in the last bit; ours give the same bits on x86_64 and aarch64. */
#ifndef BMOE_TENSOR_H
#define BMOE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define BMOE_Q8_0_BLOCK 32
#define BMOE_Q8_0_BYTES 34 /* f16 scale + 32 int8 */

float bm_f16_to_f32(uint16_t h);  /* exact; subnormals, inf and NaN (payload kept) */
uint16_t bm_f32_to_f16(float f);  /* round to nearest even; overflow to inf */

/* Dequantises n elements of `row` into y. */
void row_to_f32(uint32_t type, const void *row, float *y, size_t n);

/* Portable math in double precision (error well below float rounding). */
double bm_exp(double x);
double bm_log(double x);             /* x > 0 */
void bm_sincos(double x, double *s, double *c);
float bm_silu(float z);              /* z / (1 + exp(-z)) */
double bm_tanh(double x);
float bm_gelu_tanh(float z);         /* 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))) */
/* GELU as ggml's CPU backend computes it (llama.cpp's GELU and GEGLU): a table indexed by z rounded to
 * f16, holding gelu_tanh rounded to f16; z <= -10 gives 0, z >= 10 gives z. */
float bm_gelu_f16(float z);

#endif
