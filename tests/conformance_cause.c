/* Failure causes (docs/semantics.md, "Failure causes"): each cause a backend may report is
 * injected into a real engine, on its progress thread (cx_exec), against a live peer process,
 * and the core's verdict is checked: a local cause leaves the peer UP and the data path working,
 * a transport cause makes it SUSPECT and the probe over the control connection makes it UP again
 * (no FAILED; an op whose connection was closed under it ends CX_ERR, the next op reconnects the
 * data path), the peer gone fails it at once and its ops
 * return CX_EPEER; an op a backend ended with a local error waits briefly for a verdict: CX_ERR
 * with the peer alive, CX_EPEER when the peer fails within that time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxt.h"
#include "cxt_mem.h"
#include "engine.h"
#include "spin.h"

#define RS (1u << 20)
#define HB_MS 100
#define HB_TIMEOUT_MS 3000
#define OP_TIMEOUT_MS 5000

typedef struct inject {
    const char *lid;
    int cause;
    int found;
} inject_t;

/* On the progress thread: report `cause` for the peer as a backend would. */
static void do_inject(cx_engine_t *e, void *arg)
{
    inject_t *in = arg;
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        const char *h = strchr(p->url, '#');
        if (!h || strcmp(h + 1, in->lid)) continue;
        in->found = 1;
        cx_core_peer_error((cx_core_t *)(void *)e, p, (cx_cause_t)in->cause, "injected by the test");
        return;
    }
}

static void inject(cx_engine_t *e, const char *lid, int cause)
{
    inject_t in = { .lid = lid, .cause = cause };
    assert_int_equal(cx_exec(e, do_inject, &in), CX_OK);
    assert_true(in.found);
}

/* An op ended by a backend with a local error (CX_ERR): a record of the core's, made on the
 * progress thread as if a backend held it, and what its caller would have been told. */
typedef struct settle {
    const char *lid;
    int then_fail; /* the peer fails in the same turn, as when its control connection closes */
    cx_op_t op;
    int found, done_at_once, status;
    uint64_t done_ns;
} settle_t;

static void settle_done(cx_op_t *op, int status)
{
    settle_t *s = (settle_t *)((char *)op - offsetof(settle_t, op));
    s->status = status;
    s->done_ns = cxt_now_ns();
    cx_op_set_done(op);
}

static void do_settle(cx_engine_t *e, void *arg)
{
    settle_t *s = arg;
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        const char *h = strchr(p->url, '#');
        if (!h || strcmp(h + 1, s->lid)) continue;
        s->found = 1;
        cx_op_t *op = &s->op;
        op->e = e;
        op->kind = CX_OPK_READ;
        op->peer = p;
        op->on_done = settle_done;
        op->deadline_ns = cxt_now_ns() + (uint64_t)OP_TIMEOUT_MS * 1000000ull;
        cx_op_link(e, p, op);
        op->stage = OPS_IN_BACKEND;
        cx_op_backend_status(e, op, CX_ERR);
        s->done_at_once = cx_op_is_done(op);
        if (s->then_fail) cx_peer_fail(e, p, "control connection closed (the test)");
        return;
    }
}

/* Runs one local error; returns the status its caller got. */
static int settle(cx_engine_t *e, const char *lid, int then_fail, double *ms)
{
    settle_t s = { .lid = lid, .then_fail = then_fail };
    uint64_t t0 = cxt_now_ns();
    assert_int_equal(cx_exec(e, do_settle, &s), CX_OK);
    assert_true(s.found);
    if (!then_fail) assert_false(s.done_at_once); /* held for the verdict */
    for (int i = 0; i < 2000 && !cx_op_is_done(&s.op); i++) usleep(1000);
    assert_true(cx_op_is_done(&s.op));
    *ms = (double)(s.done_ns - t0) / 1e6;
    return s.status;
}

static void read_ok(cx_engine_t *e, cxt_peer_t *p, uint8_t *r)
{
    memset(r, 0, 4096);
    assert_int_equal(cx_read(e, p->lid, r, p->base, 4096), CX_OK);
    assert_int_equal(cxt_check(r, 4096, p->seed, 0), -1);
}

static void test_causes(void **state)
{
    (void)state;
    cx_engine_t *e = NULL;
    assert_int_equal(cxt_engine(&e, "causesrc", 0, HB_MS, HB_TIMEOUT_MS, OP_TIMEOUT_MS), 0);
    uint8_t *r = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(r != MAP_FAILED);
    assert_int_equal(cx_register_memory(e, r, RS), CX_OK);
    cxt_peer_t p;
    cxt_peer_opts_t o = { .model = "cause",
                          .replica = 1,
                          .region = RS,
                          .seed = 23,
                          .hb_ms = HB_MS,
                          .hb_timeout_ms = HB_TIMEOUT_MS,
                          .op_timeout_ms = OP_TIMEOUT_MS };
    assert_int_equal(cxt_peer_start(&p, &o, 10000), 0);
    assert_int_equal(cx_connect(e, p.url, 5000), CX_OK);
    read_ok(e, &p, r);
    cxt_drain_events(e);
    cx_event_t ev;
    unsigned seen = 0;

    /* Local: nothing happens to the peer. */
    inject(e, p.lid, CX_CAUSE_LOCAL);
    if (cxt_wait_event(e, p.lid, CX_EVENT_SUSPECT, 300, &ev, &seen) == 0)
        fail_msg("a local cause made the peer SUSPECT ('%s')", ev.reason);
    if (seen & (1u << CX_EVENT_FAILED)) fail_msg("a local cause failed the peer");
    assert_int_equal(cx_peer_state(e, p.lid), CX_PEER_UP);
    read_ok(e, &p, r);
    printf("cause: local: the peer stays UP, a read works\n");

    /* Transport: SUSPECT, then UP when the probe is answered, well before the heartbeat
     * timeout; never FAILED. The data endpoint was closed: the next op opens a new one. */
    /* A read of the whole region in flight: when the report comes first, its connection is
     * closed under it and it waits for the verdict (CX_ERR, the probe being answered); it may
     * also have completed before. Never CX_EPEER: the peer is not failed. */
    cx_op_t *op = NULL;
    assert_int_equal(cx_read_async(e, p.lid, r, p.base, RS, CX_CLASS_CRITICAL, &op), CX_OK);
    uint64_t t0 = cxt_now_ns();
    inject(e, p.lid, CX_CAUSE_TRANSPORT);
    int rc = cx_op_wait(op, OP_TIMEOUT_MS + 2000);
    printf("cause: transport: a 1 MiB read in flight at the report: %s\n", cx_strerror(rc));
    if (rc != CX_OK && rc != CX_ERR)
        fail_msg("a read in flight at a transport cause: %s, expected CX_OK or CX_ERR", cx_strerror(rc));
    seen = 0;
    assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_SUSPECT, 1000, &ev, &seen), 0);
    printf("cause: transport: SUSPECT '%s'\n", ev.reason);
    assert_non_null(strstr(ev.reason, "injected by the test"));
    assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_UP, HB_TIMEOUT_MS / 2, &ev, &seen), 0);
    double up_ms = cxt_ms_since(t0);
    printf("cause: transport: UP '%s' %.1f ms after the report\n", ev.reason, up_ms);
    if (seen & (1u << CX_EVENT_FAILED)) fail_msg("a transport cause with the peer alive failed it");
    assert_int_equal(cx_peer_state(e, p.lid), CX_PEER_UP);
    read_ok(e, &p, r);

    /* Transport, at the target of the peer's reads: our data endpoint is dropped and the peer
     * sends its next read at once. The request is served, not dropped for want of an endpoint
     * (the backend holds it while the core makes one again: cx_core_peer_want_ep); a read whose
     * connection was closed under it may end CX_ERR, and the next one works. */
    char lid[CX_URL_MAX];
    cx_url_t u;
    assert_int_equal(cx_url_parse(cx_engine_local_url(e), &u, NULL, 0), CX_OK);
    cx_lid_format(&u.lid, lid, sizeof lid);
    cxt_fill(r, 4096, 29, 0);
    char want[32], rep[256];
    snprintf(want, sizeof want, "OK %" PRIx64, cxt_mem_hash(r, 4096));
    assert_int_equal(cxt_peer_cmd(&p, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 4096 65536", lid, (uintptr_t)r),
                     0);
    assert_string_equal(rep, want);
    for (int round = 0; round < 4; round++) {
        cxt_drain_events(e);
        inject(e, p.lid, CX_CAUSE_TRANSPORT);
        int ok = 0;
        for (int k = 0; k < 3 && !ok; k++) {
            uint64_t t1 = cxt_now_ns();
            rc = cxt_peer_cmd(&p, OP_TIMEOUT_MS + 5000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 4096 65536", lid,
                              (uintptr_t)r);
            double rms = cxt_ms_since(t1);
            printf("cause: transport at the target, round %d: the peer's read %d: %s in %.1f ms\n", round, k,
                   cx_strerror(rc), rms);
            if (rc != CX_OK && rc != CX_ERR) fail_msg("the peer's read of ours: %s", cx_strerror(rc));
            ok = rc == CX_OK;
            if (ok) assert_string_equal(rep, want);
        }
        assert_true(ok);
        seen = 0;
        assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_UP, HB_TIMEOUT_MS / 2, &ev, &seen), 0);
        if (seen & (1u << CX_EVENT_FAILED)) fail_msg("a transport cause with the peer alive failed it");
    }
    read_ok(e, &p, r);

    /* A local error on an op, the peer alive: the op waits briefly for a verdict that does not
     * come, then ends CX_ERR; the peer stays UP. */
    double ms = 0;
    assert_int_equal(settle(e, p.lid, 0, &ms), CX_ERR);
    printf("cause: an op's local error, the peer alive: CX_ERR after %.1f ms\n", ms);
    assert_int_equal(cx_peer_state(e, p.lid), CX_PEER_UP);
    read_ok(e, &p, r);

    /* Peer gone: FAILED at once, ops CX_EPEER. */
    t0 = cxt_now_ns();
    inject(e, p.lid, CX_CAUSE_PEER_GONE);
    seen = 0;
    assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_FAILED, 1000, &ev, &seen), 0);
    printf("cause: peer gone: FAILED '%s' %.1f ms after the report\n", ev.reason, cxt_ms_since(t0));
    assert_non_null(strstr(ev.reason, "injected by the test"));
    assert_int_equal(cx_read(e, p.lid, r, p.base, 4096), CX_EPEER);

    cxt_peer_crash(&p);

    /* A local error on an op, and in the same turn the peer's control connection closes (a
     * killed process, whose connections the backend and the core read in either order): the
     * caller is told CX_EPEER, so it hands the work elsewhere. */
    cxt_peer_t q;
    o.replica = 2;
    assert_int_equal(cxt_peer_start(&q, &o, 10000), 0);
    assert_int_equal(cx_connect(e, q.url, 5000), CX_OK);
    read_ok(e, &q, r);
    assert_int_equal(settle(e, q.lid, 1, &ms), CX_EPEER);
    printf("cause: an op's local error, then the peer failed: CX_EPEER after %.1f ms\n", ms);
    cxt_peer_crash(&q);

    cx_unregister_memory(e, r);
    cx_engine_destroy(e);
    munmap(r, RS);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_causes, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    return cxt_run_tests(tests, NULL, NULL);
}
