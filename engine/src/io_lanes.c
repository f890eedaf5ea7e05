/* I/O lanes (see io_lanes.h): a mutex, two FIFO queues (demand, speculative), N reader threads. */
#include "io_lanes.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct node {
    bmoe_io_job job;
    bmoe_io_group *group;
    struct node *next;
} node;

typedef struct { node *head, *tail; } fifo;

struct bmoe_io_lanes {
    pthread_mutex_t mu;
    pthread_cond_t work;   /* a job was queued, or stop */
    pthread_cond_t done;   /* a group's last job finished */
    fifo q[2];             /* BMOE_IO_DEMAND, BMOE_IO_SPECULATIVE */
    node *free_nodes;
    int stop;
    int direct_refused;
    uint64_t bytes_read;   /* what the reads returned from the file, padding included */
    int n;
    int started;
    pthread_t *threads;
};

static void push(fifo *f, node *x) {
    x->next = NULL;
    if (f->tail) f->tail->next = x;
    else f->head = x;
    f->tail = x;
}

static node *pop(fifo *f) {
    node *x = f->head;
    if (x) {
        f->head = x->next;
        if (!f->head) f->tail = NULL;
    }
    return x;
}

/* Reads [off, off + len) of fd into dst until at least `need` bytes are in, the file ends, or an
 * error. *got = bytes read. Returns 0 or an errno. For a direct read a short block means the end of
 * the file (the next offset would not be aligned), so it stops there. */
static int read_range(int fd, uint8_t *dst, size_t len, uint64_t off, size_t need, int direct, size_t align,
                      size_t *got) {
    size_t done = 0;
    while (done < need) {
        ssize_t r = pread(fd, dst + done, len - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            *got = done;
            return errno ? errno : EIO;
        }
        if (r == 0) break;
        done += (size_t)r;
        if (direct && done % align != 0) break;
    }
    *got = done;
    return 0;
}

/* Runs one job. Returns 0, or an errno (-1 when the file ended before the slice did). *got is the
 * slice's bytes that were read; *raw every byte the reads returned (a direct read's padding included). */
static int run_job(bmoe_io_lanes *io, const bmoe_io_job *j, size_t *got, size_t *raw) {
    *raw = 0;
    if (j->fd_direct >= 0) {
        size_t pad = (size_t)(j->off & (uint64_t)(j->align - 1));
        size_t need = pad + j->len;
        size_t alen = (need + j->align - 1) & ~(j->align - 1);
        size_t g = 0;
        int rc = read_range(j->fd_direct, j->dst - pad, alen, j->off - pad, need, 1, j->align, &g);
        *raw = g;
        if (rc == 0) {
            *got = g > pad ? (g - pad < j->len ? g - pad : j->len) : 0;
            return g >= need ? 0 : -1;
        }
        if (rc != EINVAL) {
            *got = g > pad ? g - pad : 0;
            return rc;
        }
        pthread_mutex_lock(&io->mu);
        io->direct_refused = 1;
        pthread_mutex_unlock(&io->mu);
    }
    int rc = read_range(j->fd_buffered, j->dst, j->len, j->off, j->len, 0, 1, got);
    *raw += *got;
    if (rc) return rc;
    return *got >= j->len ? 0 : -1;
}

static void finish(bmoe_io_lanes *io, node *x, int rc, size_t got, size_t raw) {
    bmoe_io_group *g = x->group;
    io->bytes_read += raw;
    if (rc && !g->failed) {
        g->failed = 1;
        g->err_errno = rc > 0 ? rc : 0;
        g->err_tag = x->job.tag;
        g->err_off = x->job.off;
        g->err_len = x->job.len;
        g->err_got = got;
    }
    if (--g->pending == 0) pthread_cond_broadcast(&io->done);
    x->next = io->free_nodes;
    io->free_nodes = x;
}

static void *lane(void *arg) {
    bmoe_io_lanes *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        node *x = NULL;
        while (!io->stop && !(x = pop(&io->q[BMOE_IO_DEMAND])) && !(x = pop(&io->q[BMOE_IO_SPECULATIVE])))
            pthread_cond_wait(&io->work, &io->mu);
        if (!x) break; /* stop */
        pthread_mutex_unlock(&io->mu);
        size_t got = 0, raw = 0;
        int rc = run_job(io, &x->job, &got, &raw);
        pthread_mutex_lock(&io->mu);
        finish(io, x, rc, got, raw);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

bmoe_io_lanes *io_create(int n) {
    if (n < 1 || n > 64) return NULL;
    bmoe_io_lanes *io = calloc(1, sizeof *io);
    if (!io) return NULL;
    io->threads = calloc((size_t)n, sizeof *io->threads);
    if (!io->threads || pthread_mutex_init(&io->mu, NULL) != 0) {
        free(io->threads);
        free(io);
        return NULL;
    }
    pthread_cond_init(&io->work, NULL);
    pthread_cond_init(&io->done, NULL);
    io->n = n;
    for (int i = 0; i < n; i++) {
        if (pthread_create(&io->threads[i], NULL, lane, io) != 0) {
            io_destroy(io);
            return NULL;
        }
        io->started++;
    }
    return io;
}

int io_submit(bmoe_io_lanes *io, const bmoe_io_job *job, bmoe_io_group *g, int prio) {
    pthread_mutex_lock(&io->mu);
    node *x = io->free_nodes;
    if (x) io->free_nodes = x->next;
    else x = malloc(sizeof *x);
    if (!x) {
        pthread_mutex_unlock(&io->mu);
        return -1;
    }
    x->job = *job;
    x->group = g;
    g->pending++;
    push(&io->q[prio == BMOE_IO_SPECULATIVE ? BMOE_IO_SPECULATIVE : BMOE_IO_DEMAND], x);
    pthread_cond_signal(&io->work);
    pthread_mutex_unlock(&io->mu);
    return 0;
}

int io_wait(bmoe_io_lanes *io, bmoe_io_group *g) {
    pthread_mutex_lock(&io->mu);
    /* a speculative job this group waits for is now demand: move it ahead of other speculation */
    if (g->pending > 0) {
        fifo keep = { NULL, NULL }, *sq = &io->q[BMOE_IO_SPECULATIVE];
        node *x;
        while ((x = pop(sq))) push(x->group == g ? &io->q[BMOE_IO_DEMAND] : &keep, x);
        *sq = keep;
    }
    while (g->pending > 0) pthread_cond_wait(&io->done, &io->mu);
    int failed = g->failed;
    pthread_mutex_unlock(&io->mu);
    return failed ? -1 : 0;
}

int io_busy(bmoe_io_lanes *io, const bmoe_io_group *g) {
    pthread_mutex_lock(&io->mu);
    int busy = g->pending > 0;
    pthread_mutex_unlock(&io->mu);
    return busy;
}

int io_direct_refused(bmoe_io_lanes *io) {
    pthread_mutex_lock(&io->mu);
    int r = io->direct_refused;
    pthread_mutex_unlock(&io->mu);
    return r;
}

uint64_t io_bytes_read(bmoe_io_lanes *io) {
    pthread_mutex_lock(&io->mu);
    uint64_t n = io->bytes_read;
    pthread_mutex_unlock(&io->mu);
    return n;
}

int io_lanes_count(const bmoe_io_lanes *io) { return io->n; }

void io_destroy(bmoe_io_lanes *io) {
    if (!io) return;
    pthread_mutex_lock(&io->mu);
    io->stop = 1;
    for (int p = 0; p < 2; p++) {
        node *x;
        while ((x = pop(&io->q[p]))) finish(io, x, ECANCELED, 0, 0);
    }
    pthread_cond_broadcast(&io->work);
    pthread_mutex_unlock(&io->mu);
    for (int i = 0; i < io->started; i++) pthread_join(io->threads[i], NULL);
    node *x = io->free_nodes;
    while (x) {
        node *nx = x->next;
        free(x);
        x = nx;
    }
    pthread_cond_destroy(&io->work);
    pthread_cond_destroy(&io->done);
    pthread_mutex_destroy(&io->mu);
    free(io->threads);
    free(io);
}
