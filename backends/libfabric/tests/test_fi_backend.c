/* The libfabric backend between two instances in one process, behind a fake core.
 * Usage: test_fi_backend <provider parts>   ("tcp ofi_rxm" for tcp;ofi_rxm, "shm", ...)
 *
 * Progress is driven the way the engine drives it: progress() only when a wait fd is readable,
 * so a missed re-arm shows up as a timeout, not as a pass. */
#include "fake_core.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "connex/log.h"
#include "../fi_int.h"

extern const struct cx_backend_ops cx_libfabric_ops;
static const struct cx_backend_ops *ops = &cx_libfabric_ops;

static cx_core_t ca, cb;
static cx_backend_t *ba, *bb;
static cx_bep_t *ab, *ba_ep;   /* A's endpoint to B, B's to A */
static int cookie_a, cookie_b; /* peer cookies: &cookie_b is "B" as A sees it */

#define REG (4u << 20)
static unsigned char *abuf, *bbuf;
static void *amh, *bmh;
static unsigned char akey[256], bkey[256];
static size_t akey_len, bkey_len;

/* Drives both backends until every xfer is done or timeout_ms passed. */
static int drive(fc_xfer_t **xs, int n, int timeout_ms)
{
    return fc_drive(ops, ba, bb, xs, n, timeout_ms);
}

/* Runs both progress loops for ms milliseconds (lets late entries arrive). */
static void settle(int ms)
{
    fc_xfer_t dummy;
    memset(&dummy, 0, sizeof dummy);
    fc_xfer_t *p = &dummy;
    drive(&p, 1, ms);
}

static void xfer_init(fc_xfer_t *f, int kind, void *local, size_t len, uint64_t remote, const void *msg, size_t msg_len)
{
    fc_xfer_init(f, kind, local, len, remote, msg, msg_len);
    f->x.local_mh = amh;
    f->x.remote_base = (uint64_t)(uintptr_t)bbuf;
    f->x.rkey = bkey;
    f->x.rkey_len = bkey_len;
}

static int run1(fc_xfer_t *f, int timeout_ms)
{
    int r = ops->submit(ba, ab, &f->x);
    if (r) return r;
    return drive(&f, 1, timeout_ms) ? CX_ETIMEDOUT : f->status;
}

static int setup(void **state)
{
    (void)state;
    fc_reset(&ca);
    fc_reset(&cb);
    ca.peer_errors = cb.peer_errors = 0;
    memset(abuf, 0, REG);
    memset(bbuf, 0, REG);
    return 0;
}

static void test_open_and_address(void **state)
{
    (void)state;
    unsigned char addr[4096];
    size_t len = sizeof addr;
    assert_int_equal(ops->address(ba, addr, &len), CX_OK);
    assert_true(len > 8);
    size_t small = 2;
    assert_int_equal(ops->address(ba, addr, &small), CX_EINVAL);
    assert_true(ops->wait_fd(ba) >= 0);
    /* shm: nothing is sent at connect for same-host copies (fi_cma.c: a first read asks). */
    assert_false(ab->cma_asked || ab->cma_heard || ba_ep->cma_asked || ba_ep->cma_heard);
}

static void test_write_read(void **state)
{
    (void)state;
    const size_t sizes[] = { 1, 4096, 65536, 1u << 20, REG };
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        for (size_t i = 0; i < n; i++) abuf[i] = (unsigned char)(i * 7 + s);
        fc_xfer_t w;
        xfer_init(&w, CX_XFER_WRITE, abuf, n, (uint64_t)(uintptr_t)bbuf, NULL, 0);
        assert_int_equal(run1(&w, 10000), CX_OK);
        assert_int_equal(w.done, 1);
        assert_memory_equal(abuf, bbuf, n);
        memset(abuf, 0, n);
        fc_xfer_t r;
        xfer_init(&r, CX_XFER_READ, abuf, n, (uint64_t)(uintptr_t)bbuf, NULL, 0);
        assert_int_equal(run1(&r, 10000), CX_OK);
        assert_memory_equal(abuf, bbuf, n);
    }
    /* at an offset inside the remote region */
    memset(bbuf + 1000, 0x5a, 100);
    fc_xfer_t r;
    xfer_init(&r, CX_XFER_READ, abuf + 3, 100, (uint64_t)(uintptr_t)(bbuf + 1000), NULL, 0);
    assert_int_equal(run1(&r, 10000), CX_OK);
    for (int i = 0; i < 100; i++) assert_int_equal(abuf[3 + i], 0x5a);
}

/* Reads around the sizes where the way they travel changes (on tcp: answered in messages of up
 * to rxm's eager limit each, up to 64 KiB; above, by write-back; fi_read elsewhere), at odd
 * offsets, with nothing written outside the range. */
static void read_sizes(const size_t *sizes, size_t nsizes)
{
    for (size_t i = 0; i < REG; i++) bbuf[i] = (unsigned char)(i * 13 + 5);
    for (size_t s = 0; s < nsizes; s++) {
        size_t n = sizes[s], ro = 4096 * s + 3;
        memset(abuf, 0xee, n + 2);
        fc_xfer_t r;
        xfer_init(&r, CX_XFER_READ, abuf + 1, n, (uint64_t)(uintptr_t)(bbuf + ro), NULL, 0);
        assert_int_equal(run1(&r, 10000), CX_OK);
        assert_int_equal(r.done, 1);
        assert_memory_equal(abuf + 1, bbuf + ro, n);
        assert_int_equal(abuf[0], 0xee);
        assert_int_equal(abuf[n + 1], 0xee);
    }
}

/* The parts the target sends for reads of these sizes in parts of `part` bytes: those up to the
 * reader's rd_inline are answered in parts, the rest by write-back. */
static uint64_t answer_parts(const size_t *sizes, size_t n, size_t part)
{
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (sizes[i] <= ba->rd_inline) k += (sizes[i] + part - 1) / part;
    return k;
}

/* With tcp's small reads (fi_wb.c) the parts of an answer: headerless (rd_raw bytes each, its
 * header the CQ data word) where the reader asks for them, with a header (rd_part) where it does
 * not (a reader without 8 bytes of CQ data). Each way, sizes across both part boundaries. */
static void test_read_boundaries(void **state)
{
    (void)state;
    const size_t sizes[] = { 16359, 16360, 16361, 16383, 16384, 16385, 32720, 32721,
                             32767, 32768, 32769, 40000, 65535, 65536, 65537 };
    const size_t n = sizeof sizes / sizeof sizes[0];
    uint64_t hdr0 = bb->rd_sent[0], raw0 = bb->rd_sent[1];
    read_sizes(sizes, n);
    if (!ba->rd_inline) return; /* reads by RMA: no answers */
    print_message("rd_part %zu, rd_raw %zu: %llu parts with header, %llu headerless\n", bb->rd_part, bb->rd_raw,
                  (unsigned long long)(bb->rd_sent[0] - hdr0), (unsigned long long)(bb->rd_sent[1] - raw0));
    if (!ba->rd_raw || !bb->rd_raw) return;
    assert_int_equal(bb->rd_sent[1] - raw0, answer_parts(sizes, n, bb->rd_raw)); /* 16384: one part */
    assert_int_equal(bb->rd_sent[0] - hdr0, 0);
    size_t keep = ba->rd_raw;
    ba->rd_raw = 0;
    hdr0 = bb->rd_sent[0];
    raw0 = bb->rd_sent[1];
    read_sizes(sizes, n);
    ba->rd_raw = keep;
    assert_int_equal(bb->rd_sent[1] - raw0, 0);
    assert_int_equal(bb->rd_sent[0] - hdr0, answer_parts(sizes, n, bb->rd_part)); /* 16384: two */
}

/* The target refuses a read of what its core does not hold registered: the read fails with
 * CX_EINVAL (small and write-back reads alike), nothing lands, and the next read works. */
static void test_read_refused_by_target(void **state)
{
    (void)state;
    cb.reg_lo = (uint64_t)(uintptr_t)bbuf;
    cb.reg_hi = cb.reg_lo + 65536;
    const size_t sizes[] = { 4096, 40000, 1u << 20 };
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        memset(abuf, 0xee, n);
        fc_xfer_t r;
        /* starts inside the target's region, ends past it */
        xfer_init(&r, CX_XFER_READ, abuf, n, (uint64_t)(uintptr_t)(bbuf + 65536 - 100), NULL, 0);
        int checks = cb.region_checks;
        int st = run1(&r, 10000);
        assert_int_equal(r.done, 1);
        if (cb.region_checks == checks) continue; /* fi_read (not tcp): the provider checks keys, not our core */
        assert_int_equal(st, CX_EINVAL);
        for (size_t i = 0; i < n; i++) assert_int_equal(abuf[i], 0xee);
    }
    memset(bbuf, 0x42, 100);
    fc_xfer_t r;
    xfer_init(&r, CX_XFER_READ, abuf, 100, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    assert_int_equal(run1(&r, 10000), CX_OK);
    assert_int_equal(abuf[99], 0x42);
}

static void test_many_in_flight(void **state)
{
    (void)state;
    enum { N = 200 };
    static fc_xfer_t f[N];
    fc_xfer_t *p[N];
    for (int i = 0; i < N; i++) {
        abuf[i * 4096] = (unsigned char)i;
        xfer_init(&f[i], CX_XFER_WRITE, abuf + i * 4096, 4096, (uint64_t)(uintptr_t)(bbuf + i * 4096), NULL, 0);
        p[i] = &f[i];
        assert_int_equal(ops->submit(ba, ab, &f[i].x), CX_OK);
    }
    assert_int_equal(drive(p, N, 10000), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(f[i].done, 1);
        assert_int_equal(f[i].status, CX_OK);
        assert_int_equal(bbuf[i * 4096], (unsigned char)i);
    }
}

/* Disconnects A's endpoint with f[0..n) in flight: each ends CX_EPEER at once and exactly once,
 * the CQ entries that come later touch nothing, and a new endpoint works. */
static void disconnect_in_flight(fc_xfer_t *f, int n, unsigned char fill)
{
    ops->disconnect(ba, ab, CX_EPEER);
    ab = NULL;
    for (int i = 0; i < n; i++) {
        assert_int_equal(f[i].done, 1);
        assert_int_equal(f[i].status, CX_EPEER);
    }
    settle(300);
    for (int i = 0; i < n; i++) assert_int_equal(f[i].done, 1);
    unsigned char addr[4096];
    size_t len = sizeof addr;
    assert_int_equal(ops->address(bb, addr, &len), CX_OK);
    assert_int_equal(ops->connect(ba, &cookie_b, addr, len, &ab), CX_OK);
    memset(bbuf, fill, 4096);
    fc_xfer_t r;
    xfer_init(&r, CX_XFER_READ, abuf, 4096, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    assert_int_equal(run1(&r, 10000), CX_OK);
    assert_int_equal(abuf[4095], fill);
}

/* submit_batch: reads and writes go as vector ops (fi_vec.c), a message or a bad key in between
 * goes alone and the next ones after it in a new vector; every xfer completes exactly once with
 * its own status, the data lands; then a batch in flight whose endpoint is disconnected ends
 * CX_EPEER at once, exactly once, and the CQ entries that come later touch nothing. */
static void test_batch_vectors(void **state)
{
    (void)state;
    enum { N = 150, LEN = 4096 + 17 };
    static fc_xfer_t f[N];
    int cma = ba->cma;
    ba->cma = 0; /* the provider's path: same-host copies (shm, fi_cma.c) end within the submit */
    fc_xfer_t *p[N];
    cx_xfer_t *xs[N];
    int rcs[N];
    static const unsigned char badkey[3] = { 9, 9, 9 };
    for (int i = 0; i < N; i++) {
        unsigned char *a = abuf + (size_t)i * LEN, *r = bbuf + (size_t)i * LEN;
        int k = i % 10 == 9 ? CX_XFER_MSG : i & 1 ? CX_XFER_READ : CX_XFER_WRITE;
        memset(a, k == CX_XFER_WRITE ? 0x40 + i % 64 : 0, LEN);
        memset(r, k == CX_XFER_READ ? 0x80 + i % 64 : 0, LEN);
        xfer_init(&f[i], k, a, LEN, (uint64_t)(uintptr_t)r, "v", 1);
        if (i == 77) {
            f[i].x.rkey = badkey; /* refused: that xfer alone */
            f[i].x.rkey_len = sizeof badkey;
        }
        p[i] = &f[i];
        xs[i] = &f[i].x;
    }
    ops->submit_batch(ba, ab, xs, N, rcs);
    int started = 0;
    for (int i = 0; i < N; i++) {
        if (i == 77) {
            assert_int_equal(rcs[i], CX_EINVAL);
            f[i].done = 1; /* not started: never completed */
            continue;
        }
        assert_int_equal(rcs[i], CX_OK);
        started++;
    }
    assert_int_equal(started, N - 1);
    assert_int_equal(drive(p, N, 10000), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(f[i].done, 1);
        if (i == 77) continue;
        assert_int_equal(f[i].status, CX_OK);
        unsigned char *a = abuf + (size_t)i * LEN, *r = bbuf + (size_t)i * LEN;
        if (f[i].x.kind == CX_XFER_READ) assert_int_equal(a[LEN - 1], 0x80 + i % 64);
        if (f[i].x.kind == CX_XFER_WRITE) assert_int_equal(r[LEN - 1], 0x40 + i % 64);
        if (f[i].x.kind != CX_XFER_MSG) assert_memory_equal(a, r, LEN);
    }
    assert_int_equal(cb.nmsg, N / 10);
    settle(100);
    for (int i = 0; i < N; i++) assert_int_equal(f[i].done, 1);

    /* In flight when its endpoint goes. */
    for (int i = 0; i < N; i++) {
        xfer_init(&f[i], i & 1 ? CX_XFER_READ : CX_XFER_WRITE, abuf + (size_t)i * LEN, LEN,
                  (uint64_t)(uintptr_t)(bbuf + (size_t)i * LEN), NULL, 0);
        xs[i] = &f[i].x;
    }
    ops->submit_batch(ba, ab, xs, N, rcs);
    for (int i = 0; i < N; i++) assert_int_equal(rcs[i], CX_OK);
    /* On shm each one finished inside its post, but its completion was not read yet. */
    disconnect_in_flight(f, N, 0x21);
    ba->cma = cma;
}

/* shm: host reads and writes between the two are copies by the initiator (fi_cma.c), once each
 * side has the other's offer from its warm-up: a single read or write ends inside its submit; a
 * batch's runs of entries up to a sixteenth of the largest copy go one call each, a larger entry
 * and a message the provider's way, every one completed once with its bytes in place; a region
 * whose key does not say host memory goes the provider's way; a copy that fails (the pid is no
 * longer the target's) leaves same-host copies with that peer and the xfer still completes
 * through the provider. */
static void test_same_host_copies(void **state)
{
    (void)state;
    if (!ba->cma) {
        print_message("no same-host copies on this provider: skipped\n");
        skip();
    }
    /* Nothing was asked at connect; A's first read asks (it goes the provider's way). Earlier
     * tests made A's endpoint again while copies were off: that one asks now too. */
    fc_xfer_t first;
    xfer_init(&first, CX_XFER_READ, abuf, 4096, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    if (!ab->cma.ok) {
        uint64_t before = ba->cma_ops;
        assert_int_equal(run1(&first, 10000), CX_OK);
        assert_int_equal(ba->cma_ops, before);
        assert_true(ab->cma_asked);
    }
    for (int i = 0; i < 300 && !(ab->cma.ok && ba_ep->cma.ok); i++) settle(10);
    assert_true(ab->cma.ok);
    assert_true(ba_ep->cma.ok);
    for (size_t i = 0; i < 65536; i++) bbuf[i] = (unsigned char)(i * 7 + 1);
    uint64_t ops0 = ba->cma_ops;
    fc_xfer_t r;
    xfer_init(&r, CX_XFER_READ, abuf, 65536, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    assert_int_equal(ops->submit(ba, ab, &r.x), CX_OK);
    assert_int_equal(r.done, 1); /* within the submit */
    assert_int_equal(r.status, CX_OK);
    assert_memory_equal(abuf, bbuf, 65536);
    memset(abuf, 0x3c, 4096);
    fc_xfer_t w;
    xfer_init(&w, CX_XFER_WRITE, abuf, 4096, (uint64_t)(uintptr_t)(bbuf + 100000), NULL, 0);
    assert_int_equal(ops->submit(ba, ab, &w.x), CX_OK);
    assert_int_equal(w.done, 1);
    assert_memory_equal(bbuf + 100000, abuf, 4096);
    assert_int_equal(ba->cma_ops - ops0, 2);

    /* A batch: reads of 1 B .. 64 KiB, one of 64 KiB + 1 and a message among them. */
    enum { N = 40 };
    static fc_xfer_t f[N];
    fc_xfer_t *p[N];
    cx_xfer_t *xs[N];
    int rcs[N];
    size_t off = 0;
    int copied = 0;
    for (size_t i = 0; i < REG; i++) bbuf[i] = (unsigned char)(i * 31 + 9);
    memset(abuf, 0, REG);
    for (int i = 0; i < N; i++) {
        size_t len = i == 20 ? 65537 : i % 4 == 0 ? 65536 : 1 + (size_t)i * 997;
        int k = i == 30 ? CX_XFER_MSG : CX_XFER_READ;
        xfer_init(&f[i], k, abuf + off, len, (uint64_t)(uintptr_t)(bbuf + off), "c", 1);
        copied += k == CX_XFER_READ && len <= 65536;
        off += len + 64;
        p[i] = &f[i];
        xs[i] = &f[i].x;
    }
    ops0 = ba->cma_ops;
    ops->submit_batch(ba, ab, xs, N, rcs);
    for (int i = 0; i < N; i++) assert_int_equal(rcs[i], CX_OK);
    assert_int_equal(drive(p, N, 10000), 0);
    off = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(f[i].status, CX_OK);
        if (f[i].x.kind == CX_XFER_READ) assert_memory_equal(abuf + off, bbuf + off, f[i].x.len);
        off += f[i].x.len + 64;
    }
    assert_int_equal(ba->cma_ops - ops0, copied);
    assert_int_equal(cb.nmsg, 1);

    /* A region that is not host memory (its key says so): the provider's way. */
    cx_fi_key_t k;
    assert_int_equal(cx_fi_key_get(bkey, bkey_len, &k), CX_OK);
    assert_true(k.flags & CX_FI_KEY_HOST);
    k.flags &= (uint8_t)~CX_FI_KEY_HOST;
    unsigned char devkey[CX_FI_KEY_LEN];
    cx_wr_t kw;
    cx_wr_init(&kw, devkey, sizeof devkey);
    cx_fi_key_put(&kw, &k);
    ops0 = ba->cma_ops;
    xfer_init(&r, CX_XFER_READ, abuf, 4096, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    r.x.rkey = devkey;
    r.x.rkey_len = kw.len;
    assert_int_equal(run1(&r, 10000), CX_OK);
    assert_memory_equal(abuf, bbuf, 4096);
    assert_int_equal(ba->cma_ops, ops0);

    /* The pid is no longer the target's (a child, reaped): the copy fails, the provider reads. */
    cx_cma_peer_t keep = ab->cma;
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) _exit(0);
    assert_int_equal(waitpid(c, NULL, 0), c);
    ab->cma.pid = (uint32_t)c;
    memset(abuf, 0, 8192);
    xfer_init(&r, CX_XFER_READ, abuf, 8192, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    assert_int_equal(run1(&r, 10000), CX_OK);
    assert_memory_equal(abuf, bbuf, 8192);
    assert_false(ab->cma.ok);
    assert_int_equal(ba->cma_ops, ops0);
    ab->cma = keep;
}

/* Waits (driving both sides, at most ms) until A knows B serves read lists (fi_list.c). */
static int lists_known(int ms)
{
    for (int i = 0; i < ms / 10 && !(ab && ab->lists); i++) settle(10);
    return ab && ab->lists;
}

/* Submits f[0..n) as one batch; rcs must all be CX_OK but for the index `bad` (CX_EINVAL). */
static void batch_submit(fc_xfer_t *f, int n, int bad)
{
    static cx_xfer_t *xs[1024];
    static int rcs[1024];
    for (int i = 0; i < n; i++) xs[i] = &f[i].x;
    ops->submit_batch(ba, ab, xs, (size_t)n, rcs);
    for (int i = 0; i < n; i++) {
        assert_int_equal(rcs[i], i == bad ? CX_EINVAL : CX_OK);
        if (i == bad) f[i].done = 1; /* not started: never completed */
    }
}

/* tcp: a batch's small reads to one endpoint go as one request per run (CX_FM_RLIST, at most a
 * list's capacity each), once the peer said it serves them; each read keeps its own status (a
 * range the target does not hold fails alone with CX_EINVAL, a bad key is refused at submit, a
 * message and a large read in between go alone) and its bytes land exactly. Without the peer's
 * word, the same batch goes as single requests. In flight when the endpoint goes: every read
 * ends CX_EPEER once; and after a reconnect (a new endpoint of A's, B's the same) A learns again
 * from B's echo of its warm-up. */
static void test_batch_read_lists(void **state)
{
    (void)state;
    if (!ba->wb || !ba->rd_inline) {
        print_message("reads are no requests on this provider: skipped\n");
        skip();
    }
    assert_true(lists_known(3000));
    assert_true(ba_ep->lists); /* both ways: B heard A's warm-up or its echo */
    enum { N = 700 };
    static fc_xfer_t f[N];
    fc_xfer_t *p[N];
    static const unsigned char badkey[3] = { 9, 9, 9 };
    const size_t rdi = ba->rd_inline;
    size_t off = 0;
    int in_lists = 0, refused_at_target = 250;
    for (size_t i = 0; i < REG; i++) bbuf[i] = (unsigned char)(i * 29 + 3);
    memset(abuf, 0xee, REG);
    cb.reg_lo = (uint64_t)(uintptr_t)bbuf;
    cb.reg_hi = cb.reg_lo + REG;
    for (int i = 0; i < N; i++) {
        /* Sizes around the answer's part boundaries; 690: by write-back, alone. */
        size_t len = i == 690 ? rdi + 1
            : i % 50 == 0     ? rdi
            : i % 50 == 10    ? rdi - 1
            : i % 50 == 25    ? 16385
            : i % 7 == 0      ? 16384
                              : 1 + (size_t)(i * 37) % 600;
        int k = i == 30 ? CX_XFER_MSG : CX_XFER_READ;
        uint64_t remote = (uint64_t)(uintptr_t)(bbuf + off);
        if (i == refused_at_target) remote = cb.reg_hi - 10; /* runs past the target's region */
        xfer_init(&f[i], k, abuf + off + 1, len, remote, "l", 1);
        if (i == 77) {
            f[i].x.rkey = badkey;
            f[i].x.rkey_len = sizeof badkey;
        }
        off += len + 64;
        p[i] = &f[i];
    }
    assert_true(off < REG);
    uint64_t l0 = ba->rl_sent[0], r0 = ba->rl_sent[1], s0 = bb->rl_served;
    batch_submit(f, N, 77);
    assert_int_equal(drive(p, N, 20000), 0);
    off = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(f[i].done, 1);
        size_t len = f[i].x.len;
        if (i != 77 && i != refused_at_target) {
            assert_int_equal(f[i].status, CX_OK);
            if (f[i].x.kind == CX_XFER_READ) assert_memory_equal(abuf + off + 1, bbuf + off, len);
        } else if (i == refused_at_target) {
            assert_int_equal(f[i].status, CX_EINVAL);
        }
        if (i != 77) {
            assert_int_equal(abuf[off], 0xee); /* nothing before or after */
            assert_int_equal(abuf[off + 1 + len], 0xee);
        }
        if (f[i].x.kind == CX_XFER_READ && len <= rdi && i != 77) in_lists++;
        off += len + 64;
    }
    /* Runs: 0..29, 31..76, 78..689, 691..699, split at the list's capacity. */
    size_t cap = (ba->rd_part + CX_FM_RDATA_HDR - CX_FM_RLIST_HEAD) / CX_FM_RLIST_ENT;
    if (cap > CX_FM_RLIST_MAX) cap = CX_FM_RLIST_MAX;
    const size_t runs[] = { 30, 46, 612, 9 };
    uint64_t lists = 0;
    for (int i = 0; i < 4; i++) lists += (runs[i] + cap - 1) / cap;
    print_message("%d reads in %llu lists (capacity %zu)\n", in_lists, (unsigned long long)(ba->rl_sent[0] - l0), cap);
    assert_int_equal(ba->rl_sent[1] - r0, in_lists);
    assert_int_equal(ba->rl_sent[0] - l0, lists);
    assert_int_equal(bb->rl_served - s0, lists);
    assert_int_equal(cb.nmsg, 1);
    settle(100);
    for (int i = 0; i < N; i++) assert_int_equal(f[i].done, 1);

    /* The peer never said so: single requests, the same outcome. */
    ab->lists = 0;
    l0 = ba->rl_sent[0];
    for (int i = 0; i < 64; i++) {
        memset(abuf + i * 8192, 0, 4096);
        xfer_init(&f[i], CX_XFER_READ, abuf + i * 8192, 4096, (uint64_t)(uintptr_t)(bbuf + i * 8192), NULL, 0);
    }
    batch_submit(f, 64, -1);
    assert_int_equal(drive(p, 64, 10000), 0);
    for (int i = 0; i < 64; i++) {
        assert_int_equal(f[i].status, CX_OK);
        assert_memory_equal(abuf + i * 8192, bbuf + i * 8192, 4096);
    }
    assert_int_equal(ba->rl_sent[0], l0);
    ab->lists = 1;

    /* In flight when the endpoint goes; then a new endpoint learns again. */
    for (int i = 0; i < N; i++)
        xfer_init(&f[i], CX_XFER_READ, abuf + (size_t)i * 4096, 4096, (uint64_t)(uintptr_t)(bbuf + (size_t)i * 4096),
                  NULL, 0);
    l0 = ba->rl_sent[0];
    batch_submit(f, N, -1);
    assert_true(ba->rl_sent[0] > l0);
    disconnect_in_flight(f, N, 0x44);
    assert_true(lists_known(3000));
    cb.reg_lo = cb.reg_hi = 0;
}

static void test_messages(void **state)
{
    (void)state;
    const size_t sizes[] = { 0, 1, 100, 65536 - 20, 65536, 1u << 20, CX_MSG_MAX };
    unsigned char *m = malloc(CX_MSG_MAX);
    assert_non_null(m);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (size_t i = 0; i < sizes[s]; i++) m[i] = (unsigned char)(i ^ s);
        fc_xfer_t f;
        xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, m, sizes[s]);
        assert_int_equal(run1(&f, 10000), CX_OK);
        assert_int_equal(f.done, 1);
        assert_int_equal(cb.nmsg, (int)s + 1);
        assert_int_equal(cb.msg_len[s], sizes[s]);
        if (sizes[s]) assert_memory_equal(cb.msg[s], m, sizes[s]);
    }
    free(m);
    assert_int_equal(cb.served_bad, 0);
}

/* Wake-ups of either wait fd within ms milliseconds, each served with progress(), as the engine
 * serves them. */
static int wakeups(int ms)
{
    uint64_t end = fc_now_ms() + (uint64_t)ms;
    int n = 0;
    for (uint64_t now = fc_now_ms(); now < end && n < 100000; now = fc_now_ms()) {
        struct pollfd p[2] = { { ops->wait_fd(ba), POLLIN, 0 }, { ops->wait_fd(bb), POLLIN, 0 } };
        if (poll(p, 2, (int)(end - now)) <= 0) continue;
        if (p[0].revents & POLLIN) ops->progress(ba);
        if (p[1].revents & POLLIN) ops->progress(bb);
        n++;
    }
    return n;
}

/* shm (fi_bell.c): a message rings its target's doorbell before submit returns, nobody spins
 * after traffic, and a peer that cannot be rung makes the sender say so and the receiver poll. */
static void test_shm_doorbells(void **state)
{
    (void)state;
    if (strcmp(ba->prov, "shm") || !ba->shm_direct) {
        skip(); /* no doorbells: tcp has a CQ fd; shm without direct mode keeps polling */
    }
    assert_true(ba->bell_fd >= 0 && bb->bell_fd >= 0);
    assert_true(cx_fi_bell_rings(ab) && cx_fi_bell_rings(ba_ep));
    assert_int_equal(ba->tick_slow, 1);
    fc_xfer_t f;
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, "ping", 5);
    assert_int_equal(run1(&f, 10000), CX_OK);
    assert_int_equal(cb.nmsg, 1);
    /* Idle after traffic: each backend wakes for its tick (CX_FI_BELL_TICK_US) and little
     * else; polling after traffic woke them thousands of times in 300 ms, the 100 us tick 6,000. */
    settle(50);
    int idle = wakeups(300);
    assert_true(idle <= 120);
    /* The ring is in the target's socket once submit returns: no tick needed. */
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, "pong", 5);
    assert_int_equal(ops->submit(ba, ab, &f.x), CX_OK);
    struct pollfd bell = { bb->bell_fd, POLLIN, 0 };
    assert_int_equal(poll(&bell, 1, 0), 1);
    fc_xfer_t *fp = &f;
    assert_int_equal(drive(&fp, 1, 10000), 0);
    assert_int_equal(f.status, CX_OK);
    assert_int_equal(cb.nmsg, 2);
    /* A peer whose bell cannot be reached (another network namespace): the failed ring turns
     * the sender's tick fast, and its later messages go out unflagged, so the receiver polls
     * after them. The message whose ring failed went out flagged: its target finds it at its
     * next tick. */
    struct sockaddr_un keep = ab->bell;
    socklen_t keep_len = ab->bell_len;
    ab->bell.sun_path[1] = 'X';
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, "lost", 5);
    assert_int_equal(ops->submit(ba, ab, &f.x), CX_OK);
    assert_false(cx_fi_bell_rings(ab));
    assert_int_equal(ba->tick_slow, 0);
    assert_int_equal(drive(&fp, 1, 10000), 0);
    assert_int_equal(cb.nmsg, 3);
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, "flag", 5);
    assert_int_equal(run1(&f, 10000), CX_OK); /* unflagged, and not rung */
    assert_int_equal(cb.nmsg, 4);
    assert_true(bb->hot_until_ns > cx_fi_now_ns());
    ab->bell = keep;
    ab->bell_len = keep_len;
    cx_fi_bell_tick(ba);
    assert_int_equal(ba->tick_slow, 1);
}

static void test_message_refused(void **state)
{
    (void)state;
    cb.refuse = 1;
    static unsigned char big[200000];
    fc_xfer_t f;
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, "hi", 2);
    assert_int_equal(run1(&f, 10000), CX_EAGAIN);
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, big, sizeof big);
    assert_int_equal(run1(&f, 10000), CX_EAGAIN);
    assert_int_equal(cb.nmsg, 0);
    cb.refuse = 0;
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, "ok", 2);
    assert_int_equal(run1(&f, 10000), CX_OK);
    assert_int_equal(cb.nmsg, 1);
}

static void test_put_signal(void **state)
{
    (void)state;
    const size_t sizes[] = { 4096, 1u << 20, REG };
    for (size_t s = 0; s < 3; s++) {
        fc_reset(&cb);
        memset(abuf, 0x40 + (int)s, sizes[s]);
        cb.check_at = bbuf;
        cb.check_len = sizes[s];
        cb.check_val = (unsigned char)(0x40 + s);
        char msg[32];
        snprintf(msg, sizeof msg, "signal %zu", s);
        fc_xfer_t f;
        xfer_init(&f, CX_XFER_PUT_SIGNAL, abuf, sizes[s], (uint64_t)(uintptr_t)bbuf, msg, strlen(msg));
        assert_int_equal(run1(&f, 10000), CX_OK);
        assert_int_equal(cb.nmsg, 1);
        assert_int_equal(cb.check_failed, 0);
        assert_memory_equal(cb.msg[0], msg, strlen(msg));
    }
    /* a large message with it (rendezvous path) */
    fc_reset(&cb);
    static unsigned char big[300000];
    memset(big, 0x77, sizeof big);
    fc_xfer_t f;
    xfer_init(&f, CX_XFER_PUT_SIGNAL, abuf, 4096, (uint64_t)(uintptr_t)bbuf, big, sizeof big);
    assert_int_equal(run1(&f, 10000), CX_OK);
    assert_int_equal(cb.nmsg, 1);
    assert_int_equal(cb.msg_len[0], sizeof big);
}

/* How reads go on tcp: fi_read only on a tcp provider without 1.17.0's teardown bug, unless
 * CONNEX_FI_TCP_READ says otherwise; never write-back on other providers. */
static void test_tcp_read_choice(void **state)
{
    (void)state;
    assert_false(cx_fi_tcp_read_fixed(FI_VERSION(117, 0)));
    assert_false(cx_fi_tcp_read_fixed(FI_VERSION(117, 1)));  /* a custom build of 1.17.0 */
    assert_false(cx_fi_tcp_read_fixed(FI_VERSION(117, 10))); /* 1.17.1: released before the fix */
    assert_false(cx_fi_tcp_read_fixed(FI_VERSION(116, 10)));
    assert_true(cx_fi_tcp_read_fixed(FI_VERSION(118, 0)));
    assert_true(cx_fi_tcp_read_fixed(FI_VERSION(122, 0)));

    static struct cx_backend b; /* large: not on the stack */
    static cx_opts_t o;         /* what the backend reads CONNEX_FI_TCP_READ from */
    memset(&b, 0, sizeof b);
    b.opts = &o;
    const char *old = getenv("CONNEX_FI_TCP_READ");
    char saved[64] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    unsetenv("CONNEX_FI_TCP_READ");
    assert_int_equal(cx_opts_load(&o), CX_OK);
    snprintf(b.prov, sizeof b.prov, "tcp;ofi_rxm");
    b.prov_version = FI_VERSION(117, 0);
    assert_int_equal(cx_fi_wb_choose(&b), 1);
    assert_true(b.rd_inline > 0);
    b.prov_version = FI_VERSION(118, 0);
    assert_int_equal(cx_fi_wb_choose(&b), 0);
    setenv("CONNEX_FI_TCP_READ", "writeback", 1);
    assert_int_equal(cx_fi_wb_choose(&b), 0); /* the table was parsed before: the change is not seen */
    assert_int_equal(cx_opts_load(&o), CX_OK);
    assert_int_equal(cx_fi_wb_choose(&b), 1);
    b.prov_version = FI_VERSION(117, 0);
    setenv("CONNEX_FI_TCP_READ", "rma", 1);
    assert_int_equal(cx_opts_load(&o), CX_OK);
    assert_int_equal(cx_fi_wb_choose(&b), 0);
    setenv("CONNEX_FI_TCP_READ", "auto", 1);
    assert_int_equal(cx_opts_load(&o), CX_OK);
    assert_int_equal(cx_fi_wb_choose(&b), 1);
    setenv("CONNEX_FI_TCP_READ", "bogus", 1); /* refused (an engine would not start): auto */
    assert_int_equal(cx_opts_load(&o), CX_EINVAL);
    assert_int_equal(cx_fi_wb_choose(&b), 1);
    b.mr_mode = FI_MR_LOCAL; /* verbs: hardware reads, and no write-back without descriptors */
    assert_int_equal(cx_fi_wb_choose(&b), 0);
    b.mr_mode = 0;
    snprintf(b.prov, sizeof b.prov, "shm");
    assert_int_equal(cx_fi_wb_choose(&b), 0);
    assert_int_equal(b.rd_inline, 0);
    if (saved[0])
        setenv("CONNEX_FI_TCP_READ", saved, 1);
    else
        unsetenv("CONNEX_FI_TCP_READ");
    /* the instance this suite opened decided the same way */
    if (!strncmp(ba->prov, "tcp", 3) && !(ba->mr_mode & FI_MR_LOCAL) && (!saved[0] || !strcmp(saved, "auto")))
        assert_int_equal(ba->wb, !cx_fi_tcp_read_fixed(ba->prov_version));
}

static void test_bad_input(void **state)
{
    (void)state;
    fc_xfer_t f;
    /* malformed key */
    xfer_init(&f, CX_XFER_READ, abuf, 16, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    f.x.rkey_len = 3;
    assert_int_equal(ops->submit(ba, ab, &f.x), CX_EINVAL);
    /* remote address below the region's base */
    xfer_init(&f, CX_XFER_READ, abuf, 16, (uint64_t)(uintptr_t)bbuf - 4096, NULL, 0);
    assert_int_equal(ops->submit(ba, ab, &f.x), CX_EINVAL);
    /* no local registration */
    xfer_init(&f, CX_XFER_WRITE, abuf, 16, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    f.x.local_mh = NULL;
    assert_int_equal(ops->submit(ba, ab, &f.x), CX_EINVAL);
    /* unknown kind */
    xfer_init(&f, 77, abuf, 16, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    assert_int_equal(ops->submit(ba, ab, &f.x), CX_EINVAL);
    /* oversize message */
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, abuf, (size_t)CX_MSG_MAX + 1);
    assert_int_equal(ops->submit(ba, ab, &f.x), CX_EINVAL);
    assert_int_equal(f.done, 0);
    /* malformed and foreign address blobs */
    cx_bep_t *ep = NULL;
    unsigned char junk[8] = { 9, 9, 9 };
    assert_int_equal(ops->connect(ba, &cookie_b, junk, sizeof junk, &ep), CX_EINVAL);
    /* version 2: provider "xyz", format 1, a 1-byte name, pid 0 */
    unsigned char foreign[64] = { 2, 3, 'x', 'y', 'z', 1, 0, 0, 0, 1, 0, 7, 0, 0, 0, 0 };
    assert_int_equal(ops->connect(ba, &cookie_b, foreign, 16, &ep), CX_EUNSUPPORTED);
    assert_null(ep);
    /* GPU memory without FI_HMEM */
    void *mh;
    unsigned char key[64];
    size_t kl = sizeof key;
    assert_int_equal(ops->mem_reg(ba, abuf, 4096, CX_MEM_CUDA, &mh, key, &kl), CX_EUNSUPPORTED);
    /* key buffer too small */
    kl = 4;
    assert_int_equal(ops->mem_reg(ba, abuf, 4096, CX_MEM_HOST, &mh, key, &kl), CX_EINVAL);
}

/* A message claiming an unknown incarnation is refused without an answer. */
static void test_unknown_sender(void **state)
{
    (void)state;
    uint64_t keep = cb.peer_inc;
    cb.peer_inc = 42;
    fc_xfer_t f;
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, "who", 3);
    assert_int_equal(ops->submit(ba, ab, &f.x), CX_OK);
    fc_xfer_t *p = &f;
    assert_int_equal(drive(&p, 1, 300), -1); /* no ack: the core's op timeout covers it */
    assert_int_equal(cb.nmsg, 0);
    assert_true(cb.served_bad >= 1);
    cb.peer_inc = keep;
    /* the core gives up on it: disconnect completes it exactly once */
    ops->disconnect(ba, ab, CX_EPEER);
    assert_int_equal(f.done, 1);
    assert_int_equal(f.status, CX_EPEER);
    unsigned char addr[4096];
    size_t len = sizeof addr;
    assert_int_equal(ops->address(bb, addr, &len), CX_OK);
    assert_int_equal(ops->connect(ba, &cookie_b, addr, len, &ab), CX_OK);
    settle(100);
    assert_int_equal(f.done, 1);
}

/* tcp with write-back (fi_cq.c, cx_fi_sweep_tick): after a connect, progress comes back at each
 * sweep of the 2 s window without any traffic, the last sweep falls at the window's end, and
 * every descriptor libfabric opened meanwhile is close-on-exec, the accepting side's too (B did
 * not connect again: it sweeps on A's warm-up ack; without that, 1 run in 4 under ASan found
 * B's accepted socket unmarked). Idle after the window. */
static void test_sweeps_after_connect(void **state)
{
    (void)state;
    if (!ba->wb) {
        print_message("no write-back on %s: no sweep window\n", ba->prov);
        skip();
    }
    size_t nbefore;
    int *before = cx_fi_fd_list(&nbefore);
    assert_non_null(before);
    ops->disconnect(ba, ab, CX_EPEER);
    unsigned char addr[4096];
    size_t len = sizeof addr;
    assert_int_equal(ops->address(bb, addr, &len), CX_OK);
    assert_int_equal(ops->connect(ba, &cookie_b, addr, len, &ab), CX_OK);
    uint64_t until = ba->sweep_hot_until_ns;
    assert_true(until > cx_fi_now_ns());
    int n = wakeups(2300);
    print_message("%d wake-ups in the 2.3 s after a connect; last sweep %lld ms after the window's end\n", n,
                  (long long)((int64_t)(ba->last_sweep_ns - until) / 1000000));
    assert_true(ba->last_sweep_ns >= until);
    assert_true(n >= 8);   /* the sweeps: at gaps doubling from 1 ms, then the window's end */
    assert_true(n <= 200); /* not a busy loop */
    assert_true(wakeups(300) <= 2);
    size_t nnow;
    int *now = cx_fi_fd_list(&nnow), bad = -1;
    assert_non_null(now);
    for (size_t i = 0, j = 0; i < nnow && bad < 0; i++) {
        while (j < nbefore && before[j] < now[i]) j++;
        if (j < nbefore && before[j] == now[i]) continue;
        int fl = fcntl(now[i], F_GETFD);
        if (fl >= 0 && !(fl & FD_CLOEXEC)) bad = now[i];
    }
    free(before);
    free(now);
    if (bad >= 0) {
        char p[64], l[128] = "?";
        snprintf(p, sizeof p, "/proc/self/fd/%d", bad);
        ssize_t k = readlink(p, l, sizeof l - 1);
        if (k > 0) l[k] = 0;
        fail_msg("fd %d (%s) opened after the connect lacks close-on-exec", bad, l);
    }
}

/* Disconnect with transfers in flight: each completes once with CX_EPEER before disconnect
 * returns, and late CQ entries are harmless. Then a fresh endpoint works. */
static void test_disconnect_in_flight(void **state)
{
    (void)state;
    enum { N = 32 };
    static fc_xfer_t f[N];
    int cma = ba->cma;
    ba->cma = 0; /* the provider's path, as above */
    for (int i = 0; i < N; i++) {
        int k = i % 3 == 0 ? CX_XFER_READ : i % 3 == 1 ? CX_XFER_WRITE : CX_XFER_MSG;
        xfer_init(&f[i], k, abuf + i * 65536, 65536, (uint64_t)(uintptr_t)(bbuf + i * 65536), "m", 1);
        assert_int_equal(ops->submit(ba, ab, &f[i].x), CX_OK);
    }
    disconnect_in_flight(f, N, 0x33);
    ba->cma = cma;
}

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* A child that takes A's region lock through the guard's mapping (which it inherits: the lock
 * it takes there is the one every process sees) and stops itself; returned once stopped. */
static pid_t stopped_holder(void)
{
    pthread_spinlock_t *lock = (pthread_spinlock_t *)(uintptr_t)ba->self_lockw;
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (pthread_spin_trylock(lock)) _exit(2);
        raise(SIGSTOP);
        pthread_spin_unlock(lock);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(c, &st, WUNTRACED), c);
    assert_true(WIFSTOPPED(st));
    return c;
}

static void continue_holder(pid_t c)
{
    int st = 0;
    kill(c, SIGCONT);
    assert_int_equal(waitpid(c, &st, 0), c);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Ops both ways while A's lock is held: A's write, read and message to B (B's ack comes into
 * A's region), B's write and message into A. */
typedef struct held_ops {
    fc_xfer_t w, r, m, bw, bm;
    fc_xfer_t *all[5];
} held_ops_t;

static void held_ops_submit(held_ops_t *o, unsigned char pat)
{
    for (size_t i = 0; i < 4096; i++) abuf[i] = (unsigned char)(i * 11 + pat);
    memset(bbuf + 65536, pat + 1, 4096);
    memset(bbuf + 131072, pat + 2, 4096);
    xfer_init(&o->w, CX_XFER_WRITE, abuf, 4096, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    xfer_init(&o->r, CX_XFER_READ, abuf + 8192, 4096, (uint64_t)(uintptr_t)(bbuf + 65536), NULL, 0);
    xfer_init(&o->m, CX_XFER_MSG, NULL, 0, 0, "to B", 4);
    fc_xfer_init(&o->bw, CX_XFER_WRITE, bbuf + 131072, 4096, (uint64_t)(uintptr_t)(abuf + 65536), NULL, 0);
    o->bw.x.local_mh = bmh;
    o->bw.x.remote_base = (uint64_t)(uintptr_t)abuf;
    o->bw.x.rkey = akey;
    o->bw.x.rkey_len = akey_len;
    fc_xfer_init(&o->bm, CX_XFER_MSG, NULL, 0, 0, "to A", 4);
    fc_xfer_t *all[5] = { &o->w, &o->r, &o->m, &o->bw, &o->bm };
    memcpy(o->all, all, sizeof all);
    assert_int_equal(ops->submit(ba, ab, &o->w.x), CX_OK);
    assert_int_equal(ops->submit(ba, ab, &o->r.x), CX_OK);
    assert_int_equal(ops->submit(ba, ab, &o->m.x), CX_OK);
    assert_int_equal(ops->submit(bb, ba_ep, &o->bw.x), CX_OK);
    assert_int_equal(ops->submit(bb, ba_ep, &o->bm.x), CX_OK);
}

static void held_ops_check(held_ops_t *o, unsigned char pat)
{
    for (int i = 0; i < 5; i++) assert_int_equal(o->all[i]->status, CX_OK);
    assert_memory_equal(bbuf, abuf, 4096);
    assert_memory_equal(abuf + 8192, bbuf + 65536, 4096);
    for (size_t i = 0; i < 4096; i++) assert_int_equal(abuf[65536 + i], (unsigned char)(pat + 2));
    assert_int_equal(cb.nmsg, 1);
    assert_memory_equal(cb.msg[0], "to B", 4);
    assert_int_equal(ca.nmsg, 1);
    assert_memory_equal(ca.msg[0], "to A", 4);
    assert_int_equal(ba->wedged_ns, 0);
}

/* shm: a process stopped while it holds a region's spinlock (a sender takes its target's to
 * queue a command; libfabric 1.17 spins on it). Our region's held: A's progress keeps returning
 * (before, A's thread spun inside fi_cq_read until the holder was continued: the engine's
 * heartbeats and op timeouts stopped with it); B's posts to A wait in B's backlog instead of
 * spinning. Once the holder lets go, every op completes with the right bytes. This is the path
 * without a new region (fi_rot.c): the next test has one. */
/* The shm provider without the spinlock guard: libfabric's region layout was not recognised
 * (fi_shm.c). A skip, or a failure where CONNEX_TEST_REQUIRE names fi_shm_guard (tests/README.md,
 * "Skips"); on other providers the guard does not apply. */
static void guard_missing(const char *what)
{
    const char *prov = getenv("CONNEX_FI_PROVIDER"), *req = getenv("CONNEX_TEST_REQUIRE");
    if (prov && !strcmp(prov, "shm") && req && strstr(req, "fi_shm_guard"))
        fail_msg("cxt: required capability fi_shm_guard missing: %s on shm", what);
    print_message("%s on this provider: skipped\n", what);
    skip();
}

/* The held-lock tests are about the provider's path: same-host copies (fi_cma.c) need no lock
 * and end a read or write while the holder is stopped. */
static int cma_a, cma_b;
static void cma_off(void)
{
    cma_a = ba->cma;
    cma_b = bb->cma;
    ba->cma = bb->cma = 0;
}

static void cma_on(void)
{
    ba->cma = cma_a;
    bb->cma = cma_b;
}

static void test_region_lock_held_by_stopped_process(void **state)
{
    (void)state;
    if (!ba->self_lockw || !ba_ep->lockw) guard_missing("no spinlock guard");
    /* A thread spinning inside the provider never returns to a cmocka check: bounded here. */
    alarm(30);
    cma_off();
    uint64_t rot_ns = ba->rot_ns;
    ba->rot_ns = 0; /* no rotation at all */
    pid_t c = stopped_holder();
    assert_true(cx_fi_lock_held(ba, ba->self_lockw));
    held_ops_t o;
    held_ops_submit(&o, 1);
    /* 300 ms of both progress loops, bounded: with the thread spinning inside the provider
     * this call would not return until the holder is continued. */
    uint64_t t0 = now_ms();
    drive(o.all, 5, 300);
    uint64_t took = now_ms() - t0;
    print_message("progress while held: 300 ms asked, returned after %llu ms; done: write %d "
                  "read %d msg %d B's write %d B's msg %d\n",
                  (unsigned long long)took, o.w.done, o.r.done, o.m.done, o.bw.done, o.bm.done);
    assert_true(took < 2000);
    assert_int_equal(o.bw.done, 0); /* still in B's backlog: nothing was posted into A */
    assert_int_equal(o.bm.done, 0);
    assert_true(cx_fi_lock_held(ba, ba->self_lockw));
    continue_holder(c);
    assert_int_equal(drive(o.all, 5, 10000), 0);
    held_ops_check(&o, 1);
    ba->rot_ns = rot_ns;
    cma_on();
    alarm(0);
}

/* The same stopped holder, with the rotation on (fi_rot.c): A moves to a new region, tells B,
 * and every op in both directions completes while the holder is still stopped. First as one of
 * A's peers (A's core answers for B with the holder's process): A moves once it has been held
 * rot_ns. Then a holder that is no peer of A's: A waits rot_any_ns, not rot_ns. */
static void test_stopped_holder_new_region(void **state)
{
    (void)state;
    if (!ba->self_lockw || !ba_ep->lockw || !ba->rot_ns) guard_missing("no spinlock guard or no rotation");
    alarm(30);
    cma_off();
    uint64_t rot_ns = ba->rot_ns, rot_any_ns = ba->rot_any_ns;
    ba->rot_ns = 100000000ull;
    ba->rot_any_ns = 10000000000ull;
    uint32_t gen0 = ba->rot_gen, b_pid = ca.peer_pid;
    char old_name[64], path[128];
    memcpy(old_name, ba->shm_self, sizeof old_name);
    snprintf(path, sizeof path, "/dev/shm/%s", old_name);
    assert_int_equal(access(path, F_OK), 0);
    unsigned char addr0[4096], addr1[4096];
    size_t len0 = sizeof addr0, len1 = sizeof addr1;
    assert_int_equal(ops->address(ba, addr0, &len0), CX_OK);

    pid_t c = stopped_holder();
    ca.peer_pid = (uint32_t)c;
    held_ops_t o;
    held_ops_submit(&o, 3);
    uint64_t t0 = now_ms();
    int left = drive(o.all, 5, 5000);
    print_message("holder stopped (a peer): %d of 5 ops left after %llu ms; generation %u, "
                  "region %s\n",
                  left, (unsigned long long)(now_ms() - t0), ba->rot_gen, ba->shm_self);
    ca.peer_pid = b_pid;
    assert_int_equal(left, 0);
    assert_true(now_ms() - t0 < 2000);
    held_ops_check(&o, 3);
    /* A is elsewhere now, B posts there, and the old region is gone from /dev/shm. */
    assert_int_equal(ba->rot_gen, gen0 + 1);
    assert_string_not_equal(ba->shm_self, old_name);
    assert_int_equal(ba_ep->peer_gen, ba->rot_gen);
    assert_string_equal(ba_ep->shm_name, ba->shm_self);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(ops->address(ba, addr1, &len1), CX_OK);
    assert_false(len0 == len1 && !memcmp(addr0, addr1, len0));

    /* A connect with the HELLO from before the move still reaches the new region. */
    cx_bep_t *late = NULL;
    static int cookie_late;
    assert_int_equal(ops->connect(bb, &cookie_late, addr0, len0, &late), CX_OK);
    assert_string_equal(late->shm_name, ba->shm_self);
    ops->disconnect(bb, late, CX_EPEER);

    /* And on, both directions, once the holder has let go of the old lock. */
    continue_holder(c);
    fc_reset(&ca);
    fc_reset(&cb);
    held_ops_submit(&o, 5);
    assert_int_equal(drive(o.all, 5, 5000), 0);
    held_ops_check(&o, 5);

    /* A holder that is none of A's peers: no move at rot_ns (it could be a live process
     * merely preempted), one at rot_any_ns. */
    ba->rot_any_ns = 400000000ull;
    c = stopped_holder();
    fc_reset(&ca);
    fc_reset(&cb);
    held_ops_submit(&o, 7);
    t0 = now_ms();
    drive(o.all, 5, 250);
    assert_int_equal(o.bw.done, 0);
    assert_int_equal(ba->rot_gen, gen0 + 1);
    left = drive(o.all, 5, 5000);
    uint64_t took = now_ms() - t0;
    print_message("holder stopped (no peer): %d of 5 ops left after %llu ms; generation %u\n", left,
                  (unsigned long long)took, ba->rot_gen);
    assert_int_equal(left, 0);
    assert_true(took >= 400);
    held_ops_check(&o, 7);
    assert_int_equal(ba->rot_gen, gen0 + 2);
    continue_holder(c);
    ba->rot_ns = rot_ns;
    ba->rot_any_ns = rot_any_ns;
    cma_on();
    alarm(0);
}

static int group_setup(void **state)
{
    (void)state;
    if (fc_open_pair(ops, &ca, &cb, &cookie_a, &cookie_b, &ba, &bb)) return -1;
    unsigned char addr[4096];
    size_t len = sizeof addr;
    if (ops->address(bb, addr, &len) || ops->connect(ba, &cookie_b, addr, len, &ab)) return -1;
    len = sizeof addr;
    if (ops->address(ba, addr, &len) || ops->connect(bb, &cookie_a, addr, len, &ba_ep)) return -1;
    abuf = aligned_alloc(4096, REG);
    bbuf = aligned_alloc(4096, REG);
    if (!abuf || !bbuf) return -1;
    akey_len = sizeof akey;
    bkey_len = sizeof bkey;
    if (ops->mem_reg(ba, abuf, REG, CX_MEM_HOST, &amh, akey, &akey_len) ||
        ops->mem_reg(bb, bbuf, REG, CX_MEM_HOST, &bmh, bkey, &bkey_len))
        return -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    ops->mem_dereg(ba, amh);
    ops->mem_dereg(bb, bmh);
    if (ab) ops->disconnect(ba, ab, CX_EPEER);
    ops->disconnect(bb, ba_ep, CX_EPEER);
    ops->close(ba);
    ops->close(bb);
    fc_reset(&ca);
    fc_reset(&cb);
    free(abuf);
    free(bbuf);
    return 0;
}

int main(int argc, char **argv)
{
    /* The provider's parts as separate arguments ("tcp" "ofi_rxm"): a ';' does not survive
     * CMake's add_test. */
    char prov[128] = "";
    for (int i = 1; i < argc; i++)
        snprintf(prov + strlen(prov), sizeof prov - strlen(prov), "%s%s", i > 1 ? ";" : "", argv[i]);
    if (argc > 1) setenv("CONNEX_FI_PROVIDER", prov, 1);
    cx_log_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_open_and_address, setup),
        cmocka_unit_test_setup(test_write_read, setup),
        cmocka_unit_test_setup(test_read_boundaries, setup),
        cmocka_unit_test_setup(test_read_refused_by_target, setup),
        cmocka_unit_test_setup(test_many_in_flight, setup),
        cmocka_unit_test_setup(test_batch_vectors, setup),
        cmocka_unit_test_setup(test_batch_read_lists, setup),
        cmocka_unit_test_setup(test_same_host_copies, setup),
        cmocka_unit_test_setup(test_messages, setup),
        cmocka_unit_test_setup(test_shm_doorbells, setup),
        cmocka_unit_test_setup(test_message_refused, setup),
        cmocka_unit_test_setup(test_put_signal, setup),
        cmocka_unit_test_setup(test_tcp_read_choice, setup),
        cmocka_unit_test_setup(test_bad_input, setup),
        cmocka_unit_test_setup(test_unknown_sender, setup),
        cmocka_unit_test_setup(test_sweeps_after_connect, setup),
        cmocka_unit_test_setup(test_disconnect_in_flight, setup),
        cmocka_unit_test_setup(test_region_lock_held_by_stopped_process, setup),
        cmocka_unit_test_setup(test_stopped_holder_new_region, setup),
    };
    return cmocka_run_group_tests_name(argc > 1 ? prov : "default", tests, group_setup, group_teardown);
}
