/* The streaming JSON writer (see json.h for the contract). */
#include "json.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#define JSON_MAX_DEPTH 63

void json_init(json_writer *w, FILE *out) {
    memset(w, 0, sizeof *w);
    w->out = out;
}

static void put(json_writer *w, const char *s, size_t n) { fwrite(s, 1, n, w->out); }
static void puts_(json_writer *w, const char *s) { put(w, s, strlen(s)); }

/* Length of the well-formed UTF-8 sequence at s[0..n) (RFC 3629, Table 3-7 of Unicode), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }          /* no surrogates */
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }          /* no overlongs */
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }          /* nothing above U+10FFFF */
    else return 0;                                       /* 0x80..0xC1, 0xF5..0xFF */
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

static void write_string(json_writer *w, const char *str, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    put(w, "\"", 1);
    size_t i = 0, run = 0; /* run: bytes from s+i-run that pass through unchanged, not yet written */
    while (i < n) {
        unsigned char c = s[i];
        const char *esc = NULL;
        char u[7];
        size_t len = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20 || (c >= 0x80 && (len = utf8_len(s + i, n - i)) == 0)) {
            u[0] = '\\'; u[1] = 'u'; u[2] = '0'; u[3] = '0';
            u[4] = hex[c >> 4]; u[5] = hex[c & 15]; u[6] = 0;
            esc = u;
            len = 1;
        }
        if (esc) {
            if (run) put(w, (const char *)s + i - run, run);
            run = 0;
            puts_(w, esc);
            i += 1;
        } else {
            run += len;
            i += len;
        }
    }
    if (run) put(w, (const char *)s + i - run, run);
    put(w, "\"", 1);
}

/* Separator and key before a value at the current level. */
static void value_prefix(json_writer *w, const char *key) {
    int d = w->depth > JSON_MAX_DEPTH ? JSON_MAX_DEPTH : w->depth;
    if (d == 0) return; /* top level: one value, no key */
    if (w->need_comma[d]) put(w, ",", 1);
    w->need_comma[d] = 1;
    if (key) {
        write_string(w, key, strlen(key));
        put(w, ":", 1);
    }
}

static void open_(json_writer *w, const char *key, char ch) {
    value_prefix(w, key);
    put(w, &ch, 1);
    w->depth++;
    if (w->depth <= JSON_MAX_DEPTH) w->need_comma[w->depth] = 0;
}

static void close_(json_writer *w, char ch) {
    if (w->depth > 0) w->depth--;
    put(w, &ch, 1);
}

void json_begin_object(json_writer *w, const char *key) { open_(w, key, '{'); }
void json_end_object(json_writer *w) { close_(w, '}'); }
void json_begin_array(json_writer *w, const char *key) { open_(w, key, '['); }
void json_end_array(json_writer *w) { close_(w, ']'); }

void json_str(json_writer *w, const char *key, const char *s) {
    if (!s) { json_null(w, key); return; }
    json_strn(w, key, s, strlen(s));
}

void json_strn(json_writer *w, const char *key, const char *s, size_t n) {
    value_prefix(w, key);
    if (!s && n == 0) s = "";
    if (!s) { puts_(w, "null"); return; }
    write_string(w, s, n);
}

void json_hex(json_writer *w, const char *key, const uint8_t *b, size_t n) {
    static const char hex[] = "0123456789abcdef";
    value_prefix(w, key);
    put(w, "\"", 1);
    char buf[128];
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        buf[j++] = hex[b[i] >> 4];
        buf[j++] = hex[b[i] & 15];
        if (j == sizeof buf) { put(w, buf, j); j = 0; }
    }
    if (j) put(w, buf, j);
    put(w, "\"", 1);
}

void json_int(json_writer *w, const char *key, int64_t v) {
    char buf[32];
    value_prefix(w, key);
    snprintf(buf, sizeof buf, "%" PRId64, v);
    puts_(w, buf);
}

void json_uint(json_writer *w, const char *key, uint64_t v) {
    char buf[32];
    value_prefix(w, key);
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    puts_(w, buf);
}

void json_num(json_writer *w, const char *key, double v) {
    value_prefix(w, key);
    if (!isfinite(v)) { puts_(w, "null"); return; }
    char raw[48], out[48];
    snprintf(raw, sizeof raw, "%.17g", v);
    /* Whatever the locale's decimal separator (possibly multi-byte), write '.'. */
    size_t j = 0;
    int in_sep = 0;
    for (size_t i = 0; raw[i] && j + 1 < sizeof out; i++) {
        char ch = raw[i];
        if ((ch >= '0' && ch <= '9') || ch == '-' || ch == '+' || ch == 'e' || ch == 'E') {
            out[j++] = ch;
            in_sep = 0;
        } else if (!in_sep) {
            out[j++] = '.';
            in_sep = 1;
        }
    }
    out[j] = 0;
    puts_(w, out);
}

void json_bool(json_writer *w, const char *key, int v) {
    value_prefix(w, key);
    puts_(w, v ? "true" : "false");
}

void json_null(json_writer *w, const char *key) {
    value_prefix(w, key);
    puts_(w, "null");
}

void json_end(json_writer *w) {
    put(w, "\n", 1);
    fflush(w->out);
    w->depth = 0;
    memset(w->need_comma, 0, sizeof w->need_comma);
}
