/* The recurrent pieces (recurrent.h, docs/model-math.md "Recurrent layers"). */
#include "recurrent.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

void rec_conv(const float *x, size_t xs, int T, const float *w, int K, float *state, float *y, size_t ys, int c0,
              int c1) {
    int H = K - 1; /* inputs kept per channel */
    for (int c = c0; c < c1; c++) {
        float *st = state + (size_t)c * (size_t)H;
        const float *wc = w + (size_t)c * (size_t)K;
        for (int t = 0; t < T; t++) {
            float acc = 0.0f;
            for (int i = 0; i < K; i++) {
                /* window element t + i: the state's for t + i < H, else input t + i - H */
                int e = t + i;
                float xv = e < H ? st[e] : x[(size_t)(e - H) * xs + (size_t)c];
#ifndef BMOE_FAULT_CONV_TAPS_REVERSED
                acc += wc[i] * xv;
#else
                acc += wc[K - 1 - i] * xv; /* fault: the newest input meets the oldest tap */
#endif
            }
            y[(size_t)t * ys + (size_t)c] = acc;
        }
        /* the last H inputs of the window (state, then x) become the state */
        if (T >= H) {
            for (int e = 0; e < H; e++) st[e] = x[(size_t)(T - H + e) * xs + (size_t)c];
        } else {
            memmove(st, st + T, (size_t)(H - T) * sizeof *st);
            for (int e = 0; e < T; e++) st[H - T + e] = x[(size_t)e * xs + (size_t)c];
        }
    }
}

void rec_l2norm(float *x, int n, double eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float scale = (float)(1.0 / sqrt(ss + eps));
    for (int i = 0; i < n; i++) x[i] *= scale;
}

float rec_gate(float alpha, float dt_bias, float a) {
    double z = (double)(alpha + dt_bias);
    double sp = z > 20.0 ? z : bm_log(1.0 + bm_exp(z));
    return (float)(sp * (double)a);
}

float rec_beta(float b) { return (float)(1.0 / (1.0 + bm_exp(-(double)b))); }

void rec_delta_head(const bm_kernels *kern, int S, int T, const float *q, size_t qs, const float *k, size_t ks,
                    const float *v, size_t vs, const float *g, const float *beta, size_t gs, float *M, float *o,
                    size_t os, float *tmp) {
    size_t n = (size_t)S;
    float scale = (float)(1.0 / sqrt((double)S));
    for (int t = 0; t < T; t++) {
        const float *qt = q + (size_t)t * qs, *kt = k + (size_t)t * ks, *vt = v + (size_t)t * vs;
        float decay = (float)bm_exp((double)g[(size_t)t * gs]), b = beta[(size_t)t * gs];
        for (size_t x = 0; x < n * n; x++) M[x] = M[x] * decay;
        for (size_t j = 0; j < n; j++) tmp[j] = (vt[j] - kern->dot_f32(M + j * n, kt, n)) * b;
        for (size_t j = 0; j < n; j++) {
            float *row = M + j * n, dj = tmp[j];
            for (size_t i = 0; i < n; i++) {
                float p = dj * kt[i];
                row[i] = row[i] + p;
            }
        }
        float *ot = o + (size_t)t * os;
        for (size_t j = 0; j < n; j++) ot[j] = kern->dot_f32(M + j * n, qt, n) * scale;
    }
}

int rec_state_init(rec_state *s, size_t n) {
    memset(s, 0, sizeof *s);
    s->n = n;
    s->mark_pos = -1;
    if (n == 0) return 0;
    s->cur = calloc(n, sizeof *s->cur);
    return s->cur ? 0 : 1;
}

void rec_state_free(rec_state *s) {
    free(s->cur);
    free(s->mark);
    memset(s, 0, sizeof *s);
    s->mark_pos = -1;
}

int rec_seek(rec_state *s, int pos0) {
    if (s->n == 0 || pos0 == s->pos) return 0;
    if (pos0 == 0) {
#ifndef BMOE_FAULT_RECURRENT_KEEP_STATE
        memset(s->cur, 0, s->n * sizeof *s->cur); /* a new context */
#endif
        s->pos = 0;
        return 0;
    }
    if (s->mark && pos0 == s->mark_pos) {
        memcpy(s->cur, s->mark, s->n * sizeof *s->cur);
        s->pos = pos0;
        return 0;
    }
    return -1;
}

int rec_mark(rec_state *s) {
    if (s->n == 0) return 0;
    if (!s->mark && !(s->mark = malloc(s->n * sizeof *s->mark))) return 1;
    memcpy(s->mark, s->cur, s->n * sizeof *s->mark);
    s->mark_pos = s->pos;
    return 0;
}
