/* Traffic classes: cx_read_async / cx_write_async in both classes, data checked byte
 * for byte from 1 B to 64 MiB (sizes that are not multiples of the chunk included); background
 * chunks counted; a critical op issued while a big background transfer runs completes first;
 * kill -9 mid background transfer fails everything with CX_EPEER; a SIGSTOPped peer times out
 * ops of both classes; classes off (config and env); small credits and chunks; bad input.
 * Backend: CONNEX_BACKEND (the test process and its peer both use it). Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxt.h"

#define RS ((size_t)(64u << 20) + (64u << 10)) /* 64 MiB plus room for odd offsets */
#define TSEED 7
#define PSEED 3
#define CHUNK_BYTES (256u << 10) /* the main engine's background chunk */
#define WAIT_MS 90000            /* an op's wait: past the 60 s op timeout, so a stall shows as CX_ETIMEDOUT */

static cx_engine_t *E;
static uint8_t *R;
static cxt_peer_t P;

static const size_t sizes[] = { 1,        7, 4096, 65537, CHUNK_BYTES, CHUNK_BYTES + 1, (1u << 20) + 3, (16u << 20) + 3,
                                64u << 20 };
#define NSIZES (sizeof sizes / sizeof sizes[0])

static size_t loff(size_t len)
{
    return len & 1 ? 5 : 0;
}
static size_t roff(size_t len)
{
    return len & 1 ? 4096 + 13 : 4096;
}

/* An engine with class settings; the rest as cxt_engine makes it. */
static int engine(cx_engine_t **e, const char *model, uint32_t hb, uint32_t hbt, uint32_t opt, uint32_t ccrit,
                  uint32_t cbg, uint32_t chunk, int off)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.heartbeat_ms = hb;
    c.heartbeat_timeout_ms = hbt;
    c.op_timeout_ms = opt;
    c.credits_critical = ccrit;
    c.credits_background = cbg;
    c.background_chunk = chunk;
    c.classes_off = off;
    cxt_apply_test_env(&c);
    int rc = cx_engine_create(&c, e);
    if (rc) fprintf(stderr, "cx_engine_create: %s\n", cx_strerror(rc));
    return rc;
}

static uint64_t stat_chunks(cx_engine_t *e)
{
    cx_stats_t st;
    assert_int_equal(cx_stats(e, &st), CX_OK);
    return st.background_chunks;
}

static int group_setup(void **state)
{
    (void)state;
    /* A 10 s heartbeat timeout: 64 MiB transfers on 2 busy cores must not fail the pair. */
    if (engine(&E, "tclass", 1000, 10000, 60000, 0, 0, CHUNK_BYTES, 0)) return -1;
    R = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (R == MAP_FAILED) return -1;
    cxt_fill(R, RS, TSEED, 0);
    if (cx_register_memory(E, R, RS)) return -1;
    cxt_peer_opts_t o = { .replica = 1, .region = RS, .seed = PSEED, .hb_ms = 1000, .hb_timeout_ms = 10000 };
    if (cxt_peer_start(&P, &o, 10000)) return -1;
    int rc = cx_connect(E, P.url, 5000);
    if (rc) {
        fprintf(stderr, "connect %s: %s\n", P.url, cx_strerror(rc));
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    cxt_peer_stop(&P);
    if (E) {
        cx_unregister_memory(E, R);
        cx_engine_destroy(E);
    }
    if (R && R != MAP_FAILED) munmap(R, RS);
    return 0;
}

static uint64_t chunks_of(size_t n, size_t chunk)
{
    return (n + chunk - 1) / chunk;
}

static void read_sizes(cx_class_t cls)
{
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i], lo = loff(n), ro = roff(n);
        memset(R + lo, 0, n);
        if (lo) R[lo - 1] = 0xA5;
        R[lo + n] = 0x5A;
        uint64_t c0 = stat_chunks(E);
        cx_op_t *op = NULL;
        uint64_t t0 = cxt_now_ns();
        int rc = cx_read_async(E, P.url, R + lo, P.base + ro, n, cls, &op);
        if (rc) fail_msg("read_async %zu B class %d: %s", n, cls, cx_strerror(rc));
        assert_non_null(op);
        rc = cx_op_wait(op, WAIT_MS);
        if (rc) fail_msg("read_async %zu B class %d completed with %s", n, cls, cx_strerror(rc));
        double ms = cxt_ms_since(t0);
        long long bad = cxt_check(R + lo, n, PSEED, ro);
        if (bad >= 0) fail_msg("read_async %zu B class %d: byte %lld differs", n, cls, bad);
        if (lo) assert_int_equal(R[lo - 1], 0xA5);
        assert_int_equal(R[lo + n], 0x5A);
        uint64_t dc = stat_chunks(E) - c0;
        assert_int_equal(dc, cls == CX_CLASS_BACKGROUND ? chunks_of(n, CHUNK_BYTES) : 0);
        fprintf(stderr, "read_async  %s %9zu B  %8.3f ms  %" PRIu64 " chunks\n",
                cls == CX_CLASS_BACKGROUND ? "bg  " : "crit", n, ms, dc);
    }
    cxt_fill(R, RS, TSEED, 0);
}

static void write_sizes(cx_class_t cls)
{
    char rep[256], want[64];
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i], lo = loff(n), ro = roff(n);
        assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED), 0);
        uint64_t c0 = stat_chunks(E);
        cx_op_t *op = NULL;
        int rc = cx_write_async(E, P.url, R + lo, P.base + ro, n, cls, &op);
        if (rc) fail_msg("write_async %zu B class %d: %s", n, cls, cx_strerror(rc));
        rc = cx_op_wait(op, WAIT_MS);
        if (rc) fail_msg("write_async %zu B class %d completed with %s", n, cls, cx_strerror(rc));
        /* Completed: the data is in place at the target, and nothing around it changed. */
        assert_int_equal(cxt_peer_cmd(&P, 20000, rep, sizeof rep, "HASH %zu %zu", ro, n), 0);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(R + lo, n));
        if (strcmp(rep, want)) fail_msg("write_async %zu B class %d: peer has '%s', expected '%s'", n, cls, rep, want);
        uint8_t g[2] = { cxt_pat(PSEED, ro - 1), cxt_pat(PSEED, ro + n) };
        assert_int_equal(cxt_peer_cmd(&P, 5000, rep, sizeof rep, "HASH %zu 1", ro - 1), 0);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(&g[0], 1));
        assert_string_equal(rep, want);
        assert_int_equal(cxt_peer_cmd(&P, 5000, rep, sizeof rep, "HASH %zu 1", ro + n), 0);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(&g[1], 1));
        assert_string_equal(rep, want);
        assert_int_equal(stat_chunks(E) - c0, cls == CX_CLASS_BACKGROUND ? chunks_of(n, CHUNK_BYTES) : 0);
    }
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED), 0); /* the pattern back */
}

static void test_read_critical(void **s)
{
    (void)s;
    read_sizes(CX_CLASS_CRITICAL);
}
static void test_read_background(void **s)
{
    (void)s;
    read_sizes(CX_CLASS_BACKGROUND);
}
static void test_write_critical(void **s)
{
    (void)s;
    write_sizes(CX_CLASS_CRITICAL);
}
static void test_write_background(void **s)
{
    (void)s;
    write_sizes(CX_CLASS_BACKGROUND);
}

/* Many ops of both classes at once, each on its own range: all complete, all data right. */
static void test_mixed_concurrent(void **state)
{
    (void)state;
    enum { N = 24 };
    const size_t n = (1u << 20) + 777; /* ~1 MiB each: 24 fit the 64 MiB region twice over */
    cx_op_t *ops[N];
    memset(R, 0, RS);
    for (int i = 0; i < N; i++) {
        size_t off = (size_t)i * (2u << 20);
        cx_class_t cls = i % 3 ? CX_CLASS_BACKGROUND : CX_CLASS_CRITICAL;
        assert_int_equal(cx_read_async(E, P.lid, R + off, P.base + off, n, cls, &ops[i]), CX_OK);
    }
    for (int i = 0; i < N; i++) {
        int rc = cx_op_wait(ops[i], WAIT_MS);
        if (rc) fail_msg("op %d: %s", i, cx_strerror(rc));
        size_t off = (size_t)i * (2u << 20);
        long long bad = cxt_check(R + off, n, PSEED, off);
        if (bad >= 0) fail_msg("op %d: byte %lld differs", i, bad);
    }
    cx_stats_t st;
    assert_int_equal(cx_stats(E, &st), CX_OK);
    assert_int_equal(st.ops_in_flight, 0);
    cxt_fill(R, RS, TSEED, 0);
}

/* A critical op issued while a 64 MiB background transfer runs completes before it. Ordering
 * only: no speed is asserted. */
static void ordering(int write)
{
    const size_t big = 64u << 20, small = 16u << 10;
    cx_stats_t st0, st1;
    assert_int_equal(cx_stats(E, &st0), CX_OK);
    cx_op_t *bg = NULL;
    if (write)
        assert_int_equal(cx_write_async(E, P.lid, R, P.base, big, CX_CLASS_BACKGROUND, &bg), CX_OK);
    else
        assert_int_equal(cx_read_async(E, P.lid, R, P.base, big, CX_CLASS_BACKGROUND, &bg), CX_OK);
    /* Wait until the transfer is under way (its first chunk counted) before the critical op. */
    for (int i = 0; i < 2000; i++) {
        cx_stats_t st;
        assert_int_equal(cx_stats(E, &st), CX_OK);
        if (st.background_chunks > st0.background_chunks) break;
        usleep(500);
    }
    uint8_t *dst = R + big + 4096;
    int rc = write ? cx_write(E, P.lid, dst, P.base + big + 4096, small)
                   : cx_read(E, P.lid, dst, P.base + big + 4096, small);
    assert_int_equal(rc, CX_OK);
    /* The critical op is done; the background transfer must still be running. */
    int bg_rc = cx_op_wait(bg, 0);
    assert_int_equal(cx_stats(E, &st1), CX_OK);
    fprintf(stderr, "%s: background after the critical op: %s; chunks so far %" PRIu64 ", deferred %" PRIu64 "\n",
            write ? "write" : "read", bg_rc == CX_EINPROGRESS ? "still running" : cx_strerror(bg_rc),
            st1.background_chunks - st0.background_chunks, st1.background_deferred - st0.background_deferred);
    if (bg_rc != CX_EINPROGRESS) fail_msg("the 64 MiB background transfer finished before a 16 KiB critical op");
    assert_int_equal(cx_op_wait(bg, WAIT_MS), CX_OK);
    if (!write) {
        long long bad = cxt_check(R, big, PSEED, 0);
        if (bad >= 0) fail_msg("background read: byte %lld differs", bad);
        bad = cxt_check(dst, small, PSEED, big + 4096);
        if (bad >= 0) fail_msg("critical read: byte %lld differs", bad);
        cxt_fill(R, RS, TSEED, 0);
    } else {
        char rep[128], want[64];
        assert_int_equal(cxt_peer_cmd(&P, 20000, rep, sizeof rep, "HASH 0 %zu", big), 0);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(R, big));
        assert_string_equal(rep, want);
        assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED), 0);
    }
}

static void test_critical_first_read(void **s)
{
    (void)s;
    ordering(0);
}
static void test_critical_first_write(void **s)
{
    (void)s;
    ordering(1);
}

/* One credit per class, chunks of 1 byte (rounded up to 4 KiB): many ops queue for credit,
 * every one completes with its data. */
static void test_small_credits(void **state)
{
    (void)state;
    cx_engine_t *e = NULL;
    assert_int_equal(engine(&e, "tclass-small", 1000, 10000, 60000, 1, 1, 1, 0), CX_OK);
    const size_t len = 4u << 20;
    uint8_t *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(r != MAP_FAILED);
    assert_int_equal(cx_register_memory(e, r, len), CX_OK);
    assert_int_equal(cx_connect(e, P.url, 5000), CX_OK);
    enum { N = 32 };
    cx_op_t *ops[N];
    const size_t each = 10000; /* 3 chunks of 4 KiB for a background op */
    for (int i = 0; i < N; i++)
        assert_int_equal(cx_read_async(e, P.lid, r + (size_t)i * 16384, P.base + (size_t)i * 16384, each,
                                       i % 2 ? CX_CLASS_BACKGROUND : CX_CLASS_CRITICAL, &ops[i]),
                         CX_OK);
    for (int i = 0; i < N; i++) {
        int rc = cx_op_wait(ops[i], WAIT_MS);
        if (rc) fail_msg("op %d: %s", i, cx_strerror(rc));
        long long bad = cxt_check(r + (size_t)i * 16384, each, PSEED, (size_t)i * 16384);
        if (bad >= 0) fail_msg("op %d: byte %lld differs", i, bad);
    }
    cx_stats_t st;
    assert_int_equal(cx_stats(e, &st), CX_OK);
    assert_int_equal(st.background_chunks, (N / 2) * 3);
    assert_int_equal(st.ops_in_flight, 0);
    assert_int_equal(st.ops[CX_OPK_READ], N);
    /* Messages are critical ops too: with one credit they still arrive, in order. */
    for (int i = 0; i < 5; i++) assert_int_equal(cx_send_msg(e, P.lid, "x", 1), CX_OK);
    assert_int_equal(cx_unregister_memory(e, r), CX_OK);
    cx_engine_destroy(e);
    munmap(r, len);
    cxt_peer_drain(&P, 100);
}

/* classes_off (config and env): background ops go whole, no chunk is counted. */
static void classes_off(int via_env)
{
    cx_engine_t *e = NULL;
    if (via_env) setenv("CONNEX_CLASSES", "off", 1);
    int rc = engine(&e, via_env ? "tclass-offenv" : "tclass-off", 1000, 10000, 60000, 0, 0, 4096, !via_env);
    if (via_env) unsetenv("CONNEX_CLASSES");
    assert_int_equal(rc, CX_OK);
    const size_t len = 8u << 20;
    uint8_t *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(r != MAP_FAILED);
    assert_int_equal(cx_register_memory(e, r, len), CX_OK);
    cx_op_t *a = NULL, *b = NULL;
    assert_int_equal(cx_read_async(e, P.url, r, P.base, len / 2, CX_CLASS_BACKGROUND, &a), CX_OK);
    assert_int_equal(cx_read_async(e, P.url, r + len / 2, P.base + len / 2, len / 2, CX_CLASS_CRITICAL, &b), CX_OK);
    assert_int_equal(cx_op_wait(a, WAIT_MS), CX_OK);
    assert_int_equal(cx_op_wait(b, WAIT_MS), CX_OK);
    assert_int_equal(cxt_check(r, len, PSEED, 0), -1);
    cxt_fill(r, len, 11, 0);
    assert_int_equal(cx_write_async(e, P.url, r, P.base + (32u << 20), len, CX_CLASS_BACKGROUND, &a), CX_OK);
    assert_int_equal(cx_op_wait(a, WAIT_MS), CX_OK);
    char rep[128], want[64];
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "HASH %u %zu", 32u << 20, len), 0);
    snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(r, len));
    assert_string_equal(rep, want);
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED), 0);
    cx_stats_t st;
    assert_int_equal(cx_stats(e, &st), CX_OK);
    assert_int_equal(st.background_chunks, 0);
    assert_int_equal(st.ops_in_flight, 0);
    assert_int_equal(cx_unregister_memory(e, r), CX_OK);
    cx_engine_destroy(e);
    munmap(r, len);
}

static void test_classes_off(void **s)
{
    (void)s;
    classes_off(0);
}
static void test_classes_off_env(void **s)
{
    (void)s;
    classes_off(1);
}

static void test_bad_input(void **state)
{
    (void)state;
    cx_op_t *op = (cx_op_t *)1;
    assert_int_equal(cx_read_async(E, P.url, R, P.base, 16, (cx_class_t)2, &op), CX_EINVAL);
    assert_null(op);
    assert_int_equal(cx_read_async(E, P.url, R, P.base, 16, (cx_class_t)-1, &op), CX_EINVAL);
    assert_int_equal(cx_write_async(E, P.url, R, P.base, 16, (cx_class_t)7, &op), CX_EINVAL);
    assert_int_equal(cx_read_async(E, P.url, R, P.base, 16, CX_CLASS_BACKGROUND, NULL), CX_EINVAL);
    assert_int_equal(cx_write_async(E, P.url, R, P.base, 16, CX_CLASS_CRITICAL, NULL), CX_EINVAL);
    assert_int_equal(cx_read_async(NULL, P.url, R, P.base, 16, CX_CLASS_CRITICAL, &op), CX_EINVAL);
    assert_int_equal(cx_read_async(E, NULL, R, P.base, 16, CX_CLASS_CRITICAL, &op), CX_EINVAL);
    assert_int_equal(cx_read_async(E, P.url, R, P.base, 0, CX_CLASS_BACKGROUND, &op), CX_EINVAL);
    uint8_t local[64];
    assert_int_equal(cx_read_async(E, P.url, local, P.base, sizeof local, CX_CLASS_BACKGROUND, &op), CX_EINVAL);
    assert_int_equal(cx_write_async(E, P.url, R, UINT64_MAX - 8, 4096, CX_CLASS_BACKGROUND, &op), CX_EINVAL);
    /* Remote range outside the peer's region: the op fails, for either class. */
    for (int c = 0; c < 2; c++) {
        assert_int_equal(cx_read_async(E, P.url, R, P.base + RS - 100, 4096, (cx_class_t)c, &op), CX_OK);
        assert_int_equal(cx_op_wait(op, WAIT_MS), CX_EINVAL);
    }
    cx_stats_t st;
    assert_int_equal(cx_stats(E, &st), CX_OK);
    assert_int_equal(st.ops_in_flight, 0);
    assert_int_equal(cx_op_wait(NULL, 0), CX_EINVAL);
}

/* ---- failures: own engine and peer each ---- */

typedef struct fixture {
    cx_engine_t *e;
    uint8_t *r;
    cxt_peer_t p;
} fixture_t;

static int make(fixture_t *f, uint32_t hb, uint32_t hbt, uint32_t opt, uint32_t chunk)
{
    memset(f, 0, sizeof *f);
    f->p.pid = -1;
    f->p.in_fd = f->p.out_fd = -1;
    if (engine(&f->e, "tclass-survivor", hb, hbt, opt, 0, 0, chunk, 0)) return -1;
    f->r = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (f->r == MAP_FAILED) return -1;
    if (cx_register_memory(f->e, f->r, RS)) return -1;
    cxt_peer_opts_t o = { .replica = 2, .region = RS, .seed = 4, .hb_ms = hb, .hb_timeout_ms = hbt };
    if (cxt_peer_start(&f->p, &o, 10000)) return -1;
    return cx_connect(f->e, f->p.url, 5000) ? -1 : 0;
}

static void unmake(fixture_t *f)
{
    cxt_peer_crash(&f->p);
    if (f->e) {
        cx_unregister_memory(f->e, f->r);
        cx_engine_destroy(f->e);
    }
    if (f->r && f->r != MAP_FAILED) munmap(f->r, RS);
}

/* kill -9 mid background transfer: every op fails with CX_EPEER (a critical one may have made
 * it before), nothing hangs, nothing stays in flight. */
static void test_kill9_mid_background(void **state)
{
    (void)state;
    fixture_t f;
    assert_int_equal(make(&f, 100, 1000, 30000, 64u << 10), 0);
    const size_t half = 32u << 20;
    cx_op_t *rd = NULL, *wr = NULL, *cr[4];
    assert_int_equal(cx_read_async(f.e, f.p.lid, f.r, f.p.base, half, CX_CLASS_BACKGROUND, &rd), CX_OK);
    assert_int_equal(cx_write_async(f.e, f.p.lid, f.r + half, f.p.base + half, half, CX_CLASS_BACKGROUND, &wr), CX_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(cx_read_async(f.e, f.p.lid, f.r + RS - 65536 + i * 4096, f.p.base + (size_t)i * 4096, 4096,
                                       CX_CLASS_CRITICAL, &cr[i]),
                         CX_OK);
    /* Under way: some chunks done, the peer dies in the middle. */
    for (int i = 0; i < 2000; i++) {
        cx_stats_t st;
        assert_int_equal(cx_stats(f.e, &st), CX_OK);
        if (st.background_chunks >= 4) break;
        usleep(500);
    }
    uint64_t t0 = cxt_now_ns();
    cxt_peer_crash(&f.p);
    int rc = cx_op_wait(rd, 10000);
    if (rc != CX_EPEER) fail_msg("background read: %s, expected CX_EPEER", cx_strerror(rc));
    rc = cx_op_wait(wr, 10000);
    if (rc != CX_EPEER) fail_msg("background write: %s, expected CX_EPEER", cx_strerror(rc));
    for (int i = 0; i < 4; i++) {
        rc = cx_op_wait(cr[i], 10000);
        if (rc != CX_OK && rc != CX_EPEER) fail_msg("critical read %d: %s", i, cx_strerror(rc));
    }
    fprintf(stderr, "every op completed %.1f ms after kill -9\n", cxt_ms_since(t0));
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_int_equal(st.ops_in_flight, 0);
    assert_true(st.op_errors[CX_OPK_READ] >= 1);
    assert_true(st.op_errors[CX_OPK_WRITE] >= 1);
    /* After the failure new ops of both classes fail at once, nothing queues. */
    assert_int_equal(cx_read_async(f.e, f.p.lid, f.r, f.p.base, 1u << 20, CX_CLASS_BACKGROUND, &rd), CX_OK);
    assert_int_equal(cx_op_wait(rd, 10000), CX_EPEER);
    assert_int_equal(cx_read(f.e, f.p.lid, f.r, f.p.base, 4096), CX_EPEER);
    unmake(&f);
}

/* kill() returns before the target stops: wait (bounded) until every thread of pid is stopped, so
 * no op issued afterwards can be served. 1 when it is. */
static int all_stopped(pid_t pid, int timeout_ms)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    for (int i = 0; i < timeout_ms; i++) {
        DIR *d = opendir(dir);
        if (!d) return 0;
        int running = 0, n = 0;
        for (struct dirent *de; (de = readdir(d));) {
            if (de->d_name[0] == '.') continue;
            char path[384], buf[512];
            snprintf(path, sizeof path, "%s/%s/stat", dir, de->d_name);
            FILE *f = fopen(path, "r");
            if (!f) continue;
            size_t k = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[k] = 0;
            char *rp = strrchr(buf, ')'); /* "pid (comm) S ..." */
            n++;
            if (!rp || rp[1] != ' ' || (rp[2] != 'T' && rp[2] != 't')) running = 1;
        }
        closedir(d);
        if (n && !running) return 1;
        usleep(1000);
    }
    return 0;
}

/* SIGSTOP: ops of both classes time out (op timeout below the heartbeat timeout), nothing lands
 * in the caller's buffer afterwards. */
static void test_sigstop_timeout(void **state)
{
    (void)state;
    fixture_t f;
    const uint32_t opt = 500;
    assert_int_equal(make(&f, 200, 5000, opt, 256u << 10), 0);
    assert_int_equal(cx_read(f.e, f.p.lid, f.r, f.p.base, 4096), CX_OK);
    memset(f.r, 0, RS);
    cxt_peer_signal(&f.p, SIGSTOP);
    if (!all_stopped(f.p.pid, 2000)) {
        cxt_peer_signal(&f.p, SIGCONT);
        fail_msg("the peer did not stop within 2 s of SIGSTOP");
    }
    uint64_t t0 = cxt_now_ns();
    cx_op_t *bg = NULL, *cr = NULL, *bw = NULL;
    assert_int_equal(cx_read_async(f.e, f.p.lid, f.r, f.p.base, 16u << 20, CX_CLASS_BACKGROUND, &bg), CX_OK);
    assert_int_equal(
        cx_write_async(f.e, f.p.lid, f.r + (32u << 20), f.p.base + (32u << 20), 16u << 20, CX_CLASS_BACKGROUND, &bw),
        CX_OK);
    assert_int_equal(cx_read_async(f.e, f.p.lid, f.r + (20u << 20), f.p.base, 16384, CX_CLASS_CRITICAL, &cr), CX_OK);
    int rb = cx_op_wait(bg, 10000), rw = cx_op_wait(bw, 10000), rc = cx_op_wait(cr, 10000);
    double ms = cxt_ms_since(t0);
    fprintf(stderr, "stopped peer: background read %s, background write %s, critical %s after %.1f ms\n",
            cx_strerror(rb), cx_strerror(rw), cx_strerror(rc), ms);
    cxt_peer_signal(&f.p, SIGCONT);
    assert_int_equal(rb, CX_ETIMEDOUT);
    assert_int_equal(rw, CX_ETIMEDOUT);
    assert_int_equal(rc, CX_ETIMEDOUT);
    if (ms > 4 * opt + 3000) fail_msg("took %.1f ms with a %u ms op timeout", ms, opt);
    usleep(300 * 1000);
    for (size_t i = 0; i < (16u << 20); i++)
        if (f.r[i]) fail_msg("byte %zu of a timed-out background read changed after it completed", i);
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_int_equal(st.ops_in_flight, 0);
    assert_true(st.op_timeouts >= 3);
    /* The peer is back: both classes work again. */
    assert_int_equal(cx_read_async(f.e, f.p.lid, f.r, f.p.base, 3u << 20, CX_CLASS_BACKGROUND, &bg), CX_OK);
    assert_int_equal(cx_op_wait(bg, WAIT_MS), CX_OK);
    assert_int_equal(cxt_check(f.r, 3u << 20, 4, 0), -1);
    unmake(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bad_input, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_read_critical, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_read_background, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_write_critical, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_write_background, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_mixed_concurrent, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_critical_first_read, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_critical_first_write, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_small_credits, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_classes_off, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_classes_off_env, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_kill9_mid_background, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_sigstop_timeout, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    return cxt_run_tests(tests, group_setup, group_teardown);
}
