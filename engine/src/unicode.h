/* Code points for the tokenizers: UTF-8 decoding with llama.cpp's error rule, UTF-8 encoding, and
 * the general-category class of a code point (from the generated unicode_table.c). */
#ifndef BMOE_UNICODE_H
#define BMOE_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* The class of a code point: Python's unicodedata general category folded to the classes the
 * pre-tokenizer patterns ask about (\p{L}, \p{N}, ...). Numbers match engine/tools/gen_unicode_table.py. */
enum {
    UNI_UNASSIGNED = 0,
    UNI_LETTER = 1,
    UNI_NUMBER = 2,
    UNI_MARK = 3,
    UNI_PUNCT = 4,
    UNI_SYMBOL = 5,
    UNI_SEPARATOR = 6,
    UNI_CONTROL = 7,
};

/* Flags of a position, 0 for "no code point here" (past the end of a chunk or beyond U+10FFFF):
 * every real code point has at least its class bit, so `flags != 0` means "some character". */
enum {
    UF_UNASSIGNED = 1u << 0,
    UF_LETTER = 1u << 1,
    UF_NUMBER = 1u << 2,
    UF_MARK = 1u << 3,
    UF_PUNCT = 1u << 4,
    UF_SYMBOL = 1u << 5,
    UF_SEPARATOR = 1u << 6,
    UF_CONTROL = 1u << 7,
    UF_WHITESPACE = 1u << 8,
};

extern const int uni_n_ranges;
extern const uint32_t uni_range_start[];
extern const uint8_t uni_range_class[];

#define UNI_REPLACEMENT 0xfffdu
#define UNI_MAX 0x10ffffu

int uni_class(uint32_t cp);
unsigned uni_flags(uint32_t cp);
/* Unicode's White_Space property (the \s of the patterns). */
int uni_is_whitespace(uint32_t cp);

/* Decodes s[0..n) into code points (out needs n entries); returns the count. A malformed sequence
 * gives U+FFFD for its first byte and decoding resumes at the next byte (llama.cpp's rule: lead and
 * continuation bits are checked, overlong forms and surrogates are not); a value beyond U+10FFFF is
 * also U+FFFD. */
size_t uni_decode(const uint8_t *s, size_t n, uint32_t *out);
/* UTF-8 of cp into out (4 bytes room); returns its length. */
int uni_encode(uint32_t cp, uint8_t *out);
/* The length of the UTF-8 sequence that lead byte c announces (1 for a stray continuation byte). */
int uni_len_from_lead(uint8_t c);

#endif
