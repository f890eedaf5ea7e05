/* The forward pass on a tiny model written by this test: hook order and contents, determinism over
 * thread counts, batch rows equal to single-token rows, hook edits and aborts, top-k tie-breaking,
 * and model loading refusals (shape, type agreement, missing keys). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "engine.h"
#include "expert_resident.h"
#include "forward.h"
#include "gguf.h"
#include "model.h"
#include "tensor.h"
#include "threads.h"

/* ---- an in-memory GGUF v3 writer ---- */
typedef struct { uint8_t *b; size_t n, cap; } buf;
static void put(buf *o, const void *p, size_t n) {
    if (o->n + n > o->cap) { o->cap = (o->n + n) * 2 + 64; o->b = realloc(o->b, o->cap); }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void u32(buf *o, uint32_t v) { uint8_t b[4]; for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> 8 * i); put(o, b, 4); }
static void u64(buf *o, uint64_t v) { uint8_t b[8]; for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> 8 * i); put(o, b, 8); }
static void str(buf *o, const char *s) { u64(o, strlen(s)); put(o, s, strlen(s)); }

typedef struct { buf kv, ti, data; uint64_t n_kv, n_t; } gb;
static void kv_u32(gb *g, const char *k, uint32_t v) { str(&g->kv, k); u32(&g->kv, 4); u32(&g->kv, v); g->n_kv++; }
static void kv_f32(gb *g, const char *k, float v) { uint32_t u; memcpy(&u, &v, 4); str(&g->kv, k); u32(&g->kv, 6); u32(&g->kv, u); g->n_kv++; }
static void kv_bool(gb *g, const char *k, int v) { uint8_t b = (uint8_t)v; str(&g->kv, k); u32(&g->kv, 7); put(&g->kv, &b, 1); g->n_kv++; }
static void kv_str(gb *g, const char *k, const char *v) { str(&g->kv, k); u32(&g->kv, 8); str(&g->kv, v); g->n_kv++; }
static void kv_vocab(gb *g, int n) {
    str(&g->kv, "tokenizer.ggml.tokens"); u32(&g->kv, 9); u32(&g->kv, 8); u64(&g->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) { char s[2] = { (char)('A' + i), 0 }; str(&g->kv, s); }
    g->n_kv++;
}

static uint64_t rs = 12345;
static float frand(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* A tensor of random values (scale s; 1-D vectors around 1), F32 or Q8_0. ne[0] first. */
static void tensor(gb *g, const char *name, int nd, uint64_t e0, uint64_t e1, uint64_t e2, float s, uint32_t type) {
    uint64_t ne[3] = { e0, e1, e2 }, n = e0 * e1 * e2;
    while (g->data.n % 32) { uint8_t z = 0; put(&g->data, &z, 1); }
    str(&g->ti, name); u32(&g->ti, (uint32_t)nd);
    for (int i = 0; i < nd; i++) u64(&g->ti, ne[i]);
    u32(&g->ti, type); u64(&g->ti, g->data.n);
    g->n_t++;
    if (type == GGML_TYPE_Q8_0) {
        for (uint64_t b = 0; b < n / 32; b++) {
            uint16_t sc = bm_f32_to_f16(s / 100.0f);
            uint8_t h[2] = { (uint8_t)sc, (uint8_t)(sc >> 8) };
            put(&g->data, h, 2);
            for (int i = 0; i < 32; i++) { int8_t q = (int8_t)(frand() * 100); put(&g->data, &q, 1); }
        }
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        float v = nd == 1 ? 1.0f + 0.1f * frand() : s * frand();
        put(&g->data, &v, 4);
    }
}

static int write_file(gb *g, const char *path) {
    buf o = {0};
    put(&o, "GGUF", 4); u32(&o, 3); u64(&o, g->n_t); u64(&o, g->n_kv);
    put(&o, g->kv.b, g->kv.n);
    put(&o, g->ti.b, g->ti.n);
    while (o.n % 32) { uint8_t z = 0; put(&o, &z, 1); }
    put(&o, g->data.b, g->data.n);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(o.b, 1, o.n, f) == o.n;
    if (f) fclose(f);
    free(o.b); free(g->kv.b); free(g->ti.b); free(g->data.b);
    return ok ? 0 : -1;
}

enum { D = 32, H = 4, HKV = 2, HD = 8, E = 4, K = 2, F = 32, V = 20, L = 2 };

typedef struct {
    int gating, norm_set, norm, bad_shape, bad_type, no_eps; /* bad_type: layer 1's up experts in another type */
    float scale;
    uint32_t exp_type;
    int dots1;                  /* arch dots1: a shared expert ffn_*_shexp of F x 1, gating keys read */
} variant;

static void build(const char *path, variant v) {
    gb g = {0};
    char n[96], key[96];
    const char *arch = v.dots1 ? "dots1" : "qwen3moe";
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    kv_str(&g, "general.architecture", arch);
    kv_u32(&g, KEY("block_count"), L);
    kv_u32(&g, KEY("context_length"), 64);
    kv_u32(&g, KEY("embedding_length"), D);
    kv_u32(&g, KEY("attention.head_count"), H);
    kv_u32(&g, KEY("attention.head_count_kv"), HKV);
    kv_u32(&g, KEY("attention.key_length"), HD);
    if (!v.no_eps) kv_f32(&g, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    kv_u32(&g, KEY("expert_count"), E);
    kv_u32(&g, KEY("expert_used_count"), K);
    kv_u32(&g, KEY("expert_feed_forward_length"), F);
    if (v.gating) kv_u32(&g, KEY("expert_gating_func"), (uint32_t)v.gating);
    if (v.norm_set) kv_bool(&g, KEY("expert_weights_norm"), v.norm);
    if (v.scale != 0) kv_f32(&g, KEY("expert_weights_scale"), v.scale);
    if (v.dots1) kv_u32(&g, KEY("expert_shared_count"), 1);
#undef KEY
    kv_vocab(&g, V);
    tensor(&g, "token_embd.weight", 2, D, V, 1, 1.0f, GGML_TYPE_F32);
    tensor(&g, "output_norm.weight", 1, D, 1, 1, 1, GGML_TYPE_F32);
    if (v.dots1) tensor(&g, "output.weight", 2, D, V, 1, 1.0f, GGML_TYPE_F32); /* dots1 never ties */
    for (int il = 0; il < L; il++) {
#define T(name, nd, a, b, c, s, ty) do { snprintf(n, sizeof n, "blk.%d." name ".weight", il); tensor(&g, n, nd, a, b, c, s, ty); } while (0)
        T("attn_norm", 1, D, 1, 1, 1, GGML_TYPE_F32);
        T("attn_q", 2, D, H * HD, 1, 0.3f, GGML_TYPE_F32);
        T("attn_k", 2, D, HKV * HD, 1, 0.3f, GGML_TYPE_F32);
        T("attn_v", 2, D, HKV * HD, 1, 0.3f, GGML_TYPE_F32);
        T("attn_output", 2, H * HD, D, 1, 0.3f, GGML_TYPE_F32);
        T("attn_q_norm", 1, HD, 1, 1, 1, GGML_TYPE_F32);
        T("attn_k_norm", 1, HD, 1, 1, 1, GGML_TYPE_F32);
        T("ffn_norm", 1, D, 1, 1, 1, GGML_TYPE_F32);
        T("ffn_gate_inp", 2, D, E, 1, 1.0f, GGML_TYPE_F32);
        uint32_t et = v.exp_type;
        T("ffn_gate_exps", 3, D, F, E, 0.3f, et);
        T("ffn_up_exps", 3, D, (v.bad_shape && il == 1) ? F + 32 : F, E, 0.3f,
          (v.bad_type && il == 1) ? (et == GGML_TYPE_F32 ? GGML_TYPE_Q8_0 : GGML_TYPE_F32) : et);
        T("ffn_down_exps", 3, F, D, E, 0.3f, et);
        if (v.dots1) {
            T("ffn_gate_shexp", 2, D, F, 1, 0.3f, GGML_TYPE_F32);
            T("ffn_up_shexp", 2, D, F, 1, 0.3f, GGML_TYPE_F32);
            T("ffn_down_shexp", 2, F, D, 1, 0.3f, GGML_TYPE_F32);
        }
#undef T
    }
    CHECK(write_file(&g, path) == 0);
}

/* ---- a hook that records and optionally edits ---- */
typedef struct {
    int n;
    int node[256], layer[256], ntok[256], ncols[256];
    int scores_ok, probs_flag;
    int abort_layer, abort_code;   /* return abort_code at TOPK of abort_layer (-1: never) */
    int force_expert;              /* >= 0: rewrite every id at TOPK */
    int bad_id;                    /* write an out-of-range id at WEIGHTS */
    double wsum_last;              /* sum of the final weights of the last EXPERTS node, row 0 */
} rec;

static int hook(void *user, bmoe_moe_result *r) {
    rec *h = user;
    if (h->n < 256) { h->node[h->n] = r->node; h->layer[h->n] = r->layer; h->ntok[h->n] = r->n_tokens; h->ncols[h->n] = r->n_cols; h->n++; }
    if (r->node == BMOE_NODE_TOPK) {
        h->scores_ok = r->scores != NULL && r->ids != NULL && r->f32 == NULL;
        h->probs_flag = r->scores_are_probs;
        if (h->abort_layer == r->layer) return h->abort_code;
        if (h->force_expert >= 0)
            for (int i = 0; i < r->n_tokens * r->n_cols; i++) r->ids[i] = h->force_expert;
    }
    if (r->node == BMOE_NODE_WEIGHTS && h->bad_id) r->ids[0] = 99;
    if (r->node == BMOE_NODE_EXPERTS) {
        h->wsum_last = 0;
        for (int s = 0; s < r->n_cols; s++) h->wsum_last += r->weights[s];
    }
    return 0;
}

/* ---- an expert source that counts and forwards to the resident one ---- */
typedef struct { bmoe_expert_source inner; int calls[E]; } counting;
static int counting_view(void *self, int il, int e, bmoe_expert_view *out) {
    counting *c = self;
    if (e >= 0 && e < E) c->calls[e]++;
    return c->inner.view(c->inner.self, il, e, out);
}

static void test_topk(void) {
    int32_t ids[5];
    const float p[5] = { 0.5f, 0.7f, 0.7f, 0.1f, 0.7f };
    topk_row(p, 5, 3, ids);
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4);
    topk_row(p, 5, 5, ids);
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4 && ids[3] == 0 && ids[4] == 3);
    const float q[4] = { NAN, 1.0f, NAN, 2.0f };
    topk_row(q, 4, 3, ids);
    CHECK(ids[0] == 3 && ids[1] == 1 && ids[2] == 0); /* NaN never beats a number; then lowest id */
    const float z[4] = { 0, 0, 0, 0 };
    topk_row(z, 4, 4, ids);
    CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2 && ids[3] == 3);
    const float a[5] = { 1, 3, 3, 2, 3 };
    CHECK(argmax_first(a, 5) == 1);
    const float b[3] = { NAN, -1, -1 };
    CHECK(argmax_first(b, 3) == 1);
}

/* Runs prefill of `toks` (all logits) then `extra` decode steps; fills out [(T+extra), V]. */
static int run(const char *path, int threads, rec *h, counting *cs, const int32_t *toks, int T, int extra, float *out,
               uint64_t *routed) {
    bmoe_model *m = NULL;
    char err[512] = "";
    int rc = model_open(path, 1, &m, err, sizeof err);
    if (rc) { fprintf(stderr, "model_open: %s\n", err); return rc; }
    bmoe_pool *pool = pool_create(threads);
    bmoe_resident res;
    bmoe_seam seam = { 0 };
    seam.experts = resident_source(&res, m);
    if (cs) { cs->inner = seam.experts; seam.experts.self = cs; seam.experts.view = counting_view; }
    if (h) { seam.hook = hook; seam.hook_user = h; }
    bmoe_forward *f = NULL;
    rc = forward_create(&f, m, pool, &seam, 64, T, K, err, sizeof err);
    if (!rc) rc = forward_eval(f, toks, T, 0, 0, 0, 1, out, err, sizeof err);
    int32_t tok = toks[T - 1];
    for (int s = 0; !rc && s < extra; s++) {
        tok = (tok * 7 + 3) % V;
        rc = forward_eval(f, &tok, 1, T + s, 1, s, 0, out + (size_t)(T + s) * V, err, sizeof err);
    }
    if (routed && f) *routed = forward_experts_routed(f);
    forward_free(f);
    pool_destroy(pool);
    model_close(m);
    return rc;
}

static void test_forward(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/fwd.gguf", dir);
    build(path, (variant){ .exp_type = GGML_TYPE_F32 });
    const int32_t toks[6] = { 3, 1, 4, 1, 5, 9 };
    enum { T = 6, X = 4 };
    static float a[(T + X) * V], b[(T + X) * V], c[(T + X) * V];

    /* hook order and contents */
    rec h = { .abort_layer = -1, .force_expert = -1 };
    uint64_t routed = 0;
    CHECK(run(path, 1, &h, NULL, toks, T, 0, a, &routed) == 0);
    static const int want[] = { BMOE_NODE_LOGITS, BMOE_NODE_PROBS, BMOE_NODE_TOPK, BMOE_NODE_WEIGHTS,
                                BMOE_NODE_WEIGHTS_NORM, BMOE_NODE_EXPERTS };
    CHECK(h.n == 2 * 6);
    int order_ok = 1;
    for (int i = 0; i < h.n && i < 12; i++)
        order_ok &= h.node[i] == want[i % 6] && h.layer[i] == i / 6 && h.ntok[i] == T && h.ncols[i] == (i % 6 < 2 ? E : K);
    CHECK(order_ok);
    CHECK(h.scores_ok && h.probs_flag == 1);
    CHECK(h.wsum_last > 0.999 && h.wsum_last < 1.001); /* normalised */
    CHECK(routed == (uint64_t)T * K * L);

    /* thread counts: identical bits */
    CHECK(run(path, 1, NULL, NULL, toks, T, X, a, NULL) == 0);
    CHECK(run(path, 3, NULL, NULL, toks, T, X, b, NULL) == 0);
    CHECK(memcmp(a, b, sizeof a) == 0);

    /* a batch row equals the same position run alone, bit for bit */
    {
        bmoe_model *m = NULL;
        char err[256];
        CHECK(model_open(path, 1, &m, err, sizeof err) == 0);
        bmoe_pool *pool = pool_create(2);
        bmoe_resident res;
        bmoe_seam seam = { 0 };
        seam.experts = resident_source(&res, m);
        bmoe_forward *f = NULL;
        CHECK(forward_create(&f, m, pool, &seam, 64, 1, K, err, sizeof err) == 0);
        for (int t = 0; t < T; t++) CHECK(forward_eval(f, &toks[t], 1, t, 1, t, 0, c + (size_t)t * V, err, sizeof err) == 0);
        CHECK(memcmp(a, c, (size_t)T * V * sizeof(float)) == 0);
        /* out-of-range requests are errors, not crashes */
        int32_t badtok = V;
        CHECK(forward_eval(f, &badtok, 1, T, 1, 0, 0, c, err, sizeof err) == 2);
        CHECK(forward_eval(f, toks, 1, 64, 1, 0, 0, c, err, sizeof err) == 2);
        CHECK(forward_eval(f, toks, 2, 0, 1, 0, 0, c, err, sizeof err) == 2); /* beyond max_batch */
        forward_free(f);
        pool_destroy(pool);
        model_close(m);
    }

    /* a hook abort stops the pass with its code */
    rec ab = { .abort_layer = 1, .abort_code = 7, .force_expert = -1 };
    CHECK(run(path, 1, &ab, NULL, toks, T, 0, c, NULL) == 7);
    /* an out-of-range id from a hook is an internal error */
    rec bad = { .abort_layer = -1, .force_expert = -1, .bad_id = 1 };
    CHECK(run(path, 1, &bad, NULL, toks, T, 0, c, NULL) == 1);
    /* edits at TOPK are what the experts read: force expert 2 everywhere */
    rec fe = { .abort_layer = -1, .force_expert = 2 };
    counting cs = { 0 };
    CHECK(run(path, 2, &fe, &cs, toks, T, 0, c, NULL) == 0);
    CHECK(cs.calls[0] == 0 && cs.calls[1] == 0 && cs.calls[3] == 0 && cs.calls[2] == L); /* once per layer: the batch's pairs grouped by expert */
    CHECK(memcmp(a, c, (size_t)T * V * sizeof(float)) != 0);
    unlink(path);
}

static void test_gating_variants(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/gate3.gguf", dir);
    build(path, (variant){ .gating = 3, .norm_set = 1, .norm = 0, .scale = 2.0f, .exp_type = GGML_TYPE_Q8_0, .dots1 = 1 });
    const int32_t toks[2] = { 2, 7 };
    static float o[2 * V];
    rec h = { .abort_layer = -1, .force_expert = -1 };
    CHECK(run(path, 2, &h, NULL, toks, 2, 0, o, NULL) == 0);
    static const int want[] = { BMOE_NODE_LOGITS, BMOE_NODE_PROBS, BMOE_NODE_TOPK, BMOE_NODE_WEIGHTS,
                                BMOE_NODE_WEIGHTS_SOFTMAX, BMOE_NODE_WEIGHTS_SCALED, BMOE_NODE_EXPERTS };
    int ok = h.n == 14;
    for (int i = 0; i < h.n && i < 14; i++) ok &= h.node[i] == want[i % 7];
    CHECK(ok);
    CHECK(h.probs_flag == 0);
    CHECK(h.wsum_last > 1.999 && h.wsum_last < 2.001); /* softmax sums to 1, then x2 */
    unlink(path);

    snprintf(path, sizeof path, "%s/gate2.gguf", dir);
    build(path, (variant){ .gating = 2, .norm_set = 1, .norm = 1, .exp_type = GGML_TYPE_F32, .dots1 = 1 });
    rec h2 = { .abort_layer = -1, .force_expert = -1 };
    CHECK(run(path, 1, &h2, NULL, toks, 2, 0, o, NULL) == 0);
    CHECK(h2.n == 12 && h2.node[4] == BMOE_NODE_WEIGHTS_NORM && h2.probs_flag == 0);
    unlink(path);
}

static void test_refusals(const char *dir) {
    char path[512], err[512];
    bmoe_model *m = NULL;
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    build(path, (variant){ .bad_shape = 1, .exp_type = GGML_TYPE_F32 });
    CHECK(model_open(path, 1, &m, err, sizeof err) == 3 && m == NULL);
    CHECK(strstr(err, "bad.gguf: blk.1.ffn_up_exps.weight: shape [32,64,4] but expected [32,32,4]") != NULL);
    /* each expert tensor its own type (llama.cpp's mixes): layer 1's up projection in another type loads,
     * and that layer's expert bytes are its own */
    build(path, (variant){ .bad_type = 1, .exp_type = GGML_TYPE_F32 });
    CHECK(model_open(path, 1, &m, err, sizeof err) == 0);
    if (m) {
        CHECK(m->layers[0].exp_part[BMOE_EXP_UP].type == GGML_TYPE_F32 &&
              m->layers[1].exp_part[BMOE_EXP_UP].type == GGML_TYPE_Q8_0);
        CHECK(m->layers[0].expert_bytes == 3 * (uint64_t)D * F * 4);
        CHECK(m->layers[1].expert_bytes == 2 * (uint64_t)D * F * 4 + (uint64_t)(D / 32) * 34 * F);
        model_close(m);
        m = NULL;
    }
    build(path, (variant){ .no_eps = 1, .exp_type = GGML_TYPE_F32 });
    CHECK(model_open(path, 1, &m, err, sizeof err) == 3);
    CHECK(strstr(err, "qwen3moe.attention.layer_norm_rms_epsilon") != NULL);
    build(path, (variant){ .gating = 9, .exp_type = GGML_TYPE_F32, .dots1 = 1 });
    CHECK(model_open(path, 1, &m, err, sizeof err) == 3);
    CHECK(strstr(err, "expert_gating_func") != NULL);
    /* qwen3moe: llama.cpp always routes softmax, normalised, unscaled: contrary keys are refused */
    build(path, (variant){ .gating = 1, .norm_set = 1, .norm = 0, .exp_type = GGML_TYPE_F32 });
    CHECK(model_open(path, 1, &m, err, sizeof err) == 3);
    CHECK(strstr(err, "qwen3moe.expert_weights_norm = false") != NULL && strstr(err, "dots1") != NULL);
    build(path, (variant){ .gating = 2, .exp_type = GGML_TYPE_F32 });
    CHECK(model_open(path, 1, &m, err, sizeof err) == 3 && strstr(err, "qwen3moe.expert_gating_func = 2") != NULL);
    build(path, (variant){ .scale = 2.0f, .exp_type = GGML_TYPE_F32 });
    CHECK(model_open(path, 1, &m, err, sizeof err) == 3 && strstr(err, "qwen3moe.expert_weights_scale = 2") != NULL);
    build(path, (variant){ .gating = 1, .norm_set = 1, .norm = 1, .scale = 1.0f, .exp_type = GGML_TYPE_F32 });
    CHECK(model_open(path, 1, &m, err, sizeof err) == 0); /* keys that agree are fine */
    model_close(m);
    m = NULL;
    /* dots1: the gating key is required (llama.cpp has no default), the shared expert is bound */
    build(path, (variant){ .exp_type = GGML_TYPE_F32, .dots1 = 1 });
    CHECK(model_open(path, 1, &m, err, sizeof err) == 3 && strstr(err, "dots1.expert_gating_func is missing") != NULL);
    build(path, (variant){ .gating = 1, .exp_type = GGML_TYPE_F32, .dots1 = 1 });
    CHECK(model_open(path, 1, &m, err, sizeof err) == 0);
    if (m) {
        CHECK(m->hp.norm_w == 0 && m->hp.n_ff_shexp == F && m->layers[1].ffn_down.t != NULL);
        model_close(m);
        m = NULL;
    }
    unlink(path);
    snprintf(path, sizeof path, "%s/does-not-exist.gguf", dir);
    CHECK(model_open(path, 1, &m, err, sizeof err) == 3);

    /* the expert layout of a good model */
    snprintf(path, sizeof path, "%s/good.gguf", dir);
    build(path, (variant){ .exp_type = GGML_TYPE_Q8_0 });
    CHECK(model_open(path, 0, &m, err, sizeof err) == 0);
    if (m) {
        const bmoe_expert_part *p = &m->layers[1].exp_part[BMOE_EXP_DOWN];
        CHECK(p->present && p->stride == (uint64_t)(F / 32) * 34 * D && p->bytes == p->stride);
        CHECK(m->layers[0].expert_bytes == 3 * (uint64_t)(D / 32) * 34 * F && m->layers[1].expert_bytes == m->layers[0].expert_bytes);
        CHECK(!m->layers[1].exp_part[BMOE_EXP_GATE_UP].present);
        CHECK(m->n_moe_layers == L && m->moe_layers[1] == 1);
        model_close(m);
    }
    unlink(path);
}

/* The whole engine: -t 1, -t 2 and -t 3 give the same tokens and the same --logits-out bytes, and a
 * second fresh instance repeats the first. */
static int engine_once(const char *model, const char *logits, int threads, int32_t *toks, int *n_toks) {
    bmoe_config c;
    config_defaults(&c);
    int32_t *prompt = malloc(3 * sizeof *prompt);
    prompt[0] = 5; prompt[1] = 2; prompt[2] = 11;
    c.model = model;
    c.prompt_tokens = prompt;
    c.n_prompt_tokens = 3;
    c.n_predict = 8;
    c.threads = threads;
    c.mmap = 1;
    c.logits_out = logits;
    bmoe_engine *e = NULL;
    bmoe_error err = { 0 };
    int rc = engine_open(&c, &e, &err);
    if (!rc) rc = engine_generate(e, &err);
    if (rc) fprintf(stderr, "engine: %s\n", err.msg);
    if (!rc) {
        const bmoe_result *r = engine_result(e);
        *n_toks = r->n_tokens;
        memcpy(toks, r->tokens, (size_t)r->n_tokens * sizeof *toks);
        CHECK(r->counters.experts_routed == (uint64_t)(3 + r->n_tokens - 1) * K * L);
        CHECK(r->top_k_effective == K && r->config->ctx == 64);
    }
    engine_close(e);
    config_free(&c);
    return rc;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc(1 << 16);
    *n = fread(b, 1, 1 << 16, f);
    fclose(f);
    return b;
}

static void test_engine_threads(const char *dir) {
    char model[512], l[3][512];
    snprintf(model, sizeof model, "%s/eng.gguf", dir);
    build(model, (variant){ .exp_type = GGML_TYPE_Q8_0 });
    int32_t toks[4][16];
    int n[4] = { 0 };
    for (int i = 0; i < 3; i++) {
        snprintf(l[i], sizeof l[i], "%s/logits%d.f32", dir, i);
        CHECK(engine_once(model, l[i], i + 1, toks[i], &n[i]) == 0);
    }
    CHECK(engine_once(model, l[0], 1, toks[3], &n[3]) == 0);
    size_t s0 = 0, s;
    char *b0 = slurp(l[0], &s0);
    CHECK(b0 && s0 == (size_t)(3 + n[0] - 1) * V * sizeof(float));
    for (int i = 1; i < 4; i++) {
        CHECK(n[i] == n[0] && memcmp(toks[i], toks[0], (size_t)n[0] * sizeof(int32_t)) == 0);
        if (i < 3) {
            char *b = slurp(l[i], &s);
            CHECK(b && s == s0 && memcmp(b, b0, s0) == 0);
            free(b);
        }
    }
    free(b0);
    /* streaming (the default without --mmap): a model that cannot be opened is an I/O error */
    bmoe_config c;
    config_defaults(&c);
    c.model = "/nonexistent.gguf";
    c.prompt = "x";
    bmoe_engine *e = NULL;
    bmoe_error err = { 0 };
    CHECK(engine_open(&c, &e, &err) == 3 && e == NULL && strstr(err.msg, "/nonexistent.gguf") != NULL);
    for (int i = 0; i < 3; i++) unlink(l[i]);
    unlink(model);
}

/* A prompt longer than one pass of the grouped experts (forward.c, MOE_PASS = 512 tokens): its rows
 * still equal the same positions run one at a time, bit for bit, and with every slot of every token
 * forced to one expert (so that expert's rows of a pass, 2 x 512, are more than one gather holds) too;
 * each pass views the forced expert once. */
static void nop_rows(void *ctx, int i0, int i1, int tid) {
    int *hit = ctx;
    (void)tid;
    for (int i = i0; i < i1; i++) hit[i]++;
}

/* pool_jobs counts the jobs handed to workers: one per pool_run with work and more than one thread. */
static void test_pool_jobs(void) {
    int hit[100] = { 0 };
    bmoe_pool *one = pool_create(1), *two = pool_create(2);
    CHECK(one && two && pool_jobs(one) == 0 && pool_jobs(two) == 0);
    for (int r = 0; r < 3; r++) { pool_run(one, 100, nop_rows, hit); pool_run(two, 100, nop_rows, hit); }
    pool_run(two, 0, nop_rows, hit);
    CHECK(pool_jobs(one) == 0 && pool_jobs(two) == 3);
    for (int i = 0; i < 100; i++) CHECK(hit[i] == 6);
    pool_destroy(one);
    pool_destroy(two);
}

static void test_long_batch(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/long.gguf", dir);
    build(path, (variant){ .exp_type = GGML_TYPE_Q8_0 });
    enum { NT = 600, CTX = 640 };
    static int32_t toks[NT];
    static float a[NT * V], b[NT * V];
    for (int t = 0; t < NT; t++) toks[t] = (int32_t)((t * 7 + t / 5) % V);
    for (int forced = 0; forced < 2; forced++) {
        bmoe_model *m = NULL;
        char err[512] = "";
        CHECK(model_open(path, 1, &m, err, sizeof err) == 0);
        bmoe_pool *pool = pool_create(2);
        bmoe_resident res;
        counting cs = { 0 };
        rec h = { .abort_layer = -1, .force_expert = forced ? 2 : -1 };
        bmoe_seam seam = { 0 };
        cs.inner = resident_source(&res, m);
        seam.experts.self = &cs;
        seam.experts.view = counting_view;
        seam.hook = hook;
        seam.hook_user = &h;
        bmoe_forward *f = NULL, *g = NULL;
        CHECK(forward_create(&f, m, pool, &seam, CTX, NT, K, err, sizeof err) == 0);
        unsigned long j0 = pool_jobs(pool);
        CHECK(forward_eval(f, toks, NT, 0, 0, 0, 1, a, err, sizeof err) == 0);
        unsigned long jobs = pool_jobs(pool) - j0;
        CHECK(jobs > 0);
        if (!forced) fprintf(stderr, "prefill of %d tokens, 2 threads: %lu pool jobs (barriers), %.3f per token\n", NT,
                             jobs, (double)jobs / NT);
        if (!forced) {
            /* the count is a property of the model, prompt and split, not of the run: the same again */
            bmoe_forward *f2 = NULL;
            CHECK(forward_create(&f2, m, pool, &seam, CTX, NT, K, err, sizeof err) == 0);
            j0 = pool_jobs(pool);
            CHECK(forward_eval(f2, toks, NT, 0, 0, 0, 1, b, err, sizeof err) == 0);
            CHECK(pool_jobs(pool) - j0 == jobs);
            CHECK(memcmp(a, b, sizeof a) == 0);
            forward_free(f2);
        }
        if (forced) CHECK(cs.calls[2] == 2 * L && cs.calls[0] == 0 && cs.calls[1] == 0 && cs.calls[3] == 0);
        CHECK(forward_create(&g, m, pool, &seam, CTX, 1, K, err, sizeof err) == 0);
        for (int t = 0; t < NT; t++) CHECK(forward_eval(g, &toks[t], 1, t, 1, t, 0, b + (size_t)t * V, err, sizeof err) == 0);
        CHECK(memcmp(a, b, sizeof a) == 0);
        forward_free(f);
        forward_free(g);
        pool_destroy(pool);
        model_close(m);
    }
    unlink(path);
}

int main(void) {
    char dir[] = "/tmp/bmoe_test_forward_XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    test_topk();
    test_forward(dir);
    test_pool_jobs();
    test_long_batch(dir);
    test_gating_variants(dir);
    test_refusals(dir);
    test_engine_threads(dir);
    rmdir(dir);
    return check_report("test_forward");
}
