/* Expert memory of the streaming mode (docs/design.md, expert memory): reserved ranges, slots committed by a positioned
 * read from the GGUF file, released on eviction.
 *
 * Two layouts:
 *   per-expert slots (the cache): each streamed layer owns one reserved virtual range of
 *     n_expert slots; slot e holds expert e of that layer when it is loaded;
 *   shared slots (--cache-mb 0): one range of S slots that every layer reuses, plus one guard slot
 *     that is never committed.
 * A range is mapped with no access (PROT_NONE, MAP_NORESERVE): it costs address space, not memory.
 * Loading commits a slot (read-write) and queues the reads of the expert's parts on the I/O lanes.
 * Releasing returns its pages (MADV_DONTNEED) and removes access (PROT_NONE), so a later touch of
 * an evicted or never-loaded slot faults instead of reading stale bytes.
 *
 * Huge pages: the shared slots and each frame arena start on a 2 MiB boundary and are advised
 * MADV_HUGEPAGE, so direct reads land in physically contiguous 2 MiB runs. Because a huge page needs
 * its whole 2 MiB inside one read-write mapping, the S shared slots (not the guard) and the first
 * frame_pool_bytes of each arena's frames are opened read-write together at stream_open rather than
 * one by one; neither holds an expert before its read, so opening them early exposes nothing.
 *
 * Frame pool (per-expert layout with frame_pool_bytes > 0): the memory behind the slots is an arena
 * of slot-sized frames per slot size (a class: layers whose experts differ in type have slots of
 * different sizes, and a frame serves the slots of its own size). Committing gives the slot a free
 * frame of its class and opens it read-write; the expert's
 * address is then its frame (stream_view). Releasing takes the frame back and closes it (PROT_NONE)
 * with its pages kept, so the next commit of any slot reuses them: no zero-filled page faults inside
 * the read. Closing is deferred to stream_settle, so a frame released and committed again in between
 * (the usual eviction for a miss) changes no protection at all. A released or never-loaded expert's address is its slot in the reserved range, never
 * committed with a pool, so it faults; a pointer kept into a free frame faults too. Free frames keep
 * their pages until stream_trim, which the hook calls once per forward pass: it returns the pages
 * (MADV_DONTNEED) of free frames while the frames held (in use and free, in bytes) exceed
 * max(frame_pool_bytes, the most bytes in use at once since the previous trim). So the pool holds what
 * the budget and the last pass's peak need, and a pass that pins more than the budget reuses its
 * frames instead of faulting fresh pages in.
 *
 * Slot geometry, per layer: each part (gate, up, gate_up, down) of one of the layer's experts gets a
 * sub-slot aligned to BMOE_STREAM_ALIGN, sized for that layer's slice of the part (its own type and
 * width); a layer's slot is its sub-slots rounded up to a page. Shared slots hold any layer's expert, so
 * they are as large as the largest layer's slot. The part's bytes start at (file offset mod
 * BMOE_STREAM_ALIGN) inside its sub-slot, so an
 * O_DIRECT read of the aligned covering range lands the slice exactly there, with no bounce buffer
 * and no copy, and the data keeps the alignment it has in the file (F32 rows stay 4-aligned).
 *
 * Reads go through O_DIRECT (Linux and other systems that have it) or F_NOCACHE (macOS) unless
 * `odirect` is 0; a filesystem that refuses (EINVAL at open or at read) falls back to the page cache
 * and stream_direct() says so. Nothing here reads through a model mapping. */
#ifndef BMOE_EXPERT_STREAM_H
#define BMOE_EXPERT_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "io_lanes.h"
#include "model.h"
#include "seam.h"

#define BMOE_STREAM_ALIGN 4096

/* One expert tensor of one streamed layer: expert e is bytes [offset + e*stride, + bytes) of shard. */
typedef struct bmoe_stream_part {
    int present;
    uint32_t shard;
    uint64_t offset, stride, bytes;
    const char *name;             /* tensor name, for messages (borrowed) */
} bmoe_stream_part;

typedef struct bmoe_stream_opts {
    int n_layers;                       /* streamed layers (a model's MoE layers, in order) */
    int n_expert;
    const bmoe_stream_part *parts;      /* [n_layers][BMOE_EXP_NPARTS], copied */
    uint32_t n_shards;
    const char *const *shard_paths;     /* borrowed; opened by stream_open */
    int shared_slots;                   /* 0: a slot per (layer, expert); S > 0: S slots for every layer */
    int odirect;                        /* try O_DIRECT / F_NOCACHE */
    int io_lanes;                       /* 1..8 */
    uint64_t frame_pool_bytes;          /* per-expert layout only: > 0 recycles committed frames across
                                         * slots, keeping at most this many bytes of frames committed
                                         * (the cache budget) beyond what the slots hold; 0 releases a
                                         * slot's pages on eviction */
} bmoe_stream_opts;

typedef struct bmoe_stream bmoe_stream;

/* Opens the shards, reserves the ranges, starts the lanes. 0, or an exit code (1 memory/threads/address
 * space, 4 a shard cannot be opened) with one line in err. */
int stream_open(const bmoe_stream_opts *o, bmoe_stream **out, char *err, size_t errlen);
void stream_close(bmoe_stream *s); /* joins the lanes first; NULL is fine */

/* Bytes one committed slot of streamed layer `layer` holds (its parts' aligned sub-slots, rounded to
 * pages): what the cache budget is charged per resident expert of that layer. 0 for no such layer. */
size_t stream_slot_bytes(const bmoe_stream *s, int layer);
/* The largest layer's slot (at least one page): the size of a shared slot. */
size_t stream_slot_max(const bmoe_stream *s);
/* The page the slot is rounded up to (the system page, at least BMOE_STREAM_ALIGN). */
size_t stream_page_bytes(const bmoe_stream *s);
int stream_shared_slots(const bmoe_stream *s);  /* S, or 0 for per-expert slots */
/* 1 while reads go through O_DIRECT/F_NOCACHE, 0 when off or refused by the filesystem. */
int stream_direct(const bmoe_stream *s);
/* When O_DIRECT was asked for but refused: a one-line explanation, else NULL. */
const char *stream_direct_note(const bmoe_stream *s);

/* Every byte the expert reads so far returned from the file (io_bytes_read). */
uint64_t stream_bytes_read(const bmoe_stream *s);

/* Frame pool figures (all 0 without a pool): frames created, frames committed to slots now, free
 * frames whose pages are kept. */
void stream_frames(const bmoe_stream *s, size_t *created, size_t *in_use, size_t *warm);

/* Commits slot `slot` of `layer` (per-expert layout: slot == e; shared: 0..S-1, layer ignored) and
 * queues the reads of expert e of `layer` into it, in group g at priority prio (io_lanes.h).
 * 0, or an exit code with err set (1: cannot commit memory or queue). */
int stream_load(bmoe_stream *s, int layer, int slot, int e, int prio, bmoe_io_group *g, char *err, size_t errlen);
/* Waits for g. 0, or 4 with a one-line message naming the shard, tensor, expert and offset. */
int stream_wait(bmoe_stream *s, bmoe_io_group *g, char *err, size_t errlen);
/* 1 while g has reads queued or running. */
int stream_busy(bmoe_stream *s, const bmoe_io_group *g);
/* Returns the slot's pages and removes access. The caller makes sure no read into it is pending. */
void stream_release(bmoe_stream *s, int layer, int slot);
/* Closes (PROT_NONE) the free frames released since the last call that no commit has taken since.
 * Until then a pointer kept into such a frame still reads it; the expert's own view faults at once.
 * The hook settles before it returns to the forward pass, so nothing computes in between. */
void stream_settle(bmoe_stream *s);
/* Once per forward pass (the hook calls it at the first streamed layer): returns the pages of free
 * frames, and closes them, while the frames held (in use and free, in bytes) exceed
 * max(frame_pool_bytes, the most bytes in use at once since the previous call); classes in the order
 * their first layer comes, the latest released frame first. No-op without a pool. */
void stream_trim(bmoe_stream *s);
int stream_committed(const bmoe_stream *s, int layer, int slot);

/* The addresses expert e's parts have in `slot` of `layer` (slot -1: the guard slot, shared layout
 * only). Nothing is checked or waited for: an uncommitted slot faults when touched. */
void stream_view(const bmoe_stream *s, int layer, int slot, int e, bmoe_expert_view *out);

/* File offset of part p of expert e in `layer` (what stream_load reads). */
uint64_t stream_expert_offset(const bmoe_stream *s, int layer, int e, int p);

#endif
