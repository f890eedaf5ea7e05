/* The recurrent pieces of the hybrid architectures (docs/model-math.md, "Recurrent layers"): the short
 * causal convolution (lfm2moe's conv layers, the input of qwen35moe's delta-net layers), the L2 norm,
 * the delta-net gates and the gated delta rule, and the state they carry from one position to the next.
 *
 * Every function here computes one position after the other, in the same operations whether a call
 * covers one position (decode) or a whole prompt batch: prefill rows equal single rows (engine.md,
 * determinism rule 6). A call covers a range of channels or heads, each computed entirely by that
 * call, so splitting the range over threads changes no bit. Sums run in a fixed order: the
 * convolution's taps in index order, the L2 norm's squares in double in index order, the delta rule's
 * dot products through the kernels' 8-lane dot (kernels.h), identical on every kernel path. */
#ifndef BMOE_RECURRENT_H
#define BMOE_RECURRENT_H

#include <stddef.h>

#include "kernels.h"

/* Causal depthwise convolution of T positions, channels [c0, c1), K taps:
 *   y[t][c] = sum_{i=0..K-1} w[c*K + i] * win_c[t + i]
 * where win_c is the K-1 previous inputs of channel c (state[c*(K-1) ..], oldest first) followed by
 * x[0..T)[c]; the sum runs in i order, each product rounded to float. Afterwards the state holds the
 * last K-1 inputs of win_c. x and y are rows of xs and ys floats (y may not alias x). */
void rec_conv(const float *x, size_t xs, int T, const float *w, int K, float *state, float *y, size_t ys, int c0,
              int c1);

/* x[0..n) *= 1 / sqrt(sum x[i]^2 + eps), the sum of squares in double in index order. */
void rec_l2norm(float *x, int n, double eps);

/* The delta-net's decay gate g = softplus(alpha + dt_bias) * a (a = -exp(A_log), stored so in the
 * file), softplus(x) = x for x > 20 else log(1 + exp(x)), in double after the float add; and its update
 * strength beta = sigmoid(b), in double. Both rounded to float once. */
float rec_gate(float alpha, float dt_bias, float a);
float rec_beta(float b);

/* One value head of the gated delta rule over T positions. M is the head's state, S x S floats with
 * M[j*S + i] = state[i][j] (key index i, value index j: row j of M is column j of the state). For each t,
 * with q, k, v the position's rows (S floats each; q and k L2-normed), g and beta its gates:
 *   M *= (float)exp(g)
 *   d[j] = (v[j] - dot(M row j, k)) * beta
 *   M row j += d[j] * k                 (a multiply, then an add: no FMA)
 *   o[j] = dot(M row j, q) * (1 / sqrt(S))
 * qs, ks, vs, os: the row strides; gs: the stride of g and beta. tmp: S floats of scratch. */
void rec_delta_head(const bm_kernels *kern, int S, int T, const float *q, size_t qs, const float *k, size_t ks,
                    const float *v, size_t vs, const float *g, const float *beta, size_t gs, float *M, float *o,
                    size_t os, float *tmp);

/* The recurrent state of a model's layers, one buffer for all of them (dense, resident, never streamed).
 * It stands for a position, as the KV cache does: `pos` positions have been absorbed. A forward pass
 * at pos0 continues from it when pos0 == pos, starts a new context when pos0 == 0 (every value 0), and
 * returns to the marked state when pos0 is the mark's position (--ppl-choices evaluates each option
 * after the same context). */
typedef struct rec_state {
    float *cur;    /* n floats */
    float *mark;   /* n floats, allocated by the first rec_mark */
    size_t n;
    int pos;       /* positions absorbed */
    int mark_pos;  /* the marked position, -1 for none */
} rec_state;

/* 0, or 1 when out of memory. n may be 0 (a model without recurrent layers: every call is a no-op). */
int rec_state_init(rec_state *s, size_t n);
void rec_state_free(rec_state *s);
/* Makes the state the one a pass at pos0 continues from. 0, or -1 when pos0 is none of 0, pos and the
 * mark's position (a caller that skips or rewinds positions another way). */
int rec_seek(rec_state *s, int pos0);
/* Remembers the current state and its position (one mark; a new one replaces it). 0, or 1 out of memory. */
int rec_mark(rec_state *s);

#endif
