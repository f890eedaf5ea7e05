/* Run configuration: command-line parsing, the strict number grammar, and validate().
 *
 * Every verdict here is decided by code in this file, never by a libc quirk: numbers are accepted or
 * rejected by our own grammar before strtod/strtoll convert them, and strtod is only trusted for what
 * both glibc and musl guarantee (correct rounding of decimal input). The rules and their order are
 * documented in docs/engine-flags.md; keep the two in step. */
#include "config.h"
#include "json.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------------ */

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return 2;
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* ASCII-only, locale-free case-insensitive compare. */
static int ieq(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char x = *a, y = *b;
        if (x >= 'A' && x <= 'Z') x = (char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z') y = (char)(y - 'A' + 'a');
        if (x != y) return 0;
    }
    return *a == *b;
}

/* Quote a user-supplied value for a message: at most 40 bytes, control bytes and non-ASCII as '?',
 * so one bad argument can never break the one-line contract. */
static const char *quoted(const char *s, char *buf, size_t n) {
    size_t j = 0, i = 0;
    if (n < 8) { if (n) buf[0] = 0; return buf; }
    buf[j++] = '\'';
    for (; s[i] && j + 5 < n && i < 40; i++) {
        unsigned char ch = (unsigned char)s[i];
        buf[j++] = (ch < 0x20 || ch >= 0x7f) ? '?' : (char)ch;
    }
    if (s[i]) { buf[j++] = '.'; buf[j++] = '.'; buf[j++] = '.'; }
    buf[j++] = '\'';
    buf[j] = 0;
    return buf;
}

/* ------------------------------------------------------------------------------------------------ */
/* Numbers                                                                                           */

/* A number as typed, for a message: digits and sign only (it passed the grammar), cut at 40. */
static const char *shown(const char *s, char *buf, size_t n) {
    size_t len = strlen(s);
    if (len > 40) snprintf(buf, n, "%.40s...", s);
    else snprintf(buf, n, "%s", s);
    return buf;
}

/* s[0..n) is [+-]?[0-9]+ → 0 (value in *v), 1 not the grammar, 2 beyond the 64-bit range. */
static int int_grammar_n(const char *s, size_t n, long long *v) {
    const char *p = s, *end = s + n;
    int neg = 0;
    if (p < end && (*p == '+' || *p == '-')) neg = (*p++ == '-');
    if (p == end) return 1;
    for (const char *x = p; x < end; x++)
        if (!is_digit(*x)) return 1;
    /* Accumulate with saturation: the verdict must not depend on overflow behaviour. */
    unsigned long long mag = 0;
    for (const char *x = p; x < end; x++) {
        unsigned dig = (unsigned)(*x - '0');
        if (mag > (9223372036854775807ULL - dig) / 10) return 2;
        mag = mag * 10 + dig;
    }
    *v = neg ? -(long long)mag : (long long)mag;
    return 0;
}

static int int_grammar(const char *s, long long *v) { return int_grammar_n(s, strlen(s), v); }

int config_parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out,
                     char *err, size_t errlen) {
    char q[64];
    long long v = 0;
    if (!s || !*s) return fail(err, errlen, "%s: empty value, expected an integer", flag);
    int g = int_grammar(s, &v);
    if (g == 1) return fail(err, errlen, "%s: %s is not an integer", flag, quoted(s, q, sizeof q));
    if (g == 2 || v < lo || v > hi)
        return fail(err, errlen, "%s: %s is outside %lld..%lld", flag, shown(s, q, sizeof q), lo, hi);
    *out = v;
    return 0;
}

int config_parse_real(const char *flag, const char *s, double *out, char *err, size_t errlen) {
    char q[64], q2[64];
    if (!s || !*s) return fail(err, errlen, "%s: empty value, expected a number", flag);
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    /* Named reasons for the forms strtod would accept on some platform but we never do. */
    if (ieq(p, "nan") || (strncmp(p, "nan(", 4) == 0) || (strncmp(p, "NAN(", 4) == 0))
        return fail(err, errlen, "%s: NaN is not accepted", flag);
    if (ieq(p, "inf") || ieq(p, "infinity"))
        return fail(err, errlen, "%s: %s is out of range (infinite)", flag, quoted(s, q, sizeof q));
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))
        return fail(err, errlen, "%s: %s: hexadecimal is not accepted", flag, quoted(s, q, sizeof q));

    /* [+-]?(D+(.D*)?|.D+)([eE][+-]?D+)? and, on the way, the decimal exponent of the first
     * significant digit (value is in [10^e10, 10^(e10+1)) before rounding). */
    long long intdigits = 0, lead_zero_frac = 0, exp = 0;
    int nonzero = 0, seen_nz = 0;
    const char *m = p;
    while (is_digit(*p)) {
        if (*p != '0') { nonzero = 1; seen_nz = 1; }
        if (seen_nz) intdigits++;
        p++;
    }
    size_t ndig = (size_t)(p - m);
    if (*p == '.') {
        p++;
        const char *f = p;
        while (is_digit(*p)) {
            if (*p != '0') nonzero = 1;
            if (!seen_nz) { if (*p != '0') seen_nz = 1; else lead_zero_frac++; }
            p++;
        }
        ndig += (size_t)(p - f);
    }
    if (ndig == 0) return fail(err, errlen, "%s: %s is not a number", flag, quoted(s, q, sizeof q));
    if (*p == 'e' || *p == 'E') {
        const char *e = p++;
        int eneg = 0;
        if (*p == '+' || *p == '-') eneg = (*p++ == '-');
        if (!is_digit(*p)) {
            p = e; /* "1e", "1e+": the exponent is what is unexpected */
        } else {
            while (is_digit(*p)) {
                if (exp < 100000000) exp = exp * 10 + (*p - '0'); /* saturate: far past any double */
                p++;
            }
            if (eneg) exp = -exp;
        }
    }
    if (*p)
        return fail(err, errlen, "%s: %s is not a number (unexpected %s)", flag, quoted(s, q, sizeof q),
                    quoted(p, q2, sizeof q2));
    if (!nonzero) { *out = 0.0; return 0; } /* "0", "-0", "0e999", "-.000": all plain +0 */

    /* Decide far-out exponents ourselves so no libc's handling of huge exponents matters. */
    long long e10 = (intdigits > 0 ? intdigits - 1 : -(lead_zero_frac + 1)) + exp;
    if (e10 > 400) return fail(err, errlen, "%s: %s overflows", flag, quoted(s, q, sizeof q));
    if (e10 < -400) return fail(err, errlen, "%s: %s underflows", flag, quoted(s, q, sizeof q));

    /* Convert. strtod reads the decimal point of the current locale, so hand it the same number with
     * no point at all: the mantissa digits and an adjusted exponent ("-12.5e3" → "-125e2"). Decimal
     * input is correctly rounded by both glibc and musl, so the bits are the same everywhere. */
    size_t slen = strlen(s);
    char *lit = malloc(slen + 32);
    if (!lit) return fail(err, errlen, "%s: out of memory", flag);
    size_t j = 0;
    long long frac = 0;
    const char *x = s;
    if (*x == '+' || *x == '-') lit[j++] = *x++;
    for (; is_digit(*x); x++) lit[j++] = *x;
    if (*x == '.')
        for (x++; is_digit(*x); x++, frac++) lit[j++] = *x;
    snprintf(lit + j, 32, "e%lld", exp - frac);
    double v = strtod(lit, NULL);
    free(lit);
    if (isinf(v)) return fail(err, errlen, "%s: %s overflows", flag, quoted(s, q, sizeof q));
    if (fabs(v) < DBL_MIN) return fail(err, errlen, "%s: %s underflows", flag, quoted(s, q, sizeof q));
    *out = v;
    return 0;
}

const char *config_fmt_real(double v, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    if (isnan(v)) { snprintf(buf, n, "nan"); return buf; }
    if (isinf(v)) { snprintf(buf, n, v < 0 ? "-inf" : "inf"); return buf; }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        /* Normalise a locale's decimal separator (possibly multi-byte) to '.'. */
        char clean[40];
        size_t j = 0;
        int in_sep = 0;
        for (size_t i = 0; tmp[i] && j + 1 < sizeof clean; i++) {
            char ch = tmp[i];
            if (is_digit(ch) || ch == '-' || ch == '+' || ch == 'e' || ch == 'E') { clean[j++] = ch; in_sep = 0; }
            else if (!in_sep) { clean[j++] = '.'; in_sep = 1; }
        }
        clean[j] = 0;
        if (prec == 17 || strtod(tmp, NULL) == v) { snprintf(buf, n, "%s", clean); return buf; }
    }
    return buf;
}

/* ------------------------------------------------------------------------------------------------ */
/* Options                                                                                           */

enum opt_kind { K_STR, K_PATH, K_TOKENS, K_INT, K_REAL, K_BOOL };

enum opt_id {
    O_MODEL, O_PROMPT, O_PROMPT_TOKENS, O_N_PREDICT, O_THREADS, O_CTX, O_N_EXPERT_USED, O_MMAP,
    O_CACHE_MB, O_FORCE_CACHE, O_IO_THREADS, O_NO_ODIRECT, O_PREFETCH, O_PREFETCH_SYNC, O_DROP,
    O_DROP_IN_PREFILL, O_DROP_NO_RENORM, O_SUBST, O_ROUTE_TRACE, O_JSON, O_LOGITS_OUT, O_PPL, O_PPL_STEP,
    O_PPL_REF, O_PPL_CHOICES, O_SESSION, O_CHAT, O__COUNT
};

typedef struct opt {
    enum opt_id id;
    const char *shortname; /* NULL if none */
    const char *longname;
    enum opt_kind kind;
    long long lo, hi;      /* K_INT: accepted range (the same bounds validate() enforces) */
} opt;

static const opt OPTS[] = {
    {O_MODEL, "-m", "--model", K_PATH, 0, 0},
    {O_PROMPT, "-p", "--prompt", K_STR, 0, 0},
    {O_PROMPT_TOKENS, NULL, "--prompt-tokens", K_TOKENS, 0, 0},
    {O_N_PREDICT, "-n", "--n-predict", K_INT, 0, BMOE_MAX_N_PREDICT},
    {O_THREADS, "-t", "--threads", K_INT, 1, BMOE_MAX_THREADS},
    {O_CTX, "-c", "--ctx", K_INT, 0, BMOE_MAX_CTX},
    {O_N_EXPERT_USED, NULL, "--n-expert-used", K_INT, 0, BMOE_MAX_EXPERT_USED},
    {O_MMAP, NULL, "--mmap", K_BOOL, 0, 0},
    {O_CACHE_MB, NULL, "--cache-mb", K_INT, 0, BMOE_MAX_CACHE_MB},
    {O_FORCE_CACHE, NULL, "--force-cache", K_BOOL, 0, 0},
    {O_IO_THREADS, NULL, "--io-threads", K_INT, 1, BMOE_MAX_IO_THREADS},
    {O_NO_ODIRECT, NULL, "--no-odirect", K_BOOL, 0, 0},
    {O_PREFETCH, NULL, "--prefetch", K_INT, 0, BMOE_MAX_PREFETCH},
    {O_PREFETCH_SYNC, NULL, "--prefetch-sync", K_BOOL, 0, 0},
    {O_DROP, NULL, "--drop-cold-experts", K_REAL, 0, 0},
    {O_DROP_IN_PREFILL, NULL, "--drop-in-prefill", K_BOOL, 0, 0},
    {O_DROP_NO_RENORM, NULL, "--drop-no-renorm", K_BOOL, 0, 0},
    {O_SUBST, NULL, "--expert-substitute", K_REAL, 0, 0},
    {O_ROUTE_TRACE, NULL, "--route-trace", K_PATH, 0, 0},
    {O_JSON, NULL, "--json", K_BOOL, 0, 0},
    {O_LOGITS_OUT, NULL, "--logits-out", K_PATH, 0, 0},
    {O_PPL, NULL, "--ppl", K_PATH, 0, 0},
    {O_PPL_STEP, NULL, "--ppl-step", K_PATH, 0, 0},
    {O_PPL_REF, NULL, "--ppl-ref", K_PATH, 0, 0},
    {O_PPL_CHOICES, NULL, "--ppl-choices", K_PATH, 0, 0},
    {O_SESSION, NULL, "--session", K_PATH, 0, 0},
    {O_CHAT, NULL, "--chat", K_BOOL, 0, 0},
};

void config_defaults(bmoe_config *c) {
    memset(c, 0, sizeof *c);
    c->n_predict = 16;
    c->threads = 1;
    c->ctx = 0;
    c->io_threads = 1;
}

void config_free(bmoe_config *c) {
    if (!c) return;
    free(c->prompt_tokens);
    c->prompt_tokens = NULL;
    c->n_prompt_tokens = 0;
}

/* "1,2,3": each item a strict integer (range-checked to int32; negative ids are left to validate()
 * so that every id rule has one home). An empty string is an empty list (validate: empty prompt). */
static int parse_tokens(const char *flag, const char *s, int32_t **out, int *n_out, char *err, size_t errlen) {
    size_t n = 0, cap = 1;
    for (const char *x = s; *x; x++) cap += (*x == ',');
    *out = NULL;
    *n_out = 0;
    if (!*s) {
        *out = malloc(sizeof(int32_t)); /* non-NULL: "given, but empty" */
        return *out ? 0 : fail(err, errlen, "%s: out of memory", flag);
    }
    if (cap > (size_t)INT_MAX / sizeof(int32_t)) return fail(err, errlen, "%s: too many items", flag);
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return fail(err, errlen, "%s: out of memory", flag);
    const char *p = s;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[48];
        char q[64];
        if (len == 0) {
            free(ids);
            return fail(err, errlen, "%s: item %zu is empty", flag, n);
        }
        /* item: for messages only (cut at 40 bytes); the verdict reads the whole span */
        snprintf(item, sizeof item, "%.*s%s", (int)(len > 40 ? 40 : len), p, len > 40 ? "..." : "");
        long long v = 0;
        int g = int_grammar_n(p, len, &v);
        if (g == 1) {
            free(ids);
            return fail(err, errlen, "%s: item %zu: %s is not an integer", flag, n, quoted(item, q, sizeof q));
        }
        if (g == 2 || v > INT32_MAX || v < INT32_MIN) {
            free(ids);
            return fail(err, errlen, "%s: item %zu: %s is outside 0..%ld", flag, n, item, (long)INT32_MAX);
        }
        ids[n++] = (int32_t)v;
        if (!comma) break;
        p = comma + 1;
    }
    *out = ids;
    *n_out = (int)n;
    return 0;
}

/* For conflict detection between repeated options. */
typedef struct seen {
    int given;
    const char *spelling; /* as first typed, for messages */
} seen;

static int same_tokens(const int32_t *a, int na, const int32_t *b, int nb) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

int config_parse(bmoe_config *c, int argc, char **argv, char *err, size_t errlen) {
    seen st[O__COUNT];
    memset(st, 0, sizeof st);
    char q[64], q2[64];
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!a) return fail(err, errlen, "argument %d is missing", i);
        const opt *o = NULL;
        const char *val = NULL;
        char typed[48];
        if (a[0] != '-' || a[1] == 0)
            return fail(err, errlen, "unexpected argument %s (options start with -)", quoted(a, q, sizeof q));
        for (size_t k = 0; k < sizeof OPTS / sizeof OPTS[0]; k++) {
            const opt *c2 = &OPTS[k];
            size_t ln = strlen(c2->longname);
            if (strcmp(a, c2->longname) == 0 || (c2->shortname && strcmp(a, c2->shortname) == 0)) {
                o = c2;
                break;
            }
            if (strncmp(a, c2->longname, ln) == 0 && a[ln] == '=') {
                o = c2;
                val = a + ln + 1;
                break;
            }
        }
        if (!o) {
            /* name it as typed (up to '=', at most 40 bytes, printable ASCII only) */
            int short_eq = a[1] != '-' && a[1] && a[2] == '=';
            const char *eq = strchr(a, '=');
            size_t nl = (eq && !short_eq) ? (size_t)(eq - a) : strlen(a);
            if (nl > 40) nl = 40;
            snprintf(typed, sizeof typed, "%.*s", (int)nl, a);
            for (char *x = typed; *x; x++)
                if ((unsigned char)*x < 0x20 || (unsigned char)*x >= 0x7f) *x = '?';
            if (short_eq)
                return fail(err, errlen, "%s: unknown option (a short option takes its value as the next "
                            "argument: %.2s VALUE)", typed, a);
            return fail(err, errlen, "%s: unknown option", typed);
        }
        if (val) snprintf(typed, sizeof typed, "%s", o->longname);
        else snprintf(typed, sizeof typed, "%s", a);

        if (o->kind == K_BOOL) {
            if (val) return fail(err, errlen, "%s: takes no value", typed);
        } else if (!val) {
            if (i + 1 >= argc) return fail(err, errlen, "%s: missing value", typed);
            val = argv[++i];
            if (!val) return fail(err, errlen, "%s: missing value", typed);
            if (o->kind == K_PATH && val[0] == '-' && val[1] != 0)
                return fail(err, errlen, "%s: missing value (%s is an option)", typed, quoted(val, q, sizeof q));
        }

        /* -p and --prompt-tokens are one choice. */
        if ((o->id == O_PROMPT && st[O_PROMPT_TOKENS].given) || (o->id == O_PROMPT_TOKENS && st[O_PROMPT].given)) {
            const seen *other = &st[o->id == O_PROMPT ? O_PROMPT_TOKENS : O_PROMPT];
            return fail(err, errlen, "%s: cannot be combined with %s (give one prompt)", typed, other->spelling);
        }

        seen *s = &st[o->id];
        int repeat = s->given;
        switch (o->kind) {
        case K_BOOL:
            switch (o->id) {
            case O_MMAP: c->mmap = 1; break;
            case O_FORCE_CACHE: c->force_cache = 1; break;
            case O_NO_ODIRECT: c->no_odirect = 1; break;
            case O_PREFETCH_SYNC: c->prefetch_sync = 1; break;
            case O_DROP_IN_PREFILL: c->drop_in_prefill = 1; break;
            case O_DROP_NO_RENORM: c->drop_no_renorm = 1; break;
            case O_JSON: c->json = 1; break;
            case O_CHAT: c->chat = 1; break;
            default: break;
            }
            break;
        case K_STR:
        case K_PATH: {
            const char **dst = o->id == O_MODEL ? &c->model : o->id == O_PROMPT ? &c->prompt
                             : o->id == O_ROUTE_TRACE ? &c->route_trace : o->id == O_PPL ? &c->ppl
                             : o->id == O_PPL_STEP ? &c->ppl_step : o->id == O_PPL_REF ? &c->ppl_ref
                             : o->id == O_PPL_CHOICES ? &c->ppl_choices : o->id == O_SESSION ? &c->session
                             : &c->logits_out;
            if (repeat && strcmp(*dst, val) != 0)
                return fail(err, errlen, "%s: given twice with different values (%s, then %s)", typed,
                            quoted(*dst, q, sizeof q), quoted(val, q2, sizeof q2));
            *dst = val;
            break;
        }
        case K_TOKENS: {
            int32_t *ids;
            int n;
            if (parse_tokens(typed, val, &ids, &n, err, errlen)) return 2;
            if (repeat) {
                int same = same_tokens(c->prompt_tokens, c->n_prompt_tokens, ids, n);
                free(ids);
                if (!same) return fail(err, errlen, "%s: given twice with different values", typed);
            } else {
                free(c->prompt_tokens);
                c->prompt_tokens = ids;
                c->n_prompt_tokens = n;
            }
            break;
        }
        case K_INT: {
            /* Only what does not fit an int is refused here, with the flag's documented range;
             * everything else is validate()'s to judge, so each range rule has one home. */
            long long v = 0;
            if (!*val) return fail(err, errlen, "%s: empty value, expected an integer", typed);
            int g = int_grammar(val, &v);
            if (g == 1) return fail(err, errlen, "%s: %s is not an integer", typed, quoted(val, q, sizeof q));
            if (g == 2 || v < INT_MIN || v > INT_MAX)
                return fail(err, errlen, "%s: %s is outside %lld..%lld", typed, shown(val, q, sizeof q), o->lo, o->hi);
            int *dst = o->id == O_N_PREDICT ? &c->n_predict : o->id == O_THREADS ? &c->threads
                     : o->id == O_CTX ? &c->ctx : o->id == O_N_EXPERT_USED ? &c->n_expert_used
                     : o->id == O_CACHE_MB ? &c->cache_mb : o->id == O_IO_THREADS ? &c->io_threads
                     : &c->prefetch;
            if (repeat && *dst != (int)v)
                return fail(err, errlen, "%s: given twice with different values (%d, then %lld)", typed, *dst, v);
            *dst = (int)v;
            if (o->id == O_N_PREDICT) c->n_predict_set = 1;
            break;
        }
        case K_REAL: {
            double v;
            if (config_parse_real(typed, val, &v, err, errlen)) return 2;
            double *dst = o->id == O_DROP ? &c->drop : &c->subst;
            if (repeat && *dst != v) {
                char b1[32], b2[32];
                return fail(err, errlen, "%s: given twice with different values (%s, then %s)", typed,
                            config_fmt_real(*dst, b1, sizeof b1), config_fmt_real(v, b2, sizeof b2));
            }
            *dst = v;
            if (o->id == O_DROP) c->drop_set = 1;
            else c->subst_set = 1;
            break;
        }
        }
        if (!repeat) {
            s->given = 1;
            s->spelling = (o->shortname && strcmp(typed, o->shortname) == 0) ? o->shortname : o->longname;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* validate()                                                                                        */

static int range_int(const char *flag, int v, long long lo, long long hi, char *err, size_t errlen) {
    if (v < lo || v > hi) return fail(err, errlen, "%s: %d is outside %lld..%lld", flag, v, lo, hi);
    return 0;
}

/* F or L: a number in [0, 1], NaN named as such. */
static int range_unit(const char *flag, double v, char *err, size_t errlen) {
    char b[32];
    if (isnan(v)) return fail(err, errlen, "%s: NaN is not accepted", flag);
#ifdef BMOE_FAULT_CFG_LOOSE_RANGE
    /* Fault: the upper bound is forgotten (the CFG gate must notice). */
    if (!(v >= 0.0))
#else
    if (!(v >= 0.0 && v <= 1.0))
#endif
        return fail(err, errlen, "%s: %s is outside [0, 1]", flag, config_fmt_real(v, b, sizeof b));
    return 0;
}

/* The lossy knobs and prefetch act on streamed experts held in the cache. */
static int needs_cache(const bmoe_config *c, const char *flag, char *err, size_t errlen) {
    if (c->mmap) return fail(err, errlen, "%s: not available with --mmap (nothing is streamed)", flag);
    if (c->cache_mb <= 0) return fail(err, errlen, "%s: needs the expert cache (--cache-mb > 0)", flag);
    return 0;
}

/* The input modes, in option order: their names and where each is stored. */
static const char *const MODE_FLAGS[4] = {"--ppl", "--ppl-step", "--ppl-choices", "--session"};

static const char *mode_file(const bmoe_config *c, int i) {
    return i == 0 ? c->ppl : i == 1 ? c->ppl_step : i == 2 ? c->ppl_choices : c->session;
}

enum bmoe_mode config_mode(const bmoe_config *c) {
    if (c->ppl) return BMOE_MODE_PPL;
    if (c->ppl_step) return BMOE_MODE_PPL_STEP;
    if (c->ppl_choices) return BMOE_MODE_CHOICES;
    if (c->session) return BMOE_MODE_SESSION;
    return BMOE_MODE_RUN;
}

/* Rules 34-41 of docs/engine-flags.md: file names, one input mode, what each mode excludes. */
static int validate_inputs(const bmoe_config *c, char *err, size_t errlen) {
    int first = -1;
    for (int i = 0; i < 4; i++) {
        const char *f = mode_file(c, i);
        if (!f) continue;
        if (!f[0]) return fail(err, errlen, "%s: the file name is empty", MODE_FLAGS[i]);
        if (first >= 0)
            return fail(err, errlen, "%s: cannot be combined with %s (one input mode per run)", MODE_FLAGS[i],
                        MODE_FLAGS[first]);
        first = i;
    }
    if (c->ppl_ref && !c->ppl_ref[0]) return fail(err, errlen, "--ppl-ref: the file name is empty");
    if (first < 0) {
        if (c->ppl_ref) return fail(err, errlen, "--ppl-ref: has no effect without --ppl or --ppl-step");
        return 0;
    }
    const char *mf = MODE_FLAGS[first];
    if (c->prompt) return fail(err, errlen, "%s: cannot be combined with -p (the prompts come from the file)", mf);
    if (c->prompt_tokens)
        return fail(err, errlen, "%s: cannot be combined with --prompt-tokens (the prompts come from the file)", mf);
    if (first <= 2 && c->n_predict_set)
        return fail(err, errlen, "%s: cannot be combined with -n (scoring generates nothing)", mf);
    if (c->ppl_ref && first >= 2) return fail(err, errlen, "--ppl-ref: not available with %s", mf);
    if (c->logits_out && first >= 2)
        return fail(err, errlen, "--logits-out: not available with %s (it writes the rows of --ppl or --ppl-step)", mf);
    /* an output must never overwrite an input */
    const char *ins[2] = {mode_file(c, first), c->ppl_ref};
    const char *in_flags[2] = {mf, "--ppl-ref"};
    for (int i = 0; i < 2; i++) {
        if (!ins[i]) continue;
        if (c->logits_out && strcmp(c->logits_out, ins[i]) == 0)
            return fail(err, errlen, "--logits-out: the same file as %s", in_flags[i]);
        if (c->route_trace && strcmp(c->route_trace, ins[i]) == 0)
            return fail(err, errlen, "--route-trace: the same file as %s", in_flags[i]);
    }
    return 0;
}

int config_validate(const bmoe_config *c, char *err, size_t errlen) {
    int r;
    /* The order below is the order of the option list (docs/design.md, engine: command line); docs/engine-flags.md lists it. */

    /* 1. -m */
    if (c->model && !c->model[0]) return fail(err, errlen, "-m: the model path is empty");

    /* 2. the prompt */
    if (c->prompt && c->prompt_tokens)
        return fail(err, errlen, "-p: cannot be combined with --prompt-tokens (give one prompt)");
    if (c->prompt && !c->prompt[0]) return fail(err, errlen, "-p: the prompt is empty");
    /* --chat wraps a text prompt; the model's template is checked at load (engine_open) */
    if (c->chat && !c->prompt)
        return fail(err, errlen, "--chat: needs a text prompt (-p); it cannot wrap --prompt-tokens or an input file");
    if (c->prompt_tokens || c->n_prompt_tokens) {
        if (c->n_prompt_tokens <= 0 || !c->prompt_tokens)
            return fail(err, errlen, "--prompt-tokens: the prompt is empty");
        if (c->n_prompt_tokens > BMOE_MAX_PROMPT_TOKENS)
            return fail(err, errlen, "--prompt-tokens: %d tokens, at most %d are accepted", c->n_prompt_tokens,
                        BMOE_MAX_PROMPT_TOKENS);
        for (int i = 0; i < c->n_prompt_tokens; i++)
            if (c->prompt_tokens[i] < 0)
                return fail(err, errlen, "--prompt-tokens: token id %d at position %d is negative",
                            (int)c->prompt_tokens[i], i);
    }

    /* 3. -n, -t, -c and the context budget */
    if ((r = range_int("-n", c->n_predict, 0, BMOE_MAX_N_PREDICT, err, errlen))) return r;
    if ((r = range_int("-t", c->threads, 1, BMOE_MAX_THREADS, err, errlen))) return r;
    if ((r = range_int("-c", c->ctx, 0, BMOE_MAX_CTX, err, errlen))) return r;
    if (c->ctx > 0 && c->prompt_tokens && c->n_prompt_tokens > 0 &&
        (long long)c->n_prompt_tokens + c->n_predict > c->ctx)
        return fail(err, errlen, "-c: %d prompt tokens + %d to predict (-n) do not fit a context of %d",
                    c->n_prompt_tokens, c->n_predict, c->ctx);

    /* 4. --n-expert-used (against the model's expert count: at load) */
    if ((r = range_int("--n-expert-used", c->n_expert_used, 0, BMOE_MAX_EXPERT_USED, err, errlen))) return r;

    /* 5. --mmap and --cache-mb */
    if (c->cache_mb < 0) return fail(err, errlen, "--cache-mb: %d is negative", c->cache_mb);
    if (c->mmap && c->cache_mb > 0)
        return fail(err, errlen, "--mmap: cannot be combined with --cache-mb %d (there is no expert cache in "
                    "mmap mode)", c->cache_mb);
    if ((r = range_int("--cache-mb", c->cache_mb, 0, BMOE_MAX_CACHE_MB, err, errlen))) return r;
    if (c->cache_mb >= 1 && c->cache_mb <= BMOE_CACHE_BAND_MB && !c->force_cache)
        return fail(err, errlen, "--cache-mb: %d MiB is in the band 1..%d MiB where a cache thrashes; pass "
                    "--force-cache to use it anyway", c->cache_mb, BMOE_CACHE_BAND_MB);

    /* 6. --io-threads */
    if ((r = range_int("--io-threads", c->io_threads, 1, BMOE_MAX_IO_THREADS, err, errlen))) return r;

    /* 7. --prefetch, --prefetch-sync */
    if ((r = range_int("--prefetch", c->prefetch, 0, BMOE_MAX_PREFETCH, err, errlen))) return r;
    if (c->prefetch > 0 && (r = needs_cache(c, "--prefetch", err, errlen))) return r;
    if (c->prefetch_sync && c->prefetch <= 0)
        return fail(err, errlen, "--prefetch-sync: has no effect without --prefetch");

    /* 8. --drop-cold-experts and its modifiers */
    if (c->drop_set) {
        if ((r = range_unit("--drop-cold-experts", c->drop, err, errlen))) return r;
        if ((r = needs_cache(c, "--drop-cold-experts", err, errlen))) return r;
    }
    if (c->drop_in_prefill && !c->drop_set)
        return fail(err, errlen, "--drop-in-prefill: has no effect without --drop-cold-experts");
    if (c->drop_no_renorm && !c->drop_set)
        return fail(err, errlen, "--drop-no-renorm: has no effect without --drop-cold-experts");

    /* 9. --expert-substitute */
    if (c->subst_set) {
        if ((r = range_unit("--expert-substitute", c->subst, err, errlen))) return r;
        if ((r = needs_cache(c, "--expert-substitute", err, errlen))) return r;
    }

    /* 10. output files */
    if (c->route_trace && !c->route_trace[0]) return fail(err, errlen, "--route-trace: the file name is empty");
    if (c->logits_out && !c->logits_out[0]) return fail(err, errlen, "--logits-out: the file name is empty");
    if (c->route_trace && c->logits_out && strcmp(c->route_trace, c->logits_out) == 0)
        return fail(err, errlen, "--logits-out: the same file as --route-trace");

    /* 11. the scoring instruments and sessions (docs/engine-flags.md, scoring) */
    return validate_inputs(c, err, errlen);
}

int config_require_run(const bmoe_config *c, char *err, size_t errlen) {
    if (!c->model) return fail(err, errlen, "-m: a model is required (-m FILE)");
    if (!c->prompt && !c->prompt_tokens && config_mode(c) == BMOE_MODE_RUN)
        return fail(err, errlen, "-p: a prompt is required (-p TEXT or --prompt-tokens IDS)");
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */

void config_to_json(const bmoe_config *c, json_writer *w, const char *key) {
    json_begin_object(w, key);
    if (c->model) json_str(w, "model", c->model); else json_null(w, "model");
    if (c->prompt) json_str(w, "prompt", c->prompt); else json_null(w, "prompt");
    if (c->prompt_tokens) {
        json_begin_array(w, "prompt_tokens");
        for (int i = 0; i < c->n_prompt_tokens; i++) json_int(w, NULL, c->prompt_tokens[i]);
        json_end_array(w);
    } else {
        json_null(w, "prompt_tokens");
    }
    json_int(w, "n_predict", c->n_predict);
    json_int(w, "threads", c->threads);
    json_int(w, "ctx", c->ctx);
    json_int(w, "n_expert_used", c->n_expert_used);
    json_bool(w, "mmap", c->mmap);
    json_int(w, "cache_mb", c->cache_mb);
    json_bool(w, "force_cache", c->force_cache);
    json_int(w, "io_threads", c->io_threads);
    json_bool(w, "no_odirect", c->no_odirect);
    json_int(w, "prefetch", c->prefetch);
    json_bool(w, "prefetch_sync", c->prefetch_sync);
    if (c->drop_set) json_num(w, "drop_cold_experts", c->drop); else json_null(w, "drop_cold_experts");
    json_bool(w, "drop_in_prefill", c->drop_in_prefill);
    json_bool(w, "drop_no_renorm", c->drop_no_renorm);
    if (c->subst_set) json_num(w, "expert_substitute", c->subst); else json_null(w, "expert_substitute");
    if (c->route_trace) json_str(w, "route_trace", c->route_trace); else json_null(w, "route_trace");
    json_bool(w, "json", c->json);
    json_bool(w, "chat", c->chat);
    if (c->logits_out) json_str(w, "logits_out", c->logits_out); else json_null(w, "logits_out");
    const char *files[5] = {c->ppl, c->ppl_step, c->ppl_ref, c->ppl_choices, c->session};
    const char *keys[5] = {"ppl", "ppl_step", "ppl_ref", "ppl_choices", "session"};
    for (int i = 0; i < 5; i++) {
        if (files[i]) json_str(w, keys[i], files[i]); else json_null(w, keys[i]);
    }
    json_end_object(w);
}
