/* Small pieces of the forward pass that only some recipes use (arch.h): biases, gpt-oss's clamped
 * SwiGLU, the sigmoid gate of a gated shared expert, YaRN's per-dimension RoPE mix. Each is scalar code
 * with a fixed order of operations (no fused multiply-add: the build has -ffp-contract=off), so every
 * kernel path, thread count and batch width gives the same bits. forward.c calls them. */
#ifndef BMOE_ARCH_OPS_H
#define BMOE_ARCH_OPS_H

#include <stddef.h>

/* y[t, j] += b[j] for T rows of n (b NULL: nothing). */
void ops_add_bias_rows(float *y, const float *b, int T, size_t n);

/* y[t, j] *= s for T rows of n. */
void ops_scale_rows(float *y, float s, int T, size_t n);

/* gpt-oss's clamped SwiGLU (ggml's swiglu_oai, alpha 1.702, limit 7), out may be u:
 * x = min(g, 7), y = clamp(u, -7, 7), out = x / (1 + exp(-1.702 x)) * (y + 1). */
void ops_swiglu_oai(const float *g, const float *u, size_t n, float *out);

/* 1 / (1 + exp(-x)). */
float ops_sigmoid(float x);

/* YaRN (llama.cpp's rope_yarn with ext_factor 1): multiplies dimension pair j's frequency inv[j] by
 * scale (1 - ramp_j) + ramp_j for j < n_rot / 2 (ramp 1 below the correction range: unscaled, 0 above it:
 * fully scaled); returns the magnitude every cos and sin is multiplied by, attn_factor (1 + 0.1 ln(1 /
 * scale)). scale is 1 / rope.scaling.factor, orig_ctx the original context, base the layer's RoPE base. */
double ops_yarn(int n_rot, double base, double scale, int orig_ctx, double beta_fast, double beta_slow,
                double attn_factor, double *inv);

#endif
