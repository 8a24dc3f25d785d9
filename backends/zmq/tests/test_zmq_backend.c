/* The ZeroMQ backend alone, behind the fake core (tests/fake_core): two instances against each
 * other through the vtable, and raw frames from a DEALER of the test's own against a target's
 * ROUTER. Requests are single frames (zmq_be_submit); a target must refuse every frame that does
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

#define REG 65536
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
    };
    return cmocka_run_group_tests_name("zmq_backend", tests, group_setup, group_teardown);
}
