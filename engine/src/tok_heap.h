/* The merge queue both subword tokenizers use (tok_bpe.c, tok_spm.c): a binary min-heap of candidate
 * pairs of adjacent symbols, ordered by key, then by the left symbol's index, so that among equally
 * good merges the leftmost goes first, as llama.cpp's queues order them. BPE's key is the merge's rank;
 * SentencePiece's is the negated score of the merged token (best score first). */
#ifndef BMOE_TOK_HEAP_H
#define BMOE_TOK_HEAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok_bigram {
    double key;                  /* smaller merges first */
    int left, right;             /* the symbols' indices */
    int32_t lid, rid, result;    /* BPE: the pair's token ids when queued, and the merged token */
    size_t size;                 /* SentencePiece: the merged piece's bytes when queued */
} tok_bigram;

typedef struct tok_heap { tok_bigram *h; int n, cap; } tok_heap;

/* 0, or -3 when out of memory (the tokenizers' code for it). */
int tok_heap_push(tok_heap *q, tok_bigram b);
/* The first pair; the heap must not be empty. */
tok_bigram tok_heap_pop(tok_heap *q);
void tok_heap_free(tok_heap *q);

#endif
