/* Byte-level tokenizer. The vocabulary's texts are decoded once at load: each code point of a token's
 * text maps back to one byte through GPT-2's byte-to-unicode table. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2 maps the printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) to themselves and the other 68
 * bytes, in increasing order, to 256, 257, ... so that every byte has a visible code point. */
static int byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++) n += !byte_is_printable(c);
    return 256 + n;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
    uint32_t n = 0;
    for (unsigned c = 0; c < 256; c++) {
        if (byte_is_printable(c)) continue;
        if (256 + n == cp) return (int)c;
        n++;
    }
    return -1;
}

/* Decodes one UTF-8 sequence at s[0..n); returns its length (>= 1) and the code point, or 0 when
 * malformed (the caller then takes the byte literally). */
static size_t utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    size_t len;
    uint32_t v;
    if (c < 0x80) { *cp = c; return 1; }
    if ((c & 0xe0) == 0xc0) { len = 2; v = c & 0x1f; }
    else if ((c & 0xf0) == 0xe0) { len = 3; v = c & 0x0f; }
    else if ((c & 0xf8) == 0xf0) { len = 4; v = c & 0x07; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    *cp = v;
    return len;
}

/* Token text → bytes. A code point that is not a byte image (e.g. a special token's text) is kept as
 * its UTF-8 bytes. Output is never longer than the input. */
static size_t text_to_bytes(const uint8_t *s, size_t n, uint8_t *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = utf8_next(s + i, n - i, &cp);
        if (l == 0) { out[o++] = s[i++]; continue; }
        int b = tok_cp_to_byte(cp);
        if (b >= 0) out[o++] = (uint8_t)b;
        else { memcpy(out + o, s + i, l); o += l; }
        i += l;
    }
    return o;
}

static int get_id(const gguf_model *g, const char *key, int n_vocab, int32_t *out, const char *path, char *err,
                  size_t errlen) {
    uint64_t v;
    char e[256] = "";
    int r = gguf_get_u64(g, key, &v, e, sizeof e);
    if (r < 0) { snprintf(err, errlen, "%s: %s: %s", path, key, e); return 3; }
    if (r == 0) { *out = -1; return 0; }
    if (v >= (uint64_t)n_vocab) {
        snprintf(err, errlen, "%s: %s = %llu is not below the vocabulary size %d", path, key, (unsigned long long)v, n_vocab);
        return 3;
    }
    *out = (int32_t)v;
    return 0;
}

int tok_load(bmoe_tokenizer *tk, const gguf_model *g, const char *path, char *err, size_t errlen) {
    memset(tk, 0, sizeof *tk);
    const gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING || kv->n < 1 || kv->n > (1u << 24)) {
        snprintf(err, errlen, "%s: tokenizer.ggml.tokens is missing or not an array of strings", path);
        return 3;
    }
    gguf_str model;
    char e[256] = "";
    int r = gguf_get_str(g, "tokenizer.ggml.model", &model, e, sizeof e);
    if (r < 0 || (r > 0 && !gguf_str_eq(model, "gpt2"))) {
        snprintf(err, errlen, "%s: tokenizer.ggml.model must be \"gpt2\" (a byte-level vocabulary)", path);
        return 3;
    }
    int n = (int)kv->n;
    const gguf_str *texts = (const gguf_str *)kv->data;
    /* token types: 3 control, 5 unused decode to nothing (llama.cpp's special tokens) */
    const gguf_kv *tt = gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (tt && (tt->type != GGUF_TYPE_ARRAY || tt->n != kv->n ||
               (tt->arr_type != GGUF_TYPE_INT32 && tt->arr_type != GGUF_TYPE_UINT32))) {
        snprintf(err, errlen, "%s: tokenizer.ggml.token_type must be an int32 array with one entry per token", path);
        return 3;
    }
    int rc;
    if ((rc = get_id(g, "tokenizer.ggml.bos_token_id", n, &tk->bos, path, err, errlen))) return rc;
    if ((rc = get_id(g, "tokenizer.ggml.eos_token_id", n, &tk->eos, path, err, errlen))) return rc;
    int add_bos = 0;
    r = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, e, sizeof e);
    if (r < 0) { snprintf(err, errlen, "%s: tokenizer.ggml.add_bos_token: %s", path, e); return 3; }
    tk->add_bos = r > 0 && add_bos;
    if (tk->add_bos && tk->bos < 0) {
        snprintf(err, errlen, "%s: tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing", path);
        return 3;
    }

    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (texts[i].len > (1u << 20)) {
            snprintf(err, errlen, "%s: tokenizer.ggml.tokens[%d] is %llu bytes long", path, i, (unsigned long long)texts[i].len);
            return 3;
        }
        total += texts[i].len;
    }
    tk->n_vocab = n;
    tk->bytes = malloc(total ? (size_t)total : 1);
    tk->off = malloc(((size_t)n + 1) * sizeof *tk->off);
    if (!tk->bytes || !tk->off) { tok_free(tk); snprintf(err, errlen, "out of memory loading the vocabulary"); return 1; }
    for (int b = 0; b < 256; b++) tk->byte_token[b] = -1;
    uint64_t o = 0;
    for (int i = 0; i < n; i++) {
        tk->off[i] = o;
        int special = i == tk->bos || i == tk->eos;
        if (tt) {
            const uint8_t *p = (const uint8_t *)tt->data + 4 * (size_t)i;
            uint32_t type = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            special = type == 3 || type == 5;
        }
        if (special) continue;
        size_t len = text_to_bytes((const uint8_t *)texts[i].ptr, (size_t)texts[i].len, tk->bytes + o);
        /* the token of byte b is the one whose whole text is b's image (lowest id wins) */
        uint32_t cp;
        if (texts[i].len > 0 && utf8_next((const uint8_t *)texts[i].ptr, (size_t)texts[i].len, &cp) == texts[i].len) {
            int b = tok_cp_to_byte(cp);
            if (b >= 0 && tk->byte_token[b] < 0) tk->byte_token[b] = i;
        }
        o += len;
    }
    tk->off[n] = o;
    return 0;
}

void tok_free(bmoe_tokenizer *tk) {
    free(tk->bytes);
    free(tk->off);
    tk->bytes = NULL;
    tk->off = NULL;
}

int tok_encode(const bmoe_tokenizer *tk, const uint8_t *text, size_t len, int32_t *out, int cap, char *err,
               size_t errlen) {
    int n = 0;
    if (tk->add_bos) {
        if (n >= cap) return -2;
        out[n++] = tk->bos;
    }
    for (size_t i = 0; i < len; i++) {
        int32_t t = tk->byte_token[text[i]];
        if (t < 0) {
            snprintf(err, errlen, "-p: byte 0x%02x of the prompt has no token in this model's vocabulary", text[i]);
            return -1;
        }
        if (n >= cap) return -2;
        out[n++] = t;
    }
    return n;
}

const uint8_t *tok_piece(const bmoe_tokenizer *tk, int32_t id, size_t *len) {
    if (id < 0 || id >= tk->n_vocab) { *len = 0; return NULL; }
    *len = (size_t)(tk->off[id + 1] - tk->off[id]);
    return tk->bytes + tk->off[id];
}
