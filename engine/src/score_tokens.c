/* The scoring inputs as tokens (scoring.h, docs/engine-flags.md, scoring): through the model's own
 * tokenizer, the one -p uses, so that a real model is scored on the tokens it would see. A byte-level
 * vocabulary gives one token per byte, as before. */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "scoring.h"

/* likelihood texts: BOS/EOS as the model asks, special-token texts read as text (llama.cpp's
 * perplexity and hellaswag tokenize with parse_special off) */
#define SCORE_FLAGS TOK_ADD_SPECIAL

int score_text_tokens(const char *flag, const char *path, const bmoe_tokenizer *tk, int32_t **out, int *n,
                      bmoe_error *err) {
    *out = NULL;
    *n = 0;
    uint8_t *buf;
    size_t len;
    int rc = score_read_file(flag, path, &buf, &len, err);
    if (rc) return rc;
    const uint8_t *nul = memchr(buf, 0, len);
    if (nul) {
        rc = err_set(err, 2, "usage", "%s: %s is not text (a NUL byte at offset %zu)", flag, path, (size_t)(nul - buf));
        free(buf);
        return rc;
    }
    char msg[256] = "";
    int32_t *ids = NULL;
    int k = 0;
    int r = tok_encode(tk, buf, len, SCORE_FLAGS, &ids, &k, msg, sizeof msg);
    free(buf);
    if (r == -3) return err_set(err, 1, NULL, "%s: out of memory tokenizing %s", flag, path);
    if (r) return err_set(err, 2, "config", "%s: %s: %s", flag, path, msg);
    if (k < 2) {
        free(ids);
        return err_set(err, 2, "usage", "%s: %s gives %d token, at least 2 are needed to score one", flag, path, k);
    }
    *out = ids;
    *n = k;
    return 0;
}

static int lcp(const int32_t *a, int na, const int32_t *b, int nb) {
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

int choice_tokens_build(const bmoe_tokenizer *tk, const choice_question *q, const char *flag, const char *path,
                        choice_tokens *t, bmoe_error *err) {
    memset(t, 0, sizeof *t);
    t->opt = calloc((size_t)q->n_options, sizeof *t->opt);
    t->n_opt = calloc((size_t)q->n_options, sizeof *t->n_opt);
    int32_t **full = calloc((size_t)q->n_options, sizeof *full); /* each context + option, whole */
    size_t longest = 0;
    for (int k = 0; k < q->n_options; k++)
        if (q->option_len[k] > longest) longest = q->option_len[k];
    uint8_t *cat = malloc(q->context_len + longest + 1);
    char msg[256] = "";
    int rc = 0, r;
    if (!t->opt || !t->n_opt || !full || !cat) { rc = err_set(err, 1, NULL, "out of memory"); goto done; }
    r = tok_encode(tk, q->context, q->context_len, SCORE_FLAGS, &t->prefix, &t->n_prefix, msg, sizeof msg);
    if (r) {
        rc = r == -3 ? err_set(err, 1, NULL, "out of memory")
                     : err_set(err, 2, "config", "%s: %s: line %d: context: %s", flag, path, q->line, msg);
        goto done;
    }
    if (t->n_prefix == 0) {
        rc = err_set(err, 2, "usage", "%s: %s: line %d: the context is empty (the model adds no BOS)", flag, path, q->line);
        goto done;
    }
    int base = t->n_prefix;
    memcpy(cat, q->context, q->context_len);
    for (int k = 0; k < q->n_options; k++) {
        memcpy(cat + q->context_len, q->options[k], q->option_len[k]);
        r = tok_encode(tk, cat, q->context_len + q->option_len[k], SCORE_FLAGS, &full[k], &t->n_opt[k], msg, sizeof msg);
        if (r) {
            rc = r == -3 ? err_set(err, 1, NULL, "out of memory")
                         : err_set(err, 2, "config", "%s: %s: line %d: option %d: %s", flag, path, q->line, k, msg);
            goto done;
        }
        int shared = lcp(t->prefix, t->n_prefix, full[k], t->n_opt[k]);
        if (shared < base) base = shared;
    }
    if (base == 0) {
        rc = err_set(err, 2, "config",
                     "%s: %s: line %d: an option changes the context's first token, so no position predicts it (the model adds no BOS)",
                     flag, path, q->line);
        goto done;
    }
    t->n_prefix = base;
    for (int k = 0; k < q->n_options; k++) {
        int m = t->n_opt[k] - base;
        if (m < 1) { /* only tokens that spell nothing could do this; an option must be scored on something */
            rc = err_set(err, 2, "config", "%s: %s: line %d: option %d adds no token to the context", flag, path, q->line, k);
            goto done;
        }
        t->opt[k] = malloc(((size_t)m + 1) * sizeof **t->opt);
        if (!t->opt[k]) { rc = err_set(err, 1, NULL, "out of memory"); goto done; }
        memcpy(t->opt[k], full[k] + base, (size_t)m * sizeof **t->opt);
        t->n_opt[k] = m;
    }
done:
    if (full)
        for (int k = 0; k < q->n_options; k++) free(full[k]);
    free(full);
    free(cat);
    return rc;
}

void choice_tokens_free(choice_tokens *t, int n_options) {
    if (t->opt)
        for (int k = 0; k < n_options; k++) free(t->opt[k]);
    free(t->opt);
    free(t->n_opt);
    free(t->prefix);
    memset(t, 0, sizeof *t);
}

int session_tokens(const bmoe_tokenizer *tk, const session_prompt *p, const char *flag, const char *path,
                   int32_t **out, int *n, bmoe_error *err) {
    char msg[256] = "";
    int r = tok_encode(tk, p->text, p->len, TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, out, n, msg, sizeof msg);
    if (r == -3) return err_set(err, 1, NULL, "out of memory");
    if (r) return err_set(err, 2, "config", "%s: %s: line %d: %s", flag, path, p->line, msg);
    int rc = 0;
    if (*n == 0) rc = err_set(err, 2, "usage", "%s: %s: line %d: the prompt is empty", flag, path, p->line);
    else if (*n > BMOE_MAX_PROMPT_TOKENS)
        rc = err_set(err, 2, "config", "%s: %s: line %d: %d prompt tokens, at most %d are accepted", flag, path, p->line,
                     *n, BMOE_MAX_PROMPT_TOKENS);
    if (rc) { free(*out); *out = NULL; *n = 0; }
    return rc;
}
