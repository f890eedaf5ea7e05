/* The recipe-specific pieces of the forward pass (arch_ops.h). */
#include "arch_ops.h"

#include <math.h>

#include "tensor.h"

void ops_add_bias_rows(float *y, const float *b, int T, size_t n) {
    if (!b) return;
    for (int t = 0; t < T; t++)
        for (size_t j = 0; j < n; j++) y[(size_t)t * n + j] += b[j];
}

void ops_scale_rows(float *y, float s, int T, size_t n) {
    for (size_t i = 0; i < (size_t)T * n; i++) y[i] *= s;
}

void ops_swiglu_oai(const float *g, const float *u, size_t n, float *out) {
    const float alpha = 1.702f, limit = 7.0f;
    for (size_t i = 0; i < n; i++) {
        float x = limit < g[i] ? limit : g[i]; /* std::min(g, limit): a NaN stays NaN, as in ggml */
        float y = u[i] < -limit ? -limit : (u[i] > limit ? limit : u[i]);
        float ax = alpha * -x;
        float glu = x / (1.0f + (float)bm_exp((double)ax));
        out[i] = glu * (y + 1.0f);
    }
}

float ops_sigmoid(float x) { return (float)(1.0 / (1.0 + bm_exp(-(double)x))); }

/* n_dims log(n_ctx_orig / (n_rot 2 pi)) / (2 log base): the dimension whose wavelength fits n_rot times */
static double corr_dim(int n_dims, int orig_ctx, double n_rot, double base) {
    return n_dims * bm_log((double)orig_ctx / (n_rot * 2.0 * 3.14159265358979323846)) / (2.0 * bm_log(base));
}

double ops_yarn(int n_rot, double base, double scale, int orig_ctx, double beta_fast, double beta_slow,
                double attn_factor, double *inv) {
    double lo = floor(corr_dim(n_rot, orig_ctx, beta_fast, base));
    double hi = ceil(corr_dim(n_rot, orig_ctx, beta_slow, base));
    if (lo < 0) lo = 0;
    if (hi > n_rot - 1) hi = n_rot - 1;
    double span = hi - lo > 0.001 ? hi - lo : 0.001;
    for (int j = 0; j < n_rot / 2; j++) {
        double y = ((double)j - lo) / span;
        double ramp = 1.0 - (y < 0 ? 0 : (y > 1 ? 1 : y)); /* 1: extrapolate (keep), 0: interpolate (scale) */
        inv[j] *= scale * (1.0 - ramp) + ramp;
    }
    return attn_factor * (1.0 + 0.1 * bm_log(1.0 / scale));
}
