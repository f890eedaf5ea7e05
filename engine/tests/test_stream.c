/* Expert streaming: the expert store (slots, O_DIRECT and buffered reads, I/O lanes, release),
 * and the stream hook driven node by node with a hand-built model (counters, residency, the policy
 * plug with a deferred load, the route trace, prefetch).
 *
 * "Touching a released or never-loaded slot faults" is checked in a forked child that restores the
 * default SIGSEGV/SIGBUS handlers (ASan would otherwise catch the fault and exit with a status). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "expert_stream.h"
#include "io_lanes.h"
#include "model.h"
#include "stream_hook.h"

/* ---- a data file whose every byte says where it is ---- */
static uint8_t byte_at(uint64_t x) { return (uint8_t)((x * 2654435761u) >> 13); }

static int make_file(char *path, size_t size) {
    strcpy(path, "/tmp/bmoe_stream_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    uint8_t *b = malloc(size);
    for (size_t i = 0; i < size; i++) b[i] = byte_at(i);
    int ok = write(fd, b, size) == (ssize_t)size;
    free(b);
    close(fd);
    return ok ? 0 : -1;
}

/* 2 layers x 5 experts x (gate, up, down); layer l lives in shard l, at unaligned offsets */
#define NL 2
#define NE 5
#define FILE_SIZE (3u << 20)
/* big enough down slices that a 1 MiB cache holds exactly three expert slots */
static const uint64_t PART_BYTES[BMOE_EXP_NPARTS] = { 3000, 3000, 0, 300004 };
#define EXPERT_BYTES (3000 + 3000 + 300004)
/* The down slice of each layer: PART_BYTES' unless a test makes the layers differ (a mixed-type
 * model: Q6_K down projections in one layer, Q4_K in the other, are 210 / 144 times apart). */
static uint64_t g_down[NL] = { 300004, 300004 };
#define MIXED_DOWN 450004

static void layout(bmoe_stream_part *parts) {
    memset(parts, 0, sizeof(bmoe_stream_part) * NL * BMOE_EXP_NPARTS);
    for (int l = 0; l < NL; l++) {
        uint64_t off = 4096 + 123 + (uint64_t)l * 8;
        for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
            uint64_t bytes = p == BMOE_EXP_DOWN ? g_down[l] : PART_BYTES[p];
            if (!bytes) continue;
            bmoe_stream_part *P = &parts[l * BMOE_EXP_NPARTS + p];
            P->present = 1;
            P->shard = (uint32_t)l;
            P->offset = off;
            P->stride = bytes;
            P->bytes = bytes;
            P->name = p == 0 ? "gate" : p == 1 ? "up" : "down";
            off += NE * bytes + 36;
        }
    }
}

/* docs/streaming.md, slot geometry: per part roundup(bytes + 4095, 4096), the slot rounded to a page */
static size_t slot_of(uint64_t down) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), a = 4096, t = 0;
    if (page < a) page = a;
    uint64_t b[3] = { 3000, 3000, down };
    for (int i = 0; i < 3; i++) t += (size_t)((b[i] + 4095 + a - 1) / a * a);
    return (t + page - 1) / page * page;
}

static int view_matches(const bmoe_stream_part *parts, int l, int e, const bmoe_expert_view *v) {
    const void *ptr[BMOE_EXP_NPARTS] = { v->gate, v->up, v->gate_up, v->down };
    for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
        const bmoe_stream_part *P = &parts[l * BMOE_EXP_NPARTS + p];
        if (!P->present) { if (ptr[p]) return 0; continue; }
        const uint8_t *b = ptr[p];
        if (!b) return 0;
        uint64_t off = P->offset + (uint64_t)e * P->stride;
        for (uint64_t i = 0; i < P->bytes; i++)
            if (b[i] != byte_at(off + i)) return 0;
    }
    return 1;
}

/* 1 when reading *p in a child process kills it with SIGSEGV or SIGBUS */
static int touch_faults(const volatile uint8_t *p) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        volatile uint8_t x = *p;
        (void)x;
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return 0;
    return WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS);
}

static void test_store(const char *f0, const char *f1) {
    bmoe_stream_part parts[NL * BMOE_EXP_NPARTS];
    layout(parts);
    const char *paths[2] = { f0, f1 };
    for (int pool = 0; pool <= 1; pool++)
    for (int direct = 0; direct <= 1; direct++)
        for (int lanes = 1; lanes <= 4; lanes += 3) {
            /* pool: a frame pool of about three slots (the rest of this test holds for both) */
            bmoe_stream_opts o = { NL, NE, parts, 2, paths, 0, direct, lanes, pool ? (uint64_t)1 << 20 : 0 };
            bmoe_stream *s = NULL;
            char err[512] = "";
            CHECK(stream_open(&o, &s, err, sizeof err) == 0);
            if (!s) { fprintf(stderr, "%s\n", err); continue; }
            if (direct && !stream_direct(s)) printf("test_stream: note: %s\n", stream_direct_note(s));
            CHECK(stream_slot_bytes(s, 0) % BMOE_STREAM_ALIGN == 0 && stream_slot_bytes(s, 1) == stream_slot_bytes(s, 0));
            CHECK(stream_slot_bytes(s, 0) >= EXPERT_BYTES && stream_slot_bytes(s, 0) == slot_of(300004));
            CHECK(stream_slot_bytes(s, 2) == 0 && stream_slot_max(s) == stream_slot_bytes(s, 0));
            bmoe_io_group g[NL][NE];
            memset(g, 0, sizeof g);
            for (int l = 0; l < NL; l++)
                for (int e = 0; e < NE; e++)
                    CHECK(stream_load(s, l, e, e, e % 2 ? BMOE_IO_SPECULATIVE : BMOE_IO_DEMAND, &g[l][e], err, sizeof err) == 0);
            int all = 1;
            for (int l = 0; l < NL; l++)
                for (int e = 0; e < NE; e++) {
                    all &= stream_wait(s, &g[l][e], err, sizeof err) == 0;
                    bmoe_expert_view v;
                    stream_view(s, l, e, e, &v);
                    all &= view_matches(parts, l, e, &v);
                    all &= (uintptr_t)v.gate % 4 == (parts[l * BMOE_EXP_NPARTS].offset + (uint64_t)e * 3000) % 4;
                }
            CHECK(all);
            /* release: pages gone, access removed; the bytes cannot be read stale */
            bmoe_expert_view v;
            stream_view(s, 1, 3, 3, &v);
            CHECK(!touch_faults(v.down));
            stream_release(s, 1, 3);
            stream_settle(s); /* what the hook does before it returns to the forward pass */
            CHECK(!stream_committed(s, 1, 3));
            CHECK(touch_faults(v.down));
            CHECK(touch_faults(v.gate));
            /* committing again reads it again */
            memset(&g[1][3], 0, sizeof g[1][3]);
            CHECK(stream_load(s, 1, 3, 3, BMOE_IO_DEMAND, &g[1][3], err, sizeof err) == 0);
            CHECK(stream_wait(s, &g[1][3], err, sizeof err) == 0);
            stream_view(s, 1, 3, 3, &v);
            CHECK(view_matches(parts, 1, 3, &v));
            stream_close(s);
        }

    /* shared slots: two slots for every layer; the guard slot is never committed */
    bmoe_stream_opts o = { NL, NE, parts, 2, paths, 2, 1, 2, 0 };
    bmoe_stream *s = NULL;
    char err[512];
    CHECK(stream_open(&o, &s, err, sizeof err) == 0 && stream_shared_slots(s) == 2);
    bmoe_io_group g = {0};
    CHECK(stream_load(s, 0, 1, 4, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    bmoe_expert_view v;
    stream_view(s, 0, 1, 4, &v);
    CHECK(view_matches(parts, 0, 4, &v));
    CHECK(stream_load(s, 1, 1, 2, BMOE_IO_DEMAND, &g, err, sizeof err) == 0); /* same slot, next layer */
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    stream_view(s, 1, 1, 2, &v);
    CHECK(view_matches(parts, 1, 2, &v));
    stream_view(s, 1, -1, 2, &v);
    CHECK(touch_faults(v.gate));
    CHECK(stream_load(s, 0, 2, 0, BMOE_IO_DEMAND, &g, err, sizeof err) == 1); /* the guard is not loadable */
    stream_close(s);
}

/* A shard cut short after the store opened it: a clean error naming the file, tensor and expert. */
/* The frame pool: frames are recycled across slots (no new frame while a free one exists), an
 * evicted expert's view faults even while its old frame holds another expert, a pointer kept into a
 * free frame faults, the reused frame holds exactly the new expert's slices, and free frames beyond
 * the budget are kept while a pass's peak needs them and returned by the trim after a pass that did
 * not. */
static void test_frame_pool(const char *f0, const char *f1) {
    bmoe_stream_part parts[NL * BMOE_EXP_NPARTS];
    layout(parts);
    const char *paths[2] = { f0, f1 };
    bmoe_stream_opts probe = { NL, NE, parts, 2, paths, 0, 1, 2, 0 };
    bmoe_stream *s = NULL;
    char err[512] = "";
    CHECK(stream_open(&probe, &s, err, sizeof err) == 0);
    if (!s) return;
    size_t slot = stream_slot_bytes(s, 0), created = 9, in_use = 9, warm = 9;
    stream_frames(s, &created, &in_use, &warm);
    CHECK(created == 0 && in_use == 0 && warm == 0); /* no pool asked for */
    stream_close(s);

    bmoe_stream_opts o = { NL, NE, parts, 2, paths, 0, 1, 2, 2 * (uint64_t)slot };
    s = NULL;
    CHECK(stream_open(&o, &s, err, sizeof err) == 0);
    if (!s) return;
    bmoe_io_group g = { 0 };
    bmoe_expert_view v0, v1, v2;
    for (int e = 0; e < 3; e++) CHECK(stream_load(s, 0, e, e, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    stream_frames(s, &created, &in_use, &warm);
    CHECK(created == 3 && in_use == 3 && warm == 0);
    stream_view(s, 0, 0, 0, &v0);
    stream_view(s, 0, 1, 1, &v1);
    CHECK(view_matches(parts, 0, 0, &v0) && view_matches(parts, 0, 1, &v1));
    stream_release(s, 0, 0);
    stream_release(s, 0, 1);
    /* the evicted experts' own views fault at once */
    stream_view(s, 0, 0, 0, &v2);
    CHECK(touch_faults(v2.gate));
    stream_view(s, 0, 1, 1, &v2);
    CHECK(touch_faults(v2.down));
    /* settled, free frames are closed: what was read through the old views faults */
    stream_settle(s);
    CHECK(touch_faults(v0.gate) && touch_faults(v0.down) && touch_faults(v1.down));
    stream_frames(s, &created, &in_use, &warm);
    CHECK(in_use == 1 && warm == 2); /* over the budget of 2, but within this pass's peak of 3: kept */
    stream_trim(s); /* a pass starts: the last one peaked at 3 frames, so all 3 stay */
    stream_frames(s, &created, &in_use, &warm);
    CHECK(in_use == 1 && warm == 2);
    CHECK(touch_faults(v0.gate) && touch_faults(v1.down)); /* still closed */
    stream_trim(s); /* the next pass: this one peaked at 1, so the pool goes back to the budget of 2 */
    stream_frames(s, &created, &in_use, &warm);
    CHECK(in_use == 1 && warm == 1);
    CHECK(touch_faults(v0.gate) && touch_faults(v0.down) && touch_faults(v1.gate) && touch_faults(v1.down));
    /* an expert of another layer takes a recycled frame: right bytes, and the evicted experts' views fault */
    CHECK(stream_load(s, 1, 3, 3, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_load(s, 1, 4, 4, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    stream_frames(s, &created, &in_use, &warm);
    CHECK(created == 3 && in_use == 3 && warm == 0); /* no new frame: the warm one and the returned one */
    stream_view(s, 1, 3, 3, &v2);
    CHECK(view_matches(parts, 1, 3, &v2));
    stream_view(s, 1, 4, 4, &v2);
    CHECK(view_matches(parts, 1, 4, &v2));
    stream_view(s, 0, 0, 0, &v0); /* what a matmul of the evicted experts would read */
    stream_view(s, 0, 1, 1, &v1);
    CHECK(touch_faults(v0.gate) && touch_faults(v0.down) && touch_faults(v1.gate) && touch_faults(v1.down));
    CHECK(stream_committed(s, 0, 2) && !stream_committed(s, 0, 0) && stream_committed(s, 1, 3));
    /* the same slot again, after a release: read again into whatever frame it gets */
    stream_release(s, 1, 3);
    CHECK(stream_load(s, 1, 3, 3, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    stream_view(s, 1, 3, 3, &v2);
    CHECK(view_matches(parts, 1, 3, &v2));
    stream_close(s);
}

/* Layers whose experts differ in size (their parts in different types): each layer's slot is its own,
 * shared slots are the largest, and the frame pool keeps one class of frames per slot size: a frame
 * freed by one layer is reused by a layer of the same size only, and the trim counts bytes. */
static void test_store_mixed(const char *f0, const char *f1) {
    g_down[1] = MIXED_DOWN;
    bmoe_stream_part parts[NL * BMOE_EXP_NPARTS];
    layout(parts);
    const char *paths[2] = { f0, f1 };
    const size_t s0 = slot_of(300004), s1 = slot_of(MIXED_DOWN);
    char err[512] = "";
    bmoe_stream *s = NULL;
    /* shared slots: as large as the largest layer's, and either layer's expert reads back whole */
    bmoe_stream_opts sh = { NL, NE, parts, 2, paths, 2, 1, 2, 0 };
    CHECK(stream_open(&sh, &s, err, sizeof err) == 0);
    if (!s) return;
    CHECK(stream_slot_bytes(s, 0) == s0 && stream_slot_bytes(s, 1) == s1 && s1 > s0 && stream_slot_max(s) == s1);
    bmoe_io_group g = { 0 };
    bmoe_expert_view v;
    CHECK(stream_load(s, 1, 0, 3, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_load(s, 1, 1, 4, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    stream_view(s, 1, 0, 3, &v);
    CHECK(view_matches(parts, 1, 3, &v));
    stream_view(s, 1, 1, 4, &v);
    CHECK(view_matches(parts, 1, 4, &v));
    CHECK(stream_load(s, 0, 1, 2, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    stream_view(s, 0, 1, 2, &v);
    CHECK(view_matches(parts, 0, 2, &v));
    stream_close(s);

    /* the frame pool: a budget of one slot of each size */
    bmoe_stream_opts o = { NL, NE, parts, 2, paths, 0, 1, 2, (uint64_t)(s0 + s1) };
    s = NULL;
    CHECK(stream_open(&o, &s, err, sizeof err) == 0);
    if (!s) return;
    size_t created, in_use, warm;
    CHECK(stream_load(s, 0, 0, 0, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_load(s, 0, 1, 1, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_load(s, 1, 0, 0, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    stream_release(s, 0, 0);
    stream_release(s, 0, 1);
    stream_settle(s);
    /* two small frames free, but a layer-1 expert needs a large one: a new frame */
    CHECK(stream_load(s, 1, 1, 1, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    stream_frames(s, &created, &in_use, &warm);
    CHECK(created == 4 && in_use == 2 && warm == 2);
    stream_view(s, 1, 1, 1, &v);
    CHECK(view_matches(parts, 1, 1, &v));
    stream_view(s, 1, 0, 0, &v);
    CHECK(view_matches(parts, 1, 0, &v));
    /* the pass peaked at 2 s0 + s1 bytes in use; 2 s1 in use + 2 s0 warm is more: both small frames go */
    stream_trim(s);
    stream_frames(s, &created, &in_use, &warm);
    CHECK(in_use == 2 && warm == 0);
    /* a large frame released is reused by the same layer's next expert, no new frame */
    stream_release(s, 1, 0);
    CHECK(stream_load(s, 1, 2, 2, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    stream_frames(s, &created, &in_use, &warm);
    CHECK(created == 4 && in_use == 2 && warm == 0);
    stream_view(s, 1, 2, 2, &v);
    CHECK(view_matches(parts, 1, 2, &v));
    /* a small expert again: a returned small frame, still no new frame */
    CHECK(stream_load(s, 0, 3, 3, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
    CHECK(stream_wait(s, &g, err, sizeof err) == 0);
    stream_frames(s, &created, &in_use, &warm);
    CHECK(created == 4 && in_use == 3);
    stream_view(s, 0, 3, 3, &v);
    CHECK(view_matches(parts, 0, 3, &v));
    /* 2 s1 + s0 in use: releasing one large frame leaves s1 + s0 in use and s1 warm; the peak since the
     * last trim (2 s1 + s0) holds it, the next trim (peak s1 + s0 = the budget) returns it */
    stream_release(s, 1, 1);
    stream_trim(s);
    stream_frames(s, &created, &in_use, &warm);
    CHECK(in_use == 2 && warm == 1);
    stream_trim(s);
    stream_frames(s, &created, &in_use, &warm);
    CHECK(in_use == 2 && warm == 0);
    stream_close(s);
    g_down[1] = 300004;
}

static void test_truncated(const char *f0, const char *f1) {
    bmoe_stream_part parts[NL * BMOE_EXP_NPARTS];
    layout(parts);
    const char *paths[2] = { f0, f1 };
    for (int direct = 0; direct <= 1; direct++) {
        bmoe_stream_opts o = { NL, NE, parts, 2, paths, 0, direct, 2, 0 };
        bmoe_stream *s = NULL;
        char err[512] = "";
        CHECK(stream_open(&o, &s, err, sizeof err) == 0);
        const bmoe_stream_part *down = &parts[1 * BMOE_EXP_NPARTS + BMOE_EXP_DOWN];
        CHECK(truncate(f1, (off_t)(down->offset + 3 * down->stride + 100)) == 0);
        bmoe_io_group g = {0};
        CHECK(stream_load(s, 1, 2, 2, BMOE_IO_DEMAND, &g, err, sizeof err) == 0); /* still whole */
        CHECK(stream_wait(s, &g, err, sizeof err) == 0);
        memset(&g, 0, sizeof g);
        CHECK(stream_load(s, 1, 3, 3, BMOE_IO_DEMAND, &g, err, sizeof err) == 0);
        CHECK(stream_wait(s, &g, err, sizeof err) == 4);
        CHECK(strstr(err, f1) && strstr(err, "down expert 3") && strstr(err, "ends after 100 of its 300004 bytes"));
        CHECK(strchr(err, '\n') == NULL);
        stream_close(s);
        /* put the file back */
        int fd = open(f1, O_WRONLY);
        size_t size = FILE_SIZE;
        uint8_t *b = malloc(size);
        for (size_t i = 0; i < size; i++) b[i] = byte_at(i);
        CHECK(pwrite(fd, b, size, 0) == (ssize_t)size);
        free(b);
        close(fd);
    }
    /* a shard that cannot be opened */
    const char *bad[2] = { f0, "/nonexistent/shard.gguf" };
    bmoe_stream_opts o = { NL, NE, parts, 2, bad, 0, 1, 1, 0 };
    bmoe_stream *s = NULL;
    char err[512];
    CHECK(stream_open(&o, &s, err, sizeof err) == 4 && s == NULL && strstr(err, "/nonexistent/shard.gguf"));
}

/* I/O lanes: many jobs, results independent of the lane count; queued jobs dropped at destroy. */
static void test_lanes(const char *f0) {
    int fd = open(f0, O_RDONLY);
    enum { N = 200 };
    static uint8_t out[4][N * 64];
    for (int li = 0; li < 4; li++) {
        bmoe_io_lanes *io = io_create(li == 0 ? 1 : li == 1 ? 2 : li == 2 ? 4 : 8);
        CHECK(io != NULL && io_lanes_count(io) == (li == 0 ? 1 : li == 1 ? 2 : li == 2 ? 4 : 8));
        bmoe_io_group g = {0};
        for (int i = 0; i < N; i++) {
            bmoe_io_job j = { -1, fd, (uint64_t)(i * 37 + 5), 64, out[li] + i * 64, 4096, i };
            CHECK(io_submit(io, &j, &g, i % 3 ? BMOE_IO_DEMAND : BMOE_IO_SPECULATIVE) == 0);
        }
        CHECK(io_wait(io, &g) == 0 && !io_busy(io, &g));
        io_destroy(io);
    }
    int same = 1, right = 1;
    for (int li = 1; li < 4; li++) same &= memcmp(out[0], out[li], sizeof out[0]) == 0;
    for (int i = 0; i < N; i++)
        for (int b = 0; b < 64; b++) right &= out[0][i * 64 + b] == byte_at((uint64_t)(i * 37 + 5 + b));
    CHECK(same && right);
    /* a read past the end of the file is a short read, reported with its tag */
    bmoe_io_lanes *io = io_create(2);
    bmoe_io_group g = {0};
    bmoe_io_job j = { -1, fd, 1u << 30, 16, out[0], 4096, 77 };
    io_submit(io, &j, &g, BMOE_IO_DEMAND);
    CHECK(io_wait(io, &g) == -1 && g.failed && g.err_errno == 0 && g.err_tag == 77 && g.err_got == 0);
    io_destroy(io);
    io_destroy(NULL);
    CHECK(io_create(0) == NULL);
    close(fd);
}

/* ---- the hook, with a hand-built model: layer 0 dense, layers 1 and 2 MoE (the store's layout) ---- */

typedef struct fake { bmoe_model m; gguf_model g; gguf_shard sh[2]; bmoe_layer ly[3]; int moe[2]; } fake;

static void fake_model(fake *f, const char *f0, const char *f1) {
    memset(f, 0, sizeof *f);
    bmoe_stream_part parts[NL * BMOE_EXP_NPARTS];
    layout(parts);
    f->m.path = (char *)"fake.gguf";
    strcpy(f->m.arch, "qwen3moe");
    f->m.hp.n_layer = 3;
    f->m.hp.n_expert = NE;
    f->m.hp.n_expert_used = 2;
    f->g.n_shards = 2;
    f->g.shards = f->sh;
    f->sh[0].path = (char *)f0;
    f->sh[1].path = (char *)f1;
    f->sh[0].fd = f->sh[1].fd = -1;
    f->m.g = &f->g;
    f->m.layers = f->ly;
    f->m.moe_layers = f->moe;
    f->m.n_moe_layers = 2;
    f->moe[0] = 1;
    f->moe[1] = 2;
    for (int l = 0; l < NL; l++) {
        bmoe_layer *ly = &f->ly[l + 1];
        ly->is_moe = 1;
        for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
            const bmoe_stream_part *P = &parts[l * BMOE_EXP_NPARTS + p];
            bmoe_expert_part *ep = &ly->exp_part[p];
            ep->present = P->present;
            if (!P->present) continue;
            snprintf(ep->name, sizeof ep->name, "blk.%d.%s", l + 1, P->name);
            ep->shard = P->shard;
            ep->offset = P->offset;
            ep->stride = P->stride;
            ep->bytes = P->bytes;
            ly->expert_bytes += P->bytes;
        }
    }
}

typedef struct drive {
    float logits[8 * NE], probs[8 * NE], w[8 * 2];
    int32_t ids[8 * 2];
} drive;

/* One MoE layer's nodes through the hook, as forward.c emits them (softmax gating with norm). */
static int pass(bmoe_stream_hook *h, drive *d, int il, int T, int phase, int step, int pos0) {
    bmoe_moe_result r = { .layer = il, .n_tokens = T, .n_expert = NE, .phase = phase, .step = step, .pos0 = pos0 };
    static const bmoe_node order[] = { BMOE_NODE_LOGITS, BMOE_NODE_PROBS, BMOE_NODE_TOPK, BMOE_NODE_WEIGHTS,
                                       BMOE_NODE_WEIGHTS_NORM, BMOE_NODE_EXPERTS };
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        r.node = order[i];
        r.n_cols = r.node <= BMOE_NODE_PROBS ? NE : 2;
        r.f32 = r.node == BMOE_NODE_LOGITS ? d->logits : r.node == BMOE_NODE_PROBS ? d->probs : NULL;
        r.ids = r.node >= BMOE_NODE_TOPK ? d->ids : NULL;
        r.scores = r.node == BMOE_NODE_TOPK ? d->probs : NULL;
        r.weights = r.node >= BMOE_NODE_WEIGHTS ? d->w : NULL;
        if (r.node >= BMOE_NODE_WEIGHTS && r.node != BMOE_NODE_EXPERTS) r.f32 = d->w;
        int rc = stream_hook_fn(h, &r);
        if (rc) return rc;
    }
    return 0;
}

static int views_ok(bmoe_stream_hook *h, const drive *d, int il, int T) {
    bmoe_stream_part parts[NL * BMOE_EXP_NPARTS];
    layout(parts);
    bmoe_expert_source src = stream_hook_source(h);
    int ok = 1;
    for (int i = 0; i < T * 2; i++) {
        bmoe_expert_view v;
        ok &= src.view(src.self, il, d->ids[i], &v) == 0;
        ok &= view_matches(parts, il - 1, d->ids[i], &v);
    }
    return ok;
}

static void set_row(drive *d, int t, int a, int b) {
    d->ids[t * 2] = a;
    d->ids[t * 2 + 1] = b;
    d->w[t * 2] = 0.75f;
    d->w[t * 2 + 1] = 0.25f;
}

static bmoe_stream_hook *open_hook(fake *f, bmoe_stream_hook_opts *c, int cache_mb, int prefetch, const char *trace) {
    *c = (bmoe_stream_hook_opts){ .cache_mb = cache_mb, .odirect = 1, .io_lanes = 2, .prefetch = prefetch,
                                .prefetch_sync = prefetch > 0, .route_trace = trace };
    bmoe_stream_hook *h = NULL;
    bmoe_error err = {0};
    int rc = stream_hook_create(&h, &f->m, c, 2, 4, &err);
    if (rc) fprintf(stderr, "stream_hook_create: %s\n", err.msg);
    return h;
}

static void test_hook_cache_off(fake *f) {
    bmoe_stream_hook_opts c;
    bmoe_stream_hook *h = open_hook(f, &c, 0, 0, NULL);
    CHECK(h != NULL);
    if (!h) return;
    drive d = {0};
    set_row(&d, 0, 1, 2);
    set_row(&d, 1, 2, 4);
    set_row(&d, 2, 1, 0);
    CHECK(pass(h, &d, 1, 3, 0, 0, 0) == 0);
    CHECK(views_ok(h, &d, 1, 3));
    bmoe_expert_source src = stream_hook_source(h);
    bmoe_expert_view v;
    src.view(src.self, 1, 3, &v); /* not routed in this layer: the guard slot */
    CHECK(touch_faults(v.gate));
    set_row(&d, 0, 3, 1);
    CHECK(pass(h, &d, 2, 1, 1, 0, 3) == 0);
    CHECK(views_ok(h, &d, 2, 1));
    src.view(src.self, 1, 1, &v); /* layer 1's experts are gone once layer 2 loaded */
    CHECK(touch_faults(v.gate));
    bmoe_counters k = {0};
    stream_hook_counters(h, &k);
    /* every routed slot is a miss; a read per unique expert per layer and batch */
    CHECK(k.cache_misses == 8 && k.cache_hits == 0 && k.flash_reads == 4 + 2);
    CHECK(k.flash_bytes == 6 * EXPERT_BYTES);
    uint8_t res[NE];
    CHECK(stream_query_residency(h, 1, res) == 0 && res[1] == 0 && res[2] == 0);
    CHECK(stream_query_residency(h, 0, res) != 0); /* a dense layer */
    bmoe_error err = {0};
    CHECK(stream_hook_finish(h, &err) == 1); /* that query left its error */
    stream_hook_destroy(h);
}

static void test_hook_cache(fake *f) {
    bmoe_stream_hook_opts c;
    /* 1 MiB holds three slots */
    bmoe_stream_hook *h = open_hook(f, &c, 1, 0, NULL);
    CHECK(h != NULL);
    if (!h) return;
    drive d = {0};
    set_row(&d, 0, 1, 2);
    set_row(&d, 1, 2, 1);
    CHECK(pass(h, &d, 1, 2, 0, 0, 0) == 0 && views_ok(h, &d, 1, 2));
    set_row(&d, 0, 2, 3);
    CHECK(pass(h, &d, 1, 1, 1, 0, 2) == 0 && views_ok(h, &d, 1, 1));
    bmoe_counters k = {0};
    stream_hook_counters(h, &k);
    CHECK(k.cache_misses == 4 + 1 && k.cache_hits == 1 && k.flash_reads == 3);
    uint8_t res[NE];
    CHECK(stream_query_residency(h, 1, res) == 0);
    CHECK(res[0] == 0 && res[1] == 1 && res[2] == 1 && res[3] == 1 && res[4] == 0);
    CHECK(stream_hook_cache_bytes(h) == 3 * stream_hook_slot_bytes(h, 1));
    CHECK(stream_hook_slot_bytes(h, 0) == 0 && stream_hook_slot_bytes(h, 2) == stream_hook_slot_bytes(h, 1));
    bmoe_error err = {0};
    CHECK(stream_hook_finish(h, &err) == 0);
    stream_hook_destroy(h);
}

/* The hook trims the frame pool once per pass: a pass that pinned more frames than the budget keeps
 * them through the next pass's start, and the start of the pass after that gives back what the
 * budget does not hold. */
static void test_hook_trim(fake *f) {
    bmoe_stream_hook_opts c;
    bmoe_stream_hook *h = open_hook(f, &c, 1, 0, NULL); /* 1 MiB: three slots */
    CHECK(h != NULL);
    if (!h) return;
    size_t budget = (size_t)((1u << 20) / stream_hook_slot_bytes(h, 1)), created, in_use, warm;
    CHECK(budget == 3);
    drive d = {0};
    set_row(&d, 0, 1, 2);
    set_row(&d, 1, 3, 4);
    /* the prompt pass: each layer pins four experts, one more than the budget */
    CHECK(pass(h, &d, 1, 2, 0, 0, 0) == 0 && views_ok(h, &d, 1, 2));
    CHECK(pass(h, &d, 2, 2, 0, 0, 0) == 0 && views_ok(h, &d, 2, 2));
    stream_hook_frames(h, &created, &in_use, &warm);
    CHECK(in_use == 4 && warm == 0);
    /* a decode pass starts: the prompt pass peaked at four frames, so none is given back */
    set_row(&d, 0, 1, 2);
    CHECK(pass(h, &d, 1, 1, 1, 0, 2) == 0 && views_ok(h, &d, 1, 1));
    stream_hook_frames(h, &created, &in_use, &warm);
    CHECK(in_use + warm == 4);
    CHECK(pass(h, &d, 2, 1, 1, 0, 2) == 0 && views_ok(h, &d, 2, 1));
    /* the next pass starts: the last one never had more in use than the budget */
    CHECK(pass(h, &d, 1, 1, 1, 1, 3) == 0 && views_ok(h, &d, 1, 1));
    stream_hook_frames(h, &created, &in_use, &warm);
    CHECK(in_use + warm <= budget);
    bmoe_error err = {0};
    CHECK(stream_hook_finish(h, &err) == 0);
    stream_hook_destroy(h);
}

/* A budget of two slots (set through the cache directly is not possible from here, so the model's
 * experts are made big enough through the layout: 1 MiB / slot > 1 MiB budget is refused). */
static void test_hook_budget_refused(const char *f0, const char *f1) {
    fake f;
    fake_model(&f, f0, f1);
    for (int l = 1; l <= 2; l++) {
        f.ly[l].exp_part[BMOE_EXP_DOWN].bytes = 1u << 20; /* one expert > 1 MiB */
        f.ly[l].exp_part[BMOE_EXP_DOWN].stride = 1u << 20;
    }
    bmoe_stream_hook_opts c = { .cache_mb = 1, .odirect = 1, .io_lanes = 1 };
    bmoe_stream_hook *h = NULL;
    bmoe_error err = {0};
    CHECK(stream_hook_create(&h, &f.m, &c, 2, 4, &err) == 2 && h == NULL);
    CHECK(strstr(err.msg, "--cache-mb: 1 MiB is smaller than one expert") && strstr(err.msg, "--cache-mb 2 or more"));
}

static char *slurp(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    buf[n] = 0;
    fclose(fp);
    return buf;
}

/* A model whose MoE layers differ in expert size (layer 2's down projection in a wider type): each
 * layer's reads are charged its own expert bytes, its cache entries its own slot, the trace says both
 * per layer, and a budget is refused when the largest layer's expert does not fit. */
static void test_hook_mixed(const char *f0, const char *f1) {
    g_down[1] = MIXED_DOWN;
    fake f;
    fake_model(&f, f0, f1);
    const uint64_t eb1 = 3000 + 3000 + 300004, eb2 = 3000 + 3000 + MIXED_DOWN;
    const size_t s1 = slot_of(300004), s2 = slot_of(MIXED_DOWN);
    char trace[] = "/tmp/bmoe_trace_XXXXXX";
    int tfd = mkstemp(trace);
    close(tfd);
    bmoe_stream_hook_opts c;
    bmoe_stream_hook *h = open_hook(&f, &c, 1, 0, trace); /* 1 MiB: s1 + s2 fit, 2 s1 + s2 do not */
    CHECK(h != NULL);
    if (!h) { g_down[1] = 300004; return; }
    CHECK(stream_hook_slot_bytes(h, 1) == s1 && stream_hook_slot_bytes(h, 2) == s2);
    drive d = {0};
    set_row(&d, 0, 1, 2);
    CHECK(pass(h, &d, 1, 1, 0, 0, 0) == 0 && views_ok(h, &d, 1, 1));
    set_row(&d, 0, 3, 4);
    CHECK(pass(h, &d, 2, 1, 0, 0, 0) == 0 && views_ok(h, &d, 2, 1));
    /* layer 2's first miss evicts one layer-1 expert (2 s1 + s2 > 1 MiB), its second the other */
    CHECK(stream_hook_evictions(h) == 2 && stream_hook_cache_bytes(h) == 2 * s2);
    bmoe_counters k = {0};
    stream_hook_counters(h, &k);
    CHECK(k.flash_reads == 4 && k.flash_bytes == 2 * eb1 + 2 * eb2);
    const uint64_t *lr = NULL, *lb = NULL;
    CHECK(stream_hook_flash_layers(h, &lr, &lb) == 2);
    CHECK(lr && lb && lr[0] == 2 && lr[1] == 2 && lb[0] == 2 * eb1 && lb[1] == 2 * eb2);
    bmoe_error err = {0};
    CHECK(stream_hook_finish(h, &err) == 0);
    stream_hook_destroy(h);
    char lines[256];
    snprintf(lines, sizeof lines, "\n# layer=1 expert_bytes=%llu part_bytes=3000,3000,0,300004 slot_bytes=%zu\n"
             "# layer=2 expert_bytes=%llu part_bytes=3000,3000,0,%d slot_bytes=%zu\n",
             (unsigned long long)eb1, s1, (unsigned long long)eb2, MIXED_DOWN, s2);
    const char *txt = slurp(trace);
    CHECK(txt && strstr(txt, lines));
    CHECK(txt && strstr(txt, "\n0,0,0,1,0,1,1,0.75,0.75,0,306004,0,0,\n0,0,0,1,1,2,2,0.25,0.25,0,306004,0,0,\n"));
    CHECK(txt && strstr(txt, "\n0,0,0,2,0,3,3,0.75,0.75,0,456004,0,0,\n0,0,0,2,1,4,4,0.25,0.25,0,456004,0,0,\n"));
    unlink(trace);
    /* a budget that holds a layer-1 expert but not a layer-2 one is refused, naming the layer */
    f.ly[2].exp_part[BMOE_EXP_DOWN].bytes = f.ly[2].exp_part[BMOE_EXP_DOWN].stride = 1u << 20;
    bmoe_stream_hook_opts small = { .cache_mb = 1, .odirect = 1, .io_lanes = 1 };
    h = NULL;
    CHECK(stream_hook_create(&h, &f.m, &small, 2, 4, &err) == 2 && h == NULL);
    CHECK(strstr(err.msg, "smaller than one expert of this model") && strstr(err.msg, "of layer 2, the largest") &&
          strstr(err.msg, "--cache-mb 2 or more"));
    g_down[1] = 300004;
}

/* A toy policy pair: substitution puts expert 4 in slot 1 of every row; the drop drops slot 1. */
typedef struct toy { int topk_calls, terminal_calls; } toy;

static int toy_topk(void *self, bmoe_moe_result *r, const uint8_t *resident, uint8_t *changed, bmoe_counters *c) {
    toy *t = self;
    t->topk_calls++;
    for (int i = 0; i < r->n_tokens; i++) {
        int32_t *row = r->ids + i * r->n_cols;
        if (row[0] != 4 && row[1] != 4) { row[1] = 4; changed[i * r->n_cols + 1] = 1; }
    }
    c->subst_examined += (uint64_t)(r->n_tokens * r->n_cols);
    (void)resident;
    return 0;
}

static int toy_terminal(void *self, bmoe_moe_result *r, const uint8_t *resident, uint8_t *dropped, bmoe_counters *c) {
    toy *t = self;
    t->terminal_calls++;
    CHECK(r->node == BMOE_NODE_WEIGHTS_NORM); /* the learned terminal node of this chain */
    for (int i = 0; i < r->n_tokens; i++) {
        int32_t *row = r->ids + i * r->n_cols;
        if (resident[row[1]]) continue;
        r->weights[i * r->n_cols + 1] = 0.0f;
        row[1] = row[0];
        dropped[i * r->n_cols + 1] = 1;
    }
    (void)c;
    return 0;
}


static void test_hook_policy_and_trace(fake *f) {
    char trace[] = "/tmp/bmoe_trace_XXXXXX";
    int tfd = mkstemp(trace);
    close(tfd);
    bmoe_stream_hook_opts c;
    bmoe_stream_hook *h = open_hook(f, &c, 1, 0, trace);
    CHECK(h != NULL);
    if (!h) return;
    toy t = {0};
    bmoe_route_policy pol = { &t, toy_topk, toy_terminal, 1, 0 };
    stream_hook_set_policy(h, &pol);
    drive d = {0};
    for (int e = 0; e < NE; e++) d.probs[e] = 0.1f * (float)(e + 1);
    /* prefill: substitution runs, the drop does not (terminal unknown, and prefill is excluded) */
    set_row(&d, 0, 1, 2);
    CHECK(pass(h, &d, 1, 1, 0, 0, 0) == 0);
    CHECK(d.ids[1] == 4 && t.topk_calls == 1 && t.terminal_calls == 0 && views_ok(h, &d, 1, 1));
    /* decode: the terminal node is known now; slot 1 (expert 4 after substitution) is resident, kept */
    set_row(&d, 0, 0, 3);
    CHECK(pass(h, &d, 1, 1, 1, 0, 1) == 0);
    CHECK(t.terminal_calls == 1 && d.ids[0] == 0 && d.ids[1] == 4);
    /* decode again with a fresh routing: 4 substituted in, still resident, kept; then a routing that
     * holds 4 already: 2 is a miss in slot 1 and gets dropped, repointed at slot 0's expert */
    set_row(&d, 0, 4, 2);
    CHECK(pass(h, &d, 1, 1, 1, 1, 2) == 0);
    CHECK(t.terminal_calls == 2 && d.ids[1] == 4 && d.w[1] == 0.0f);
    CHECK(views_ok(h, &d, 1, 1));
    bmoe_counters k = {0};
    stream_hook_counters(h, &k);
    CHECK(k.subst_examined == 6 && k.subst_changed == 2 && k.experts_dropped == 1);
    /* prefill reads 1, 4; decode 1 reads 0; decode 2 reads nothing (4 resident, 2 dropped) */
    CHECK(k.flash_reads == 3 && k.cache_hits + k.cache_misses == 6);
    bmoe_error err = {0};
    CHECK(stream_hook_finish(h, &err) == 0);
    char geo[96], lines[256];
    long page = sysconf(_SC_PAGESIZE);
    snprintf(geo, sizeof geo, "\n# page_bytes=%ld shared_slot_bytes=0\n", page < 4096 ? 4096L : page);
    snprintf(lines, sizeof lines, "\n# layer=1 expert_bytes=306004 part_bytes=3000,3000,0,300004 slot_bytes=%llu\n"
             "# layer=2 expert_bytes=306004 part_bytes=3000,3000,0,300004 slot_bytes=%llu\n",
             (unsigned long long)stream_hook_slot_bytes(h, 1), (unsigned long long)stream_hook_slot_bytes(h, 2));
    stream_hook_destroy(h);
    const char *txt = slurp(trace);
    CHECK(txt && strncmp(txt, "# route_trace v4\n# model=fake.gguf\n# arch=qwen3moe\n# layers=3\n# experts=5\n# top_k=2\n",
                         84) == 0);
    CHECK(txt && strstr(txt, geo));
    CHECK(txt && strstr(txt, lines));
    CHECK(txt && strstr(txt, "\nturn,phase,step,layer,slot,router_expert,expert,router_weight,weight,residency,"
                             "expert_bytes,dropped,substituted,scores\n"));
    CHECK(txt && strstr(txt, "\n# scores_are_probs="));
    /* the rows: the router's expert, the expert as executed after substitution (before drop
     * repointing), the weight before the drop edit and as applied; the routing's first slot row carries
     * the scores the substitution re-ranked (%.9g, so each reads back to the same float) */
#define SC "0.100000001 0.200000003 0.300000012 0.400000006 0.5"
    CHECK(txt && strstr(txt, "\n0,0,0,1,0,1,1,0.75,0.75,0,306004,0,0," SC "\n0,0,0,1,1,2,4,0.25,0.25,0,306004,0,1,\n"));
    CHECK(txt && strstr(txt, "\n0,1,0,1,0,0,0,0.75,0.75,0,306004,0,0," SC "\n0,1,0,1,1,3,4,0.25,0.25,1,0,0,1,\n"));
    CHECK(txt && strstr(txt, "\n0,1,1,1,0,4,4,0.75,0.75,1,0,0,0," SC "\n0,1,1,1,1,2,2,0.25,0,0,0,1,0,\n"));
#undef SC
    unlink(trace);
}

/* The terminal node comes from weight_chain.c, keyed by the layer's shape: a chain that changes shape
 * after it was learned defers to a node that never comes, and EXPERTS loads the layer undropped (the
 * backstop); the next pass defers to the newly learned terminal. */
typedef struct toy_node { int calls; bmoe_node last; } toy_node;

static int toy_node_terminal(void *self, bmoe_moe_result *r, const uint8_t *resident, uint8_t *dropped,
                             bmoe_counters *c) {
    toy_node *t = self;
    t->calls++;
    t->last = r->node;
    (void)resident; (void)dropped; (void)c;
    return 0;
}

static int pass_chain(bmoe_stream_hook *h, drive *d, int il, int phase, int step, int pos0, int with_norm) {
    bmoe_moe_result r = { .layer = il, .n_tokens = 1, .n_expert = NE, .phase = phase, .step = step, .pos0 = pos0 };
    bmoe_node order[6] = { BMOE_NODE_LOGITS, BMOE_NODE_PROBS, BMOE_NODE_TOPK, BMOE_NODE_WEIGHTS,
                           BMOE_NODE_WEIGHTS_NORM, BMOE_NODE_EXPERTS };
    int n = 6;
    if (!with_norm) { order[4] = BMOE_NODE_EXPERTS; n = 5; }
    for (int i = 0; i < n; i++) {
        r.node = order[i];
        r.n_cols = r.node <= BMOE_NODE_PROBS ? NE : 2;
        r.f32 = r.node == BMOE_NODE_LOGITS ? d->logits : r.node == BMOE_NODE_PROBS ? d->probs : NULL;
        r.ids = r.node >= BMOE_NODE_TOPK ? d->ids : NULL;
        r.scores = r.node == BMOE_NODE_TOPK ? d->probs : NULL;
        r.weights = r.node >= BMOE_NODE_WEIGHTS ? d->w : NULL;
        int rc = stream_hook_fn(h, &r);
        if (rc) return rc;
    }
    return 0;
}

static void test_hook_learned_terminal(fake *f) {
    bmoe_stream_hook_opts c;
    bmoe_stream_hook *h = open_hook(f, &c, 1, 0, NULL);
    CHECK(h != NULL);
    if (!h) return;
    toy_node t = { 0, BMOE_NODE_COUNT };
    bmoe_route_policy pol = { &t, NULL, toy_node_terminal, 0, 1 }; /* dropping in prefill too */
    stream_hook_set_policy(h, &pol);
    drive d = {0};
    set_row(&d, 0, 0, 1);
    /* the first pass of the shape: unknown, loaded at topk, the policy not called */
    CHECK(pass_chain(h, &d, 1, 0, 0, 0, 1) == 0 && t.calls == 0 && views_ok(h, &d, 1, 1));
    /* learned weights>weights_norm: deferred to weights_norm */
    set_row(&d, 0, 2, 3);
    CHECK(pass_chain(h, &d, 1, 1, 0, 1, 1) == 0 && t.calls == 1 && t.last == BMOE_NODE_WEIGHTS_NORM);
    CHECK(views_ok(h, &d, 1, 1));
    /* the chain loses its norm node: the deferral waits for weights_norm, which never comes; EXPERTS
     * loads the layer undropped (no call), and the shape is re-learned */
    set_row(&d, 0, 4, 0);
    CHECK(pass_chain(h, &d, 1, 1, 1, 2, 0) == 0 && t.calls == 1);
    CHECK(views_ok(h, &d, 1, 1));
    /* from now on the terminal is ffn_moe_weights */
    set_row(&d, 0, 1, 2);
    CHECK(pass_chain(h, &d, 1, 1, 2, 3, 0) == 0 && t.calls == 2 && t.last == BMOE_NODE_WEIGHTS);
    CHECK(views_ok(h, &d, 1, 1));
    /* another layer has its own record: unseen, loaded at topk */
    set_row(&d, 0, 3, 4);
    CHECK(pass_chain(h, &d, 2, 1, 2, 3, 0) == 0 && t.calls == 2 && views_ok(h, &d, 2, 1));
    bmoe_counters k = {0};
    stream_hook_counters(h, &k);
    CHECK(k.cache_hits + k.cache_misses == 10 && k.experts_dropped == 0);
    bmoe_error err = {0};
    CHECK(stream_hook_finish(h, &err) == 0);
    stream_hook_destroy(h);
}

/* Prefetch with a cache of three slots (both layers share it):
 *   prefill  L1 (0,1) reads 0,1;  L2 (2,3) reads 2,3, evicting L1:0            [L1:1 L2:2 L2:3]
 *   decode   L1 (0,1): 1 hits, 0 misses (evicts L2:2); guess for L2 = (2,3): 2 is speculatively
 *            read (evicting L2:3); 3 finds no room: the round's own guess is pinned, L1 is in use
 *   decode   L2 (2,3): 2 is a hit on a prefetched expert (residency 2, used), 3 a miss            */
static void test_hook_prefetch(fake *f) {
    char trace[] = "/tmp/bmoe_trace_XXXXXX";
    int tfd = mkstemp(trace);
    close(tfd);
    bmoe_stream_hook_opts c;
    bmoe_stream_hook *h = open_hook(f, &c, 1, 1, trace);
    CHECK(h != NULL);
    if (!h) return;
    drive d = {0};
    set_row(&d, 0, 0, 1);
    CHECK(pass(h, &d, 1, 1, 0, 0, 0) == 0);
    set_row(&d, 0, 2, 3);
    CHECK(pass(h, &d, 2, 1, 0, 0, 0) == 0);
    CHECK(stream_hook_evictions(h) == 1);
    set_row(&d, 0, 0, 1);
    CHECK(pass(h, &d, 1, 1, 1, 0, 1) == 0 && views_ok(h, &d, 1, 1));
    bmoe_counters k = {0};
    stream_hook_counters(h, &k);
    CHECK(k.prefetch_issued == 1 && k.prefetch_used == 0 && k.flash_reads == 6);
    uint8_t res[NE];
    CHECK(stream_query_residency(h, 2, res) == 0 && res[2] == 1 && res[3] == 0);
    set_row(&d, 0, 2, 3);
    CHECK(pass(h, &d, 2, 1, 1, 0, 1) == 0 && views_ok(h, &d, 2, 1));
    memset(&k, 0, sizeof k);
    stream_hook_counters(h, &k);
    CHECK(k.prefetch_issued == 1 && k.prefetch_used == 1 && k.cache_hits == 2 && k.cache_misses == 6);
    CHECK(k.flash_reads == 7 && k.flash_bytes == 7 * (uint64_t)EXPERT_BYTES);
    bmoe_error err = {0};
    CHECK(stream_hook_finish(h, &err) == 0);
    stream_hook_destroy(h);
    /* the prefetched expert's read is charged to its first use (residency 2) */
    const char *txt = slurp(trace);
    CHECK(txt && strstr(txt, "\n0,1,0,2,0,2,2,0.75,0.75,2,306004,0,0,\n0,1,0,2,1,3,3,0.25,0.25,0,306004,0,0,\n"));
    unlink(trace);
}

int main(void) {
    char f0[64], f1[64];
    if (make_file(f0, FILE_SIZE) || make_file(f1, FILE_SIZE)) {
        fprintf(stderr, "cannot create test files in /tmp\n");
        return 1;
    }
    test_store(f0, f1);
    test_frame_pool(f0, f1);
    test_store_mixed(f0, f1);
    test_truncated(f0, f1);
    test_lanes(f0);
    fake f;
    fake_model(&f, f0, f1);
    test_hook_cache_off(&f);
    test_hook_cache(&f);
    test_hook_trim(&f);
    test_hook_budget_refused(f0, f1);
    test_hook_mixed(f0, f1);
    test_hook_policy_and_trace(&f);
    test_hook_learned_terminal(&f);
    test_hook_prefetch(&f);
    unlink(f0);
    unlink(f1);
    return check_report("test_stream");
}
