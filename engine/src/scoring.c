/* Input files and row scoring of the quality instruments (scoring.h, docs/engine-flags.md, scoring). */
#include "scoring.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "forward.h"
#include "tensor.h"

/* ------------------------------------------------------------------------------------------------ */
/* Files                                                                                             */

int score_read_file(const char *flag, const char *path, uint8_t **buf, size_t *len, bmoe_error *err) {
    *buf = NULL;
    *len = 0;
    struct stat st;
    if (stat(path, &st) != 0) return err_set(err, 2, "usage", "%s: cannot open %s: %s", flag, path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return err_set(err, 2, "usage", "%s: %s is a directory", flag, path);
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, 2, "usage", "%s: cannot open %s: %s", flag, path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = malloc(cap + 1);
    int rc = 0;
    while (b) {
        if (n == cap) {
            if (cap >= BMOE_MAX_INPUT_BYTES) {
                rc = err_set(err, 2, "usage", "%s: %s is larger than %u bytes", flag, path, BMOE_MAX_INPUT_BYTES);
                break;
            }
            uint8_t *nb = realloc(b, cap * 2 + 1);
            if (!nb) { free(b); b = NULL; break; }
            b = nb;
            cap *= 2;
        }
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) rc = err_set(err, 2, "usage", "%s: cannot read %s: %s", flag, path, strerror(errno ? errno : EIO));
            break;
        }
    }
    fclose(f);
    if (!b) return err_set(err, 1, NULL, "%s: out of memory reading %s", flag, path);
    if (!rc && n > BMOE_MAX_INPUT_BYTES)
        rc = err_set(err, 2, "usage", "%s: %s is larger than %u bytes", flag, path, BMOE_MAX_INPUT_BYTES);
    if (!rc && n == 0) rc = err_set(err, 2, "usage", "%s: %s is empty", flag, path);
    if (rc) { free(b); return rc; }
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}

int score_read_ref(const char *path, int V, int64_t n_scored, float **out, bmoe_error *err) {
    *out = NULL;
    uint8_t *buf;
    size_t len;
    struct stat st;
    /* the size decides before anything is read: a reference for another text or model is refused */
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) {
        uint64_t row = (uint64_t)V * 4, sz = (uint64_t)st.st_size;
        if (sz != row * (uint64_t)n_scored && sz != row * (uint64_t)(n_scored + 1))
            return err_set(err, 2, "config",
                           "--ppl-ref: %s has %llu bytes, expected %lld or %lld rows of %d f32 logits (%llu or %llu bytes)",
                           path, (unsigned long long)sz, (long long)n_scored, (long long)n_scored + 1, V,
                           (unsigned long long)(row * (uint64_t)n_scored),
                           (unsigned long long)(row * (uint64_t)(n_scored + 1)));
    }
    /* read without the text size cap: the size was just checked against the text */
    FILE *f = NULL;
    if (stat(path, &st) != 0) return err_set(err, 2, "usage", "--ppl-ref: cannot open %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return err_set(err, 2, "usage", "--ppl-ref: %s is a directory", path);
    f = fopen(path, "rb");
    if (!f) return err_set(err, 2, "usage", "--ppl-ref: cannot open %s: %s", path, strerror(errno));
    size_t want = (size_t)V * 4 * (size_t)n_scored;
    buf = malloc(want ? want : 1);
    if (!buf) { fclose(f); return err_set(err, 1, NULL, "out of memory"); }
    len = fread(buf, 1, want, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || len != want) {
        free(buf);
        return err_set(err, 2, "usage", "--ppl-ref: cannot read %s: %s", path, bad ? strerror(errno ? errno : EIO) : "short read");
    }
    float *v = malloc((size_t)V * (size_t)n_scored * sizeof *v);
    if (!v) { free(buf); return err_set(err, 1, NULL, "out of memory"); }
    for (size_t i = 0; i < (size_t)V * (size_t)n_scored; i++) {
        const uint8_t *b = buf + 4 * i;
        uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        memcpy(&v[i], &u, 4);
    }
    free(buf);
    *out = v;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Scoring a row                                                                                     */

/* log Σ exp(l_i) over the row: max, then the exponentials summed serially in index order (double). */
static double log_sum_exp(const float *l, int V) {
    double m = l[0];
    for (int i = 1; i < V; i++)
        if (l[i] > m) m = l[i];
    double s = 0.0;
    for (int i = 0; i < V; i++) s += bm_exp((double)l[i] - m);
    return m + bm_log(s);
}

double score_row(score_acc *a, const float *logits, int V, int32_t target, const float *ref) {
    double lse = log_sum_exp(logits, V);
    double lp = (double)logits[target] - lse;
    int am = argmax_first(logits, V);
    a->nll_sum += -lp;
    a->n++;
    a->top1 += am == target;
    if (ref) {
        a->ref_agree += am == argmax_first(ref, V);
        double lse_r = log_sum_exp(ref, V), kl = 0.0;
        for (int i = 0; i < V; i++) {
            double lr = (double)ref[i] - lse_r;
            double pr = bm_exp(lr);
            if (pr > 0.0) kl += pr * (lr - ((double)logits[i] - lse));
        }
        a->kl_sum += kl;
    }
    return lp;
}

/* ------------------------------------------------------------------------------------------------ */
/* A bounded JSON reader for one JSONL line (objects of strings, integers, arrays; others skipped)   */

typedef struct jl {
    const char *p, *end;
    const char *flag;
    const char *path;
    int line;
    bmoe_error *err;
} jl;

static int jl_fail(jl *j, const char *what) {
    return err_set(j->err, 2, "usage", "%s: %s: line %d: %s", j->flag, j->path, j->line, what);
}

static void jl_ws(jl *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n')) j->p++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int jl_u4(jl *j, unsigned *v) {
    if (j->end - j->p < 4) return 1;
    unsigned x = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(j->p[i]);
        if (h < 0) return 1;
        x = x * 16 + (unsigned)h;
    }
    j->p += 4;
    *v = x;
    return 0;
}

/* A JSON string at j->p (the opening quote) → malloc'd bytes (UTF-8, escapes decoded). out NULL: skip. */
static int jl_string(jl *j, uint8_t **out, size_t *n) {
    if (j->p >= j->end || *j->p != '"') return jl_fail(j, "expected a string");
    j->p++;
    size_t cap = 16, k = 0;
    uint8_t *b = out ? malloc(cap) : NULL;
    if (out && !b) return err_set(j->err, 1, NULL, "out of memory");
    for (;;) {
        if (j->p >= j->end) { free(b); return jl_fail(j, "unterminated string"); }
        unsigned char c = (unsigned char)*j->p++;
        uint8_t tmp[4];
        size_t tn = 0;
        if (c == '"') break;
        if (c < 0x20) { free(b); return jl_fail(j, "a control character in a string"); }
        if (c != '\\') {
            tmp[tn++] = c;
        } else {
            if (j->p >= j->end) { free(b); return jl_fail(j, "unterminated string"); }
            char e = *j->p++;
            unsigned cp = 0;
            switch (e) {
            case '"': tmp[tn++] = '"'; break;
            case '\\': tmp[tn++] = '\\'; break;
            case '/': tmp[tn++] = '/'; break;
            case 'b': tmp[tn++] = '\b'; break;
            case 'f': tmp[tn++] = '\f'; break;
            case 'n': tmp[tn++] = '\n'; break;
            case 'r': tmp[tn++] = '\r'; break;
            case 't': tmp[tn++] = '\t'; break;
            case 'u':
                if (jl_u4(j, &cp)) { free(b); return jl_fail(j, "a bad \\u escape"); }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u') { free(b); return jl_fail(j, "a lone surrogate"); }
                    j->p += 2;
                    if (jl_u4(j, &lo) || lo < 0xDC00 || lo > 0xDFFF) { free(b); return jl_fail(j, "a lone surrogate"); }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    free(b);
                    return jl_fail(j, "a lone surrogate");
                }
                if (cp == 0) { free(b); return jl_fail(j, "\\u0000 is not accepted"); }
                if (cp < 0x80) tmp[tn++] = (uint8_t)cp;
                else if (cp < 0x800) { tmp[tn++] = (uint8_t)(0xC0 | cp >> 6); tmp[tn++] = (uint8_t)(0x80 | (cp & 63)); }
                else if (cp < 0x10000) {
                    tmp[tn++] = (uint8_t)(0xE0 | cp >> 12); tmp[tn++] = (uint8_t)(0x80 | ((cp >> 6) & 63));
                    tmp[tn++] = (uint8_t)(0x80 | (cp & 63));
                } else {
                    tmp[tn++] = (uint8_t)(0xF0 | cp >> 18); tmp[tn++] = (uint8_t)(0x80 | ((cp >> 12) & 63));
                    tmp[tn++] = (uint8_t)(0x80 | ((cp >> 6) & 63)); tmp[tn++] = (uint8_t)(0x80 | (cp & 63));
                }
                break;
            default: free(b); return jl_fail(j, "a bad escape in a string");
            }
        }
        if (!out) continue;
        if (k + tn + 1 > cap) {
            while (k + tn + 1 > cap) cap *= 2;
            uint8_t *nb = realloc(b, cap);
            if (!nb) { free(b); return err_set(j->err, 1, NULL, "out of memory"); }
            b = nb;
        }
        memcpy(b + k, tmp, tn);
        k += tn;
    }
    if (out) {
        b[k] = 0;
        *out = b;
        *n = k;
    }
    return 0;
}

/* An integer: -?[0-9]+ (no fraction, no exponent), within int range. */
static int jl_int(jl *j, int *v, char *text, size_t textn) {
    const char *s = j->p;
    if (j->p < j->end && *j->p == '-') j->p++;
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') return jl_fail(j, "expected an integer");
    long long x = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (x < 1000000000LL) x = x * 10 + (*j->p - '0');
        j->p++;
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')) return jl_fail(j, "expected an integer");
    if (x >= 1000000000LL) return jl_fail(j, "an integer out of range");
    *v = *s == '-' ? -(int)x : (int)x;
    if (text) snprintf(text, textn, "%.*s", (int)(j->p - s), s);
    return 0;
}

static int jl_skip(jl *j, int depth);

static int jl_skip_container(jl *j, int depth, char close) {
    j->p++;
    jl_ws(j);
    if (j->p < j->end && *j->p == close) { j->p++; return 0; }
    for (;;) {
        jl_ws(j);
        if (close == '}') {
            if (jl_string(j, NULL, NULL)) return 2;
            jl_ws(j);
            if (j->p >= j->end || *j->p != ':') return jl_fail(j, "expected ':'");
            j->p++;
        }
        if (jl_skip(j, depth + 1)) return 2;
        jl_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == close) { j->p++; return 0; }
        return jl_fail(j, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int jl_skip(jl *j, int depth) {
    jl_ws(j);
    if (depth > 32) return jl_fail(j, "nested too deeply");
    if (j->p >= j->end) return jl_fail(j, "expected a value");
    char c = *j->p;
    if (c == '"') return jl_string(j, NULL, NULL);
    if (c == '{') return jl_skip_container(j, depth, '}');
    if (c == '[') return jl_skip_container(j, depth, ']');
    const char *words[3] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t wl = strlen(words[i]);
        if ((size_t)(j->end - j->p) >= wl && memcmp(j->p, words[i], wl) == 0) { j->p += wl; return 0; }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        j->p++;
        while (j->p < j->end && strchr("0123456789.eE+-", *j->p)) j->p++;
        return 0;
    }
    return jl_fail(j, "expected a value");
}

/* Walks one object: for each key calls field(j, key, user), which parses the value (or returns -1
 * to have it skipped). */
typedef int (*jl_field_fn)(jl *j, const char *key, void *user);

static int jl_object(jl *j, jl_field_fn field, void *user) {
    jl_ws(j);
    if (j->p >= j->end || *j->p != '{') return jl_fail(j, "expected a JSON object");
    j->p++;
    jl_ws(j);
    if (j->p < j->end && *j->p == '}') { j->p++; goto tail; }
    for (;;) {
        jl_ws(j);
        uint8_t *key;
        size_t kn;
        if (jl_string(j, &key, &kn)) return 2;
        jl_ws(j);
        if (j->p >= j->end || *j->p != ':') { free(key); return jl_fail(j, "expected ':'"); }
        j->p++;
        jl_ws(j);
        int r = field(j, (const char *)key, user);
        free(key);
        if (r > 0) return r;
        if (r < 0 && jl_skip(j, 1)) return 2;
        jl_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == '}') { j->p++; break; }
        return jl_fail(j, "expected ',' or '}'");
    }
tail:
    jl_ws(j);
    if (j->p != j->end) return jl_fail(j, "unexpected text after the object");
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* --ppl-choices                                                                                     */

typedef struct choice_seen { int id, context, options, answer; } choice_seen;
typedef struct choice_ctx { choice_question *q; choice_seen seen; } choice_ctx;

static int choice_field(jl *j, const char *key, void *user) {
    choice_ctx *c = user;
    choice_question *q = c->q;
    char msg[160];
    if (strcmp(key, "id") == 0) {
        if (c->seen.id++) return jl_fail(j, "\"id\" given twice");
        if (j->p < j->end && *j->p == '"') {
            uint8_t *s;
            size_t n;
            if (jl_string(j, &s, &n)) return 2;
            q->id = (char *)s;
            q->id_is_string = 1;
            return 0;
        }
        int v;
        char text[32];
        if (j->p >= j->end || !(*j->p == '-' || (*j->p >= '0' && *j->p <= '9')))
            return jl_fail(j, "\"id\" must be a string or an integer");
        if (jl_int(j, &v, text, sizeof text)) return 2;
        q->id = strdup(text);
        if (!q->id) return err_set(j->err, 1, NULL, "out of memory");
        return 0;
    }
    if (strcmp(key, "context") == 0) {
        if (c->seen.context++) return jl_fail(j, "\"context\" given twice");
        if (j->p >= j->end || *j->p != '"') return jl_fail(j, "\"context\" must be a string");
        return jl_string(j, &q->context, &q->context_len);
    }
    if (strcmp(key, "answer") == 0) {
        if (c->seen.answer++) return jl_fail(j, "\"answer\" given twice");
        if (j->p >= j->end || !(*j->p == '-' || (*j->p >= '0' && *j->p <= '9')))
            return jl_fail(j, "\"answer\" must be an integer (an index into \"options\")");
        return jl_int(j, &q->answer, NULL, 0);
    }
    if (strcmp(key, "options") == 0) {
        if (c->seen.options++) return jl_fail(j, "\"options\" given twice");
        if (j->p >= j->end || *j->p != '[') return jl_fail(j, "\"options\" must be an array of strings");
        j->p++;
        q->options = calloc(BMOE_MAX_CHOICE_OPTIONS, sizeof *q->options);
        q->option_len = calloc(BMOE_MAX_CHOICE_OPTIONS, sizeof *q->option_len);
        if (!q->options || !q->option_len) return err_set(j->err, 1, NULL, "out of memory");
        jl_ws(j);
        if (j->p < j->end && *j->p == ']') { j->p++; return 0; }
        for (;;) {
            jl_ws(j);
            if (q->n_options == BMOE_MAX_CHOICE_OPTIONS) {
                snprintf(msg, sizeof msg, "more than %d options", BMOE_MAX_CHOICE_OPTIONS);
                return jl_fail(j, msg);
            }
            if (j->p >= j->end || *j->p != '"') return jl_fail(j, "\"options\" must be an array of strings");
            if (jl_string(j, &q->options[q->n_options], &q->option_len[q->n_options])) return 2;
            q->n_options++;
            jl_ws(j);
            if (j->p < j->end && *j->p == ',') { j->p++; continue; }
            if (j->p < j->end && *j->p == ']') { j->p++; return 0; }
            return jl_fail(j, "expected ',' or ']' in \"options\"");
        }
    }
    return -1;
}

void choices_free(choice_question *q, int n) {
    if (!q) return;
    for (int i = 0; i < n; i++) {
        free(q[i].id);
        free(q[i].context);
        if (q[i].options)
            for (int k = 0; k < q[i].n_options; k++) free(q[i].options[k]);
        free(q[i].options);
        free(q[i].option_len);
    }
    free(q);
}

/* Calls line_fn for each non-blank line (1-based numbers). */
typedef int (*line_fn)(const char *s, size_t n, int line, void *user);

static int each_line(const uint8_t *buf, size_t len, line_fn fn, void *user) {
    size_t pos = 0;
    int line = 0;
    while (pos < len) {
        size_t end = pos;
        while (end < len && buf[end] != '\n') end++;
        line++;
        const char *s = (const char *)buf + pos;
        size_t n = end - pos;
        pos = end + 1;
        size_t k = 0;
        while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
        if (k == n) continue;
        int rc = fn(s, n, line, user);
        if (rc) return rc;
    }
    return 0;
}

typedef struct choices_acc {
    const char *path;
    choice_question *q;
    int n;
    bmoe_error *err;
} choices_acc;

static int choice_line(const char *s, size_t n, int line, void *user) {
    choices_acc *a = user;
    jl j = {s, s + n, "--ppl-choices", a->path, line, a->err};
    if (a->n == BMOE_MAX_CHOICE_QUESTIONS) return jl_fail(&j, "too many questions (at most 65536)");
    if (memchr(s, 0, n)) return jl_fail(&j, "a NUL byte");
    choice_question *q = &a->q[a->n++];
    memset(q, 0, sizeof *q);
    q->line = line;
    choice_ctx c = {q, {0, 0, 0, 0}};
    int rc = jl_object(&j, choice_field, &c);
    if (rc) return rc;
    char msg[160];
    if (!c.seen.id) return jl_fail(&j, "missing key \"id\"");
    if (!c.seen.context) return jl_fail(&j, "missing key \"context\"");
    if (!c.seen.options) return jl_fail(&j, "missing key \"options\"");
    if (!c.seen.answer) return jl_fail(&j, "missing key \"answer\"");
    if (q->n_options < 2) {
        snprintf(msg, sizeof msg, "\"options\" has %d entries, at least 2 are needed", q->n_options);
        return jl_fail(&j, msg);
    }
    for (int k = 0; k < q->n_options; k++)
        if (q->option_len[k] == 0) {
            snprintf(msg, sizeof msg, "option %d is empty", k);
            return jl_fail(&j, msg);
        }
    if (q->answer < 0 || q->answer >= q->n_options) {
        snprintf(msg, sizeof msg, "\"answer\" %d is not an index into the %d options", q->answer, q->n_options);
        return jl_fail(&j, msg);
    }
    return 0;
}

static int count_lines(const uint8_t *buf, size_t len) {
    int n = 1;
    for (size_t i = 0; i < len; i++) n += buf[i] == '\n';
    return n;
}

int choices_parse(const char *path, const uint8_t *buf, size_t len, choice_question **out, int *n, bmoe_error *err) {
    *out = NULL;
    *n = 0;
    int cap = count_lines(buf, len);
    if (cap > BMOE_MAX_CHOICE_QUESTIONS) cap = BMOE_MAX_CHOICE_QUESTIONS;
    choices_acc a = {path, calloc((size_t)cap, sizeof(choice_question)), 0, err};
    if (!a.q) return err_set(err, 1, NULL, "out of memory");
    int rc = each_line(buf, len, choice_line, &a);
    if (!rc && a.n == 0) rc = err_set(err, 2, "usage", "--ppl-choices: %s has no questions", path);
    if (rc) { choices_free(a.q, a.n); return rc; }
    *out = a.q;
    *n = a.n;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* --session                                                                                         */

typedef struct session_acc {
    const char *path;
    session_prompt *p;
    int n, jsonl;
    bmoe_error *err;
} session_acc;

typedef struct prompt_ctx { session_prompt *p; int seen_id, seen_prompt; } prompt_ctx;

static int prompt_field(jl *j, const char *key, void *user) {
    prompt_ctx *c = user;
    if (strcmp(key, "prompt") == 0) {
        if (c->seen_prompt++) return jl_fail(j, "\"prompt\" given twice");
        if (j->p >= j->end || *j->p != '"') return jl_fail(j, "\"prompt\" must be a string");
        return jl_string(j, &c->p->text, &c->p->len);
    }
    if (strcmp(key, "id") == 0) {
        if (c->seen_id++) return jl_fail(j, "\"id\" given twice");
        if (j->p < j->end && *j->p == '"') {
            uint8_t *s;
            size_t n;
            if (jl_string(j, &s, &n)) return 2;
            c->p->id = (char *)s;
            return 0;
        }
        int v;
        char text[32];
        if (j->p >= j->end || !(*j->p == '-' || (*j->p >= '0' && *j->p <= '9')))
            return jl_fail(j, "\"id\" must be a string or an integer");
        if (jl_int(j, &v, text, sizeof text)) return 2;
        c->p->id = strdup(text);
        return c->p->id ? 0 : err_set(j->err, 1, NULL, "out of memory");
    }
    return -1;
}

static int session_line(const char *s, size_t n, int line, void *user) {
    session_acc *a = user;
    jl j = {s, s + n, "--session", a->path, line, a->err};
    if (a->n == BMOE_MAX_SESSION_PROMPTS) return jl_fail(&j, "too many prompts (at most 4096)");
    if (memchr(s, 0, n)) return jl_fail(&j, "a NUL byte");
    session_prompt *p = &a->p[a->n++];
    memset(p, 0, sizeof *p);
    p->line = line;
    if (a->jsonl) {
        prompt_ctx c = {p, 0, 0};
        int rc = jl_object(&j, prompt_field, &c);
        if (rc) return rc;
        if (!c.seen_prompt) return jl_fail(&j, "missing key \"prompt\"");
        if (p->len == 0) return jl_fail(&j, "the prompt is empty");
    } else {
        size_t k = n;
        if (k && s[k - 1] == '\r') k--;
        p->text = malloc(k + 1);
        if (!p->text) return err_set(a->err, 1, NULL, "out of memory");
        memcpy(p->text, s, k);
        p->text[k] = 0;
        p->len = k;
    }
    if (!p->id) {
        char text[32];
        snprintf(text, sizeof text, "%d", line);
        p->id = strdup(text);
        if (!p->id) return err_set(a->err, 1, NULL, "out of memory");
    }
    return 0;
}

void session_free(session_prompt *p, int n) {
    if (!p) return;
    for (int i = 0; i < n; i++) {
        free(p[i].id);
        free(p[i].text);
    }
    free(p);
}

int session_parse(const char *path, const uint8_t *buf, size_t len, session_prompt **out, int *n, bmoe_error *err) {
    *out = NULL;
    *n = 0;
    size_t k = 0;
    while (k < len && (buf[k] == ' ' || buf[k] == '\t' || buf[k] == '\r' || buf[k] == '\n')) k++;
    int cap = count_lines(buf, len);
    if (cap > BMOE_MAX_SESSION_PROMPTS) cap = BMOE_MAX_SESSION_PROMPTS;
    session_acc a = {path, calloc((size_t)cap, sizeof(session_prompt)), 0, k < len && buf[k] == '{', err};
    if (!a.p) return err_set(err, 1, NULL, "out of memory");
    int rc = each_line(buf, len, session_line, &a);
    if (!rc && a.n == 0) rc = err_set(err, 2, "usage", "--session: %s has no prompts", path);
    if (rc) { session_free(a.p, a.n); return rc; }
    *out = a.p;
    *n = a.n;
    return 0;
}
