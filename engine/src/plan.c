/* Batch plan line reader (see plan.h). Recursive descent over a bounded buffer; every read checks the
 * end first; nesting is capped so a hostile line cannot exhaust the stack. */
#include "plan.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 32

typedef struct {
    const char *s;
    size_t n, i;
    char *err;
    size_t errlen;
} rd;

static int fail(rd *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(r->err, r->errlen, "plan line, byte %zu: ", r->i);
    if (k >= 0 && (size_t)k < r->errlen) vsnprintf(r->err + k, r->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return 2;
}

static void ws(rd *r) {
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\r' || r->s[r->i] == '\n')) r->i++;
}

static int hex4(rd *r, unsigned *v) {
    if (r->n - r->i < 4) return fail(r, "truncated \\u escape");
    unsigned x = 0;
    for (int k = 0; k < 4; k++) {
        char c = r->s[r->i++];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (unsigned)(c - 'A' + 10);
        else return fail(r, "bad \\u escape");
    }
    *v = x;
    return 0;
}

/* A JSON string at r->i (the opening quote). *out (when out is not NULL) gets a malloc'd C string. */
static int string(rd *r, char **out) {
    if (r->i >= r->n || r->s[r->i] != '"') return fail(r, "expected a string");
    r->i++;
    /* decoded output is never longer than the input: escapes shrink or keep length */
    char *buf = out ? malloc(r->n - r->i + 1) : NULL;
    if (out && !buf) return fail(r, "out of memory");
    size_t o = 0;
    for (;;) {
        if (r->i >= r->n) { free(buf); return fail(r, "unterminated string"); }
        unsigned char c = (unsigned char)r->s[r->i++];
        if (c == '"') break;
        if (c < 0x20) { free(buf); return fail(r, "control character in a string"); }
        if (c != '\\') { if (buf) buf[o++] = (char)c; continue; }
        if (r->i >= r->n) { free(buf); return fail(r, "unterminated escape"); }
        char e = r->s[r->i++];
        unsigned cp;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (hex4(r, &cp)) { free(buf); return 2; }
            if (cp >= 0xd800 && cp <= 0xdbff) { /* a surrogate pair */
                unsigned lo;
                if (r->n - r->i < 2 || r->s[r->i] != '\\' || r->s[r->i + 1] != 'u') { free(buf); return fail(r, "unpaired surrogate"); }
                r->i += 2;
                if (hex4(r, &lo)) { free(buf); return 2; }
                if (lo < 0xdc00 || lo > 0xdfff) { free(buf); return fail(r, "unpaired surrogate"); }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                free(buf);
                return fail(r, "unpaired surrogate");
            }
            if (cp == 0) { free(buf); return fail(r, "\\u0000 is not allowed in an argument"); }
            break;
        default: free(buf); return fail(r, "bad escape \\%c", (e >= 0x20 && e < 0x7f) ? e : '?');
        }
        if (!buf) continue;
        /* UTF-8; at most as long as the escape it came from (\uXXXX is 6 bytes, a pair 12) */
        if (cp < 0x80) buf[o++] = (char)cp;
        else if (cp < 0x800) { buf[o++] = (char)(0xc0 | (cp >> 6)); buf[o++] = (char)(0x80 | (cp & 0x3f)); }
        else if (cp < 0x10000) {
            buf[o++] = (char)(0xe0 | (cp >> 12)); buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
            buf[o++] = (char)(0x80 | (cp & 0x3f));
        } else {
            buf[o++] = (char)(0xf0 | (cp >> 18)); buf[o++] = (char)(0x80 | ((cp >> 12) & 0x3f));
            buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3f)); buf[o++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    if (buf) { buf[o] = 0; *out = buf; }
    return 0;
}

static int skip_value(rd *r, int depth);

static int skip_container(rd *r, int depth, char close) {
    if (depth >= MAX_DEPTH) return fail(r, "nested too deeply");
    r->i++;
    ws(r);
    if (r->i < r->n && r->s[r->i] == close) { r->i++; return 0; }
    for (;;) {
        ws(r);
        if (close == '}') {
            if (string(r, NULL)) return 2;
            ws(r);
            if (r->i >= r->n || r->s[r->i] != ':') return fail(r, "expected ':'");
            r->i++;
        }
        if (skip_value(r, depth + 1)) return 2;
        ws(r);
        if (r->i >= r->n) return fail(r, "unterminated %s", close == '}' ? "object" : "array");
        if (r->s[r->i] == ',') { r->i++; continue; }
        if (r->s[r->i] == close) { r->i++; return 0; }
        return fail(r, "expected ',' or '%c'", close);
    }
}

static int skip_value(rd *r, int depth) {
    ws(r);
    if (r->i >= r->n) return fail(r, "expected a value");
    char c = r->s[r->i];
    if (c == '"') return string(r, NULL);
    if (c == '{') return skip_container(r, depth, '}');
    if (c == '[') return skip_container(r, depth, ']');
    static const char *const words[] = { "true", "false", "null" };
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(words[k]);
        if (r->n - r->i >= l && memcmp(r->s + r->i, words[k], l) == 0) { r->i += l; return 0; }
    }
    /* a number: the JSON grammar's characters; this reader has no use for its value */
    size_t start = r->i;
    while (r->i < r->n && strchr("+-0123456789.eE", r->s[r->i]) && r->s[r->i]) r->i++;
    if (r->i == start) return fail(r, "unexpected character '%c'", (c >= 0x20 && c < 0x7f) ? c : '?');
    return 0;
}

static int argv_array(rd *r, bmoe_plan_entry *e) {
    if (r->i >= r->n || r->s[r->i] != '[') return fail(r, "\"argv\" must be an array of strings");
    r->i++;
    ws(r);
    if (r->i < r->n && r->s[r->i] == ']') { r->i++; return 0; }
    for (;;) {
        ws(r);
        if (e->argc >= BMOE_PLAN_MAX_ARGS) return fail(r, "\"argv\" has more than %d items", BMOE_PLAN_MAX_ARGS);
        char *a;
        if (r->i >= r->n || r->s[r->i] != '"') return fail(r, "\"argv\" items must be strings");
        if (string(r, &a)) return 2;
        char **nv = realloc(e->argv, ((size_t)e->argc + 2) * sizeof *nv);
        if (!nv) { free(a); return fail(r, "out of memory"); }
        e->argv = nv;
        e->argv[e->argc++] = a;
        e->argv[e->argc] = NULL;
        ws(r);
        if (r->i >= r->n) return fail(r, "unterminated \"argv\"");
        if (r->s[r->i] == ',') { r->i++; continue; }
        if (r->s[r->i] == ']') { r->i++; return 0; }
        return fail(r, "expected ',' or ']' in \"argv\"");
    }
}

int plan_parse_line(const char *line, size_t len, bmoe_plan_entry *e, char *err, size_t errlen) {
    memset(e, 0, sizeof *e);
    rd r = { line, len, 0, err, errlen };
    if (len > BMOE_PLAN_MAX_LINE) return fail(&r, "line longer than %u bytes", BMOE_PLAN_MAX_LINE);
    int have_argv = 0;
    ws(&r);
    if (r.i >= r.n || r.s[r.i] != '{') return fail(&r, "expected a JSON object");
    r.i++;
    ws(&r);
    if (r.i < r.n && r.s[r.i] == '}') r.i++;
    else
        for (;;) {
            ws(&r);
            char *key;
            if (string(&r, &key)) return 2;
            ws(&r);
            if (r.i >= r.n || r.s[r.i] != ':') { free(key); return fail(&r, "expected ':'"); }
            r.i++;
            ws(&r);
            int rc;
            if (strcmp(key, "id") == 0) {
                if (e->id || r.i >= r.n || r.s[r.i] != '"') {
                    rc = fail(&r, e->id ? "\"id\" given twice" : "\"id\" must be a string");
                } else {
                    rc = string(&r, &e->id);
                }
            } else if (strcmp(key, "argv") == 0) {
                rc = have_argv ? fail(&r, "\"argv\" given twice") : argv_array(&r, e);
                have_argv = 1;
            } else {
                rc = skip_value(&r, 1);
            }
            free(key);
            if (rc) return rc;
            ws(&r);
            if (r.i >= r.n) return fail(&r, "unterminated object");
            if (r.s[r.i] == ',') { r.i++; continue; }
            if (r.s[r.i] == '}') { r.i++; break; }
            return fail(&r, "expected ',' or '}'");
        }
    ws(&r);
    if (r.i != r.n) return fail(&r, "trailing characters after the object");
    if (!e->id) return fail(&r, "missing \"id\"");
    if (!have_argv || e->argc == 0) return fail(&r, "missing \"argv\" (e.g. [\"run\", \"-m\", \"model.gguf\", ...])");
    return 0;
}

void plan_entry_free(bmoe_plan_entry *e) {
    free(e->id);
    for (int i = 0; i < e->argc; i++) free(e->argv[i]);
    free(e->argv);
    memset(e, 0, sizeof *e);
}
