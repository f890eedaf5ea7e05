/* Byte-level tokenizer: the GPT-2 byte ↔ code point mapping, loading a vocabulary from GGUF
 * metadata, encode → decode round trips, specials, BOS, and refusals. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gguf.h"
#include "tokenizer.h"

/* ---- a minimal in-memory GGUF v3 writer (metadata only) ---- */
typedef struct { uint8_t *b; size_t n, cap; } buf;
static void put(buf *o, const void *p, size_t n) {
    if (o->n + n > o->cap) { o->cap = (o->n + n) * 2 + 64; o->b = realloc(o->b, o->cap); }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void u32(buf *o, uint32_t v) { uint8_t b[4]; for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> 8 * i); put(o, b, 4); }
static void u64(buf *o, uint64_t v) { uint8_t b[8]; for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> 8 * i); put(o, b, 8); }
static void str(buf *o, const char *s) { u64(o, strlen(s)); put(o, s, strlen(s)); }

typedef struct { buf kv; uint64_t n_kv; } meta;
static void kv_u32(meta *m, const char *k, uint32_t v) { str(&m->kv, k); u32(&m->kv, 4); u32(&m->kv, v); m->n_kv++; }
static void kv_bool(meta *m, const char *k, int v) { uint8_t b = (uint8_t)v; str(&m->kv, k); u32(&m->kv, 7); put(&m->kv, &b, 1); m->n_kv++; }
static void kv_str(meta *m, const char *k, const char *v) { str(&m->kv, k); u32(&m->kv, 8); str(&m->kv, v); m->n_kv++; }
static void kv_strs(meta *m, const char *k, char **v, int n) {
    str(&m->kv, k); u32(&m->kv, 9); u32(&m->kv, 8); u64(&m->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) str(&m->kv, v[i]);
    m->n_kv++;
}
static void kv_i32s(meta *m, const char *k, const int32_t *v, int n) {
    str(&m->kv, k); u32(&m->kv, 9); u32(&m->kv, 5); u64(&m->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) u32(&m->kv, (uint32_t)v[i]);
    m->n_kv++;
}
static gguf_model *finish(meta *m) {
    buf o = {0};
    put(&o, "GGUF", 4); u32(&o, 3); u64(&o, 0); u64(&o, m->n_kv);
    put(&o, m->kv.b, m->kv.n);
    gguf_model *g = NULL;
    char err[256];
    int rc = gguf_parse_buffer(o.b, o.n, &g, err, sizeof err);
    if (rc) fprintf(stderr, "gguf_parse_buffer: %s\n", err);
    free(o.b);
    free(m->kv.b);
    return g;
}

/* utf-8 of a code point */
static int utf8(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xc0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    out[0] = (char)(0xe0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
}

static void test_mapping(void) {
    int seen[512] = {0}, ok = 1;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        ok &= cp < 512 && !seen[cp];
        if (cp < 512) seen[cp] = 1;
        ok &= tok_cp_to_byte(cp) == b;
    }
    CHECK(ok);
    CHECK(tok_byte_to_cp(' ') == 0x120);   /* 'Ġ' */
    CHECK(tok_byte_to_cp('\n') == 0x10a);  /* 'Ċ' */
    CHECK(tok_byte_to_cp(0) == 0x100);
    CHECK(tok_byte_to_cp('a') == 'a');
    CHECK(tok_byte_to_cp(0xad) == 0x143);  /* the last non-printable byte gets 256 + 67 */
    CHECK(tok_cp_to_byte(0x144) == -1);
    CHECK(tok_cp_to_byte(0x20) == -1);     /* a raw space is not a byte image */
}

/* vocabulary: 256 byte tokens in a shuffled order, then "<eos>" (control) and "<bos>" (control),
 * then a multi-byte normal token "Ġhi" */
static gguf_model *vocab_model(int add_bos, int with_types, int drop_byte) {
    meta m = {0};
    char *toks[259];
    int32_t types[259];
    int n = 0;
    for (int i = 0; i < 256; i++) {
        int b = (i * 167 + 13) & 255; /* a permutation of 0..255 */
        if (b == drop_byte) b = 'A'; /* the dropped byte's slot becomes a duplicate of 'A' */
        char *s = malloc(4);
        s[utf8(tok_byte_to_cp((uint8_t)b), s)] = 0;
        toks[n] = s; types[n++] = 1;
    }
    toks[n] = strdup("<eos>"); types[n++] = 3;
    toks[n] = strdup("<bos>"); types[n++] = 3;
    char hi[8]; int l = utf8(0x120, hi); hi[l] = 'h'; hi[l + 1] = 'i'; hi[l + 2] = 0;
    toks[n] = strdup(hi); types[n++] = 1;
    kv_str(&m, "tokenizer.ggml.model", "gpt2");
    kv_strs(&m, "tokenizer.ggml.tokens", toks, n);
    if (with_types) kv_i32s(&m, "tokenizer.ggml.token_type", types, n);
    kv_u32(&m, "tokenizer.ggml.eos_token_id", 256);
    kv_u32(&m, "tokenizer.ggml.bos_token_id", 257);
    kv_bool(&m, "tokenizer.ggml.add_bos_token", add_bos);
    for (int i = 0; i < n; i++) free(toks[i]);
    return finish(&m);
}

static void test_roundtrip(int with_types) {
    gguf_model *g = vocab_model(0, with_types, -1);
    CHECK(g != NULL);
    if (!g) return;
    bmoe_tokenizer tk;
    char err[256] = "";
    CHECK(tok_load(&tk, g, "vocab.gguf", err, sizeof err) == 0);
    CHECK(tk.n_vocab == 259 && tk.eos == 256 && tk.bos == 257 && !tk.add_bos);
    uint8_t text[256];
    for (int i = 0; i < 256; i++) text[i] = (uint8_t)(255 - i); /* every byte, invalid UTF-8 included */
    int32_t ids[300];
    int n = tok_encode(&tk, text, 256, ids, 300, err, sizeof err);
    CHECK(n == 256);
    uint8_t back[512];
    size_t bl = 0;
    for (int i = 0; i < n; i++) {
        size_t l;
        const uint8_t *p = tok_piece(&tk, ids[i], &l);
        memcpy(back + bl, p, l);
        bl += l;
    }
    CHECK(bl == 256 && memcmp(back, text, 256) == 0);
    size_t l = 99;
    tok_piece(&tk, 256, &l);
    CHECK(l == 0); /* a special decodes to nothing */
    tok_piece(&tk, 257, &l);
    CHECK(l == 0);
    const uint8_t *p = tok_piece(&tk, 258, &l);
    CHECK(l == 3 && memcmp(p, " hi", 3) == 0); /* a multi-byte token */
    tok_piece(&tk, 259, &l);
    CHECK(l == 0); /* out of range */
    tok_piece(&tk, -1, &l);
    CHECK(l == 0);
    CHECK(tok_encode(&tk, text, 256, ids, 10, err, sizeof err) == -2); /* capacity */
    tok_free(&tk);
    gguf_close(g);
}

static void test_bos_and_missing(void) {
    gguf_model *g = vocab_model(1, 1, 'Z');
    bmoe_tokenizer tk;
    char err[256] = "";
    CHECK(g && tok_load(&tk, g, "vocab.gguf", err, sizeof err) == 0);
    if (!g) return;
    int32_t ids[8];
    int n = tok_encode(&tk, (const uint8_t *)"AB", 2, ids, 8, err, sizeof err);
    CHECK(n == 3 && ids[0] == 257);
    CHECK(tk.byte_token['A'] >= 0 && ids[1] == tk.byte_token['A']);
    /* 'A' appears twice: the lower id is its token */
    int first = -1;
    for (int i = 0; i < 256 && first < 0; i++) {
        size_t l;
        const uint8_t *p = tok_piece(&tk, i, &l);
        if (l == 1 && p[0] == 'A') first = i;
    }
    CHECK(tk.byte_token['A'] == first);
    CHECK(tok_encode(&tk, (const uint8_t *)"aZ", 2, ids, 8, err, sizeof err) == -1);
    CHECK(strstr(err, "0x5a") != NULL);
    tok_free(&tk);
    gguf_close(g);
}

static void test_refusals(void) {
    meta m = {0};
    char *toks[1] = { "a" };
    kv_strs(&m, "tokenizer.ggml.tokens", toks, 1);
    kv_u32(&m, "tokenizer.ggml.eos_token_id", 5); /* beyond the vocabulary */
    gguf_model *g = finish(&m);
    bmoe_tokenizer tk;
    char err[256] = "";
    CHECK(g && tok_load(&tk, g, "v.gguf", err, sizeof err) == 3);
    CHECK(strstr(err, "v.gguf") && strstr(err, "eos_token_id"));
    gguf_close(g);

    meta m2 = {0};
    kv_strs(&m2, "tokenizer.ggml.tokens", toks, 1);
    kv_bool(&m2, "tokenizer.ggml.add_bos_token", 1); /* but no bos id */
    g = finish(&m2);
    CHECK(g && tok_load(&tk, g, "v.gguf", err, sizeof err) == 3);
    gguf_close(g);

    meta m3 = {0};
    kv_str(&m3, "tokenizer.ggml.model", "llama");
    kv_strs(&m3, "tokenizer.ggml.tokens", toks, 1);
    g = finish(&m3);
    CHECK(g && tok_load(&tk, g, "v.gguf", err, sizeof err) == 3);
    gguf_close(g);

    meta m4 = {0};
    kv_u32(&m4, "tokenizer.ggml.tokens", 3); /* not an array */
    g = finish(&m4);
    CHECK(g && tok_load(&tk, g, "v.gguf", err, sizeof err) == 3);
    gguf_close(g);
}

int main(void) {
    test_mapping();
    test_roundtrip(1);
    test_roundtrip(0); /* without token types, BOS/EOS ids are the specials */
    test_bos_and_missing();
    test_refusals();
    return check_report("test_tokenizer");
}
