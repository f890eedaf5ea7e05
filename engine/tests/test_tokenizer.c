/* Tokenizers: the GPT-2 byte ↔ code point mapping, byte-level vocabularies (encode → decode round
 * trips, specials, BOS), Unicode classes, the pre-tokenizer matchers, BPE merges by rank,
 * SentencePiece merges by score with byte fallback, special-token parsing, chat templates,
 * detokenizing, and refusals of malformed metadata. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gguf.h"
#include "mini_gguf.h"
#include "pretok.h"
#include "tokenizer.h"
#include "unicode.h"

/* utf-8 of a code point */
static int utf8(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xc0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    out[0] = (char)(0xe0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
}

static void test_mapping(void) {
    int seen[512] = {0}, ok = 1;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        ok &= cp < 512 && !seen[cp];
        if (cp < 512) seen[cp] = 1;
        ok &= tok_cp_to_byte(cp) == b;
    }
    CHECK(ok);
    CHECK(tok_byte_to_cp(' ') == 0x120);   /* 'Ġ' */
    CHECK(tok_byte_to_cp('\n') == 0x10a);  /* 'Ċ' */
    CHECK(tok_byte_to_cp(0) == 0x100);
    CHECK(tok_byte_to_cp('a') == 'a');
    CHECK(tok_byte_to_cp(0xad) == 0x143);  /* the last non-printable byte gets 256 + 67 */
    CHECK(tok_cp_to_byte(0x144) == -1);
    CHECK(tok_cp_to_byte(0x20) == -1);     /* a raw space is not a byte image */
}

/* vocabulary: 256 byte tokens in a shuffled order, then "<eos>" (control) and "<bos>" (control),
 * then a multi-byte normal token "Ġhi" */
static gguf_model *vocab_model(int add_bos, int with_types, int drop_byte) {
    meta m = {0};
    char *toks[259];
    int32_t types[259];
    int n = 0;
    for (int i = 0; i < 256; i++) {
        int b = (i * 167 + 13) & 255; /* a permutation of 0..255 */
        if (b == drop_byte) b = 'A'; /* the dropped byte's slot becomes a duplicate of 'A' */
        char *s = malloc(4);
        s[utf8(tok_byte_to_cp((uint8_t)b), s)] = 0;
        toks[n] = s; types[n++] = 1;
    }
    toks[n] = strdup("<eos>"); types[n++] = 3;
    toks[n] = strdup("<bos>"); types[n++] = 3;
    char hi[8]; int l = utf8(0x120, hi); hi[l] = 'h'; hi[l + 1] = 'i'; hi[l + 2] = 0;
    toks[n] = strdup(hi); types[n++] = 1;
    kv_str(&m, "tokenizer.ggml.model", "gpt2");
    kv_strs(&m, "tokenizer.ggml.tokens", toks, n);
    if (with_types) kv_i32s(&m, "tokenizer.ggml.token_type", types, n);
    kv_u32(&m, "tokenizer.ggml.eos_token_id", 256);
    kv_u32(&m, "tokenizer.ggml.bos_token_id", 257);
    kv_bool(&m, "tokenizer.ggml.add_bos_token", add_bos);
    for (int i = 0; i < n; i++) free(toks[i]);
    return finish(&m);
}

static void test_roundtrip(int with_types) {
    gguf_model *g = vocab_model(0, with_types, -1);
    CHECK(g != NULL);
    if (!g) return;
    bmoe_tokenizer tk;
    char err[256] = "";
    CHECK(tok_load(&tk, g, "vocab.gguf", err, sizeof err) == 0);
    CHECK(tk.n_vocab == 259 && tk.eos == 256 && tk.bos == 257 && !tk.add_bos);
    /* every ASCII byte, then multi-byte UTF-8: with no merges each byte is its own token */
    uint8_t text[256];
    for (int i = 0; i < 128; i++) text[i] = (uint8_t)(127 - i);
    const char *mb = "\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80"; /* é ▁ 😀 */
    size_t tl = 128 + strlen(mb);
    memcpy(text + 128, mb, strlen(mb));
    int32_t *ids = NULL;
    int n = 0;
    CHECK(tok_encode(&tk, text, tl, TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, &ids, &n, err, sizeof err) == 0);
    CHECK(n == (int)tl);
    uint8_t back[512];
    size_t bl = 0;
    for (int i = 0; i < n; i++) {
        size_t l;
        const uint8_t *p = tok_piece(&tk, ids[i], &l);
        memcpy(back + bl, p, l);
        bl += l;
    }
    CHECK(bl == tl && memcmp(back, text, tl) == 0);
    free(ids);
    /* a byte that is not UTF-8 reads as U+FFFD, like llama.cpp: three byte tokens */
    CHECK(tok_encode(&tk, (const uint8_t *)"\xff", 1, 0, &ids, &n, err, sizeof err) == 0);
    CHECK(n == 3 && ids[0] == tk.byte_token[0xef] && ids[1] == tk.byte_token[0xbf] && ids[2] == tk.byte_token[0xbd]);
    free(ids);
    /* special texts become their tokens only with TOK_PARSE_SPECIAL */
    CHECK(tok_encode(&tk, (const uint8_t *)"a<eos>b", 7, TOK_PARSE_SPECIAL, &ids, &n, err, sizeof err) == 0);
    CHECK(n == 3 && ids[1] == 256);
    free(ids);
    CHECK(tok_encode(&tk, (const uint8_t *)"a<eos>b", 7, 0, &ids, &n, err, sizeof err) == 0);
    CHECK(n == 7);
    free(ids);
    size_t l = 99;
    tok_piece(&tk, 256, &l);
    CHECK(l == 0); /* a special decodes to nothing */
    tok_piece(&tk, 257, &l);
    CHECK(l == 0);
    const uint8_t *p = tok_piece(&tk, 258, &l);
    CHECK(l == 3 && memcmp(p, " hi", 3) == 0); /* a multi-byte token */
    tok_piece(&tk, 259, &l);
    CHECK(l == 0); /* out of range */
    tok_piece(&tk, -1, &l);
    CHECK(l == 0);
    tok_free(&tk);
    gguf_close(g);
}

static void test_bos_and_missing(void) {
    gguf_model *g = vocab_model(1, 1, 'Z');
    bmoe_tokenizer tk;
    char err[256] = "";
    CHECK(g && tok_load(&tk, g, "vocab.gguf", err, sizeof err) == 0);
    if (!g) return;
    int32_t *ids = NULL;
    int n = 0;
    CHECK(tok_encode(&tk, (const uint8_t *)"AB", 2, TOK_ADD_SPECIAL, &ids, &n, err, sizeof err) == 0);
    CHECK(n == 3 && ids[0] == 257);
    CHECK(tk.byte_token['A'] >= 0 && ids[1] == tk.byte_token['A']);
    free(ids);
    /* 'A' appears twice: the higher id is its token (llama.cpp's text → id map keeps the last) */
    int last = -1;
    for (int i = 0; i < 256; i++) {
        size_t l;
        const uint8_t *p = tok_piece(&tk, i, &l);
        if (l == 1 && p[0] == 'A') last = i;
    }
    CHECK(tk.byte_token['A'] == last);
    CHECK(tok_encode(&tk, (const uint8_t *)"aZ", 2, 0, &ids, &n, err, sizeof err) == -1);
    CHECK(strstr(err, "0x5a") != NULL);
    tok_free(&tk);
    gguf_close(g);
}

static void test_refusals(void) {
    meta m = {0};
    char *toks[1] = { "a" };
    kv_strs(&m, "tokenizer.ggml.tokens", toks, 1);
    kv_u32(&m, "tokenizer.ggml.eos_token_id", 5); /* beyond the vocabulary */
    gguf_model *g = finish(&m);
    bmoe_tokenizer tk;
    char err[256] = "";
    CHECK(g && tok_load(&tk, g, "v.gguf", err, sizeof err) == 3);
    CHECK(strstr(err, "v.gguf") && strstr(err, "eos_token_id"));
    gguf_close(g);

    meta m2 = {0};
    kv_strs(&m2, "tokenizer.ggml.tokens", toks, 1);
    kv_bool(&m2, "tokenizer.ggml.add_bos_token", 1); /* but no bos id */
    g = finish(&m2);
    CHECK(g && tok_load(&tk, g, "v.gguf", err, sizeof err) == 3);
    gguf_close(g);

    meta m3 = {0};
    kv_str(&m3, "tokenizer.ggml.model", "llama");
    kv_strs(&m3, "tokenizer.ggml.tokens", toks, 1);
    g = finish(&m3);
    CHECK(g && tok_load(&tk, g, "v.gguf", err, sizeof err) == 3);
    gguf_close(g);

    meta m4 = {0};
    kv_u32(&m4, "tokenizer.ggml.tokens", 3); /* not an array */
    g = finish(&m4);
    CHECK(g && tok_load(&tk, g, "v.gguf", err, sizeof err) == 3);
    gguf_close(g);
}

/* ---- Unicode classes and UTF-8 ---- */
static void test_unicode(void) {
    CHECK(uni_class('a') == UNI_LETTER && uni_class('Z') == UNI_LETTER && uni_class(0xe9) == UNI_LETTER);
    CHECK(uni_class('5') == UNI_NUMBER && uni_class(0x0660) == UNI_NUMBER && uni_class(0x2163) == UNI_NUMBER);
    CHECK(uni_class(0x0301) == UNI_MARK);
    CHECK(uni_class('!') == UNI_PUNCT && uni_class(0x3001) == UNI_PUNCT);
    CHECK(uni_class('$') == UNI_SYMBOL && uni_class(0x20ac) == UNI_SYMBOL);
    CHECK(uni_class(0x4e00) == UNI_LETTER && uni_class(0x0378) == UNI_UNASSIGNED && uni_class(0) == UNI_CONTROL);
    CHECK(uni_class(0x10ffff) == UNI_UNASSIGNED);
    CHECK((uni_flags(0x3000) & UF_WHITESPACE) && (uni_flags(0x3000) & UF_SEPARATOR));
    CHECK((uni_flags('\n') & UF_WHITESPACE) && !(uni_flags(0x1c) & UF_WHITESPACE) && !(uni_flags(0x200b) & UF_WHITESPACE));
    CHECK(uni_flags(0x110000) == 0 && uni_flags(0x0378) == UF_UNASSIGNED);
    uint32_t cp[8];
    /* a truncated 3-byte sequence: U+FFFD for its lead byte, then for the stray continuation byte */
    CHECK(uni_decode((const uint8_t *)"a\xe2\x82" "a", 4, cp) == 4);
    CHECK(cp[0] == 'a' && cp[1] == 0xfffd && cp[2] == 0xfffd && cp[3] == 'a');
    CHECK(uni_decode((const uint8_t *)"\xf0\x9f\x98\x80\xf8", 5, cp) == 2 && cp[0] == 0x1f600 && cp[1] == 0xfffd);
    CHECK(uni_decode((const uint8_t *)"\xf4\x90\x80\x80", 4, cp) == 1 && cp[0] == 0xfffd); /* beyond U+10FFFF */
    uint8_t b[4];
    CHECK(uni_encode(0x1f600, b) == 4 && memcmp(b, "\xf0\x9f\x98\x80", 4) == 0);
    CHECK(uni_encode(0x2581, b) == 3 && memcmp(b, "\xe2\x96\x81", 3) == 0);
    CHECK(uni_len_from_lead(0x80) == 1 && uni_len_from_lead(0xc3) == 2 && uni_len_from_lead(0xf0) == 4);
}

/* ---- pre-tokenizers: words joined by '|' ---- */
static int split_is(pretok_kind k, const char *text, const char *want) {
    uint32_t cp[128];
    size_t lens[128], tmp[128];
    size_t n = uni_decode((const uint8_t *)text, strlen(text), cp);
    size_t nw = pretok_split(k, cp, n, lens, tmp);
    char got[512];
    size_t o = 0, at = 0;
    for (size_t w = 0; w < nw; w++) {
        if (w) got[o++] = '|';
        for (size_t i = at; i < at + lens[w]; i++) o += (size_t)uni_encode(cp[i], (uint8_t *)got + o);
        at += lens[w];
    }
    got[o] = 0;
    if (strcmp(got, want) != 0) fprintf(stderr, "split %s of '%s': got '%s', want '%s'\n", pretok_name(k), text, got, want);
    return strcmp(got, want) == 0 && at == n;
}

static void test_pretok(void) {
    CHECK(split_is(PRETOK_GPT2, "Hello world's  end 123", "Hello| world|'s| | end| 123"));
    CHECK(split_is(PRETOK_GPT2, "I'M ok!?  ", "I|'|M| ok|!?|  "));
    CHECK(split_is(PRETOK_LLAMA3, "abc 12345 x\n\nY", "abc| |123|45| x|\n\n|Y"));
    CHECK(split_is(PRETOK_QWEN2, "abc 12345 x\n\nY", "abc| |1|2|3|4|5| x|\n\n|Y"));
    CHECK(split_is(PRETOK_LLAMA3, "I'M (x)\n", "I|'M| (|x|)\n"));
    CHECK(split_is(PRETOK_LLAMA3, "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87", "caf\xc3\xa9| \xe4\xb8\xad\xe6\x96\x87"));
    CHECK(split_is(PRETOK_DEFAULT, "a+=b 1234567", "a|+=|b| |123|456|7"));
    CHECK(split_is(PRETOK_GPT2, "", ""));
    /* gpt-4o: cased runs (an upper run keeps its lower tail, all-caps stands alone), contractions of any
     * case, up to 3 digits, punctuation with trailing [\r\n/]*; a combining mark is no letter: it splits
     * a word and, like punctuation, may lead the next one */
    CHECK(split_is(PRETOK_GPT4O, "HELLOworld helloWorld CamelCase", "HELLOworld| hello|World| Camel|Case"));
    CHECK(split_is(PRETOK_GPT4O, "I'M x'S 1234567", "I'M| x'S| |123|456|7"));
    CHECK(split_is(PRETOK_GPT4O, "a/b//\n!?/\n", "a|/b|//\n|!?/\n"));
    CHECK(split_is(PRETOK_GPT4O, "nai\xcc\x88ve \xc3\x80" "Bc \xc3\x80" "B!", "nai|\xcc\x88ve| \xc3\x80" "Bc| \xc3\x80|B|!"));
    CHECK(split_is(PRETOK_GPT4O, "x  \n\n  y", "x|  \n\n| | y"));
    CHECK(pretok_from_name("gpt-4o", 6) == PRETOK_GPT4O && pretok_from_name("llama4", 6) == PRETOK_GPT4O);
    CHECK(pretok_from_name("llama-bpe", 9) == PRETOK_LLAMA3 && pretok_from_name("qwen2", 5) == PRETOK_QWEN2);
    CHECK(pretok_from_name("gpt-2", 5) == PRETOK_GPT2 && pretok_from_name("starcoder", 9) < 0);
    /* qwen35: a letter run takes combining marks (U+0301 after "e", U+0300 after a space, Devanagari vowel
     * signs) and the "other" run stops at one; qwen2 cuts before every mark (a mark then starts the next
     * letter run as its optional prefix, or joins a space's "other" run) */
    CHECK(split_is(PRETOK_QWEN35, "e\xcc\x81" "x \xcc\x80" "a 12", "e\xcc\x81" "x| \xcc\x80" "a| |1|2"));
    CHECK(split_is(PRETOK_QWEN2, "e\xcc\x81" "x \xcc\x80" "a 12", "e|\xcc\x81" "x| \xcc\x80|a| |1|2"));
    CHECK(split_is(PRETOK_QWEN35, "?!\xcc\x81" "?", "?!|\xcc\x81|?"));
    CHECK(split_is(PRETOK_QWEN2, "?!\xcc\x81" "?", "?!\xcc\x81" "?"));
    CHECK(split_is(PRETOK_QWEN35, "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\x82 x", "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\x82| x"));
    CHECK(split_is(PRETOK_QWEN2, "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\x82 x", "\xe0\xa4\xb9|\xe0\xa4\xbf\xe0\xa4\x82| x"));
    CHECK(pretok_from_name("qwen35", 6) == PRETOK_QWEN35 && pretok_from_name("lfm2", 4) == PRETOK_LLAMA3);
}

/* ---- BPE: 256 byte images, then ab, abc, bc and merges by rank ---- */
static gguf_model *bpe_model(const char **merges, int n_merges, const char *pre) {
    meta m = {0};
    char *toks[260];
    for (int b = 0; b < 256; b++) {
        toks[b] = malloc(4);
        toks[b][utf8(tok_byte_to_cp((uint8_t)b), toks[b])] = 0;
    }
    toks[256] = strdup("ab"); toks[257] = strdup("abc"); toks[258] = strdup("bc"); toks[259] = strdup("<|end|>");
    int32_t types[260];
    for (int i = 0; i < 260; i++) types[i] = i == 259 ? 3 : 1;
    kv_str(&m, "tokenizer.ggml.model", "gpt2");
    if (pre) kv_str(&m, "tokenizer.ggml.pre", pre);
    kv_strs(&m, "tokenizer.ggml.tokens", toks, 260);
    kv_i32s(&m, "tokenizer.ggml.token_type", types, 260);
    kv_strs(&m, "tokenizer.ggml.merges", (char **)merges, n_merges);
    for (int i = 0; i < 260; i++) free(toks[i]);
    return finish(&m);
}

static int enc_is(const bmoe_tokenizer *tk, const char *text, unsigned flags, const int32_t *want, int nw) {
    int32_t *ids = NULL;
    int n = 0;
    char err[256] = "";
    int rc = tok_encode(tk, (const uint8_t *)text, strlen(text), flags, &ids, &n, err, sizeof err);
    int ok = rc == 0 && n == nw && (nw == 0 || memcmp(ids, want, (size_t)nw * sizeof *ids) == 0);
    if (!ok) {
        fprintf(stderr, "encode '%s' (rc %d %s):", text, rc, err);
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

static void test_bpe(void) {
    const char *merges[] = { "a b", "b c", "ab c" };
    gguf_model *g = bpe_model(merges, 3, "gpt-2");
    bmoe_tokenizer tk;
    char err[256] = "";
    CHECK(g && tok_load(&tk, g, "bpe.gguf", err, sizeof err) == 0);
    if (!g) return;
    CHECK(tk.kind == TOK_BPE && tk.pre == PRETOK_GPT2 && tk.n_merges == 3);
    CHECK(enc_is(&tk, "abc", 0, (const int32_t[]){ 257 }, 1));      /* a b → ab, then ab c */
    CHECK(enc_is(&tk, "bca", 0, (const int32_t[]){ 258, 'a' }, 2)); /* b c, nothing for c a */
    /* " abc" is one word (space + letters): the space's byte token stays, abc merges */
    int32_t sp = tk.byte_token[' '];
    CHECK(enc_is(&tk, " abc", 0, (const int32_t[]){ sp, 257 }, 2));
    /* the special splits the text before pre-tokenizing: no merge crosses it */
    CHECK(enc_is(&tk, "ab<|end|>c", TOK_PARSE_SPECIAL, (const int32_t[]){ 256, 259, 'c' }, 3));
    uint8_t *out = NULL;
    size_t ol = 0;
    int32_t ids[] = { 'x', sp, ',', sp, 'y', sp, '\'', 's', 259 };
    CHECK(tok_detokenize(&tk, ids, 9, &out, &ol) == 0);
    CHECK(ol == 6 && memcmp(out, "x, y's", 6) == 0); /* the clean-up; the control token prints nothing */
    free(out);
    tok_free(&tk);
    gguf_close(g);

    /* the rank decides: with "b c" first, "abc" ends as a + bc */
    const char *merges2[] = { "b c", "a b", "ab c" };
    g = bpe_model(merges2, 3, "qwen2");
    CHECK(g && tok_load(&tk, g, "bpe.gguf", err, sizeof err) == 0);
    CHECK(enc_is(&tk, "abc", 0, (const int32_t[]){ 'a', 258 }, 2));
    CHECK(tk.clean_spaces == 0);
    tok_free(&tk);
    gguf_close(g);

    /* refusals: one line, exit 3 */
    const char *bad1[] = { "a zz" }, *bad2[] = { "ab" }, *bad3[] = { "c a" };
    const char **bads[] = { bad1, bad2, bad3 };
    const char *why[] = { "names a token", "no space", "merges into" };
    for (int i = 0; i < 3; i++) {
        g = bpe_model(bads[i], 1, NULL);
        CHECK(g && tok_load(&tk, g, "bad.gguf", err, sizeof err) == 3);
        CHECK(strstr(err, "bad.gguf") && strstr(err, "tokenizer.ggml.merges[0]") && strstr(err, why[i]));
        gguf_close(g);
    }
    g = bpe_model(merges, 3, "starcoder");
    CHECK(g && tok_load(&tk, g, "bad.gguf", err, sizeof err) == 3 && strstr(err, "tokenizer.ggml.pre"));
    gguf_close(g);
    meta m = {0};
    char *toks[1] = { "a" };
    kv_strs(&m, "tokenizer.ggml.tokens", toks, 1);
    kv_u32(&m, "tokenizer.ggml.merges", 7); /* not an array */
    g = finish(&m);
    CHECK(g && tok_load(&tk, g, "bad.gguf", err, sizeof err) == 3 && strstr(err, "merges"));
    gguf_close(g);
}

/* ---- SentencePiece: <unk> <s> </s>, 256 byte tokens, then pieces with scores ---- */
static gguf_model *spm_model(int with_scores, int add_space_prefix) {
    meta m = {0};
    char *toks[268];
    int32_t types[268];
    float scores[268];
    int n = 0;
    toks[n] = strdup("<unk>"); types[n] = 2; scores[n++] = 0;
    toks[n] = strdup("<s>"); types[n] = 3; scores[n++] = 0;
    toks[n] = strdup("</s>"); types[n] = 3; scores[n++] = 0;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        toks[n] = strdup(name); types[n] = 6; scores[n++] = 0;
    }
    const char *pieces[] = { "\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab", "c", "<user>" };
    const float ps[] = { -5, -3, -3, -1, -2, -0.5f, -3, 0 };
    for (int i = 0; i < 8; i++) { toks[n] = strdup(pieces[i]); types[n] = i == 7 ? 4 : 1; scores[n++] = ps[i]; }
    kv_str(&m, "tokenizer.ggml.model", "llama");
    kv_strs(&m, "tokenizer.ggml.tokens", toks, n);
    kv_i32s(&m, "tokenizer.ggml.token_type", types, n);
    if (with_scores) kv_f32s(&m, "tokenizer.ggml.scores", scores, n);
    if (add_space_prefix >= 0) kv_bool(&m, "tokenizer.ggml.add_space_prefix", add_space_prefix);
    for (int i = 0; i < n; i++) free(toks[i]);
    return finish(&m);
}

static void test_spm(void) {
    enum { SP = 259, A = 260, B = 261, SPA = 262, AB = 263, SPAB = 264, C = 265, USER = 266 };
    gguf_model *g = spm_model(1, -1);
    bmoe_tokenizer tk;
    char err[256] = "";
    CHECK(g && tok_load(&tk, g, "spm.gguf", err, sizeof err) == 0);
    if (!g) return;
    CHECK(tk.kind == TOK_SPM && tk.bos == 1 && tk.eos == 2 && tk.add_bos && tk.add_space_prefix);
    /* ▁ a b: ▁a (-1) beats ab (-2), then ▁a b → ▁ab */
    CHECK(enc_is(&tk, "ab", TOK_ADD_SPECIAL, (const int32_t[]){ 1, SPAB }, 2));
    CHECK(enc_is(&tk, "ba", 0, (const int32_t[]){ SP, B, A }, 3));
    /* é has no piece: its two bytes as <0xC3> <0xA9> */
    CHECK(enc_is(&tk, "\xc3\xa9", 0, (const int32_t[]){ SP, 3 + 0xc3, 3 + 0xa9 }, 3));
    /* a control token splits the text and the next piece gets the space prefix again */
    CHECK(enc_is(&tk, "a</s>b", TOK_PARSE_SPECIAL, (const int32_t[]){ SPA, 2, SP, B }, 4));
    /* user-defined tokens are matched even without parse_special; control ones are not */
    CHECK(enc_is(&tk, "c<user>", 0, (const int32_t[]){ SP, C, USER }, 3));
    CHECK(enc_is(&tk, "", TOK_ADD_SPECIAL, (const int32_t[]){ 1 }, 1));
    uint8_t *out = NULL;
    size_t ol = 0;
    CHECK(tok_detokenize(&tk, (const int32_t[]){ 1, SPAB, SP, 3 + 0xc3, 3 + 0xa9, USER }, 6, &out, &ol) == 0);
    CHECK(ol == 12 && memcmp(out, " ab \xc3\xa9<user>", 12) == 0); /* BOS printed nothing, so its strip was spent */
    free(out);
    CHECK(tok_detokenize(&tk, (const int32_t[]){ SPAB, C }, 2, &out, &ol) == 0);
    CHECK(ol == 3 && memcmp(out, "abc", 3) == 0);
    free(out);
    tok_free(&tk);
    gguf_close(g);

    g = spm_model(1, 0); /* add_space_prefix false */
    CHECK(g && tok_load(&tk, g, "spm.gguf", err, sizeof err) == 0);
    CHECK(enc_is(&tk, "ab", 0, (const int32_t[]){ AB }, 1));
    tok_free(&tk);
    gguf_close(g);

    g = spm_model(0, -1);
    CHECK(g && tok_load(&tk, g, "spm.gguf", err, sizeof err) == 3 && strstr(err, "tokenizer.ggml.scores"));
    gguf_close(g);
}

/* ---- chat templates ---- */
static void test_chat(void) {
    const char *chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}";
    CHECK(tok_chat_detect(chatml, strlen(chatml)) == TOK_CHAT_CHATML);
    CHECK(tok_chat_detect("<start_of_turn>user", 19) == TOK_CHAT_GEMMA);
    const char *l3 = "<|start_header_id|>' + role + '<|end_header_id|>";
    CHECK(tok_chat_detect(l3, strlen(l3)) == TOK_CHAT_LLAMA3);
    CHECK(tok_chat_detect("[INST] <start_of_turn>", 22) == TOK_CHAT_NONE); /* llama.cpp would take it for mistral */
    CHECK(tok_chat_detect("<|im_start|><|im_sep|>", 22) == TOK_CHAT_NONE);
    CHECK(tok_chat_detect("plain", 5) == TOK_CHAT_NONE);
    bmoe_tokenizer tk;
    memset(&tk, 0, sizeof tk);
    char *s = NULL, err[256] = "";
    tk.chat = TOK_CHAT_CHATML;
    CHECK(tok_chat_wrap(&tk, " hi ", &s, err, sizeof err) == 0);
    CHECK(s && strcmp(s, "<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\n") == 0);
    free(s);
    tk.chat = TOK_CHAT_GEMMA;
    CHECK(tok_chat_wrap(&tk, " hi\n", &s, err, sizeof err) == 0);
    CHECK(s && strcmp(s, "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n") == 0);
    free(s);
    tk.chat = TOK_CHAT_LLAMA3;
    CHECK(tok_chat_wrap(&tk, "hi", &s, err, sizeof err) == 0);
    CHECK(s && strcmp(s, "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n") == 0);
    free(s);
    tk.chat = TOK_CHAT_NONE;
    CHECK(tok_chat_wrap(&tk, "hi", &s, err, sizeof err) == 2 && s == NULL && strstr(err, "--chat"));
}

/* ---- end of generation (tok_eog.c) ---- */

/* A vocabulary of `texts` (NULL-terminated; "" entries become "tN"), type normal, plus u32 keys. */
static gguf_model *eog_model(const char *model, const char *const *texts, const char *const *keys, const uint32_t *vals) {
    meta m = {0};
    char *toks[64];
    float scores[64];
    int n = 0;
    for (; texts[n]; n++) {
        toks[n] = malloc(16 + strlen(texts[n]));
        if (texts[n][0]) strcpy(toks[n], texts[n]);
        else snprintf(toks[n], 16, "t%d", n);
        scores[n] = 0.0f;
    }
    kv_str(&m, "tokenizer.ggml.model", model);
    kv_strs(&m, "tokenizer.ggml.tokens", toks, n);
    if (!strcmp(model, "llama")) kv_f32s(&m, "tokenizer.ggml.scores", scores, n);
    else kv_strs(&m, "tokenizer.ggml.merges", toks, 0);
    for (int i = 0; keys && keys[i]; i++) kv_u32(&m, keys[i], vals[i]);
    for (int i = 0; i < n; i++) free(toks[i]);
    return finish(&m);
}

/* loads the vocabulary and checks its EOG set is exactly want[0..nw) (ascending); returns tok_load's code */
static int eog_is(const char *model, const char *const *texts, const char *const *keys, const uint32_t *vals,
                  const int32_t *want, int nw, bmoe_tokenizer *keep) {
    gguf_model *g = eog_model(model, texts, keys, vals);
    bmoe_tokenizer tk;
    char err[256] = "";
    CHECK(g != NULL);
    if (!g) return -1;
    int rc = tok_load(&tk, g, "eog.gguf", err, sizeof err);
    if (rc == 0) {
        int ok = tk.n_eog == nw;
        for (int i = 0; ok && i < nw; i++) ok = tk.eog[i] == want[i];
        int members = 0;
        for (int32_t id = -1; id <= tk.n_vocab; id++) members += tok_is_eog(&tk, id);
        if (!ok || members != nw) {
            fprintf(stderr, "eog set:");
            for (int i = 0; i < tk.n_eog; i++) fprintf(stderr, " %d", tk.eog[i]);
            fprintf(stderr, "\n");
        }
        CHECK(ok && members == nw);
        if (keep) *keep = tk;
        else tok_free(&tk);
    }
    gguf_close(g);
    return rc;
}

static void test_eog(void) {
    /* the texts, EOS from its key; the texts found become control (they print nothing) */
    const char *chat[] = { "", "<|im_end|>", "", "<|endoftext|>", "", "<|im_start|>", "<end_of_turn>", NULL };
    const char *eos_key[] = { "tokenizer.ggml.eos_token_id", NULL };
    uint32_t eos4[] = { 4 };
    bmoe_tokenizer tk;
    CHECK(eog_is("gpt2", chat, eos_key, eos4, (const int32_t[]){ 1, 3, 4, 6 }, 4, &tk) == 0);
    size_t l = 9;
    tok_piece(&tk, 1, &l);
    CHECK(l == 0 && (tk.attr[6] & TOK_ATTR_CONTROL) && !tok_is_eog(&tk, 5) && !tok_is_eog(&tk, -1));
    tok_free(&tk);

    /* gpt2 without an EOS key: llama.cpp's default EOS 11 when the vocabulary has it */
    const char *twelve[] = { "", "", "", "", "", "", "", "", "", "", "", "", NULL };
    CHECK(eog_is("gpt2", twelve, NULL, NULL, (const int32_t[]){ 11 }, 1, NULL) == 0);
    CHECK(eog_is("gpt2", twelve + 1, NULL, NULL, NULL, 0, NULL) == 0);
    /* SentencePiece: EOS 2 by default */
    CHECK(eog_is("llama", twelve, NULL, NULL, (const int32_t[]){ 2 }, 1, NULL) == 0);

    /* EOT and EOM keys join; an id beyond the vocabulary is refused */
    const char *keys3[] = { "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", NULL };
    CHECK(eog_is("gpt2", twelve, keys3, (const uint32_t[]){ 0, 7, 9 }, (const int32_t[]){ 0, 7, 9 }, 3, NULL) == 0);
    const char *eot_key[] = { "tokenizer.ggml.eot_token_id", NULL };
    CHECK(eog_is("gpt2", twelve, eot_key, (const uint32_t[]){ 12 }, NULL, 0, NULL) == 3);

    /* FIM pad/repo/file-separator: by key, else by text (the lowest id when a kind has two) */
    const char *fim[] = { "", "<|fim_pad|>", "<|repo_name|>", "", "<|file_sep|>", "[PAD]", "<PAD>", NULL };
    CHECK(eog_is("gpt2", fim, eos_key, (const uint32_t[]){ 0 }, (const int32_t[]){ 0, 1, 2, 4 }, 4, NULL) == 0);
    const char *pad_key[] = { "tokenizer.ggml.eos_token_id", "tokenizer.ggml.fim_pad_token_id", NULL };
    CHECK(eog_is("gpt2", fim, pad_key, (const uint32_t[]){ 0, 3 }, (const int32_t[]){ 0, 2, 3, 4 }, 4, NULL) == 0);
    const char *pads[] = { "", "", "<PAD>", "[PAD]", NULL };
    CHECK(eog_is("gpt2", pads, eos_key, (const uint32_t[]){ 0 }, (const int32_t[]){ 0, 2 }, 2, &tk) == 0);
    CHECK((tk.attr[2] & TOK_ATTR_CONTROL) && !(tk.attr[3] & TOK_ATTR_CONTROL));
    tok_free(&tk);

    /* harmony: with <|return|> and <|call|> (or <|calls|> and <|flush|>) <|end|> ends a message, not the
     * generation: out of the set, user-defined (it prints its text) */
    const char *harmony[] = { "", "<|return|>", "<|call|>", "<|end|>", NULL };
    CHECK(eog_is("gpt2", harmony, eos_key, (const uint32_t[]){ 0 }, (const int32_t[]){ 0, 1, 2 }, 3, &tk) == 0);
    const uint8_t *p = tok_piece(&tk, 3, &l);
    CHECK(l == 7 && memcmp(p, "<|end|>", 7) == 0);
    tok_free(&tk);
    const char *solar[] = { "", "<|flush|>", "<|calls|>", "<|end|>", NULL };
    CHECK(eog_is("gpt2", solar, eos_key, (const uint32_t[]){ 0 }, (const int32_t[]){ 0, 1, 2 }, 3, NULL) == 0);
    const char *call_only[] = { "", "<|call|>", "<|end|>", NULL };
    CHECK(eog_is("gpt2", call_only, eos_key, (const uint32_t[]){ 0 }, (const int32_t[]){ 0, 1, 2 }, 3, NULL) == 0);
    /* </s> is a normal token next to <|tool_response>: out of the set */
    const char *s_marker[] = { "", "</s>", "<|tool_response>", NULL };
    CHECK(eog_is("gpt2", s_marker, eos_key, (const uint32_t[]){ 0 }, (const int32_t[]){ 0, 2 }, 2, &tk) == 0);
    CHECK(tk.attr[1] == TOK_ATTR_NORMAL);
    tok_free(&tk);
    const char *s_alone[] = { "", "</s>", NULL };
    CHECK(eog_is("gpt2", s_alone, eos_key, (const uint32_t[]){ 0 }, (const int32_t[]){ 0, 1 }, 2, NULL) == 0);
}

int main(void) {
    test_mapping();
    test_roundtrip(1);
    test_roundtrip(0); /* without token types, BOS/EOS ids are the specials */
    test_bos_and_missing();
    test_refusals();
    test_unicode();
    test_pretok();
    test_bpe();
    test_spm();
    test_chat();
    test_eog();
    return check_report("test_tokenizer");
}
