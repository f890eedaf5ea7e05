/* The end-of-generation set (tokenizer.h, docs/tokenizers.md#end-of-generation): the tokens whose
 * generation ends a greedy decode. llama.cpp decides it in its vocabulary loader, mostly by token
 * text; this is the same decision, written from its rule:
 *
 *   1. the FIM pad, repo and file-separator tokens (tokenizer.ggml.fim_{pad,rep,sep}_token_id, or when
 *      a key is absent the token whose text is one of that kind's markers);
 *   2. every token whose text is on the end-of-generation list below;
 *   3. EOS, EOT and EOM (tokenizer.ggml.{eos,eot,eom}_token_id; a gpt2 vocabulary without an EOS key
 *      has llama.cpp's default EOS, id 11);
 *   4. then two exceptions: `<|end|>` leaves the set (and becomes user-defined) when `<|return|>` and
 *      `<|call|>`, or `<|call|>`/`<|calls|>` and `<|flush|>`, are in it (harmony-style vocabularies end
 *      a message with it, not the generation); `</s>` leaves it (and becomes normal) when
 *      `<|tool_response>` or `<|plamo:eos|>` is in it.
 *
 * Before the exceptions, the harmony markers `<|channel|>`, `<|message|>`, `<|start|>` and
 * `<|constrain|>` become user-defined in any vocabulary (llama.cpp's rule for gpt-oss: they always print).
 *
 * Tokens found by text (1, 2) are made control tokens, as llama.cpp does. An EOT or EOM found by text
 * is always on the list of step 2, so which one llama.cpp would pick does not change the set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_eog.h"

static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>", /* <｜end▁of▁sentence｜> */
    "[e~[",
};

/* the markers llama.cpp looks for when a FIM key is absent, per kind */
static const char *const FIM_PAD[] = { "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL };
static const char *const FIM_REP[] = { "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL };
static const char *const FIM_SEP[] = { "<|file_sep|>", NULL };

static int32_t find(const bmoe_tokenizer *tk, const char *s) { return tok_find(tk, (const uint8_t *)s, strlen(s)); }

static int has_text(const bmoe_tokenizer *tk, int32_t id, const char *s) {
    size_t n = strlen(s);
    return tk->text_off[id + 1] - tk->text_off[id] == n && memcmp(tk->text + tk->text_off[id], s, n) == 0;
}

/* the key's id, -1 when absent; an id outside the vocabulary is refused like bos/eos (3) */
static int key_id(const bmoe_tokenizer *tk, const gguf_model *g, const char *key, int32_t *out, const char *path,
                  char *err, size_t errlen) {
    uint64_t v;
    char e[256] = "";
    *out = -1;
    int r = gguf_get_u64(g, key, &v, e, sizeof e);
    if (r < 0) { snprintf(err, errlen, "%s: %s: %s", path, key, e); return 3; }
    if (r == 0) return 0;
    if (v >= (uint64_t)tk->n_vocab) {
        snprintf(err, errlen, "%s: %s = %llu is not below the vocabulary size %d", path, key, (unsigned long long)v,
                 tk->n_vocab);
        return 3;
    }
    *out = (int32_t)v;
    return 0;
}

/* A FIM kind's token: its key, else the lowest id among the tokens with one of its marker texts
 * (llama.cpp takes whichever its hash map yields first; a vocabulary holding two markers of one kind
 * is the only case where that can differ). A token found by text becomes control. */
static int fim_id(bmoe_tokenizer *tk, const gguf_model *g, const char *key, const char *const *texts, int32_t *out,
                  const char *path, char *err, size_t errlen) {
    int rc = key_id(tk, g, key, out, path, err, errlen);
    if (rc || *out >= 0) return rc;
    for (int i = 0; texts[i]; i++) {
        int32_t id = find(tk, texts[i]);
        if (id >= 0 && (*out < 0 || id < *out)) *out = id;
    }
    if (*out >= 0) tk->attr[*out] |= TOK_ATTR_CONTROL;
    return 0;
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void add(int32_t *set, int *n, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < *n; i++)
        if (set[i] == id) return;
    set[(*n)++] = id;
}

static void drop(int32_t *set, int *n, int32_t id) {
    for (int i = 0; i < *n; i++)
        if (set[i] == id) { set[i] = set[--*n]; return; }
}

int tok_build_eog(bmoe_tokenizer *tk, const gguf_model *g, const char *path, char *err, size_t errlen) {
    enum { N_TEXTS = sizeof EOG_TEXTS / sizeof EOG_TEXTS[0] };
    int32_t pad, rep, sep, eot, eom;
    int rc;
    if ((rc = fim_id(tk, g, "tokenizer.ggml.fim_pad_token_id", FIM_PAD, &pad, path, err, errlen)) ||
        (rc = fim_id(tk, g, "tokenizer.ggml.fim_rep_token_id", FIM_REP, &rep, path, err, errlen)) ||
        (rc = fim_id(tk, g, "tokenizer.ggml.fim_sep_token_id", FIM_SEP, &sep, path, err, errlen)) ||
        (rc = key_id(tk, g, "tokenizer.ggml.eot_token_id", &eot, path, err, errlen)) ||
        (rc = key_id(tk, g, "tokenizer.ggml.eom_token_id", &eom, path, err, errlen)))
        return rc;
    /* llama.cpp's gpt2 default EOS (Falcon's id 11) stands when the key is absent */
    int32_t eos = tk->eos >= 0 ? tk->eos : tk->kind == TOK_BPE && tk->n_vocab > 11 ? 11 : -1;
    int32_t set[N_TEXTS + 6];
    int n = 0;
    add(set, &n, pad);
    add(set, &n, rep);
    add(set, &n, sep);
    for (int i = 0; i < N_TEXTS; i++) {
        int32_t id = find(tk, EOG_TEXTS[i]);
        if (id < 0) continue;
        add(set, &n, id);
        tk->attr[id] |= TOK_ATTR_CONTROL;
    }
    add(set, &n, eos);
    add(set, &n, eot);
    add(set, &n, eom);
    /* llama.cpp's rendering rule for gpt-oss's harmony markers, in every vocabulary: user-defined, so they
     * print their text (and are parsed in any text) */
    static const char *const RENDERED[] = { "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>" };
    for (size_t i = 0; i < sizeof RENDERED / sizeof RENDERED[0]; i++) {
        int32_t id = find(tk, RENDERED[i]);
        if (id >= 0) tk->attr[id] = TOK_ATTR_USER;
    }
    int has_return = 0, has_call = 0, has_flush = 0, has_marker = 0;
    int32_t end = -1, s = -1;
    for (int i = 0; i < n; i++) {
        int32_t id = set[i];
        has_return |= has_text(tk, id, "<|return|>");
        has_call |= has_text(tk, id, "<|call|>") || has_text(tk, id, "<|calls|>");
        has_flush |= has_text(tk, id, "<|flush|>");
        has_marker |= has_text(tk, id, "<|tool_response>") || has_text(tk, id, "<|plamo:eos|>");
        if (has_text(tk, id, "<|end|>")) end = id;
        if (has_text(tk, id, "</s>")) s = id;
    }
    if (end >= 0 && has_call && (has_return || has_flush)) {
        drop(set, &n, end);
        tk->attr[end] = TOK_ATTR_USER;
    }
    if (s >= 0 && has_marker) {
        drop(set, &n, s);
        tk->attr[s] = TOK_ATTR_NORMAL;
    }
    qsort(set, (size_t)n, sizeof *set, cmp_id);
    tk->eog = malloc(((size_t)n + 1) * sizeof *tk->eog);
    if (!tk->eog) { snprintf(err, errlen, "out of memory loading the vocabulary"); return 1; }
    memcpy(tk->eog, set, (size_t)n * sizeof *set);
    tk->n_eog = n;
    return 0;
}

int tok_is_eog(const bmoe_tokenizer *tk, int32_t id) {
    return id >= 0 && tk->n_eog > 0 && bsearch(&id, tk->eog, (size_t)tk->n_eog, sizeof *tk->eog, cmp_id) != NULL;
}
