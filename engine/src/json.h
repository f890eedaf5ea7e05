/* A small streaming JSON writer: deterministic output (keys in the order written, doubles as "%.17g"
 * so they read back bit-exact, non-finite as null, integers exact, no locale dependence).
 * Strings (keys too) are escaped per RFC 8259: '"' '\\' and \b \f \n \r \t short, every other byte
 * below 0x20 as \u00XX; well-formed UTF-8 (RFC 3629: no overlongs, surrogates or > U+10FFFF) passes
 * through; every byte that is not part of a well-formed sequence becomes \u00XX of the byte. That is
 * lossy (a reader cannot tell it from U+00XX), so binary-ish text must also go out through json_hex,
 * the lossless field (lowercase hex of the bytes; the result's "text_hex").
 * A NULL string is written as null. json_end() writes the newline and resets the writer, so one
 * writer can emit one value per line (JSONL). Nesting deeper than 63 levels is not supported. */
#ifndef BMOE_JSON_H
#define BMOE_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct json_writer {
    FILE *out;
    int depth;
    int need_comma[64];
} json_writer;

void json_init(json_writer *w, FILE *out);
void json_begin_object(json_writer *w, const char *key); /* key NULL at top level / in arrays */
void json_end_object(json_writer *w);
void json_begin_array(json_writer *w, const char *key);
void json_end_array(json_writer *w);
void json_str(json_writer *w, const char *key, const char *s);
void json_strn(json_writer *w, const char *key, const char *s, size_t n);
void json_hex(json_writer *w, const char *key, const uint8_t *b, size_t n);
void json_int(json_writer *w, const char *key, int64_t v);
void json_uint(json_writer *w, const char *key, uint64_t v);
void json_num(json_writer *w, const char *key, double v); /* non-finite → null */
void json_bool(json_writer *w, const char *key, int v);
void json_null(json_writer *w, const char *key);
void json_end(json_writer *w); /* newline after the top-level value */

#endif
