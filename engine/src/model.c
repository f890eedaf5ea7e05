/* Model loading: metadata → hyperparameters, tensors bound by llama.cpp name and checked against
 * them, shards mapped read-only, per-expert layout computed. Nothing here trusts the file: every
 * value read is range-checked before it sizes anything, and every failure is a message, never an
 * assertion. */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tensor.h"

/* Upper bounds that keep every product of two dimensions far from overflow; the real bound is the
 * file itself (a tensor's bytes must fit in its shard), checked when the tensor is bound. */
#define MAX_LAYERS (1 << 12)
#define MAX_DIM (1 << 22)
#define MAX_HEADS (1 << 12)
#define MAX_EXPERTS (1 << 16)
#define MAX_VOCAB (1 << 24)
#define MAX_CTX (1 << 30)

typedef struct loader {
    bmoe_model *m;
    char *err;
    size_t errlen;
    char key[160];
    uint8_t *used;            /* per tensor of the file: bound by the loader (every one must be) */
} loader;

static int fail(loader *L, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err, L->errlen, fmt, ap);
    va_end(ap);
    return code;
}

/* A key present with the wrong type or value; the reader's message names the key already. */
static int bad_type(loader *L, const char *key, const char *e) {
    if (e[0] && strstr(e, key)) return fail(L, 3, "%s: %s", L->m->path, e);
    return fail(L, 3, "%s: %s: %s", L->m->path, key, e[0] ? e : "wrong type");
}

static const char *akey(loader *L, const char *suffix) {
    snprintf(L->key, sizeof L->key, "%s.%s", L->m->arch, suffix);
    return L->key;
}

/* Integer hyperparameter `{arch}.suffix`: *out = def when absent and not required. */
static int get_int(loader *L, const char *suffix, int required, int def, int lo, int hi, int *out) {
    const char *key = akey(L, suffix);
    uint64_t v = 0;
    char e[256] = "";
    int r = gguf_get_u64(L->m->g, key, &v, e, sizeof e);
    if (r < 0) return bad_type(L, key, e);
    if (r == 0) {
        if (required) return fail(L, 3, "%s: required metadata key %s is missing", L->m->path, key);
        *out = def;
        return 0;
    }
    if (v < (uint64_t)lo || v > (uint64_t)hi)
        return fail(L, 3, "%s: %s = %llu is out of range [%d, %d]", L->m->path, key, (unsigned long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

static int get_real(loader *L, const char *suffix, int required, double def, double lo, double hi, double *out) {
    const char *key = akey(L, suffix);
    double v = 0;
    char e[256] = "";
    int r = gguf_get_f64(L->m->g, key, &v, e, sizeof e);
    if (r < 0) return bad_type(L, key, e);
    if (r == 0) {
        if (required) return fail(L, 3, "%s: required metadata key %s is missing", L->m->path, key);
        *out = def;
        return 0;
    }
    if (!(v >= lo && v <= hi)) return fail(L, 3, "%s: %s = %g is out of range [%g, %g]", L->m->path, key, v, lo, hi);
    *out = v;
    return 0;
}

static int get_flag(loader *L, const char *suffix, int def, int *out) {
    const char *key = akey(L, suffix);
    int v = 0;
    char e[256] = "";
    int r = gguf_get_bool(L->m->g, key, &v, e, sizeof e);
    if (r < 0) return bad_type(L, key, e);
    *out = r == 0 ? def : (v != 0);
    return 0;
}

/* The one reader of per-layer arrays (one entry per block) under `key`: its length, and entry i; with
 * `bools`, an array of booleans is read as 0/1 too (sliding-window patterns, recurrent layers). */
static int per_layer_len(loader *L, const char *key, const gguf_kv *kv) {
    if (kv->n != (uint64_t)L->m->hp.n_layer)
        return fail(L, 3, "%s: %s has %llu entries but block_count is %d", L->m->path, key, (unsigned long long)kv->n,
                    L->m->hp.n_layer);
    return 0;
}

static int per_layer_entry(loader *L, const char *key, const gguf_kv *kv, uint64_t i, int bools, uint64_t *u) {
    int ok = bools && kv->arr_type == GGUF_TYPE_BOOL ? (*u = ((const uint8_t *)kv->data)[i], 1) : gguf_arr_u64(kv, i, u);
    if (ok) return 0;
    return fail(L, 3, "%s: %s must be %s", L->m->path, key,
                bools ? "an array of booleans or integers" : "an integer or an array of integers");
}

/* A hyperparameter llama.cpp reads with get_key_or_arr: one integer for every layer, or an array of
 * block_count integers. out[il] for il < n_layer; def fills it when absent and not required. */
static int get_int_layers(loader *L, const char *suffix, int required, int def, int lo, int hi, int *out) {
    bmoe_model *m = L->m;
    int n = m->hp.n_layer;
    const char *key = akey(L, suffix);
    const gguf_kv *kv = gguf_find_kv(m->g, key);
    if (kv && kv->type == GGUF_TYPE_ARRAY) {
        int rc = per_layer_len(L, key, kv);
        for (int i = 0; !rc && i < n; i++) {
            uint64_t v = 0;
            if ((rc = per_layer_entry(L, key, kv, (uint64_t)i, 0, &v))) break;
            if (v < (uint64_t)lo || v > (uint64_t)hi)
                return fail(L, 3, "%s: %s[%d] = %llu is out of range [%d, %d]", m->path, key, i, (unsigned long long)v,
                            lo, hi);
            out[i] = (int)v;
        }
        return rc;
    }
    int v = 0, rc = get_int(L, suffix, required, def, lo, hi, &v);
    if (rc) return rc;
    for (int i = 0; i < n; i++) out[i] = v;
    return 0;
}

/* A per-layer key whose values the engine needs equal in every layer (one width for the model). */
static int get_int_uniform(loader *L, const char *suffix, int required, int def, int lo, int hi, int *out,
                           const char *what) {
    int n = L->m->hp.n_layer, rc;
    int *v = malloc((size_t)n * sizeof *v);
    if (!v) return fail(L, 1, "out of memory");
    if ((rc = get_int_layers(L, suffix, required, def, lo, hi, v)) == 0) {
        for (int i = 1; i < n; i++)
            if (v[i] != v[0]) {
                rc = fail(L, 3, "%s: %s differs between layers (%d in layer 0, %d in layer %d): %s is not implemented",
                          L->m->path, akey(L, suffix), v[0], v[i], i, what);
                break;
            }
        *out = v[0];
    }
    free(v);
    return rc;
}

static void fmt_shape(char *buf, size_t n, const uint64_t *ne, int nd) {
    size_t u = 0;
    u += (size_t)snprintf(buf + u, n - u, "[");
    for (int i = 0; i < nd && u < n; i++)
        u += (size_t)snprintf(buf + u, n - u, "%s%llu", i ? "," : "", (unsigned long long)ne[i]);
    if (u < n) snprintf(buf + u, n - u, "]");
}

static const char *shard_path(const bmoe_model *m, const gguf_tensor *t) {
    return t->shard < m->g->n_shards ? m->g->shards[t->shard].path : m->path;
}

/* Finds tensor `name`, checks it has exactly the expected shape (n_exp dims; missing dims are 1),
 * a usable type and alignment, and fills *w. Absent and not required: *w zeroed, returns 0. */
static int bind(loader *L, const char *name, int required, int n_exp, uint64_t e0, uint64_t e1, uint64_t e2,
                bmoe_weight *w) {
    bmoe_model *m = L->m;
    memset(w, 0, sizeof *w);
    const gguf_tensor *t = gguf_find_tensor(m->g, name);
    if (!t) {
        if (required) return fail(L, 3, "%s: tensor %s is missing", m->path, name);
        return 0;
    }
    const char *path = shard_path(m, t);
    if (L->used) L->used[t - m->g->tensors] = 1;
    uint64_t want[GGUF_MAX_DIMS] = {e0, n_exp > 1 ? e1 : 1, n_exp > 2 ? e2 : 1, 1};
    int same = 1;
    for (int i = 0; i < GGUF_MAX_DIMS; i++) same &= t->ne[i] == want[i];
    if (!same) {
        char got[96], exp[96];
        int nd = t->n_dims < 1 ? 1 : (t->n_dims > GGUF_MAX_DIMS ? GGUF_MAX_DIMS : (int)t->n_dims);
        fmt_shape(got, sizeof got, t->ne, nd);
        fmt_shape(exp, sizeof exp, want, n_exp);
        return fail(L, 3, "%s: %s: shape %s but expected %s", path, name, got, exp);
    }
    const bm_type_traits *tt = bm_type(t->type);
    if (!tt) {
        char list[256];
        return fail(L, 3, "%s: %s: type %s is not supported (%s)", path, name, ggml_type_name(t->type),
                    bm_types_supported(list, sizeof list));
    }
    if (t->ne[0] % tt->blck != 0)
        return fail(L, 3, "%s: %s: ne[0] = %llu is not a multiple of the %s block size %u", path, name,
                    (unsigned long long)t->ne[0], tt->name, tt->blck);
    uint64_t rb = bm_type_nbytes(t->type, t->ne[0]);
    /* rows * row bytes, overflow-checked against what the tensor actually holds */
    uint64_t rows = t->ne[1] * t->ne[2]; /* each < MAX_DIM-ish from the shape check */
    if (rb == 0 || rb != t->row_bytes || rows > t->nbytes / rb)
        return fail(L, 3, "%s: %s: %llu bytes cannot hold shape with %s rows of %llu bytes", path, name,
                    (unsigned long long)t->nbytes, tt->name, (unsigned long long)rb);
    /* f32, f16 and bf16 rows are read as float / half words: the data must be aligned to them */
    if (t->offset % tt->align != 0)
        return fail(L, 3, "%s: %s: data offset %llu is not aligned to %u bytes", path, name,
                    (unsigned long long)t->offset, tt->align);
    w->t = t;
    w->type = t->type;
    w->ne[0] = t->ne[0];
    w->ne[1] = t->ne[1];
    w->ne[2] = t->ne[2];
    w->row_bytes = rb;
    w->data = (m->maps && m->maps[t->shard]) ? (const uint8_t *)m->maps[t->shard] + t->offset : NULL;
    return 0;
}

/* A 1-D weight of n elements, dequantised into an owned f32 array (read with pread-free copies from the
 * mapping, or from the file when the model is not mapped). */
static int bind_vec(loader *L, const char *name, int required, uint64_t n, float **out) {
    bmoe_weight w;
    *out = NULL;
    int rc = bind(L, name, required, 1, n, 1, 1, &w);
    if (rc || !w.t) return rc;
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) return fail(L, 1, "out of memory loading %s", name);
    if (w.data) {
        row_to_f32(w.type, w.data, v, (size_t)n);
    } else { /* not mapped (bmoe info): the values are not needed, keep zeros */
        memset(v, 0, (size_t)n * sizeof(float));
    }
    *out = v;
    return 0;
}

/* A 2-D weight [n, rows] (ne order) as an owned f32 array of rows x n (the per-expert biases). */
static int bind_rows_f32(loader *L, const char *name, int required, uint64_t n, uint64_t rows, float **out) {
    bmoe_weight w;
    *out = NULL;
    int rc = bind(L, name, required, 2, n, rows, 1, &w);
    if (rc || !w.t) return rc;
    float *v = calloc((size_t)(n * rows), sizeof(float));
    if (!v) return fail(L, 1, "out of memory loading %s", name);
    for (uint64_t i = 0; w.data && i < rows; i++) row_to_f32(w.type, w.data + i * w.row_bytes, v + i * n, (size_t)n);
    *out = v;
    return 0;
}

/* An optional or required bias (arch.h, bmoe_bias) of block il: blk.<il>.<what>.bias, n values. */
static int bind_layer_bias(loader *L, int il, const char *what, bmoe_bias kind, uint64_t n, float **out) {
    *out = NULL;
    if (kind == BMOE_BIAS_NONE) return 0; /* refuse_foreign has refused a file that has it */
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.bias", il, what);
    return bind_vec(L, name, kind == BMOE_BIAS_REQUIRED, n, out);
}

static int bind_layer_vec(loader *L, int il, const char *what, int required, uint64_t n, float **out) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight", il, what);
    return bind_vec(L, name, required, n, out);
}

static int bind_layer(loader *L, int il, const char *what, int required, int n_exp, uint64_t e0, uint64_t e1,
                      uint64_t e2, bmoe_weight *w) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight", il, what);
    return bind(L, name, required, n_exp, e0, e1, e2, w);
}

/* A 2-D weight [n_in, n_out] dequantised into owned f32 rows (zeros when the model is not mapped). */
static int bind_mat_f32(loader *L, const char *name, uint64_t n_in, uint64_t n_out, float **out) {
    bmoe_weight w;
    *out = NULL;
    int rc = bind(L, name, 1, 2, n_in, n_out, 1, &w);
    if (rc) return rc;
    float *v = calloc((size_t)(n_in * n_out), sizeof(float));
    if (!v) return fail(L, 1, "out of memory loading %s", name);
    for (uint64_t j = 0; w.data && j < n_out; j++) row_to_f32(w.type, w.data + j * w.row_bytes, v + j * n_in, (size_t)n_in);
    *out = v;
    return 0;
}

/* The tensors of a recurrent layer (docs/model-math.md, "Hybrid architectures"), and its share of the
 * recurrent state: the convolution's K-1 inputs per channel, then a delta-net layer's Hv S x S matrices. */
static int bind_recurrent(loader *L, int il) {
    bmoe_model *m = L->m;
    const bmoe_hparams *hp = &m->hp;
    bmoe_layer *ly = &m->layers[il];
    uint64_t d = (uint64_t)hp->n_embd, K = (uint64_t)hp->conv_taps;
    char name[96];
    int rc;
    ly->rec_off = m->rec_floats;
    if (ly->kind == BMOE_LAYER_CONV) {
        if ((rc = bind_layer(L, il, "shortconv.in_proj", 1, 2, d, 3 * d, 1, &ly->sc_in))) return rc;
        if ((rc = bind_layer(L, il, "shortconv.out_proj", 1, 2, d, d, 1, &ly->sc_out))) return rc;
        snprintf(name, sizeof name, "blk.%d.shortconv.conv.weight", il);
        if ((rc = bind_mat_f32(L, name, K, d, &ly->sc_conv))) return rc;
        m->rec_floats += (size_t)((K - 1) * d);
        return 0;
    }
    uint64_t S = (uint64_t)hp->ssm_state, Hk = (uint64_t)hp->ssm_groups, Hv = (uint64_t)hp->ssm_heads;
    uint64_t C = (2 * Hk + Hv) * S;
    if ((rc = bind_layer(L, il, "attn_qkv", 1, 2, d, C, 1, &ly->attn_qkv))) return rc;
    if ((rc = bind_layer(L, il, "attn_gate", 1, 2, d, Hv * S, 1, &ly->attn_z))) return rc;
    if ((rc = bind_layer(L, il, "ssm_beta", 1, 2, d, Hv, 1, &ly->ssm_beta))) return rc;
    if ((rc = bind_layer(L, il, "ssm_alpha", 1, 2, d, Hv, 1, &ly->ssm_alpha))) return rc;
    if ((rc = bind_layer(L, il, "ssm_out", 1, 2, Hv * S, d, 1, &ly->ssm_out))) return rc;
    snprintf(name, sizeof name, "blk.%d.ssm_conv1d.weight", il);
    if ((rc = bind_mat_f32(L, name, K, C, &ly->ssm_conv1d))) return rc;
    snprintf(name, sizeof name, "blk.%d.ssm_dt.bias", il);
    if ((rc = bind_vec(L, name, 1, Hv, &ly->ssm_dt))) return rc;
    snprintf(name, sizeof name, "blk.%d.ssm_a", il);
    if ((rc = bind_vec(L, name, 1, Hv, &ly->ssm_a))) return rc;
    if ((rc = bind_layer_vec(L, il, "ssm_norm", 1, S, &ly->ssm_norm))) return rc;
    m->rec_floats += (size_t)((K - 1) * C + Hv * S * S);
    return 0;
}

/* The gating keys, as llama.cpp's graph for the architecture uses them (arch.h, bmoe_gating_keys). */
static int read_gating(loader *L) {
    bmoe_model *m = L->m;
    bmoe_hparams *hp = &m->hp;
    const bmoe_recipe *r = m->recipe;
    int rc, gid = 0, norm = -1;
    double scale = 0.0;
    if ((rc = get_int(L, "expert_gating_func", 0, 0, 0, 1 << 30, &gid))) return rc;
    if ((rc = get_flag(L, "expert_weights_norm", -1, &norm))) return rc;
    if ((rc = get_real(L, "expert_weights_scale", 0, 0.0, 0.0, 1e30, &scale))) return rc;
    if (r->gating_keys == BMOE_GATING_KEYS_FUNC) {
        /* the function is the file's (and required); the norm and the scale are the graph's own */
        if (gid == 0 && hp->n_expert > 0)
            return fail(L, 3, "%s: required metadata key %s.expert_gating_func is missing (llama.cpp's %s graph "
                        "has no default gating)", m->path, m->arch, m->arch);
        hp->gating = arch_gating(gid == 0 ? BMOE_GATING_SOFTMAX : gid);
        if (!hp->gating)
            return fail(L, 3, "%s: %s.expert_gating_func = %d is not implemented (1 softmax, 2 sigmoid, 3 softmax "
                        "over the selected)", m->path, m->arch, gid);
        gid = 0; /* checked: the norm and scale checks below are those of a fixed gating */
    }
    if (r->gating_keys != BMOE_GATING_KEYS_READ) {
        /* llama.cpp ignores these keys for this architecture: a value that asks for anything else would
         * give a model llama.cpp computes differently, so it is refused rather than followed or ignored */
        const bmoe_gating *g = r->gating_keys == BMOE_GATING_KEYS_FUNC ? hp->gating : arch_gating(r->gating);
        if (gid != 0 && gid != r->gating)
            return fail(L, 3, "%s: %s.expert_gating_func = %d: llama.cpp's %s graph always uses %s gating (%d); "
                        "use an architecture that reads the key (dots1)", m->path, m->arch, gid, m->arch,
                        g->name, r->gating);
        if (norm >= 0 && norm != r->norm_w)
            return fail(L, 3, "%s: %s.expert_weights_norm = %s: llama.cpp's %s graph always %s the selected "
                        "weights; use an architecture that reads the key (dots1)", m->path, m->arch,
                        norm ? "true" : "false", m->arch, r->norm_w ? "normalises" : "leaves unnormalised");
        if (scale != 0.0 && scale != 1.0)
            return fail(L, 3, "%s: %s.expert_weights_scale = %g: llama.cpp's %s graph never scales the routing "
                        "weights; use an architecture that reads the key (dots1)", m->path, m->arch, scale, m->arch);
        hp->gating = g;
        hp->norm_w = r->norm_w;
        hp->w_scale = 1.0;
        return 0;
    }
    if (gid == 0) {
        if (hp->n_expert > 0)
            return fail(L, 3, "%s: required metadata key %s.expert_gating_func is missing (llama.cpp's %s graph "
                        "has no default gating)", m->path, m->arch, m->arch);
        gid = BMOE_GATING_SOFTMAX; /* no MoE layer: never used */
    }
    hp->gating = arch_gating(gid);
    if (!hp->gating)
        return fail(L, 3, "%s: %s.expert_gating_func = %d is not implemented (1 softmax, 2 sigmoid, 3 softmax over "
                    "the selected)", m->path, m->arch, gid);
    hp->norm_w = norm < 0 ? r->norm_w : norm;
    hp->w_scale = scale == 0.0 ? 1.0 : scale; /* llama.cpp: a scale of 0 or 1 adds no node */
    return 0;
}

/* The shared expert's hidden width, from the keys llama.cpp's graph reads for it. */
static int read_shared_width(loader *L) {
    bmoe_model *m = L->m;
    bmoe_hparams *hp = &m->hp;
    const bmoe_recipe *r = m->recipe;
    int rc, given = -1;
    if ((rc = get_int(L, "expert_shared_feed_forward_length", 0, -1, 0, MAX_DIM, &given))) return rc;
    hp->n_ff_shexp = 0;
    if (r->shared_expert == BMOE_SHEXP_FFN) {
        /* llama.cpp sizes gemma4's shared expert by feed_forward_length and ignores the shared key */
        if (given >= 0 && given != hp->n_ff)
            return fail(L, 3, "%s: %s.expert_shared_feed_forward_length = %d differs from feed_forward_length %d "
                        "(llama.cpp's %s graph sizes the shared expert by feed_forward_length)", m->path, m->arch,
                        given, hp->n_ff, m->arch);
        hp->n_ff_shexp = hp->n_ff;
    } else if (r->shared_expert == BMOE_SHEXP_GATED) {
        hp->n_ff_shexp = given >= 0 ? given : hp->n_ff; /* llama.cpp: n_ff_shexp, else feed_forward_length */
    } else if (r->shared_expert == BMOE_SHEXP_NAMED) {
        if (given >= 0)
            return fail(L, 3, "%s: %s.expert_shared_feed_forward_length is not read by llama.cpp's %s graph (the "
                        "shared expert is expert_feed_forward_length x expert_shared_count)", m->path, m->arch,
                        m->arch);
        if ((rc = get_int(L, "expert_shared_count", hp->n_expert > 0, 0, 0, MAX_EXPERTS, &hp->n_expert_shared)))
            return rc;
        if (hp->n_expert > 0 && hp->n_expert_shared < 1)
            return fail(L, 3, "%s: %s.expert_shared_count = 0: llama.cpp's %s graph always has a shared expert",
                        m->path, m->arch, m->arch);
        if ((uint64_t)hp->n_ff_exp * (uint64_t)hp->n_expert_shared > MAX_DIM)
            return fail(L, 3, "%s: %s: shared expert width exceeds %d", m->path, m->arch, MAX_DIM);
        hp->n_ff_shexp = hp->n_ff_exp * hp->n_expert_shared;
    } else if (given >= 0) {
        return fail(L, 3, "%s: %s.expert_shared_feed_forward_length: the %s architecture has no shared expert",
                    m->path, m->arch, m->arch);
    }
    return 0;
}

/* Sliding-window keys (gemma4): llama.cpp requires them. A sliding-window layer attends to the n_swa
 * latest positions, has head sizes of its own (attention.key_length_swa / value_length_swa) and rotates
 * with its own RoPE base and dims, without rope_freqs; per-layer input embeddings and shared KV layers
 * are refused. */
static int read_swa(loader *L) {
    bmoe_model *m = L->m;
    bmoe_hparams *hp = &m->hp;
    int rc, v = 0;
    char e[256] = "";
    const gguf_kv *kv = NULL;
    const char *key = akey(L, "attention.sliding_window_pattern");
    int r = gguf_get_arr(m->g, key, GGUF_TYPE_COUNT, &kv, e, sizeof e);
    if (r < 0) return bad_type(L, key, e);
    if (r == 0) return fail(L, 3, "%s: required metadata key %s is missing", m->path, key);
    if ((rc = per_layer_len(L, key, kv))) return rc;
    m->swa_pattern = calloc((size_t)hp->n_layer, 1);
    if (!m->swa_pattern) return fail(L, 1, "out of memory");
    for (uint64_t i = 0; i < kv->n; i++) {
        uint64_t u = 0;
        if ((rc = per_layer_entry(L, key, kv, i, 1, &u))) return rc;
        m->swa_pattern[i] = u != 0;
    }
    if ((rc = get_int(L, "attention.sliding_window", 1, 0, 1, MAX_CTX, &hp->n_swa))) return rc;
    /* a sliding-window layer's head sizes and rotated dims (gemma4's 26B: 256 against the full layers' 512) */
    if ((rc = get_int(L, "attention.key_length_swa", 1, 0, 1, MAX_DIM, &hp->head_dim_swa))) return rc;
    if ((rc = get_int(L, "attention.value_length_swa", 1, 0, 1, MAX_DIM, &hp->head_dim_v_swa))) return rc;
    int def_rot = hp->n_rot < hp->head_dim_swa ? hp->n_rot : hp->head_dim_swa;
    if ((rc = get_int(L, "rope.dimension_count_swa", 0, def_rot, 0, hp->head_dim_swa, &hp->n_rot_swa))) return rc;
    if (hp->n_rot_swa % 2 != 0)
        return fail(L, 3, "%s: %s.rope.dimension_count_swa = %d is odd", m->path, m->arch, hp->n_rot_swa);
    /* llama.cpp's default for a sliding-window layer's base is 10000, not rope.freq_base */
    if ((rc = get_real(L, "rope.freq_base_swa", 0, 10000.0, 1e-6, 1e30, &hp->rope_base_swa))) return rc;
    if ((rc = get_int(L, "embedding_length_per_layer_input", 1, 0, 0, MAX_DIM, &v))) return rc;
    if (v != 0)
        return fail(L, 3, "%s: %s.embedding_length_per_layer_input = %d: per-layer input embeddings are not "
                    "implemented (write 0)", m->path, m->arch, v);
    if ((rc = get_int(L, "attention.shared_kv_layers", 0, 0, 0, MAX_LAYERS, &v))) return rc;
    if (v != 0)
        return fail(L, 3, "%s: %s.attention.shared_kv_layers = %d: KV sharing is not implemented", m->path, m->arch, v);
    return 0;
}

/* Sliding-window keys as llama.cpp's gemma3 reads them: attention.sliding_window absent or 0 means no
 * local layer at all (every layer global, with rope.freq_base); otherwise sliding_window_pattern is a
 * per-layer array (true = local), or a period n (layer il is local unless il % n == n - 1, and n = 0
 * makes every layer local), or absent (the recipe's period). Local layers rotate every dim of a head
 * with rope.freq_base_swa (default 10000) and no scaling; their head sizes are the global ones. */
static int read_swa_periodic(loader *L) {
    bmoe_model *m = L->m;
    bmoe_hparams *hp = &m->hp;
    const bmoe_recipe *rc_ = m->recipe;
    int rc, period = rc_->swa_period, required = rc_->swa_window_required;
    char e[256] = "";
    if ((rc = get_int(L, "attention.sliding_window", required, 0, required, MAX_CTX, &hp->n_swa))) return rc;
    hp->n_rot_swa = hp->n_rot;
    /* a local layer's RoPE base: its own key, defaulting to 10000 (gemma3) or to the global base (gpt-oss) */
    double base_swa = rc_->swa_rope == BMOE_SWA_ROPE_GLOBAL ? hp->rope_base : 10000.0;
    hp->rope_base_swa = base_swa;
    if (hp->n_swa == 0) return 0; /* no local layers: swa_pattern stays NULL */
    m->swa_pattern = calloc((size_t)hp->n_layer, 1);
    if (!m->swa_pattern) return fail(L, 1, "out of memory");
    const char *key = akey(L, "attention.sliding_window_pattern");
    const gguf_kv *kv = gguf_find_kv(m->g, key);
    if (kv && kv->type == GGUF_TYPE_ARRAY) {
        if ((rc = per_layer_len(L, key, kv))) return rc;
        for (uint64_t i = 0; i < kv->n; i++) {
            uint64_t u = 0;
            if ((rc = per_layer_entry(L, key, kv, i, 1, &u))) return rc;
            m->swa_pattern[i] = u != 0;
        }
    } else {
        uint64_t v = 0;
        int r = gguf_get_u64(m->g, key, &v, e, sizeof e);
        if (r < 0) return bad_type(L, key, e);
        if (r > 0) {
            if (v > MAX_LAYERS) return fail(L, 3, "%s: %s = %llu is out of range [0, %d]", m->path, key,
                                            (unsigned long long)v, MAX_LAYERS);
            period = (int)v;
        }
        for (int il = 0; il < hp->n_layer; il++) m->swa_pattern[il] = period == 0 || il % period < period - 1;
    }
    if ((rc = get_real(L, "rope.freq_base_swa", 0, base_swa, 1e-6, 1e30, &hp->rope_base_swa))) return rc;
    return 0;
}

/* rope.scaling.type (default linear) and rope.scaling.factor (0 or absent: 1), as llama.cpp reads them for
 * every architecture: the rotation angles are multiplied by 1 / factor (linear), or mixed per dimension
 * between scaled and unscaled as YaRN does (rope.scaling.original_context_length, default context_length;
 * rope.scaling.attn_factor, default 1; llama.cpp's beta_fast 32 and beta_slow 1). A type the recipe does
 * not read (arch.h, rope_scaling) is refused, never ignored; "none" never scales. */
static int read_rope_scaling(loader *L) {
    bmoe_model *m = L->m;
    bmoe_hparams *hp = &m->hp;
    unsigned kinds = m->recipe->rope_scaling;
    gguf_str type;
    char e[256] = "";
    const char *key = akey(L, "rope.scaling.type");
    int r = gguf_get_str(m->g, key, &type, e, sizeof e);
    if (r < 0) return bad_type(L, key, e);
    int linear = r == 0 || gguf_str_eq(type, "linear"), none = r > 0 && gguf_str_eq(type, "none");
    int yarn = r > 0 && gguf_str_eq(type, "yarn");
    if (!none && !(linear && (kinds & BMOE_ROPE_SCALING_LINEAR)) && !(yarn && (kinds & BMOE_ROPE_SCALING_YARN)))
        return fail(L, 3, "%s: %s = '%.*s': the engine implements %s RoPE scaling for %s", m->path, key,
                    r > 0 ? (int)(type.len > 20 ? 20 : type.len) : 6, r > 0 ? type.ptr : "linear",
                    (kinds & BMOE_ROPE_SCALING_YARN) ? "linear and yarn" : "linear", m->arch);
    double factor = 0.0;
    int rc = get_real(L, "rope.scaling.factor", 0, 0.0, 0.0, 1e30, &factor);
    if (rc) return rc;
    if (factor == 0.0 && (rc = get_real(L, "rope.scale_linear", 0, 0.0, 0.0, 1e30, &factor))) return rc;
    hp->rope_scale = factor == 0.0 || none ? 1.0 : 1.0 / factor;
    if (!yarn) return 0;
    hp->rope_yarn = 1;
    if ((rc = get_int(L, "rope.scaling.original_context_length", 0, hp->n_ctx_train, 1, MAX_CTX, &hp->yarn_orig_ctx)))
        return rc;
    if ((rc = get_real(L, "rope.scaling.attn_factor", 0, 1.0, 1e-6, 1e6, &hp->yarn_attn_factor))) return rc;
    hp->yarn_beta_fast = 32.0;
    hp->yarn_beta_slow = 1.0;
    return 0;
}

/* Each layer's attention geometry: its head counts (read per layer), the head sizes and rotated dims of
 * its kind (a gemma4 sliding-window layer has its own), checked as llama.cpp's graph needs them. */
static int layer_geometry(loader *L) {
    bmoe_model *m = L->m;
    const bmoe_hparams *hp = &m->hp;
    const bmoe_recipe *r = m->recipe;
    for (int il = 0; il < hp->n_layer; il++) {
        bmoe_layer *ly = &m->layers[il];
        int swa = m->swa_pattern && m->swa_pattern[il];
        ly->is_swa = swa;
        ly->head_dim = swa ? hp->head_dim_swa : hp->head_dim;
        ly->head_dim_v = swa ? hp->head_dim_v_swa : hp->head_dim_v;
        ly->n_rot = swa ? hp->n_rot_swa : hp->n_rot;
        ly->out_scale = 1.0f;
        const char *sfx = swa && r->swa == BMOE_SWA_REQUIRED ? "_swa" : "";
        if (ly->head_dim_v != ly->head_dim)
            return fail(L, 3, "%s: %s.attention.value_length%s %d differs from key_length%s %d (llama.cpp's %s graph "
                        "requires them equal)", m->path, m->arch, sfx, ly->head_dim_v, sfx, ly->head_dim, m->arch);
        if (r->full_rope && ly->n_rot != ly->head_dim)
            return fail(L, 3, "%s: %s.rope.dimension_count %d differs from key_length %d (partial RoPE is not part of "
                        "llama.cpp's %s graph)", m->path, m->arch, ly->n_rot, ly->head_dim, m->arch);
        if ((uint64_t)ly->n_head * (uint64_t)ly->head_dim > MAX_DIM)
            return fail(L, 3, "%s: %s: head_count x head dim exceeds %d (layer %d)", m->path, m->arch, MAX_DIM, il);
    }
    return 0;
}

/* Which layers are recurrent (arch.h, bmoe_mixer) into m->layer_kinds; with BMOE_MIXER_SHORTCONV also
 * the attention layers' KV heads, from head_count_kv given per layer (0: a conv layer) or once. */
static int read_layer_kinds(loader *L) {
    bmoe_model *m = L->m;
    bmoe_hparams *hp = &m->hp;
    const bmoe_recipe *r = m->recipe;
    int rc;
    char e[256] = "";
    m->layer_kinds = calloc((size_t)hp->n_layer, 1); /* BMOE_LAYER_ATTN everywhere */
    if (!m->layer_kinds) return fail(L, 1, "out of memory");
    if (r->mixer == BMOE_MIXER_SHORTCONV) {
        int *kv = malloc((size_t)hp->n_layer * sizeof *kv), kvh = 0;
        if (!kv) return fail(L, 1, "out of memory");
        rc = get_int_layers(L, "attention.head_count_kv", 0, hp->n_head, 0, MAX_HEADS, kv);
        for (int il = 0; !rc && il < hp->n_layer; il++) {
            if (kv[il] == 0) { m->layer_kinds[il] = BMOE_LAYER_CONV; continue; }
            if (kvh && kv[il] != kvh)
                rc = fail(L, 3, "%s: %s: layer %d has %d KV heads but an earlier attention layer %d "
                          "(attention layers with different KV head counts are not implemented)", m->path,
                          akey(L, "attention.head_count_kv"), il, kv[il], kvh);
            kvh = kv[il];
        }
        free(kv);
        if (rc) return rc;
        hp->n_head_kv = kvh ? kvh : hp->n_head; /* no attention layer: unused */
        return 0;
    }
    if (r->mixer != BMOE_MIXER_DELTA_NET) return 0;
    const char *key = akey(L, "attention.recurrent_layers");
    const gguf_kv *kv = NULL;
    int got = gguf_get_arr(m->g, key, GGUF_TYPE_COUNT, &kv, e, sizeof e);
    if (got < 0) return bad_type(L, key, e);
    if (got > 0) {
        if ((rc = per_layer_len(L, key, kv))) return rc;
        for (uint64_t i = 0; i < kv->n; i++) {
            uint64_t u = 0;
            if ((rc = per_layer_entry(L, key, kv, i, 1, &u))) return rc;
            m->layer_kinds[i] = u ? BMOE_LAYER_DELTA : BMOE_LAYER_ATTN;
        }
        return 0;
    }
    int every = 4; /* llama.cpp's default */
    if ((rc = get_int(L, "full_attention_interval", 0, 4, 1, MAX_LAYERS, &every))) return rc;
    for (int il = 0; il < hp->n_layer; il++) m->layer_kinds[il] = (il + 1) % every ? BMOE_LAYER_DELTA : BMOE_LAYER_ATTN;
    return 0;
}

/* The recurrent layers' sizes (delta-net: ssm.*; conv: shortconv.l_cache) and the M-RoPE sections. */
static int read_recurrent(loader *L) {
    bmoe_model *m = L->m;
    bmoe_hparams *hp = &m->hp;
    const bmoe_recipe *r = m->recipe;
    int rc, inner = 0;
    if (r->mixer == BMOE_MIXER_DELTA_NET) {
        /* the state is Hv S x S floats per layer: S is bounded far above real models' 128 */
        if ((rc = get_int(L, "ssm.state_size", 1, 0, 1, 4096, &hp->ssm_state))) return rc;
        if ((rc = get_int(L, "ssm.group_count", 1, 0, 1, MAX_HEADS, &hp->ssm_groups))) return rc;
        if ((rc = get_int(L, "ssm.time_step_rank", 1, 0, 1, MAX_HEADS, &hp->ssm_heads))) return rc;
        if ((rc = get_int(L, "ssm.inner_size", 1, 0, 1, MAX_DIM, &inner))) return rc;
        if ((rc = get_int(L, "ssm.conv_kernel", 1, 0, 1, 64, &hp->conv_taps))) return rc;
        if (hp->ssm_heads % hp->ssm_groups != 0)
            return fail(L, 3, "%s: %s.ssm.time_step_rank %d is not a multiple of ssm.group_count %d", m->path, m->arch,
                        hp->ssm_heads, hp->ssm_groups);
        if ((uint64_t)hp->ssm_heads * (uint64_t)hp->ssm_state != (uint64_t)inner)
            return fail(L, 3, "%s: %s.ssm.inner_size %d is not ssm.time_step_rank x ssm.state_size (%d x %d)", m->path,
                        m->arch, inner, hp->ssm_heads, hp->ssm_state);
        if ((uint64_t)(2 * hp->ssm_groups + hp->ssm_heads) * (uint64_t)hp->ssm_state > MAX_DIM)
            return fail(L, 3, "%s: %s: the delta-net's convolution channels exceed %d", m->path, m->arch, MAX_DIM);
    } else if (r->mixer == BMOE_MIXER_SHORTCONV) {
        if ((rc = get_int(L, "shortconv.l_cache", 1, 0, 2, 64, &hp->conv_taps))) return rc;
    }
    if (r->rope_sections) {
        const char *key = akey(L, "rope.dimension_sections");
        const gguf_kv *kv = NULL;
        char e[256] = "";
        int got = gguf_get_arr(m->g, key, GGUF_TYPE_COUNT, &kv, e, sizeof e);
        if (got < 0) return bad_type(L, key, e);
        if (got == 0) return fail(L, 3, "%s: required metadata key %s is missing", m->path, key);
        if (kv->n != 4) return fail(L, 3, "%s: %s has %llu entries, expected 4", m->path, key, (unsigned long long)kv->n);
        for (int i = 0; i < 4; i++) {
            uint64_t u = 0;
            if (!gguf_arr_u64(kv, (uint64_t)i, &u) || u > MAX_DIM)
                return fail(L, 3, "%s: %s must hold 4 integers in [0, %d]", m->path, key, MAX_DIM);
            hp->rope_sections[i] = (int)u;
        }
        if (hp->rope_sections[0] + hp->rope_sections[1] + hp->rope_sections[2] == 0)
            return fail(L, 3, "%s: %s: the first three sections are all 0", m->path, key);
    }
    return 0;
}

static int read_hparams(loader *L) {
    bmoe_model *m = L->m;
    bmoe_hparams *hp = &m->hp;
    const bmoe_recipe *r = m->recipe;
    int rc;
    if ((rc = get_int(L, "block_count", 1, 0, 1, MAX_LAYERS, &hp->n_layer))) return rc;
    if ((rc = get_int(L, "context_length", 1, 0, 1, MAX_CTX, &hp->n_ctx_train))) return rc;
    if ((rc = get_int(L, "embedding_length", 1, 0, 1, MAX_DIM, &hp->n_embd))) return rc;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    int *tmp = calloc((size_t)hp->n_layer, sizeof *tmp);
    if (!m->layers || !tmp) { free(tmp); return fail(L, 1, "out of memory"); }
    /* feed_forward_length, head_count and head_count_kv: one value, or one per layer (llama.cpp reads
     * them with get_key_or_arr for every architecture) */
    rc = get_int_layers(L, "feed_forward_length", 0, 0, 0, MAX_DIM, tmp);
    for (int il = 0; !rc && il < hp->n_layer; il++) {
        m->layers[il].n_ff = tmp[il];
        if (tmp[il] > hp->n_ff) hp->n_ff = tmp[il];
    }
    if (!rc) rc = get_int_layers(L, "attention.head_count", 1, 0, 1, MAX_HEADS, tmp);
    for (int il = 0; !rc && il < hp->n_layer; il++) m->layers[il].n_head = tmp[il];
    if (!rc) hp->n_head = m->layers[0].n_head;
    /* a short-convolution recipe says which layers attend by head_count_kv (0: a conv layer): read_layer_kinds
     * reads it there; elsewhere it is each layer's KV heads */
    if (!rc && r->mixer != BMOE_MIXER_SHORTCONV) rc = get_int_layers(L, "attention.head_count_kv", 0, -1, 1, MAX_HEADS, tmp);
    for (int il = 0; !rc && il < hp->n_layer && r->mixer != BMOE_MIXER_SHORTCONV; il++)
        m->layers[il].n_head_kv = tmp[il] < 0 ? m->layers[il].n_head : tmp[il]; /* absent: head_count */
    free(tmp);
    if (rc) return rc;
    if ((rc = read_layer_kinds(L))) return rc; /* head_count_kv per layer for BMOE_MIXER_SHORTCONV */
    for (int il = 0; il < hp->n_layer; il++) {
        bmoe_layer *ly = &m->layers[il];
        if (r->mixer == BMOE_MIXER_SHORTCONV) ly->n_head_kv = hp->n_head_kv;
        if (ly->n_head % ly->n_head_kv != 0)
            return fail(L, 3, "%s: %s.attention.head_count %d is not a multiple of head_count_kv %d (layer %d)",
                        m->path, m->arch, ly->n_head, ly->n_head_kv, il);
    }
    hp->n_head_kv = m->layers[0].n_head_kv;
    int def_hd = hp->n_embd / hp->n_head;
    if ((rc = get_int(L, "attention.key_length", 0, def_hd, 1, MAX_DIM, &hp->head_dim))) return rc;
    if (hp->head_dim < 1) return fail(L, 3, "%s: %s.attention.key_length is missing and embedding_length < head_count", m->path, m->arch);
    if ((rc = get_int(L, "attention.value_length", 0, hp->head_dim, 1, MAX_DIM, &hp->head_dim_v))) return rc;
    hp->head_dim_swa = hp->head_dim;
    hp->head_dim_v_swa = hp->head_dim_v;
    if ((rc = get_real(L, "attention.layer_norm_rms_epsilon", 1, 0, 1e-30, 1.0, &hp->eps))) return rc;
    if ((rc = get_real(L, "rope.freq_base", 0, 10000.0, 1e-6, 1e30, &hp->rope_base))) return rc;
    if ((rc = get_int(L, "rope.dimension_count", 0, hp->head_dim, 0, hp->head_dim, &hp->n_rot))) return rc;
    if (hp->n_rot % 2 != 0)
        return fail(L, 3, "%s: %s.rope.dimension_count = %d is odd (it defaults to attention.key_length)", m->path,
                    m->arch, hp->n_rot);
    if (r->moe_layers != BMOE_MOE_NONE) { /* a dense architecture's graph reads none of these: they stay 0 */
        if ((rc = get_int(L, "expert_count", 0, 0, 0, MAX_EXPERTS, &hp->n_expert))) return rc;
        if ((rc = get_int_uniform(L, "expert_used_count", 0, 0, 0, MAX_EXPERTS, &hp->n_expert_used,
                                  "a per-layer top-k")))
            return rc;
        if ((rc = get_int_uniform(L, "expert_feed_forward_length", 0, 0, 0, MAX_DIM, &hp->n_ff_exp,
                                  "a per-layer expert width")))
            return rc;
    }
    /* leading dense blocks: read where llama.cpp's graph reads the key; elsewhere every block is MoE (all),
     * dense (none) or MoE by its router (by_router) */
    hp->n_dense_lead = r->moe_layers == BMOE_MOE_NONE ? hp->n_layer : 0;
    if (r->moe_layers == BMOE_MOE_LEAD_DENSE &&
        (rc = get_int(L, "leading_dense_block_count", 0, r->n_dense_lead, 0, hp->n_layer, &hp->n_dense_lead)))
        return rc;
    if (r->moe_layers != BMOE_MOE_NONE) {
        if ((rc = read_gating(L))) return rc;
    } else { /* no router: the recipe's fixed gating, only so that reports name one */
        hp->gating = arch_gating(r->gating);
        hp->norm_w = r->norm_w;
        hp->w_scale = 1.0;
    }
    if ((rc = read_shared_width(L))) return rc;
    if ((rc = read_recurrent(L))) return rc;
    if (r->swa == BMOE_SWA_REQUIRED && (rc = read_swa(L))) return rc;
    if (r->swa == BMOE_SWA_PERIODIC && (rc = read_swa_periodic(L))) return rc;
    hp->rope_scale = 1.0;
    if (r->rope_scaling && (rc = read_rope_scaling(L))) return rc;
    if ((rc = layer_geometry(L))) return rc;
    /* the attention scale: 1 (recipe), or 1/sqrt(head dim), or at the recipe's block count (llama.cpp's
     * gemma3 27B, whose query_pre_attn_scalar is n_embd / n_head) 1/sqrt(n_embd / n_head), the integer
     * quotient as llama.cpp takes it */
    if (r->attn_scale_one) hp->attn_scale = 1.0;
    else if (r->attn_scale_embd_at > 0 && hp->n_layer == r->attn_scale_embd_at)
        hp->attn_scale = 1.0 / sqrt((double)(hp->n_embd / hp->n_head));
    else hp->attn_scale = 1.0 / sqrt((double)hp->head_dim);
    /* Final logit soft-capping, where the graph has it: llama.cpp's default when the key is absent is the
     * recipe's (gemma4 30, gemma3 none); 0 turns it off. */
    hp->softcap = 0.0;
    if (r->final_softcap &&
        (rc = get_real(L, "final_logit_softcapping", 0, r->softcap_default, 0.0, 1e30, &hp->softcap)))
        return rc;
    return 0;
}

static int read_vocab_size(loader *L) {
    const gguf_kv *kv = gguf_find_kv(L->m->g, "tokenizer.ggml.tokens");
    if (!kv) return fail(L, 3, "%s: required metadata key tokenizer.ggml.tokens is missing", L->m->path);
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING)
        return fail(L, 3, "%s: tokenizer.ggml.tokens is not an array of strings", L->m->path);
    if (kv->n < 1 || kv->n > MAX_VOCAB)
        return fail(L, 3, "%s: tokenizer.ggml.tokens has %llu entries (1..%d allowed)", L->m->path,
                    (unsigned long long)kv->n, MAX_VOCAB);
    L->m->hp.n_vocab = (int)kv->n;
    return 0;
}

/* Records the layout of one expert tensor. Each tensor keeps its own type: llama.cpp's mixes give a
 * part different types in different layers (Q4_K_M's Q6_K ffn_down_exps in some layers) and its
 * narrow-row fallbacks give gate, up and down different types in one layer, so every size derived
 * from it (the expert's bytes, its slot, its cache cost) is per layer. */
static int expert_part(loader *L, int il, int part, const bmoe_weight *w) {
    bmoe_model *m = L->m;
    bmoe_layer *ly = &m->layers[il];
    bmoe_expert_part *p = &ly->exp_part[part];
    p->present = 1;
    snprintf(p->name, sizeof p->name, "%.*s", (int)(w->t->name.len < 63 ? w->t->name.len : 63), w->t->name.ptr);
    p->shard = w->t->shard;
    p->offset = w->t->offset;
    p->type = w->type;
    p->n_in = w->ne[0];
    p->n_out = w->ne[1];
    p->row_bytes = w->row_bytes;
    p->bytes = w->row_bytes * w->ne[1];
    p->stride = p->bytes;
    ly->expert_bytes += p->bytes;
    return 0;
}

/* Tensors of block il that the recipe says are not part of the architecture's graph, and parts of
 * llama.cpp's graphs the engine does not implement: refused, never ignored. */
static int refuse_foreign(loader *L, int il) {
    const bmoe_model *m = L->m;
    const bmoe_recipe *r = m->recipe;
    const bmoe_layer *ly = &m->layers[il];
    static const char *const unsupported[] = { "exp_probs_b.bias", "attn_qkv.weight" };
    const struct { const char *name; int allowed; } by_recipe[] = {
        { "attn_q.bias", r->qkv_bias != BMOE_BIAS_NONE },
        { "attn_k.bias", r->qkv_bias != BMOE_BIAS_NONE },
        { "attn_v.bias", r->qkv_bias != BMOE_BIAS_NONE },
        { "attn_output.bias", r->out_bias != BMOE_BIAS_NONE },
        { "attn_sinks.weight", r->attn_sinks },
        { "ffn_gate_inp.bias", r->router_bias != BMOE_BIAS_NONE },
        { "ffn_gate_exps.bias", r->expert_bias != BMOE_BIAS_NONE },
        { "ffn_up_exps.bias", r->expert_bias != BMOE_BIAS_NONE },
        { "ffn_down_exps.bias", r->expert_bias != BMOE_BIAS_NONE },
        { "ffn_gate_inp_shexp.weight", r->shared_expert == BMOE_SHEXP_GATED },
        { "layer_output_scale.weight", r->layer_scale != BMOE_BIAS_NONE },
        { "ffn_down_exps.scale", r->expert_scale != BMOE_BIAS_NONE },
    };
    char name[96];
    for (size_t u = 0; u < sizeof unsupported / sizeof unsupported[0]; u++) {
        if (u == 0 && r->probs_bias) continue;                /* exp_probs_b: bound with the router */
        if (u == 1 && ly->kind == BMOE_LAYER_DELTA) continue; /* attn_qkv: a delta-net layer's input */
        snprintf(name, sizeof name, "blk.%d.%s", il, unsupported[u]);
        if (gguf_find_tensor(m->g, name))
            return fail(L, 3, "%s: tensor %s is not implemented by the engine", m->path, name);
    }
    for (size_t u = 0; u < sizeof by_recipe / sizeof by_recipe[0]; u++) {
        snprintf(name, sizeof name, "blk.%d.%s", il, by_recipe[u].name);
        if (!by_recipe[u].allowed && gguf_find_tensor(m->g, name))
            return fail(L, 3, "%s: tensor %s is not part of llama.cpp's %s graph", m->path, name, m->arch);
    }
    return 0;
}

static int bind_tensors(loader *L) {
    bmoe_model *m = L->m;
    const bmoe_hparams *hp = &m->hp;
    const bmoe_recipe *r = m->recipe;
    uint64_t d = (uint64_t)hp->n_embd, V = (uint64_t)hp->n_vocab;
    uint64_t hd_global = (uint64_t)hp->head_dim; /* rope_freqs: the global layers' head dim */
    int rc;
    if ((rc = bind(L, "token_embd.weight", 1, 2, d, V, 1, &m->token_embd))) return rc;
    char output_norm_name[96];
    snprintf(output_norm_name, sizeof output_norm_name, "%s.weight", arch_output_norm(r));
    if ((rc = bind_vec(L, output_norm_name, 1, d, &m->output_norm))) return rc;
    if ((rc = bind(L, "output.weight", r->output_required, 2, d, V, 1, &m->output))) return rc;
    if (!m->output.t) { m->output = m->token_embd; m->output_tied = 1; }
    if (hp->n_layer < 1) return fail(L, 3, "%s: %s.block_count is 0", m->path, m->arch);
    int any_global = 0;
    for (int il = 0; il < hp->n_layer; il++) any_global |= !(m->swa_pattern && m->swa_pattern[il]);
    if (r->rope_freqs && any_global) { /* llama.cpp: required once a layer is global */
        if ((rc = bind_vec(L, "rope_freqs.weight", 1, hd_global / 2, &m->rope_freqs))) return rc;
        const gguf_tensor *rt = gguf_find_tensor(m->g, "rope_freqs.weight");
        int mapped = rt && m->maps && m->maps[rt->shard]; /* `bmoe info` does not map: no values to check */
        for (uint64_t j = 0; mapped && j < hd_global / 2; j++)
            if (!(m->rope_freqs[j] > 0.0f && isfinite(m->rope_freqs[j]))) /* gemma4 writes 1e30: an unrotated dim */
                return fail(L, 3, "%s: rope_freqs.weight[%llu] = %g is not a positive finite divisor", m->path,
                            (unsigned long long)j, (double)m->rope_freqs[j]);
    }

    m->moe_layers = calloc((size_t)hp->n_layer, sizeof *m->moe_layers);
    if (!m->layers || !m->moe_layers) return fail(L, 1, "out of memory");
    for (int il = 0; il < hp->n_layer; il++) {
        bmoe_layer *ly = &m->layers[il];
        /* this layer's geometry (layer_geometry) */
        uint64_t hd = (uint64_t)ly->head_dim, hdv = (uint64_t)ly->head_dim_v;
        uint64_t H = (uint64_t)ly->n_head, Hkv = (uint64_t)ly->n_head_kv;
        ly->kind = m->layer_kinds[il];
        ly->kv_slot = -1;
        if ((rc = bind_layer_vec(L, il, "attn_norm", 1, d, &ly->attn_norm))) return rc;
        if (ly->kind == BMOE_LAYER_ATTN) {
            ly->kv_slot = m->n_attn_layers++;
            uint64_t qrows = H * hd * (r->attn_gate ? 2 : 1); /* a gated head's queries, then its gate */
            if ((rc = bind_layer(L, il, "attn_q", 1, 2, d, qrows, 1, &ly->attn_q))) return rc;
            if ((rc = bind_layer(L, il, "attn_k", 1, 2, d, Hkv * hd, 1, &ly->attn_k))) return rc;
            /* gemma4 may leave v out: v is then k's projection (llama.cpp's use_alternative_attention) */
            if ((rc = bind_layer(L, il, "attn_v", !r->v_from_k, 2, d, Hkv * hdv, 1, &ly->attn_v))) return rc;
            if ((rc = bind_layer(L, il, "attn_output", 1, 2, H * hdv, d, 1, &ly->attn_output))) return rc;
            if ((rc = bind_layer_vec(L, il, "attn_q_norm", r->qk_norm, hd, &ly->attn_q_norm))) return rc;
            if ((rc = bind_layer_vec(L, il, "attn_k_norm", r->qk_norm, hd, &ly->attn_k_norm))) return rc;
            if ((rc = bind_layer_bias(L, il, "attn_q", r->qkv_bias, H * hd, &ly->attn_q_b))) return rc;
            if ((rc = bind_layer_bias(L, il, "attn_k", r->qkv_bias, Hkv * hd, &ly->attn_k_b))) return rc;
            if ((rc = bind_layer_bias(L, il, "attn_v", r->qkv_bias, Hkv * hdv, &ly->attn_v_b))) return rc;
            if ((rc = bind_layer_bias(L, il, "attn_output", r->out_bias, d, &ly->attn_output_b))) return rc;
            if ((rc = bind_layer_vec(L, il, "attn_sinks", r->attn_sinks, H, &ly->attn_sinks))) return rc;
        } else if ((rc = bind_recurrent(L, il))) {
            return rc;
        }
        if (r->layer_scale != BMOE_BIAS_NONE) {
            float *sc = NULL;
            if ((rc = bind_layer_vec(L, il, "layer_output_scale", r->layer_scale == BMOE_BIAS_REQUIRED, 1, &sc)))
                return rc;
            if (sc) ly->out_scale = sc[0]; /* `bmoe info` maps nothing: 0 there, never run */
            free(sc);
        }
        /* the norm of the attention's output, in recipes with post norms; elsewhere a tensor of that name
         * may be the FFN's input norm (qwen35moe, gpt-oss), never this */
        if (r->post_norms && (rc = bind_layer_vec(L, il, "post_attention_norm", 1, d, &ly->post_attention_norm)))
            return rc;
        if ((rc = bind_layer_vec(L, il, arch_ffn_norm(r), 1, d, &ly->ffn_norm))) return rc;

        char name[96];
        if ((rc = refuse_foreign(L, il))) return rc;
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", il);
        int has_router = gguf_find_tensor(m->g, name) != NULL;
        if (r->moe_layers == BMOE_MOE_NONE && has_router)
            return fail(L, 3, "%s: tensor %s: llama.cpp's %s graph has no routed experts", m->path, name, m->arch);
        /* which blocks are MoE (arch.h, bmoe_moe_layers); a block that must be MoE needs its router */
        ly->is_moe = r->moe_layers == BMOE_MOE_BY_ROUTER ? has_router
                     : r->moe_layers != BMOE_MOE_NONE && il >= hp->n_dense_lead;
        if (ly->is_moe && !has_router) return fail(L, 3, "%s: tensor %s is missing", m->path, name);
        if (!ly->is_moe) {
            if (ly->n_ff < 1)
                return fail(L, 3, "%s: layer %d is dense but %s.feed_forward_length is missing", m->path, il, m->arch);
            uint64_t F = (uint64_t)ly->n_ff;
            if ((rc = bind_layer(L, il, "ffn_gate", 1, 2, d, F, 1, &ly->ffn_gate))) return rc;
            if ((rc = bind_layer(L, il, "ffn_up", 1, 2, d, F, 1, &ly->ffn_up))) return rc;
            if ((rc = bind_layer(L, il, "ffn_down", 1, 2, F, d, 1, &ly->ffn_down))) return rc;
            if ((rc = bind_layer_vec(L, il, "post_ffw_norm", r->post_norms, d, &ly->post_ffw_norm))) return rc;
            continue;
        }
        /* a MoE layer */
        if (hp->n_expert < 1) return fail(L, 3, "%s: required metadata key %s.expert_count is missing", m->path, m->arch);
        if (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)
            return fail(L, 3, "%s: %s.expert_used_count = %d must be in [1, expert_count = %d]", m->path, m->arch,
                        hp->n_expert_used, hp->n_expert);
        if (hp->n_ff_exp < 1)
            return fail(L, 3, "%s: required metadata key %s.expert_feed_forward_length is missing", m->path, m->arch);
        uint64_t E = (uint64_t)hp->n_expert, f = (uint64_t)hp->n_ff_exp;
        if ((rc = bind_layer(L, il, "ffn_gate_inp", 1, 2, d, E, 1, &ly->ffn_gate_inp))) return rc;
        if ((rc = bind_layer_bias(L, il, "ffn_gate_inp", r->router_bias, E, &ly->ffn_gate_inp_b))) return rc;
        if (r->expert_bias != BMOE_BIAS_NONE) { /* small and resident: never streamed with the experts */
            int req = r->expert_bias == BMOE_BIAS_REQUIRED;
            snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.bias", il);
            if ((rc = bind_rows_f32(L, name, req && !r->fused_gate_up, f, E, &ly->exp_gate_b))) return rc;
            snprintf(name, sizeof name, "blk.%d.ffn_up_exps.bias", il);
            if ((rc = bind_rows_f32(L, name, req && !r->fused_gate_up, f, E, &ly->exp_up_b))) return rc;
            snprintf(name, sizeof name, "blk.%d.ffn_down_exps.bias", il);
            if ((rc = bind_rows_f32(L, name, req, d, E, &ly->exp_down_b))) return rc;
        }
        if (r->probs_bias) {
            snprintf(name, sizeof name, "blk.%d.exp_probs_b.bias", il);
            if ((rc = bind_vec(L, name, 1, E, &ly->exp_probs_b))) return rc;
        }
        if (r->router_prescale) {
            snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.scale", il);
            if ((rc = bind_vec(L, name, 1, d, &ly->ffn_gate_inp_s))) return rc;
        }
        if (r->fused_gate_up) {
            if ((rc = bind_layer(L, il, "ffn_gate_up_exps", 1, 3, d, 2 * f, E, &ly->exps[BMOE_EXP_GATE_UP]))) return rc;
            if ((rc = expert_part(L, il, BMOE_EXP_GATE_UP, &ly->exps[BMOE_EXP_GATE_UP]))) return rc;
        } else {
            if ((rc = bind_layer(L, il, "ffn_gate_exps", 1, 3, d, f, E, &ly->exps[BMOE_EXP_GATE]))) return rc;
            if ((rc = expert_part(L, il, BMOE_EXP_GATE, &ly->exps[BMOE_EXP_GATE]))) return rc;
            if ((rc = bind_layer(L, il, "ffn_up_exps", 1, 3, d, f, E, &ly->exps[BMOE_EXP_UP]))) return rc;
            if ((rc = expert_part(L, il, BMOE_EXP_UP, &ly->exps[BMOE_EXP_UP]))) return rc;
        }
        if ((rc = bind_layer(L, il, "ffn_down_exps", 1, 3, f, d, E, &ly->exps[BMOE_EXP_DOWN]))) return rc;
        if (r->expert_scale != BMOE_BIAS_NONE) { /* expert e's output times scale[e], resident */
            snprintf(name, sizeof name, "blk.%d.ffn_down_exps.scale", il);
            if ((rc = bind_vec(L, name, r->expert_scale == BMOE_BIAS_REQUIRED, E, &ly->exp_out_s))) return rc;
        }
        if ((rc = expert_part(L, il, BMOE_EXP_DOWN, &ly->exps[BMOE_EXP_DOWN]))) return rc;
        if (r->shared_expert != BMOE_SHEXP_NONE) {
            int named = r->shared_expert == BMOE_SHEXP_NAMED || r->shared_expert == BMOE_SHEXP_GATED;
            if (hp->n_ff_shexp < 1)
                return fail(L, 3, "%s: required metadata key %s.%s is missing", m->path, m->arch,
                            r->shared_expert == BMOE_SHEXP_NAMED   ? "expert_shared_count"
                            : r->shared_expert == BMOE_SHEXP_GATED ? "expert_shared_feed_forward_length"
                                                                   : "feed_forward_length");
            /* gemma4's shared expert is its layer's feed_forward_length wide */
            uint64_t S = (uint64_t)(r->shared_expert == BMOE_SHEXP_FFN ? ly->n_ff : hp->n_ff_shexp);
            if (S < 1) return fail(L, 3, "%s: layer %d: %s.feed_forward_length is 0", m->path, il, m->arch);
            if ((rc = bind_layer(L, il, named ? "ffn_gate_shexp" : "ffn_gate", 1, 2, d, S, 1, &ly->ffn_gate))) return rc;
            if ((rc = bind_layer(L, il, named ? "ffn_up_shexp" : "ffn_up", 1, 2, d, S, 1, &ly->ffn_up))) return rc;
            if ((rc = bind_layer(L, il, named ? "ffn_down_shexp" : "ffn_down", 1, 2, S, d, 1, &ly->ffn_down))) return rc;
            if (r->shared_expert == BMOE_SHEXP_GATED &&
                (rc = bind_layer(L, il, "ffn_gate_inp_shexp", 1, 1, d, 1, 1, &ly->ffn_gate_inp_shexp)))
                return rc;
        }
        if (r->post_norms) {
            if ((rc = bind_layer_vec(L, il, "pre_ffw_norm_2", 1, d, &ly->pre_ffw_norm_2))) return rc;
            if ((rc = bind_layer_vec(L, il, "post_ffw_norm_1", 1, d, &ly->post_ffw_norm_1))) return rc;
            if ((rc = bind_layer_vec(L, il, "post_ffw_norm_2", 1, d, &ly->post_ffw_norm_2))) return rc;
            if ((rc = bind_layer_vec(L, il, "post_ffw_norm", 1, d, &ly->post_ffw_norm))) return rc;
        }
        m->moe_layers[m->n_moe_layers++] = il;
    }
    /* llama.cpp refuses a file with a tensor its loader did not create; the engine refuses one it did
     * not bind, rather than compute without weights the model has */
    for (uint64_t i = 0; i < m->g->n_tensors; i++)
        if (!L->used[i]) {
            const gguf_tensor *t = &m->g->tensors[i];
            return fail(L, 3, "%s: tensor %.*s is not part of the %s graph the engine implements", shard_path(m, t),
                        (int)(t->name.len > 80 ? 80 : t->name.len), t->name.ptr, m->arch);
        }
    return 0;
}

static int map_shards(loader *L) {
    bmoe_model *m = L->m;
    for (uint32_t s = 0; s < m->g->n_shards; s++) {
        const gguf_shard *sh = &m->g->shards[s];
        if (sh->size == 0 || sh->size > (uint64_t)SIZE_MAX) return fail(L, 3, "%s: cannot map a file of %llu bytes", sh->path, (unsigned long long)sh->size);
        void *p = mmap(NULL, (size_t)sh->size, PROT_READ, MAP_PRIVATE, sh->fd, 0);
        if (p == MAP_FAILED) return fail(L, 4, "%s: mmap failed: %s", sh->path, strerror(errno));
        m->maps[s] = p;
        m->map_len[s] = sh->size;
    }
    return 0;
}

int model_open(const char *path, int map, bmoe_model **out, char *err, size_t errlen) {
    *out = NULL;
    bmoe_model *m = calloc(1, sizeof *m);
    if (!m) { snprintf(err, errlen, "out of memory"); return 1; }
    loader L = { .m = m, .err = err, .errlen = errlen };
    int rc = 0;
    m->path = strdup(path);
    if (!m->path) { rc = fail(&L, 1, "out of memory"); goto fail; }

    char gerr[512] = "";
    int st = gguf_open(path, &m->g, gerr, sizeof gerr);
    if (st != BMOE_GGUF_OK || !m->g) {
        /* docs/design.md, engine: result and exit codes: an unreadable model file is exit 3 like a malformed one; 4 is kept for I/O
         * that fails once the model is open (a shard truncated mid-stream). */
        rc = st == BMOE_GGUF_ENOMEM ? 1 : 3;
        if (strstr(gerr, path)) fail(&L, rc, "%s", gerr);
        else fail(&L, rc, "%s: %s", path, gerr[0] ? gerr : "cannot open model");
        goto fail;
    }
    for (uint32_t s = 0; s < m->g->n_shards; s++) m->file_bytes += m->g->shards[s].size;

    gguf_str arch;
    char e[256] = "";
    int r = gguf_get_str(m->g, "general.architecture", &arch, e, sizeof e);
    if (r <= 0) {
        rc = r == 0 ? fail(&L, 3, "%s: required metadata key general.architecture is missing", path)
                    : bad_type(&L, "general.architecture", e);
        goto fail;
    }
    m->recipe = arch_recipe(arch.ptr, (unsigned long)arch.len);
    if (!m->recipe || arch.len >= sizeof m->arch) {
        char known[128];
        rc = fail(&L, 3, "%s: general.architecture '%.*s' is not supported (known: %s)", path,
                  (int)(arch.len > 40 ? 40 : arch.len), arch.ptr, arch_known(known, sizeof known));
        goto fail;
    }
    memcpy(m->arch, arch.ptr, arch.len);
    m->arch[arch.len] = 0;

    if ((rc = read_hparams(&L))) goto fail;
    if ((rc = read_vocab_size(&L))) goto fail;
    m->maps = calloc(m->g->n_shards, sizeof *m->maps);
    m->map_len = calloc(m->g->n_shards, sizeof *m->map_len);
    if (!m->maps || !m->map_len) { rc = fail(&L, 1, "out of memory"); goto fail; }
    if (map && (rc = map_shards(&L))) goto fail;
    L.used = calloc(m->g->n_tensors ? m->g->n_tensors : 1, 1);
    if (!L.used) { rc = fail(&L, 1, "out of memory"); goto fail; }
    if ((rc = bind_tensors(&L))) goto fail;
    free(L.used);
    L.used = NULL;
    *out = m;
    return 0;
fail:
    free(L.used);
    model_close(m);
    return rc ? rc : 1;
}

enum { DENSE_PER_LAYER = 16 };

size_t model_dense_capacity(const bmoe_model *m) { return 2 + (size_t)m->hp.n_layer * DENSE_PER_LAYER; }

size_t model_dense_weights(bmoe_model *m, bmoe_weight **out) {
    size_t n = 0;
    out[n++] = &m->token_embd;
    if (!m->output_tied) out[n++] = &m->output;
    for (int il = 0; il < m->hp.n_layer; il++) {
        bmoe_layer *ly = &m->layers[il];
        bmoe_weight *lw[DENSE_PER_LAYER] = {
            &ly->attn_q, &ly->attn_k, &ly->attn_v, &ly->attn_output,
            &ly->attn_qkv, &ly->attn_z, &ly->ssm_beta, &ly->ssm_alpha, &ly->ssm_out, &ly->sc_in, &ly->sc_out,
            &ly->ffn_gate, &ly->ffn_up, &ly->ffn_down, &ly->ffn_gate_inp, &ly->ffn_gate_inp_shexp,
        };
        for (int i = 0; i < DENSE_PER_LAYER; i++)
            if (lw[i]->t) out[n++] = lw[i];
    }
    return n;
}

void model_close(bmoe_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int il = 0; il < m->hp.n_layer; il++) {
            bmoe_layer *ly = &m->layers[il];
            free(ly->attn_norm); free(ly->attn_q_norm); free(ly->attn_k_norm); free(ly->post_attention_norm);
            free(ly->ffn_norm); free(ly->pre_ffw_norm_2); free(ly->post_ffw_norm_1); free(ly->post_ffw_norm_2);
            free(ly->post_ffw_norm); free(ly->ffn_gate_inp_s);
            free(ly->attn_q_b); free(ly->attn_k_b); free(ly->attn_v_b); free(ly->attn_output_b); free(ly->attn_sinks);
            free(ly->ffn_gate_inp_b); free(ly->exp_gate_b); free(ly->exp_up_b); free(ly->exp_down_b);
            free(ly->exp_out_s);
            free(ly->exp_probs_b);
            free(ly->ssm_conv1d); free(ly->ssm_dt); free(ly->ssm_a); free(ly->ssm_norm); free(ly->sc_conv);
        }
    }
    free(m->layers);
    free(m->moe_layers);
    free(m->output_norm);
    free(m->rope_freqs);
    free(m->swa_pattern);
    free(m->layer_kinds);
    if (m->maps && m->g)
        for (uint32_t s = 0; s < m->g->n_shards; s++)
            if (m->maps[s]) munmap(m->maps[s], (size_t)m->map_len[s]);
    free(m->maps);
    free(m->map_len);
    if (m->g) gguf_close(m->g);
    free(m->path);
    free(m);
}
