/* Pre-tokenizer matchers (pretok.h). Each `split_*` walks one chunk [ini, end) of code points and
 * appends word lengths; positions outside the chunk read as "no character" (flags 0), which is how
 * the patterns' look-ahead (?!\S) sees the end of the text. */
#include "pretok.h"

#include <string.h>

#include "unicode.h"

#define OOR 0xffffffffu /* "no code point here" */

typedef struct {
    const uint32_t *cp;
    size_t ini, end, prev;
    size_t *out;
    size_t n_out;
} chunk;

static uint32_t cpt(const chunk *c, size_t p) { return p >= c->ini && p < c->end ? c->cp[p] : OOR; }
static unsigned flg(const chunk *c, size_t p) { return p >= c->ini && p < c->end ? uni_flags(c->cp[p]) : 0; }

/* ends the current word at e; returns its length (0 adds nothing) */
static size_t add(chunk *c, size_t e) {
    size_t len = e - c->prev;
    if (len > 0) c->out[c->n_out++] = len;
    c->prev = e;
    return len;
}

static uint32_t ascii_lower(uint32_t x) { return x >= 'A' && x <= 'Z' ? x + 32 : x; }

/* 's 't 're 've 'm 'll 'd at pos (case-folded when fold); returns the match length or 0. Only ASCII
 * letters fold to these letters, so ASCII folding equals full Unicode lower-casing here. */
static size_t contraction(const chunk *c, size_t pos, int fold) {
    if (cpt(c, pos) != '\'' || pos + 1 >= c->end) return 0;
    uint32_t a = cpt(c, pos + 1);
    if (fold) a = ascii_lower(a);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= c->end) return 0;
    uint32_t b = cpt(c, pos + 2);
    if (fold) b = ascii_lower(b);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

#define NOT_WLN(f) (!((f) & (UF_WHITESPACE | UF_LETTER | UF_NUMBER)))

static void split_gpt2(chunk *c) {
    for (size_t pos = c->ini; pos < c->end;) {
        uint32_t ch = cpt(c, pos);
        unsigned f = flg(c, pos);
        size_t k = contraction(c, pos, 0);
        if (k) { pos += add(c, pos + k); continue; }
        unsigned f2 = ch == ' ' ? flg(c, pos + 1) : f;
        if (f2 & UF_LETTER) { /* ' ?\p{L}+' */
            pos += ch == ' ';
            while (f2 & UF_LETTER) f2 = flg(c, ++pos);
            add(c, pos);
            continue;
        }
        if (f2 & UF_NUMBER) { /* ' ?\p{N}+' */
            pos += ch == ' ';
            while (f2 & UF_NUMBER) f2 = flg(c, ++pos);
            add(c, pos);
            continue;
        }
        if (NOT_WLN(f2) && f2) { /* ' ?[^\s\p{L}\p{N}]+' */
            pos += ch == ' ';
            while (NOT_WLN(f2) && f2) f2 = flg(c, ++pos);
            add(c, pos);
            continue;
        }
        size_t nws = 0;
        while (flg(c, pos + nws) & UF_WHITESPACE) nws++;
        if (nws > 1 && cpt(c, pos + nws) != OOR) { /* '\s+(?!\S)': leave the last space to the next word */
            pos += nws - 1;
            add(c, pos);
            continue;
        }
        if (nws > 0) { pos += nws; add(c, pos); continue; }
        add(c, ++pos);
    }
}

/* llama3 (max_digits 3, letters \p{L}), qwen2 (max_digits 1) and qwen35 (max_digits 1, letters
 * [\p{L}\p{M}]: a letter run also takes combining marks, and the "other" run excludes them). `letter`
 * is the flag mask of what a letter run takes. */
static void split_llama3(chunk *c, int max_digits, unsigned letter) {
    unsigned word = UF_WHITESPACE | UF_NUMBER | letter; /* what ' ?[^\s<letter>\p{N}]+' stops at */
    for (size_t pos = c->ini; pos < c->end;) {
        uint32_t ch = cpt(c, pos);
        unsigned f = flg(c, pos);
        size_t k = contraction(c, pos, 1);
        if (k) { pos += add(c, pos + k); continue; }
        /* '[^\r\n\p{L}\p{N}]?<letter>+' */
        if (!(ch == '\r' || ch == '\n' || (f & UF_NUMBER)) && ((f & letter) || (flg(c, pos + 1) & letter))) {
            pos++;
            while (flg(c, pos) & letter) pos++;
            add(c, pos);
            continue;
        }
        if (f & UF_NUMBER) { /* '\p{N}{1,max}' */
            size_t start = pos;
            while (flg(c, pos) & UF_NUMBER) {
                if ((int)(++pos - start) >= max_digits) { add(c, pos); start = pos; }
            }
            add(c, pos);
            continue;
        }
        /* ' ?[^\s<letter>\p{N}]+[\r\n]*' (the first test looks at this position's own flags, as llama.cpp does) */
        unsigned f2 = ch == ' ' ? flg(c, pos + 1) : f;
        if (!(f2 & word) && f) {
            pos += ch == ' ';
            while (!(f2 & word) && f2) f2 = flg(c, ++pos);
            uint32_t c2 = cpt(c, pos);
            while (c2 == '\r' || c2 == '\n') c2 = cpt(c, ++pos);
            add(c, pos);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (flg(c, pos + nws) & UF_WHITESPACE) {
            uint32_t c2 = cpt(c, pos + nws);
            if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) { pos = last_rn; add(c, pos); continue; } /* '\s*[\r\n]+' */
        if (nws > 1 && cpt(c, pos + nws) != OOR) { pos += nws - 1; add(c, pos); continue; }
        if (nws > 0) { pos += nws; add(c, pos); continue; }
        add(c, ++pos);
    }
}

/* The default list's class runs. ASCII is matched literally, other code points by class (whitespace
 * first), the way llama.cpp's collapsed-text regex sees them. */
static int is_punct_run(uint32_t x) {
    if (x < 128) return (x >= 0x21 && x <= 0x2f) || (x >= 0x3a && x <= 0x40) || (x >= 0x5b && x <= 0x5f) || (x >= 0x7b && x <= 0x7e);
    return !uni_is_whitespace(x) && uni_class(x) == UNI_PUNCT;
}
static int is_number_run(uint32_t x) {
    if (x < 128) return x >= '0' && x <= '9';
    return !uni_is_whitespace(x) && uni_class(x) == UNI_NUMBER;
}

/* isolates maximal runs of pred (matches and the text between them become words) */
static void split_runs(chunk *c, int (*pred)(uint32_t)) {
    size_t pos = c->ini;
    while (pos < c->end) {
        size_t s = pos;
        int in = pred(c->cp[pos]);
        while (pos < c->end && pred(c->cp[pos]) == in) pos++;
        add(c, pos);
        (void)s;
    }
}

/* isolates each leftmost "[0-9][0-9][0-9]" */
static void split_digit_triples(chunk *c) {
    size_t pos = c->ini;
    while (pos + 3 <= c->end) {
        const uint32_t *p = c->cp + pos;
        if (p[0] >= '0' && p[0] <= '9' && p[1] >= '0' && p[1] <= '9' && p[2] >= '0' && p[2] <= '9') {
            add(c, pos);
            add(c, pos + 3);
            pos += 3;
        } else {
            pos++;
        }
    }
    add(c, c->end);
}

typedef enum { PASS_GPT2, PASS_LLAMA3, PASS_QWEN2, PASS_QWEN35, PASS_PUNCT, PASS_NUMBERS, PASS_TRIPLES } pass;

/* one pass over every chunk of `in` (n_in lengths), lengths to out; returns their count */
static size_t run_pass(pass p, const uint32_t *cp, const size_t *in, size_t n_in, size_t *out) {
    chunk c = { cp, 0, 0, 0, out, 0 };
    size_t start = 0;
    for (size_t i = 0; i < n_in; i++) {
        c.ini = c.prev = start;
        c.end = start + in[i];
        switch (p) {
        case PASS_GPT2: split_gpt2(&c); break;
        case PASS_LLAMA3: split_llama3(&c, 3, UF_LETTER); break;
        case PASS_QWEN2: split_llama3(&c, 1, UF_LETTER); break;
        case PASS_QWEN35: split_llama3(&c, 1, UF_LETTER | UF_MARK); break;
        case PASS_PUNCT: split_runs(&c, is_punct_run); break;
        case PASS_NUMBERS: split_runs(&c, is_number_run); break;
        case PASS_TRIPLES: split_digit_triples(&c); break;
        }
        start = c.end;
    }
    return c.n_out;
}

size_t pretok_split(pretok_kind k, const uint32_t *cp, size_t n, size_t *lens, size_t *tmp) {
    if (n == 0) return 0;
    static const pass plans[][4] = {
        [PRETOK_DEFAULT] = { PASS_PUNCT, PASS_GPT2, PASS_NUMBERS, PASS_TRIPLES },
        [PRETOK_GPT2] = { PASS_GPT2 },
        [PRETOK_LLAMA3] = { PASS_LLAMA3 },
        [PRETOK_QWEN2] = { PASS_QWEN2 },
        [PRETOK_QWEN35] = { PASS_QWEN35 },
    };
    int n_pass = k == PRETOK_DEFAULT ? 4 : 1;
    /* passes alternate between the two buffers and end in lens */
    size_t *bufs[2] = { (n_pass & 1) ? lens : tmp, (n_pass & 1) ? tmp : lens };
    size_t cur_n = 1;
    bufs[1][0] = n; /* the whole text is one chunk; read from bufs[1] first */
    const size_t *src = bufs[1];
    for (int i = 0; i < n_pass; i++) {
        size_t *dst = bufs[i & 1];
        /* a pass never makes more words than code points, and reads src before dst overwrites it
         * only when they differ: they always do (the two buffers alternate) */
        cur_n = run_pass(plans[k][i], cp, src, cur_n, dst);
        src = dst;
    }
    return cur_n;
}

static const struct { const char *name; pretok_kind kind; } NAMES[] = {
    { "default", PRETOK_DEFAULT },
    { "gpt-2", PRETOK_GPT2 }, { "phi-2", PRETOK_GPT2 }, { "mpt", PRETOK_GPT2 }, { "olmo", PRETOK_GPT2 },
    { "llama3", PRETOK_LLAMA3 }, { "llama-v3", PRETOK_LLAMA3 }, { "llama-bpe", PRETOK_LLAMA3 },
    { "falcon3", PRETOK_LLAMA3 }, { "pixtral", PRETOK_LLAMA3 }, { "lfm2", PRETOK_LLAMA3 },
    { "qwen2", PRETOK_QWEN2 }, { "deepseek-r1-qwen", PRETOK_QWEN2 }, { "stablelm2", PRETOK_QWEN2 },
    { "qwen35", PRETOK_QWEN35 },
};

int pretok_from_name(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (strlen(NAMES[i].name) == len && memcmp(NAMES[i].name, name, len) == 0) return (int)NAMES[i].kind;
    return -1;
}

const char *pretok_name(pretok_kind k) {
    switch (k) {
    case PRETOK_DEFAULT: return "default";
    case PRETOK_GPT2: return "gpt-2";
    case PRETOK_LLAMA3: return "llama3";
    case PRETOK_QWEN2: return "qwen2";
    case PRETOK_QWEN35: return "qwen35";
    }
    return "?";
}
