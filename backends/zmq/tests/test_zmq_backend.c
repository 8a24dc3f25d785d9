/* The ZeroMQ backend alone, behind the fake core (tests/fake_core): two instances against each
 * other through the vtable, and raw frames from a DEALER of the test's own against a target's
 * ROUTER. Requests are single frames (cx_zmq_submit); a target must refuse every frame that does
 * not add up with a clear status, never crash or write outside what the header names. */
#include "fake_core.h"
#include "zmq_int.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "connex/log.h"

extern const struct cx_backend_ops cx_zmq_ops;
static const struct cx_backend_ops *ops = &cx_zmq_ops;

static cx_core_t ca, cb;
static cx_backend_t *ba, *bb;
static cx_bep_t *ab; /* A's endpoint to B */
static int cookie_a, cookie_b;
static void *rctx, *raw; /* the test's own DEALER, connected to B's ROUTER */
static char baddr[256];  /* B's address blob */
static size_t baddr_len;

#define REG (256u << 10)  /* room for entries that go zero-copy (CX_ZMQ_ZEROCOPY_MIN) */
#define RAW_INC 0x7777ull /* the raw DEALER's "incarnation" */
static unsigned char abuf[REG], bbuf[REG];
static void *amh, *bmh;

static void xfer_init(fc_xfer_t *f, int kind, void *local, size_t len, uint64_t remote, const void *msg, size_t msg_len)
{
    fc_xfer_init(f, kind, local, len, remote, msg, msg_len);
    f->x.local_mh = amh;
    f->x.remote_base = (uint64_t)(uintptr_t)bbuf;
}

static int run1(fc_xfer_t *f)
{
    int r = ops->submit(ba, ab, &f->x);
    if (r) return r;
    return fc_drive(ops, ba, bb, &f, 1, 5000) ? CX_ETIMEDOUT : f->status;
}

/* Sends one raw request (nparts frames), serves it on B and returns the reply's status, with a
 * READ's data frame in *data (at most cap bytes, *dlen its size); 1 when no reply came. */
static int raw_req(const void *const *part, const size_t *len, int nparts, void *data, size_t cap, size_t *dlen)
{
    for (int i = 0; i < nparts; i++) assert_true(zmq_send(raw, part[i], len[i], i + 1 < nparts ? ZMQ_SNDMORE : 0) >= 0);
    if (dlen) *dlen = 0;
    uint64_t end = fc_now_ms() + 1000;
    while (fc_now_ms() < end) {
        struct pollfd p = { ops->wait_fd(bb), POLLIN, 0 };
        poll(&p, 1, 2);
        ops->progress(bb);
        uint8_t hdr[64];
        int n = zmq_recv(raw, hdr, sizeof hdr, ZMQ_DONTWAIT);
        if (n < 0) continue;
        cx_zmq_rep_t rep;
        assert_int_equal(n, CX_ZMQ_REP_HDR);
        assert_int_equal(cx_zmq_rep_get(hdr, (size_t)n, &rep), CX_OK);
        int more = 0;
        size_t sz = sizeof more;
        zmq_getsockopt(raw, ZMQ_RCVMORE, &more, &sz);
        if (more) {
            int m = zmq_recv(raw, data, cap, 0);
            assert_true(m >= 0);
            if (dlen) *dlen = (size_t)m;
        }
        return rep.status;
    }
    return 1;
}

/* One frame: header, then body bytes. */
static int raw1(uint8_t kind, uint64_t sender, uint64_t addr, uint64_t len, const void *body, size_t blen, void *data,
                size_t cap, size_t *dlen)
{
    static uint8_t f[CX_ZMQ_REQ_HDR + REG + 64];
    static uint64_t id = 1000;
    assert_true(blen <= sizeof f - CX_ZMQ_REQ_HDR);
    cx_zmq_req_put(f, &(cx_zmq_req_t){ .kind = kind, .id = id++, .sender = sender, .addr = addr, .len = len });
    if (blen) memcpy(f + CX_ZMQ_REQ_HDR, body, blen);
    const void *parts[1] = { f };
    size_t lens[1] = { CX_ZMQ_REQ_HDR + blen };
    return raw_req(parts, lens, 1, data, cap, dlen);
}

static int setup(void **state)
{
    (void)state;
    fc_reset(&ca);
    fc_reset(&cb);
    memset(abuf, 0, sizeof abuf);
    memset(bbuf, 0, sizeof bbuf);
    cb.peer_inc = ca.inc; /* test_raw_* switch it to the raw DEALER's */
    return 0;
}

/* The vtable end to end: every kind of op from A to B, checked at B. */
static void test_ops_through_the_backend(void **state)
{
    (void)state;
    for (size_t i = 0; i < 5000; i++) abuf[i] = (unsigned char)(i * 3 + 1);
    fc_xfer_t f;
    xfer_init(&f, CX_XFER_WRITE, abuf, 5000, (uint64_t)(uintptr_t)bbuf + 7, NULL, 0);
    assert_int_equal(run1(&f), CX_OK);
    assert_memory_equal(bbuf + 7, abuf, 5000);
    assert_int_equal(bbuf[6], 0);
    assert_int_equal(bbuf[5007], 0);

    memset(abuf, 0, 5000);
    xfer_init(&f, CX_XFER_READ, abuf, 5000, (uint64_t)(uintptr_t)bbuf + 7, NULL, 0);
    assert_int_equal(run1(&f), CX_OK);
    assert_memory_equal(abuf, bbuf + 7, 5000);

    /* put_signal: the data is in place when the message is delivered */
    memset(abuf, 0x5c, 300);
    cb.check_at = bbuf + 100;
    cb.check_len = 300;
    cb.check_val = 0x5c;
    xfer_init(&f, CX_XFER_PUT_SIGNAL, abuf, 300, (uint64_t)(uintptr_t)bbuf + 100, "step 17", 7);
    assert_int_equal(run1(&f), CX_OK);
    assert_int_equal(cb.check_failed, 0);
    assert_int_equal(cb.nmsg, 1);
    assert_int_equal(cb.msg_len[0], 7);
    assert_memory_equal(cb.msg[0], "step 17", 7);
    cb.check_at = NULL;

    /* messages: empty and 40000 bytes */
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, "", 0);
    assert_int_equal(run1(&f), CX_OK);
    static unsigned char big[40000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i ^ 0x3c);
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, big, sizeof big);
    assert_int_equal(run1(&f), CX_OK);
    assert_int_equal(cb.nmsg, 3);
    assert_int_equal(cb.msg_len[1], 0);
    assert_int_equal(cb.msg_len[2], sizeof big);
    assert_memory_equal(cb.msg[2], big, sizeof big);

    /* the target's queue is full: the sender hears CX_EAGAIN, the target counts a rejection */
    int ok0 = cb.served_ok, bad0 = cb.served_bad;
    cb.refuse = 1;
    xfer_init(&f, CX_XFER_MSG, NULL, 0, 0, "x", 1);
    assert_int_equal(run1(&f), CX_EAGAIN);
    assert_int_equal(cb.served_ok, ok0);
    assert_int_equal(cb.served_bad, bad0 + 1);
    /* the same for a put_signal whose data landed but whose message was refused */
    xfer_init(&f, CX_XFER_PUT_SIGNAL, abuf, 300, (uint64_t)(uintptr_t)bbuf + 100, "y", 1);
    assert_int_equal(run1(&f), CX_EAGAIN);
    assert_int_equal(cb.served_ok, ok0);
    assert_int_equal(cb.served_bad, bad0 + 2);
}

/* Well-formed raw frames work as the backend's own do. */
static void test_raw_good_frames(void **state)
{
    (void)state;
    cb.peer_inc = RAW_INC;
    unsigned char d[200];
    for (int i = 0; i < 200; i++) d[i] = (unsigned char)(200 - i);
    uint64_t at = (uint64_t)(uintptr_t)bbuf + 1000;
    assert_int_equal(raw1(CX_XFER_WRITE, RAW_INC, at, 200, d, 200, NULL, 0, NULL), CX_OK);
    assert_memory_equal(bbuf + 1000, d, 200);
    unsigned char got[256];
    size_t n = 0;
    assert_int_equal(raw1(CX_XFER_READ, RAW_INC, at, 200, NULL, 0, got, sizeof got, &n), CX_OK);
    assert_int_equal(n, 200);
    assert_memory_equal(got, d, 200);
    unsigned char ps[205];
    memset(ps, 0x11, 200);
    memcpy(ps + 200, "hello", 5);
    assert_int_equal(raw1(CX_XFER_PUT_SIGNAL, RAW_INC, at, 200, ps, sizeof ps, NULL, 0, NULL), CX_OK);
    assert_int_equal(bbuf[1000], 0x11);
    assert_int_equal(cb.nmsg, 1);
    assert_int_equal(cb.msg_len[0], 5);
    assert_memory_equal(cb.msg[0], "hello", 5);
    assert_int_equal(raw1(CX_XFER_MSG, RAW_INC, 0, 0, "m", 1, NULL, 0, NULL), CX_OK);
    assert_int_equal(cb.nmsg, 2);
}

/* Frames that do not add up: refused with CX_EINVAL (or dropped when not even the header
 * parses), nothing written, the target still serving afterwards. */
static void test_raw_garbage(void **state)
{
    (void)state;
    cb.peer_inc = RAW_INC;
    uint64_t at = (uint64_t)(uintptr_t)bbuf + 2000;
    unsigned char d[300];
    memset(d, 0xab, sizeof d);
    int bad0 = cb.served_bad;
    /* a write whose frame holds fewer bytes than its header says */
    assert_int_equal(raw1(CX_XFER_WRITE, RAW_INC, at, 300, d, 299, NULL, 0, NULL), CX_EINVAL);
    /* a write with bytes after its data (only a message may follow, and a write has none) */
    assert_int_equal(raw1(CX_XFER_WRITE, RAW_INC, at, 100, d, 101, NULL, 0, NULL), CX_EINVAL);
    /* a read with a body */
    assert_int_equal(raw1(CX_XFER_READ, RAW_INC, at, 100, d, 3, NULL, 0, NULL), CX_EINVAL);
    /* zero-length read and write */
    assert_int_equal(raw1(CX_XFER_READ, RAW_INC, at, 0, NULL, 0, NULL, 0, NULL), CX_EINVAL);
    assert_int_equal(raw1(CX_XFER_WRITE, RAW_INC, at, 0, NULL, 0, NULL, 0, NULL), CX_EINVAL);
    /* a message whose header claims data */
    assert_int_equal(raw1(CX_XFER_MSG, RAW_INC, 0, 5, "abcde", 5, NULL, 0, NULL), CX_EINVAL);
    /* a length near 2^64 */
    assert_int_equal(raw1(CX_XFER_WRITE, RAW_INC, at, UINT64_MAX, d, 10, NULL, 0, NULL), CX_EINVAL);
    /* the multipart layout of earlier versions: header, data, message */
    uint8_t h[CX_ZMQ_REQ_HDR];
    cx_zmq_req_put(h,
                   &(cx_zmq_req_t){ .kind = CX_XFER_PUT_SIGNAL, .id = 1, .sender = RAW_INC, .addr = at, .len = 300 });
    const void *parts[3] = { h, d, "sig" };
    size_t lens[3] = { sizeof h, 300, 3 };
    assert_int_equal(raw_req(parts, lens, 3, NULL, 0, NULL), CX_EINVAL);
    for (int i = 0; i < 300; i++) assert_int_equal(bbuf[2000 + i], 0);
    assert_int_equal(cb.nmsg, 0);
    /* outside the target's region: its core refuses */
    cb.reg_lo = (uint64_t)(uintptr_t)bbuf;
    cb.reg_hi = cb.reg_lo + REG;
    assert_int_equal(raw1(CX_XFER_WRITE, RAW_INC, cb.reg_hi - 10, 20, d, 20, NULL, 0, NULL), CX_EINVAL);
    assert_int_equal(raw1(CX_XFER_READ, RAW_INC, cb.reg_lo - 1, 20, NULL, 0, NULL, 0, NULL), CX_EINVAL);
    /* an unknown sender */
    assert_int_equal(raw1(CX_XFER_WRITE, 0x9999, at, 10, d, 10, NULL, 0, NULL), CX_EPEER);
    /* not even a header: dropped, no reply, counted */
    int before = cb.served_bad;
    const void *shortp[1] = { "tiny" };
    size_t shortl[1] = { 4 };
    assert_int_equal(raw_req(shortp, shortl, 1, NULL, 0, NULL), 1);
    assert_int_equal(cb.served_bad, before + 1);
    assert_true(cb.served_bad - bad0 >= 10);
    for (int i = 0; i < 300; i++) assert_int_equal(bbuf[2000 + i], 0);
    /* and the target still serves */
    assert_int_equal(raw1(CX_XFER_WRITE, RAW_INC, at, 300, d, 300, NULL, 0, NULL), CX_OK);
    assert_int_equal(bbuf[2299], 0xab);
}

/* Batches through the vtable: entries under CX_ZMQ_ZEROCOPY_MIN in one frame per run (bp[3]
 * numbers an xfer inside its frame), larger ones and a run of one as single requests between them,
 * and an entry outside the target's region in the middle of a frame failing alone, with the status
 * the single request gets. */
static void test_batch_through_the_backend(void **state)
{
    (void)state;
    char addr[256];
    size_t alen = sizeof addr;
    assert_int_equal(ops->address(bb, addr, &alen), CX_OK);
    assert_true(alen > 16 && !memcmp(addr, "tcp://0.0.0.0:0;", 16)); /* version 2 advertised */
    static const size_t len[] = { 100, 70000, 3000, 1, 3000, 70000, 5, 6 };
    static const uintptr_t place[] = { 0, 0, 1, 2, 3, 0, 1, 2 }; /* in its frame; 0: single */
    enum { N = sizeof len / sizeof *len };
    static fc_xfer_t f[N];
    fc_xfer_t *fp[N];
    cx_xfer_t *xs[N];
    int rcs[N];
    for (size_t i = 0; i < REG; i++) abuf[i] = (unsigned char)(i * 7 + 3);
    for (int bad = -1; bad <= 3; bad += 4) { /* no bad entry, then entry 3 outside the region */
        memset(bbuf, 0, REG);
        cb.reg_lo = (uint64_t)(uintptr_t)bbuf;
        cb.reg_hi = cb.reg_lo + REG;
        size_t off = 0;
        for (int i = 0; i < N; i++) {
            uint64_t at = i == bad ? cb.reg_hi + 64 : (uint64_t)(uintptr_t)bbuf + off;
            xfer_init(&f[i], CX_XFER_WRITE, abuf + off, len[i], at, NULL, 0);
            fp[i] = &f[i];
            xs[i] = &f[i].x;
            off += len[i] + 11;
        }
        ops->submit_batch(ba, ab, xs, N, rcs);
        for (int i = 0; i < N; i++) assert_int_equal(rcs[i], CX_OK);
        assert_int_equal(fc_drive(ops, ba, bb, fp, N, 5000), 0);
        off = 0;
        for (int i = 0; i < N; i++) {
            assert_int_equal(f[i].done, 1);
            assert_int_equal((uintptr_t)f[i].x.bp[3], place[i]);
            assert_int_equal(f[i].status, i == bad ? CX_EINVAL : CX_OK);
            if (i != bad) assert_memory_equal(bbuf + off, abuf + off, len[i]);
            assert_int_equal(bbuf[off + len[i]], 0); /* nothing past an entry */
            off += len[i] + 11;
        }
        /* and read back into a cleared buffer */
        memset(abuf, 0, REG);
        off = 0;
        for (int i = 0; i < N; i++) {
            uint64_t at = i == bad ? cb.reg_hi + 64 : (uint64_t)(uintptr_t)bbuf + off;
            xfer_init(&f[i], CX_XFER_READ, abuf + off, len[i], at, NULL, 0);
            off += len[i] + 11;
        }
        ops->submit_batch(ba, ab, xs, N, rcs);
        assert_int_equal(fc_drive(ops, ba, bb, fp, N, 5000), 0);
        off = 0;
        for (int i = 0; i < N; i++) {
            assert_int_equal(f[i].done, 1);
            assert_int_equal(f[i].status, i == bad ? CX_EINVAL : CX_OK);
            for (size_t k = 0; k < len[i]; k++)
                assert_int_equal(abuf[off + k], i == bad ? 0 : (unsigned char)((off + k) * 7 + 3));
            off += len[i] + 11;
        }
        for (size_t i = 0; i < REG; i++) abuf[i] = (unsigned char)(i * 7 + 3);
    }
    /* a lone entry, a put_signal and a 4 MiB entry go as single requests */
    static unsigned char big[4u << 20];
    unsigned char *tgt = malloc(sizeof big);
    assert_non_null(tgt);
    cb.reg_hi = 0;
    memset(big, 0x42, sizeof big);
    xfer_init(&f[0], CX_XFER_WRITE, abuf, 10, (uint64_t)(uintptr_t)bbuf, NULL, 0);
    xfer_init(&f[1], CX_XFER_PUT_SIGNAL, abuf, 10, (uint64_t)(uintptr_t)bbuf + 20, "s", 1);
    xfer_init(&f[2], CX_XFER_WRITE, big, sizeof big, (uint64_t)(uintptr_t)tgt, NULL, 0);
    xfer_init(&f[3], CX_XFER_WRITE, abuf, 10, (uint64_t)(uintptr_t)bbuf + 40, NULL, 0);
    ops->submit_batch(ba, ab, xs, 4, rcs);
    assert_int_equal(fc_drive(ops, ba, bb, fp, 4, 5000), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(rcs[i], CX_OK);
        assert_int_equal(f[i].status, CX_OK);
        assert_null(f[i].x.bp[3]);
    }
    assert_int_equal(tgt[sizeof big - 1], 0x42);
    assert_int_equal(cb.nmsg, 1);
    free(tgt);
}

/* Sends one raw batch frame (fsz bytes) and returns the reply's head, with a read's data parts
 * concatenated into data (at most cap bytes, *dlen their size); 1 when no reply came. */
static int raw_batch(const uint8_t *frame, size_t fsz, cx_zmq_brep_t *rep, uint8_t *head, size_t hcap, void *data,
                     size_t cap, size_t *dlen)
{
    assert_true(zmq_send(raw, frame, fsz, 0) >= 0);
    *dlen = 0;
    uint64_t end = fc_now_ms() + 1000;
    while (fc_now_ms() < end) {
        struct pollfd p = { ops->wait_fd(bb), POLLIN, 0 };
        poll(&p, 1, 2);
        ops->progress(bb);
        int n = zmq_recv(raw, head, hcap, ZMQ_DONTWAIT);
        if (n < 0) continue;
        assert_true((size_t)n <= hcap);
        assert_int_equal(cx_zmq_brep_get(head, (size_t)n, rep), CX_OK);
        int more = 1;
        size_t sz = sizeof more;
        for (int parts = 0; parts < 2000; parts++) {
            zmq_getsockopt(raw, ZMQ_RCVMORE, &more, &sz);
            if (!more) break;
            int m = zmq_recv(raw, (uint8_t *)data + *dlen, cap - *dlen, 0);
            assert_true(m >= 0 && (size_t)m <= cap - *dlen);
            *dlen += (size_t)m;
        }
        return 0;
    }
    return 1;
}

static size_t bframe(uint8_t *f, uint8_t kind, uint64_t sender, uint32_t n, const uint64_t *addr, const uint64_t *len)
{
    static uint64_t id = 5000;
    cx_zmq_breq_put(f, &(cx_zmq_breq_t){ .kind = kind, .id = id++, .sender = sender, .n = n });
    for (uint32_t i = 0; i < n; i++) cx_zmq_bent_put(f, i, addr[i], len[i]);
    return CX_ZMQ_BREQ_HDR + (size_t)n * CX_ZMQ_BENT;
}

/* Raw batch frames against a target: a bad entry in the middle fails alone; frames that do not
 * add up (truncated, data short or long, no entries, too many) are refused whole with CX_EINVAL
 * and write nothing; an unknown sender gets CX_EPEER; a head too short to parse is dropped and
 * counted. */
static void test_raw_batch_frames(void **state)
{
    (void)state;
    cb.peer_inc = RAW_INC;
    cb.reg_lo = (uint64_t)(uintptr_t)bbuf;
    cb.reg_hi = cb.reg_lo + REG;
    static uint8_t f[CX_ZMQ_BREQ_HDR + 8 * CX_ZMQ_BENT + 4096], head[256], got[4096];
    cx_zmq_brep_t rep;
    size_t dlen;
    uint64_t b0 = (uint64_t)(uintptr_t)bbuf;
    uint64_t addr[4] = { b0 + 100, b0 + 200, cb.reg_hi - 5, b0 + 300 }, len[4] = { 50, 60, 10, 70 };
    /* a write: entry 2 runs past the region's end */
    size_t fsz = bframe(f, CX_XFER_WRITE, RAW_INC, 4, addr, len);
    for (int i = 0; i < 4; i++) {
        memset(f + fsz, 0x10 + i, len[i]);
        fsz += len[i];
    }
    assert_int_equal(raw_batch(f, fsz, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_OK);
    assert_int_equal(rep.n, 4);
    int want[4] = { CX_OK, CX_OK, CX_EINVAL, CX_OK };
    for (uint32_t i = 0; i < 4; i++) assert_int_equal(cx_zmq_brep_st(&rep, i), want[i]);
    assert_int_equal(dlen, 0);
    assert_int_equal(bbuf[100], 0x10);
    assert_int_equal(bbuf[259], 0x11);
    assert_int_equal(bbuf[REG - 5], 0);
    assert_int_equal(bbuf[369], 0x13);
    assert_int_equal(bbuf[370], 0);
    /* the same entries read: the good ones' bytes back to back, the bad one's missing */
    fsz = bframe(f, CX_XFER_READ, RAW_INC, 4, addr, len);
    assert_int_equal(raw_batch(f, fsz, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    for (uint32_t i = 0; i < 4; i++) assert_int_equal(cx_zmq_brep_st(&rep, i), want[i]);
    assert_int_equal(dlen, 50 + 60 + 70);
    assert_int_equal(got[0], 0x10);
    assert_int_equal(got[50], 0x11);
    assert_int_equal(got[110], 0x13);
    assert_int_equal(got[179], 0x13);
    /* a zero-length entry fails alone, as a zero-length single request does */
    len[1] = 0;
    fsz = bframe(f, CX_XFER_READ, RAW_INC, 4, addr, len);
    assert_int_equal(raw_batch(f, fsz, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(cx_zmq_brep_st(&rep, 1), CX_EINVAL);
    assert_int_equal(cx_zmq_brep_st(&rep, 0), CX_OK);
    len[1] = 60;
    addr[2] = b0 + 400;
    int bad0 = cb.served_bad;
    memset(bbuf, 0, REG);
    /* truncated: four entries announced, three there */
    fsz = bframe(f, CX_XFER_READ, RAW_INC, 4, addr, len);
    assert_int_equal(raw_batch(f, fsz - 1, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_EINVAL);
    assert_int_equal(rep.n, 0);
    /* a write one byte short of its data, and one byte over */
    fsz = bframe(f, CX_XFER_WRITE, RAW_INC, 4, addr, len);
    memset(f + fsz, 0x77, 200);
    assert_int_equal(raw_batch(f, fsz + 189, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_EINVAL);
    assert_int_equal(raw_batch(f, fsz + 191, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_EINVAL);
    /* a read of more than CX_ZMQ_FRAME_BYTES in all; a write whose lengths add up past 2^64 */
    uint64_t over[2] = { CX_ZMQ_FRAME_BYTES, 1 };
    fsz = bframe(f, CX_XFER_READ, RAW_INC, 2, addr, over);
    assert_int_equal(raw_batch(f, fsz, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_EINVAL);
    uint64_t huge[2] = { UINT64_MAX, 2 };
    fsz = bframe(f, CX_XFER_WRITE, RAW_INC, 2, addr, huge);
    assert_int_equal(raw_batch(f, fsz + 1, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_EINVAL);
    /* no entries; more than a frame may hold; a kind that is neither read nor write */
    fsz = bframe(f, CX_XFER_READ, RAW_INC, 0, addr, len);
    assert_int_equal(raw_batch(f, fsz, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_EINVAL);
    cx_zmq_breq_put(f, &(cx_zmq_breq_t){ .kind = CX_XFER_READ, .id = 1, .sender = RAW_INC, .n = 1025 });
    assert_int_equal(raw_batch(f, CX_ZMQ_BREQ_HDR, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_EINVAL);
    fsz = bframe(f, CX_XFER_PUT_SIGNAL, RAW_INC, 1, addr, len);
    assert_int_equal(raw_batch(f, fsz + 50, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_EINVAL);
    /* an unknown sender */
    fsz = bframe(f, CX_XFER_READ, 0x9999, 4, addr, len);
    assert_int_equal(raw_batch(f, fsz, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_EPEER);
    assert_int_equal(dlen, 0);
    for (size_t i = 0; i < REG; i++) assert_int_equal(bbuf[i], 0);
    assert_true(cb.served_bad - bad0 >= 7);
    /* a head cut short: not even an id to answer to, dropped and counted */
    int before = cb.served_bad;
    assert_int_equal(raw_batch(f, CX_ZMQ_BREQ_HDR - 1, &rep, head, sizeof head, got, sizeof got, &dlen), 1);
    assert_int_equal(cb.served_bad, before + 1);
    /* and the target still serves */
    fsz = bframe(f, CX_XFER_READ, RAW_INC, 4, addr, len);
    assert_int_equal(raw_batch(f, fsz, &rep, head, sizeof head, got, sizeof got, &dlen), 0);
    assert_int_equal(rep.status, CX_OK);
    assert_int_equal(dlen, 50 + 60 + 10 + 70);
}

/* A peer of version 1 (its blob has no source part): a batch reaches it as single requests, each
 * the 40-byte head and its data, answered the way such a peer answers. Played by a ROUTER of the
 * test's own. */
static void test_old_peer_gets_single_frames(void **state)
{
    (void)state;
    void *old = zmq_socket(rctx, ZMQ_ROUTER);
    assert_non_null(old);
    int zero = 0;
    assert_int_equal(zmq_setsockopt(old, ZMQ_LINGER, &zero, sizeof zero), 0);
    assert_int_equal(zmq_bind(old, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t epl = sizeof ep;
    assert_int_equal(zmq_getsockopt(old, ZMQ_LAST_ENDPOINT, ep, &epl), 0);
    int cookie_old;
    cx_bep_t *oe;
    assert_int_equal(ops->connect(ba, &cookie_old, ep, strlen(ep), &oe), CX_OK);
    enum { N = 3 };
    fc_xfer_t f[N];
    cx_xfer_t *xs[N];
    int rcs[N];
    for (int i = 0; i < N; i++) {
        xfer_init(&f[i], i == 1 ? CX_XFER_WRITE : CX_XFER_READ, abuf + 100 * i, 10 + i, 0x1000 + 100 * i, NULL, 0);
        xs[i] = &f[i].x;
    }
    memset(abuf, 0x21, 300);
    ops->submit_batch(ba, oe, xs, N, rcs);
    int seen = 0;
    uint64_t end = fc_now_ms() + 5000;
    while (fc_now_ms() < end && (f[0].done + f[1].done + f[2].done) < N) {
        ops->progress(ba);
        uint8_t id[64], req[CX_ZMQ_REQ_HDR + 64];
        int il = zmq_recv(old, id, sizeof id, ZMQ_DONTWAIT);
        if (il < 0) {
            struct pollfd p = { ops->wait_fd(ba), POLLIN, 0 };
            poll(&p, 1, 2);
            continue;
        }
        int rl = zmq_recv(old, req, sizeof req, 0);
        int more = 0;
        size_t sz = sizeof more;
        zmq_getsockopt(old, ZMQ_RCVMORE, &more, &sz);
        assert_int_equal(more, 0);
        cx_zmq_req_t q;
        assert_true(rl >= CX_ZMQ_REQ_HDR);
        assert_int_equal(cx_zmq_req_get(req, CX_ZMQ_REQ_HDR, &q), CX_OK);
        assert_int_equal(q.kind, seen == 1 ? CX_XFER_WRITE : CX_XFER_READ);
        assert_int_equal(q.addr, 0x1000 + 100 * (uint64_t)seen);
        assert_int_equal(q.len, 10 + (uint64_t)seen);
        assert_int_equal(rl, CX_ZMQ_REQ_HDR + (q.kind == CX_XFER_WRITE ? (int)q.len : 0));
        uint8_t rh[CX_ZMQ_REP_HDR], data[16];
        cx_zmq_rep_put(rh, &(cx_zmq_rep_t){ .id = q.id, .status = CX_OK });
        memset(data, 0x30 + seen, sizeof data);
        assert_true(zmq_send(old, id, (size_t)il, ZMQ_SNDMORE) >= 0);
        assert_true(zmq_send(old, rh, sizeof rh, q.kind == CX_XFER_READ ? ZMQ_SNDMORE : 0) >= 0);
        if (q.kind == CX_XFER_READ) assert_true(zmq_send(old, data, q.len, 0) >= 0);
        seen++;
    }
    assert_int_equal(seen, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(rcs[i], CX_OK);
        assert_int_equal(f[i].done, 1);
        assert_int_equal(f[i].status, CX_OK);
        assert_null(f[i].x.bp[3]);
    }
    assert_int_equal(abuf[0], 0x30);
    assert_int_equal(abuf[211], 0x32);
    assert_int_equal(abuf[212], 0x21);
    ops->disconnect(ba, oe, CX_EPEER);
    zmq_close(old);
}

/* The address blob: version 2's source part, and version 1's bare endpoint. */
static void test_address_blob(void **state)
{
    (void)state;
    char blob[128], ep[160];
    int v = 0;
    assert_int_equal(cx_zmq_addr_put(blob, sizeof blob, "tcp://10.0.0.1:5555", 0), CX_OK);
    assert_string_equal(blob, "tcp://0.0.0.0:0;10.0.0.1:5555");
    assert_int_equal(cx_zmq_addr_get(blob, strlen(blob), ep, sizeof ep, &v), CX_OK);
    assert_string_equal(ep, "tcp://10.0.0.1:5555");
    assert_int_equal(v, 2);
    assert_int_equal(cx_zmq_addr_put(blob, sizeof blob, "tcp://[fd00::1]:5555", 1), CX_OK);
    assert_string_equal(blob, "tcp://[::]:0;[fd00::1]:5555");
    assert_int_equal(cx_zmq_addr_get(blob, strlen(blob), ep, sizeof ep, &v), CX_OK);
    assert_string_equal(ep, "tcp://[fd00::1]:5555");
    assert_int_equal(v, 2);
    assert_int_equal(cx_zmq_addr_get("tcp://10.0.0.1:5555", 19, ep, sizeof ep, &v), CX_OK);
    assert_string_equal(ep, "tcp://10.0.0.1:5555");
    assert_int_equal(v, 1);
    assert_int_equal(cx_zmq_addr_get("tcp://0.0.0.0:0;a;b:1", 21, ep, sizeof ep, &v), CX_EINVAL);
    assert_int_equal(cx_zmq_addr_get("tcp:/", 5, ep, sizeof ep, &v), CX_EINVAL);
    assert_int_equal(cx_zmq_addr_get("tcp://a\0b:1", 11, ep, sizeof ep, &v), CX_EINVAL);
    assert_int_equal(cx_zmq_addr_get("tcp://10.0.0.1:5555", 19, ep, 19, &v), CX_EINVAL);
    assert_int_equal(cx_zmq_addr_put(blob, 20, "tcp://10.0.0.1:5555", 0), CX_EINVAL);
}

/* A transfer larger than CX_ZMQ_PIECE goes as pieces (zmq_flow.c): each a request the target
 * serves (one region check each), the transfer completed once, with every byte in place; a
 * put_signal's message only after all of them; a piece the target refuses fails the transfer
 * (and a put_signal's message is never delivered); a disconnect with pieces in flight completes
 * it once with CX_EPEER. */
static void test_large_transfers_go_in_pieces(void **state)
{
    (void)state;
    const size_t len = 2 * CX_ZMQ_PIECE + 4099; /* three pieces, the last a short one */
    const size_t npieces = 3;
    unsigned char *a = malloc(len), *bm = malloc(len + 64);
    assert_non_null(a);
    assert_non_null(bm);
    unsigned char key[64];
    size_t kl = sizeof key;
    void *amh2, *bmh2;
    assert_int_equal(ops->mem_reg(ba, a, len, CX_MEM_HOST, &amh2, key, &kl), CX_OK);
    kl = sizeof key;
    assert_int_equal(ops->mem_reg(bb, bm, len + 64, CX_MEM_HOST, &bmh2, key, &kl), CX_OK);
    for (size_t i = 0; i < len; i++) a[i] = (unsigned char)(i * 7 + (i >> 13));
    memset(bm, 0, len + 64);
    uint64_t rb = (uint64_t)(uintptr_t)bm;
    fc_xfer_t f;

    int checks = cb.region_checks;
    fc_xfer_init(&f, CX_XFER_WRITE, a, len, rb + 32, NULL, 0);
    f.x.local_mh = amh2;
    f.x.remote_base = rb;
    assert_int_equal(run1(&f), CX_OK);
    assert_int_equal(f.done, 1);
    assert_int_equal(cb.region_checks - checks, (int)npieces);
    assert_memory_equal(bm + 32, a, len);
    assert_int_equal(bm[31], 0);
    assert_int_equal(bm[32 + len], 0);

    unsigned char *back = calloc(1, len);
    assert_non_null(back);
    void *backmh;
    kl = sizeof key;
    assert_int_equal(ops->mem_reg(ba, back, len, CX_MEM_HOST, &backmh, key, &kl), CX_OK);
    fc_xfer_init(&f, CX_XFER_READ, back, len, rb + 32, NULL, 0);
    f.x.local_mh = backmh;
    f.x.remote_base = rb;
    assert_int_equal(run1(&f), CX_OK);
    assert_int_equal(f.done, 1);
    assert_memory_equal(back, a, len);

    /* put_signal: at delivery every byte of every piece is in place */
    memset(a, 0x6b, len);
    int nmsg = cb.nmsg;
    cb.check_at = bm;
    cb.check_len = len;
    cb.check_val = 0x6b;
    fc_xfer_init(&f, CX_XFER_PUT_SIGNAL, a, len, rb, "all in", 6);
    f.x.local_mh = amh2;
    f.x.remote_base = rb;
    assert_int_equal(run1(&f), CX_OK);
    assert_int_equal(f.done, 1);
    assert_int_equal(cb.check_failed, 0);
    assert_int_equal(cb.nmsg, nmsg + 1);
    assert_memory_equal(cb.msg[nmsg], "all in", 6);
    cb.check_at = NULL;

    /* the target refuses the first piece, then the last: the transfer fails, no message */
    for (int which = 0; which < 2; which++) {
        cb.reg_lo = which ? rb : rb + CX_ZMQ_PIECE;
        cb.reg_hi = which ? rb + len - 1 : rb + len + 64;
        fc_xfer_init(&f, CX_XFER_PUT_SIGNAL, a, len, rb, "never", 5);
        f.x.local_mh = amh2;
        f.x.remote_base = rb;
        assert_int_equal(run1(&f), CX_EINVAL);
        assert_int_equal(f.done, 1);
        assert_int_equal(cb.nmsg, nmsg + 1);
        fc_xfer_init(&f, CX_XFER_WRITE, a, len, rb, NULL, 0);
        f.x.local_mh = amh2;
        f.x.remote_base = rb;
        assert_int_equal(run1(&f), CX_EINVAL);
        assert_int_equal(f.done, 1);
    }
    cb.reg_lo = cb.reg_hi = 0;

    /* pieces in flight as the endpoint closes: completed once, CX_EPEER */
    cx_bep_t *ep2;
    assert_int_equal(ops->connect(ba, &cookie_b, baddr, baddr_len, &ep2), CX_OK);
    fc_xfer_init(&f, CX_XFER_READ, back, len, rb, NULL, 0);
    f.x.local_mh = backmh;
    f.x.remote_base = rb;
    assert_int_equal(ops->submit(ba, ep2, &f.x), CX_OK);
    assert_int_equal(f.done, 0);
    ops->disconnect(ba, ep2, CX_ETIMEDOUT);
    assert_int_equal(f.done, 1);
    assert_int_equal(f.status, CX_EPEER);
    /* B serves what reached it; its replies go nowhere */
    uint64_t end = fc_now_ms() + 200;
    while (fc_now_ms() < end) {
        ops->progress(bb);
        ops->progress(ba);
    }
    assert_int_equal(f.done, 1);

    ops->mem_dereg(ba, backmh);
    ops->mem_dereg(ba, amh2);
    ops->mem_dereg(bb, bmh2);
    free(back);
    free(a);
    free(bm);
}

/* The send window (zmq_flow.c): two large requests in flight, the third waits, a message waits
 * behind it (and is delivered after its bytes are in place), a small write passes; all complete
 * once, verified. A disconnect completes what is in flight and what waits with CX_EPEER. */
static void test_send_window(void **state)
{
    (void)state;
    const size_t big = CX_ZMQ_ZEROCOPY_MIN;
    uint64_t rb = (uint64_t)(uintptr_t)bbuf;
    for (size_t i = 0; i < 3 * big + 4096; i++) abuf[i] = (unsigned char)(i / big + 1);
    fc_xfer_t f[5], *fp[5];
    for (int i = 0; i < 3; i++) xfer_init(&f[i], CX_XFER_WRITE, abuf + i * big, big, rb + i * big, NULL, 0);
    xfer_init(&f[3], CX_XFER_MSG, NULL, 0, 0, "after", 5);
    xfer_init(&f[4], CX_XFER_WRITE, abuf + 3 * big, 4096, rb + 3 * big, NULL, 0);
    for (int i = 0; i < 5; i++) {
        fp[i] = &f[i];
        assert_int_equal(ops->submit(ba, ab, &f[i].x), CX_OK);
    }
    assert_int_equal(ab->large_out, CX_ZMQ_WINDOW);
    int waiting = 0;
    for (cx_xfer_t *x = ab->wq_head; x; x = x->bp[0]) waiting++;
    assert_int_equal(waiting, 2); /* the third large write, and the message behind it */
    assert_ptr_equal(ab->wq_head, &f[2].x);
    int nmsg = cb.nmsg;
    cb.check_at = bbuf + 2 * big; /* the waiting write is in place when the message arrives */
    cb.check_len = big;
    cb.check_val = 3;
    assert_int_equal(fc_drive(ops, ba, bb, fp, 5, 5000), 0);
    cb.check_at = NULL;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(f[i].done, 1);
        assert_int_equal(f[i].status, CX_OK);
    }
    assert_int_equal(cb.check_failed, 0);
    assert_int_equal(cb.nmsg, nmsg + 1);
    assert_memory_equal(bbuf, abuf, 3 * big + 4096);
    assert_int_equal(ab->large_out, 0);
    assert_null(ab->wq_head);

    /* B never serves these: A's endpoint closes with two in flight and three waiting */
    cx_bep_t *ep2;
    assert_int_equal(ops->connect(ba, &cookie_b, baddr, baddr_len, &ep2), CX_OK);
    for (int i = 0; i < 4; i++) xfer_init(&f[i], CX_XFER_READ, abuf + i * big / 2, big / 2, rb, NULL, 0);
    xfer_init(&f[4], CX_XFER_MSG, NULL, 0, 0, "gone", 4);
    for (int i = 0; i < 5; i++) assert_int_equal(ops->submit(ba, ep2, &f[i].x), CX_OK);
    ops->disconnect(ba, ep2, CX_ETIMEDOUT);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(f[i].done, 1);
        assert_int_equal(f[i].status, CX_EPEER);
    }
    uint64_t end = fc_now_ms() + 200; /* B serves what reached it; the replies go nowhere */
    while (fc_now_ms() < end) {
        ops->progress(bb);
        ops->progress(ba);
    }
    for (int i = 0; i < 5; i++) assert_int_equal(f[i].done, 1);
}

static int group_setup(void **state)
{
    (void)state;
    if (fc_open_pair(ops, &ca, &cb, &cookie_a, &cookie_b, &ba, &bb)) return -1;
    char addr[256];
    size_t len = sizeof addr - 1;
    if (ops->address(bb, addr, &len) || ops->connect(ba, &cookie_b, addr, len, &ab)) return -1;
    unsigned char key[64];
    size_t kl = sizeof key;
    if (ops->mem_reg(ba, abuf, REG, CX_MEM_HOST, &amh, key, &kl)) return -1;
    kl = sizeof key;
    if (ops->mem_reg(bb, bbuf, REG, CX_MEM_HOST, &bmh, key, &kl)) return -1;
    memcpy(baddr, addr, len);
    baddr_len = len;
    addr[len] = 0;
    rctx = zmq_ctx_new();
    raw = rctx ? zmq_socket(rctx, ZMQ_DEALER) : NULL;
    int zero = 0;
    if (!raw || zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof zero) || zmq_connect(raw, addr)) return -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    zmq_close(raw);
    zmq_ctx_term(rctx);
    ops->mem_dereg(ba, amh);
    ops->mem_dereg(bb, bmh);
    ops->disconnect(ba, ab, CX_EPEER);
    ops->close(ba);
    ops->close(bb);
    fc_reset(&ca);
    fc_reset(&cb);
    return 0;
}

int main(void)
{
    cx_log_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_ops_through_the_backend, setup),
        cmocka_unit_test_setup(test_raw_good_frames, setup),
        cmocka_unit_test_setup(test_raw_garbage, setup),
        cmocka_unit_test_setup(test_batch_through_the_backend, setup),
        cmocka_unit_test_setup(test_raw_batch_frames, setup),
        cmocka_unit_test_setup(test_old_peer_gets_single_frames, setup),
        cmocka_unit_test_setup(test_address_blob, setup),
        cmocka_unit_test_setup(test_large_transfers_go_in_pieces, setup),
        cmocka_unit_test_setup(test_send_window, setup),
    };
    return cmocka_run_group_tests_name("zmq_backend", tests, group_setup, group_teardown);
}
