/* Route trace writer (see route_trace.h). */
#include "route_trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bmoe_route_trace {
    FILE *f;
    char *path;
    int write_errno;
    uint64_t rows;
};

/* One printable field: control bytes, commas and non-ASCII become '?'. */
static void put_safe(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        fputc(c < 0x20 || c >= 0x7f || c == ',' ? '?' : c, f);
    }
}

int trace_open(bmoe_route_trace **out, const char *path, const bmoe_model *m, int top_k, bmoe_trace_geometry geo,
               char *err, size_t errlen) {
    *out = NULL;
    bmoe_route_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    t->f = fopen(path, "w");
    if (!t->f) {
        snprintf(err, errlen, "--route-trace: cannot open %s: %s", path, strerror(errno));
        free(t->path);
        free(t);
        return 4;
    }
    setvbuf(t->f, NULL, _IOFBF, 1 << 16);
    fputs("# route_trace v4\n# model=", t->f);
    put_safe(t->f, m->path);
    fputs("\n# arch=", t->f);
    put_safe(t->f, m->arch);
    fprintf(t->f, "\n# layers=%d\n# experts=%d\n# top_k=%d\n", m->hp.n_layer, m->hp.n_expert, top_k);
    fprintf(t->f, "# scores_are_probs=%d\n", m->hp.gating && m->hp.gating->scores_are_probs ? 1 : 0);
    fprintf(t->f, "# page_bytes=%llu shared_slot_bytes=%llu\n", (unsigned long long)geo.page_bytes,
            (unsigned long long)geo.shared_slot_bytes);
    for (int i = 0; i < m->n_moe_layers; i++) {
        const bmoe_layer *ly = &m->layers[m->moe_layers[i]];
        fprintf(t->f, "# layer=%d expert_bytes=%llu part_bytes=", m->moe_layers[i], (unsigned long long)ly->expert_bytes);
        for (int p = 0; p < BMOE_EXP_NPARTS; p++) /* in enum order: gate, up, gate_up, down; 0 when absent */
            fprintf(t->f, "%s%llu", p ? "," : "", ly->exp_part[p].present ? (unsigned long long)ly->exp_part[p].bytes : 0ULL);
        fprintf(t->f, " slot_bytes=%llu\n", (unsigned long long)geo.slot_bytes[i]);
    }
    fputs("turn,phase,step,layer,slot,router_expert,expert,router_weight,weight,residency,expert_bytes,dropped,"
          "substituted,scores\n", t->f);
    *out = t;
    return 0;
}

void trace_row(bmoe_route_trace *t, const bmoe_trace_row *r) {
    if (!t || t->write_errno) return;
    int bad = fprintf(t->f, "%d,%d,%d,%d,%d,%d,%d,%.9g,%.9g,%d,%llu,%d,%d,", r->turn, r->phase, r->step, r->layer,
                      r->slot, r->router_expert, r->expert, (double)r->router_weight, (double)r->weight, r->residency,
                      (unsigned long long)r->expert_bytes, r->dropped, r->substituted) < 0;
    for (int e = 0; r->scores && e < r->n_scores && !bad; e++)
        bad = fprintf(t->f, "%s%.9g", e ? " " : "", (double)r->scores[e]) < 0;
    if (!bad) bad = fputc('\n', t->f) == EOF;
    if (bad) t->write_errno = errno ? errno : EIO;
    t->rows++;
}

int trace_close(bmoe_route_trace *t, char *err, size_t errlen) {
    if (!t) return 0;
    int e = t->write_errno;
    if (fflush(t->f) != 0 && !e) e = errno ? errno : EIO;
    if (ferror(t->f) && !e) e = EIO;
    if (fclose(t->f) != 0 && !e) e = errno ? errno : EIO;
    int rc = 0;
    if (e) {
        snprintf(err, errlen, "--route-trace: cannot write %s: %s", t->path, strerror(e));
        rc = 4;
    }
    free(t->path);
    free(t);
    return rc;
}

uint64_t trace_rows(const bmoe_route_trace *t) { return t ? t->rows : 0; }
