/* Tokenizer loading, special-token partition, encoding and decoding (tokenizer.h). The vocabulary's
 * lookups are tok_vocab.c; the encoders of one text fragment are tok_bpe.c and tok_spm.c; the
 * end-of-generation set is tok_eog.c; chat templates are chat.c. None of them calls back into this file. */
#include "tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pretok.h"
#include "tok_bpe.h"
#include "tok_spm.h"
#include "unicode.h"

/* ---- the token map ------------------------------------------------------------------------------ */

static uint32_t table_size(uint64_t n) {
    uint32_t sz = 16;
    while (sz < 2 * n) sz *= 2;
    return sz;
}

/* later ids win over earlier ones with the same text, as in llama.cpp's token_to_id */
static int build_map(bmoe_tokenizer *tk) {
    uint32_t sz = table_size((uint64_t)tk->n_vocab);
    tk->map = malloc((size_t)sz * sizeof *tk->map);
    if (!tk->map) return 1;
    memset(tk->map, 0xff, (size_t)sz * sizeof *tk->map);
    tk->map_mask = sz - 1;
    for (int32_t id = 0; id < tk->n_vocab; id++) {
        size_t len;
        const uint8_t *s = tok_text(tk, id, &len);
        if (len == 0) continue; /* matches nothing */
        for (uint32_t i = (uint32_t)tok_hash_text(s, len) & tk->map_mask;; i = (i + 1) & tk->map_mask) {
            int32_t o = tk->map[i];
            if (o < 0) { tk->map[i] = id; break; }
            size_t l;
            const uint8_t *t = tok_text(tk, o, &l);
            if (l == len && memcmp(t, s, len) == 0) { tk->map[i] = id; break; }
        }
    }
    return 0;
}

/* ---- loading ---------------------------------------------------------------------------------- */

static int get_id(const gguf_model *g, const char *key, int n_vocab, int32_t *out, const char *path, char *err,
                  size_t errlen) {
    uint64_t v;
    char e[256] = "";
    int r = gguf_get_u64(g, key, &v, e, sizeof e);
    if (r < 0) { snprintf(err, errlen, "%s: %s: %s", path, key, e); return 3; }
    if (r == 0) return 0; /* keep the default */
    if (v >= (uint64_t)n_vocab) {
        snprintf(err, errlen, "%s: %s = %llu is not below the vocabulary size %d", path, key, (unsigned long long)v, n_vocab);
        return 3;
    }
    *out = (int32_t)v;
    return 0;
}

static int get_flag(const gguf_model *g, const char *key, int *out, const char *path, char *err, size_t errlen) {
    int v;
    char e[256] = "";
    int r = gguf_get_bool(g, key, &v, e, sizeof e);
    if (r < 0) { snprintf(err, errlen, "%s: %s: %s", path, key, e); return 3; }
    if (r > 0) *out = v;
    return 0;
}

static uint32_t rd32(const void *p, size_t i) {
    const uint8_t *b = (const uint8_t *)p + 4 * i;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint8_t attr_of_type(uint32_t t) {
    switch (t) {
    case 1: return TOK_ATTR_NORMAL;
    case 2: return TOK_ATTR_UNKNOWN;
    case 3: return TOK_ATTR_CONTROL;
    case 4: return TOK_ATTR_USER;
    case 5: return TOK_ATTR_UNUSED;
    case 6: return TOK_ATTR_BYTE;
    default: return TOK_ATTR_UNDEFINED;
    }
}

/* Texts llama.cpp treats as control tokens whatever their stored type (end-of-turn, end-of-generation
 * and fill-in-the-middle markers it recognises by text). */
static const char *const FORCED_CONTROL[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
    "[EOT]", "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>" /* <｜end▁of▁sentence｜> */, "<end_of_utterance>", "<|eom_id|>",
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "\xe2\x96\x81<PRE>", "<|fim_suffix|>", "<fim-suffix>",
    "<fim_suffix>", "<SUF>", "\xe2\x96\x81<SUF>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>",
    "\xe2\x96\x81<MID>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
    "<REPO>", "<reponame>", "<|file_sep|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "</s>", "[EOS]",
    "<eos>", /* the end-of-generation texts are made control by tok_build_eog as well */
};

typedef struct { int32_t id; size_t len; } special_ent;

static int cmp_special_ent(const void *a, const void *b) {
    const special_ent *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first */
    return x->id < y->id ? -1 : x->id > y->id; /* then by id: a fixed order */
}

static int build_specials(bmoe_tokenizer *tk) {
    int n = 0;
    for (int i = 0; i < tk->n_vocab; i++)
        if ((tk->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER | TOK_ATTR_UNKNOWN)) && tk->text_off[i + 1] > tk->text_off[i]) n++;
    special_ent *e = malloc(((size_t)n + 1) * sizeof *e);
    tk->special = malloc(((size_t)n + 1) * sizeof *tk->special);
    if (!e || !tk->special) { free(e); return 1; }
    int k = 0;
    for (int i = 0; i < tk->n_vocab; i++)
        if ((tk->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER | TOK_ATTR_UNKNOWN)) && tk->text_off[i + 1] > tk->text_off[i])
            e[k++] = (special_ent){ i, (size_t)(tk->text_off[i + 1] - tk->text_off[i]) };
    qsort(e, (size_t)n, sizeof *e, cmp_special_ent);
    for (int i = 0; i < n; i++) tk->special[i] = e[i].id;
    tk->n_special = n;
    free(e);
    return 0;
}

/* tokenizer.ggml.merges: "left right" per rank, both sides and their concatenation tokens */
static int load_merges(bmoe_tokenizer *tk, const gguf_model *g, const char *path, char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.merges");
    if (!kv) return 0; /* byte-level: no merges */
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING) {
        snprintf(err, errlen, "%s: tokenizer.ggml.merges is not an array of strings", path);
        return 3;
    }
    if (kv->n > (1u << 24)) {
        snprintf(err, errlen, "%s: tokenizer.ggml.merges has %llu entries", path, (unsigned long long)kv->n);
        return 3;
    }
    tk->n_merges = (int)kv->n;
    uint32_t sz = table_size(kv->n);
    tk->merge_key = malloc((size_t)sz * sizeof *tk->merge_key);
    tk->merge_rank = malloc((size_t)sz * sizeof *tk->merge_rank);
    tk->merge_result = malloc((size_t)sz * sizeof *tk->merge_result);
    uint8_t *cat = NULL;
    size_t cat_cap = 0;
    if (!tk->merge_key || !tk->merge_rank || !tk->merge_result) { snprintf(err, errlen, "out of memory loading merges"); return 1; }
    memset(tk->merge_rank, 0xff, (size_t)sz * sizeof *tk->merge_rank);
    tk->merge_mask = sz - 1;
    const gguf_str *m = (const gguf_str *)kv->data;
    for (uint64_t r = 0; r < kv->n; r++) {
        const uint8_t *s = (const uint8_t *)m[r].ptr;
        size_t len = (size_t)m[r].len, sp = 1;
        while (sp < len && s[sp] != ' ') sp++; /* the first space after the first byte, like llama.cpp */
        int32_t a = -1, b = -1, c = -1;
        if (sp < len) {
            a = tok_find(tk, s, sp);
            b = tok_find(tk, s + sp + 1, len - sp - 1);
            if (len > cat_cap) {
                uint8_t *nc = realloc(cat, len * 2);
                if (!nc) { free(cat); snprintf(err, errlen, "out of memory loading merges"); return 1; }
                cat = nc;
                cat_cap = len * 2;
            }
            memcpy(cat, s, sp);
            memcpy(cat + sp, s + sp + 1, len - sp - 1);
            c = tok_find(tk, cat, len - 1);
        }
        if (a < 0 || b < 0 || c < 0) {
            free(cat);
            snprintf(err, errlen, "%s: tokenizer.ggml.merges[%llu] %s", path, (unsigned long long)r,
                     sp >= len ? "has no space between its two parts"
                     : a < 0 || b < 0 ? "names a token the vocabulary does not have"
                                      : "merges into a text the vocabulary does not have");
            return 3;
        }
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        for (uint32_t i = (uint32_t)tok_hash_pair(key) & tk->merge_mask;; i = (i + 1) & tk->merge_mask) {
            if (tk->merge_rank[i] < 0) {
                tk->merge_key[i] = key;
                tk->merge_rank[i] = (int32_t)r;
                tk->merge_result[i] = c;
                break;
            }
            if (tk->merge_key[i] == key) break; /* the first rank of a repeated pair wins */
        }
    }
    free(cat);
    return 0;
}

/* The decoded bytes of every token (tok_piece). */
static int build_pieces(bmoe_tokenizer *tk) {
    uint64_t total = tk->text_off[tk->n_vocab];
    tk->bytes = malloc(total ? (size_t)total : 1);
    tk->off = malloc(((size_t)tk->n_vocab + 1) * sizeof *tk->off);
    if (!tk->bytes || !tk->off) return 1;
    uint64_t o = 0;
    for (int i = 0; i < tk->n_vocab; i++) {
        tk->off[i] = o;
        size_t n;
        const uint8_t *s = tok_text(tk, i, &n);
        uint8_t a = tk->attr[i];
        uint8_t *dst = tk->bytes + o;
        if (a & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)) continue; /* first: a forced control token may also be user-defined */
        if (a & TOK_ATTR_USER) { memcpy(dst, s, n); o += n; continue; }
        if (a & TOK_ATTR_NORMAL) {
            if (tk->kind == TOK_SPM || tk->kind == TOK_GEMMA4) { /* U+2581 → space */
                size_t k = 0;
                for (size_t j = 0; j < n;) {
                    if (j + 3 <= n && s[j] == 0xe2 && s[j + 1] == 0x96 && s[j + 2] == 0x81) { dst[k++] = ' '; j += 3; }
                    else dst[k++] = s[j++];
                }
                o += k;
            } else { /* byte images → bytes; another code point keeps its UTF-8 */
                size_t k = 0;
                uint32_t cps[4];
                for (size_t j = 0; j < n;) {
                    int l = uni_len_from_lead(s[j]);
                    if (j + (size_t)l > n) l = 1;
                    size_t got = uni_decode(s + j, (size_t)l, cps);
                    int b = got == 1 && cps[0] != UNI_REPLACEMENT ? tok_cp_to_byte(cps[0]) : -1;
                    if (b >= 0) dst[k++] = (uint8_t)b;
                    else { memcpy(dst + k, s + j, (size_t)l); k += (size_t)l; }
                    j += (size_t)l;
                }
                o += k;
            }
            continue;
        }
        if ((a & TOK_ATTR_BYTE) && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
            unsigned v;
            char hex[3] = { (char)s[3], (char)s[4], 0 };
            if (sscanf(hex, "%2x", &v) == 1) { dst[0] = (uint8_t)v; o += 1; }
        }
        /* control, unknown, unused, undefined: nothing */
    }
    tk->off[tk->n_vocab] = o;
    return 0;
}

static void byte_tokens(bmoe_tokenizer *tk) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        if (tk->kind == TOK_SPM || tk->kind == TOK_GEMMA4) {
            uint8_t name[6] = { '<', '0', 'x', (uint8_t)hex[b >> 4], (uint8_t)hex[b & 15], '>' };
            int32_t id = tok_find(tk, name, 6);
            if (id < 0 && tk->kind == TOK_SPM) { uint8_t c = (uint8_t)b; id = tok_find(tk, &c, 1); }
            tk->byte_token[b] = id;
        } else {
            uint8_t img[4];
            int l = uni_encode(tok_byte_to_cp((uint8_t)b), img);
            tk->byte_token[b] = tok_find(tk, img, (size_t)l);
        }
    }
}

static void set_attr(bmoe_tokenizer *tk, const char *text, unsigned bit, int on) {
    int32_t id = tok_find(tk, (const uint8_t *)text, strlen(text));
    if (id < 0) return;
    if (on) tk->attr[id] |= (uint8_t)bit;
    else tk->attr[id] &= (uint8_t)~bit;
}

/* llama.cpp gives phi-3 models (recognised by general.name) right-stripping special tokens: the white
 * space after them in the text is dropped, except after <unk>, <s> and <|endoftext|>. */
static int phi3_rstrip(bmoe_tokenizer *tk, const gguf_model *g, const char *path, char *err, size_t errlen) {
    gguf_str name;
    char e[256] = "";
    int r = gguf_get_str(g, "general.name", &name, e, sizeof e);
    if (r < 0) { snprintf(err, errlen, "%s: general.name: %s", path, e); return 3; }
    if (r == 0) return 0;
    int phi3 = 0;
    for (uint64_t i = 0; i + 4 <= name.len && !phi3; i++) {
        char c[5];
        for (int k = 0; k < 5; k++) {
            char x = i + (uint64_t)k < name.len ? name.ptr[i + (uint64_t)k] : 0;
            c[k] = (char)(x >= 'A' && x <= 'Z' ? x + 32 : x);
        }
        phi3 = memcmp(c, "phi3", 4) == 0 || memcmp(c, "phi-3", 5) == 0;
    }
    if (!phi3) return 0;
    for (int i = 0; i < tk->n_special; i++) tk->attr[tk->special[i]] |= TOK_ATTR_RSTRIP;
    set_attr(tk, "</s>", TOK_ATTR_RSTRIP, 1);
    set_attr(tk, "<unk>", TOK_ATTR_RSTRIP, 0);
    set_attr(tk, "<s>", TOK_ATTR_RSTRIP, 0);
    set_attr(tk, "<|endoftext|>", TOK_ATTR_RSTRIP, 0);
    return 0;
}

int tok_load(bmoe_tokenizer *tk, const gguf_model *g, const char *path, char *err, size_t errlen) {
    memset(tk, 0, sizeof *tk);
    tk->bos = tk->eos = -1;
    const gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING || kv->n < 1 || kv->n > (1u << 24)) {
        snprintf(err, errlen, "%s: tokenizer.ggml.tokens is missing or not an array of strings", path);
        return 3;
    }
    int n = (int)kv->n;
    const gguf_str *texts = (const gguf_str *)kv->data;
    gguf_str s;
    char e[256] = "";
    int r = gguf_get_str(g, "tokenizer.ggml.model", &s, e, sizeof e);
    if (r < 0) { snprintf(err, errlen, "%s: tokenizer.ggml.model: %s", path, e); return 3; }
    if (r == 0 || gguf_str_eq(s, "gpt2")) tk->kind = TOK_BPE;
    else if (gguf_str_eq(s, "llama")) tk->kind = TOK_SPM;
    else if (gguf_str_eq(s, "gemma4")) tk->kind = TOK_GEMMA4;
    else {
        snprintf(err, errlen, "%s: tokenizer.ggml.model \"%.40s\" is not supported (\"gpt2\", \"llama\" or \"gemma4\")",
                 path, s.ptr);
        return 3;
    }
    tk->pre = PRETOK_DEFAULT;
    if (tk->kind == TOK_BPE) {
        r = gguf_get_str(g, "tokenizer.ggml.pre", &s, e, sizeof e);
        if (r < 0) { snprintf(err, errlen, "%s: tokenizer.ggml.pre: %s", path, e); return 3; }
        if (r > 0) {
            int k = pretok_from_name(s.ptr, (size_t)s.len);
            if (k < 0) {
                snprintf(err, errlen, "%s: tokenizer.ggml.pre \"%.40s\" is not supported (default, gpt-2, llama-bpe, qwen2, qwen35, gpt-4o and their aliases)",
                         path, s.ptr);
                return 3;
            }
            tk->pre = k;
        }
        tk->ignore_merges = tk->pre == PRETOK_LLAMA3;
        tk->add_bos = tk->pre == PRETOK_LLAMA3; /* llama.cpp's default for the llama3 family */
        tk->clean_spaces = tk->pre != PRETOK_QWEN2 && tk->pre != PRETOK_QWEN35 && tk->pre != PRETOK_GPT4O; /* llama.cpp */
    } else if (tk->kind == TOK_GEMMA4) {
        tk->clean_spaces = 1; /* llama.cpp's BPE default; no pre-tokenizer name is read */
    } else {
        tk->bos = n > 1 ? 1 : -1; /* llama.cpp's SentencePiece defaults */
        tk->eos = n > 2 ? 2 : -1;
        tk->add_bos = 1;
        tk->add_space_prefix = 1;
    }
    const gguf_kv *tt = gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (tt && (tt->type != GGUF_TYPE_ARRAY || tt->n != kv->n ||
               (tt->arr_type != GGUF_TYPE_INT32 && tt->arr_type != GGUF_TYPE_UINT32))) {
        snprintf(err, errlen, "%s: tokenizer.ggml.token_type must be an int32 array with one entry per token", path);
        return 3;
    }
    const gguf_kv *sc = gguf_find_kv(g, "tokenizer.ggml.scores");
    if (sc && (sc->type != GGUF_TYPE_ARRAY || sc->n < kv->n ||
               (sc->arr_type != GGUF_TYPE_FLOAT32 && sc->arr_type != GGUF_TYPE_INT32))) {
        snprintf(err, errlen, "%s: tokenizer.ggml.scores must be a float32 array with one entry per token", path);
        return 3;
    }
    if (tk->kind == TOK_SPM && !sc) {
        snprintf(err, errlen, "%s: tokenizer.ggml.scores is missing (a \"llama\" tokenizer merges by score)", path);
        return 3;
    }
    int rc;
    if ((rc = get_id(g, "tokenizer.ggml.bos_token_id", n, &tk->bos, path, err, errlen))) return rc;
    if ((rc = get_id(g, "tokenizer.ggml.eos_token_id", n, &tk->eos, path, err, errlen))) return rc;
    if ((rc = get_flag(g, "tokenizer.ggml.add_bos_token", &tk->add_bos, path, err, errlen))) return rc;
    if ((rc = get_flag(g, "tokenizer.ggml.add_eos_token", &tk->add_eos, path, err, errlen))) return rc;
    if ((rc = get_flag(g, "tokenizer.ggml.add_space_prefix", &tk->add_space_prefix, path, err, errlen))) return rc;
    tk->add_bos = !!tk->add_bos;
    tk->add_eos = !!tk->add_eos;
    if (tk->kind == TOK_GEMMA4) { /* llama.cpp adds BOS to a gemma4 prompt whatever the key says */
        tk->add_bos = 1;
        tk->add_space_prefix = 0;
    }
    if (tk->add_bos && tk->bos < 0) {
        snprintf(err, errlen, "%s: tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing", path);
        return 3;
    }
    if (tk->add_eos && tk->eos < 0) {
        snprintf(err, errlen, "%s: tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is missing", path);
        return 3;
    }

    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (texts[i].len > (1u << 20)) {
            snprintf(err, errlen, "%s: tokenizer.ggml.tokens[%d] is %llu bytes long", path, i, (unsigned long long)texts[i].len);
            return 3;
        }
        total += texts[i].len;
    }
    tk->n_vocab = n;
    tk->text = malloc(total ? (size_t)total : 1);
    tk->text_off = malloc(((size_t)n + 1) * sizeof *tk->text_off);
    tk->attr = malloc((size_t)n);
    if (tk->kind == TOK_SPM) tk->score = malloc((size_t)n * sizeof *tk->score);
    if (!tk->text || !tk->text_off || !tk->attr || (tk->kind == TOK_SPM && !tk->score)) goto oom;
    uint64_t o = 0;
    for (int i = 0; i < n; i++) {
        tk->text_off[i] = o;
        memcpy(tk->text + o, texts[i].ptr, (size_t)texts[i].len);
        o += texts[i].len;
        /* without token types, BOS and EOS are the control tokens */
        tk->attr[i] = tt ? attr_of_type(rd32(tt->data, (size_t)i))
                         : (i == tk->bos || i == tk->eos) ? TOK_ATTR_CONTROL : TOK_ATTR_NORMAL;
        if (tk->score) {
            uint32_t v = rd32(sc->data, (size_t)i);
            float f;
            if (sc->arr_type == GGUF_TYPE_INT32) f = (float)(int32_t)v;
            else memcpy(&f, &v, 4);
            if (isnan(f)) {
                snprintf(err, errlen, "%s: tokenizer.ggml.scores[%d] is not a number", path, i);
                tok_free(tk);
                return 3;
            }
            tk->score[i] = f;
        }
    }
    tk->text_off[n] = o;
    if (build_map(tk)) goto oom;
    for (size_t i = 0; i < sizeof FORCED_CONTROL / sizeof FORCED_CONTROL[0]; i++) {
        int32_t id = tok_find(tk, (const uint8_t *)FORCED_CONTROL[i], strlen(FORCED_CONTROL[i]));
        if (id >= 0) tk->attr[id] |= TOK_ATTR_CONTROL;
    }
    if ((rc = tok_build_eog(tk, g, path, err, errlen))) { tok_free(tk); return rc; }
    if (tk->kind != TOK_SPM && (rc = load_merges(tk, g, path, err, errlen))) { tok_free(tk); return rc; }
    byte_tokens(tk);
    if (build_pieces(tk) || build_specials(tk)) goto oom;
    if ((rc = phi3_rstrip(tk, g, path, err, errlen))) { tok_free(tk); return rc; }
    r = gguf_get_str(g, "tokenizer.chat_template", &s, e, sizeof e);
    tk->chat = r > 0 ? tok_chat_detect(s.ptr, (size_t)s.len) : TOK_CHAT_NONE;
    return 0;
oom:
    tok_free(tk);
    snprintf(err, errlen, "out of memory loading the vocabulary");
    return 1;
}

void tok_free(bmoe_tokenizer *tk) {
    free(tk->text);
    free(tk->text_off);
    free(tk->attr);
    free(tk->score);
    free(tk->bytes);
    free(tk->off);
    free(tk->map);
    free(tk->merge_key);
    free(tk->merge_rank);
    free(tk->merge_result);
    free(tk->special);
    free(tk->eog);
    memset(tk, 0, sizeof *tk);
    tk->bos = tk->eos = -1;
}

/* ---- encoding --------------------------------------------------------------------------------- */

/* A piece of the input: raw text [off, off + len) or a special token (id >= 0). */
typedef struct { size_t off, len; int32_t id; } frag;
typedef struct { frag *f; size_t n, cap; } frag_vec;

static int frag_push(frag_vec *v, frag f) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        frag *p = realloc(v->f, cap * sizeof *p);
        if (!p) return -3;
        v->f = p;
        v->cap = cap;
    }
    v->f[v->n++] = f;
    return 0;
}

static const uint8_t *find_bytes(const uint8_t *h, size_t hn, const uint8_t *nd, size_t nn) {
    if (nn == 0 || nn > hn) return NULL;
    for (const uint8_t *p = h; (p = memchr(p, nd[0], hn - (size_t)(p - h) - nn + 1)) != NULL; p++)
        if (memcmp(p, nd, nn) == 0) return p;
    return NULL;
}

/* llama.cpp's tokenizer_st_partition: for each special token, longest first, every raw fragment is
 * split at each of its leftmost non-overlapping occurrences. Control and unknown tokens take part only
 * with parse_special; user-defined ones always do. */
static int partition(const bmoe_tokenizer *tk, const uint8_t *text, size_t len, int parse_special, frag_vec *out) {
    frag_vec cur = { 0 }, nxt = { 0 };
    if (len && frag_push(&cur, (frag){ 0, len, -1 })) return -3;
    for (int k = 0; k < tk->n_special; k++) {
        int32_t id = tk->special[k];
        if (!parse_special && (tk->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) continue;
        size_t sl;
        const uint8_t *st = tok_text(tk, id, &sl);
        nxt.n = 0;
        int hit = 0;
        for (size_t i = 0; i < cur.n; i++) {
            frag f = cur.f[i];
            if (f.id >= 0) { if (frag_push(&nxt, f)) goto oom; continue; }
            size_t pos = f.off, end = f.off + f.len;
            const uint8_t *m;
            while ((m = find_bytes(text + pos, end - pos, st, sl)) != NULL) {
                size_t at = (size_t)(m - text);
                if (at > pos && frag_push(&nxt, (frag){ pos, at - pos, -1 })) goto oom;
                if (frag_push(&nxt, (frag){ at, sl, id })) goto oom;
                pos = at + sl;
                if (tk->attr[id] & TOK_ATTR_RSTRIP) /* C-locale isspace, as llama.cpp */
                    while (pos < end && (text[pos] == ' ' || (text[pos] >= '\t' && text[pos] <= '\r'))) pos++;
                hit = 1;
            }
            if (pos < end && frag_push(&nxt, (frag){ pos, end - pos, -1 })) goto oom;
        }
        if (hit) { frag_vec t = cur; cur = nxt; nxt = t; }
    }
    free(nxt.f);
    *out = cur;
    return 0;
oom:
    free(cur.f);
    free(nxt.f);
    return -3;
}

int tok_encode(const bmoe_tokenizer *tk, const uint8_t *text, size_t len, unsigned flags, int32_t **out, int *n,
               char *err, size_t errlen) {
    *out = NULL;
    *n = 0;
    tok_vec v = { 0 };
    frag_vec fr = { 0 };
    int rc = partition(tk, text, len, !!(flags & TOK_PARSE_SPECIAL), &fr);
    int add = !!(flags & TOK_ADD_SPECIAL);
    if (!rc && add && tk->add_bos) rc = tok_vec_push(&v, tk->bos);
    int prev_special = 1; /* SentencePiece: a space prefix at the start and after each special token */
    for (size_t i = 0; !rc && i < fr.n; i++) {
        frag f = fr.f[i];
        if (f.id >= 0) { rc = tok_vec_push(&v, f.id); prev_special = 1; continue; }
        if (tk->kind == TOK_SPM) rc = tok_spm_fragment(tk, text + f.off, f.len, tk->add_space_prefix && prev_special, &v, err, errlen);
        else if (tk->kind == TOK_GEMMA4) rc = tok_gemma4_fragment(tk, text + f.off, f.len, &v, err, errlen);
        else rc = tok_bpe_fragment(tk, text + f.off, f.len, &v, err, errlen);
        prev_special = 0;
    }
    if (!rc && add && tk->add_eos) rc = tok_vec_push(&v, tk->eos);
    free(fr.f);
    if (rc) { free(v.v); return rc; }
    *out = v.v;
    *n = v.n;
    return 0;
}

/* ---- decoding --------------------------------------------------------------------------------- */

const uint8_t *tok_piece(const bmoe_tokenizer *tk, int32_t id, size_t *len) {
    if (id < 0 || id >= tk->n_vocab) { *len = 0; return NULL; }
    *len = (size_t)(tk->off[id + 1] - tk->off[id]);
    return tk->bytes + tk->off[id];
}

/* llama.cpp's clean_up_tokenization_spaces, its three passes */
static size_t clean_spaces(uint8_t *t, size_t total) {
    size_t n1 = total, k = total ? 1 : 0;
    for (size_t i = 1; i < n1; i++) {
        uint8_t x = t[i];
        if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) k--;
        t[k++] = x;
    }
    size_t n2 = k;
    k = n2 ? 1 : 0;
    for (size_t i = 1; i < n2; i++) {
        uint8_t x = t[i];
        if (x == '\'' && i + 1 < n2 && t[i - 1] == ' ' && t[i + 1] == ' ') { k--; t[++i] = 0; }
        t[k++] = x;
    }
    size_t n3 = k;
    k = n3 ? 1 : 0;
    for (size_t i = 1; i < n3; i++) {
        uint8_t x = t[i];
        if (t[i - 1] == ' ' && x == '\'' && i + 1 < n3) {
            uint8_t x1 = t[i + 1];
            if (x1 == 's' || x1 == 'm') k--;
            else if (i + 2 < n3 && ((x1 == 'r' && t[i + 2] == 'e') || (x1 == 'v' && t[i + 2] == 'e'))) k--;
        }
        t[k++] = x;
    }
    return k;
}

int tok_detokenize(const bmoe_tokenizer *tk, const int32_t *ids, int n, uint8_t **out, size_t *len) {
    size_t total = 0;
    for (int i = 0; i < n; i++) { size_t l; tok_piece(tk, ids[i], &l); total += l; }
    uint8_t *buf = malloc(total + 1);
    if (!buf) return -3;
    size_t k = 0;
    int strip = tk->add_space_prefix;
    for (int i = 0; i < n; i++) {
        size_t l;
        const uint8_t *p = tok_piece(tk, ids[i], &l);
        if (strip && l && p[0] == ' ') { p++; l--; }
        strip = 0; /* only the first token, even when it printed nothing */
        if (l) memcpy(buf + k, p, l);
        k += l;
    }
    if (tk->clean_spaces) k = clean_spaces(buf, k);
    buf[k] = 0;
    *out = buf;
    *len = k;
    return 0;
}
