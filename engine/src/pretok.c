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

/* gpt-4o (o200k), as llama.cpp runs it: its std::regex over "collapsed" text, where a code point below
 * 128 is itself and any other is one byte for its class (whitespace, letter, number, punctuation, mark,
 * symbol, other), with llama.cpp's rewrite of the pattern
 *
 *   [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?
 *  |[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|...)?
 *  |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *
 * So "upper" is a letter other than a-z and "lower" a letter other than A-Z: a letter outside ASCII is
 * both, and a combining mark is no letter at all (it splits a word, unlike the original pattern, whose
 * letter classes include \p{M}). \s is ASCII's " \t\n\v\f\r" and Unicode's other white space. The
 * alternatives are tried in order with the regex's backtracking, which the loops below follow. */
typedef struct { int ws, letter, number, upper, lower, any; } o200k_cls;

static o200k_cls o200k_at(const chunk *c, size_t p) {
    o200k_cls k = { 0, 0, 0, 0, 0, 0 };
    uint32_t x = cpt(c, p);
    if (x == OOR) return k;
    k.any = 1;
    if (x < 128) {
        k.ws = x == ' ' || (x >= 0x09 && x <= 0x0d);
        int up = x >= 'A' && x <= 'Z', lo = x >= 'a' && x <= 'z';
        k.letter = up || lo;
        k.upper = up;
        k.lower = lo;
        k.number = x >= '0' && x <= '9';
        return k;
    }
    if (uni_is_whitespace(x)) { k.ws = 1; return k; }
    int cl = uni_class(x);
    k.letter = k.upper = k.lower = cl == UNI_LETTER;
    k.number = cl == UNI_NUMBER;
    return k;
}

/* [^\r\n\p{L}\p{N}]: any character but CR, LF, a letter or a number */
static int o200k_prefix(const chunk *c, size_t p) {
    o200k_cls k = o200k_at(c, p);
    uint32_t x = cpt(c, p);
    return k.any && x != '\r' && x != '\n' && !k.letter && !k.number;
}

/* the two letter alternatives from pos; returns the match end, or 0 when neither matches */
static size_t o200k_word(const chunk *c, size_t pos) {
    size_t st = o200k_prefix(c, pos) ? pos + 1 : pos; /* when the prefix fails the rest fails too */
    size_t k = 0;
    while (o200k_at(c, st + k).upper) k++;
    for (size_t m = k + 1; m-- > 0;) { /* upper* (greedy, backing off) then lower+ */
        if (!o200k_at(c, st + m).lower) continue;
        size_t e = st + m;
        while (o200k_at(c, e).lower) e++;
        return e + contraction(c, e, 1);
    }
    if (k > 0) { /* upper+ lower* */
        size_t e = st + k;
        while (o200k_at(c, e).lower) e++;
        return e + contraction(c, e, 1);
    }
    return 0;
}

static void split_gpt4o(chunk *c) {
    for (size_t pos = c->ini; pos < c->end;) {
        size_t e = o200k_word(c, pos);
        if (e) { pos += add(c, e); continue; }
        o200k_cls k = o200k_at(c, pos);
        if (k.number) { /* '\p{N}{1,3}' */
            size_t n = 0;
            while (n < 3 && o200k_at(c, pos + n).number) n++;
            pos += add(c, pos + n);
            continue;
        }
        /* ' ?[^\s\p{L}\p{N}]+[\r\n/]*' */
        size_t st = cpt(c, pos) == ' ' ? pos + 1 : pos;
        o200k_cls k2 = o200k_at(c, st);
        if (!(k2.any && !k2.ws && !k2.letter && !k2.number)) st = pos, k2 = k;
        if (k2.any && !k2.ws && !k2.letter && !k2.number) {
            e = st;
            for (o200k_cls q = k2; q.any && !q.ws && !q.letter && !q.number; q = o200k_at(c, ++e)) {}
            for (uint32_t x = cpt(c, e); x == '\r' || x == '\n' || x == '/'; x = cpt(c, ++e)) {}
            pos += add(c, e);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (o200k_at(c, pos + nws).ws) {
            uint32_t x = cpt(c, pos + nws);
            if (x == '\r' || x == '\n') last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) { pos += add(c, last_rn); continue; }              /* '\s*[\r\n]+' */
        if (nws > 1 && cpt(c, pos + nws) != OOR) { pos += add(c, pos + nws - 1); continue; } /* '\s+(?!\S)' */
        if (nws > 0) { pos += add(c, pos + nws); continue; }                /* '\s+' */
        pos += add(c, pos + 1); /* not reached: every character matches some alternative */
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

typedef enum { PASS_GPT2, PASS_LLAMA3, PASS_QWEN2, PASS_QWEN35, PASS_GPT4O, PASS_PUNCT, PASS_NUMBERS, PASS_TRIPLES } pass;

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
        case PASS_GPT4O: split_gpt4o(&c); break;
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
        [PRETOK_GPT4O] = { PASS_GPT4O },
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
    { "gpt-4o", PRETOK_GPT4O }, { "llama4", PRETOK_GPT4O },
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
    case PRETOK_GPT4O: return "gpt-4o";
    case PRETOK_QWEN35: return "qwen35";
    }
    return "?";
}
