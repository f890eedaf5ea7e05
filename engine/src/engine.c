/* One engine instance, from configuration to result:
 *
 *   engine_open      config checks that need the model → model + tokenizer → threads → seam → forward
 *   engine_generate  prompt → prefill (one batch) → greedy decode → text, counters, timings
 *
 * The seam is where streaming plugs in: in --mmap mode the expert source is the resident mapping and
 * there is no hook; otherwise the streaming source and its hook (stream_hook.c: expert memory, cache,
 * I/O lanes, prefetch, route trace, and the place the lossy policies plug in) are built in
 * build_seam(), which also builds the lossy knobs from the config (policies.c) and plugs them into
 * the hook; nothing else here or in forward.c knows about them.
 *
 * The scoring modes and sessions (--ppl, --ppl-step, --ppl-choices, --session) are engine_scoring.c's;
 * the instance's state both files share, and their common helpers, are engine_state.h's. */
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_scoring.h"
#include "engine_state.h"
#include "expert_checked.h"
#include "expert_resident.h"
#include "forward.h"
#include "model.h"
#include "policies.h"
#include "policy_report.h"
#include "seam.h"
#include "stream_hook.h"
#include "kernels.h"
#include "tensor.h"
#include "threads.h"
#include "tokenizer.h"

#define BMOE_DEFAULT_CTX 4096

/* The prompt as token ids: --prompt-tokens as given (checked against the vocabulary), or the
 * text's bytes (BOS first when the model asks for it); a scoring mode's inputs (engine_scoring.c). */
static int build_prompt(bmoe_engine *e, bmoe_error *err) {
    const bmoe_config *c = &e->cfg;
    int V = e->model->hp.n_vocab;
    if (e->mode != BMOE_MODE_RUN) return scoring_build_inputs(e, err);
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
    char *wrapped = NULL;
    char msg[256] = "";
    if (c->chat) { /* docs/engine-flags.md, --chat */
        int rc = tok_chat_wrap(&e->tok, p, &wrapped, msg, sizeof msg);
        if (rc == -3) return err_set(err, 1, NULL, "out of memory");
        if (rc) return err_set(err, 2, "config", "%s", msg);
        p = wrapped;
    }
    /* specials in the text are parsed (llama.cpp's parse_special), BOS/EOS as the model asks */
    int n = 0;
    int rc = tok_encode(&e->tok, (const uint8_t *)p, strlen(p), TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, &e->prompt, &n, msg,
                        sizeof msg);
    free(wrapped);
    if (rc == -3) return err_set(err, 1, NULL, "out of memory");
    if (rc) return err_set(err, 2, "config", "-p: %s", msg);
    if (n == 0) return err_set(err, 2, "config", "-p: the prompt is empty");
    if (n > BMOE_MAX_PROMPT_TOKENS)
        return err_set(err, 2, "config", "-p: %d tokens, at most %d prompt tokens are accepted", n, BMOE_MAX_PROMPT_TOKENS);
    e->n_prompt = n;
    return 0;
}

/* Every expert source is seen through the checker (expert_checked.h). */
static int checked_wrap(bmoe_engine *e, bmoe_expert_source inner, bmoe_error *err) {
    if (checked_init(&e->checked, inner, e->model)) return err_set(err, 1, NULL, "out of memory");
    e->seam.experts = checked_source(&e->checked);
    return 0;
}

/* Who provides expert weights and who sees the routing. */
static int build_seam(bmoe_engine *e, bmoe_error *err) {
    memset(&e->seam, 0, sizeof e->seam);
    /* The lossy knobs (policies.c). validate() has refused them with --mmap or without a cache;
     * policies_create() refuses that again, so no path runs a knob that cannot consult the cache. */
    if (e->top_k > 0) {
        bmoe_policy_opts po = {
            .drop_set = e->cfg.drop_set, .drop = e->cfg.drop, .drop_no_renorm = e->cfg.drop_no_renorm,
            .drop_in_prefill = e->cfg.drop_in_prefill, .subst_set = e->cfg.subst_set, .subst = e->cfg.subst,
            .mmap = e->cfg.mmap, .cache_mb = e->cfg.cache_mb,
        };
        int rc = policies_create(&e->policies, &po, e->top_k, e->model->hp.n_expert_used, e->model->hp.n_expert,
                                 e->max_batch, err);
        if (rc) return rc;
    }
    if (e->cfg.mmap) {
        e->seam.hook = NULL; /* no policies in the resident reference */
        resident_populate(e->model); /* the weights' first touch belongs to loading, as llama.cpp's does */
        int rc = checked_wrap(e, resident_source(&e->resident, e->model), err);
        /* and, the file being in memory now, every expert's check (in parallel), not each at its first use */
        if (!rc && (rc = checked_all(&e->checked, e->pool)))
            return err_set(err, rc, NULL, "%s", rc == 3 ? checked_error(&e->checked) : "out of memory");
        return rc;
    }
    /* Streaming: dense weights resident, experts read from the file into the expert memory of
     * docs/design.md, expert memory, behind the hook. Routing policies plug into the hook (stream_hook_set_policy). */
    bmoe_stream_hook_opts so = {
        .cache_mb = e->cfg.cache_mb, .odirect = !e->cfg.no_odirect, .io_lanes = e->cfg.io_threads,
        .prefetch = e->cfg.prefetch, .prefetch_sync = e->cfg.prefetch_sync, .route_trace = e->cfg.route_trace,
    };
    int rc = stream_hook_create(&e->stream, e->model, &so, e->top_k, e->max_batch, err);
    if (rc) return rc;
    if (e->policies) {
        bmoe_route_policy p = policies_route_policy(e->policies);
        stream_hook_set_policy(e->stream, &p);
    }
    e->seam.hook = stream_hook_fn;
    e->seam.hook_user = e->stream;
    return checked_wrap(e, stream_hook_source(e->stream), err);
}

int engine_open(const bmoe_config *cfg, bmoe_engine **out, bmoe_error *err) {
    *out = NULL;
    double t0 = engine_now_s();
    char msg[1024] = "";
    int rc = config_validate(cfg, msg, sizeof msg);
    if (rc) return err_set(err, 2, "config", "%s", msg);
    if ((rc = config_require_run(cfg, msg, sizeof msg))) return err_set(err, 2, "usage", "%s", msg);
    int kpath = -1; /* auto */
    if (cfg->kernels && bm_kpath_parse(cfg->kernels, &kpath))
        return err_set(err, 2, "config", "BMOE_KERNELS: unknown kernel path '%.40s' (auto, scalar, avx2, avx512-vnni, neon, neon-dot)",
                       cfg->kernels);
    if (kpath >= 0 && !bm_kpath_available((bm_kpath)kpath))
        return err_set(err, 2, "config", "BMOE_KERNELS: the %s kernels are not available on this CPU or build",
                       bm_kpath_name((bm_kpath)kpath));

    bmoe_engine *e = calloc(1, sizeof *e);
    if (!e) return err_set(err, 1, NULL, "out of memory");
    e->user = cfg;
    e->cfg = *cfg;

    rc = model_open(cfg->model, 1, &e->model, msg, sizeof msg);
    if (rc) { err_set(err, rc, NULL, "%s", msg); goto fail; }
    rc = check_dense_tensors(e->model, msg, sizeof msg);
    if (rc) { err_set(err, rc, NULL, "%s", msg); goto fail; }
    const bmoe_hparams *hp = &e->model->hp;
    rc = tok_load(&e->tok, e->model->g, e->model->path, msg, sizeof msg);
    if (rc) { err_set(err, rc, NULL, "%s", msg); goto fail; }
    e->tok_loaded = 1;

    /* A model without MoE layers has no routing for a knob to change: asking for one is an error, not a
     * silent no-op. The streaming flags stay valid (there is nothing to stream: every expert counter
     * reports 0). */
    if (e->model->n_moe_layers == 0 && (cfg->drop_set || cfg->subst_set || cfg->n_expert_used > 0)) {
        rc = err_set(err, 2, "config", "%s: the model (%s) has no MoE layers",
                     cfg->drop_set ? "--drop-cold-experts" : cfg->subst_set ? "--expert-substitute" : "--n-expert-used",
                     e->model->arch);
        goto fail;
    }

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

    e->mode = config_mode(cfg);
    if ((rc = build_prompt(e, err))) goto fail;
    if (e->mode == BMOE_MODE_RUN) e->max_batch = e->n_prompt;
    if (e->mode == BMOE_MODE_RUN && (long long)e->n_prompt + cfg->n_predict > e->cfg.ctx) {
        rc = err_set(err, 2, "config", "-c: %d prompt tokens + %d to predict (-n) do not fit a context of %d",
                     e->n_prompt, cfg->n_predict, e->cfg.ctx);
        goto fail;
    }

    e->pool = pool_create(cfg->threads);
    if (!e->pool) { rc = err_set(err, 1, NULL, "cannot start %d threads (-t)", cfg->threads); goto fail; }
    if ((rc = build_seam(e, err))) goto fail;
    /* docs/design.md, engine: result and exit codes: due when dropping is armed and the EFFECTIVE top-k is 4 or less */
    report_narrow_warning(e->warning, sizeof e->warning, cfg->drop_set, cfg->drop, e->top_k);
    rc = forward_create(&e->fwd, e->model, e->pool, &e->seam, e->cfg.ctx, e->max_batch, e->top_k, msg, sizeof msg);
    if (rc) { err_set(err, rc, NULL, "%s", msg); goto fail; }
    if (kpath >= 0) forward_set_kernels(e->fwd, (bm_kpath)kpath); /* available: checked above */

    size_t rows = e->mode == BMOE_MODE_PPL ? (size_t)e->max_batch : cfg->logits_out ? (size_t)e->n_prompt : 1;
    size_t n_out = e->mode == BMOE_MODE_SESSION ? (size_t)e->n_prompts * ((size_t)cfg->n_predict + 1)
                                                : (size_t)cfg->n_predict + 1;
    e->logits = malloc(rows * (size_t)hp->n_vocab * sizeof(float));
    e->out = malloc(n_out * sizeof *e->out);
    e->step_s = malloc(n_out * sizeof *e->step_s);
    if (!e->logits || !e->out || !e->step_s) { rc = err_set(err, 1, NULL, "out of memory"); goto fail; }
    e->timing.load_s = engine_now_s() - t0;
    *out = e;
    return 0;
fail:
    engine_close(e);
    return rc ? rc : 1;
}

int engine_generate(bmoe_engine *e, bmoe_error *err) {
    if (e->mode != BMOE_MODE_RUN) return scoring_run(e, err);
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
    double t0 = engine_now_s();
    int all = lf != NULL;
    rc = forward_eval(e->fwd, e->prompt, P, 0, 0, 0, all, e->logits, msg, sizeof msg);
    if (rc) { engine_forward_failed(e, err, rc, msg); goto done; }
    const float *last = e->logits + (all ? (size_t)(P - 1) * V : 0);
    if (lf && engine_write_logits(lf, e->logits, (size_t)P * V)) goto write_failed;
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
        if (engine_append_text(e, tok)) { rc = err_set(err, 1, NULL, "out of memory"); goto done; }
    }
    double t1 = engine_now_s();
    e->timing.prefill_s = t1 - t0;

    /* decode: one token at a time; the last sampled token is not evaluated. Any end-of-generation
     * token ends it (tok_is_eog: EOS, EOT, <|im_end|>, ... as llama.cpp decides) and is kept in the output. */
    int steps = 0;
    while (e->n_out < c->n_predict && !tok_is_eog(&e->tok, tok)) {
        double ts = engine_now_s();
        rc = forward_eval(e->fwd, &tok, 1, P + steps, 1, steps, 0, e->logits, msg, sizeof msg);
        if (rc) { engine_forward_failed(e, err, rc, msg); goto done; }
        if (lf && engine_write_logits(lf, e->logits, (size_t)V)) goto write_failed;
        e->step_s[steps++] = engine_now_s() - ts;
        tok = argmax_first(e->logits, V);
        e->out[e->n_out++] = tok;
        if (engine_append_text(e, tok)) { rc = err_set(err, 1, NULL, "out of memory"); goto done; }
    }
    e->timing.decode_s = engine_now_s() - t1;
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
    r->stop = engine_stop_reason(e, e->out, e->n_out);
    r->text = e->text;
    r->text_len = e->text_len;
    r->counters = e->counters;
    if (e->stream) r->n_flash_layers = stream_hook_flash_layers(e->stream, &r->flash_layer_reads, &r->flash_layer_bytes);
    r->timing = e->timing;
    r->kernels = bm_kpath_name(forward_kernels(e->fwd));
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
    checked_free(&e->checked);
    model_close(e->model);
    free(e->prompt);
    free(e->out);
    free(e->step_s);
    free(e->text);
    free(e->logits);
    scoring_free(e);
    free(e);
}

void engine_summary(const bmoe_engine *e, FILE *out) { scoring_summary(e, out); }

enum bmoe_mode engine_mode(const bmoe_engine *e) { return e->mode; }
