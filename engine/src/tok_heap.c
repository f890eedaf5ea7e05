/* The tokenizers' merge queue (tok_heap.h). */
#include "tok_heap.h"

#include <stdlib.h>

static int before(const tok_bigram *a, const tok_bigram *b) {
#ifndef BMOE_FAULT_TOK_MERGE_RIGHTMOST
    return a->key < b->key || (a->key == b->key && a->left < b->left);
#else
    return a->key < b->key || (a->key == b->key && a->left > b->left); /* fault: the rightmost of equals */
#endif
}

int tok_heap_push(tok_heap *q, tok_bigram b) {
    if (q->n == q->cap) {
        int cap = q->cap ? q->cap * 2 : 64;
        tok_bigram *p = realloc(q->h, (size_t)cap * sizeof *p);
        if (!p) return -3;
        q->h = p;
        q->cap = cap;
    }
    int i = q->n++;
    while (i > 0 && before(&b, &q->h[(i - 1) / 2])) { q->h[i] = q->h[(i - 1) / 2]; i = (i - 1) / 2; }
    q->h[i] = b;
    return 0;
}

tok_bigram tok_heap_pop(tok_heap *q) {
    tok_bigram top = q->h[0], last = q->h[--q->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && before(&q->h[c + 1], &q->h[c])) c++;
        if (!before(&q->h[c], &last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n) q->h[i] = last;
    return top;
}

void tok_heap_free(tok_heap *q) {
    free(q->h);
    q->h = NULL;
    q->n = q->cap = 0;
}
