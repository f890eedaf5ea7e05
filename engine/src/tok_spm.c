/* SentencePiece-style encoding of one raw text fragment (tokenizer.h), llama.cpp's
 * llm_tokenizer_spm_session: spaces become U+2581 (and one is prefixed when asked), the text is cut
 * into UTF-8 characters, and the adjacent pair whose concatenation is the best-scoring token merges
 * first (leftmost among equal scores) until no pair is a token. A piece left without a token is
 * spelled with byte tokens <0xXX>. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_heap.h"
#include "tok_spm.h"
#include "unicode.h"

typedef struct { size_t off, n; int prev, next; } sym;

static int add_bigram(const bmoe_tokenizer *tk, tok_heap *q, const uint8_t *t, const sym *s, int l, int r) {
    if (l < 0 || r < 0) return 0;
    size_t size = s[l].n + s[r].n; /* the two symbols are adjacent in t */
    int32_t id = tok_find(tk, t + s[l].off, size);
    if (id < 0) return 0;
    return tok_heap_push(q, (tok_bigram){ .key = -(double)tk->score[id], .left = l, .right = r, .size = size });
}

int tok_spm_fragment(const bmoe_tokenizer *tk, const uint8_t *text, size_t len, int space_prefix, tok_vec *out, char *err,
                     size_t errlen) {
    /* the escaped text: each space (and the prefix) is the 3 bytes of U+2581 */
    size_t cap = (len + 1) * 3;
    uint8_t *t = malloc(cap);
    sym *s = malloc(cap * sizeof *s);
    tok_heap q = { 0 };
    int rc = 0;
    if (!t || !s) { rc = -3; goto done; }
    size_t n = 0;
    static const uint8_t U2581[3] = { 0xe2, 0x96, 0x81 };
    if (space_prefix) { memcpy(t, U2581, 3); n = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(t + n, U2581, 3); n += 3; }
        else t[n++] = text[i];
    }
    int ns = 0;
    for (size_t o = 0; o < n;) {
        size_t l = (size_t)uni_len_from_lead(t[o]);
        if (l > n - o) l = n - o;
        s[ns] = (sym){ o, l, ns - 1, o + l < n ? ns + 1 : -1 };
        ns++;
        o += l;
    }
    for (int i = 1; i < ns; i++)
        if (add_bigram(tk, &q, t, s, i - 1, i)) { rc = -3; goto done; }
    while (q.n) {
        tok_bigram b = tok_heap_pop(&q);
        sym *L = &s[b.left], *R = &s[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue; /* stale */
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) s[R->next].prev = b.left;
        if (add_bigram(tk, &q, t, s, L->prev, b.left) || add_bigram(tk, &q, t, s, b.left, L->next)) { rc = -3; goto done; }
    }
    for (int i = ns ? 0 : -1; i >= 0; i = s[i].next) {
        int32_t id = tok_find(tk, t + s[i].off, s[i].n);
        if (id >= 0) {
            if (tok_vec_push(out, id)) { rc = -3; goto done; }
            continue;
        }
        for (size_t j = 0; j < s[i].n; j++) { /* byte fallback */
            uint8_t b = t[s[i].off + j];
            if (tk->byte_token[b] < 0) {
                snprintf(err, errlen, "byte 0x%02x has no token in this model's vocabulary", b);
                rc = -1;
                goto done;
            }
            if (tok_vec_push(out, tk->byte_token[b])) { rc = -3; goto done; }
        }
    }
done:
    free(t);
    free(s);
    tok_heap_free(&q);
    return rc;
}
