/* Pre-tokenizers of byte-level BPE vocabularies (tokenizer.ggml.pre): the text's code points cut into
 * words before merges run inside each word. Each split is a hand-written matcher equal to the
 * regular expression the vocabulary names (docs/tokenizers.md lists them); no regex engine. */
#ifndef BMOE_PRETOK_H
#define BMOE_PRETOK_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    PRETOK_DEFAULT = 0, /* llama.cpp's fallback list: punctuation runs, GPT-2, number runs, digit triples */
    PRETOK_GPT2,        /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    PRETOK_LLAMA3,      /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    PRETOK_QWEN2,       /* the llama3 pattern with \p{N} (one digit per word) */
    PRETOK_GPT4O,       /* o200k (gpt-oss, llama4): cased letter runs, \p{N}{1,3}, punctuation with trailing
                         * [\r\n/]*, as llama.cpp's collapsed-text regex cuts them (pretok.c) */
    PRETOK_QWEN35,      /* qwen2's with [\p{L}\p{M}]+ letter runs and marks left out of the other run */
} pretok_kind;

/* Maps a tokenizer.ggml.pre name to its kind; -1 when the name is not supported. */
int pretok_from_name(const char *name, size_t len);
const char *pretok_name(pretok_kind k);

/* Cuts cp[0..n) into words. lens (capacity n) receives each word's length in code points, tmp is
 * scratch of n entries. Returns the number of words (0 for n == 0). */
size_t pretok_split(pretok_kind k, const uint32_t *cp, size_t n, size_t *lens, size_t *tmp);

#endif
