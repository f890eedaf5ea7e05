/* The hybrid architectures' forward pass on tiny models written by this test (docs/model-math.md,
 * "Hybrid architectures"): the same bits for any thread count, prefill rows equal to single rows,
 * the recurrent state reset by a new context and restored from a mark, a skipped position refused,
 * the selection-only bias at the seam, and the loader's refusals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "expert_resident.h"
#include "forward.h"
#include "gguf_build.h"
#include "model.h"
#include "threads.h"

enum { D = 32, H = 4, HKV = 2, HD = 8, E = 4, K = 2, F = 32, V = 20, L = 4, TAPS = 3 };

typedef struct {
    int kv_scalar;      /* head_count_kv written once (every layer attention) instead of per layer */
    int kv_mixed;       /* two attention layers with different KV head counts (refused) */
    int no_bias;        /* no exp_probs_b (refused: lfm2moe's MoE layers need it) */
    int no_gating;      /* no expert_gating_func (refused: required) */
} lfm2_variant;

/* lfm2moe: layers conv, attention, conv, conv; layer 0 dense; sigmoid routing with a selection bias */
static void build_lfm2(const char *path, lfm2_variant v) {
    gguf_build g = { .rng = 4242 };
    char n[96];
    gb_kv_str(&g, "general.architecture", "lfm2moe");
    gb_kv_u32(&g, "lfm2moe.block_count", L);
    gb_kv_u32(&g, "lfm2moe.context_length", 64);
    gb_kv_u32(&g, "lfm2moe.embedding_length", D);
    gb_kv_u32(&g, "lfm2moe.feed_forward_length", F);
    gb_kv_u32(&g, "lfm2moe.attention.head_count", H);
    const uint32_t kv[L] = { 0, HKV, 0, v.kv_mixed ? 1 : 0 };
    const int attn[L] = { v.kv_scalar, 1, v.kv_scalar, v.kv_scalar || v.kv_mixed };
    if (v.kv_scalar) gb_kv_u32(&g, "lfm2moe.attention.head_count_kv", HKV);
    else gb_kv_u32s(&g, "lfm2moe.attention.head_count_kv", kv, L);
    gb_kv_f32(&g, "lfm2moe.attention.layer_norm_rms_epsilon", 1e-5f);
    gb_kv_u32(&g, "lfm2moe.shortconv.l_cache", TAPS);
    gb_kv_u32(&g, "lfm2moe.expert_count", E);
    gb_kv_u32(&g, "lfm2moe.expert_used_count", K);
    gb_kv_u32(&g, "lfm2moe.expert_feed_forward_length", F);
    gb_kv_u32(&g, "lfm2moe.leading_dense_block_count", 1);
    if (!v.no_gating) gb_kv_u32(&g, "lfm2moe.expert_gating_func", 2);
    gb_kv_vocab(&g, V);
    gb_tensor(&g, "token_embd.weight", 2, D, V, 1, 0.0f, 1.0f);
    gb_tensor(&g, "token_embd_norm.weight", 1, D, 1, 1, 1.0f, 0.1f);
    for (int il = 0; il < L; il++) {
#define T(name, nd, a, b, c, ctr, s) do { snprintf(n, sizeof n, "blk.%d." name, il); gb_tensor(&g, n, nd, a, b, c, ctr, s); } while (0)
        T("attn_norm.weight", 1, D, 1, 1, 1.0f, 0.1f);
        if (attn[il]) {
            int hkv = il == 3 && v.kv_mixed ? 1 : HKV;
            T("attn_q.weight", 2, D, H * HD, 1, 0.0f, 0.3f);
            T("attn_k.weight", 2, D, hkv * HD, 1, 0.0f, 0.3f);
            T("attn_v.weight", 2, D, hkv * HD, 1, 0.0f, 0.3f);
            T("attn_output.weight", 2, H * HD, D, 1, 0.0f, 0.3f);
            T("attn_q_norm.weight", 1, HD, 1, 1, 1.0f, 0.1f);
            T("attn_k_norm.weight", 1, HD, 1, 1, 1.0f, 0.1f);
        } else {
            T("shortconv.in_proj.weight", 2, D, 3 * D, 1, 0.0f, 0.4f);
            T("shortconv.conv.weight", 2, TAPS, D, 1, 0.0f, 0.6f);
            T("shortconv.out_proj.weight", 2, D, D, 1, 0.0f, 0.3f);
        }
        T("ffn_norm.weight", 1, D, 1, 1, 1.0f, 0.1f);
        if (il == 0) {
            T("ffn_gate.weight", 2, D, F, 1, 0.0f, 0.3f);
            T("ffn_up.weight", 2, D, F, 1, 0.0f, 0.3f);
            T("ffn_down.weight", 2, F, D, 1, 0.0f, 0.3f);
            continue;
        }
        T("ffn_gate_inp.weight", 2, D, E, 1, 0.0f, 1.0f);
        if (!v.no_bias) T("exp_probs_b.bias", 1, E, 1, 1, 0.0f, 0.5f);
        T("ffn_gate_exps.weight", 3, D, F, E, 0.0f, 0.3f);
        T("ffn_up_exps.weight", 3, D, F, E, 0.0f, 0.3f);
        T("ffn_down_exps.weight", 3, F, D, E, 0.0f, 0.3f);
#undef T
    }
    CHECK(gb_write(&g, path) == 0);
}

/* a hook that checks the selection bias: TOPK's scores are PROBS plus exp_probs_b */
typedef struct {
    const bmoe_model *m;
    float probs[64 * E];
    int topk_seen, bias_ok, weights_unbiased;
} bias_hook;

static int on_node(void *user, bmoe_moe_result *r) {
    bias_hook *h = user;
    if (r->node == BMOE_NODE_PROBS && r->n_tokens <= 64) memcpy(h->probs, r->f32, (size_t)r->n_tokens * E * sizeof(float));
    if (r->node == BMOE_NODE_TOPK) {
        const float *b = h->m->layers[r->layer].exp_probs_b;
        h->topk_seen++;
        for (int i = 0; i < r->n_tokens * E; i++) h->bias_ok &= r->scores[i] == h->probs[i] + b[i % E];
        h->bias_ok &= r->scores_are_probs == 0;
    }
    if (r->node == BMOE_NODE_WEIGHTS)
        for (int t = 0; t < r->n_tokens; t++)
            for (int s = 0; s < r->n_cols; s++)
                h->weights_unbiased &= r->weights[t * K + s] == h->probs[t * E + r->ids[t * K + s]];
    return 0;
}

typedef struct {
    bmoe_model *m;
    bmoe_pool *pool;
    bmoe_resident res;
    bmoe_seam seam;
    bmoe_forward *f;
} rig;

static int rig_open(rig *r, const char *path, int threads, int max_batch, bias_hook *h) {
    char err[512] = "";
    memset(r, 0, sizeof *r);
    int rc = model_open(path, 1, &r->m, err, sizeof err);
    if (rc) { fprintf(stderr, "model_open: %s\n", err); return rc; }
    r->pool = pool_create(threads);
    r->seam.experts = resident_source(&r->res, r->m);
    if (h) { h->m = r->m; r->seam.hook = on_node; r->seam.hook_user = h; }
    rc = forward_create(&r->f, r->m, r->pool, &r->seam, 64, max_batch, K, err, sizeof err);
    if (rc) fprintf(stderr, "forward_create: %s\n", err);
    return rc;
}

static void rig_close(rig *r) {
    forward_free(r->f);
    pool_destroy(r->pool);
    model_close(r->m);
}

static int eval(rig *r, const int32_t *toks, int T, int pos0, float *out) {
    char err[512] = "";
    int rc = forward_eval(r->f, toks, T, pos0, T > 1 ? 0 : 1, 0, 1, out, err, sizeof err);
    if (rc && rc != 1) fprintf(stderr, "forward_eval: %s\n", err);
    return rc;
}

static void test_lfm2(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/lfm2moe.gguf", dir);
    build_lfm2(path, (lfm2_variant){ 0 });
    enum { T = 7 };
    const int32_t toks[T] = { 3, 1, 4, 1, 5, 9, 2 };
    static float a[T * V], b[T * V], c[T * V], d2[T * V];
    rig r;
    bias_hook h = { .bias_ok = 1, .weights_unbiased = 1 };
    CHECK(rig_open(&r, path, 1, T, &h) == 0);
    CHECK(r.m->layers[0].kind == BMOE_LAYER_CONV && r.m->layers[1].kind == BMOE_LAYER_ATTN &&
          r.m->layers[3].kind == BMOE_LAYER_CONV && r.m->n_attn_layers == 1 && r.m->hp.n_head_kv == HKV);
    CHECK(!r.m->layers[0].is_moe && r.m->layers[1].is_moe && r.m->n_moe_layers == 3);
    CHECK(r.m->rec_floats == (size_t)3 * (TAPS - 1) * D);
    CHECK(eval(&r, toks, T, 0, a) == 0);
    CHECK(h.topk_seen == 3 && h.bias_ok && h.weights_unbiased);
    /* a new context at position 0: the state starts again from zero, the same rows */
    CHECK(eval(&r, toks, T, 0, b) == 0 && memcmp(a, b, sizeof a) == 0);
    /* skipping a position is refused (exit 1: the recurrent state cannot stand for it) */
    CHECK(eval(&r, toks, 1, T + 1, c) == 1);
    rig_close(&r);
    for (int i = 0; i < T * V; i++) CHECK(isfinite(a[i]));

    /* token by token, on three threads: the prefill's bits */
    CHECK(rig_open(&r, path, 3, 1, NULL) == 0);
    for (int t = 0; t < T; t++) CHECK(eval(&r, toks + t, 1, t, c + (size_t)t * V) == 0);
    CHECK(memcmp(a, c, sizeof a) == 0);
    /* mark after 4 positions, continue with other tokens, return to the mark: the original rows */
    int32_t other[3] = { 7, 7, 8 };
    CHECK(eval(&r, toks, 1, 0, d2) == 0);
    for (int t = 1; t < 4; t++) CHECK(eval(&r, toks + t, 1, t, d2 + (size_t)t * V) == 0);
    CHECK(forward_mark(r.f) == 0);
    for (int t = 0; t < 3; t++) CHECK(eval(&r, other + t, 1, 4 + t, c) == 0);
    for (int t = 4; t < T; t++) CHECK(eval(&r, toks + t, 1, t, d2 + (size_t)t * V) == 0);
    CHECK(memcmp(a, d2, sizeof a) == 0);
    rig_close(&r);

    /* head_count_kv once: every layer attends (no recurrent state) */
    build_lfm2(path, (lfm2_variant){ .kv_scalar = 1 });
    CHECK(rig_open(&r, path, 1, T, NULL) == 0);
    CHECK(r.m->n_attn_layers == L && r.m->rec_floats == 0);
    CHECK(eval(&r, toks, T, 0, b) == 0 && memcmp(a, b, sizeof a) != 0);
    rig_close(&r);

    /* refusals, one line each */
    static const struct { lfm2_variant v; const char *msg; } bad[] = {
        { { .kv_mixed = 1 }, "different KV head counts are not implemented" },
        { { .no_bias = 1 }, "exp_probs_b.bias is missing" },
        { { .no_gating = 1 }, "expert_gating_func is missing" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        build_lfm2(path, bad[i].v);
        bmoe_model *m = NULL;
        char err[512] = "";
        CHECK(model_open(path, 1, &m, err, sizeof err) == 3 && strstr(err, bad[i].msg) != NULL);
        if (!strstr(err, bad[i].msg)) fprintf(stderr, "  got: %s\n", err);
        model_close(m);
    }
    unlink(path);
}

/* qwen35moe: delta-net layers 0 and 2, gated attention layers 1 and 3 (full_attention_interval 2),
 * M-RoPE sections [2, 1, 0, 1] over 8 of 16 dims, a gated shared expert */
enum { QS = 8, QHK = 2, QHV = 4, QTAPS = 4, QHD = 16, QSH = 24 };

/* variant: 0 as described, 1 three M-RoPE sections, 2 ssm.inner_size not Hv x S, 3 Hv not a multiple of Hk */
static void build_q35(const char *path, int variant) {
    gguf_build g = { .rng = 3535 };
    char n[96];
    const char *a = "qwen35moe";
    char k[96];
#define KEY(s) (snprintf(k, sizeof k, "%s." s, a), k)
    gb_kv_str(&g, "general.architecture", a);
    gb_kv_u32(&g, KEY("block_count"), L);
    gb_kv_u32(&g, KEY("context_length"), 64);
    gb_kv_u32(&g, KEY("embedding_length"), D);
    gb_kv_u32(&g, KEY("attention.head_count"), 2);
    gb_kv_u32(&g, KEY("attention.head_count_kv"), 1);
    gb_kv_u32(&g, KEY("attention.key_length"), QHD);
    gb_kv_u32(&g, KEY("attention.value_length"), QHD);
    gb_kv_f32(&g, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    gb_kv_u32(&g, KEY("rope.dimension_count"), 8);
    const uint32_t sec[4] = { 2, 1, 0, 1 };
    gb_kv_u32s(&g, KEY("rope.dimension_sections"), sec, variant == 1 ? 3 : 4);
    gb_kv_u32(&g, KEY("expert_count"), E);
    gb_kv_u32(&g, KEY("expert_used_count"), K);
    gb_kv_u32(&g, KEY("expert_feed_forward_length"), F);
    gb_kv_u32(&g, KEY("expert_shared_feed_forward_length"), QSH);
    gb_kv_u32(&g, KEY("ssm.conv_kernel"), QTAPS);
    gb_kv_u32(&g, KEY("ssm.state_size"), QS);
    gb_kv_u32(&g, KEY("ssm.group_count"), variant == 3 ? 3 : QHK);
    gb_kv_u32(&g, KEY("ssm.time_step_rank"), QHV);
    gb_kv_u32(&g, KEY("ssm.inner_size"), variant == 2 ? QHV * QS + 1 : QHV * QS);
    gb_kv_u32(&g, KEY("full_attention_interval"), 2);
#undef KEY
    gb_kv_vocab(&g, V);
    gb_tensor(&g, "token_embd.weight", 2, D, V, 1, 0.0f, 1.0f);
    gb_tensor(&g, "output_norm.weight", 1, D, 1, 1, 1.0f, 0.1f);
    gb_tensor(&g, "output.weight", 2, D, V, 1, 0.0f, 0.3f);
    int C = (2 * QHK + QHV) * QS;
    for (int il = 0; il < L; il++) {
#define T(name, nd, x, y, z, ctr, s) do { snprintf(n, sizeof n, "blk.%d." name, il); gb_tensor(&g, n, nd, x, y, z, ctr, s); } while (0)
        T("attn_norm.weight", 1, D, 1, 1, 1.0f, 0.1f);
        T("post_attention_norm.weight", 1, D, 1, 1, 1.0f, 0.1f);
        if (il % 2) {
            T("attn_q.weight", 2, D, 2 * 2 * QHD, 1, 0.0f, 0.3f);
            T("attn_k.weight", 2, D, QHD, 1, 0.0f, 0.3f);
            T("attn_v.weight", 2, D, QHD, 1, 0.0f, 0.3f);
            T("attn_output.weight", 2, 2 * QHD, D, 1, 0.0f, 0.3f);
            T("attn_q_norm.weight", 1, QHD, 1, 1, 1.0f, 0.1f);
            T("attn_k_norm.weight", 1, QHD, 1, 1, 1.0f, 0.1f);
        } else {
            T("attn_qkv.weight", 2, D, C, 1, 0.0f, 0.3f);
            T("attn_gate.weight", 2, D, QHV * QS, 1, 0.0f, 0.3f);
            T("ssm_conv1d.weight", 2, QTAPS, C, 1, 0.0f, 0.5f);
            T("ssm_dt.bias", 1, QHV, 1, 1, 0.0f, 0.5f);
            T("ssm_a", 1, QHV, 1, 1, -1.0f, 0.5f);
            T("ssm_beta.weight", 2, D, QHV, 1, 0.0f, 0.3f);
            T("ssm_alpha.weight", 2, D, QHV, 1, 0.0f, 0.3f);
            T("ssm_norm.weight", 1, QS, 1, 1, 1.0f, 0.1f);
            T("ssm_out.weight", 2, QHV * QS, D, 1, 0.0f, 0.3f);
        }
        T("ffn_gate_inp.weight", 2, D, E, 1, 0.0f, 1.0f);
        T("ffn_gate_exps.weight", 3, D, F, E, 0.0f, 0.3f);
        T("ffn_up_exps.weight", 3, D, F, E, 0.0f, 0.3f);
        T("ffn_down_exps.weight", 3, F, D, E, 0.0f, 0.3f);
        T("ffn_gate_inp_shexp.weight", 1, D, 1, 1, 0.0f, 0.3f);
        T("ffn_gate_shexp.weight", 2, D, QSH, 1, 0.0f, 0.3f);
        T("ffn_up_shexp.weight", 2, D, QSH, 1, 0.0f, 0.3f);
        T("ffn_down_shexp.weight", 2, QSH, D, 1, 0.0f, 0.3f);
#undef T
    }
    CHECK(gb_write(&g, path) == 0);
}

static void test_q35(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/qwen35moe.gguf", dir);
    build_q35(path, 0);
    enum { T = 9 };
    const int32_t toks[T] = { 2, 7, 1, 8, 2, 8, 1, 8, 3 };
    static float a[T * V], b[T * V], c[T * V];
    rig r;
    CHECK(rig_open(&r, path, 1, T, NULL) == 0);
    CHECK(r.m->layers[0].kind == BMOE_LAYER_DELTA && r.m->layers[1].kind == BMOE_LAYER_ATTN &&
          r.m->layers[2].kind == BMOE_LAYER_DELTA && r.m->n_attn_layers == 2 && r.m->n_moe_layers == L);
    CHECK(r.m->rec_floats == (size_t)2 * ((QTAPS - 1) * (2 * QHK + QHV) * QS + QHV * QS * QS));
    CHECK(r.m->layers[1].ffn_norm != NULL && r.m->layers[1].post_attention_norm == NULL); /* the FFN's norm */
    CHECK(eval(&r, toks, T, 0, a) == 0);
    CHECK(eval(&r, toks, T, 0, b) == 0 && memcmp(a, b, sizeof a) == 0);
    rig_close(&r);
    for (int i = 0; i < T * V; i++) CHECK(isfinite(a[i]));
    /* token by token on four threads, and after a mark and a detour: the same bits */
    CHECK(rig_open(&r, path, 4, 2, NULL) == 0);
    for (int t = 0; t < 5; t++) CHECK(eval(&r, toks + t, 1, t, c + (size_t)t * V) == 0);
    CHECK(forward_mark(r.f) == 0);
    const int32_t detour[2] = { 4, 4 };
    CHECK(eval(&r, detour, 2, 5, b) == 0);
    for (int t = 5; t < T; t++) CHECK(eval(&r, toks + t, 1, t, c + (size_t)t * V) == 0);
    CHECK(memcmp(a, c, sizeof a) == 0);
    rig_close(&r);
    static const char *const msg[] = { NULL, "rope.dimension_sections has 3 entries",
                                       "ssm.inner_size 33 is not ssm.time_step_rank x ssm.state_size",
                                       "ssm.time_step_rank 4 is not a multiple of ssm.group_count 3" };
    for (int v = 1; v <= 3; v++) {
        build_q35(path, v);
        bmoe_model *m = NULL;
        char err[512] = "";
        CHECK(model_open(path, 1, &m, err, sizeof err) == 3 && strstr(err, msg[v]) != NULL);
        if (!strstr(err, msg[v])) fprintf(stderr, "  got: %s\n", err);
        model_close(m);
    }
    unlink(path);
}

int main(void) {
    char dir[] = "/tmp/bmoe-hybrid-XXXXXX";
    if (!mkdtemp(dir)) return 2;
    test_lfm2(dir);
    test_q35(dir);
    rmdir(dir);
    return check_report("test_hybrid");
}
