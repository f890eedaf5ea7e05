/* I/O lanes: N pthreads that execute positioned reads of expert slices into memory the caller owns.
 *
 * A read is a job; jobs belong to a group (the caller's unit of waiting, e.g. one expert). Two
 * priorities: demand reads (the layer being computed waits for them) are always taken before
 * speculative ones (prefetch), so speculation only ever runs on lanes that would otherwise be idle.
 *
 * Determinism: a job writes only its own destination range, and which lane runs it never changes
 * the bytes written, so the result is the same for any lane count (1..8).
 *
 * O_DIRECT: a job may carry a direct descriptor. The lane then reads the covering range aligned to
 * `align` (offset, length and destination), which the caller has laid out so that it fits. When the
 * kernel refuses the direct read (EINVAL: a filesystem or alignment it does not accept) the lane
 * reads the exact range through the buffered descriptor instead and remembers the refusal
 * (io_direct_refused), so the caller stops issuing direct reads. */
#ifndef BMOE_IO_LANES_H
#define BMOE_IO_LANES_H

#include <stddef.h>
#include <stdint.h>

typedef struct bmoe_io_lanes bmoe_io_lanes;

enum { BMOE_IO_DEMAND = 0, BMOE_IO_SPECULATIVE = 1 };

typedef struct bmoe_io_job {
    int fd_direct;        /* O_DIRECT (or F_NOCACHE) descriptor, -1 for none */
    int fd_buffered;      /* always valid */
    uint64_t off;         /* exact file offset of the slice */
    size_t len;           /* exact length of the slice */
    uint8_t *dst;         /* where the slice goes; for a direct read dst - (off % align) must be
                           * align-aligned with room for roundup(off % align + len, align) bytes */
    size_t align;         /* direct-I/O alignment (a power of two) */
    int tag;              /* the caller's id, reported with an error */
} bmoe_io_job;

/* The caller's unit of waiting. Zero-initialise; reusable once io_wait has returned. The fields are
 * written by the lanes under their lock and are the caller's to read after io_wait. */
typedef struct bmoe_io_group {
    int pending;          /* jobs queued or running */
    int failed;           /* the first failing job: */
    int err_errno;        /* errno of the read, or 0 for a short read (the file ended early) */
    int err_tag;
    uint64_t err_off;     /* the slice's offset and length, and how many bytes of it were read */
    size_t err_len, err_got;
} bmoe_io_group;

/* NULL on failure (out of memory or threads refused); n in 1..64. */
bmoe_io_lanes *io_create(int n);
/* Queues a copy of `job` in group g at `prio`. 0, or -1 when out of memory (nothing queued). */
int io_submit(bmoe_io_lanes *io, const bmoe_io_job *job, bmoe_io_group *g, int prio);
/* Blocks until every job of g has finished. 0, or -1 when one failed (g->failed and err_* set). */
int io_wait(bmoe_io_lanes *io, bmoe_io_group *g);
/* 1 while jobs of g are queued or running (does not block). */
int io_busy(bmoe_io_lanes *io, const bmoe_io_group *g);
/* 1 once a direct read has been refused with EINVAL (and redone through the buffered descriptor). */
int io_direct_refused(bmoe_io_lanes *io);
/* Every byte the finished reads returned from the file: a direct read's aligned covering range (its
 * padding included), a buffered read's slice. What read amplification is measured with. */
uint64_t io_bytes_read(bmoe_io_lanes *io);
int io_lanes_count(const bmoe_io_lanes *io);
/* Finishes the jobs being read, drops the queued ones (their groups are marked failed with
 * ECANCELED), and joins the threads: no lane touches memory after this returns. NULL is fine. */
void io_destroy(bmoe_io_lanes *io);

#endif
