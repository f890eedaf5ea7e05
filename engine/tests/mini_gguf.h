/* A minimal in-memory GGUF v3 writer (metadata only) for the C unit tests that need a vocabulary:
 * key-value pairs appended to a `meta`, then finish() parses the image with gguf_parse_buffer. */
#ifndef BMOE_MINI_GGUF_H
#define BMOE_MINI_GGUF_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

typedef struct { uint8_t *b; size_t n, cap; } buf;
static inline void put(buf *o, const void *p, size_t n) {
    if (o->n + n > o->cap) { o->cap = (o->n + n) * 2 + 64; o->b = realloc(o->b, o->cap); }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static inline void u32(buf *o, uint32_t v) { uint8_t b[4]; for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> 8 * i); put(o, b, 4); }
static inline void u64(buf *o, uint64_t v) { uint8_t b[8]; for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> 8 * i); put(o, b, 8); }
static inline void str(buf *o, const char *s) { u64(o, strlen(s)); put(o, s, strlen(s)); }

typedef struct { buf kv; uint64_t n_kv; } meta;
static inline void kv_u32(meta *m, const char *k, uint32_t v) { str(&m->kv, k); u32(&m->kv, 4); u32(&m->kv, v); m->n_kv++; }
static inline void kv_bool(meta *m, const char *k, int v) { uint8_t b = (uint8_t)v; str(&m->kv, k); u32(&m->kv, 7); put(&m->kv, &b, 1); m->n_kv++; }
static inline void kv_str(meta *m, const char *k, const char *v) { str(&m->kv, k); u32(&m->kv, 8); str(&m->kv, v); m->n_kv++; }
static inline void kv_strs(meta *m, const char *k, char **v, int n) {
    str(&m->kv, k); u32(&m->kv, 9); u32(&m->kv, 8); u64(&m->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) str(&m->kv, v[i]);
    m->n_kv++;
}
static inline void kv_f32s(meta *m, const char *k, const float *v, int n) {
    str(&m->kv, k); u32(&m->kv, 9); u32(&m->kv, 6); u64(&m->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) { uint32_t b; memcpy(&b, &v[i], 4); u32(&m->kv, b); }
    m->n_kv++;
}
static inline void kv_i32s(meta *m, const char *k, const int32_t *v, int n) {
    str(&m->kv, k); u32(&m->kv, 9); u32(&m->kv, 5); u64(&m->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) u32(&m->kv, (uint32_t)v[i]);
    m->n_kv++;
}
static inline gguf_model *finish(meta *m) {
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

#endif
