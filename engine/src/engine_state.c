/* The helpers the run (engine.c) and the scoring modes (engine_scoring.c) share (engine_state.h). */
#include "engine_state.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double engine_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A forward pass stopped: the hook's own message when it was the hook that stopped it. */
int engine_forward_failed(bmoe_engine *e, bmoe_error *err, int rc, const char *msg) {
    const char *hm = e->stream ? stream_hook_error(e->stream) : "";
    if (!hm[0]) hm = checked_error(&e->checked);
    return err_set(err, rc, NULL, "%s", hm[0] ? hm : msg);
}

int engine_append_text(bmoe_engine *e, int32_t tok) {
    size_t n;
    const uint8_t *piece = tok_piece(&e->tok, tok, &n);
    if (n == 0) return 0;
    if (e->text_len + n > e->text_cap) {
        size_t cap = e->text_cap ? e->text_cap * 2 : 256;
        while (cap < e->text_len + n) cap *= 2;
        uint8_t *p = realloc(e->text, cap);
        if (!p) return 1;
        e->text = p;
        e->text_cap = cap;
    }
    memcpy(e->text + e->text_len, piece, n);
    e->text_len += n;
    return 0;
}

/* Raw little-endian f32 rows. */
int engine_write_logits(FILE *f, const float *v, size_t n) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe == 1) return fwrite(v, sizeof(float), n, f) == n ? 0 : -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        uint8_t b[4] = { (uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24) };
        if (fwrite(b, 1, 4, f) != 4) return -1;
    }
    return 0;
}

/* Why a generation of n tokens stopped: "eog" when its last token is an end-of-generation token,
 * else "n_predict" (-n tokens made, -n 0 included). */
const char *engine_stop_reason(const bmoe_engine *e, const int32_t *toks, int n) {
    return n > 0 && tok_is_eog(&e->tok, toks[n - 1]) ? "eog" : "n_predict";
}
