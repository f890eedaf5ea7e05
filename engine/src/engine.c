/* One engine instance, from configuration to result:
 *
 *   engine_open      config checks that need the model → model + tokenizer → threads → seam → forward
 *   engine_generate  prompt → prefill (one batch) → greedy decode → text, counters, timings
 *
 * The seam is where streaming plugs in: in --mmap mode the expert source is the resident mapping and
 * there is no hook; otherwise the streaming source and its hook (stream_hook.c: expert memory, cache,
 * I/O lanes, prefetch, route trace, and the place the lossy policies plug in) are built in
 * build_seam(), which also builds the lossy knobs from the config (policies.c) and plugs them into
 * the hook; nothing else here or in forward.c knows about them. */
#include "engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "expert_resident.h"
#include "forward.h"
#include "model.h"
#include "policies.h"
#include "policy_report.h"
#include "seam.h"
#include "stream_hook.h"
#include "threads.h"
#include "tokenizer.h"

#define BMOE_DEFAULT_CTX 4096

struct bmoe_engine {
    const bmoe_config *user;     /* as given */
    bmoe_config cfg;             /* effective copy: ctx and n_expert_used resolved (shares pointers with user) */
    bmoe_model *model;
    bmoe_tokenizer tok;
    int tok_loaded;
    bmoe_pool *pool;
    bmoe_resident resident;
    bmoe_stream_hook *stream;    /* the streaming source + hook; NULL in --mmap mode */
    bmoe_policies *policies;     /* the lossy knobs behind the hook; NULL when none is armed */
    char warning[512];           /* the narrow-routing warning ("" when not due) */
    bmoe_seam seam;
    bmoe_forward *fwd;
    int top_k;                   /* effective top-k (0 for a model without MoE layers) */
    int32_t *prompt;
    int n_prompt;
    int32_t *out;                /* generated tokens */
    int n_out;
    double *step_s;              /* wall time of each decode step (measurement only; never read back) */
    uint8_t *text;
    size_t text_len, text_cap;
    float *logits;               /* [n_prompt, V] when --logits-out, else [V] */
    bmoe_result res;
    bmoe_counters counters;
    bmoe_timing timing;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The prompt as token ids: --prompt-tokens as given (checked against the vocabulary), or the
 * text's bytes (BOS first when the model asks for it). */
static int build_prompt(bmoe_engine *e, bmoe_error *err) {
    const bmoe_config *c = &e->cfg;
    int V = e->model->hp.n_vocab;
    if (c->prompt_tokens) {
        if (c->n_prompt_tokens < 1) return err_set(err, 2, "config", "--prompt-tokens: the prompt is empty");
        e->prompt = malloc((size_t)c->n_prompt_tokens * sizeof *e->prompt);
        if (!e->prompt) return err_set(err, 1, NULL, "out of memory");
        for (int i = 0; i < c->n_prompt_tokens; i++) {
            if (c->prompt_tokens[i] < 0 || c->prompt_tokens[i] >= V)
                return err_set(err, 2, "config", "--prompt-tokens: token id %d at position %d is not below the vocabulary size %d",
                               (int)c->prompt_tokens[i], i, V);
            e->prompt[i] = c->prompt_tokens[i];
        }
        e->n_prompt = c->n_prompt_tokens;
        return 0;
    }
    const char *p = c->prompt ? c->prompt : "";
    size_t len = strlen(p);
    if (len > BMOE_MAX_PROMPT_TOKENS) /* one token per byte */
        return err_set(err, 2, "config", "-p: %zu bytes, at most %d prompt tokens are accepted", len, BMOE_MAX_PROMPT_TOKENS);
    int cap = (int)len + 1;
    e->prompt = malloc((size_t)cap * sizeof *e->prompt);
    if (!e->prompt) return err_set(err, 1, NULL, "out of memory");
    char msg[256] = "";
    int n = tok_encode(&e->tok, (const uint8_t *)p, len, e->prompt, cap, msg, sizeof msg);
    if (n < 0) return err_set(err, 2, "config", "%s", n == -1 ? msg : "-p: prompt too long");
    if (n == 0) return err_set(err, 2, "config", "-p: the prompt is empty");
    e->n_prompt = n;
    return 0;
}

/* Who provides expert weights and who sees the routing. */
static int build_seam(bmoe_engine *e, bmoe_error *err) {
    memset(&e->seam, 0, sizeof e->seam);
    /* The lossy knobs (policies.c). validate() has refused them with --mmap or without a cache;
     * policies_create() refuses that again, so no path runs a knob that cannot consult the cache. */
    if (e->top_k > 0) {
        int rc = policies_create(&e->policies, &e->cfg, e->top_k, e->model->hp.n_expert_used, e->model->hp.n_expert,
                                 e->n_prompt, err);
        if (rc) return rc;
    }
    if (e->cfg.mmap) {
        e->seam.experts = resident_source(&e->resident, e->model);
        e->seam.hook = NULL; /* no policies in the resident reference */
        return 0;
    }
    /* Streaming: dense weights resident, experts read from the file into the expert memory of
     * docs/design.md, expert memory, behind the hook. Routing policies plug into the hook (stream_hook_set_policy). */
    int rc = stream_hook_create(&e->stream, e->model, &e->cfg, e->top_k, e->n_prompt, err);
    if (rc) return rc;
    if (e->policies) {
        bmoe_route_policy p = policies_route_policy(e->policies);
        stream_hook_set_policy(e->stream, &p);
    }
    e->seam.experts = stream_hook_source(e->stream);
    e->seam.hook = stream_hook_fn;
    e->seam.hook_user = e->stream;
    return 0;
}

/* A forward pass stopped: the hook's own message when it was the hook that stopped it. */
static int forward_failed(bmoe_engine *e, bmoe_error *err, int rc, const char *msg) {
    const char *hm = e->stream ? stream_hook_error(e->stream) : "";
    return err_set(err, rc, NULL, "%s", hm[0] ? hm : msg);
}

int engine_open(const bmoe_config *cfg, bmoe_engine **out, bmoe_error *err) {
    *out = NULL;
    double t0 = now_s();
    char msg[1024] = "";
    int rc = config_validate(cfg, msg, sizeof msg);
    if (rc) return err_set(err, 2, "config", "%s", msg);
    if ((rc = config_require_run(cfg, msg, sizeof msg))) return err_set(err, 2, "usage", "%s", msg);

    bmoe_engine *e = calloc(1, sizeof *e);
    if (!e) return err_set(err, 1, NULL, "out of memory");
    e->user = cfg;
    e->cfg = *cfg;

    rc = model_open(cfg->model, 1, &e->model, msg, sizeof msg);
    if (rc) { err_set(err, rc, NULL, "%s", msg); goto fail; }
    const bmoe_hparams *hp = &e->model->hp;
    rc = tok_load(&e->tok, e->model->g, e->model->path, msg, sizeof msg);
    if (rc) { err_set(err, rc, NULL, "%s", msg); goto fail; }
    e->tok_loaded = 1;

    /* the effective top-k and context */
    if (e->model->n_moe_layers > 0) {
        e->top_k = cfg->n_expert_used > 0 ? cfg->n_expert_used : hp->n_expert_used;
        if (e->top_k > hp->n_expert) {
            rc = err_set(err, 2, "config", "--n-expert-used: %d exceeds the model's %d experts", e->top_k, hp->n_expert);
            goto fail;
        }
    }
    e->cfg.n_expert_used = e->top_k;
    if (cfg->ctx > hp->n_ctx_train) {
        rc = err_set(err, 2, "config", "-c: %d exceeds the model's context length %d", cfg->ctx, hp->n_ctx_train);
        goto fail;
    }
    e->cfg.ctx = cfg->ctx > 0 ? cfg->ctx : (hp->n_ctx_train < BMOE_DEFAULT_CTX ? hp->n_ctx_train : BMOE_DEFAULT_CTX);

    if ((rc = build_prompt(e, err))) goto fail;
    if ((long long)e->n_prompt + cfg->n_predict > e->cfg.ctx) {
        rc = err_set(err, 2, "config", "-c: %d prompt tokens + %d to predict (-n) do not fit a context of %d",
                     e->n_prompt, cfg->n_predict, e->cfg.ctx);
        goto fail;
    }

    e->pool = pool_create(cfg->threads);
    if (!e->pool) { rc = err_set(err, 1, NULL, "cannot start %d threads (-t)", cfg->threads); goto fail; }
    if ((rc = build_seam(e, err))) goto fail;
    /* docs/design.md, engine: result and exit codes: due when dropping is armed and the EFFECTIVE top-k is 4 or less */
    report_narrow_warning(e->warning, sizeof e->warning, cfg->drop_set, cfg->drop, e->top_k);
    rc = forward_create(&e->fwd, e->model, e->pool, &e->seam, e->cfg.ctx, e->n_prompt, e->top_k, msg, sizeof msg);
    if (rc) { err_set(err, rc, NULL, "%s", msg); goto fail; }

    size_t rows = cfg->logits_out ? (size_t)e->n_prompt : 1;
    e->logits = malloc(rows * (size_t)hp->n_vocab * sizeof(float));
    e->out = malloc(((size_t)cfg->n_predict + 1) * sizeof *e->out);
    e->step_s = malloc(((size_t)cfg->n_predict + 1) * sizeof *e->step_s);
    if (!e->logits || !e->out || !e->step_s) { rc = err_set(err, 1, NULL, "out of memory"); goto fail; }
    e->timing.load_s = now_s() - t0;
    *out = e;
    return 0;
fail:
    engine_close(e);
    return rc ? rc : 1;
}

static int append_text(bmoe_engine *e, int32_t tok) {
    size_t n;
    const uint8_t *piece = tok_piece(&e->tok, tok, &n);
    if (n == 0) return 0;
    if (e->text_len + n > e->text_cap) {
        size_t cap = e->text_cap ? e->text_cap * 2 : 256;
        while (cap < e->text_len + n) cap *= 2;
        uint8_t *p = realloc(e->text, cap);
        if (!p) return 1;
        e->text = p;
        e->text_cap = cap;
    }
    memcpy(e->text + e->text_len, piece, n);
    e->text_len += n;
    return 0;
}

/* Raw little-endian f32 rows. */
static int write_logits(FILE *f, const float *v, size_t n) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe == 1) return fwrite(v, sizeof(float), n, f) == n ? 0 : -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        uint8_t b[4] = { (uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24) };
        if (fwrite(b, 1, 4, f) != 4) return -1;
    }
    return 0;
}

int engine_generate(bmoe_engine *e, bmoe_error *err) {
    const bmoe_config *c = &e->cfg;
    int V = e->model->hp.n_vocab, P = e->n_prompt;
    char msg[1024];
    FILE *lf = NULL;
    int rc = 0;
    if (c->logits_out) {
        lf = fopen(c->logits_out, "wb");
        if (!lf) return err_set(err, 4, NULL, "--logits-out: cannot open %s: %s", c->logits_out, strerror(errno));
    }

    /* prefill: the whole prompt as one batch */
    double t0 = now_s();
    int all = lf != NULL;
    rc = forward_eval(e->fwd, e->prompt, P, 0, 0, 0, all, e->logits, msg, sizeof msg);
    if (rc) { forward_failed(e, err, rc, msg); goto done; }
    const float *last = e->logits + (all ? (size_t)(P - 1) * V : 0);
    if (lf && write_logits(lf, e->logits, (size_t)P * V)) goto write_failed;
    e->n_out = 0;
    int32_t tok = -1;
    if (c->n_predict > 0) {
        tok = argmax_first(last, V);
#ifdef BMOE_FAULT_BATCH_STATE
        {   /* Fault: state carried from one engine instance to the next in a process (DET-batch). */
            static int instances;
            if (instances++ > 0) tok = (tok + 1) % V;
        }
#endif
        e->out[e->n_out++] = tok;
        if (append_text(e, tok)) { rc = err_set(err, 1, NULL, "out of memory"); goto done; }
    }
    double t1 = now_s();
    e->timing.prefill_s = t1 - t0;

    /* decode: one token at a time; the last sampled token is not evaluated */
    int steps = 0;
    while (e->n_out < c->n_predict && tok != e->tok.eos) {
        double ts = now_s();
        rc = forward_eval(e->fwd, &tok, 1, P + steps, 1, steps, 0, e->logits, msg, sizeof msg);
        if (rc) { forward_failed(e, err, rc, msg); goto done; }
        if (lf && write_logits(lf, e->logits, (size_t)V)) goto write_failed;
        e->step_s[steps++] = now_s() - ts;
        tok = argmax_first(e->logits, V);
        e->out[e->n_out++] = tok;
        if (append_text(e, tok)) { rc = err_set(err, 1, NULL, "out of memory"); goto done; }
    }
    e->timing.decode_s = now_s() - t1;
    e->timing.decode_tok_s = steps > 0 && e->timing.decode_s > 0 ? steps / e->timing.decode_s : 0.0;

    if (e->stream) {
        if ((rc = stream_hook_finish(e->stream, err))) goto done;
        stream_hook_counters(e->stream, &e->counters);
    }
    e->counters.experts_routed = forward_experts_routed(e->fwd);
    bmoe_result *r = &e->res;
    memset(r, 0, sizeof *r);
    r->config = &e->cfg;
    r->model = e->model;
    r->top_k_effective = e->top_k;
    r->prompt_tokens = e->prompt;
    r->n_prompt_tokens = P;
    r->tokens = e->out;
    r->n_tokens = e->n_out;
    r->text = e->text;
    r->text_len = e->text_len;
    r->counters = e->counters;
    r->timing = e->timing;
    r->decode_step_s = e->step_s;
    r->n_decode_steps = steps;
    if (e->warning[0] && r->n_warnings < BMOE_MAX_WARNINGS) r->warnings[r->n_warnings++] = e->warning;
    if (e->stream)
        r->n_warnings += stream_hook_warnings(e->stream, r->warnings + r->n_warnings, BMOE_MAX_WARNINGS - r->n_warnings);
    goto done;
write_failed:
    rc = err_set(err, 4, NULL, "--logits-out: cannot write %s: %s", c->logits_out, strerror(errno));
done:
    if (lf && fclose(lf) != 0 && rc == 0)
        rc = err_set(err, 4, NULL, "--logits-out: cannot write %s: %s", c->logits_out, strerror(errno));
    return rc;
}

const bmoe_result *engine_result(const bmoe_engine *e) { return &e->res; }

const char *engine_load_warning(const bmoe_engine *e) { return e && e->warning[0] ? e->warning : NULL; }

void engine_close(bmoe_engine *e) {
    if (!e) return;
    forward_free(e->fwd);
    stream_hook_destroy(e->stream); /* before the model: it owns the dense weights' memory */
    policies_destroy(e->policies);
    pool_destroy(e->pool);
    if (e->tok_loaded) tok_free(&e->tok);
    model_close(e->model);
    free(e->prompt);
    free(e->out);
    free(e->step_s);
    free(e->text);
    free(e->logits);
    free(e);
}
