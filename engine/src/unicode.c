/* Code point classes and UTF-8 (unicode.h). */
#include "unicode.h"

int uni_class(uint32_t cp) {
    if (cp > UNI_MAX) return UNI_UNASSIGNED;
    /* the last run whose start is <= cp */
    int lo = 0, hi = uni_n_ranges - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (uni_range_start[mid] <= cp) lo = mid;
        else hi = mid - 1;
    }
    return uni_range_class[lo];
}

int uni_is_whitespace(uint32_t cp) {
    /* PropList.txt White_Space: stable across Unicode versions since 4.1 */
    if (cp >= 0x09 && cp <= 0x0d) return 1;
    switch (cp) {
    case 0x20: case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f: case 0x3000:
        return 1;
    default:
        return cp >= 0x2000 && cp <= 0x200a;
    }
}

unsigned uni_flags(uint32_t cp) {
    if (cp > UNI_MAX) return 0;
    unsigned f = 1u << uni_class(cp);
    if (uni_is_whitespace(cp)) f |= UF_WHITESPACE;
#ifdef BMOE_FAULT_TOK_NUMBER_ASCII_ONLY
    /* fault: \p{N} taken as isdigit(): other scripts' digits and No/Nl numbers read as symbols */
    if ((f & UF_NUMBER) && !(cp >= '0' && cp <= '9')) f = (f & ~UF_NUMBER) | UF_SYMBOL;
#endif
    return f;
}

int uni_len_from_lead(uint8_t c) {
    static const uint8_t len[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
    return len[c >> 4];
}

size_t uni_decode(const uint8_t *s, size_t n, uint32_t *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len = 0;
        uint32_t v = 0;
        if (c < 0x80) { len = 1; v = c; }
        else if ((c & 0xe0) == 0xc0) { len = 2; v = c & 0x1f; }
        else if ((c & 0xf0) == 0xe0) { len = 3; v = c & 0x0f; }
        else if ((c & 0xf8) == 0xf0) { len = 4; v = c & 0x07; }
        int ok = len > 0 && i + len <= n;
        for (size_t j = 1; ok && j < len; j++) {
            if ((s[i + j] & 0xc0) != 0x80) ok = 0;
            else v = (v << 6) | (s[i + j] & 0x3f);
        }
        if (!ok) { out[k++] = UNI_REPLACEMENT; i++; continue; }
        /* llama.cpp decodes these but then cannot encode them again; one replacement char instead */
        out[k++] = v > UNI_MAX ? UNI_REPLACEMENT : v;
        i += len;
    }
    return k;
}

int uni_encode(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = (uint8_t)(0xc0 | (cp >> 6)); o[1] = (uint8_t)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xe0 | (cp >> 12)); o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f)); o[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | ((cp >> 18) & 0x07)); o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}
