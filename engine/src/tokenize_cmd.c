/* `bmoe tokenize -m MODEL (-p TEXT | --texts FILE) [--chat] [--no-special] [--no-parse-special]`
 * `bmoe tokenize -m MODEL --eog`
 *
 * Reads only the model's metadata (a vocabulary-only GGUF works), encodes each text and prints
 *   {"ids": [...], "decoded_hex": "..."}
 * one line per text: the token ids, and the ids decoded back to bytes (tok_detokenize) as hex so that
 * any byte survives. --texts FILE holds several texts separated by NUL bytes: one process for a whole
 * test set. --no-special leaves out BOS/EOS, --no-parse-special reads control-token texts as text.
 * --eog prints {"eog": [...]} instead: the ids that end generation (tok_is_eog), ascending. */
#include "tokenize_cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "json.h"
#include "scoring.h"
#include "tokenizer.h"

static int encode_one(const bmoe_tokenizer *tk, const char *text, size_t len, unsigned flags, int chat, json_writer *w,
                      bmoe_error *err) {
    char msg[256] = "";
    char *wrapped = NULL;
    char *owned = NULL;
    if (chat) {
        owned = malloc(len + 1); /* the template wants a NUL-terminated prompt */
        if (!owned) return err_set(err, 1, NULL, "out of memory");
        memcpy(owned, text, len);
        owned[len] = 0;
        int rc = tok_chat_wrap(tk, owned, &wrapped, msg, sizeof msg);
        free(owned);
        if (rc == -3) return err_set(err, 1, NULL, "out of memory");
        if (rc) return err_set(err, 2, "config", "%s", msg);
        text = wrapped;
        len = strlen(wrapped);
    }
    int32_t *ids = NULL;
    int n = 0;
    int rc = tok_encode(tk, (const uint8_t *)text, len, flags, &ids, &n, msg, sizeof msg);
    free(wrapped);
    if (rc == -3) return err_set(err, 1, NULL, "out of memory");
    if (rc) return err_set(err, 2, "config", "tokenize: %s", msg);
    uint8_t *dec = NULL;
    size_t dl = 0;
    if (tok_detokenize(tk, ids, n, &dec, &dl)) { free(ids); return err_set(err, 1, NULL, "out of memory"); }
    json_init(w, stdout);
    json_begin_object(w, NULL);
    json_begin_array(w, "ids");
    for (int i = 0; i < n; i++) json_int(w, NULL, ids[i]);
    json_end_array(w);
    json_hex(w, "decoded_hex", dec, dl);
    json_end_object(w);
    json_end(w);
    free(ids);
    free(dec);
    return 0;
}

int tokenize_main(int argc, char **argv, bmoe_error *err) {
    const char *model = NULL, *prompt = NULL, *texts = NULL;
    int chat = 0, eog = 0;
    unsigned flags = TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "-m") || !strcmp(a, "--model") ? &model
                         : !strcmp(a, "-p") || !strcmp(a, "--prompt") ? &prompt
                         : !strcmp(a, "--texts") ? &texts : NULL;
        if (dst) {
            if (i + 1 >= argc) return err_set(err, 2, "usage", "%s: missing value", a);
            *dst = argv[++i];
        } else if (!strcmp(a, "--chat")) {
            chat = 1;
        } else if (!strcmp(a, "--eog")) {
            eog = 1;
        } else if (!strcmp(a, "--no-special")) {
            flags &= ~(unsigned)TOK_ADD_SPECIAL;
        } else if (!strcmp(a, "--no-parse-special")) {
            flags &= ~(unsigned)TOK_PARSE_SPECIAL;
        } else {
            return err_set(err, 2, "usage",
                           "tokenize: unexpected argument '%.40s' (usage: bmoe tokenize -m MODEL -p TEXT | --texts FILE | --eog)", a);
        }
    }
    if (!model || !model[0]) return err_set(err, 2, "usage", "tokenize: -m MODEL is required");
    if (!!prompt + !!texts + eog != 1) return err_set(err, 2, "usage", "tokenize: give one of -p TEXT, --texts FILE or --eog");
    uint8_t *buf = NULL;
    size_t len = 0;
    if (texts) {
        int rc = score_read_file("--texts", texts, &buf, &len, err);
        if (rc) return rc;
    }
    gguf_model *g = NULL;
    char msg[1024] = "";
    int rc = gguf_open(model, &g, msg, sizeof msg);
    if (rc) { free(buf); return err_set(err, rc, NULL, "%s", msg); }
    bmoe_tokenizer tk;
    rc = tok_load(&tk, g, model, msg, sizeof msg);
    if (rc) { gguf_close(g); free(buf); return err_set(err, rc, NULL, "%s", msg); }
    json_writer w;
    if (eog) {
        json_init(&w, stdout);
        json_begin_object(&w, NULL);
        json_begin_array(&w, "eog");
        for (int i = 0; i < tk.n_eog; i++) json_int(&w, NULL, tk.eog[i]);
        json_end_array(&w);
        json_end_object(&w);
        json_end(&w);
    } else if (prompt) {
        rc = encode_one(&tk, prompt, strlen(prompt), flags, chat, &w, err);
    } else {
        /* NUL-separated texts; a trailing NUL ends the last one instead of starting an empty one */
        size_t at = 0;
        while (!rc && at < len) {
            const uint8_t *z = memchr(buf + at, 0, len - at);
            size_t end = z ? (size_t)(z - buf) : len;
            rc = encode_one(&tk, (const char *)buf + at, end - at, flags, chat, &w, err);
            at = end + 1;
        }
    }
    fflush(stdout);
    tok_free(&tk);
    gguf_close(g);
    free(buf);
    return rc;
}
