/* Byte-level BPE of one raw text fragment (tokenizer.h): code points → pre-tokenizer words → each
 * word's bytes as symbols → merges by rank, lowest first, leftmost among equals (llama.cpp's
 * llm_tokenizer_bpe_session). Symbols carry token ids: every merge's parts and result are tokens
 * (tok_load refuses merges that are not), so a pair is looked up by ids, not by text (tok_merge_find). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pretok.h"
#include "tok_heap.h"
#include "tok_bpe.h"
#include "unicode.h"

typedef struct { int32_t id; int prev, next; int alive; } sym;

/* The merges of one word's symbols s[0..n) (ids set, linked in order): the lowest rank first, the
 * leftmost among equals, until no adjacent pair has a merge. Returns 0 or -3 (memory). */
static int merge_symbols(const bmoe_tokenizer *tk, sym *s, size_t n, tok_heap *q);

static int add_bigram(const bmoe_tokenizer *tk, tok_heap *q, const sym *s, int l, int r) {
    if (l < 0 || r < 0) return 0;
    int32_t res;
    int rank = tok_merge_find(tk, s[l].id, s[r].id, &res);
    if (rank < 0) return 0;
    return tok_heap_push(q, (tok_bigram){ .key = rank, .left = l, .right = r, .lid = s[l].id, .rid = s[r].id, .result = res });
}

/* one word: bytes w[0..n) (not yet byte-encoded) */
/* enc: scratch of 2 n bytes for the byte-encoded word */
static int bpe_word(const bmoe_tokenizer *tk, const uint8_t *w, size_t n, uint8_t *enc, sym *s, tok_heap *q, tok_vec *out,
                    char *err, size_t errlen) {
    if (tk->ignore_merges) { /* a word that is a token is taken whole (llama3) */
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += (size_t)uni_encode(tok_byte_to_cp(w[i]), enc + k);
        int32_t id = tok_find(tk, enc, k);
        if (id >= 0) return tok_vec_push(out, id);
    }
    for (size_t i = 0; i < n; i++) s[i] = (sym){ tk->byte_token[w[i]], (int)i - 1, i + 1 < n ? (int)i + 1 : -1, 1 };
    if (merge_symbols(tk, s, n, q)) return -3;
    for (int i = 0; i >= 0; i = s[i].next) {
        if (s[i].id < 0) { /* only an unmerged single byte can lack a token */
            snprintf(err, errlen, "byte 0x%02x has no token in this model's vocabulary", w[i]);
            return -1;
        }
        if (tok_vec_push(out, s[i].id)) return -3;
    }
    return 0;
}

static int merge_symbols(const bmoe_tokenizer *tk, sym *s, size_t n, tok_heap *q) {
    q->n = 0;
    for (size_t i = 1; i < n; i++)
        if (add_bigram(tk, q, s, (int)i - 1, (int)i)) return -3;
    while (q->n) {
        tok_bigram b = tok_heap_pop(q);
        sym *L = &s[b.left], *R = &s[b.right];
        /* stale: a side was merged away or changed since the pair was queued */
        if (!L->alive || !R->alive || L->id != b.lid || R->id != b.rid || L->next != b.right) continue;
        L->id = b.result;
        R->alive = 0;
        L->next = R->next;
        if (R->next >= 0) s[R->next].prev = b.left;
        if (add_bigram(tk, q, s, L->prev, b.left) || add_bigram(tk, q, s, b.left, L->next)) return -3;
    }
    return 0;
}

/* gemma4 (llama.cpp's "gemma4" BPE): one word of raw UTF-8, w[0..n). A word of newlines that is a token
 * is taken whole; otherwise each UTF-8 character is a symbol (its token, or none), merges run by rank,
 * and a symbol left without a token is spelled with the <0xXX> tokens of its bytes. */
static int gemma4_word(const bmoe_tokenizer *tk, const uint8_t *w, size_t n, sym *s, size_t *at, tok_heap *q,
                       tok_vec *out, char *err, size_t errlen) {
    size_t nl = 0;
    while (nl < n && w[nl] == '\n') nl++;
    if (nl == n) {
        int32_t id = tok_find(tk, w, n);
        if (id >= 0) return tok_vec_push(out, id);
    }
    size_t ns = 0;
    for (size_t o = 0; o < n; ns++) {
        size_t l = (size_t)uni_len_from_lead(w[o]);
        if (l > n - o) l = n - o;
        at[ns] = o;
        s[ns] = (sym){ tok_find(tk, w + o, l), (int)ns - 1, o + l < n ? (int)ns + 1 : -1, 1 };
        o += l;
    }
    at[ns] = n;
    if (merge_symbols(tk, s, ns, q)) return -3;
    for (int i = 0; i >= 0; i = s[i].next) {
        if (s[i].id >= 0) {
            if (tok_vec_push(out, s[i].id)) return -3;
            continue;
        }
        /* only a symbol that never merged lacks a token: its own bytes, each as <0xXX> */
        for (size_t b = at[i]; b < at[i + 1]; b++) {
            if (tk->byte_token[w[b]] < 0) {
                snprintf(err, errlen, "byte 0x%02x has no token in this model's vocabulary", w[b]);
                return -1;
            }
            if (tok_vec_push(out, tk->byte_token[w[b]])) return -3;
        }
    }
    return 0;
}

int tok_gemma4_fragment(const bmoe_tokenizer *tk, const uint8_t *text, size_t len, tok_vec *out, char *err,
                        size_t errlen) {
    if (len == 0) return 0;
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    uint8_t *esc = malloc(len + 2 * spaces + 1); /* ' ' becomes U+2581, three bytes */
    sym *s = malloc((len + 2 * spaces + 1) * sizeof *s);
    size_t *at = malloc((len + 2 * spaces + 2) * sizeof *at);
    tok_heap q = { 0 };
    int rc = 0;
    if (!esc || !s || !at) { rc = -3; goto done; }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { esc[n++] = 0xe2; esc[n++] = 0x96; esc[n++] = 0x81; }
        else esc[n++] = text[i];
    }
    /* words: runs of newlines and runs of anything else ("[^\n]+|[\n]+") */
    for (size_t o = 0; o < n && !rc;) {
        size_t e = o + 1;
        while (e < n && (esc[e] == '\n') == (esc[o] == '\n')) e++;
        rc = gemma4_word(tk, esc + o, e - o, s, at, &q, out, err, errlen);
        o = e;
    }
done:
    free(esc);
    free(s);
    free(at);
    tok_heap_free(&q);
    return rc;
}

int tok_bpe_fragment(const bmoe_tokenizer *tk, const uint8_t *text, size_t len, tok_vec *out, char *err, size_t errlen) {
    if (len == 0) return 0;
    uint32_t *cp = malloc(len * sizeof *cp);
    size_t *lens = malloc(len * sizeof *lens), *tmp = malloc(len * sizeof *tmp);
    uint8_t *word = malloc(len * 3 + 4); /* U+FFFD replacements make a word longer than its input */
    uint8_t *enc = malloc(len * 6 + 8);
    sym *s = malloc((len * 3 + 4) * sizeof *s);
    tok_heap q = { 0 };
    int rc = 0;
    if (!cp || !lens || !tmp || !word || !enc || !s) { rc = -3; goto done; }
    size_t n = uni_decode(text, len, cp);
    size_t nw = pretok_split((pretok_kind)tk->pre, cp, n, lens, tmp);
    size_t at = 0;
    for (size_t w = 0; w < nw && !rc; w++) {
        size_t k = 0;
        for (size_t i = at; i < at + lens[w]; i++) k += (size_t)uni_encode(cp[i], word + k);
        at += lens[w];
        rc = bpe_word(tk, word, k, enc, s, &q, out, err, errlen);
    }
done:
    free(cp);
    free(lens);
    free(tmp);
    free(word);
    free(enc);
    free(s);
    tok_heap_free(&q);
    return rc;
}
