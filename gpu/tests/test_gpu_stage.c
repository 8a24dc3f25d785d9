/* The staging pipeline, driven the way the core's progress thread drives it: poll the fd, call
 * cx_stage_progress, play "network" for the chunks handed out. Runs on the sim device, or on CUDA
 * device memory with CONNEX_GPU_TEST_KIND=cuda. Mode "env": configuration from the environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cx_stage.h"

static int g_kind = CX_MEM_SIM;

static uint64_t now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

/* ---- the fake network ---- */

#define NET_MAX 4096

struct xfer {
    int dir;
    unsigned char *host; /* OUT: where the network delivers; IN: where it reads from */
    size_t len;
    cx_stage_job_t *job;
    int done, status;
    uint32_t net_ok; /* chunks whose network part finished ok */
    uint32_t outstanding, max_outstanding;
    int last_seen_after;   /* the last chunk came after how many others were done */
    int fail_chunk;        /* this chunk's network part fails with CX_EPEER (-1: none) */
    int hold;              /* keep chunks on the "network" (do not complete them) */
    int check_dev_at_done; /* IN: the device already holds the data when done runs */
    void *dev;
    int dev_ok_at_done;
};

struct net_item {
    struct xfer *x;
    cx_stage_chunk_t c;
};
static struct net_item g_net[NET_MAX];
static int g_nnet;

static void on_chunk(const cx_stage_chunk_t *c)
{
    struct xfer *x = c->job_arg;
    assert_true(g_nnet < NET_MAX);
    assert_ptr_equal(c->job, x->job);
    assert_true(c->len > 0 && c->off + c->len <= x->len);
    assert_int_equal(c->last, c->index == c->nchunks - 1);
    if (c->last) x->last_seen_after = (int)x->net_ok;
    x->outstanding++;
    if (x->outstanding > x->max_outstanding) x->max_outstanding = x->outstanding;
    g_net[g_nnet++] = (struct net_item){ x, *c };
}

static void on_done(void *arg, cx_stage_job_t *job, int status)
{
    struct xfer *x = arg;
    assert_ptr_equal(job, x->job);
    assert_false(x->done);
    assert_int_equal(x->outstanding, 0); /* never done while the network holds a slot */
    x->done = 1;
    x->status = status;
    if (x->check_dev_at_done && status == CX_OK) {
        unsigned char *tmp = malloc(x->len);
        assert_non_null(tmp);
        assert_int_equal(cx_gpu_memcpy(tmp, x->dev, x->len), CX_OK);
        x->dev_ok_at_done = memcmp(tmp, x->host, x->len) == 0;
        free(tmp);
    }
}

static const cx_stage_cbs_t *cbs_for(struct xfer *x)
{
    static cx_stage_cbs_t cbs;
    cbs = (cx_stage_cbs_t){ on_chunk, on_done, x };
    return &cbs;
}

/* Finish the network part of every chunk the network holds that is not held back. */
static int net_run(int status_override)
{
    int n = 0, keep = 0;
    for (int i = 0; i < g_nnet; i++) {
        struct net_item *it = &g_net[i];
        struct xfer *x = it->x;
        if (x->hold && !status_override) {
            g_net[keep++] = *it;
            continue;
        }
        int st = status_override ? status_override : CX_OK;
        if ((int)it->c.index == x->fail_chunk) st = CX_EPEER;
        if (st == CX_OK) {
            if (x->dir == CX_STAGE_OUT)
                memcpy(x->host + it->c.off, it->c.host, it->c.len);
            else
                memcpy(it->c.host, x->host + it->c.off, it->c.len);
            x->net_ok++;
        }
        x->outstanding--;
        cx_stage_chunk_done(it->c.job, it->c.index, st);
        n++;
    }
    g_nnet = keep;
    return n;
}

/* Drive until every xfer is done (bounded: 10 s, and by count of rounds). */
static void drive(cx_stage_t *st, struct xfer **xs, int n)
{
    uint64_t t0 = now_us();
    for (int round = 0; round < 1000000 && now_us() - t0 < 10000000u; round++) {
        int all = 1;
        for (int i = 0; i < n; i++) all &= xs[i]->done;
        if (all) return;
        struct pollfd p = { cx_stage_fd(st), POLLIN, 0 };
        poll(&p, 1, g_nnet ? 0 : 50);
        cx_stage_progress(st);
        if (net_run(0)) cx_stage_progress(st);
    }
    fail_msg("staging did not finish within 10 s");
}

static void fill(unsigned char *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++) p[i] = (unsigned char)((i * 131u + seed) ^ (i >> 9));
}

static void assert_all_slots_back(cx_stage_t *st)
{
    cx_stage_stats_t s;
    cx_stage_get_stats(st, &s);
    assert_int_equal(s.slots_free, s.slots);
}

static cx_stage_t *mk(size_t chunk, uint32_t slots, uint32_t per_job)
{
    cx_stage_cfg_t cfg = { chunk, slots, per_job, 0 };
    cx_stage_t *st = NULL;
    assert_int_equal(cx_stage_create(g_kind, 0, &cfg, &st), CX_OK);
    return st;
}

/* ---- cases ---- */

/* OUT and IN for sizes around the chunk size; stats count exactly the bytes staged. */
static void t_sizes(void **state)
{
    (void)state;
    const size_t C = 64 << 10;
    cx_stage_t *st = mk(C, 4, 2);
    const size_t sizes[] = { 1, 4095, C - 1, C, C + 1, 3 * C + 17, 10 * C };
    uint64_t d2h = 0, h2d = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t len = sizes[k];
        void *dev;
        assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &dev), CX_OK);
        unsigned char *src = malloc(len), *dst = calloc(1, len);
        assert_non_null(src);
        assert_non_null(dst);
        fill(src, len, (unsigned)k);

        /* IN: network -> slot -> device. */
        struct xfer in = {
            .dir = CX_STAGE_IN, .host = src, .len = len, .fail_chunk = -1, .check_dev_at_done = 1, .dev = dev
        };
        assert_int_equal(cx_stage_start(st, CX_STAGE_IN, dev, len, 0, cbs_for(&in), &in.job), CX_OK);
        struct xfer *xs[] = { &in };
        drive(st, xs, 1);
        assert_int_equal(in.status, CX_OK);
        assert_true(in.dev_ok_at_done);
        assert_int_equal(in.net_ok, (len + C - 1) / C);
        assert_true(in.max_outstanding <= 2);

        /* OUT: device -> slot -> network. */
        struct xfer out = { .dir = CX_STAGE_OUT, .host = dst, .len = len, .fail_chunk = -1 };
        assert_int_equal(cx_stage_start(st, CX_STAGE_OUT, dev, len, 0, cbs_for(&out), &out.job), CX_OK);
        struct xfer *xo[] = { &out };
        drive(st, xo, 1);
        assert_int_equal(out.status, CX_OK);
        assert_memory_equal(src, dst, len);
        h2d += len;
        d2h += len;
        cx_stage_stats_t s;
        cx_stage_get_stats(st, &s);
        assert_int_equal(s.h2d_bytes, h2d);
        assert_int_equal(s.d2h_bytes, d2h);
        assert_int_equal(s.slots_free, 4);
        cx_gpu_dev_free(dev);
        free(src);
        free(dst);
    }
    cx_stage_stats_t s;
    cx_stage_get_stats(st, &s);
    assert_int_equal(s.jobs_ok, 2 * (sizeof sizes / sizeof sizes[0]));
    assert_int_equal(s.jobs_failed, 0);
    assert_int_equal(cx_stage_progress(st), 0);
    cx_stage_destroy(st);
}

/* A transfer of fewer than 8 full chunks is cut into 8 pieces (not below min_chunk), so its
 * copies still overlap; small transfers stay one chunk. With CX_STAGE_WHOLE (a piece of a
 * pipeline overlapped elsewhere) chunks keep the ring's full size. */
static void t_small_pieces(void **state)
{
    (void)state;
    cx_stage_cfg_t cfg = { 4 << 20, 4, 4, 128 << 10 };
    cx_stage_t *st;
    assert_int_equal(cx_stage_create(g_kind, 0, &cfg, &st), CX_OK);
    const size_t lens[] = { 4 << 20, 1 << 20, 100000, 64 << 20, 4 << 20, 6 << 20 };
    const unsigned flags[] = { 0, 0, 0, 0, CX_STAGE_WHOLE, CX_STAGE_WHOLE };
    const uint32_t want[] = { 8, 8, 1, 16, 1, 2 };
    void *dev;
    assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, 64 << 20, &dev), CX_OK);
    unsigned char *h = malloc(64 << 20);
    fill(h, 64 << 20, 11);
    for (int i = 0; i < 6; i++) {
        struct xfer x = {
            .dir = CX_STAGE_IN, .host = h, .len = lens[i], .fail_chunk = -1, .check_dev_at_done = 1, .dev = dev
        };
        assert_int_equal(cx_stage_start(st, CX_STAGE_IN, dev, lens[i], flags[i], cbs_for(&x), &x.job), CX_OK);
        struct xfer *xs[] = { &x };
        drive(st, xs, 1);
        assert_int_equal(x.status, CX_OK);
        assert_true(x.dev_ok_at_done);
        assert_int_equal(x.net_ok, want[i]);
    }
    cx_stage_destroy(st);
    cx_gpu_dev_free(dev);
    free(h);
}

/* put_signal's order: the last chunk is handed out only after every other chunk's network part. */
static void t_last_after_all(void **state)
{
    (void)state;
    const size_t C = 16 << 10, len = 9 * C + 5;
    cx_stage_t *st = mk(C, 8, 8);
    void *dev;
    assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &dev), CX_OK);
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    fill(src, len, 9);
    assert_int_equal(cx_gpu_memcpy(dev, src, len), CX_OK);
    struct xfer out = { .dir = CX_STAGE_OUT, .host = dst, .len = len, .fail_chunk = -1, .last_seen_after = -1 };
    assert_int_equal(cx_stage_start(st, CX_STAGE_OUT, dev, len, CX_STAGE_LAST_AFTER_ALL, cbs_for(&out), &out.job),
                     CX_OK);
    struct xfer *xs[] = { &out };
    drive(st, xs, 1);
    assert_int_equal(out.status, CX_OK);
    assert_int_equal(out.last_seen_after, 9);
    assert_memory_equal(src, dst, len);
    assert_all_slots_back(st);
    cx_stage_destroy(st);
    cx_gpu_dev_free(dev);
    free(src);
    free(dst);
}

/* Several transfers share a small ring: every one finishes, none holds more than per_job. */
static void t_many_jobs(void **state)
{
    (void)state;
    const size_t C = 32 << 10;
    cx_stage_t *st = mk(C, 4, 2);
    enum { J = 6 };
    struct xfer x[J];
    struct xfer *xs[J];
    void *dev[J];
    unsigned char *host[J], *ref[J];
    for (int i = 0; i < J; i++) {
        size_t len = (size_t)(i + 1) * C * 3 + (size_t)i * 1000 + 1;
        assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &dev[i]), CX_OK);
        host[i] = calloc(1, len);
        ref[i] = malloc(len);
        fill(ref[i], len, (unsigned)i + 40);
        int dir = i % 2 ? CX_STAGE_OUT : CX_STAGE_IN;
        if (dir == CX_STAGE_OUT)
            assert_int_equal(cx_gpu_memcpy(dev[i], ref[i], len), CX_OK);
        else
            memcpy(host[i], ref[i], len);
        x[i] = (struct xfer){ .dir = dir,
                              .host = host[i],
                              .len = len,
                              .fail_chunk = -1,
                              .check_dev_at_done = dir == CX_STAGE_IN,
                              .dev = dev[i] };
        xs[i] = &x[i];
        assert_int_equal(cx_stage_start(st, dir, dev[i], len, 0, cbs_for(&x[i]), &x[i].job), CX_OK);
    }
    drive(st, xs, J);
    for (int i = 0; i < J; i++) {
        assert_int_equal(x[i].status, CX_OK);
        assert_true(x[i].max_outstanding <= 2);
        if (x[i].dir == CX_STAGE_OUT)
            assert_memory_equal(host[i], ref[i], x[i].len);
        else
            assert_true(x[i].dev_ok_at_done);
        cx_gpu_dev_free(dev[i]);
        free(host[i]);
        free(ref[i]);
    }
    assert_all_slots_back(st);
    cx_stage_destroy(st);
}

/* The peer dies mid-staging: one chunk fails, the backend then fails the rest it holds. The job
 * ends with CX_EPEER once every slot is back; a transfer to another peer is unaffected. */
static void t_peer_killed(void **state)
{
    (void)state;
    const size_t C = 16 << 10, len = 40 * C;
    cx_stage_t *st = mk(C, 6, 3);
    for (int dir = 0; dir < 2; dir++) {
        void *dev, *dev2;
        assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &dev), CX_OK);
        assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &dev2), CX_OK);
        unsigned char *h = calloc(1, len), *h2 = calloc(1, len);
        fill(h2, len, 77);
        if (dir == CX_STAGE_OUT) assert_int_equal(cx_gpu_memcpy(dev2, h2, len), CX_OK);
        struct xfer dead = { .dir = dir, .host = h, .len = len, .fail_chunk = 5 };
        struct xfer live = { .dir = dir,
                             .host = dir == CX_STAGE_OUT ? calloc(1, len) : h2,
                             .len = len,
                             .fail_chunk = -1,
                             .check_dev_at_done = dir == CX_STAGE_IN,
                             .dev = dev2 };
        assert_int_equal(cx_stage_start(st, dir, dev, len, 0, cbs_for(&dead), &dead.job), CX_OK);
        assert_int_equal(cx_stage_start(st, dir, dev2, len, 0, cbs_for(&live), &live.job), CX_OK);
        struct xfer *xs[] = { &dead, &live };
        drive(st, xs, 2);
        assert_int_equal(dead.status, CX_EPEER);
        assert_true(dead.net_ok < 40);
        assert_int_equal(live.status, CX_OK);
        if (dir == CX_STAGE_OUT)
            assert_memory_equal(live.host, h2, len);
        else
            assert_true(live.dev_ok_at_done);
        assert_all_slots_back(st);
        if (dir == CX_STAGE_OUT) free(live.host);
        cx_gpu_dev_free(dev);
        cx_gpu_dev_free(dev2);
        free(h);
        free(h2);
    }
    cx_stage_stats_t s;
    cx_stage_get_stats(st, &s);
    assert_int_equal(s.jobs_failed, 2);
    assert_int_equal(s.jobs_ok, 2);
    cx_stage_destroy(st);
}

/* Cancel while chunks sit on the network and copies are in flight (slow sim copy engine): the
 * done callback waits for both, then every slot is back. */
static void t_cancel_mid_transfer(void **state)
{
    (void)state;
    if (g_kind == CX_MEM_SIM) setenv("CONNEX_GPU_SIM_GBPS", "0.5", 1);
    setenv("CONNEX_STAGE_SYNC_MAX", "0", 1); /* CUDA: every copy called back, so one is in flight */
    const size_t C = 256 << 10, len = 64 * C;
    cx_stage_t *st = mk(C, 4, 4);
    unsetenv("CONNEX_GPU_SIM_GBPS");
    unsetenv("CONNEX_STAGE_SYNC_MAX");
    for (int dir = 0; dir < 2; dir++) {
        void *dev;
        assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &dev), CX_OK);
        unsigned char *h = calloc(1, len);
        struct xfer x = { .dir = dir, .host = h, .len = len, .fail_chunk = -1, .hold = 1 };
        assert_int_equal(cx_stage_start(st, dir, dev, len, 0, cbs_for(&x), &x.job), CX_OK);
        uint64_t t0 = now_us();
        while (g_nnet == 0 && now_us() - t0 < 5000000u) {
            struct pollfd p = { cx_stage_fd(st), POLLIN, 0 };
            poll(&p, 1, 50);
            cx_stage_progress(st);
        }
        assert_true(g_nnet > 0);
        if (dir == CX_STAGE_IN) { /* let one chunk's H2D start, so a copy is in flight too */
            g_net[0].x->hold = 0;
            net_run(0);
            x.hold = 1;
            cx_stage_progress(st);
        }
        cx_stage_cancel(x.job, CX_ETIMEDOUT);
        cx_stage_progress(st);
        assert_false(x.done); /* the network (and the slow sim) still hold slots */
        net_run(CX_EPEER);    /* the backend's disconnect fails what it held */
        struct xfer *xs[] = { &x };
        drive(st, xs, 1);
        assert_int_equal(x.status, CX_ETIMEDOUT);
        assert_true(x.net_ok < 64);
        assert_all_slots_back(st);
        cx_gpu_dev_free(dev);
        free(h);
    }
    cx_stage_destroy(st);
}

/* Bad input gets CX_EINVAL and a log line; misuse of chunk_done is ignored. */
static void t_bad_input(void **state)
{
    (void)state;
    cx_stage_t *st = mk(4096, 2, 0);
    void *dev;
    assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, 10000, &dev), CX_OK);
    char host[100];
    struct xfer x = { .fail_chunk = -1 };
    cx_stage_job_t *j = (cx_stage_job_t *)1;
    assert_int_equal(cx_stage_start(st, CX_STAGE_OUT, dev, 0, 0, cbs_for(&x), &j), CX_EINVAL);
    assert_null(j);
    assert_int_equal(cx_stage_start(st, CX_STAGE_OUT, NULL, 1, 0, cbs_for(&x), &j), CX_EINVAL);
    assert_int_equal(cx_stage_start(st, 5, dev, 1, 0, cbs_for(&x), &j), CX_EINVAL);
    assert_int_equal(cx_stage_start(st, CX_STAGE_OUT, dev, 1, 0x80, cbs_for(&x), &j), CX_EINVAL);
    assert_int_equal(cx_stage_start(st, CX_STAGE_OUT, dev, 10001, 0, cbs_for(&x), &j), CX_EINVAL);
    assert_int_equal(cx_stage_start(st, CX_STAGE_OUT, host, sizeof host, 0, cbs_for(&x), &j), CX_EINVAL);
    assert_int_equal(cx_stage_start(st, CX_STAGE_OUT, dev, 1, 0, NULL, &j), CX_EINVAL);
    cx_stage_cfg_t bad = { (size_t)2 << 30, 4, 2, 0 };
    cx_stage_t *st2 = (cx_stage_t *)1;
    assert_int_equal(cx_stage_create(g_kind, 0, &bad, &st2), CX_EINVAL);
    assert_null(st2);
    assert_int_equal(cx_stage_create(CX_MEM_HOST, 0, NULL, &st2), CX_EINVAL);

    /* chunk_done for a chunk the caller does not hold: logged and ignored. */
    x = (struct xfer){ .dir = CX_STAGE_IN, .host = (unsigned char *)host, .len = 100, .hold = 1, .fail_chunk = -1 };
    assert_int_equal(cx_stage_start(st, CX_STAGE_IN, dev, 100, 0, cbs_for(&x), &x.job), CX_OK);
    cx_stage_progress(st);
    assert_int_equal(g_nnet, 1);
    cx_stage_chunk_done(x.job, 3, CX_OK);
    cx_stage_chunk_done(NULL, 0, CX_OK);
    cx_stage_cancel(NULL, CX_EPEER);
    x.hold = 0;
    struct xfer *xs[] = { &x };
    drive(st, xs, 1);
    assert_int_equal(x.status, CX_OK);
    cx_gpu_dev_free(dev);
    cx_stage_destroy(st);
}

/* Destroy with transfers alive: copies drain, jobs whose slots came back finish with
 * CX_ECLOSED, the rest are dropped with a warning; nothing leaks (ASan). */
static void t_destroy_alive(void **state)
{
    (void)state;
    g_nnet = 0;
    cx_stage_t *st = mk(8192, 4, 2);
    void *dev;
    size_t len = 100000;
    assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &dev), CX_OK);
    unsigned char *h = calloc(1, len);
    struct xfer a = { .dir = CX_STAGE_OUT, .host = h, .len = len, .fail_chunk = -1, .hold = 1 };
    struct xfer b = { .dir = CX_STAGE_IN, .host = h, .len = len, .fail_chunk = -1, .hold = 1 };
    struct xfer c = { .dir = CX_STAGE_IN, .host = h, .len = len, .fail_chunk = -1, .hold = 1 };
    assert_int_equal(cx_stage_start(st, CX_STAGE_OUT, dev, len, 0, cbs_for(&a), &a.job), CX_OK);
    assert_int_equal(cx_stage_start(st, CX_STAGE_IN, dev, len, 0, cbs_for(&b), &b.job), CX_OK);
    cx_stage_progress(st); /* a and b take every slot */
    assert_int_equal(cx_stage_start(st, CX_STAGE_IN, dev, len, 0, cbs_for(&c), &c.job), CX_OK);
    cx_stage_destroy(st); /* c still waits for a slot: it finishes with CX_ECLOSED */
    assert_true(c.done);
    assert_int_equal(c.status, CX_ECLOSED);
    g_nnet = 0; /* the dropped jobs' chunks are gone with them */
    cx_gpu_dev_free(dev);
    free(h);
}

/* Two stages play two peers: device -> D2H -> "network" -> H2D -> device, with the copies of
 * both sides overlapping. On the slow sim the pipeline beats doing the copies one after another. */
static int g_overlap_seen; /* B's H2D landed bytes while A's D2H still had chunks to copy */

static double loopback(cx_stage_t *a, cx_stage_t *b, void *src, void *dst, size_t len)
{
    cx_stage_stats_t sa0, sb0, sa, sb;
    cx_stage_get_stats(a, &sa0);
    cx_stage_get_stats(b, &sb0);
    g_overlap_seen = 0;
    struct xfer xa = { .dir = CX_STAGE_OUT, .len = len, .fail_chunk = -1, .hold = 1 };
    struct xfer xb = { .dir = CX_STAGE_IN, .len = len, .fail_chunk = -1, .hold = 1 };
    uint64_t t0 = now_us();
    assert_int_equal(cx_stage_start(a, CX_STAGE_OUT, src, len, CX_STAGE_LAST_AFTER_ALL, cbs_for(&xa), &xa.job), CX_OK);
    assert_int_equal(cx_stage_start(b, CX_STAGE_IN, dst, len, 0, cbs_for(&xb), &xb.job), CX_OK);
    for (int round = 0; round < 10000000 && !(xa.done && xb.done); round++) {
        assert_true(now_us() - t0 < 10000000u);
        struct pollfd p[2] = { { cx_stage_fd(a), POLLIN, 0 }, { cx_stage_fd(b), POLLIN, 0 } };
        poll(p, 2, 20);
        cx_stage_progress(a);
        cx_stage_progress(b);
        cx_stage_get_stats(a, &sa);
        cx_stage_get_stats(b, &sb);
        if (sa.d2h_bytes - sa0.d2h_bytes < len && sb.h2d_bytes > sb0.h2d_bytes) g_overlap_seen = 1;
        /* Match chunk i of the sender with the receiver's slot for chunk i. */
        for (int i = 0; i < g_nnet; i++) {
            if (g_net[i].x != &xa) continue;
            for (int k = 0; k < g_nnet; k++) {
                if (g_net[k].x != &xb || g_net[k].c.index != g_net[i].c.index) continue;
                memcpy(g_net[k].c.host, g_net[i].c.host, g_net[i].c.len);
                cx_stage_chunk_t ca = g_net[i].c, cb = g_net[k].c;
                int hi = i > k ? i : k, lo = i > k ? k : i;
                g_net[hi] = g_net[--g_nnet];
                g_net[lo] = g_net[--g_nnet];
                xa.outstanding--;
                xb.outstanding--;
                xa.net_ok++;
                xb.net_ok++;
                cx_stage_chunk_done(ca.job, ca.index, CX_OK);
                cx_stage_chunk_done(cb.job, cb.index, CX_OK);
                i = -1;
                break;
            }
        }
    }
    assert_int_equal(xa.status, CX_OK);
    assert_int_equal(xb.status, CX_OK);
    assert_int_equal(g_nnet, 0);
    return (double)(now_us() - t0);
}

static void t_loopback_overlap(void **state)
{
    (void)state;
    const size_t C = 1 << 20, len = 16 * C;
    if (g_kind == CX_MEM_SIM) setenv("CONNEX_GPU_SIM_GBPS", "0.5", 1);
    cx_stage_t *a = mk(C, 4, 4), *b = mk(C, 4, 4);
    unsetenv("CONNEX_GPU_SIM_GBPS");
    void *src, *dst;
    assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &src), CX_OK);
    assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &dst), CX_OK);
    unsigned char *ref = malloc(len), *got = malloc(len);
    fill(ref, len, 3);
    assert_int_equal(cx_gpu_memcpy(src, ref, len), CX_OK);
    double us = loopback(a, b, src, dst, len);
    assert_int_equal(cx_gpu_memcpy(got, dst, len), CX_OK);
    assert_memory_equal(ref, got, len);
    if (g_kind == CX_MEM_SIM) {
        /* 16 MiB each way at 0.5 GB/s: 33.5 ms per direction, 67 ms one after the other. */
        double serial = 2.0 * (double)len / 0.5 / 1000.0;
        printf("loopback 16 MiB on the slow sim: %.1f ms (copies one after another: %.1f ms)\n", us / 1000,
               serial / 1000);
        /* Timing on a shared machine is noise; the pipeline's shape is not: the receiver's
         * first H2D finished while the sender's D2H copies were still running. */
        assert_true(g_overlap_seen);
    }
    assert_all_slots_back(a);
    assert_all_slots_back(b);
    cx_stage_destroy(a);
    cx_stage_destroy(b);
    cx_gpu_dev_free(src);
    cx_gpu_dev_free(dst);
    free(ref);
    free(got);
}

/* CONNEX_STAGE_CHUNK=64K CONNEX_STAGE_SLOTS=3 (set by ctest); then a bad value is refused. */
static void t_env(void **state)
{
    (void)state;
    cx_stage_t *st;
    assert_int_equal(cx_stage_create(g_kind, 0, NULL, &st), CX_OK);
    cx_stage_stats_t s;
    cx_stage_get_stats(st, &s);
    assert_int_equal(s.chunk, 64 << 10);
    assert_int_equal(s.slots, 3);
    void *base;
    size_t rlen;
    cx_stage_ring(st, &base, &rlen);
    assert_int_equal(rlen, 3 * (64 << 10));
    assert_int_equal(cx_gpu_mem_kind(base, rlen), CX_MEM_HOST);
    size_t len = 5 * (64 << 10) + 3;
    void *dev;
    assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &dev), CX_OK);
    unsigned char *h = malloc(len);
    fill(h, len, 5);
    struct xfer x = { .dir = CX_STAGE_IN, .host = h, .len = len, .fail_chunk = -1, .check_dev_at_done = 1, .dev = dev };
    assert_int_equal(cx_stage_start(st, CX_STAGE_IN, dev, len, 0, cbs_for(&x), &x.job), CX_OK);
    struct xfer *xs[] = { &x };
    drive(st, xs, 1);
    assert_int_equal(x.status, CX_OK);
    assert_true(x.dev_ok_at_done);
    assert_true(x.max_outstanding <= 2); /* per_job defaults to max(2, slots/2) */
    cx_stage_destroy(st);
    cx_gpu_dev_free(dev);
    free(h);

    const char *bad[] = { "abc", "0", "12Q", "99999999999999" };
    for (int i = 0; i < 4; i++) {
        setenv("CONNEX_STAGE_CHUNK", bad[i], 1);
        st = (cx_stage_t *)1;
        assert_int_equal(cx_stage_create(g_kind, 0, NULL, &st), CX_EINVAL);
        assert_null(st);
    }
    unsetenv("CONNEX_STAGE_CHUNK");
    setenv("CONNEX_STAGE_SLOTS", "0", 1);
    assert_int_equal(cx_stage_create(g_kind, 0, NULL, &st), CX_EINVAL);
}

/* Each case starts with an empty network, even after a failed one. */
static int reset(void **state)
{
    (void)state;
    g_nnet = 0;
    return 0;
}
#define CASE(f) cmocka_unit_test_setup(f, reset)

int main(int argc, char **argv)
{
    const char *k = getenv("CONNEX_GPU_TEST_KIND");
    if (k && !strcmp(k, "cuda"))
        g_kind = CX_MEM_CUDA;
    else
        cx_gpu_sim_enable(1);
    if (g_kind == CX_MEM_CUDA && cx_gpu_init() != CX_OK) {
        fprintf(stderr, "CONNEX_GPU_TEST_KIND=cuda but %s\n", cx_gpu_status());
        return 1;
    }
    if (argc > 1 && !strcmp(argv[1], "env")) {
        const struct CMUnitTest t[] = { CASE(t_env) };
        return cmocka_run_group_tests_name("gpu_stage_env", t, NULL, NULL);
    }
    const struct CMUnitTest t[] = {
        CASE(t_sizes),     CASE(t_small_pieces),  CASE(t_last_after_all),
        CASE(t_many_jobs), CASE(t_peer_killed),   CASE(t_cancel_mid_transfer),
        CASE(t_bad_input), CASE(t_destroy_alive), CASE(t_loopback_overlap),
    };
    int rc = cmocka_run_group_tests_name(g_kind == CX_MEM_CUDA ? "gpu_stage_cuda" : "gpu_stage_sim", t, NULL, NULL);
    if (g_kind == CX_MEM_SIM && cx_gpu_sim_bytes() != 0) {
        fprintf(stderr, "sim memory leaked: %zu bytes\n", cx_gpu_sim_bytes());
        return 1;
    }
    return rc;
}
