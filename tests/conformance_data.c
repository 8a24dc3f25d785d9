/* Conformance, data path: read, write and put_signal from 1 B to 64 MiB in both directions, the
 * data checked byte for byte (locally with the pattern, remotely by hash); put_signal's message
 * is checked against the target memory the moment it arrives; messages both ways; stats; a clean
 * close gives LEFT. Backend: CONNEX_BACKEND (the test process and its peer both use it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "cxt.h"

#define RS ((size_t)(64u << 20) + (64u << 10)) /* 64 MiB plus room for odd offsets */
#define TSEED 7
#define PSEED 3

static cx_engine_t *E;
static uint8_t *R;
static cxt_peer_t P;
static char E_LID[CX_URL_MAX];
static int fds_before[256], nfds_before;

static const size_t sizes[] = { 1, 7, 4096, 16385, 65536, 65537, 1u << 20, (16u << 20) + 3, 64u << 20 };
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Odd offsets for odd sizes, so unaligned transfers are covered. */
static size_t loff(size_t len)
{
    return len & 1 ? 5 : 0;
}
static size_t roff(size_t len)
{
    return len & 1 ? 4096 + 13 : 4096;
}

static int group_setup(void **state)
{
    (void)state;
    nfds_before = cxt_list_fds(fds_before, 256);
    /* This suite is about data, not failure detection (conformance_failure): a heartbeat timeout
     * of 10 s keeps a starved machine (64 MiB transfers in a Debug build on 2 busy cores) from
     * failing the pair in the middle of a transfer. */
    if (cxt_engine(&E, "tester", 0, 1000, 10000, 60000)) return -1;
    cx_url_t u;
    if (cx_url_parse(cx_engine_local_url(E), &u, NULL, 0)) return -1;
    cx_lid_format(&u.lid, E_LID, sizeof E_LID);
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
    cx_event_t ev;
    if (cxt_wait_event(E, P.lid, CX_EVENT_UP, 5000, &ev, NULL)) {
        fprintf(stderr, "no UP event for %s\n", P.lid);
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

static void test_connected(void **state)
{
    (void)state;
    assert_int_equal(cx_peer_state(E, P.url), CX_PEER_UP);
    assert_int_equal(cx_peer_state(E, P.lid), CX_PEER_UP); /* bare LID once known */
    const char *b = cx_peer_backend(E, P.url);
    assert_non_null(b);
    const char *want = getenv("CONNEX_BACKEND");
    if (want && *want && strcmp(want, "auto") != 0) {
        assert_string_equal(b, want);
        assert_non_null(strstr(cx_engine_backends(E), want));
    }
    fprintf(stderr, "pair uses backend %s (engine opened %s)\n", b, cx_engine_backends(E));
    assert_int_equal(cx_peer_state(E, "nobody|9|9|9"), CX_PEER_UNKNOWN);
    assert_null(cx_peer_backend(E, "nobody|9|9|9"));
}

/* Every fd the engine opened is close-on-exec: peers this process forks must not inherit them
 * (a child holding a copy of a control socket hides the parent's death from its peers). */
static void test_fds_cloexec(void **state)
{
    (void)state;
    const char *be = getenv("CONNEX_BACKEND");
    if (be && strcmp(be, "ucx") == 0) {
        /* UCX 1.13 opens its own sockets, pipes, epoll sets and timers without close-on-exec and
         * has no setting for it; a library must not flip flags on fds it does not own, so with
         * UCX only connex's own control sockets are checked. */
        cx_url_t u;
        assert_int_equal(cx_url_parse(cx_engine_local_url(E), &u, NULL, 0), CX_OK);
        uint16_t ports[2] = { u.port, P.port };
        int checked = 0;
        assert_int_equal(cxt_sockets_without_cloexec(ports, 2, &checked), 0);
        assert_true(checked >= 2); /* the listen socket and the connection to the peer */
        return;
    }
    if (be && strcmp(be, "libfabric") == 0) {
        /* libfabric 1.17 accepts and opens its sockets without close-on-exec; the backend's fd
         * sweep (backends/libfabric/fi_fd.c) marks every new one within milliseconds, so a
         * connection libfabric accepts in the background may be seen for that long. */
        for (int i = 0; i < 200 && cxt_fds_without_cloexec(fds_before, nfds_before); i++) usleep(10000);
    }
    assert_int_equal(cxt_fds_without_cloexec(fds_before, nfds_before), 0);
}

static void test_read_sizes(void **state)
{
    (void)state;
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i], lo = loff(n), ro = roff(n);
        memset(R + lo, 0, n);
        if (lo) R[lo - 1] = 0xA5;
        R[lo + n] = 0x5A;
        uint64_t t0 = cxt_now_ns();
        int rc = cx_read(E, P.url, R + lo, P.base + ro, n);
        double ms = cxt_ms_since(t0);
        if (rc) fail_msg("read %zu B: %s", n, cx_strerror(rc));
        long long bad = cxt_check(R + lo, n, PSEED, ro);
        if (bad >= 0) fail_msg("read %zu B: byte %lld differs", n, bad);
        if (lo) assert_int_equal(R[lo - 1], 0xA5); /* nothing written outside the range */
        assert_int_equal(R[lo + n], 0x5A);
        fprintf(stderr, "read  %9zu B  %8.3f ms\n", n, ms);
    }
    cxt_fill(R, RS, TSEED, 0);
}

static void test_write_sizes(void **state)
{
    (void)state;
    char rep[256];
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i], lo = loff(n), ro = roff(n);
        assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED), 0);
        uint64_t t0 = cxt_now_ns();
        int rc = cx_write(E, P.url, R + lo, P.base + ro, n);
        double ms = cxt_ms_since(t0);
        if (rc) fail_msg("write %zu B: %s", n, cx_strerror(rc));
        /* The write call returned: the data must be in place at the target now. */
        assert_int_equal(cxt_peer_cmd(&P, 20000, rep, sizeof rep, "HASH %zu %zu", ro, n), 0);
        char want[64];
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(R + lo, n));
        if (strcmp(rep, want)) fail_msg("write %zu B: peer has '%s', expected '%s'", n, rep, want);
        /* Guard bytes on both sides untouched. */
        uint8_t g[2] = { cxt_pat(PSEED, ro - 1), cxt_pat(PSEED, ro + n) };
        assert_int_equal(cxt_peer_cmd(&P, 5000, rep, sizeof rep, "HASH %zu 1", ro - 1), 0);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(&g[0], 1));
        assert_string_equal(rep, want);
        assert_int_equal(cxt_peer_cmd(&P, 5000, rep, sizeof rep, "HASH %zu 1", ro + n), 0);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(&g[1], 1));
        assert_string_equal(rep, want);
        fprintf(stderr, "write %9zu B  %8.3f ms\n", n, ms);
    }
}

static void test_put_signal_sizes(void **state)
{
    (void)state;
    char rep[256], line[512];
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i], lo = loff(n), ro = roff(n);
        /* Fresh, different bytes at the target, so a signal that overtakes its data sees them. */
        assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED + 100 + (unsigned)i), 0);
        char msg[128];
        snprintf(msg, sizeof msg, "CHK %" PRIx64 " %zu %" PRIx64, P.base + ro, n, cxt_hash(R + lo, n));
        cx_op_t *op = NULL;
        uint64_t t0 = cxt_now_ns();
        int rc = cx_put_signal(E, P.url, R + lo, P.base + ro, n, msg, strlen(msg), &op);
        if (rc) fail_msg("put_signal %zu B: %s", n, cx_strerror(rc));
        assert_non_null(op);
        rc = cx_op_wait(op, -1);
        double ms = cxt_ms_since(t0);
        if (rc) fail_msg("put_signal %zu B completed with %s", n, cx_strerror(rc));
        if (cxt_peer_expect(&P, "MSG ", 20000, line, sizeof line))
            fail_msg("put_signal %zu B: the peer got no message", n);
        char want[256];
        snprintf(want, sizeof want, "MSG %s %zu %" PRIx64 " CHK OK", E_LID, strlen(msg), cxt_hash(msg, strlen(msg)));
        if (strcmp(line, want)) fail_msg("put_signal %zu B: peer said '%s', expected '%s'", n, line, want);
        fprintf(stderr, "put_signal %9zu B  %8.3f ms\n", n, ms);
    }
}

static void test_peer_reads_from_us(void **state)
{
    (void)state;
    char rep[256], want[64];
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i], lo = loff(n), ro = roff(n);
        /* The peer names us by bare LID: it knows us from our HELLO. */
        int rc = cxt_peer_cmd(&P, 60000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " %zu %zu", E_LID, (uintptr_t)(R + ro),
                              n, lo);
        if (rc) fail_msg("peer read %zu B: %s", n, rep);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(R + ro, n));
        if (strcmp(rep, want)) fail_msg("peer read %zu B: got '%s', expected '%s'", n, rep, want);
    }
}

static void test_peer_writes_to_us(void **state)
{
    (void)state;
    char rep[256];
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL 11"), 0);
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i], lo = loff(n), ro = roff(n);
        memset(R + ro - 1, 0, n + 2);
        int rc = cxt_peer_cmd(&P, 60000, rep, sizeof rep, "WRITE %s 0x%" PRIxPTR " %zu %zu", E_LID, (uintptr_t)(R + ro),
                              n, lo);
        if (rc) fail_msg("peer write %zu B: %s", n, rep);
        long long bad = cxt_check(R + ro, n, 11, lo);
        if (bad >= 0) fail_msg("peer write %zu B: byte %lld differs", n, bad);
        assert_int_equal(R[ro - 1], 0);
        assert_int_equal(R[ro + n], 0);
    }
    cxt_fill(R, RS, TSEED, 0);
}

struct sig_rx {
    int rc;
    char verdict[256];
    size_t len;
    char from[CX_URL_MAX];
};

/* Checks the message against our memory the moment it arrives. */
static void *sig_receiver(void *arg)
{
    struct sig_rx *s = arg;
    cx_msg_t m;
    s->rc = cx_recv_msg(E, &m, 60000);
    if (s->rc) return NULL;
    char txt[128];
    size_t c = m.len < sizeof txt - 1 ? m.len : sizeof txt - 1;
    memcpy(txt, m.data, c);
    txt[c] = 0;
    unsigned long long addr, len, h;
    s->len = m.len;
    cx_lid_format(&m.from, s->from, sizeof s->from);
    if (sscanf(txt, "CHK %llx %llu %llx", &addr, &len, &h) != 3)
        snprintf(s->verdict, sizeof s->verdict, "not a CHK message: '%s'", txt);
    else if (addr < (uintptr_t)R || addr + len > (uintptr_t)R + RS)
        snprintf(s->verdict, sizeof s->verdict, "outside our region");
    else if (cxt_hash((void *)(uintptr_t)addr, len) != h)
        snprintf(s->verdict, sizeof s->verdict, "data not in place when the signal arrived");
    else
        snprintf(s->verdict, sizeof s->verdict, "OK");
    cx_msg_release(&m);
    return NULL;
}

static void test_peer_put_signal_to_us(void **state)
{
    (void)state;
    char rep[256];
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL 17"), 0);
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i], lo = loff(n), ro = roff(n);
        memset(R + ro, 0xEE, n);
        struct sig_rx s;
        memset(&s, 0, sizeof s);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, sig_receiver, &s), 0);
        int rc = cxt_peer_cmd(&P, 60000, rep, sizeof rep, "PUTSIG %s 0x%" PRIxPTR " %zu %zu", E_LID,
                              (uintptr_t)(R + ro), n, lo);
        pthread_join(th, NULL); /* bounded: the receiver waits at most 60 s */
        if (rc) fail_msg("peer put_signal %zu B: %s", n, rep);
        if (s.rc) fail_msg("put_signal %zu B: no message (%s)", n, cx_strerror(s.rc));
        if (strcmp(s.verdict, "OK")) fail_msg("put_signal %zu B: %s", n, s.verdict);
        assert_string_equal(s.from, P.lid);
        long long bad = cxt_check(R + ro, n, 17, lo);
        if (bad >= 0) fail_msg("peer put_signal %zu B: byte %lld differs", n, bad);
    }
    cxt_fill(R, RS, TSEED, 0);
}

static const size_t msizes[] = { 0, 1, 4096, (1u << 20) + 1, 16u << 20, CX_MSG_MAX };

static void test_messages_to_peer(void **state)
{
    (void)state;
    char line[512], want[256];
    uint8_t *buf = malloc(CX_MSG_MAX);
    assert_non_null(buf);
    for (size_t i = 0; i < sizeof msizes / sizeof msizes[0]; i++) {
        size_t n = msizes[i];
        cxt_fill(buf, n, 40 + (uint32_t)i, 0);
        int rc = cx_send_msg(E, P.url, buf, n);
        if (rc) fail_msg("send %zu B: %s", n, cx_strerror(rc));
        if (cxt_peer_expect(&P, "MSG ", 30000, line, sizeof line)) fail_msg("send %zu B: not received", n);
        snprintf(want, sizeof want, "MSG %s %zu %" PRIx64, E_LID, n, cxt_hash(buf, n));
        if (strcmp(line, want)) fail_msg("send %zu B: peer said '%s', expected '%s'", n, line, want);
    }
    /* Order is kept between one sender and one receiver. */
    for (int k = 0; k < 50; k++) {
        uint8_t b[8];
        cxt_fill(b, sizeof b, 1000 + (uint32_t)k, 0);
        assert_int_equal(cx_send_msg(E, P.lid, b, sizeof b), CX_OK);
    }
    for (int k = 0; k < 50; k++) {
        uint8_t b[8];
        cxt_fill(b, sizeof b, 1000 + (uint32_t)k, 0);
        if (cxt_peer_expect(&P, "MSG ", 10000, line, sizeof line)) fail_msg("message %d of 50 lost", k);
        snprintf(want, sizeof want, "MSG %s 8 %" PRIx64, E_LID, cxt_hash(b, 8));
        if (strcmp(line, want)) fail_msg("message %d out of order: '%s'", k, line);
    }
    free(buf);
}

static void test_messages_from_peer(void **state)
{
    (void)state;
    char rep[256];
    for (size_t i = 0; i < sizeof msizes / sizeof msizes[0]; i++) {
        size_t n = msizes[i];
        int rc = cxt_peer_cmd(&P, 30000, rep, sizeof rep, "SEND %s %zu %u", E_LID, n, 60 + (unsigned)i);
        if (rc) fail_msg("peer send %zu B: %s", n, rep);
        cx_msg_t m;
        rc = cx_recv_msg(E, &m, 30000);
        if (rc) fail_msg("recv %zu B: %s", n, cx_strerror(rc));
        assert_int_equal(m.len, n);
        char from[CX_URL_MAX];
        cx_lid_format(&m.from, from, sizeof from);
        assert_string_equal(from, P.lid);
        assert_string_equal(m.from_url, P.url);
        if (n) {
            assert_non_null(m.data);
            long long bad = cxt_check(m.data, n, 60 + (uint32_t)i, 0);
            if (bad >= 0) fail_msg("message %zu B: byte %lld differs", n, bad);
        }
        cx_msg_release(&m);
    }
    cx_msg_t m;
    assert_int_equal(cx_recv_msg(E, &m, 50), CX_ETIMEDOUT); /* nothing else queued */
}

static void test_stats(void **state)
{
    (void)state;
    cx_stats_t a, b;
    assert_int_equal(cx_stats(E, &a), CX_OK);
    assert_int_equal(a.regions, 1);
    assert_int_equal(a.registered_bytes, RS);
    assert_true(a.peers_up >= 1);
    assert_int_equal(a.ops_in_flight, 0);
    assert_int_equal(cx_read(E, P.lid, R, P.base, 4096), CX_OK);
    assert_int_equal(cx_write(E, P.lid, R, P.base, 100), CX_OK);
    assert_int_equal(cx_stats(E, &b), CX_OK);
    assert_int_equal(b.ops[CX_OPK_READ], a.ops[CX_OPK_READ] + 1);
    assert_int_equal(b.bytes[CX_OPK_READ], a.bytes[CX_OPK_READ] + 4096);
    assert_int_equal(b.ops[CX_OPK_WRITE], a.ops[CX_OPK_WRITE] + 1);
    assert_int_equal(b.bytes[CX_OPK_WRITE], a.bytes[CX_OPK_WRITE] + 100);
    assert_int_equal(b.op_errors[CX_OPK_READ], a.op_errors[CX_OPK_READ]);
    assert_int_equal(b.ops_in_flight, 0);
    assert_int_equal(b.peer_failures, 0);
    cxt_fill(R, 4096, TSEED, 0);
}

/* 64 verified 4 KiB reads from a fresh engine created with the given CONNEX_DRIVE and
 * CONNEX_POLL_US (read at create); how many its caller started itself and how many were done
 * while that caller drove the transports. */
static void setenv_saved(const char *name, const char *value, char **saved)
{
    *saved = getenv(name) ? strdup(getenv(name)) : NULL;
    setenv(name, value, 1);
}

static void setenv_restore(const char *name, char *saved)
{
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

static void drive_reads_sleep(const char *drive, const char *poll_us, const char *sleep, uint64_t *driven,
                              uint64_t *done, int *bound)
{
    char *old_d, *old_p, *old_s;
    setenv_saved("CONNEX_DRIVE", drive, &old_d);
    setenv_saved("CONNEX_POLL_US", poll_us, &old_p);
    setenv_saved("CONNEX_DRIVE_SLEEP", sleep, &old_s);
    cx_engine_t *d = NULL;
    int rc = cxt_engine(&d, "tester-drive", 0, 1000, 10000, 60000);
    setenv_restore("CONNEX_DRIVE", old_d);
    setenv_restore("CONNEX_POLL_US", old_p);
    setenv_restore("CONNEX_DRIVE_SLEEP", old_s);
    assert_int_equal(rc, CX_OK);
    uint8_t *buf = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(buf != MAP_FAILED);
    assert_int_equal(cx_register_memory(d, buf, 4096), CX_OK);
    assert_int_equal(cx_connect(d, P.url, 5000), CX_OK);
    /* ZeroMQ is thread-bound (backends/zmq/README.md): 2 when it carries this pair but the engine
     * has other backends too, 1 when it is the engine's only one. */
    cx_peer_info_t pi[4];
    assert_int_equal(cx_peer_list(d, pi, 4), 1);
    *bound = strcmp(pi[0].backend, "zmq") ? 0 : strcmp(cx_engine_backends(d), "zmq") ? 2 : 1;
    /* What the peer holds there now (earlier tests wrote to it), read once by the main engine. */
    assert_int_equal(cx_read(E, P.url, R, P.base + 4096, 64 * 4096), CX_OK);
    cx_stats_t a, b;
    assert_int_equal(cx_stats(d, &a), CX_OK);
    for (int i = 0; i < 64; i++) {
        /* A caller that does something between its ops. Back to back, each read found the
         * progress thread still in the iteration that had just completed (handed off) the one
         * before, on a loaded host for all 64 (ctest -j2: 0 of 64 driven, in CI too); what the
         * test shows is what a caller that finds the transports free does. */
        if (i) usleep(300);
        memset(buf, 0, 4096);
        rc = cx_read(d, P.url, buf, P.base + 4096 + (uint64_t)i * 4096, 4096);
        if (rc) fail_msg("read %d: %s", i, cx_strerror(rc));
        if (memcmp(buf, R + (size_t)i * 4096, 4096)) fail_msg("read %d: data differs", i);
    }
    assert_int_equal(cx_stats(d, &b), CX_OK);
    assert_int_equal(b.ops[CX_OPK_READ] - a.ops[CX_OPK_READ], 64);
    *driven = b.ops_driven - a.ops_driven;
    *done = b.ops_driven_done - a.ops_driven_done;
    fprintf(stderr,
            "CONNEX_DRIVE=%s CONNEX_POLL_US=%s CONNEX_DRIVE_SLEEP=%s: of 64 reads, %" PRIu64
            " started by the caller, %" PRIu64 " done while it drove\n",
            drive, poll_us, sleep, *driven, *done);
    cx_unregister_memory(d, buf);
    cx_engine_destroy(d);
    munmap(buf, 4096);
}

static void drive_reads(const char *drive, const char *poll_us, uint64_t *driven, uint64_t *done, int *bound)
{
    drive_reads_sleep(drive, poll_us, "1", driven, done, bound);
}

/* Callers start their ops themselves when the transports are free and, within their poll
 * window, drive them to the end (core/src/drive.h); CONNEX_DRIVE=0 hands every op to the
 * progress thread. The data is the same either way. */
static void test_callers_drive(void **state)
{
    (void)state;
    uint64_t driven, done;
    int bound;
    drive_reads("0", "100000", &driven, &done, &bound);
    assert_int_equal(driven, 0);
    assert_int_equal(done, 0);
    if (bound) {
        /* A thread-bound backend (ZeroMQ) stays with the progress thread whatever the setting. */
        drive_reads("1", "100000", &driven, &done, &bound);
        assert_int_equal(driven, 0);
        assert_int_equal(done, 0);
        /* With every backend open (the peer speaks ZeroMQ only), callers drive the others: they
         * start ops to this peer and hand them off, and none ends on a caller's thread. Without
         * a poll window: with one, the progress thread polls as long after each read, and a
         * caller arriving meanwhile finds the lock taken (ctest -j2: 0 of 64 started). */
        char *old_b;
        setenv_saved("CONNEX_BACKEND", "auto", &old_b);
        drive_reads("1", "0", &driven, &done, &bound);
        setenv_restore("CONNEX_BACKEND", old_b);
        if (bound == 2) assert_true(driven >= 1);
        assert_int_equal(done, 0);
        return;
    }
    /* The peer's region in device memory (CONNEX_TEST_MEM=sim|cuda) is staged by the peer
     * (docs/gpu.md): such ops go to the progress thread, which holds the control connection
     * their chunks are coordinated on, and none ends while its caller drives. */
    const char *mem = getenv("CONNEX_TEST_MEM");
    int staged = mem && *mem && strcmp(mem, "host");
    /* Without a poll window the caller starts the op when the progress thread is not in the
     * middle of an iteration (it often is: it has just woken this caller for the previous read).
     * Handing it off then, it sleeps on the op; */
    drive_reads_sleep("1", "0", "0", &driven, &done, &bound);
    assert_true(done <= driven);
    /* sleeping on the transports instead (CONNEX_DRIVE_SLEEP, the default), it is woken by the
     * completion itself, and the op ends on its thread: the progress thread takes the lock back
     * only for a tick or a control frame, a few of 64 reads at most. */
    drive_reads("1", "0", &driven, &done, &bound);
    assert_true(driven >= 1);
    if (staged)
        assert_int_equal(done, 0);
    else
        assert_true(done >= driven / 2);
    /* A 100 ms window: no 4 KiB read takes that long, even on a loaded 2-CPU host, so a read
     * its caller started ends while that caller drives (it lets go early only when the progress
     * thread asks for the lock: a tick, a control frame, or a backend without a wait object). */
    drive_reads("1", "100000", &driven, &done, &bound);
    assert_true(driven >= 1);
    if (staged)
        assert_int_equal(done, 0);
    else
        assert_true(done >= driven / 2);
    cxt_fill(R, 64 * 4096, TSEED, 0);
}

/* A caller's ops reuse the peer its last op of the same name resolved to (core/src/engine.c,
 * parse_peer): that must stay per engine and per name. Two engines of this process name the
 * same peer by the same URL, alternately from one thread; a second engine's async read of the
 * peer is waited for after a read of another peer (engine E) by another name, and later ops by
 * each name still reach their own peer (a hint kept across that wait sent them to the peer
 * process and failed with CX_EINVAL). A hint used across engines made test_callers_drive fail:
 * the second engine's reads ran on the first engine's peer and were counted there. */
static void test_peer_names_per_engine(void **state)
{
    (void)state;
    cx_engine_t *d = NULL;
    assert_int_equal(cxt_engine(&d, "tester-names", 0, 1000, 10000, 60000), CX_OK);
    uint8_t *buf = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(buf != MAP_FAILED);
    assert_int_equal(cx_register_memory(d, buf, 2 * 4096), CX_OK);
    assert_int_equal(cx_connect(d, P.url, 5000), CX_OK);
    char e_url[CX_URL_MAX];
    snprintf(e_url, sizeof e_url, "%s", cx_engine_local_url(E));
    assert_int_equal(cx_connect(d, e_url, 5000), CX_OK);
    /* What the peer holds at base + 4096 (earlier tests wrote there), read once by E. */
    assert_int_equal(cx_read(E, P.url, R + 8192, P.base + 4096, 4096), CX_OK);
    cx_stats_t ea, eb, da, db;
    assert_int_equal(cx_stats(E, &ea), CX_OK);
    assert_int_equal(cx_stats(d, &da), CX_OK);
    for (int i = 0; i < 20; i++) {
        memset(R, 0, 4096);
        memset(buf, 0, 4096);
        assert_int_equal(cx_read(E, P.url, R, P.base + 4096, 4096), CX_OK);
        assert_int_equal(cx_read(d, P.url, buf, P.base + 4096, 4096), CX_OK);
        assert_memory_equal(R, R + 8192, 4096);
        assert_memory_equal(buf, R + 8192, 4096);
    }
    assert_int_equal(cx_stats(E, &eb), CX_OK);
    assert_int_equal(cx_stats(d, &db), CX_OK);
    assert_int_equal(eb.ops[CX_OPK_READ] - ea.ops[CX_OPK_READ], 20);
    assert_int_equal(db.ops[CX_OPK_READ] - da.ops[CX_OPK_READ], 20);
    /* E's memory at R + 4096 holds a pattern of its own, unlike anything the peer registered. */
    cxt_fill(R + 4096, 4096, TSEED + 7, 0);
    /* E named last, so that the async read parses the peer's URL afresh (no earlier peer) */
    assert_int_equal(cx_read(d, e_url, buf, (uint64_t)(uintptr_t)(R + 4096), 4096), CX_OK);
    cx_op_t *op = NULL;
    assert_int_equal(cx_read_async(d, P.url, buf + 4096, P.base + 4096, 4096, CX_CLASS_CRITICAL, &op), CX_OK);
    memset(buf, 0, 4096);
    assert_int_equal(cx_read(d, e_url, buf, (uint64_t)(uintptr_t)(R + 4096), 4096), CX_OK);
    assert_int_equal(cxt_check(buf, 4096, TSEED + 7, 0), -1);
    assert_int_equal(cx_op_wait(op, 10000), CX_OK);
    assert_memory_equal(buf + 4096, R + 8192, 4096);
    for (int i = 0; i < 3; i++) {
        memset(buf, 0, 2 * 4096);
        assert_int_equal(cx_read(d, e_url, buf, (uint64_t)(uintptr_t)(R + 4096), 4096), CX_OK);
        assert_int_equal(cxt_check(buf, 4096, TSEED + 7, 0), -1);
        assert_int_equal(cx_read(d, P.url, buf + 4096, P.base + 4096, 4096), CX_OK);
        assert_memory_equal(buf + 4096, R + 8192, 4096);
    }
    /* The bare LID names the same peer as its URL. */
    assert_int_equal(cx_read(d, P.lid, buf, P.base + 4096, 4096), CX_OK);
    assert_memory_equal(buf, R + 8192, 4096);
    cx_unregister_memory(d, buf);
    cx_engine_destroy(d);
    munmap(buf, 2 * 4096);
    cxt_fill(R, 3 * 4096, TSEED, 0);
    cxt_drain_events(E);
}

/* Between the ops of a caller that drives, the transports stay polled, not armed, until the drive
 * timer finds that callers stopped and the progress thread arms them again (core/src/drive.h).
 * Nothing may wait on that: a message that arrives right after a burst of driven reads, or well
 * after it, a peer's read of our memory (which our side serves: UCX over shared memory runs it
 * as an active message on our worker), and an async op in flight beside driven reads, all
 * complete within bounds. */
static void test_driving_leaves_nothing_behind(void **state)
{
    (void)state;
    char *old_d, *old_p;
    setenv_saved("CONNEX_DRIVE", "1", &old_d);
    setenv_saved("CONNEX_POLL_US", "100000", &old_p);
    cx_engine_t *d = NULL;
    int rc = cxt_engine(&d, "tester-drive2", 0, 1000, 10000, 60000);
    setenv_restore("CONNEX_DRIVE", old_d);
    setenv_restore("CONNEX_POLL_US", old_p);
    assert_int_equal(rc, CX_OK);
    uint8_t *buf = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(buf != MAP_FAILED);
    assert_int_equal(cx_register_memory(d, buf, 2 * 4096), CX_OK);
    assert_int_equal(cx_connect(d, P.url, 5000), CX_OK);
    char durl[CX_URL_MAX], rep[256];
    snprintf(durl, sizeof durl, "%s", cx_engine_local_url(d));
    assert_int_equal(cx_read(E, P.url, R, P.base, 4096), CX_OK); /* what the peer holds */
    static const int pause_us[] = { 0, 300, 5000, 50000 };       /* under the tick, over it, long after */
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < 32; i++) {
            rc = cx_read(d, P.url, buf, P.base, 4096);
            if (rc) fail_msg("round %d read %d: %s", k, i, cx_strerror(rc));
        }
        assert_memory_equal(buf, R, 4096);
        if (pause_us[k]) usleep((useconds_t)pause_us[k]);
        uint64_t t0 = cxt_now_ns();
        rc = cxt_peer_cmd(&P, 10000, rep, sizeof rep, "SEND %s 64 %d", durl, 70 + k);
        if (rc) fail_msg("round %d: peer send: %s", k, rep);
        cx_msg_t m;
        rc = cx_recv_msg(d, &m, 5000);
        double ms = cxt_ms_since(t0);
        if (rc) fail_msg("round %d: no message %d us after the reads: %s", k, pause_us[k], cx_strerror(rc));
        assert_int_equal(m.len, 64);
        assert_int_equal(cxt_check(m.data, 64, 70 + (uint32_t)k, 0), -1);
        cx_msg_release(&m);
        fprintf(stderr, "message %d us after 32 driven reads: delivered in %.2f ms\n", pause_us[k], ms);
        assert_true(ms < 1000);
    }
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 32; i++) assert_int_equal(cx_read(d, P.url, buf, P.base, 4096), CX_OK);
        if (k) usleep(k == 1 ? 300 : 5000);
        cxt_fill(buf + 4096, 4096, 90 + (uint32_t)k, 0);
        char want[64];
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(buf + 4096, 4096));
        uint64_t t0 = cxt_now_ns();
        /* Into the peer's region at 64 KiB: its first pages are what the reads above compare. */
        rc = cxt_peer_cmd(&P, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 4096 65536", durl,
                          (uintptr_t)(buf + 4096));
        double ms = cxt_ms_since(t0);
        if (rc || strcmp(rep, want))
            fail_msg("round %d: the peer's read of our memory: '%s', expected '%s'", k, rep, want);
        fprintf(stderr, "peer's read of our memory after 32 driven reads: %.2f ms\n", ms);
        assert_true(ms < 1000);
    }
    /* An async read in flight while the caller drives sync reads: it completes as the reads do. */
    for (int k = 0; k < 3; k++) {
        cx_op_t *h = NULL;
        memset(buf + 4096, 0, 4096);
        assert_int_equal(cx_read_async(d, P.url, buf + 4096, P.base, 4096, CX_CLASS_CRITICAL, &h), CX_OK);
        for (int i = 0; i < 8; i++) assert_int_equal(cx_read(d, P.url, buf, P.base, 4096), CX_OK);
        uint64_t t0 = cxt_now_ns();
        rc = cx_op_wait(h, 5000);
        if (rc) fail_msg("async read %d beside driven reads: %s", k, cx_strerror(rc));
        assert_true(cxt_ms_since(t0) < 1000);
        assert_memory_equal(buf + 4096, R, 4096);
        usleep(2000); /* the progress thread arms again: the next round starts from there */
    }
    cx_unregister_memory(d, buf);
    cx_engine_destroy(d);
    munmap(buf, 2 * 4096);
    cxt_fill(R, 4096, TSEED, 0);
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED), 0);
}

/* A second peer closes cleanly: LEFT, and ops to it fail with CX_EPEER, within bounds. */
static void test_clean_close_left(void **state)
{
    (void)state;
    cxt_peer_t q;
    cxt_peer_opts_t o = { .replica = 2, .region = 4096, .seed = 5 };
    assert_int_equal(cxt_peer_start(&q, &o, 10000), 0);
    assert_int_equal(cx_connect(E, q.url, 5000), CX_OK);
    assert_int_equal(cxt_wait_event(E, q.lid, CX_EVENT_UP, 5000, NULL, NULL), CX_OK);
    assert_int_equal(cx_read(E, q.lid, R, q.base, 4096), CX_OK);
    assert_int_equal(cxt_check(R, 4096, 5, 0), -1);
    char rep[64];
    assert_int_equal(cxt_peer_cmd(&q, 5000, rep, sizeof rep, "QUIT"), 0);
    uint64_t t0 = cxt_now_ns();
    cx_event_t ev;
    unsigned seen = 0;
    int rc = cxt_wait_event(E, q.lid, CX_EVENT_LEFT, 5000, &ev, &seen);
    double ms = cxt_ms_since(t0);
    assert_int_equal(cxt_peer_reap(&q, 5000), 0);
    assert_true(WIFEXITED(q.status) && WEXITSTATUS(q.status) == 0);
    cxt_peer_stop(&q);
    if (rc) fail_msg("no LEFT event after a clean close (events seen: 0x%x)", seen);
    if (seen & (1u << CX_EVENT_FAILED)) fail_msg("a clean close was reported as FAILED");
    fprintf(stderr, "LEFT after %.1f ms\n", ms);
    assert_int_equal(cx_peer_state(E, q.lid), CX_PEER_LEFT);
    t0 = cxt_now_ns();
    rc = cx_read(E, q.lid, R, q.base, 4096);
    assert_int_equal(rc, CX_EPEER);
    assert_true(cxt_ms_since(t0) < 6000);
    cxt_fill(R, 4096, TSEED, 0);
    /* The other peer is not disturbed. */
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED), 0);
    assert_int_equal(cx_read(E, P.lid, R, P.base, 4096), CX_OK);
    assert_int_equal(cxt_check(R, 4096, PSEED, 0), -1);
    cxt_fill(R, 4096, TSEED, 0);
}

/* Hundreds of peers known at once (a serving cluster): each op finds its peer, and each message
 * its sender, among them. Peers are indexed by LID and by incarnation (more peers than the
 * index has buckets, so some share one); the live peer is the first one named, the last one a
 * newest-first walk would reach. */
static void test_many_peers(void **state)
{
    (void)state;
    cx_engine_t *en = NULL;
    assert_int_equal(cxt_engine(&en, "crowd", 0, 0, 0, 5000), CX_OK);
    uint8_t *buf = R + (2u << 20);
    assert_int_equal(cx_register_memory(en, buf, 1u << 20), CX_OK);
    assert_int_equal(cx_connect(en, P.url, 5000), CX_OK);
    enum { N = 300 };
    uint64_t t0 = cxt_now_ns();
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < N; k++) {
            char u[CX_URL_MAX];
            /* nobody listens on port 9: each becomes a peer that never came up; the second
             * round names the same ones again, which must find them, not add more */
            snprintf(u, sizeof u, "127.0.0.1:9#%s|%d|%d|%d", k % 2 ? "bench" : "crowd-other", k % 7, k % 5, 1000 + k);
            assert_true(cx_connect(en, u, 1) != CX_OK);
        }
    fprintf(stderr, "%d idle peers named twice in %.0f ms\n", N, cxt_ms_since(t0));
    cx_peer_info_t *pl = calloc(N + 8, sizeof *pl);
    assert_non_null(pl);
    int n = cx_peer_list(en, pl, N + 8);
    assert_int_equal(n, N + 1);
    int up = 0; /* SUSPECT too: a loaded host may starve a heartbeat for a moment */
    for (int i = 0; i < n; i++) up += pl[i].state == CX_PEER_UP || pl[i].state == CX_PEER_SUSPECT;
    free(pl);
    assert_int_equal(up, 1);
    cx_peer_state_t ps = cx_peer_state(en, P.lid);
    assert_true(ps == CX_PEER_UP || ps == CX_PEER_SUSPECT);
    /* by LID and by URL */
    for (int i = 0; i < 20; i++) {
        memset(buf, 0, 8192);
        assert_int_equal(cx_read(en, i % 2 ? P.lid : P.url, buf, P.base + (uint64_t)i, 8192), CX_OK);
        assert_int_equal(cxt_check(buf, 8192, PSEED, (uint64_t)i), -1);
    }
    cxt_fill(buf, 4096, 77, 0);
    assert_int_equal(cx_write(en, P.lid, buf, P.base + 8192, 4096), CX_OK);
    char rep[256], want[64];
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "HASH 8192 4096"), 0);
    snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(buf, 4096));
    assert_string_equal(rep, want);
    /* a message from the peer: the receiver resolves its sender by incarnation */
    char en_lid[CX_URL_MAX];
    cx_url_t u;
    assert_int_equal(cx_url_parse(cx_engine_local_url(en), &u, NULL, 0), CX_OK);
    cx_lid_format(&u.lid, en_lid, sizeof en_lid);
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "CONNECT %s 5000", cx_engine_local_url(en)), 0);
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "SEND %s 100 81", en_lid), 0);
    cx_msg_t m;
    assert_int_equal(cx_recv_msg(en, &m, 10000), CX_OK);
    char from[CX_URL_MAX];
    cx_lid_format(&m.from, from, sizeof from);
    assert_string_equal(from, P.lid);
    assert_int_equal(m.len, 100);
    assert_int_equal(cxt_check(m.data, 100, 81, 0), -1);
    cx_msg_release(&m);
    cx_unregister_memory(en, buf);
    cx_engine_destroy(en);
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED), 0);
    cxt_fill(R, RS, TSEED, 0);
}

/* A peer that registered many regions (a serving process registers each layer's K and V): the
 * other side finds each remote range in its index of them, a range across two regions is still
 * refused, and unregistering or registering again updates what the peer finds. */
static void test_many_regions(void **state)
{
    (void)state;
    enum { NR = 160, PG = 4096 };
    uint8_t *m = mmap(NULL, (size_t)NR * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    for (int i = 0; i < NR; i++) {
        cxt_fill(m + (size_t)i * PG, PG, 200 + (uint32_t)i, 0);
        assert_int_equal(cx_register_memory(E, m + (size_t)i * PG, PG), CX_OK);
    }
    char rep[256], want[64];
    for (int k = 0; k < NR; k++) {
        int i = (k * 37) % NR; /* every region once, not in registration order */
        size_t off = (size_t)(k * 13) % 2048;
        uint8_t *a = m + (size_t)i * PG + off;
        int rc = cxt_peer_cmd(&P, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 1024 0", E_LID, (uintptr_t)a);
        if (rc) fail_msg("peer read of region %d: %s", i, rep);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(a, 1024));
        assert_string_equal(rep, want);
    }
    /* across the boundary of two adjacent regions: inside neither */
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 32 0", E_LID,
                                  (uintptr_t)(m + 5 * PG + PG - 16)),
                     CX_EINVAL);
    for (int i = 0; i < NR; i += 2) assert_int_equal(cx_unregister_memory(E, m + (size_t)i * PG), CX_OK);
    for (int i = 0; i < 12; i++) {
        uint8_t *a = m + (size_t)i * PG + 100;
        int rc = cxt_peer_cmd(&P, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 512 0", E_LID, (uintptr_t)a);
        if (i % 2 == 0) {
            assert_int_equal(rc, CX_EINVAL); /* unregistered: the peer must not reach it */
        } else {
            if (rc) fail_msg("peer read of region %d after others went: %s", i, rep);
            snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(a, 512));
            assert_string_equal(rep, want);
        }
    }
    /* registered again at the same place: found again */
    assert_int_equal(cx_register_memory(E, m + 4 * PG, PG), CX_OK);
    uint8_t *a = m + 4 * PG + 8;
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 256 0", E_LID, (uintptr_t)a), 0);
    snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(a, 256));
    assert_string_equal(rep, want);
    assert_int_equal(cx_unregister_memory(E, m + 4 * PG), CX_OK);
    for (int i = 1; i < NR; i += 2) assert_int_equal(cx_unregister_memory(E, m + (size_t)i * PG), CX_OK);
    cx_stats_t st;
    assert_int_equal(cx_stats(E, &st), CX_OK);
    assert_int_equal(st.regions, 1);
    munmap(m, (size_t)NR * PG);
}

/* The same pair over IPv6 loopback: URLs with brackets, both directions, a clean close. */
static void test_ipv6_pair(void **state)
{
    (void)state;
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "tester6";
    c.listen_ip = "::1";
    cx_engine_t *e6 = NULL;
    int rc = cx_engine_create(&c, &e6);
    if (rc) fail_msg("engine on [::1]: %s", cx_strerror(rc));
    const char *url = cx_engine_local_url(e6);
    assert_true(strncmp(url, "[::1]:", 6) == 0);
    uint8_t *buf = R + (1u << 20);
    assert_int_equal(cx_register_memory(e6, buf, 1u << 20), CX_OK); /* e6 has its own registry */
    cxt_peer_t q;
    cxt_peer_opts_t o = { .replica = 6, .region = 1u << 20, .seed = 66, .listen_ip = "::1" };
    if (cxt_peer_start(&q, &o, 10000)) {
        cx_engine_destroy(e6);
        fail_msg("no peer on [::1]");
    }
    assert_true(strncmp(q.url, "[::1]:", 6) == 0);
    rc = cx_connect(e6, q.url, 5000);
    if (rc) {
        cxt_peer_crash(&q);
        cx_engine_destroy(e6);
        fail_msg("connect %s: %s", q.url, cx_strerror(rc));
    }
    memset(buf, 0, 65536);
    assert_int_equal(cx_read(e6, q.lid, buf, q.base + 3, 65536), CX_OK);
    assert_int_equal(cxt_check(buf, 65536, 66, 3), -1);
    cxt_fill(buf, 65536, 67, 0);
    char rep[256], want[64], lid6[CX_URL_MAX];
    cx_url_t u;
    assert_int_equal(cx_url_parse(url, &u, NULL, 0), CX_OK);
    cx_lid_format(&u.lid, lid6, sizeof lid6);
    assert_int_equal(cxt_peer_cmd(&q, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 65536 0", lid6, (uintptr_t)buf),
                     0);
    snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(buf, 65536));
    assert_string_equal(rep, want);
    assert_int_equal(cxt_peer_cmd(&q, 5000, rep, sizeof rep, "QUIT"), 0);
    assert_int_equal(cxt_wait_event(e6, q.lid, CX_EVENT_LEFT, 5000, NULL, NULL), CX_OK);
    cxt_peer_stop(&q);
    cx_unregister_memory(e6, buf);
    cx_engine_destroy(e6);
    cxt_fill(R, RS, TSEED, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_connected, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_fds_cloexec, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_read_sizes, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_write_sizes, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_put_signal_sizes, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_peer_reads_from_us, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_peer_writes_to_us, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_peer_put_signal_to_us, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_messages_to_peer, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_messages_from_peer, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_stats, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_callers_drive, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_peer_names_per_engine, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_driving_leaves_nothing_behind, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_clean_close_left, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_many_peers, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_many_regions, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_ipv6_pair, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    /* CXT_FILTER=test_name (wildcards allowed) runs a subset. */
    if (getenv("CXT_FILTER")) cmocka_set_test_filter(getenv("CXT_FILTER"));
    return cxt_run_tests(tests, group_setup, group_teardown);
}
