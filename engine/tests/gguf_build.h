/* An in-memory GGUF v3 writer with tensors (F32, random values) for the C unit tests that load a whole
 * model: key-value pairs (scalars and integer arrays), tensor infos and data, written to a file. */
#ifndef BMOE_GGUF_BUILD_H
#define BMOE_GGUF_BUILD_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint8_t *b; size_t n, cap; } gbuf;
static inline void gb_put(gbuf *o, const void *p, size_t n) {
    if (o->n + n > o->cap) { o->cap = (o->n + n) * 2 + 64; o->b = realloc(o->b, o->cap); }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static inline void gb_u32(gbuf *o, uint32_t v) { uint8_t b[4]; for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> 8 * i); gb_put(o, b, 4); }
static inline void gb_u64(gbuf *o, uint64_t v) { uint8_t b[8]; for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> 8 * i); gb_put(o, b, 8); }
static inline void gb_str(gbuf *o, const char *s) { gb_u64(o, strlen(s)); gb_put(o, s, strlen(s)); }

typedef struct { gbuf kv, ti, data; uint64_t n_kv, n_t, rng; } gguf_build;

static inline void gb_kv_u32(gguf_build *g, const char *k, uint32_t v) { gb_str(&g->kv, k); gb_u32(&g->kv, 4); gb_u32(&g->kv, v); g->n_kv++; }
static inline void gb_kv_f32(gguf_build *g, const char *k, float v) {
    uint32_t u; memcpy(&u, &v, 4); gb_str(&g->kv, k); gb_u32(&g->kv, 6); gb_u32(&g->kv, u); g->n_kv++;
}
static inline void gb_kv_str(gguf_build *g, const char *k, const char *v) { gb_str(&g->kv, k); gb_u32(&g->kv, 8); gb_str(&g->kv, v); g->n_kv++; }
static inline void gb_kv_u32s(gguf_build *g, const char *k, const uint32_t *v, int n) {
    gb_str(&g->kv, k); gb_u32(&g->kv, 9); gb_u32(&g->kv, 4); gb_u64(&g->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) gb_u32(&g->kv, v[i]);
    g->n_kv++;
}
/* n single-letter tokens "A", "B", ... */
static inline void gb_kv_vocab(gguf_build *g, int n) {
    gb_str(&g->kv, "tokenizer.ggml.tokens"); gb_u32(&g->kv, 9); gb_u32(&g->kv, 8); gb_u64(&g->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) { char s[2] = { (char)('A' + i % 26), 0 }; gb_str(&g->kv, s); }
    g->n_kv++;
}

static inline float gb_rand(gguf_build *g) { /* [-1, 1) */
    g->rng = g->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g->rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* An F32 tensor, ne[0] first: values around `center` spread by `s`. */
static inline void gb_tensor(gguf_build *g, const char *name, int nd, uint64_t e0, uint64_t e1, uint64_t e2, float center,
                             float s) {
    uint64_t ne[3] = { e0, e1, e2 }, n = e0 * e1 * e2;
    while (g->data.n % 32) { uint8_t z = 0; gb_put(&g->data, &z, 1); }
    gb_str(&g->ti, name); gb_u32(&g->ti, (uint32_t)nd);
    for (int i = 0; i < nd; i++) gb_u64(&g->ti, ne[i]);
    gb_u32(&g->ti, 0 /* F32 */); gb_u64(&g->ti, g->data.n);
    g->n_t++;
    for (uint64_t i = 0; i < n; i++) {
        float v = center + s * gb_rand(g);
        gb_put(&g->data, &v, 4);
    }
}

/* Writes the file and frees the builder; 0 or -1. */
static inline int gb_write(gguf_build *g, const char *path) {
    gbuf o = {0};
    gb_put(&o, "GGUF", 4); gb_u32(&o, 3); gb_u64(&o, g->n_t); gb_u64(&o, g->n_kv);
    gb_put(&o, g->kv.b, g->kv.n);
    gb_put(&o, g->ti.b, g->ti.n);
    while (o.n % 32) { uint8_t z = 0; gb_put(&o, &z, 1); }
    gb_put(&o, g->data.b, g->data.n);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(o.b, 1, o.n, f) == o.n;
    if (f) fclose(f);
    free(o.b); free(g->kv.b); free(g->ti.b); free(g->data.b);
    memset(g, 0, sizeof *g);
    return ok ? 0 : -1;
}

#endif
