/* The scoring modes and sessions of one engine instance (engine_scoring.h, docs/engine-flags.md,
 * scoring). Every forward pass goes through the same seam as a run's. */
#include "engine_scoring.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "kernels.h"
#include "tensor.h"

static const char *mode_flag(enum bmoe_mode m) {
    return m == BMOE_MODE_PPL ? "--ppl" : m == BMOE_MODE_PPL_STEP ? "--ppl-step"
         : m == BMOE_MODE_CHOICES ? "--ppl-choices" : "--session";
}

static const char *mode_name(enum bmoe_mode m) { return mode_flag(m) + 2; }

/* Reads the mode's input file and sets the tokens, the largest batch and the per-input arrays. */
int scoring_build_inputs(bmoe_engine *e, bmoe_error *err) {
    const bmoe_config *c = &e->cfg;
    const char *flag = mode_flag(e->mode);
    int ctx = c->ctx;
    if (e->mode == BMOE_MODE_PPL || e->mode == BMOE_MODE_PPL_STEP) {
        const char *path = e->mode == BMOE_MODE_PPL ? c->ppl : c->ppl_step;
        int rc = score_text_tokens(flag, path, &e->tok, &e->prompt, &e->n_prompt, err);
        if (rc) return rc;
        if (ctx < 2) return err_set(err, 2, "config", "-c: a context of %d cannot score (at least 2 positions)", ctx);
        e->max_batch = e->mode == BMOE_MODE_PPL ? (e->n_prompt < ctx ? e->n_prompt : ctx) : 1;
        return 0;
    }
    uint8_t *buf;
    size_t len;
    const char *path = e->mode == BMOE_MODE_CHOICES ? c->ppl_choices : c->session;
    int rc = score_read_file(flag, path, &buf, &len, err);
    if (rc) return rc;
    if (e->mode == BMOE_MODE_CHOICES) rc = choices_parse(path, buf, len, &e->questions, &e->n_questions, err);
    else rc = session_parse(path, buf, len, &e->prompts, &e->n_prompts, err);
    free(buf);
    if (rc) return rc;
    e->max_batch = 1;
    if (e->mode == BMOE_MODE_CHOICES) {
        e->chosen = calloc((size_t)e->n_questions, sizeof *e->chosen);
        e->option_lp = calloc((size_t)e->n_questions, sizeof *e->option_lp);
        e->qtok = calloc((size_t)e->n_questions, sizeof *e->qtok);
        if (!e->chosen || !e->option_lp || !e->qtok) return err_set(err, 1, NULL, "out of memory");
        for (int i = 0; i < e->n_questions && !rc; i++) {
            const choice_question *q = &e->questions[i];
            e->option_lp[i] = calloc((size_t)q->n_options, sizeof **e->option_lp);
            if (!e->option_lp[i]) { rc = err_set(err, 1, NULL, "out of memory"); break; }
            choice_tokens *t = &e->qtok[i];
            if ((rc = choice_tokens_build(&e->tok, q, flag, path, t, err))) break;
            int longest = 0;
            for (int k = 0; k < q->n_options; k++)
                if (t->n_opt[k] > longest) longest = t->n_opt[k];
            if ((long long)t->n_prefix + longest - 1 > ctx)
                rc = err_set(err, 2, "config", "%s: %s: line %d: %d context tokens + %d option tokens do not fit a context of %d",
                             flag, path, q->line, t->n_prefix, longest, ctx);
        }
    } else {
        e->prompt_ids = calloc((size_t)e->n_prompts, sizeof *e->prompt_ids);
        e->prompt_len = calloc((size_t)e->n_prompts, sizeof *e->prompt_len);
        e->gen_off = calloc((size_t)e->n_prompts, sizeof *e->gen_off);
        e->gen_len = calloc((size_t)e->n_prompts, sizeof *e->gen_len);
        e->text_off = calloc((size_t)e->n_prompts, sizeof *e->text_off);
        e->text_end = calloc((size_t)e->n_prompts, sizeof *e->text_end);
        e->prompt_counters = calloc((size_t)e->n_prompts, sizeof *e->prompt_counters);
        if (!e->prompt_ids || !e->prompt_len || !e->gen_off || !e->gen_len || !e->text_off || !e->text_end ||
            !e->prompt_counters)
            return err_set(err, 1, NULL, "out of memory");
        for (int i = 0; i < e->n_prompts && !rc; i++) {
            const session_prompt *p = &e->prompts[i];
            int n = 0;
            if ((rc = session_tokens(&e->tok, p, flag, path, &e->prompt_ids[i], &n, err))) break;
            if ((long long)n + c->n_predict > ctx) {
                rc = err_set(err, 2, "config", "%s: %s: line %d: %d prompt tokens + %d to predict (-n) do not fit a context of %d",
                             flag, path, p->line, n, c->n_predict, ctx);
                break;
            }
            e->prompt_len[i] = n;
            if (n > e->max_batch) e->max_batch = n;
        }
    }
    return rc;
}

/* The run's counters so far: the hook's and forward.c's experts_routed. */
static void counters_now(const bmoe_engine *e, bmoe_counters *c) {
    memset(c, 0, sizeof *c);
    if (e->stream) stream_hook_counters(e->stream, c);
    c->experts_routed = forward_experts_routed(e->fwd);
}

static void counters_sub(bmoe_counters *d, const bmoe_counters *a, const bmoe_counters *b) {
    d->experts_routed = a->experts_routed - b->experts_routed;
    d->experts_dropped = a->experts_dropped - b->experts_dropped;
    d->subst_examined = a->subst_examined - b->subst_examined;
    d->subst_changed = a->subst_changed - b->subst_changed;
    d->cache_hits = a->cache_hits - b->cache_hits;
    d->cache_misses = a->cache_misses - b->cache_misses;
    d->flash_bytes = a->flash_bytes - b->flash_bytes;
    d->flash_reads = a->flash_reads - b->flash_reads;
    d->prefetch_issued = a->prefetch_issued - b->prefetch_issued;
    d->prefetch_used = a->prefetch_used - b->prefetch_used;
    d->weight_routed = a->weight_routed - b->weight_routed;
    d->weight_dropped = a->weight_dropped - b->weight_dropped;
}

/* --ppl / --ppl-step: windows of at most ctx tokens that overlap by one token, so every next-token
 * prediction of the text is scored exactly once; each window starts at position 0. */
static int score_text(bmoe_engine *e, FILE *lf, const float *ref, bmoe_error *err) {
    int V = e->model->hp.n_vocab, N = e->n_prompt, W = e->cfg.ctx, step = e->mode == BMOE_MODE_PPL_STEP;
    char msg[1024];
    int gstep = 0;
    for (int s = 0; s < N - 1;) {
        int len = N - s < W ? N - s : W;
        e->windows++;
        if (!step) {
            double t0 = engine_now_s();
            int rc = forward_eval(e->fwd, e->prompt + s, len, 0, 0, 0, 1, e->logits, msg, sizeof msg);
            if (rc) return engine_forward_failed(e, err, rc, msg);
            e->timing.prefill_s += engine_now_s() - t0;
            for (int i = 0; i < len - 1; i++) {
                const float *row = e->logits + (size_t)i * V;
                score_row(&e->acc, row, V, e->prompt[s + i + 1], ref ? ref + (size_t)(s + i) * V : NULL);
            }
            if (lf && engine_write_logits(lf, e->logits, (size_t)(len - 1) * V))
                return err_set(err, 4, NULL, "--logits-out: cannot write %s: %s", e->cfg.logits_out, strerror(errno));
        } else {
            double t0 = engine_now_s();
            for (int i = 0; i < len - 1; i++) {
#ifdef BMOE_FAULT_SCORE_STEP_SHIFT
                int pos = i + 1; /* Fault: each teacher-forced step is evaluated one position late (SCORE must notice). */
#else
                int pos = i;
#endif
                int rc = forward_eval(e->fwd, e->prompt + s + i, 1, pos, 1, gstep++, 0, e->logits, msg, sizeof msg);
                if (rc) return engine_forward_failed(e, err, rc, msg);
                score_row(&e->acc, e->logits, V, e->prompt[s + i + 1], ref ? ref + (size_t)(s + i) * V : NULL);
                if (lf && engine_write_logits(lf, e->logits, (size_t)V))
                    return err_set(err, 4, NULL, "--logits-out: cannot write %s: %s", e->cfg.logits_out, strerror(errno));
            }
            e->timing.decode_s += engine_now_s() - t0;
        }
        s += len - 1;
    }
    if (step && e->timing.decode_s > 0) e->timing.decode_tok_s = gstep / e->timing.decode_s;
    return 0;
}

/* --ppl-choices: per question the context is evaluated once, one token per decode step; each option
 * then continues from it (positions after the context, overwritten by the next option) and its
 * tokens' log-probabilities are summed. The highest total wins; a tie goes to the lower index. */
static int score_choices(bmoe_engine *e, bmoe_error *err) {
    int V = e->model->hp.n_vocab;
    char msg[1024];
    int gstep = 0;
    float *base = malloc((size_t)V * sizeof *base);
    int rc = 0;
    if (!base) return err_set(err, 1, NULL, "out of memory");
    double t0 = engine_now_s();
    for (int qi = 0; qi < e->n_questions; qi++) {
        const choice_question *q = &e->questions[qi];
        const choice_tokens *t = &e->qtok[qi];
        int n = t->n_prefix;
        for (int i = 0; i < n; i++) {
            rc = forward_eval(e->fwd, t->prefix + i, 1, i, 1, gstep++, 0, e->logits, msg, sizeof msg);
            if (rc) { engine_forward_failed(e, err, rc, msg); goto done; }
        }
        memcpy(base, e->logits, (size_t)V * sizeof *base);
        /* every option continues from the context's state: the KV cache's positions are overwritten,
         * a recurrent state is returned to this mark (forward_mark) */
        if (forward_mark(e->fwd)) { rc = err_set(err, 1, NULL, "out of memory"); goto done; }
        int best = 0;
        for (int k = 0; k < q->n_options; k++) {
            const int32_t *ids = t->opt[k];
            int m = t->n_opt[k];
            double lp = 0.0;
            const float *cur = base;
            for (int j = 0; j < m; j++) {
                lp += score_row(&e->acc, cur, V, ids[j], NULL);
                if (j == m - 1) break;
                rc = forward_eval(e->fwd, ids + j, 1, n + j, 1, gstep++, 0, e->logits, msg, sizeof msg);
                if (rc) { engine_forward_failed(e, err, rc, msg); goto done; }
                cur = e->logits;
            }
            e->option_lp[qi][k] = lp;
            if (lp > e->option_lp[qi][best]) best = k;
        }
        e->chosen[qi] = best;
        e->n_correct += best == q->answer;
    }
    e->timing.decode_s = engine_now_s() - t0;
    if (e->timing.decode_s > 0) e->timing.decode_tok_s = gstep / e->timing.decode_s;
done:
    free(base);
    return rc;
}

/* --session: each prompt is a new context (positions from 0): prefill, then greedy decode of -n
 * tokens (an end-of-generation token ends it), as `run` does; the expert cache, the prefetcher's history and the learned
 * weight chains carry over from one prompt to the next. */
static int run_session(bmoe_engine *e, bmoe_error *err) {
    int V = e->model->hp.n_vocab;
    char msg[1024];
    int rc = 0, steps_total = 0;
    for (int pi = 0; pi < e->n_prompts; pi++) {
        const int32_t *ids = e->prompt_ids[pi];
        int P = e->prompt_len[pi];
        bmoe_counters before, after;
        counters_now(e, &before);
        e->gen_off[pi] = e->n_out;
        e->text_off[pi] = e->text_len;
        double t0 = engine_now_s();
        rc = forward_eval(e->fwd, ids, P, 0, 0, 0, 0, e->logits, msg, sizeof msg);
        if (rc) { engine_forward_failed(e, err, rc, msg); break; }
        int32_t tok = -1, made = 0;
        if (e->cfg.n_predict > 0) {
            tok = argmax_first(e->logits, V);
            e->out[e->n_out++] = tok;
            made++;
            if (engine_append_text(e, tok)) { rc = err_set(err, 1, NULL, "out of memory"); break; }
        }
        double t1 = engine_now_s();
        e->timing.prefill_s += t1 - t0;
        int steps = 0;
        while (made < e->cfg.n_predict && !tok_is_eog(&e->tok, tok)) {
            rc = forward_eval(e->fwd, &tok, 1, P + steps, 1, steps, 0, e->logits, msg, sizeof msg);
            if (rc) { engine_forward_failed(e, err, rc, msg); break; }
            steps++;
            tok = argmax_first(e->logits, V);
            e->out[e->n_out++] = tok;
            made++;
            if (engine_append_text(e, tok)) { rc = err_set(err, 1, NULL, "out of memory"); break; }
        }
        if (rc) break;
        e->timing.decode_s += engine_now_s() - t1;
        steps_total += steps;
        e->gen_len[pi] = made;
        e->text_end[pi] = e->text_len;
        counters_now(e, &after);
        counters_sub(&e->prompt_counters[pi], &after, &before);
    }
    if (!rc && e->timing.decode_s > 0) e->timing.decode_tok_s = steps_total / e->timing.decode_s;
    return rc;
}

static void write_scoring(struct json_writer *w, const void *user) {
    const bmoe_engine *e = user;
    json_str(w, "mode", mode_name(e->mode));
    if (e->mode == BMOE_MODE_PPL || e->mode == BMOE_MODE_PPL_STEP) {
        const score_acc *a = &e->acc;
        double n = (double)a->n, nll = a->n ? a->nll_sum / n : 0.0;
        json_int(w, "tokens_scored", a->n);
        json_int(w, "windows", e->windows);
        json_num(w, "nll_sum", a->nll_sum);
        json_num(w, "nll_mean", nll);
        json_num(w, "ppl", bm_exp(nll));
        json_num(w, "top1_agreement", a->n ? (double)a->top1 / n : 0.0);
        if (e->has_ref) {
            json_num(w, "ref_agreement", a->n ? (double)a->ref_agree / n : 0.0);
            json_num(w, "kl_mean", a->n ? a->kl_sum / n : 0.0);
        } else {
            json_null(w, "ref_agreement");
            json_null(w, "kl_mean");
        }
    } else if (e->mode == BMOE_MODE_CHOICES) {
        json_int(w, "tokens_scored", e->acc.n);
        json_int(w, "questions_scored", e->n_questions);
        json_int(w, "correct", e->n_correct);
        json_num(w, "accuracy", e->n_questions ? (double)e->n_correct / e->n_questions : 0.0);
        json_begin_array(w, "questions");
        for (int i = 0; i < e->n_questions; i++) {
            const choice_question *q = &e->questions[i];
            json_begin_object(w, NULL);
            if (q->id_is_string) json_str(w, "id", q->id);
            else json_int(w, "id", strtoll(q->id, NULL, 10));
            json_int(w, "chosen", e->chosen[i]);
            json_int(w, "answer", q->answer);
            json_bool(w, "correct", e->chosen[i] == q->answer);
            json_begin_array(w, "logprobs");
            for (int k = 0; k < q->n_options; k++) json_num(w, NULL, e->option_lp[i][k]);
            json_end_array(w);
            json_end_object(w);
        }
        json_end_array(w);
    } else {
        json_int(w, "prompts_run", e->n_prompts);
        json_begin_array(w, "prompts");
        for (int i = 0; i < e->n_prompts; i++) {
            json_begin_object(w, NULL);
            json_str(w, "id", e->prompts[i].id);
            json_int(w, "line", e->prompts[i].line);
            json_int(w, "prompt_tokens", e->prompt_len[i]);
            json_begin_array(w, "tokens");
            for (int k = 0; k < e->gen_len[i]; k++) json_int(w, NULL, e->out[e->gen_off[i] + k]);
            json_end_array(w);
            json_str(w, "stop", engine_stop_reason(e, e->out + e->gen_off[i], e->gen_len[i]));
            size_t tl = e->text_end[i] - e->text_off[i];
            json_strn(w, "text", (const char *)e->text + e->text_off[i], tl);
            json_hex(w, "text_hex", e->text + e->text_off[i], tl);
            result_write_counters(w, "counters", &e->prompt_counters[i]);
            json_end_object(w);
        }
        json_end_array(w);
    }
}

int scoring_run(bmoe_engine *e, bmoe_error *err) {
    const bmoe_config *c = &e->cfg;
    int V = e->model->hp.n_vocab, rc = 0;
    float *ref = NULL;
    FILE *lf = NULL;
    if (c->ppl_ref) {
        if ((rc = score_read_ref(c->ppl_ref, V, e->n_prompt - 1, &ref, err))) return rc;
        e->has_ref = 1;
    }
    if (c->logits_out) {
        lf = fopen(c->logits_out, "wb");
        if (!lf) {
            free(ref);
            return err_set(err, 4, NULL, "--logits-out: cannot open %s: %s", c->logits_out, strerror(errno));
        }
    }
    if (e->mode == BMOE_MODE_CHOICES) rc = score_choices(e, err);
    else if (e->mode == BMOE_MODE_SESSION) rc = run_session(e, err);
    else rc = score_text(e, lf, ref, err);
    free(ref);
    if (lf && fclose(lf) != 0 && rc == 0)
        rc = err_set(err, 4, NULL, "--logits-out: cannot write %s: %s", c->logits_out, strerror(errno));
    if (rc) return rc;
    if (e->stream) {
        if ((rc = stream_hook_finish(e->stream, err))) return rc;
    }
    counters_now(e, &e->counters);
    bmoe_result *r = &e->res;
    memset(r, 0, sizeof *r);
    r->config = &e->cfg;
    r->model = e->model;
    r->top_k_effective = e->top_k;
    r->prompt_tokens = e->mode == BMOE_MODE_SESSION ? NULL : e->prompt;
    r->n_prompt_tokens = e->mode == BMOE_MODE_SESSION ? 0 : e->n_prompt;
    r->tokens = e->out;
    r->n_tokens = e->n_out;
    r->text = e->text;
    r->text_len = e->text_len;
    r->counters = e->counters;
    if (e->stream) r->n_flash_layers = stream_hook_flash_layers(e->stream, &r->flash_layer_reads, &r->flash_layer_bytes);
    r->kernels = bm_kpath_name(forward_kernels(e->fwd)); /* scoring and sessions run the same kernels */
    r->timing = e->timing;
    r->write_extra = write_scoring;
    r->extra_user = e;
    if (e->warning[0] && r->n_warnings < BMOE_MAX_WARNINGS) r->warnings[r->n_warnings++] = e->warning;
    if (e->stream)
        r->n_warnings += stream_hook_warnings(e->stream, r->warnings + r->n_warnings, BMOE_MAX_WARNINGS - r->n_warnings);
    return 0;
}

void scoring_summary(const bmoe_engine *e, FILE *out) {
    if (e->mode == BMOE_MODE_PPL || e->mode == BMOE_MODE_PPL_STEP) {
        const score_acc *a = &e->acc;
        double nll = a->n ? a->nll_sum / (double)a->n : 0.0;
        fprintf(out, "%s: %lld tokens scored, nll_mean %.6f, ppl %.4f, top1_agreement %.4f", mode_name(e->mode),
                (long long)a->n, nll, bm_exp(nll), a->n ? (double)a->top1 / (double)a->n : 0.0);
        if (e->has_ref)
            fprintf(out, ", ref_agreement %.4f, kl_mean %.6f", (double)a->ref_agree / (double)a->n, a->kl_sum / (double)a->n);
        fputc('\n', out);
    } else if (e->mode == BMOE_MODE_CHOICES) {
        fprintf(out, "ppl-choices: %lld/%d correct, accuracy %.4f\n", (long long)e->n_correct, e->n_questions,
                e->n_questions ? (double)e->n_correct / e->n_questions : 0.0);
    } else if (e->mode == BMOE_MODE_SESSION) {
        for (int i = 0; i < e->n_prompts; i++) {
            fwrite(e->text + e->text_off[i], 1, e->text_end[i] - e->text_off[i], out);
            fputc('\n', out);
        }
    }
}

void scoring_free(bmoe_engine *e) {
    if (e->qtok) /* before the questions: it reads their option counts */
        for (int i = 0; i < e->n_questions; i++) choice_tokens_free(&e->qtok[i], e->questions[i].n_options);
    free(e->qtok);
    choices_free(e->questions, e->n_questions);
    free(e->chosen);
    if (e->option_lp)
        for (int i = 0; i < e->n_questions; i++) free(e->option_lp[i]);
    free(e->option_lp);
    if (e->prompt_ids)
        for (int i = 0; i < e->n_prompts; i++) free(e->prompt_ids[i]);
    free(e->prompt_ids);
    session_free(e->prompts, e->n_prompts);
    free(e->prompt_len);
    free(e->gen_off);
    free(e->gen_len);
    free(e->text_off);
    free(e->text_end);
    free(e->prompt_counters);
}
