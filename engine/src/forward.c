/* The forward pass (docs/model-math.md), read top to bottom:
 *
 *   forward_eval   embed → for each layer: attention block, then dense or MoE FFN → output logits
 *   attention      norm, q/k/v, per-head qk-norm, RoPE, KV cache, causal softmax attention
 *   moe_ffn        router → the named results through the hook → experts via the expert source
 *
 * Every matmul is parallel over output rows in chunks (threads.h), every other
 * reduction runs serially in index order, so the output does not depend on the thread count. */
#include "forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch_ops.h"
#include "kernels.h"
#include "matmul.h"
#include "recurrent.h"
#include "tensor.h"

struct bmoe_forward {
    const bmoe_model *m;
    bmoe_pool *pool;
    const bmoe_seam *seam;
    int n_ctx, max_batch, top_k;
    int d, q_dim, kv_dim, v_dim, o_dim, ff_max; /* the widest layer's rows (layers may differ: bmoe_layer) */
    float *k_cache, *v_cache;     /* layer il's [n_ctx][its kv rows] at k_off[il], v_off[il] */
    size_t *k_off, *v_off;
    rec_state rs;                 /* the recurrent layers' state (recurrent.h), one buffer for all of them */
    float *qg;                    /* gated attention: each head's gate values [T, q_dim] */
    float *rin, *rcv, *rz, *ro;   /* recurrent layers: projections [T, rin_w], conv out [T, rin_w], z, out [T, rz_w] */
    float *ralpha, *rbeta;        /* delta-net gates [T, Hv] */
    float *rtmp;                  /* delta rule scratch [threads][S] */
    size_t rin_w, rz_w;
    double *inv_freq;             /* RoPE: base^(-2j/n_rot) / rope_freqs[j], j < n_rot/2 */
    double *inv_freq_swa;         /* sliding-window layers: base_swa^(-2j/n_rot_swa), j < n_rot_swa/2 */
    float rope_mscale, rope_mscale_swa; /* YaRN: cos and sin multiplied by this (1 without YaRN) */
    /* activations, [max_batch, ...] */
    float *x, *xn, *hm, *q, *k, *v, *att, *o, *ffn, *sh;
    float *hg, *hu;               /* dense / shared FFN hidden [T, ff_max] */
    float *rlog, *rprob, *w;      /* router logits and probs [T, E], weights [T, top_k] */
    float *rsel;                  /* probs + the selection bias [T, E] (recipes with probs_bias) */
    float *gelu;                  /* GELU recipes: bm_gelu_f16's table [BM_GELU_TAB] (tensor.h), else NULL */
    int32_t *ids;                 /* [T, top_k] */
    /* a prompt's experts (experts_batch), a pass of at most moe_pass tokens at a time (P below) */
    int moe_pass;
    float *moe;                   /* the MoE sum [T, d] */
    float *gx, *eg, *eu;          /* one expert's rows: gathered input [P, d], hidden [P, 2f], [P, f] */
    mm_qbuf gin, din;             /* their inputs quantised: gathered [P, d], hidden [P, f] */
    float *ko;                    /* every (token, slot)'s expert output of the pass [P * k, d] */
    int *cnt, *start, *order;     /* bucketing the pass's (token, slot) pairs by expert: [E], [E], [P * k] */
    struct expert_slice *slices;  /* a group of experts (experts_batch) [MOE_GROUP_EXPERTS] */
    mm_job *gjobs;                /* its matmuls [2 * MOE_GROUP_EXPERTS] */
    float *keg, *keu, *keo;       /* one token's k experts at once: [k,2f], [k,f], [k,d] */
    mm_qbuf kxq;                  /* their hidden rows quantised [k, f] */
    bmoe_expert_view *kv;         /* their views [k] */
    float *scratch;               /* attention scores, [threads][2][n_ctx] (a pair of heads) */
    float *xl;                    /* normed rows for the output matmul [T, d] */
    mm_qbuf xq;                   /* a matmul input quantised [T, in_max] */
    size_t in_max;                /* the widest matmul input */
    bm_kernels kern;
    uint64_t experts_routed;
};

/* ---- small helpers --------------------------------------------------------------------------- */

static int is_nan(float v) { return v != v; }

void topk_row(const float *p, int n, int k, int32_t *ids) {
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int r = 0; r < s; r++) taken |= ids[r] == e;
            if (taken) continue;
            /* strict '>' keeps the lower id on ties */
            if (best < 0 || p[e] > p[best] || (is_nan(p[best]) && !is_nan(p[e]))) best = e;
        }
        ids[s] = best;
    }
}

int argmax_first(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best] || (is_nan(v[best]) && !is_nan(v[i]))) best = i;
    return best;
}

/* out = x / sqrt(mean(x^2) + eps) * w; the sum of squares runs in double, in index order. */
static void rmsnorm(float *out, const float *x, const float *w, int n, double eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
#ifndef BMOE_FAULT_RMSNORM_EPS_OUTSIDE
    float scale = (float)(1.0 / sqrt(ss / n + eps));
#else
    float scale = (float)(1.0 / (sqrt(ss / n) + eps)); /* fault: eps added outside the square root */
#endif
    for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

/* out = x / sqrt(mean(x^2) + eps), no weight (llama.cpp's v-norm and gemma4's router input). */
static void rmsnorm_plain(float *out, const float *x, int n, double eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * scale;
}

static void rmsnorm_rows(float *out, const float *x, const float *w, int T, int n, double eps) {
    for (int t = 0; t < T; t++) rmsnorm(out + (size_t)t * n, x + (size_t)t * n, w, n, eps);
}

/* In-place softmax in index order: max, exp, sum, divide. */
static void softmax(const bm_kernels *k, float *v, int n) {
    float mx = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] > mx) mx = v[i];
    k->exp_shift(v, (size_t)n, mx); /* (float)bm_exp((double)v[i] - (double)mx), each i */
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += v[i];
    for (int i = 0; i < n; i++) v[i] /= sum;
}

/* softmax over v[0..n) and one more logit `sink` that has no value (gpt-oss's attention sinks, ggml's
 * soft_max with sinks): the max and the sum include it, the output is v's n probabilities. */
static void softmax_sink(const bm_kernels *k, float *v, int n, float sink) {
    float mx = sink;
    for (int i = 0; i < n; i++)
        if (v[i] > mx) mx = v[i];
    k->exp_shift(v, (size_t)n, mx);
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += v[i];
    sum += (float)bm_exp((double)sink - (double)mx);
    for (int i = 0; i < n; i++) v[i] /= sum;
}

/* softmax (sink NULL) or softmax_sink (sink[r] row r's) of two rows at once: each row gets exactly
 * those functions' operations in their order; only the two rows' max and sum chains are interleaved,
 * so that each add waits less on the previous one's latency. */
static void softmax2(const bm_kernels *k, float *a, float *b, int n, const float *sink) {
    float ma = sink ? sink[0] : a[0], mb = sink ? sink[1] : b[0];
    for (int i = sink ? 0 : 1; i < n; i++) {
        if (a[i] > ma) ma = a[i];
        if (b[i] > mb) mb = b[i];
    }
    k->exp_shift(a, (size_t)n, ma);
    k->exp_shift(b, (size_t)n, mb);
    float sa = 0.0f, sb = 0.0f;
    for (int i = 0; i < n; i++) {
        sa += a[i];
        sb += b[i];
    }
    if (sink) {
        sa += (float)bm_exp((double)sink[0] - (double)ma);
        sb += (float)bm_exp((double)sink[1] - (double)mb);
    }
    for (int i = 0; i < n; i++) a[i] /= sa;
    for (int i = 0; i < n; i++) b[i] /= sb;
}

/* out[i] = act(g[i]) * u[i] (out may be u). SiLU through the kernels' vector form (the same bits as
 * bm_silu); GELU goes through ggml's f16 table, as llama.cpp computes it on a CPU (docs/model-math.md),
 * built once per forward pass object (bm_gelu_f16's bits). */
static void act_mul(const bmoe_forward *f, const float *g, const float *u, size_t n, float *out) {
    switch (f->m->recipe->act) {
    case BMOE_ACT_SILU: f->kern.silu_mul(g, u, n, out); break;
    case BMOE_ACT_SWIGLU_OAI: ops_swiglu_oai(g, u, n, out); break; /* gpt-oss (arch_ops.c) */
    case BMOE_ACT_GELU_TANH:
        for (size_t i = 0; i < n; i++) out[i] = bm_gelu_f16_tab(f->gelu, g[i]) * u[i];
        break;
    }
}

/* ---- matmul (matmul.h): y[t, j] = row_j(W) . x[t], parallel over rows j ---------------------------- */

/* The forward pass's matmul input x quantised into f->xq (once per matmul, not per row), as one bm_act. */
static bm_act layer_input(bmoe_forward *f, bm_act_kind kind, const float *x, int T, size_t n) {
    mm_quantise(f->pool, &f->kern, kind, x, T, n, &f->xq);
    return mm_act(x, &f->xq);
}

static void matmul_raw(bmoe_forward *f, const void *w, uint32_t type, size_t row_bytes, size_t n_in, size_t n_out,
                       const float *x, int T, float *y) {
    mm_job J = { w, type, row_bytes, n_in, n_out, layer_input(f, mm_act_kind(type), x, T, n_in), y, T, NULL, 0 };
    mm_run(f->pool, &f->kern, 1, &J);
}

static void matmul(bmoe_forward *f, const bmoe_weight *W, const float *x, int T, float *y) {
    matmul_raw(f, W->data, W->type, (size_t)W->row_bytes, (size_t)W->ne[0], (size_t)W->ne[1], x, T, y);
}

/* Several matmuls (up to MATMUL_MULTI) of the same input (q, k, v; gate, up) as one pool job over all
 * their rows: one wake-up instead of one each. Each row is computed as matmul() computes it. */
#define MATMUL_MULTI 4
static void matmul_multi(bmoe_forward *f, int n, const bmoe_weight *const *W, const float *x, int T, float *const *y) {
    mm_job J[MATMUL_MULTI];
    unsigned quantised = 0; /* the activation kinds done (bit bm_act_kind) */
    for (int m = 0; m < n; m++) {
        size_t n_in = (size_t)W[m]->ne[0], n_out = (size_t)W[m]->ne[1];
        bm_act_kind kind = mm_act_kind(W[m]->type);
        bm_act a = mm_act(x, &f->xq);
        if (!(quantised & (1u << kind))) { /* the same input: quantised once per kind */
            a = layer_input(f, kind, x, T, n_in);
            quantised |= 1u << kind;
        }
        mm_job j = { W[m]->data, W[m]->type, (size_t)W[m]->row_bytes, n_in, n_out, a, y[m], T, NULL, 0 };
        J[m] = j;
    }
    mm_run(f->pool, &f->kern, n, J);
}

/* Below this many values, a per-row step (activations, the experts' gathers and sums) runs on the
 * caller. */
#define ROWS_PARALLEL_MIN 32768u

/* fn over n rows of per_row values each, on the pool when there are enough values to be worth it. A
 * row's values depend on that row alone, so where it runs changes nothing. */
static void run_rows(bmoe_forward *f, int n, size_t per_row, bmoe_pool_fn fn, void *ctx) {
    if (n < 2 || (size_t)n * per_row < ROWS_PARALLEL_MIN) fn(ctx, 0, n, 0);
    else pool_run(f->pool, n, fn, ctx);
}

/* hu[t] = act(hg[t]) * hu[t] for rows t (the dense FFN's hidden rows of F values). */
typedef struct {
    const bmoe_forward *f;
    size_t F;
} act_rows_job;

static void act_rows(void *ctx, int t0, int t1, int tid) {
    (void)tid;
    const act_rows_job *J = ctx;
    const size_t F = J->F, a = (size_t)t0 * F;
    act_mul(J->f, J->f->hg + a, J->f->hu + a, (size_t)(t1 - t0) * F, J->f->hu + a);
}

/* FFN with resident weights: y = D (act(G h) * U h), h [T, n_in]. */
static void gated_ffn(bmoe_forward *f, const bmoe_weight *G, const bmoe_weight *U, const bmoe_weight *D,
                      const float *h, int T, float *y) {
    size_t F = (size_t)G->ne[1];
    const bmoe_weight *W[2] = { G, U };
    float *const y2[2] = { f->hg, f->hu };
    matmul_multi(f, 2, W, h, T, y2);
    act_rows_job A = { f, F };
    run_rows(f, T, F, act_rows, &A);
    matmul(f, D, f->hu, T, y);
}

/* ---- attention ------------------------------------------------------------------------------- */

typedef struct {
    bmoe_forward *f;
    const bmoe_layer *ly;
    int il, T, pos0;
    /* the layer's geometry (bmoe_layer): heads, head sizes, rows of q, k, v and the attention output */
    int H, Hkv, hd, hdv;
    size_t qd, kvd, vd, od;
    float *kc, *vc;          /* this layer's KV cache, [n_ctx][kvd] and [n_ctx][vd] */
} attn_job;

/* Per position t: per-head qk-norm, RoPE on q and k, then k and v into the cache. */
static void qk_rows(void *ctx, int t0, int t1, int tid) {
    (void)tid;
    const attn_job *J = ctx;
    bmoe_forward *f = J->f;
    const bmoe_hparams *hp = &f->m->hp;
    int hd = J->hd, hdv = J->hdv, H = J->H, Hkv = J->Hkv;
    int half = J->ly->n_rot / 2;
    const double *inv_freq = J->ly->is_swa ? f->inv_freq_swa : f->inv_freq;
    float mscale = J->ly->is_swa ? f->rope_mscale_swa : f->rope_mscale; /* YaRN's magnitude, else 1 */
    for (int t = t0; t < t1; t++) {
        float *q = f->q + (size_t)t * J->qd, *k = f->k + (size_t)t * J->kvd;
        if (J->ly->attn_q_norm)
            for (int h = 0; h < H; h++) rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, J->ly->attn_q_norm, hd, hp->eps);
#ifndef BMOE_FAULT_QK_NORM_SKIPPED /* fault: the per-head k-norm is never applied */
        if (J->ly->attn_k_norm)
#else
        if (0)
#endif
            for (int h = 0; h < Hkv; h++) rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, J->ly->attn_k_norm, hd, hp->eps);
        if (f->m->recipe->v_norm) {
            float *v = f->v + (size_t)t * J->vd;
            for (int h = 0; h < Hkv; h++) rmsnorm_plain(v + (size_t)h * hdv, v + (size_t)h * hdv, hdv, hp->eps);
        }
        double p = (double)(J->pos0 + t);
        for (int j = 0; j < half; j++) { /* NeoX pairing: (v[j], v[j + n_rot/2]) */
            double sd, cd;
            bm_sincos(p * inv_freq[j], &sd, &cd);
            float s = (float)sd * mscale, c = (float)cd * mscale, s_q = s, c_q = c;
#ifdef BMOE_FAULT_ROPE_POS /* Fault: q rotated one position ahead of k, every q-k distance off by one (REF) */
            bm_sincos((p + 1.0) * inv_freq[j], &sd, &cd), s_q = (float)sd * mscale, c_q = (float)cd * mscale;
#endif
            for (int h = 0; h < H; h++) {
                float *v = q + (size_t)h * hd, a = v[j], b = v[j + half];
                v[j] = a * c_q - b * s_q;
                v[j + half] = a * s_q + b * c_q;
            }
            for (int h = 0; h < Hkv; h++) {
                float *v = k + (size_t)h * hd, a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = a * s + b * c;
            }
        }
        size_t pos = (size_t)(J->pos0 + t);
#ifdef BMOE_FAULT_KV_POS_FIRST
        pos = (size_t)J->pos0; /* fault: every token of a batch writes its k and v at the batch's first position */
#endif
        memcpy(J->kc + pos * J->kvd, k, J->kvd * sizeof(float));
        memcpy(J->vc + pos * J->vd, f->v + (size_t)t * J->vd, J->vd * sizeof(float));
    }
}

/* The heads that share a KV group are taken in pairs where the kernel path can do two queries at once
 * (dot_f32_rows2, weighted_rows2: each key and value is loaded once for both); else one at a time. */
static int heads_per_unit(const bmoe_forward *f, int group) {
    return group >= 2 && f->kern.dot_f32_rows2 && f->kern.weighted_rows2 ? 2 : 1;
}

/* Per (unit of heads, position): causal softmax attention over the cache. A unit is one head, or two
 * heads of one KV group (heads_per_unit). Items go unit by unit (item i is position i mod T of unit
 * i / T), so a thread's run of items walks one group's keys and values over and over while they are
 * in cache, not every head's for one position; the order changes no value. Each score is
 * dot_f32(q, k_j) * scale (the kernels' dot_f32_rows, eight keys at a time), the softmax runs in index
 * order, and the output is sum_j p_j v_j in increasing j (weighted_rows): a pair's outputs have the
 * one-head functions' bits. */
static void attn_heads(void *ctx, int i0, int i1, int tid) {
    const attn_job *J = ctx;
    bmoe_forward *f = J->f;
    const bmoe_hparams *hp = &f->m->hp;
    const int hd = J->hd, hdv = J->hdv, group = J->H / J->Hkv, per = heads_per_unit(f, group);
    const int units = (group + per - 1) / per; /* per KV group */
    float scale = (float)hp->attn_scale; /* 1/sqrt(head dim), or the recipe's (model.c) */
    float *sc[2] = { f->scratch + (size_t)tid * 2 * f->n_ctx, f->scratch + ((size_t)tid * 2 + 1) * f->n_ctx };
    for (int i = i0; i < i1; i++) {
        int unit = i / J->T, t = i % J->T, g = unit / units, h0 = g * group + unit % units * per, p = J->pos0 + t;
        int nh = group - (h0 - g * group) < per ? group - (h0 - g * group) : per;
        /* a sliding-window layer sees the n_swa latest positions (p - j < n_swa) */
        int j0 = J->ly->is_swa && p - hp->n_swa + 1 > 0 ? p - hp->n_swa + 1 : 0, n = p + 1 - j0;
        const float *q = f->q + (size_t)t * J->qd + (size_t)h0 * hd, *kg = J->kc + (size_t)j0 * J->kvd + (size_t)g * hd;
        const float *vg = J->vc + (size_t)j0 * J->vd + (size_t)g * hdv;
        float *out = f->att + (size_t)t * J->od + (size_t)h0 * hdv;
        if (nh == 2) f->kern.dot_f32_rows2(q, q + hd, kg, J->kvd, (size_t)hd, n, sc[0], sc[1]);
        else f->kern.dot_f32_rows(q, kg, J->kvd, (size_t)hd, n, sc[0]);
        for (int u = 0; u < nh; u++)
            for (int j = 0; j < n; j++) sc[u][j] *= scale;
        const float *sinks = J->ly->attn_sinks ? J->ly->attn_sinks + h0 : NULL;
        if (nh == 2) softmax2(&f->kern, sc[0], sc[1], n, sinks);
        else if (sinks) softmax_sink(&f->kern, sc[0], n, sinks[0]);
        else softmax(&f->kern, sc[0], n);
        if (nh == 2) f->kern.weighted_rows2(sc[0], sc[1], n, vg, J->vd, (size_t)hdv, out, out + hdv);
        else f->kern.weighted_rows(sc[0], n, vg, J->vd, (size_t)hdv, out);
    }
}

static void attention(bmoe_forward *f, int il, int T, int pos0) {
    const bmoe_model *m = f->m;
    const bmoe_layer *ly = &m->layers[il];
    int d = f->d;
    attn_job J = { f, ly, il, T, pos0, ly->n_head, ly->n_head_kv, ly->head_dim, ly->head_dim_v,
                   (size_t)ly->n_head * ly->head_dim, (size_t)ly->n_head_kv * ly->head_dim,
                   (size_t)ly->n_head_kv * ly->head_dim_v, (size_t)ly->n_head * ly->head_dim_v,
                   f->k_cache + f->k_off[il], f->v_cache + f->v_off[il] };
    rmsnorm_rows(f->xn, f->x, ly->attn_norm, T, d, m->hp.eps);
    const bmoe_weight *W[3] = { &ly->attn_q, &ly->attn_k, &ly->attn_v };
    int gated = m->recipe->attn_gate, hd = J.hd;
    float *const y3[3] = { gated ? f->rin : f->q, f->k, f->v };
    if (ly->attn_v.t) {
        matmul_multi(f, 3, W, f->xn, T, y3);
    } else { /* gemma4 without attn_v: v is k's projection, taken before k's norm */
        matmul_multi(f, 2, W, f->xn, T, y3);
        memcpy(f->v, f->k, (size_t)T * J.kvd * sizeof(float));
    }
    if (gated) /* per head: hd queries, then hd gate values */
        for (int t = 0; t < T; t++)
            for (int h = 0; h < J.H; h++) {
                const float *src = f->rin + (size_t)t * 2 * J.qd + (size_t)h * 2 * hd;
                memcpy(f->q + (size_t)t * J.qd + (size_t)h * hd, src, (size_t)hd * sizeof(float));
                memcpy(f->qg + (size_t)t * J.qd + (size_t)h * hd, src + hd, (size_t)hd * sizeof(float));
            }
    ops_add_bias_rows(f->q, ly->attn_q_b, T, J.qd); /* q/k/v biases where the model has them */
    ops_add_bias_rows(f->k, ly->attn_k_b, T, J.kvd);
    ops_add_bias_rows(f->v, ly->attn_v_b, T, J.vd);
    pool_run(f->pool, T, qk_rows, &J);
    const int group = J.H / J.Hkv, per = heads_per_unit(f, group);
    pool_run(f->pool, T * J.Hkv * ((group + per - 1) / per), attn_heads, &J);
    if (gated) /* the output gate: each head's output times sigmoid(gate) (head dims equal: od == qd) */
        for (size_t i = 0; i < (size_t)T * J.od; i++)
            f->att[i] = f->att[i] * (float)(1.0 / (1.0 + bm_exp(-(double)f->qg[i])));
    matmul(f, &ly->attn_output, f->att, T, f->o);
    ops_add_bias_rows(f->o, ly->attn_output_b, T, (size_t)d);
    if (ly->post_attention_norm) rmsnorm_rows(f->o, f->o, ly->post_attention_norm, T, d, m->hp.eps);
    for (size_t i = 0; i < (size_t)T * d; i++) f->x[i] += f->o[i];
}

/* ---- recurrent layers (recurrent.h, docs/model-math.md "Hybrid architectures") ---------------- */

typedef struct {
    const float *x;
    size_t xs;
    int T, K;
    const float *w;
    float *state, *y;
    size_t ys;
} conv_job;

static void conv_channels(void *ctx, int c0, int c1, int tid) {
    (void)tid;
    const conv_job *J = ctx;
    rec_conv(J->x, J->xs, J->T, J->w, J->K, J->state, J->y, J->ys, c0, c1);
}

typedef struct {
    bmoe_forward *f;
    float *M;         /* the layer's delta-rule state: head h at h * S * S */
    int T;
} delta_job;

static void delta_heads(void *ctx, int h0, int h1, int tid) {
    const delta_job *J = ctx;
    bmoe_forward *f = J->f;
    const bmoe_hparams *hp = &f->m->hp;
    int S = hp->ssm_state, Hk = hp->ssm_groups, Hv = hp->ssm_heads;
    size_t C = f->rin_w, SS = (size_t)S * (size_t)S;
    for (int h = h0; h < h1; h++) {
        int a = h % Hk; /* value head h reads q/k head h mod Hk */
        const float *q = f->rcv + (size_t)a * S, *k = f->rcv + (size_t)(Hk + a) * S;
        const float *v = f->rcv + (size_t)(2 * Hk + h) * S;
        rec_delta_head(&f->kern, S, J->T, q, C, k, C, v, C, f->ralpha + h, f->rbeta + h, (size_t)Hv, J->M + (size_t)h * SS,
                       f->ro + (size_t)h * S, (size_t)Hv * S, f->rtmp + (size_t)tid * S);
    }
}

/* A gated delta-net layer: x += ssm_out(gated_norm(delta rule(l2(silu(conv(attn_qkv h)))))). */
static void delta_layer(bmoe_forward *f, int il, int T) {
    const bmoe_model *m = f->m;
    const bmoe_hparams *hp = &m->hp;
    const bmoe_layer *ly = &m->layers[il];
    int d = f->d, S = hp->ssm_state, Hk = hp->ssm_groups, Hv = hp->ssm_heads, K = hp->conv_taps;
    size_t C = f->rin_w, Z = (size_t)Hv * S;
    rmsnorm_rows(f->xn, f->x, ly->attn_norm, T, d, hp->eps);
    const bmoe_weight *W[4] = { &ly->attn_qkv, &ly->attn_z, &ly->ssm_beta, &ly->ssm_alpha };
    float *const y4[4] = { f->rin, f->rz, f->rbeta, f->ralpha };
    matmul_multi(f, 4, W, f->xn, T, y4);
    float *state = f->rs.cur + ly->rec_off;
    conv_job CJ = { f->rin, C, T, K, ly->ssm_conv1d, state, f->rcv, C };
    pool_run(f->pool, (int)C, conv_channels, &CJ);
    for (size_t i = 0; i < (size_t)T * C; i++) f->rcv[i] = bm_silu(f->rcv[i]);
    for (int t = 0; t < T; t++) {
        for (int a = 0; a < 2 * Hk; a++) rec_l2norm(f->rcv + (size_t)t * C + (size_t)a * S, S, hp->eps); /* q, then k */
        for (int h = 0; h < Hv; h++) {
            size_t i = (size_t)t * Hv + h;
            f->ralpha[i] = rec_gate(f->ralpha[i], ly->ssm_dt[h], ly->ssm_a[h]);
            f->rbeta[i] = rec_beta(f->rbeta[i]);
        }
    }
    delta_job DJ = { f, state + (size_t)(K - 1) * C, T };
    pool_run(f->pool, Hv, delta_heads, &DJ);
    for (size_t r = 0; r < (size_t)T * Hv; r++) { /* per head: rmsnorm * ssm_norm * silu(z) */
        float *o = f->ro + r * S;
        rmsnorm(o, o, ly->ssm_norm, S, hp->eps);
        f->kern.silu_mul(f->rz + r * S, o, (size_t)S, o);
    }
    matmul(f, &ly->ssm_out, f->ro, T, f->o);
    (void)Z;
    for (size_t i = 0; i < (size_t)T * d; i++) f->x[i] += f->o[i];
}

/* A short-convolution layer: [B, C, X] = in_proj h; x += out_proj(C * conv(B * X)). */
static void conv_layer(bmoe_forward *f, int il, int T) {
    const bmoe_model *m = f->m;
    const bmoe_layer *ly = &m->layers[il];
    int d = f->d;
    size_t D = (size_t)d;
    rmsnorm_rows(f->xn, f->x, ly->attn_norm, T, d, m->hp.eps);
    matmul(f, &ly->sc_in, f->xn, T, f->rin); /* [T, 3d] */
    for (int t = 0; t < T; t++) {
        const float *r = f->rin + (size_t)t * 3 * D;
        float *bx = f->rz + (size_t)t * D;
        for (size_t c = 0; c < D; c++) bx[c] = r[c] * r[2 * D + c];
    }
    conv_job CJ = { f->rz, D, T, m->hp.conv_taps, ly->sc_conv, f->rs.cur + ly->rec_off, f->rcv, D };
    pool_run(f->pool, d, conv_channels, &CJ);
    for (int t = 0; t < T; t++) {
        const float *cc = f->rin + (size_t)t * 3 * D + D;
        float *y = f->rcv + (size_t)t * D;
        for (size_t c = 0; c < D; c++) y[c] = cc[c] * y[c];
    }
    matmul(f, &ly->sc_out, f->rcv, T, f->o);
    for (size_t i = 0; i < (size_t)T * D; i++) f->x[i] += f->o[i];
}

/* ---- MoE FFN --------------------------------------------------------------------------------- */

typedef struct {
    int il, T, phase, step, pos0;
} moe_ctx;

/* Hands one named result to the hook (if any) before anything downstream reads it. */
static int emit(bmoe_forward *f, const moe_ctx *c, bmoe_node node, char *err, size_t errlen) {
    if (!f->seam->hook) return 0;
    int E = f->m->hp.n_expert, k = f->top_k;
    bmoe_moe_result r = {
        .node = node, .layer = c->il, .n_tokens = c->T, .n_cols = node <= BMOE_NODE_PROBS ? E : k,
        .n_expert = E, .phase = c->phase, .step = c->step, .pos0 = c->pos0,
    };
    if (node == BMOE_NODE_LOGITS) r.f32 = f->rlog;
    else if (node == BMOE_NODE_PROBS) r.f32 = f->rprob;
    else {
        r.ids = f->ids;
        if (node == BMOE_NODE_TOPK) {
            r.scores = f->m->layers[c->il].exp_probs_b ? f->rsel : f->rprob; /* the tensor the selection sorted */
            r.scores_are_probs = f->m->hp.gating->scores_are_probs;
        } else {
            r.weights = f->w;
            if (node != BMOE_NODE_EXPERTS) r.f32 = f->w;
        }
    }
    int rc = f->seam->hook(f->seam->hook_user, &r);
    if (rc) {
        if (!err[0]) snprintf(err, errlen, "%s-%d: the hook stopped the forward pass (code %d)", bmoe_node_name(node), c->il, rc);
        return rc;
    }
    return 0;
}

/* ---- a prompt's routed experts, grouped by expert ------------------------------------------------- */

/* A batch's experts are computed expert by expert: the (token, slot) pairs that route expert e are
 * gathered, multiplied by e's weights in one matmul each for gate/up and down (so each weight block
 * serves all of them at once), and scattered to one output row per pair; then each token sums its k
 * outputs in slot order, moe[t] = sum_s w[t,s] * out[t,s] for s = 0..k-1, exactly as decoding the
 * token alone does (experts_token). The grouping changes no bit: every output element is one row's
 * dot product with the one-token kernel's bits (matmul.h), and the sum's order is the slot order.
 *
 * The experts are visited in ascending id, so a streamed batch views (and reads: stream_hook.c's
 * issue_reads issues them in the same order) each executing expert once per pass; a prompt longer
 * than moe_pass tokens is done in passes of moe_pass tokens, which bounds the per-pair outputs at
 * [moe_pass * k, d]. The reads themselves are decided once per batch by the hook, before any view
 * (docs/streaming.md): a pass re-views an expert the previous pass used, it reads nothing again. */

static int check_view(const bmoe_expert_view *v, const bmoe_layer *ly, int il, int e, char *err, size_t errlen) {
    /* the layer's layout (fused gate_up or gate and up) is what the matmuls of a group assume */
    if (ly->exp_part[BMOE_EXP_GATE_UP].present ? !v->gate_up : !(v->gate && v->up)) {
        snprintf(err, errlen, "expert source gave no gate/up weights for layer %d expert %d", il, e);
        return 1;
    }
    if (!v->down) {
        snprintf(err, errlen, "expert source gave no down weights for layer %d expert %d", il, e);
        return 1;
    }
    return 0;
}

/* The activation formats the gate / up rows of a layer's experts take (bit bm_act_kind). */
static unsigned gate_up_kinds(const bmoe_expert_part *P) {
    unsigned kinds = 0;
    for (int p = 0; p < BMOE_EXP_DOWN; p++)
        if (P[p].present) kinds |= 1u << mm_act_kind(P[p].type);
    return kinds;
}

/* The hidden rows of one expert's gathered tokens: eu[i] = act(gate_i) * up_i, then quantised for the
 * down rows (din). gate_i and up_i are the halves of eg's row (fused gate_up) or rows of eg and eu. */
typedef struct {
    bmoe_forward *f;
    int fused;
    size_t fe;
    bm_act_kind kind;
} hidden_job;

static void hidden_rows(void *ctx, int i0, int i1, int tid) {
    (void)tid;
    const hidden_job *J = ctx;
    bmoe_forward *f = J->f;
    size_t fe = J->fe;
    for (int i = i0; i < i1; i++) {
        const size_t u = (size_t)i;
        if (J->fused) act_mul(f, f->eg + u * 2 * fe, f->eg + u * 2 * fe + fe, fe, f->eu + u * fe);
        else act_mul(f, f->eg + u * fe, f->eu + u * fe, fe, f->eu + u * fe);
    }
    mm_quantise_rows(&f->kern, J->kind, f->eu, i0, i1, fe, &f->din);
}

/* Tokens per pass of experts_batch. */
#define MOE_PASS 512

/* Experts per group in experts_batch. A group's matrices go through the pool as one job each for
 * gate/up, the hidden rows and down, so a prompt's layer waits at about three barriers per group, not
 * three per expert (with two threads, per-expert barriers on a few tokens each kept a 128-token
 * prefill at 1.5x its one-thread speed). A group's views are all asked for before its matmuls, and a
 * streamed view waits for its expert's reads: groups of a few experts keep the later groups' reads
 * overlapping the earlier groups' matmuls. */
#define MOE_GROUP_EXPERTS 8

/* One expert's share of a group: n of the pass's pairs (pair p = token t0 + p / k, slot p % k), which
 * are rows row .. row + n - 1 of the group's gathered buffers. */
typedef struct expert_slice {
    int e, n, row;
    const int *pairs;
    bmoe_expert_view v;
} expert_slice;

/* A group's FFNs: ko[p] = FFN_e(h[token of p]) for every slice's pairs. Each output element is one
 * row's dot product with the one-token kernel's bits, whichever job or thread computes it. */
static void experts_group(bmoe_forward *f, const bmoe_layer *ly, const expert_slice *S, int ns, int rows, int t0) {
    const bmoe_expert_part *P = ly->exp_part;
    const int k = f->top_k, fused = P[BMOE_EXP_GATE_UP].present;
    const size_t d = (size_t)f->d, fe = (size_t)f->m->hp.n_ff_exp, gw = fused ? 2 * fe : fe; /* eg's row width */
    /* gather: the pairs' tokens' inputs, in each format the gate / up rows take (h was put in them once) */
    const unsigned kinds = gate_up_kinds(P);
    const bm_act h = mm_act(f->hm, &f->xq);
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < S[s].n; i++)
            for (int kind = 0; kind < BM_ACT_COUNT; kind++)
                if (kinds & (1u << kind))
                    mm_act_copy_row((bm_act_kind)kind, d, &h, t0 + S[s].pairs[i] / k, f->gx, &f->gin, S[s].row + i);
    const bm_act g = mm_act(f->gx, &f->gin);
    mm_job *J = f->gjobs;
    int nj = 0;
    for (int s = 0; s < ns; s++) { /* fused: rows 0..f-1 gate, f..2f-1 up */
        const bm_act a = bm_act_token(&g, d, S[s].row);
        const size_t r = (size_t)S[s].row;
        if (fused) {
            const bmoe_expert_part *gu = &P[BMOE_EXP_GATE_UP];
            J[nj++] = (mm_job){ S[s].v.gate_up, gu->type, gu->row_bytes, gu->n_in, gu->n_out, a, f->eg + r * gw, S[s].n, NULL, 0 };
        } else {
            const bmoe_expert_part *pg = &P[BMOE_EXP_GATE], *pu = &P[BMOE_EXP_UP];
            J[nj++] = (mm_job){ S[s].v.gate, pg->type, pg->row_bytes, pg->n_in, pg->n_out, a, f->eg + r * fe, S[s].n, NULL, 0 };
            J[nj++] = (mm_job){ S[s].v.up, pu->type, pu->row_bytes, pu->n_in, pu->n_out, a, f->eu + r * fe, S[s].n, NULL, 0 };
        }
    }
    mm_run(f->pool, &f->kern, nj, J);
    /* per-expert biases (gpt-oss) before the activation, as experts_token adds them */
    for (int s = 0; s < ns && (ly->exp_gate_b || ly->exp_up_b); s++) {
        const size_t e = (size_t)S[s].e, r = (size_t)S[s].row;
        const float *gb = ly->exp_gate_b ? ly->exp_gate_b + e * fe : NULL;
        const float *ub = ly->exp_up_b ? ly->exp_up_b + e * fe : NULL;
        for (int i = 0; i < S[s].n && fused; i++) {
            ops_add_bias_rows(f->eg + (r + (size_t)i) * gw, gb, 1, fe);
            ops_add_bias_rows(f->eg + (r + (size_t)i) * gw + fe, ub, 1, fe);
        }
        if (!fused) ops_add_bias_rows(f->eg + r * fe, gb, S[s].n, fe), ops_add_bias_rows(f->eu + r * fe, ub, S[s].n, fe);
    }
    const bmoe_expert_part *dn = &P[BMOE_EXP_DOWN];
    hidden_job H = { f, fused, fe, mm_act_kind(dn->type) };
    run_rows(f, rows, 2 * fe, hidden_rows, &H);
    /* down: each pair's output goes straight to its row of ko */
    const bm_act u = mm_act(f->eu, &f->din);
    for (int s = 0; s < ns; s++)
        J[s] = (mm_job){ S[s].v.down, dn->type, dn->row_bytes, dn->n_in, dn->n_out, bm_act_token(&u, fe, S[s].row), f->ko,
                         S[s].n, S[s].pairs, d };
    mm_run(f->pool, &f->kern, ns, J);
    for (int s = 0; s < ns && (ly->exp_out_s || ly->exp_down_b); s++)
        for (int i = 0; i < S[s].n; i++) {
            const size_t e = (size_t)S[s].e;
            float *y = f->ko + (size_t)S[s].pairs[i] * d;
            if (ly->exp_out_s) ops_scale_rows(y, ly->exp_out_s[e], 1, d); /* gemma4's per-expert scale */
            ops_add_bias_rows(y, ly->exp_down_b ? ly->exp_down_b + e * d : NULL, 1, d);
        }
}

/* moe[t] += w[t,s] * ko[pair (t, s)] for s = 0..k-1 in order, for the pass's tokens t0 + i. */
typedef struct {
    bmoe_forward *f;
    int t0;
} combine_job;

static void combine_rows(void *ctx, int i0, int i1, int tid) {
    (void)tid;
    const combine_job *J = ctx;
    bmoe_forward *f = J->f;
    int k = f->top_k;
    size_t d = (size_t)f->d;
    for (int i = i0; i < i1; i++) {
        size_t t = (size_t)(J->t0 + i);
        float *dst = f->moe + t * d;
        for (int s = 0; s < k; s++) {
            float wt = f->w[t * (size_t)k + (size_t)s];
            const float *src = f->ko + ((size_t)i * (size_t)k + (size_t)s) * d;
            for (size_t c = 0; c < d; c++) dst[c] += wt * src[c];
        }
    }
}

static int experts_batch(bmoe_forward *f, int il, int T, char *err, size_t errlen) {
    const bmoe_model *m = f->m;
    const bmoe_layer *ly = &m->layers[il];
    int E = m->hp.n_expert, k = f->top_k, d = f->d;
    /* h once in every format the gate / up rows take: a row's quantisation depends on that row alone */
    unsigned kinds = gate_up_kinds(ly->exp_part);
    for (int kind = 0; kind < BM_ACT_COUNT; kind++)
        if (kinds & (1u << kind)) mm_quantise(f->pool, &f->kern, (bm_act_kind)kind, f->hm, T, (size_t)d, &f->xq);
    for (int t0 = 0; t0 < T; t0 += f->moe_pass) {
        int nt = T - t0 < f->moe_pass ? T - t0 : f->moe_pass, np = nt * k;
        const int32_t *ids = f->ids + (size_t)t0 * k;
        /* the pass's pairs bucketed by expert, each bucket in pair order */
        for (int e = 0; e < E; e++) f->cnt[e] = 0;
        for (int p = 0; p < np; p++) f->cnt[ids[p]]++;
        for (int e = 0, acc = 0; e < E; e++) { f->start[e] = acc; acc += f->cnt[e]; }
        for (int p = 0; p < np; p++) f->order[f->start[ids[p]]++] = p;
        for (int e = 0, acc = 0; e < E; e++) { f->start[e] = acc; acc += f->cnt[e]; }
        /* the experts in ascending id, in groups of at most MOE_GROUP_EXPERTS slices and moe_pass rows (an
         * expert with more pairs than that, possible only when a token routes it in several slots, is
         * split into slices) */
        expert_slice *S = f->slices;
        int ns = 0, rows = 0;
        for (int e = 0; e < E; e++) {
            bmoe_expert_view v = { 0 };
            for (int off = 0; off < f->cnt[e]; off += f->moe_pass) {
                int n = f->cnt[e] - off < f->moe_pass ? f->cnt[e] - off : f->moe_pass;
                if (ns == MOE_GROUP_EXPERTS || rows + n > f->moe_pass) {
                    experts_group(f, ly, S, ns, rows, t0);
                    ns = rows = 0;
                }
                if (off == 0) {
                    int rc = f->seam->experts.view(f->seam->experts.self, il, e, &v);
                    if (rc) {
                        snprintf(err, errlen, "expert source failed for layer %d expert %d", il, e);
                        return rc;
                    }
                    if ((rc = check_view(&v, ly, il, e, err, errlen))) return rc;
                }
                S[ns] = (expert_slice){ e, n, rows, f->order + f->start[e] + off, v };
                rows += n;
                ns++;
            }
        }
        if (ns) experts_group(f, ly, S, ns, rows, t0);
        combine_job C = { f, t0 };
        run_rows(f, nt, (size_t)k * (size_t)d, combine_rows, &C);
    }
    return 0;
}

/* One token (decode): its k routed experts in two pool jobs instead of three matmuls per expert, so
 * the threads share every expert's rows. Each output element is still one row's dot product, computed
 * by one thread with the same code and inputs as experts_batch would use, and moe accumulates in slot
 * order: the bits are experts_batch's.
 *
 * Work item i is row i / k of expert slot i % k: a thread's chunk walks the k experts' matrices side
 * by side, k streams from memory at once rather than one. Decode is bound by how fast the weights
 * arrive, and one core gets more bandwidth from several sequential streams than from one (see
 * docs/benchmarks.md). The order items are visited in changes no value. */
typedef struct {
    bmoe_forward *f;
    const bmoe_expert_part *P;
    int k;
    size_t fe, d;
} tok_experts_job;

static void tok_gate_up_rows(void *ctx, int i0, int i1, int tid) {
    const tok_experts_job *J = ctx;
    bmoe_forward *f = J->f;
    size_t F2 = 2 * J->fe;
    for (int i = i0; i < i1; i++) {
        size_t s = (size_t)i % (size_t)J->k, r = (size_t)i / (size_t)J->k; /* experts interleaved: see above */
        const bmoe_expert_view *v = &f->kv[s];
        const bmoe_expert_part *p;
        const uint8_t *row;
        if (v->gate_up) {
            p = &J->P[BMOE_EXP_GATE_UP];
            row = (const uint8_t *)v->gate_up + r * p->row_bytes;
        } else if (r < J->fe) {
            p = &J->P[BMOE_EXP_GATE];
            row = (const uint8_t *)v->gate + r * p->row_bytes;
        } else {
            p = &J->P[BMOE_EXP_UP];
            row = (const uint8_t *)v->up + (r - J->fe) * p->row_bytes;
        }
        float *y = &f->keg[s * F2 + r];
        const bm_act a = mm_act(f->hm, &f->xq);
        *y = f->kern.dot[p->type](row, &a, J->d);
#ifdef BMOE_FAULT_THREAD_ORDER
        if (tid > 0) *y *= 1.25f; /* fault: as in mm_rows */
#endif
    }
}

static void tok_down_rows(void *ctx, int i0, int i1, int tid) {
    const tok_experts_job *J = ctx;
    bmoe_forward *f = J->f;
    const bmoe_expert_part *p = &J->P[BMOE_EXP_DOWN];
    const bm_act all = mm_act(f->keu, &f->kxq);
    for (int i = i0; i < i1; i++) {
        size_t s = (size_t)i % (size_t)J->k, c = (size_t)i / (size_t)J->k; /* experts interleaved */
        const uint8_t *row = (const uint8_t *)f->kv[s].down + c * p->row_bytes;
        float *y = &f->keo[s * J->d + c];
        const bm_act a = bm_act_token(&all, J->fe, (int)s);
        *y = f->kern.dot[p->type](row, &a, J->fe);
#ifdef BMOE_FAULT_THREAD_ORDER
        if (tid > 0) *y *= 1.25f; /* fault: as in mm_rows */
#endif
    }
}

static int experts_token(bmoe_forward *f, int il, char *err, size_t errlen) {
    const bmoe_model *m = f->m;
    const bmoe_layer *ly = &m->layers[il];
    int k = f->top_k, d = f->d;
    size_t fe = (size_t)m->hp.n_ff_exp;
    for (int s = 0; s < k; s++) { /* the views in slot order */
        int e = f->ids[s];
        bmoe_expert_view *v = &f->kv[s];
        int rc = f->seam->experts.view(f->seam->experts.self, il, e, v);
        if (rc) {
            snprintf(err, errlen, "expert source failed for layer %d expert %d", il, e);
            return rc;
        }
        if ((rc = check_view(v, ly, il, e, err, errlen))) return rc;
    }
    tok_experts_job J = { f, ly->exp_part, k, fe, (size_t)d };
    const bmoe_expert_part *P = ly->exp_part;
    unsigned kinds = gate_up_kinds(P);
    for (int kind = 0; kind < BM_ACT_COUNT; kind++) /* the input, as each kind of row needs it */
        if (kinds & (1u << kind)) mm_quantise_rows(&f->kern, (bm_act_kind)kind, f->hm, 0, 1, (size_t)d, &f->xq);
    pool_run(f->pool, (int)((size_t)k * 2 * fe), tok_gate_up_rows, &J);
    for (int s = 0; s < k; s++) { /* per-expert biases (gpt-oss), as expert_rows adds them */
        size_t e = (size_t)f->ids[s];
        if (ly->exp_gate_b) ops_add_bias_rows(f->keg + (size_t)s * 2 * fe, ly->exp_gate_b + e * fe, 1, fe);
        if (ly->exp_up_b) ops_add_bias_rows(f->keg + (size_t)s * 2 * fe + fe, ly->exp_up_b + e * fe, 1, fe);
    }
    for (int s = 0; s < k; s++) {
        const float *g = f->keg + (size_t)s * 2 * fe;
        float *u = f->keu + (size_t)s * fe;
        act_mul(f, g, g + fe, fe, u);
    }
    mm_quantise_rows(&f->kern, mm_act_kind(P[BMOE_EXP_DOWN].type), f->keu, 0, k, fe, &f->kxq);
    pool_run(f->pool, k * d, tok_down_rows, &J);
    for (int s = 0; s < k && ly->exp_out_s; s++)
        ops_scale_rows(f->keo + (size_t)s * d, ly->exp_out_s[f->ids[s]], 1, (size_t)d);
    for (int s = 0; s < k && ly->exp_down_b; s++)
        ops_add_bias_rows(f->keo + (size_t)s * d, ly->exp_down_b + (size_t)f->ids[s] * d, 1, (size_t)d);
    for (int s = 0; s < k; s++) {
        float wt = f->w[s];
        const float *src = f->keo + (size_t)s * d;
        for (int c = 0; c < d; c++) f->moe[c] += wt * src[c];
    }
    return 0;
}

static int check_ids(bmoe_forward *f, const moe_ctx *c, bmoe_node node, char *err, size_t errlen) {
    int E = f->m->hp.n_expert;
    for (size_t i = 0; i < (size_t)c->T * f->top_k; i++)
        if (f->ids[i] < 0 || f->ids[i] >= E) {
            snprintf(err, errlen, "%s-%d: expert id %d out of range [0, %d)", bmoe_node_name(node), c->il, (int)f->ids[i], E);
            return 1;
        }
    return 0;
}

static int moe_ffn(bmoe_forward *f, const moe_ctx *c, char *err, size_t errlen) {
    const bmoe_model *m = f->m;
    const bmoe_hparams *hp = &m->hp;
    const bmoe_layer *ly = &m->layers[c->il];
    const bmoe_gating *gating = hp->gating;
    int T = c->T, E = hp->n_expert, k = f->top_k, d = f->d;
    int rc;

    /* h = rmsnorm(x) * ffn_norm; the router reads h, or (gemma4) rmsnorm(x) / sqrt(d) * ffn_gate_inp.scale */
    rmsnorm_rows(f->xn, f->x, ly->ffn_norm, T, d, hp->eps);
    if (ly->ffn_gate_inp_s) {
        float inv_sqrt_d = (float)(1.0 / sqrt((double)d));
        for (int t = 0; t < T; t++) {
            float *r = f->hm + (size_t)t * d;
            rmsnorm_plain(r, f->x + (size_t)t * d, d, hp->eps);
            for (int i = 0; i < d; i++) r[i] = (r[i] * inv_sqrt_d) * ly->ffn_gate_inp_s[i];
        }
        matmul(f, &ly->ffn_gate_inp, f->hm, T, f->rlog);
    } else {
        matmul(f, &ly->ffn_gate_inp, f->xn, T, f->rlog);
    }
    /* the router's bias (gpt-oss): the logits node holds the biased logits (llama.cpp's ffn_moe_logits_biased) */
    ops_add_bias_rows(f->rlog, ly->ffn_gate_inp_b, T, (size_t)E);
    if ((rc = emit(f, c, BMOE_NODE_LOGITS, err, errlen))) return rc;

    for (int t = 0; t < T; t++) {
        const float *l = f->rlog + (size_t)t * E;
        float *p = f->rprob + (size_t)t * E;
        memcpy(p, l, (size_t)E * sizeof(float));
        if (gating->probs == BMOE_PROBS_SOFTMAX) softmax(&f->kern, p, E);
        else if (gating->probs == BMOE_PROBS_SIGMOID)
            for (int e = 0; e < E; e++) p[e] = (float)(1.0 / (1.0 + bm_exp(-(double)p[e])));
    }
    if ((rc = emit(f, c, BMOE_NODE_PROBS, err, errlen))) return rc;

    /* the selection: probs, or probs + the selection-only bias (the weights stay the unbiased probs) */
    const float *sel = f->rprob;
    if (ly->exp_probs_b) {
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++) f->rsel[(size_t)t * E + e] = f->rprob[(size_t)t * E + e] + ly->exp_probs_b[e];
        sel = f->rsel;
    }
    for (int t = 0; t < T; t++) topk_row(sel + (size_t)t * E, E, k, f->ids + (size_t)t * k);
    f->experts_routed += (uint64_t)T * (uint64_t)k;
    if ((rc = emit(f, c, BMOE_NODE_TOPK, err, errlen))) return rc;
    if ((rc = check_ids(f, c, BMOE_NODE_TOPK, err, errlen))) return rc;

    for (int t = 0; t < T; t++)
        for (int s = 0; s < k; s++) f->w[(size_t)t * k + s] = f->rprob[(size_t)t * E + f->ids[(size_t)t * k + s]];
    if ((rc = emit(f, c, BMOE_NODE_WEIGHTS, err, errlen))) return rc;
    if (gating->weights_softmax) {
        for (int t = 0; t < T; t++) softmax(&f->kern, f->w + (size_t)t * k, k);
        if ((rc = emit(f, c, BMOE_NODE_WEIGHTS_SOFTMAX, err, errlen))) return rc;
    }
    if (hp->norm_w) {
        for (int t = 0; t < T; t++) {
            float *w = f->w + (size_t)t * k, sum = 0.0f;
            for (int s = 0; s < k; s++) sum += w[s];
            for (int s = 0; s < k; s++) w[s] /= sum;
        }
        if ((rc = emit(f, c, BMOE_NODE_WEIGHTS_NORM, err, errlen))) return rc;
    }
    if (hp->w_scale != 1.0) {
        float scale = (float)hp->w_scale;
        for (size_t i = 0; i < (size_t)T * k; i++) f->w[i] *= scale;
        if ((rc = emit(f, c, BMOE_NODE_WEIGHTS_SCALED, err, errlen))) return rc;
    }
    if ((rc = emit(f, c, BMOE_NODE_EXPERTS, err, errlen))) return rc;
    if ((rc = check_ids(f, c, BMOE_NODE_EXPERTS, err, errlen))) return rc;

    /* the routed experts read h, or their own pre-norm where the recipe has one */
    if (ly->pre_ffw_norm_2) rmsnorm_rows(f->hm, f->x, ly->pre_ffw_norm_2, T, d, hp->eps);
    else memcpy(f->hm, f->xn, (size_t)T * d * sizeof(float));
    memset(f->moe, 0, (size_t)T * d * sizeof(float));
    if (T == 1) {
        if ((rc = experts_token(f, c->il, err, errlen))) return rc;
    } else {
        if ((rc = experts_batch(f, c->il, T, err, errlen))) return rc;
    }

    /* the norm sandwich and the shared expert, each step only where the model has its tensors */
    if (ly->post_ffw_norm_2) rmsnorm_rows(f->moe, f->moe, ly->post_ffw_norm_2, T, d, hp->eps);
    if (ly->ffn_gate.t) {
        gated_ffn(f, &ly->ffn_gate, &ly->ffn_up, &ly->ffn_down, f->xn, T, f->sh);
        if (ly->ffn_gate_inp_shexp.t) { /* the shared expert's gate: sigmoid(ffn_gate_inp_shexp . h) per position */
            float gs[1];
            for (int t = 0; t < T; t++) {
                matmul(f, &ly->ffn_gate_inp_shexp, f->xn + (size_t)t * d, 1, gs);
                float gt = (float)(1.0 / (1.0 + bm_exp(-(double)gs[0])));
                for (int i = 0; i < d; i++) f->sh[(size_t)t * d + i] *= gt;
            }
        }
        if (ly->post_ffw_norm_1) rmsnorm_rows(f->sh, f->sh, ly->post_ffw_norm_1, T, d, hp->eps);
        for (size_t i = 0; i < (size_t)T * d; i++) f->moe[i] = f->sh[i] + f->moe[i];
    }
    if (ly->post_ffw_norm) rmsnorm_rows(f->moe, f->moe, ly->post_ffw_norm, T, d, hp->eps);
    for (size_t i = 0; i < (size_t)T * d; i++) f->x[i] += f->moe[i];
    return 0;
}

static void dense_ffn(bmoe_forward *f, int il, int T) {
    const bmoe_layer *ly = &f->m->layers[il];
    int d = f->d;
    rmsnorm_rows(f->xn, f->x, ly->ffn_norm, T, d, f->m->hp.eps);
    gated_ffn(f, &ly->ffn_gate, &ly->ffn_up, &ly->ffn_down, f->xn, T, f->ffn);
    if (ly->post_ffw_norm) rmsnorm_rows(f->ffn, f->ffn, ly->post_ffw_norm, T, d, f->m->hp.eps);
    for (size_t i = 0; i < (size_t)T * d; i++) f->x[i] += f->ffn[i];
}

/* ---- the whole pass ---------------------------------------------------------------------------- */

int forward_eval(bmoe_forward *f, const int32_t *tokens, int T, int pos0, int phase, int step, int all_logits,
                 float *logits, char *err, size_t errlen) {
    const bmoe_model *m = f->m;
    const bmoe_hparams *hp = &m->hp;
    int d = f->d, V = hp->n_vocab;
    err[0] = 0;
    if (T < 1 || T > f->max_batch || pos0 < 0 || pos0 > f->n_ctx - T) {
        snprintf(err, errlen, "batch of %d at position %d does not fit the context of %d (-c)", T, pos0, f->n_ctx);
        return 2;
    }
    if (rec_seek(&f->rs, pos0)) {
        snprintf(err, errlen, "internal: the recurrent state stands at position %d and cannot continue at %d",
                 f->rs.pos, pos0);
        return 1;
    }
    for (int t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= V) {
            snprintf(err, errlen, "token %d is outside the vocabulary (%d)", (int)tokens[t], V);
            return 2;
        }
        float *x = f->x + (size_t)t * d;
        row_to_f32(m->token_embd.type, m->token_embd.data + (size_t)tokens[t] * m->token_embd.row_bytes, x, (size_t)d);
        if (m->recipe->embd_scale) {
            float s = (float)sqrt((double)d);
            for (int i = 0; i < d; i++) x[i] *= s;
        }
    }
    for (int il = 0; il < hp->n_layer; il++) {
        int kind = m->layers[il].kind;
        if (kind == BMOE_LAYER_DELTA) delta_layer(f, il, T);
        else if (kind == BMOE_LAYER_CONV) conv_layer(f, il, T);
        else attention(f, il, T, pos0);
        if (m->layers[il].is_moe) {
            moe_ctx c = { il, T, phase, step, pos0 };
            int rc = moe_ffn(f, &c, err, errlen);
            if (rc) return rc;
        } else {
            dense_ffn(f, il, T);
        }
        /* gemma4's layer_output_scale: the layer's output, residual included, times a scalar */
        if (m->layers[il].out_scale != 1.0f) ops_scale_rows(f->x, m->layers[il].out_scale, T, (size_t)d);
    }
    f->rs.pos = pos0 + T;
    int t0 = all_logits ? 0 : T - 1, n = T - t0;
    rmsnorm_rows(f->xl, f->x + (size_t)t0 * d, m->output_norm, n, d, hp->eps);
    matmul(f, &m->output, f->xl, n, logits);
    if (hp->softcap > 0.0) { /* final logit soft-capping: c tanh(l / c) */
        for (size_t i = 0; i < (size_t)n * V; i++)
            logits[i] = (float)(hp->softcap * bm_tanh((double)logits[i] / hp->softcap));
    }
    return 0;
}

uint64_t forward_experts_routed(const bmoe_forward *f) { return f->experts_routed; }

int forward_mark(bmoe_forward *f) { return rec_mark(&f->rs); }

int forward_set_kernels(bmoe_forward *f, bm_kpath path) {
    if (!bm_kpath_available(path)) return 2;
    bm_kernels_get(path, &f->kern);
    return 0;
}

bm_kpath forward_kernels(const bmoe_forward *f) { return f->kern.path; }

/* ---- setup ------------------------------------------------------------------------------------ */

/* inv[j] = base^(-2j/n_rot) / freqs[j] for j < n_rot/2, times the RoPE scaling when `scaled`: linear
 * (positions times rope_scale) or YaRN's per-dimension mix (arch_ops.c). Returns the factor cos and sin
 * are multiplied by (YaRN's magnitude; 1 otherwise). */
static float rope_init(const bmoe_hparams *hp, int n_rot, double base, const float *freqs, int scaled, double *inv) {
    double lb = bm_log(base), mscale = 1.0;
    for (int j = 0; j < n_rot / 2; j++) {
        inv[j] = bm_exp(-(2.0 * j / n_rot) * lb);
        if (freqs) inv[j] /= (double)freqs[j]; /* frequency divisors (rope_freqs) */
    }
    if (!scaled || n_rot < 2) return 1.0f;
    if (hp->rope_yarn) {
        mscale = ops_yarn(n_rot, base, hp->rope_scale, hp->yarn_orig_ctx, hp->yarn_beta_fast, hp->yarn_beta_slow,
                          hp->yarn_attn_factor, inv);
    } else {
        for (int j = 0; j < n_rot / 2; j++) inv[j] *= hp->rope_scale; /* linear: (p * scale) * freq, 1 without */
    }
    return (float)mscale;
}

/* a * b * c with overflow checking; 0 on overflow */
static size_t mul3(size_t a, size_t b, size_t c) {
    if (a && b > SIZE_MAX / a) return 0;
    size_t ab = a * b;
    if (ab && c > SIZE_MAX / ab) return 0;
    return ab * c;
}

static void *alloc_f(size_t n, size_t elem, int *oom) {
    if (n == 0) n = 1;
    void *p = calloc(n, elem);
    if (!p) *oom = 1;
    return p;
}

int forward_create(bmoe_forward **out, const bmoe_model *m, bmoe_pool *pool, const bmoe_seam *seam, int n_ctx,
                   int max_batch, int top_k, char *err, size_t errlen) {
    *out = NULL;
    const bmoe_hparams *hp = &m->hp;
    if (n_ctx < 1 || max_batch < 1 || max_batch > n_ctx) {
        snprintf(err, errlen, "context %d / batch %d out of range (-c)", n_ctx, max_batch);
        return 2;
    }
    if (m->n_moe_layers > 0 && (top_k < 1 || top_k > hp->n_expert)) {
        snprintf(err, errlen, "--n-expert-used %d must be in [1, %d] for this model", top_k, hp->n_expert);
        return 2;
    }
    if (m->n_moe_layers > 0 && (!seam || !seam->experts.view)) {
        snprintf(err, errlen, "internal: no expert source");
        return 1;
    }
    bmoe_forward *f = calloc(1, sizeof *f);
    if (!f) { snprintf(err, errlen, "out of memory"); return 1; }
    f->m = m;
    f->pool = pool;
    f->seam = seam;
    f->n_ctx = n_ctx;
    f->max_batch = max_batch;
    f->top_k = m->n_moe_layers > 0 ? top_k : 0;
    f->d = hp->n_embd;
    f->k_off = calloc((size_t)hp->n_layer + 1, sizeof *f->k_off);
    f->v_off = calloc((size_t)hp->n_layer + 1, sizeof *f->v_off);
    if (!f->k_off || !f->v_off) {
        snprintf(err, errlen, "out of memory");
        forward_free(f);
        return 1;
    }
    size_t kv_total = 0, v_total = 0;
    int kv_overflow = 0;
    for (int il = 0; il < hp->n_layer; il++) { /* each layer's own rows (model.c checked each product) */
        const bmoe_layer *ly = &m->layers[il];
        f->k_off[il] = kv_total;
        f->v_off[il] = v_total;
        if (ly->kind != BMOE_LAYER_ATTN) continue; /* only attention layers keep k and v */
        int qd = ly->n_head * ly->head_dim, kvd = ly->n_head_kv * ly->head_dim;
        int vd = ly->n_head_kv * ly->head_dim_v, od = ly->n_head * ly->head_dim_v;
        if (qd > f->q_dim) f->q_dim = qd;
        if (kvd > f->kv_dim) f->kv_dim = kvd;
        if (vd > f->v_dim) f->v_dim = vd;
        if (od > f->o_dim) f->o_dim = od;
        size_t kb = mul3(1, (size_t)n_ctx, (size_t)kvd), vb = mul3(1, (size_t)n_ctx, (size_t)vd);
        if (kb == 0 || vb == 0 || kv_total > SIZE_MAX / 8 - kb || v_total > SIZE_MAX / 8 - vb) kv_overflow = 1;
        else kv_total += kb, v_total += vb;
    }
    f->ff_max = hp->n_ff > hp->n_ff_shexp ? hp->n_ff : hp->n_ff_shexp;
    size_t T = (size_t)max_batch, E = (size_t)(hp->n_expert > 0 ? hp->n_expert : 1);
    size_t K = (size_t)(f->top_k > 0 ? f->top_k : 1), fe = (size_t)hp->n_ff_exp;
    size_t kbytes = kv_total ? kv_total : 1, vbytes = v_total ? v_total : 1; /* no attention layer: unused */
    int oom = kv_overflow;
    if (!oom) {
        f->k_cache = alloc_f(kbytes, sizeof(float), &oom);
        f->v_cache = alloc_f(vbytes, sizeof(float), &oom);
    }
    if (oom) {
        snprintf(err, errlen, "cannot allocate the KV cache for %d positions (lower -c)", n_ctx);
        forward_free(f);
        return 1;
    }
    f->inv_freq = calloc((size_t)(hp->n_rot / 2 + 1), sizeof(double));
    f->inv_freq_swa = calloc((size_t)(hp->n_rot_swa / 2 + 1), sizeof(double));
    if (!f->inv_freq || !f->inv_freq_swa) oom = 1;
    else {
        f->rope_mscale = rope_init(hp, hp->n_rot, hp->rope_base, m->rope_freqs, 1, f->inv_freq);
        if (m->recipe->rope_sections) { /* interleaved M-RoPE: a pair of the extra sector stays put */
            const int *sec = hp->rope_sections;
            int dims = sec[0] + sec[1] + sec[2] + sec[3];
            for (int j = 0; j < hp->n_rot / 2; j++) {
                int st = j % dims;
                int moves = (st % 3 == 0 && st < 3 * sec[0]) || (st % 3 == 1 && st < 3 * sec[1]) ||
                            (st % 3 == 2 && st < 3 * sec[2]);
                if (!moves) f->inv_freq[j] = 0.0; /* angle 0: cos 1, sin 0, the pair passes unchanged */
            }
        }
        /* sliding-window layers: no rope_freqs; scaled as the global ones only when the recipe says so */
        f->rope_mscale_swa = rope_init(hp, hp->n_rot_swa, hp->rope_base_swa, NULL,
                                       m->recipe->swa_rope == BMOE_SWA_ROPE_GLOBAL, f->inv_freq_swa);
    }
    size_t D = (size_t)f->d;
    f->x = alloc_f(T * D, sizeof(float), &oom);
    f->xn = alloc_f(T * D, sizeof(float), &oom);
    f->hm = alloc_f(T * D, sizeof(float), &oom);
    f->xl = alloc_f(T * D, sizeof(float), &oom);
    f->q = alloc_f(T * (size_t)f->q_dim, sizeof(float), &oom);
    f->k = alloc_f(T * (size_t)f->kv_dim, sizeof(float), &oom);
    f->v = alloc_f(T * (size_t)f->v_dim, sizeof(float), &oom);
    f->att = alloc_f(T * (size_t)f->o_dim, sizeof(float), &oom);
    f->o = alloc_f(T * D, sizeof(float), &oom);
    f->ffn = alloc_f(T * D, sizeof(float), &oom);
    f->sh = alloc_f(T * D, sizeof(float), &oom);
    f->hg = alloc_f(T * (size_t)f->ff_max, sizeof(float), &oom);
    f->hu = alloc_f(T * (size_t)f->ff_max, sizeof(float), &oom);
    f->rlog = alloc_f(T * E, sizeof(float), &oom);
    f->rprob = alloc_f(T * E, sizeof(float), &oom);
    f->w = alloc_f(T * K, sizeof(float), &oom);
    f->ids = alloc_f(T * K, sizeof(int32_t), &oom);
    f->moe = alloc_f(T * D, sizeof(float), &oom);
    f->moe_pass = max_batch < MOE_PASS ? max_batch : MOE_PASS;
    size_t PS = (size_t)f->moe_pass, PK = m->n_moe_layers > 0 ? PS * K : 1;
    f->gx = alloc_f(PS * D, sizeof(float), &oom);
    f->eg = alloc_f(PS * 2 * fe, sizeof(float), &oom);
    f->eu = alloc_f(PS * fe, sizeof(float), &oom);
    f->ko = alloc_f(PK * D, sizeof(float), &oom);
    f->cnt = alloc_f(E, sizeof(int), &oom);
    f->start = alloc_f(E, sizeof(int), &oom);
    f->order = alloc_f(PK, sizeof(int), &oom);
    f->slices = alloc_f(MOE_GROUP_EXPERTS, sizeof(expert_slice), &oom);
    f->gjobs = alloc_f(2 * MOE_GROUP_EXPERTS, sizeof(mm_job), &oom);
    if (mm_qbuf_alloc(&f->gin, m->n_moe_layers > 0 ? PS : 1, D) || mm_qbuf_alloc(&f->din, m->n_moe_layers > 0 ? PS : 1, fe))
        oom = 1;
    f->scratch = alloc_f((size_t)pool_threads(pool) * 2 * (size_t)n_ctx, sizeof(float), &oom);
    /* the recurrent and gated-attention scratch */
    size_t HvS = (size_t)hp->ssm_heads * (size_t)hp->ssm_state;
    f->rin_w = (size_t)(2 * hp->ssm_groups + hp->ssm_heads) * (size_t)hp->ssm_state;
    size_t rin_cap = f->rin_w > 3 * D ? f->rin_w : 3 * D;
    if (m->recipe->attn_gate && (size_t)(2 * f->q_dim) > rin_cap) rin_cap = (size_t)(2 * f->q_dim);
    size_t rcv_cap = f->rin_w > D ? f->rin_w : D, rz_cap = HvS > D ? HvS : D;
    f->rz_w = HvS;
    int any_rec = m->rec_floats > 0 || m->recipe->attn_gate;
    f->rin = alloc_f(any_rec ? T * rin_cap : 1, sizeof(float), &oom);
    f->rcv = alloc_f(any_rec ? T * rcv_cap : 1, sizeof(float), &oom);
    f->rz = alloc_f(any_rec ? T * rz_cap : 1, sizeof(float), &oom);
    f->ro = alloc_f(T * HvS, sizeof(float), &oom);
    f->ralpha = alloc_f(T * (size_t)hp->ssm_heads, sizeof(float), &oom);
    f->rbeta = alloc_f(T * (size_t)hp->ssm_heads, sizeof(float), &oom);
    f->rtmp = alloc_f((size_t)pool_threads(pool) * (size_t)hp->ssm_state, sizeof(float), &oom);
    f->qg = alloc_f(m->recipe->attn_gate ? T * (size_t)f->q_dim : 1, sizeof(float), &oom);
    f->rsel = alloc_f(T * E, sizeof(float), &oom);
    if (m->recipe->act == BMOE_ACT_GELU_TANH && (f->gelu = alloc_f(BM_GELU_TAB, sizeof(float), &oom)))
        bm_gelu_f16_table(f->gelu);
    if (rec_state_init(&f->rs, m->rec_floats)) oom = 1;
    size_t in_max = D;
    if (HvS > in_max) in_max = HvS;
    if ((size_t)f->o_dim > in_max) in_max = (size_t)f->o_dim;
    if ((size_t)f->ff_max > in_max) in_max = (size_t)f->ff_max;
    if (fe > in_max) in_max = fe;
    f->in_max = in_max;
    if (mm_qbuf_alloc(&f->xq, T, in_max)) oom = 1;
    f->keg = alloc_f(K * 2 * fe, sizeof(float), &oom);
    f->keu = alloc_f(K * fe, sizeof(float), &oom);
    f->keo = alloc_f(K * D, sizeof(float), &oom);
    if (mm_qbuf_alloc(&f->kxq, K, fe)) oom = 1;
    f->kv = alloc_f(K, sizeof(bmoe_expert_view), &oom);
    bm_kernels_get(bm_kpath_best(), &f->kern);
    if (oom) {
        snprintf(err, errlen, "out of memory for a batch of %d positions", max_batch);
        forward_free(f);
        return 1;
    }
    *out = f;
    return 0;
}

void forward_free(bmoe_forward *f) {
    if (!f) return;
    free(f->k_cache); free(f->v_cache); free(f->k_off); free(f->v_off); free(f->inv_freq); free(f->inv_freq_swa);
    free(f->x); free(f->xn); free(f->hm); free(f->xl); free(f->q); free(f->k); free(f->v); free(f->att);
    free(f->o); free(f->ffn); free(f->sh); free(f->hg); free(f->hu);
    free(f->rlog); free(f->rprob); free(f->w); free(f->ids);
    free(f->moe); free(f->gx); free(f->eg); free(f->eu); free(f->ko);
    mm_qbuf_free(&f->gin); mm_qbuf_free(&f->din); mm_qbuf_free(&f->xq); mm_qbuf_free(&f->kxq);
    free(f->cnt); free(f->start); free(f->order); free(f->slices); free(f->gjobs); free(f->scratch);
    free(f->keg); free(f->keu); free(f->keo); free(f->kv);
    free(f->qg); free(f->rin); free(f->rcv); free(f->rz); free(f->ro); free(f->ralpha); free(f->rbeta); free(f->rtmp);
    free(f->rsel); free(f->gelu);
    rec_state_free(&f->rs);
    free(f);
}
