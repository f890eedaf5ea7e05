/* The vocabulary's lookups (tok_vocab.h): byte images, the token map, the merges, the token vector. */
#include "tok_vocab.h"

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

/* ---- lookups ---------------------------------------------------------------------------------- */

uint64_t tok_hash_text(const uint8_t *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

uint64_t tok_hash_pair(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ull; k ^= k >> 33;
    return k;
}

const uint8_t *tok_text(const bmoe_tokenizer *tk, int32_t id, size_t *len) {
    *len = (size_t)(tk->text_off[id + 1] - tk->text_off[id]);
    return tk->text + tk->text_off[id];
}

int32_t tok_find(const bmoe_tokenizer *tk, const uint8_t *s, size_t len) {
    if (!tk->map) return -1;
    for (uint32_t i = (uint32_t)tok_hash_text(s, len) & tk->map_mask;; i = (i + 1) & tk->map_mask) {
        int32_t id = tk->map[i];
        if (id < 0) return -1;
        size_t l;
        const uint8_t *t = tok_text(tk, id, &l);
        if (l == len && memcmp(t, s, len) == 0) return id;
    }
}

int tok_merge_find(const bmoe_tokenizer *tk, int32_t a, int32_t b, int32_t *result) {
    if (!tk->n_merges || a < 0 || b < 0) return -1;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = (uint32_t)tok_hash_pair(key) & tk->merge_mask;; i = (i + 1) & tk->merge_mask) {
        if (tk->merge_rank[i] < 0) return -1;
        if (tk->merge_key[i] == key) { *result = tk->merge_result[i]; return tk->merge_rank[i]; }
    }
}

int tok_vec_push(tok_vec *v, int32_t id) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->v, (size_t)cap * sizeof *p);
        if (!p) return -3;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = id;
    return 0;
}
