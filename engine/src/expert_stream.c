/* Expert memory: reserved ranges, committed slots, positioned reads (see expert_stream.h). */
#include "expert_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Portability: MAP_NORESERVE is a Linux promise (elsewhere PROT_NONE alone keeps the range free);
 * macOS spells the anonymous flag MAP_ANON and has F_NOCACHE instead of O_DIRECT. */
#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0
#endif
#if !defined(MAP_ANONYMOUS) && defined(MAP_ANON)
#define MAP_ANONYMOUS MAP_ANON
#endif
#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif
/* Far beyond any real model, far below what a 64-bit address space holds; keeps every product exact. */
#define MAX_RANGE_BYTES ((uint64_t)1 << 46)
/* The transparent huge page size the expert memory is aligned to (x86_64 and arm64 with 4 KiB pages). */
#define HUGE_BYTES ((size_t)2 << 20)

/* The frames of one size: the frame pool keeps one class per distinct slot size (layers whose experts
 * differ in type or width have slots of different sizes); frame f of a class is
 * [arena + f * bytes, + bytes). */
typedef struct frame_class {
    size_t bytes;                     /* a frame: one slot of the class's layers */
    uint8_t *arena;
    size_t arena_frames;              /* every slot of the class's layers committed at once */
    size_t created;
    size_t preopened;                 /* frames [0, this) were opened read-write by stream_open */
    int *warm, *cold;                 /* free frames: pages kept / returned */
    size_t n_warm, n_cold;
    uint8_t *open;                    /* [arena_frames] 1 while the frame is read-write */
    size_t n_open_free;               /* warm frames still read-write: stream_settle closes them */
} frame_class;

struct bmoe_stream {
    int n_layers, n_expert, shared;
    bmoe_stream_part *parts;          /* [n_layers * BMOE_EXP_NPARTS] */
    uint32_t n_shards;
    char **paths;
    int *fd_buf, *fd_dir;
    int direct;                       /* direct descriptors open for every shard */
    char note[320];
    size_t *part_base;                /* [n_layers * BMOE_EXP_NPARTS] each part's sub-slot in its layer's slot */
    size_t *slot_bytes;               /* [n_layers] one slot of the layer */
    size_t slot_max;                  /* the largest; the stride of the shared slots */
    size_t page_bytes;                /* the slot rounding: the system page, at least BMOE_STREAM_ALIGN */
    int n_ranges;                     /* n_layers (per-expert) or 1 (shared) */
    size_t slots_per_range;           /* n_expert, or S + 1 (the last one is the guard) */
    uint8_t **range;
    uint8_t *committed;               /* [n_ranges * slots_per_range] */
    bmoe_io_lanes *io;
    /* the frame pool (n_classes > 0) */
    int n_classes;
    frame_class *cls;
    int *class_of;                    /* [n_layers] */
    uint64_t keep_bytes;              /* frame_pool_bytes */
    uint64_t bytes_in_use;            /* frames committed to slots, in bytes */
    uint64_t bytes_peak;              /* most bytes in use at once since the last stream_trim */
    size_t frames_in_use;
    int *frame_of;                    /* [n_ranges * slots_per_range] the slot's frame in its class, -1 */
};

static int fail(char *err, size_t errlen, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}

static int open_direct(const char *path) {
#if defined(O_DIRECT)
    return open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
#elif defined(F_NOCACHE)
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && fcntl(fd, F_NOCACHE, 1) == -1) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
#else
    (void)path;
    errno = EINVAL;
    return -1;
#endif
}

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Reserves len bytes of address space with no access. With `huge`, the range starts on a 2 MiB
 * boundary and asks for transparent huge pages: the pages a direct read lands in are then
 * physically contiguous in 2 MiB runs, and the kernel hands the device a few large segments instead
 * of one per 4 KiB page. On a VM's virtio disk that made O_DIRECT reads into a 64 MiB working set
 * about 1.4x faster (docs/benchmarks.md, huge pages). The advice is only a hint: a kernel without
 * THP ignores it and nothing else changes. NULL on failure (errno set). */
static uint8_t *reserve(size_t len, int huge) {
    size_t extra = huge ? HUGE_BYTES : 0;
    void *v = mmap(NULL, len + extra, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (v == MAP_FAILED) return NULL;
    uint8_t *p = v;
    if (!huge) return p;
    uint8_t *a = (uint8_t *)round_up((size_t)(uintptr_t)p, HUGE_BYTES);
    if (a > p) munmap(p, (size_t)(a - p));
    if (p + len + extra > a + len) munmap(a + len, (size_t)((p + len + extra) - (a + len)));
#if defined(MADV_HUGEPAGE)
    madvise(a, len, MADV_HUGEPAGE);
#endif
    return a;
}

uint64_t stream_expert_offset(const bmoe_stream *s, int layer, int e, int p) {
    const bmoe_stream_part *P = &s->parts[(size_t)layer * BMOE_EXP_NPARTS + (size_t)p];
#ifdef BMOE_FAULT_WRONG_OFFSET
    /* injected fault: every slot is filled from its neighbour's bytes (an off-by-one-expert offset) */
    e = (e + 1) % s->n_expert;
#endif
    return P->offset + (uint64_t)e * P->stride;
}

static size_t slot_index(const bmoe_stream *s, int layer, int slot) {
    if (s->shared) return (size_t)slot;
    return (size_t)layer * s->slots_per_range + (size_t)slot;
}

static size_t stride_of(const bmoe_stream *s, int layer) { return s->shared ? s->slot_max : s->slot_bytes[layer]; }

/* Where the slot's expert is: its frame when the pool gave it one, else the slot's own place in the
 * reserved range (committed without a pool; with a pool never committed, so it faults). */
static uint8_t *slot_addr(const bmoe_stream *s, int layer, int slot) {
    if (s->n_classes) {
        int f = s->frame_of[(size_t)layer * s->slots_per_range + (size_t)slot];
        if (f >= 0) {
            const frame_class *c = &s->cls[s->class_of[layer]];
            return c->arena + (size_t)f * c->bytes;
        }
    }
    return s->range[s->shared ? 0 : layer] + (size_t)slot * stride_of(s, layer);
}

/* The frame pool: one class per distinct slot size, each with an arena of a frame for every slot of
 * its layers; the frames the budget keeps (of each class, up to the budget) are opened together. */
static int pool_open(bmoe_stream *s, uint64_t keep, char *err, size_t errlen) {
    s->class_of = malloc((size_t)s->n_layers * sizeof *s->class_of);
    s->cls = calloc((size_t)s->n_layers, sizeof *s->cls);
    size_t n = (size_t)s->n_ranges * s->slots_per_range;
    s->frame_of = malloc(n * sizeof *s->frame_of);
    if (!s->class_of || !s->cls || !s->frame_of) return fail(err, errlen, 1, "out of memory");
    for (size_t i = 0; i < n; i++) s->frame_of[i] = -1;
    s->keep_bytes = keep;
    for (int l = 0; l < s->n_layers; l++) {
        int c = 0;
        while (c < s->n_classes && s->cls[c].bytes != s->slot_bytes[l]) c++;
        if (c == s->n_classes) s->cls[s->n_classes++].bytes = s->slot_bytes[l];
        s->class_of[l] = c;
        s->cls[c].arena_frames += s->slots_per_range;
    }
    for (int ci = 0; ci < s->n_classes; ci++) {
        frame_class *c = &s->cls[ci];
        c->warm = malloc(c->arena_frames * sizeof *c->warm);
        c->cold = malloc(c->arena_frames * sizeof *c->cold);
        c->open = calloc(c->arena_frames, 1);
        if (!c->warm || !c->cold || !c->open) return fail(err, errlen, 1, "out of memory");
        if ((uint64_t)c->arena_frames > MAX_RANGE_BYTES / c->bytes)
            return fail(err, errlen, 1, "expert frames of %zu bytes x %zu do not fit the address space", c->bytes,
                        c->arena_frames);
        c->arena = reserve(c->arena_frames * c->bytes, 1);
        if (!c->arena)
            return fail(err, errlen, 1, "cannot reserve %zu bytes of address space for the expert frames: %s",
                        c->arena_frames * c->bytes, strerror(errno));
        /* The frames the budget keeps are opened together, for the same reason as shared slots: a
         * frame not created yet holds no expert, so opening it early exposes nothing. */
        size_t k = (size_t)(keep / c->bytes);
        c->preopened = k < c->arena_frames ? k : c->arena_frames;
        if (c->preopened && mprotect(c->arena, c->preopened * c->bytes, PROT_READ | PROT_WRITE) != 0)
            return fail(err, errlen, 1, "cannot open %zu expert frames of %zu bytes: %s", c->preopened, c->bytes,
                        strerror(errno));
    }
    return 0;
}

int stream_open(const bmoe_stream_opts *o, bmoe_stream **out, char *err, size_t errlen) {
    *out = NULL;
    if (o->n_layers < 0 || o->n_expert < 1 || o->n_shards < 1 || o->io_lanes < 1 || o->shared_slots < 0)
        return fail(err, errlen, 1, "internal: bad stream options");
    bmoe_stream *s = calloc(1, sizeof *s);
    if (!s) return fail(err, errlen, 1, "out of memory");
    int rc = 0;
    s->n_layers = o->n_layers;
    s->n_expert = o->n_expert;
    s->shared = o->shared_slots > 0;
    s->n_shards = o->n_shards;
    size_t np = (size_t)(o->n_layers > 0 ? o->n_layers : 1) * BMOE_EXP_NPARTS;
    s->parts = calloc(np, sizeof *s->parts);
    s->paths = calloc(o->n_shards, sizeof *s->paths);
    s->fd_buf = malloc(o->n_shards * sizeof *s->fd_buf);
    s->fd_dir = malloc(o->n_shards * sizeof *s->fd_dir);
    if (!s->parts || !s->paths || !s->fd_buf || !s->fd_dir) { rc = fail(err, errlen, 1, "out of memory"); goto fail; }
    if (o->n_layers > 0) memcpy(s->parts, o->parts, (size_t)o->n_layers * BMOE_EXP_NPARTS * sizeof *s->parts);
    for (uint32_t i = 0; i < o->n_shards; i++) s->fd_buf[i] = s->fd_dir[i] = -1;

    /* descriptors: buffered always, direct when asked and the filesystem accepts it */
    s->direct = o->odirect != 0;
    for (uint32_t i = 0; i < o->n_shards; i++) {
        s->paths[i] = strdup(o->shard_paths[i]);
        if (!s->paths[i]) { rc = fail(err, errlen, 1, "out of memory"); goto fail; }
        s->fd_buf[i] = open(s->paths[i], O_RDONLY | O_CLOEXEC);
        if (s->fd_buf[i] < 0) { rc = fail(err, errlen, 4, "%s: cannot open for expert reads: %s", s->paths[i], strerror(errno)); goto fail; }
        if (!s->direct) continue;
        s->fd_dir[i] = open_direct(s->paths[i]);
        if (s->fd_dir[i] < 0) {
            snprintf(s->note, sizeof s->note, "O_DIRECT refused for %s (%s): expert reads go through the page cache",
                     s->paths[i], strerror(errno));
            s->direct = 0;
        }
    }
    if (!s->direct)
        for (uint32_t i = 0; i < o->n_shards; i++)
            if (s->fd_dir[i] >= 0) { close(s->fd_dir[i]); s->fd_dir[i] = -1; }

    /* slot geometry, per layer: each part's sub-slot has room for its slice at any in-block offset */
    const size_t A = BMOE_STREAM_ALIGN;
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    if (page < A) page = A;
    s->page_bytes = page;
    size_t nl = (size_t)(o->n_layers > 0 ? o->n_layers : 1);
    s->part_base = calloc(nl * BMOE_EXP_NPARTS, sizeof *s->part_base);
    s->slot_bytes = calloc(nl, sizeof *s->slot_bytes);
    if (!s->part_base || !s->slot_bytes) { rc = fail(err, errlen, 1, "out of memory"); goto fail; }
    s->slot_max = page;
    for (int l = 0; l < o->n_layers; l++) {
        uint64_t total = 0;
        for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
            const bmoe_stream_part *P = &s->parts[(size_t)l * BMOE_EXP_NPARTS + (size_t)p];
            s->part_base[(size_t)l * BMOE_EXP_NPARTS + (size_t)p] = (size_t)total;
            if (!P->present) continue;
            if (P->shard >= o->n_shards || P->bytes == 0 || P->bytes > MAX_RANGE_BYTES) {
                rc = fail(err, errlen, 3, "%s: expert tensor layout out of range", P->name ? P->name : "?");
                goto fail;
            }
            total += round_up((size_t)P->bytes + A - 1, A);
        }
        s->slot_bytes[l] = round_up((size_t)(total ? total : A), page);
        if (s->slot_bytes[l] > s->slot_max) s->slot_max = s->slot_bytes[l];
    }
    s->n_ranges = s->shared ? 1 : o->n_layers;
    s->slots_per_range = s->shared ? (size_t)o->shared_slots + 1 : (size_t)o->n_expert;
    if ((uint64_t)s->slots_per_range > MAX_RANGE_BYTES / s->slot_max) {
        rc = fail(err, errlen, 1, "expert slots of %zu bytes x %zu do not fit the address space", s->slot_max,
                  s->slots_per_range);
        goto fail;
    }
    s->range = calloc((size_t)(s->n_ranges > 0 ? s->n_ranges : 1), sizeof *s->range);
    s->committed = calloc((size_t)(s->n_ranges > 0 ? s->n_ranges : 1) * s->slots_per_range, 1);
    if (!s->range || !s->committed) { rc = fail(err, errlen, 1, "out of memory"); goto fail; }
    for (int r = 0; r < s->n_ranges; r++) {
        size_t range_bytes = s->slots_per_range * stride_of(s, r);
        uint8_t *p = reserve(range_bytes, s->shared);
        if (!p) {
            rc = fail(err, errlen, 1, "cannot reserve %zu bytes of address space for the experts of layer %d: %s",
                      range_bytes, r, strerror(errno));
            goto fail;
        }
        s->range[r] = p;
    }
    /* Shared slots are reused by every layer and never released: they are opened together now, so
     * that their pages can be huge ones (a huge page needs its whole 2 MiB inside one read-write
     * mapping; slots opened one by one would leave every boundary in 4 KiB pages). The guard slot
     * after them stays closed. Memory is still only taken when a read touches it. */
    if (s->shared && mprotect(s->range[0], (size_t)o->shared_slots * s->slot_max, PROT_READ | PROT_WRITE) != 0) {
        rc = fail(err, errlen, 1, "cannot open %d expert slots of %zu bytes: %s", o->shared_slots, s->slot_max,
                  strerror(errno));
        goto fail;
    }
    if (!s->shared && o->frame_pool_bytes > 0 && s->n_ranges > 0 && (rc = pool_open(s, o->frame_pool_bytes, err, errlen)))
        goto fail;
    s->io = io_create(o->io_lanes);
    if (!s->io) { rc = fail(err, errlen, 1, "cannot start %d I/O lanes (--io-threads)", o->io_lanes); goto fail; }
    *out = s;
    return 0;
fail:
    stream_close(s);
    return rc ? rc : 1;
}

void stream_close(bmoe_stream *s) {
    if (!s) return;
    io_destroy(s->io); /* no lane writes into a slot after this */
    if (s->range)
        for (int r = 0; r < s->n_ranges; r++)
            if (s->range[r]) munmap(s->range[r], s->slots_per_range * stride_of(s, r));
    for (int ci = 0; s->cls && ci < s->n_classes; ci++) {
        frame_class *c = &s->cls[ci];
        if (c->arena) munmap(c->arena, c->arena_frames * c->bytes);
        free(c->warm);
        free(c->cold);
        free(c->open);
    }
    free(s->cls);
    free(s->class_of);
    free(s->frame_of);
    for (uint32_t i = 0; s->fd_buf && i < s->n_shards; i++) {
        if (s->fd_buf[i] >= 0) close(s->fd_buf[i]);
        if (s->fd_dir && s->fd_dir[i] >= 0) close(s->fd_dir[i]);
    }
    for (uint32_t i = 0; s->paths && i < s->n_shards; i++) free(s->paths[i]);
    free(s->paths);
    free(s->fd_buf);
    free(s->fd_dir);
    free(s->range);
    free(s->committed);
    free(s->part_base);
    free(s->slot_bytes);
    free(s->parts);
    free(s);
}

size_t stream_slot_bytes(const bmoe_stream *s, int layer) {
    return layer >= 0 && layer < s->n_layers ? s->slot_bytes[layer] : 0;
}
size_t stream_slot_max(const bmoe_stream *s) { return s->slot_max; }
size_t stream_page_bytes(const bmoe_stream *s) { return s->page_bytes; }
int stream_shared_slots(const bmoe_stream *s) { return s->shared ? (int)s->slots_per_range - 1 : 0; }
int stream_direct(const bmoe_stream *s) { return s->direct && !io_direct_refused(s->io); }

const char *stream_direct_note(const bmoe_stream *s) {
    bmoe_stream *m = (bmoe_stream *)s; /* the note is filled lazily from the lanes' state */
    if (!m->note[0] && m->direct && io_direct_refused(m->io))
        snprintf(m->note, sizeof m->note, "O_DIRECT reads refused (EINVAL) for %s: expert reads go through the page cache",
                 m->paths[0]);
    return m->note[0] ? m->note : NULL;
}

/* ---- the frame pool ------------------------------------------------------------------------------ */

/* Gives the slot (of `layer`) a frame of its class and opens it read-write: a warm frame (its pages
 * are still there) first, then one whose pages were returned, then a frame never used (its pages are
 * faulted in, zeroed, by the first read). A warm frame released since the last stream_settle is still
 * open: it is reused as it is, with no protection change (and so no write fault per page in the
 * read). 0, or -1 with errno. */
static int frame_commit(bmoe_stream *s, int layer, size_t si) {
    frame_class *c = &s->cls[s->class_of[layer]];
    int f, fresh = 0;
    if (c->n_warm) f = c->warm[--c->n_warm];
    else if (c->n_cold) f = c->cold[--c->n_cold];
    else if (c->created < c->arena_frames) f = (int)c->created++, fresh = 1;
    else {
        errno = ENOMEM; /* cannot happen: there is a frame for every slot */
        return -1;
    }
    if (c->open[f]) {
        c->n_open_free--;
    } else if (!(fresh && (size_t)f < c->preopened) && /* stream_open opened it */
               mprotect(c->arena + (size_t)f * c->bytes, c->bytes, PROT_READ | PROT_WRITE) != 0) {
        int e = errno;
        c->cold[c->n_cold++] = f;
        errno = e;
        return -1;
    }
    c->open[f] = 1;
    s->frame_of[si] = f;
    s->frames_in_use++;
    s->bytes_in_use += c->bytes;
    if (s->bytes_in_use > s->bytes_peak) s->bytes_peak = s->bytes_in_use;
    return 0;
}

/* Returns a free frame's pages and closes it (the frame goes to the cold list). */
static void frame_return(frame_class *c, int f) {
    uint8_t *fb = c->arena + (size_t)f * c->bytes;
#if defined(MADV_DONTNEED)
    madvise(fb, c->bytes, MADV_DONTNEED);
#endif
    mprotect(fb, c->bytes, PROT_NONE);
    c->open[f] = 0;
    c->cold[c->n_cold++] = f;
}

/* Takes the slot's frame away: the expert's address is the slot's reserved, never-committed range
 * again, at once. The frame keeps its pages and is closed (PROT_NONE) by the next stream_settle
 * unless a commit took it first. Frames beyond the budget are returned by stream_trim, once a pass,
 * not here: a pass that pins more than the budget (the next layer's misses read while this layer's
 * experts are in use) would otherwise return pages at every release and fault fresh ones in at the
 * next commit, over and over. */
static void frame_release(bmoe_stream *s, int layer, size_t si) {
    int f = s->frame_of[si];
    s->frame_of[si] = -1;
    if (f < 0) return;
    frame_class *c = &s->cls[s->class_of[layer]];
    s->frames_in_use--;
    s->bytes_in_use -= c->bytes;
    c->warm[c->n_warm++] = f;
    c->n_open_free++;
}

void stream_trim(bmoe_stream *s) {
    if (!s->n_classes) return;
    uint64_t hold = s->keep_bytes > s->bytes_peak ? s->keep_bytes : s->bytes_peak, warm = 0;
    for (int ci = 0; ci < s->n_classes; ci++) warm += (uint64_t)s->cls[ci].n_warm * s->cls[ci].bytes;
    /* warm frames are returned class by class, the latest released first, while the frames held
     * (in use and warm) exceed max(the budget, the last pass's peak) */
    for (int ci = 0; ci < s->n_classes; ci++) {
        frame_class *c = &s->cls[ci];
        while (c->n_warm > 0 && s->bytes_in_use + warm > hold) {
            int f = c->warm[--c->n_warm];
            if (c->open[f]) c->n_open_free--;
            frame_return(c, f);
            warm -= c->bytes;
        }
    }
    s->bytes_peak = s->bytes_in_use;
}

void stream_settle(bmoe_stream *s) {
    for (int ci = 0; ci < s->n_classes; ci++) {
        frame_class *c = &s->cls[ci];
        for (size_t i = c->n_warm; c->n_open_free > 0 && i-- > 0;) {
            int f = c->warm[i];
            if (!c->open[f]) continue;
            mprotect(c->arena + (size_t)f * c->bytes, c->bytes, PROT_NONE);
            c->open[f] = 0;
            c->n_open_free--;
        }
    }
}

uint64_t stream_bytes_read(const bmoe_stream *s) { return io_bytes_read(s->io); }

int stream_load(bmoe_stream *s, int layer, int slot, int e, int prio, bmoe_io_group *g, char *err, size_t errlen) {
    if (layer < 0 || layer >= s->n_layers || e < 0 || e >= s->n_expert || slot < 0 ||
        (size_t)slot >= s->slots_per_range - (s->shared ? 1 : 0))
        return fail(err, errlen, 1, "internal: expert load out of range (layer %d slot %d expert %d)", layer, slot, e);
    size_t si = slot_index(s, layer, slot);
    if (!s->committed[si]) {
        int rc = s->n_classes ? frame_commit(s, layer, si)
                              : mprotect(slot_addr(s, layer, slot), stride_of(s, layer), PROT_READ | PROT_WRITE);
        if (rc != 0)
            return fail(err, errlen, 1, "cannot commit %zu bytes for an expert slot: %s", stride_of(s, layer),
                        strerror(errno));
        s->committed[si] = 1;
    }
    uint8_t *base = slot_addr(s, layer, slot);
    int direct = stream_direct(s);
    for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
        const bmoe_stream_part *P = &s->parts[(size_t)layer * BMOE_EXP_NPARTS + (size_t)p];
        if (!P->present) continue;
        uint64_t off = stream_expert_offset(s, layer, e, p);
        bmoe_io_job j = {
            .fd_direct = direct ? s->fd_dir[P->shard] : -1,
            .fd_buffered = s->fd_buf[P->shard],
            .off = off,
            .len = (size_t)P->bytes,
            .dst = base + s->part_base[(size_t)layer * BMOE_EXP_NPARTS + (size_t)p] + (size_t)(off % BMOE_STREAM_ALIGN),
            .align = BMOE_STREAM_ALIGN,
            .tag = (layer * s->n_expert + e) * BMOE_EXP_NPARTS + p,
        };
        if (io_submit(s->io, &j, g, prio) != 0) return fail(err, errlen, 1, "out of memory queueing an expert read");
    }
    return 0;
}

int stream_wait(bmoe_stream *s, bmoe_io_group *g, char *err, size_t errlen) {
    if (io_wait(s->io, g) == 0) return 0;
    int tag = g->err_tag;
    int p = tag % BMOE_EXP_NPARTS, e = (tag / BMOE_EXP_NPARTS) % s->n_expert, layer = tag / BMOE_EXP_NPARTS / s->n_expert;
    const bmoe_stream_part *P = &s->parts[(size_t)layer * BMOE_EXP_NPARTS + (size_t)p];
    const char *path = s->paths[P->shard];
    const char *name = P->name ? P->name : "expert tensor";
    if (g->err_errno)
        return fail(err, errlen, 4, "%s: cannot read %s expert %d (%zu bytes at offset %llu): %s", path, name, e,
                    g->err_len, (unsigned long long)g->err_off, strerror(g->err_errno));
    return fail(err, errlen, 4, "%s: %s expert %d: the file ends after %zu of its %zu bytes at offset %llu (truncated "
                "since the model was opened?)", path, name, e, g->err_got, g->err_len, (unsigned long long)g->err_off);
}

int stream_busy(bmoe_stream *s, const bmoe_io_group *g) { return io_busy(s->io, g); }

void stream_release(bmoe_stream *s, int layer, int slot) {
    size_t si = slot_index(s, layer, slot);
    if (!s->committed[si]) return;
    s->committed[si] = 0;
    if (s->n_classes) {
        frame_release(s, layer, si);
        return;
    }
    uint8_t *base = slot_addr(s, layer, slot);
#if defined(MADV_DONTNEED)
    madvise(base, stride_of(s, layer), MADV_DONTNEED);
#endif
    mprotect(base, stride_of(s, layer), PROT_NONE);
}

void stream_frames(const bmoe_stream *s, size_t *created, size_t *in_use, size_t *warm) {
    *created = *warm = 0;
    for (int ci = 0; ci < s->n_classes; ci++) {
        *created += s->cls[ci].created;
        *warm += s->cls[ci].n_warm;
    }
    *in_use = s->frames_in_use;
}

int stream_committed(const bmoe_stream *s, int layer, int slot) {
    if (slot < 0 || (size_t)slot >= s->slots_per_range || (!s->shared && (layer < 0 || layer >= s->n_layers))) return 0;
    return s->committed[slot_index(s, layer, slot)];
}

void stream_view(const bmoe_stream *s, int layer, int slot, int e, bmoe_expert_view *out) {
    memset(out, 0, sizeof *out);
    if (layer < 0 || layer >= s->n_layers || e < 0 || e >= s->n_expert) return;
    if (slot < 0) slot = s->shared ? (int)s->slots_per_range - 1 : e; /* the guard slot (never committed) */
    const uint8_t *base = slot_addr(s, layer, slot);
    const void **dst[BMOE_EXP_NPARTS] = { &out->gate, &out->up, &out->gate_up, &out->down };
    for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
        const bmoe_stream_part *P = &s->parts[(size_t)layer * BMOE_EXP_NPARTS + (size_t)p];
        if (!P->present) continue;
        *dst[p] = base + s->part_base[(size_t)layer * BMOE_EXP_NPARTS + (size_t)p] +
                  (size_t)(stream_expert_offset(s, layer, e, p) % BMOE_STREAM_ALIGN);
    }
}
