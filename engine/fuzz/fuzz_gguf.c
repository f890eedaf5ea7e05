/* Fuzz target for the GGUF reader.
 *
 * With -DBMOE_LIBFUZZER (clang -fsanitize=fuzzer): only LLVMFuzzerTestOneInput, driven by libFuzzer.
 *   make -C engine fuzz && engine/build/fuzz_gguf -max_total_time=60 engine/fuzz/corpus
 *
 * Without it (gcc, ASan + UBSan): a main() that runs a bounded, deterministic mutation loop over the seed
 * files given on the command line, so that every machine with a C compiler can fuzz a little:
 *   make -C engine fuzz-smoke && engine/build/fuzz_gguf_smoke --iterations 20000 engine/fuzz/corpus
 *
 * Besides "no crash, no sanitizer report", the target checks what a successful parse promises (every
 * tensor aligned and inside the buffer, sizes consistent with the type, names and keys unique and found
 * by lookup) and what a failure promises (status 3 or 1, one non-empty line naming the input); a broken
 * promise aborts, which both drivers report as a finding. A parsed image with tokenizer metadata also goes
 * through tok_load and, when that accepts it, encodes and decodes a fixed text: malformed tokenizer
 * metadata must give status 3 (or 1) and one line, never a crash. */
#include "gguf.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void finding(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_gguf: FINDING: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

static volatile uint64_t sink;

static void touch(const void *p, uint64_t n) { /* let ASan see every byte the model hands out */
    const unsigned char *b = p;
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++) s += b[i];
    sink += s;
}

static void check_model(const gguf_model *m, size_t size) {
    char err[512];
    if (m->n_shards != 1 || !m->shards || m->shards[0].size != size || m->shards[0].fd != -1)
        finding("shard table", NULL);
    if (m->alignment == 0 || (m->alignment & (m->alignment - 1)) || m->alignment > GGUF_MAX_ALIGNMENT)
        finding("alignment", NULL);
    if (m->shards[0].data_offset % m->alignment) finding("data offset not aligned", NULL);
    for (uint64_t i = 0; i < m->n_kv; i++) {
        const gguf_kv *kv = &m->kv[i];
        if (kv->key.len == 0 || kv->key.ptr[kv->key.len] != '\0') finding("key not terminated", NULL);
        touch(kv->key.ptr, kv->key.len + 1);
        if (kv->type >= GGUF_TYPE_COUNT) finding("kv type", NULL);
        if (memchr(kv->key.ptr, 0, kv->key.len) == NULL && gguf_find_kv(m, kv->key.ptr) != kv)
            finding("kv lookup", kv->key.ptr);
        if (kv->type == GGUF_TYPE_STRING) {
            if (kv->str.ptr[kv->str.len] != '\0') finding("string not terminated", NULL);
            touch(kv->str.ptr, kv->str.len);
        }
        if (kv->type == GGUF_TYPE_ARRAY) {
            if (kv->arr_type == GGUF_TYPE_ARRAY || kv->arr_type >= GGUF_TYPE_COUNT) finding("array type", NULL);
            if (kv->n && !kv->data) finding("array data", NULL);
            for (uint64_t j = 0; j < kv->n; j++) {
                gguf_str s;
                uint64_t u;
                int64_t v;
                double f;
                if (kv->arr_type == GGUF_TYPE_STRING) {
                    if (!gguf_arr_str(kv, j, &s) || s.ptr[s.len] != '\0') finding("array string", NULL);
                    touch(s.ptr, s.len);
                } else {
                    if (!gguf_arr_f64(kv, j, &f) && kv->arr_type != GGUF_TYPE_BOOL) finding("array number", NULL);
                    (void)gguf_arr_u64(kv, j, &u);
                    (void)gguf_arr_i64(kv, j, &v);
                }
            }
            gguf_str s;
            if (gguf_arr_str(kv, kv->n, &s)) finding("array index past the end accepted", NULL);
        }
        /* every getter on every key: results are checked for sanity only */
        uint64_t u;
        int64_t v;
        double f;
        int b;
        gguf_str s;
        const gguf_kv *akv;
        if (gguf_get_u64(m, kv->key.ptr, &u, err, sizeof err) < 0 && strchr(err, '\n')) finding("getter message", err);
        (void)gguf_get_i64(m, kv->key.ptr, &v, err, sizeof err);
        (void)gguf_get_f64(m, kv->key.ptr, &f, err, sizeof err);
        (void)gguf_get_bool(m, kv->key.ptr, &b, err, sizeof err);
        (void)gguf_get_str(m, kv->key.ptr, &s, err, sizeof err);
        (void)gguf_get_arr(m, kv->key.ptr, GGUF_TYPE_COUNT, &akv, err, sizeof err);
    }
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const gguf_tensor *t = &m->tensors[i];
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) finding("n_dims", NULL);
        if (t->name.len == 0 || t->name.ptr[t->name.len] != '\0') finding("name not terminated", NULL);
        touch(t->name.ptr, t->name.len + 1);
        if (gguf_find_tensor(m, t->name.ptr) != t) finding("tensor lookup", t->name.ptr);
        if (t->offset % m->alignment || t->offset < m->shards[0].data_offset) finding("tensor offset", t->name.ptr);
        if (t->offset > size || t->nbytes > size - t->offset) finding("tensor outside the buffer", t->name.ptr);
        uint64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) {
            if (t->ne[d] == 0) finding("ne 0", NULL);
            nel *= t->ne[d]; /* bounded by the parser: <= INT64_MAX */
        }
        if (ggml_type_nbytes(t->type, nel) != t->nbytes) finding("nbytes", t->name.ptr);
        if (ggml_type_nbytes(t->type, t->ne[0]) != t->row_bytes) finding("row_bytes", t->name.ptr);
    }
    /* no two tensors share a byte (quadratic, so only for the small images fuzzing produces) */
    if (m->n_tensors <= 512)
        for (uint64_t i = 0; i < m->n_tensors; i++)
            for (uint64_t j = i + 1; j < m->n_tensors; j++) {
                const gguf_tensor *a = &m->tensors[i], *b = &m->tensors[j];
                if (a->offset < b->offset + b->nbytes && b->offset < a->offset + a->nbytes)
                    finding("tensors overlap", b->name.ptr);
            }
    if (gguf_find_kv(m, "") || gguf_find_tensor(m, "")) finding("empty name found", NULL);
}

static void check_tokenizer(const gguf_model *m) {
    if (!gguf_find_kv(m, "tokenizer.ggml.tokens")) return;
    bmoe_tokenizer tk;
    char err[512];
    int rc = tok_load(&tk, m, "<buffer>", err, sizeof err);
    if (rc) {
        if (rc != 3 && rc != 1) finding("tok_load: unexpected status", err);
        if (strchr(err, '\n')) finding("tok_load: message is not one line", err);
        return;
    }
    static const char text[] = "Hello world's  12345 \xc3\xa9\xff <s></s><|endoftext|>\n\n x";
    int32_t *ids = NULL;
    int n = 0;
    rc = tok_encode(&tk, (const uint8_t *)text, sizeof text - 1, TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, &ids, &n, err,
                    sizeof err);
    if (rc != 0 && rc != -1 && rc != -3) finding("tok_encode: unexpected status", NULL);
    for (int i = 0; rc == 0 && i < n; i++)
        if (ids[i] < 0 || ids[i] >= tk.n_vocab) finding("tok_encode: id outside the vocabulary", NULL);
    uint8_t *dec = NULL;
    size_t dl = 0;
    if (rc == 0 && tok_detokenize(&tk, ids, n, &dec, &dl) == 0) touch(dec, dl);
    free(dec);
    free(ids);
    tok_free(&tk);
}

static int last_rc;         /* for the smoke driver's statistics */
static char last_err[512];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_model *m = NULL;
    char *err = last_err;
    memset(last_err, 'X', sizeof last_err);
    int rc = gguf_parse_buffer(data, size, &m, err, sizeof last_err);
    last_rc = rc;
    if (rc == BMOE_GGUF_OK) {
        if (!m) finding("OK without a model", NULL);
        check_model(m, size);
        check_tokenizer(m);
    } else {
        if (m) finding("model returned on failure", NULL);
        if (rc != BMOE_GGUF_EMALFORMED && rc != BMOE_GGUF_ENOMEM) finding("unexpected status", err);
        if (!memchr(err, '\0', sizeof last_err)) finding("message not terminated", NULL);
        if (strncmp(err, "<buffer>: ", 10) != 0 || strlen(err) < 12) finding("message does not name the input", err);
        if (strchr(err, '\n') || strchr(err, '\r')) finding("message is not one line", err);
    }
    gguf_close(m);
    return 0;
}

#ifndef BMOE_LIBFUZZER
/* ---------------------------------------------------------------------------------------------- */
/* the bounded, deterministic mutation loop                                                        */

#include <dirent.h>
#include <sys/stat.h>
#include <time.h>

typedef struct { uint8_t *b; size_t n; size_t hot; } blob; /* hot: header bytes (mutate mostly there) */

static uint64_t rng_state;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}
static size_t rndn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static blob *inputs;
static size_t n_inputs, cap_inputs;

static void add_input(const uint8_t *b, size_t n) {
    if (n_inputs == cap_inputs) {
        cap_inputs = cap_inputs ? cap_inputs * 2 : 16;
        inputs = realloc(inputs, cap_inputs * sizeof *inputs);
        if (!inputs) { perror("realloc"); exit(1); }
    }
    inputs[n_inputs].b = malloc(n ? n : 1);
    if (!inputs[n_inputs].b) { perror("malloc"); exit(1); }
    if (n) memcpy(inputs[n_inputs].b, b, n);
    inputs[n_inputs].n = n;
    inputs[n_inputs].hot = n;
    gguf_model *m = NULL;
    char err[512];
    if (gguf_parse_buffer(b, n, &m, err, sizeof err) == BMOE_GGUF_OK) inputs[n_inputs].hot = m->shards[0].data_offset;
    gguf_close(m);
    n_inputs++;
}

static int load_file(const char *path, size_t max) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return -1; }
    uint8_t *b = malloc(max);
    if (!b) { fclose(f); return -1; }
    size_t n = fread(b, 1, max, f);
    fclose(f);
    add_input(b, n);
    free(b);
    return 0;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int load_path(const char *path, size_t max) {
    struct stat st;
    if (stat(path, &st) != 0) { perror(path); return -1; }
    if (!S_ISDIR(st.st_mode)) return load_file(path, max);
    DIR *d = opendir(path);
    if (!d) { perror(path); return -1; }
    char **names = NULL;
    size_t nn = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        names = realloc(names, (nn + 1) * sizeof *names);
        size_t len = strlen(path) + strlen(de->d_name) + 2;
        names[nn] = malloc(len);
        snprintf(names[nn], len, "%s/%s", path, de->d_name);
        nn++;
    }
    closedir(d);
    qsort(names, nn, sizeof *names, cmp_names); /* directory order is not deterministic */
    int rc = 0;
    for (size_t i = 0; i < nn; i++) {
        if (load_file(names[i], max)) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
}

static size_t hot_len; /* header length of the input being mutated */

/* A position in [0, len - width]: three times in four inside the header, where the structure is. */
static size_t pick(size_t len, size_t width) {
    if (len < width) return 0;
    size_t span = len - width + 1;
    if (hot_len && hot_len < span && rndn(4)) span = hot_len;
    return rndn(span);
}

/* One mutation of w (length *n, capacity cap). */
static void mutate(uint8_t *w, size_t *n, size_t cap) {
    static const uint64_t big[] = {
        0, 1, 2, 0x7f, 0x80, 0xff, 0xffff, 0x7fffffff, 0x80000000, 0xffffffff, UINT64_C(0x100000000),
        UINT64_C(1) << 40, UINT64_C(1) << 61, UINT64_C(1) << 62, UINT64_C(0x7fffffffffffffff),
        UINT64_C(0x8000000000000000), UINT64_MAX, UINT64_MAX - 31,
    };
    static const uint32_t small[] = { 0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 31, 32, 33, 64, 255, 256, 0x7fffffff,
                                      0x80000000, 0xffffffff };
    static const uint8_t bytes[] = { 0, 0xff, 0x7f, 0x80, 1 };
    size_t len = *n;
    switch (rndn(10)) {
    case 0: /* bit flip */
        if (len) w[pick(len, 1)] ^= (uint8_t)(1u << rndn(8));
        break;
    case 1: /* interesting byte */
        if (len) w[pick(len, 1)] = bytes[rndn(sizeof bytes)];
        break;
    case 2: { /* length / count inflation: prefer a u64 that looks like a length (small, non-zero) */
        if (len < 8) break;
        size_t p = pick(len, 8);
        for (int tries = 0; tries < 32; tries++) {
            size_t q = pick(len, 8);
            uint64_t v = get_le(w + q, 8);
            if (v && v < len) { p = q; break; }
        }
        uint64_t v = get_le(w + p, 8), nv;
        switch (rndn(5)) {
        case 0: nv = big[rndn(sizeof big / sizeof big[0])]; break;
        case 1: nv = (uint64_t)(len - p); break;          /* exactly what is left after the field */
        case 2: nv = (uint64_t)(len - p) + 1 + rndn(8); break; /* just past the end */
        case 3: nv = v * 2 + 1; break;
        default: nv = v + (uint64_t)rndn(64) - 32; break;
        }
        put_le(w + p, nv, 8);
        break;
    }
    case 3: { /* interesting u32 (types, n_dims, versions, alignment) */
        if (len < 4) break;
        put_le(w + pick(len, 4), small[rndn(sizeof small / sizeof small[0])], 4);
        break;
    }
    case 4: /* truncation */
        if (len) *n = rndn(len);
        break;
    case 5: { /* splice: overwrite with a chunk of another input */
        const blob *o = &inputs[rndn(n_inputs)];
        if (!o->n || !len) break;
        size_t from = rndn(o->n), cnt = 1 + rndn(o->n - from), at = rndn(len);
        if (cnt > len - at) cnt = len - at;
        memmove(w + at, o->b + from, cnt);
        break;
    }
    case 6: { /* splice: the head of this input, the tail of another */
        const blob *o = &inputs[rndn(n_inputs)];
        size_t keep = rndn(len + 1), from = rndn(o->n + 1), cnt = o->n - from;
        if (cnt > cap - keep) cnt = cap - keep;
        memmove(w + keep, o->b + from, cnt);
        *n = keep + cnt;
        break;
    }
    case 7: { /* delete a chunk */
        if (!len) break;
        size_t at = rndn(len), cnt = 1 + rndn(len - at > 64 ? 64 : len - at);
        memmove(w + at, w + at + cnt, len - at - cnt);
        *n = len - cnt;
        break;
    }
    case 8: { /* duplicate a chunk in place (repeated kvs / tensor infos) */
        if (!len) break;
        size_t at = rndn(len), cnt = 1 + rndn(len - at > 128 ? 128 : len - at);
        if (cnt > cap - len) break;
        memmove(w + at + cnt, w + at, len - at);
        *n = len + cnt;
        break;
    }
    default: { /* small arithmetic on a u64 field */
        if (len < 8) break;
        size_t p = pick(len, 8);
        put_le(w + p, get_le(w + p, 8) + (uint64_t)rndn(33) - 16, 8);
        break;
    }
    }
}

/* Rough count of distinct rejection reasons: digits and quoted names folded away. */
#define N_REASONS 1024
static char *reasons[N_REASONS];
static size_t n_reasons;

static void note_reason(const char *err) {
    char buf[160];
    size_t o = 0;
    int depth = 0;
    for (const char *p = err; *p && o + 1 < sizeof buf; p++) {
        if (*p == '(') depth++;
        if (*p == ')' && depth) { depth--; continue; }
        if (depth || (*p >= '0' && *p <= '9')) continue;
        buf[o++] = *p;
    }
    buf[o] = '\0';
    for (size_t i = 0; i < n_reasons; i++)
        if (!strcmp(reasons[i], buf)) return;
    if (n_reasons < N_REASONS) reasons[n_reasons++] = strdup(buf);
}

static void usage(void) {
    fprintf(stderr, "usage: fuzz_gguf_smoke [--iterations N] [--seed S] [--max-size BYTES] [-v] FILE|DIR...\n"
                    "  runs every input as given, then N deterministic mutations of them (default 20000)\n");
}

int main(int argc, char **argv) {
    uint64_t iterations = 20000, seed = 1;
    size_t max = 1 << 16;
    int verbose = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iterations") && i + 1 < argc) iterations = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--max-size") && i + 1 < argc) max = (size_t)strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(); return 0; }
        else if (argv[i][0] == '-') { usage(); return 2; }
        else if (load_path(argv[i], max)) return 2;
    }
    if (!n_inputs) { usage(); return 2; }
    if (max < 64) max = 64;
    rng_state = seed;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    uint64_t ok = 0, bad = 0, nomem = 0;
    size_t seeds = n_inputs;
    for (size_t i = 0; i < seeds; i++) LLVMFuzzerTestOneInput(inputs[i].b, inputs[i].n);

    uint8_t *w = malloc(max);
    if (!w) return 1;
    for (uint64_t it = 0; it < iterations; it++) {
        /* half the time a seed, else any input (parsable mutants included) */
        const blob *base = &inputs[rndn(2) ? rndn(seeds) : rndn(n_inputs)];
        hot_len = base->hot;
        size_t n = base->n < max ? base->n : max;
        memcpy(w, base->b, n);
        int k = 1 + (int)rndn(4);
        for (int j = 0; j < k; j++) mutate(w, &n, max);
        /* run it on an exact-size heap copy so ASan catches a one-byte overread */
        uint8_t *in = malloc(n ? n : 1);
        if (!in) return 1;
        memcpy(in, w, n);
        LLVMFuzzerTestOneInput(in, n);
        int rc = last_rc;
        if (rc == BMOE_GGUF_OK) {
            ok++;
            /* parsable mutants go back into the pool (bounded): they reach deeper than the seeds */
            if (n_inputs < seeds + 256) add_input(in, n);
            else {
                blob *slot = &inputs[seeds + rndn(256)];
                free(slot->b);
                slot->b = malloc(n ? n : 1);
                if (!slot->b) return 1;
                memcpy(slot->b, in, n);
                slot->n = n;
                slot->hot = n;
            }
        } else if (rc == BMOE_GGUF_ENOMEM) nomem++;
        else {
            bad++;
            note_reason(last_err);
        }
        free(in);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (verbose)
        for (size_t i = 0; i < n_reasons; i++) fprintf(stderr, "  reason: %s\n", reasons[i]);
    printf("fuzz_gguf_smoke: %zu seeds, %llu iterations (seed %llu) in %.2f s: %llu parsed, %llu rejected "
           "(%zu distinct reasons), %llu out of memory, 0 findings\n",
           seeds, (unsigned long long)iterations, (unsigned long long)seed, secs, (unsigned long long)ok,
           (unsigned long long)bad, n_reasons, (unsigned long long)nomem);
    for (size_t i = 0; i < n_reasons; i++) free(reasons[i]);
    free(w);
    for (size_t i = 0; i < n_inputs; i++) free(inputs[i].b);
    free(inputs);
    return 0;
}
#endif
