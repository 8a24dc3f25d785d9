/* Conformance, failures: kill -9 of a peer in the middle of transfers, a hung peer (SIGSTOP),
 * and a peer restarted under the same LID and port. Each case builds its own engine because each
 * needs its own heartbeat and op timeout. Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cxt.h"

#define RS ((size_t)8 << 20)
#define CHUNK ((size_t)1 << 20)

typedef struct fixture {
    cx_engine_t *e;
    uint8_t *r;
    cxt_peer_t p;
} fixture_t;

static int make(fixture_t *f, uint32_t hb, uint32_t hbt, uint32_t opt)
{
    memset(f, 0, sizeof *f);
    f->p.pid = -1;
    f->p.in_fd = f->p.out_fd = -1;
    if (cxt_engine(&f->e, "survivor", 0, hb, hbt, opt)) return -1;
    f->r = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (f->r == MAP_FAILED) return -1;
    cxt_fill(f->r, RS, 9, 0);
    return cx_register_memory(f->e, f->r, RS) ? -1 : 0;
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

static int start_peer(fixture_t *f, uint16_t port, uint32_t seed, uint32_t hb, uint32_t hbt, const char *connect)
{
    cxt_peer_opts_t o = {
        .replica = 1, .port = port, .region = RS, .seed = seed, .hb_ms = hb, .hb_timeout_ms = hbt, .connect = connect
    };
    return cxt_peer_start(&f->p, &o, 10000);
}

static void connect_up(fixture_t *f, cx_event_t *ev)
{
    int rc = cx_connect(f->e, f->p.url, 5000);
    if (rc) fail_msg("connect %s: %s", f->p.url, cx_strerror(rc));
    if (cxt_wait_event(f->e, f->p.lid, CX_EVENT_UP, 5000, ev, NULL)) fail_msg("no UP for %s", f->p.lid);
}

/* The engine and a peer (pattern seed 4) with these heartbeat and op timeouts, connected. */
static void make_up(fixture_t *f, uint32_t hb, uint32_t hbt, uint32_t opt, cx_event_t *ev)
{
    assert_int_equal(make(f, hb, hbt, opt), 0);
    assert_int_equal(start_peer(f, 0, 4, hb, hbt, NULL), 0);
    connect_up(f, ev);
}

/* ---- kill -9 during transfers ---- */

typedef struct worker {
    fixture_t *f;
    int kind; /* CX_OPK_READ / WRITE / PUT_SIGNAL / MSG */
    int idx;
    atomic_int ok;
    atomic_int done;
    int last_rc;
    double last_ms; /* how long the failing op took */
} worker_t;

static atomic_int g_abort;

static void *work(void *arg)
{
    worker_t *w = arg;
    fixture_t *f = w->f;
    uint8_t *loc = w->f->r + (size_t)w->idx * CHUNK;
    uint64_t rem = f->p.base + (size_t)w->idx * CHUNK;
    char msg[64];
    /* At most 100000 ops or until g_abort: a broken engine ends the loop, it cannot hang it. */
    for (int i = 0; i < 100000 && !atomic_load(&g_abort); i++) {
        uint64_t t0 = cxt_now_ns();
        int rc;
        if (w->kind == CX_OPK_READ) {
            rc = cx_read(f->e, f->p.lid, loc, rem, CHUNK);
        } else if (w->kind == CX_OPK_WRITE) {
            rc = cx_write(f->e, f->p.lid, loc, rem, CHUNK);
        } else if (w->kind == CX_OPK_PUT_SIGNAL) {
            cx_op_t *op = NULL;
            snprintf(msg, sizeof msg, "sig %d", i);
            rc = cx_put_signal(f->e, f->p.lid, loc, rem, CHUNK, msg, strlen(msg), &op);
            if (rc == CX_OK) rc = cx_op_wait(op, -1);
        } else {
            rc = cx_send_msg(f->e, f->p.lid, loc, 64 << 10);
            if (rc == CX_EAGAIN) {
                usleep(1000);
                continue;
            } /* receiver queue full: allowed */
        }
        if (rc != CX_OK) {
            w->last_rc = rc;
            w->last_ms = cxt_ms_since(t0);
            break;
        }
        atomic_fetch_add(&w->ok, 1);
    }
    atomic_store(&w->done, 1);
    return NULL;
}

/* Starts n workers (kinds[i], chunk idx0 + i) and waits, at most 10 s, until each has done
 * min_ok ops or ended. */
static void workers_start(fixture_t *f, worker_t *w, pthread_t *th, const int *kinds, int n, int idx0, int min_ok)
{
    atomic_store(&g_abort, 0);
    for (int i = 0; i < n; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].f = f;
        w[i].kind = kinds[i];
        w[i].idx = idx0 + i;
        assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    uint64_t t0 = cxt_now_ns();
    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++) all &= atomic_load(&w[i].ok) >= min_ok || atomic_load(&w[i].done);
        if (all || cxt_ms_since(t0) > 10000) break;
        cxt_peer_drain(&f->p, 2);
    }
}

/* Waits up to 10 s for every worker to end on its own (returns 1 if one did not), then sets
 * g_abort and joins them; a worker stuck in an op past the op timeout fails the test. */
static int workers_end(worker_t *w, pthread_t *th, int n)
{
    uint64_t tj = cxt_now_ns();
    int all = 0;
    while (!all && cxt_ms_since(tj) < 10000) {
        all = 1;
        for (int i = 0; i < n; i++) all &= atomic_load(&w[i].done);
        if (!all) usleep(2000);
    }
    atomic_store(&g_abort, 1);
    for (int i = 0; i < n; i++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 25;
        if (pthread_timedjoin_np(th[i], NULL, &ts)) fail_msg("worker %d hangs in an op", i);
    }
    return !all;
}

static void test_kill9_during_transfers(void **state)
{
    (void)state;
    fixture_t f;
    /* Default heartbeat (1 s / 3 s): detection within 1 s must come from the dead connection. */
    assert_int_equal(make(&f, 0, 0, 20000), 0);
    assert_int_equal(start_peer(&f, 0, 4, 0, 0, NULL), 0);
    cx_event_t ev;
    connect_up(&f, &ev);
    enum { NW = 4 };
    static const int kinds[NW] = { CX_OPK_READ, CX_OPK_WRITE, CX_OPK_PUT_SIGNAL, CX_OPK_MSG };
    worker_t w[NW];
    pthread_t th[NW];
    /* Let every kind of op get going. */
    workers_start(&f, w, th, kinds, NW, 0, 3);
    int early = 0;
    for (int i = 0; i < NW; i++) early |= atomic_load(&w[i].done);
    uint64_t tk = cxt_now_ns();
    cxt_peer_signal(&f.p, SIGKILL);
    unsigned seen = 0;
    int rc = cxt_wait_event(f.e, f.p.lid, CX_EVENT_FAILED, 5000, &ev, &seen);
    double fail_ms = cxt_ms_since(tk);
    /* Every worker must come back on its own; g_abort only rescues a broken engine. */
    int hung = workers_end(w, th, NW);
    cxt_peer_reap(&f.p, 5000);
    if (early) fail_msg("a worker failed before the kill");
    if (rc) fail_msg("no FAILED event within 5 s of kill -9 (seen 0x%x)", seen);
    fprintf(stderr, "FAILED %.2f ms after kill -9, reason '%s'\n", fail_ms, ev.reason);
    assert_true(ev.reason[0] != 0);
    if (fail_ms > 1000) fail_msg("FAILED took %.1f ms (> 1000 ms)", fail_ms);
    if (hung) fail_msg("an op was still running 10 s after the peer died");
    for (int i = 0; i < NW; i++) {
        fprintf(stderr, "worker %d: %d ok, then %s after %.2f ms\n", i, atomic_load(&w[i].ok),
                cx_strerror(w[i].last_rc), w[i].last_ms);
        assert_true(atomic_load(&w[i].ok) >= 3);
        if (w[i].last_rc != CX_EPEER)
            fail_msg("worker %d ended with %s, expected CX_EPEER", i, cx_strerror(w[i].last_rc));
    }
    /* A failed peer: ops fail at once. */
    uint64_t t1 = cxt_now_ns();
    assert_int_equal(cx_read(f.e, f.p.lid, f.r, f.p.base, 4096), CX_EPEER);
    assert_int_equal(cx_write(f.e, f.p.lid, f.r, f.p.base, 4096), CX_EPEER);
    assert_int_equal(cx_send_msg(f.e, f.p.lid, "x", 1), CX_EPEER);
    cx_op_t *op = NULL;
    rc = cx_put_signal(f.e, f.p.lid, f.r, f.p.base, 4096, "x", 1, &op);
    if (rc == CX_OK) rc = cx_op_wait(op, 5000);
    assert_int_equal(rc, CX_EPEER);
    double imm = cxt_ms_since(t1);
    if (imm > 500) fail_msg("ops to a failed peer took %.1f ms to fail", imm);
    assert_int_equal(cx_peer_state(f.e, f.p.lid), CX_PEER_FAILED);
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_int_equal(st.ops_in_flight, 0);
    assert_true(st.peer_failures >= 1);
    assert_true(st.peers_failed >= 1);
    assert_int_equal(st.peers_up, 0);
    unmake(&f);
}

/* ---- SIGSTOP: a hung peer ---- */

/* An op to a stopped peer that needs the peer's own answer ends with CX_ETIMEDOUT at the op
 * timeout (before the heartbeat declares the peer failed), not earlier, not much later. */
static void expect_timeout(int rc, double ms, uint32_t opt, const char *what, cxt_peer_t *p)
{
    fprintf(stderr, "%s to a stopped peer: %s after %.1f ms (op timeout %u ms)\n", what, cx_strerror(rc), ms, opt);
    const char *bad = NULL;
    char why[160];
    if (rc != CX_ETIMEDOUT) {
        snprintf(why, sizeof why, "%s to a stopped peer returned %s after %.1f ms, expected CX_ETIMEDOUT", what,
                 cx_strerror(rc), ms);
        bad = why;
    } else if (ms < opt * 0.8 || ms > opt + 1500.0) {
        snprintf(why, sizeof why, "%s to a stopped peer timed out after %.1f ms (op timeout %u ms)", what, ms, opt);
        bad = why;
    }
    if (bad) {
        cxt_peer_signal(p, SIGCONT);
        fail_msg("%s", bad);
    }
}

static void test_sigstop_suspect_failed_timeout(void **state)
{
    (void)state;
    fixture_t f;
    const uint32_t hb = 100, hbt = 2000, opt = 400;
    /* The op timeout is well below the heartbeat timeout: three ops one after the other (at
     * most 3 x 400 ms) all time out before the peer is even SUSPECT (1900 ms). */
    cx_event_t ev;
    make_up(&f, hb, hbt, opt, &ev);
    /* The peer answers before the stop. A loaded host (a sanitizer build beside other tests)
     * can take longer than the short op timeout for this first 1 MiB: a few tries. */
    int rc0 = CX_ETIMEDOUT;
    for (int i = 0; i < 5 && rc0 == CX_ETIMEDOUT; i++) rc0 = cx_read(f.e, f.p.lid, f.r, f.p.base, CHUNK);
    assert_int_equal(rc0, CX_OK);
    assert_int_equal(cxt_check(f.r, CHUNK, 4, 0), -1);
    memset(f.r, 0, CHUNK);
    cxt_drain_events(f.e);

    uint64_t ts = cxt_now_ns();
    cxt_peer_signal(&f.p, SIGSTOP);

    /* A read. Over shared memory the initiator copies the bytes itself (CMA) and the read
     * completes without the stopped target: then it must simply be right. Everywhere else it
     * needs the target and times out. */
    uint64_t t0 = cxt_now_ns();
    int rc = cx_read(f.e, f.p.lid, f.r, f.p.base, CHUNK);
    double op_ms = cxt_ms_since(t0);
    int one_sided = rc == CX_OK;
    if (one_sided) {
        fprintf(stderr, "read to a stopped peer: ok after %.1f ms (one-sided)\n", op_ms);
        if (!cxt_may_be_one_sided()) {
            cxt_peer_signal(&f.p, SIGCONT);
            fail_msg("a read completed without the stopped target on a variant that has no one-sided path "
                     "(CONNEX_BACKEND=%s)",
                     getenv("CONNEX_BACKEND") ? getenv("CONNEX_BACKEND") : "auto");
        }
        if (cxt_check(f.r, CHUNK, 4, 0) != -1) {
            cxt_peer_signal(&f.p, SIGCONT);
            fail_msg("a one-sided read of a stopped peer returned wrong bytes");
        }
        memset(f.r, 0, CHUNK);
    } else {
        expect_timeout(rc, op_ms, opt, "read", &f.p);
    }

    /* put_signal completes only once the target has queued the message: the stopped target
     * cannot, on every variant. The same for a message. */
    uint8_t *src = f.r + CHUNK;
    cx_op_t *op = NULL;
    t0 = cxt_now_ns();
    rc = cx_put_signal(f.e, f.p.lid, src, f.p.base + CHUNK, 64 << 10, "stopped", 7, &op);
    if (rc == CX_OK) rc = cx_op_wait(op, (int)opt + 5000);
    expect_timeout(rc, cxt_ms_since(t0), opt, "put_signal", &f.p);
    t0 = cxt_now_ns();
    rc = cx_send_msg(f.e, f.p.lid, src, 4096);
    expect_timeout(rc, cxt_ms_since(t0), opt, "message", &f.p);
    unsigned seen = 0;
    rc = cxt_wait_event(f.e, f.p.lid, CX_EVENT_FAILED, 6000, &ev, &seen);
    double fail_ms = cxt_ms_since(ts);
    if (rc) {
        cxt_peer_signal(&f.p, SIGCONT);
        fail_msg("no FAILED within 6 s of SIGSTOP (seen 0x%x)", seen);
    }
    fprintf(stderr, "FAILED %.1f ms after SIGSTOP (heartbeat %u/%u ms), reason '%s'\n", fail_ms, hb, hbt, ev.reason);
    if (!(seen & (1u << CX_EVENT_SUSPECT))) {
        cxt_peer_signal(&f.p, SIGCONT);
        fail_msg("no SUSPECT before FAILED (seen 0x%x)", seen);
    }
    if (fail_ms < hbt * 0.5 || fail_ms > hbt + 2000.0) {
        cxt_peer_signal(&f.p, SIGCONT);
        fail_msg("FAILED after %.1f ms with a %u ms heartbeat timeout", fail_ms, hbt);
    }
    /* The late reply of a timed-out read must not land in our buffer once the peer runs. */
    cxt_peer_signal(&f.p, SIGCONT);
    usleep(300 * 1000);
    for (size_t i = 0; i < CHUNK; i++)
        if (f.r[i] != 0) fail_msg("byte %zu of a timed-out read changed after the op returned", i);

    /* Resumed, the peer comes back (the survivor keeps reconnecting): JOINED, data flows. */
    rc = cxt_wait_event(f.e, f.p.lid, CX_EVENT_JOINED, 8000, &ev, NULL);
    if (rc) fail_msg("a resumed peer did not rejoin within 8 s");
    assert_int_equal(cx_read(f.e, f.p.lid, f.r, f.p.base, CHUNK), CX_OK);
    assert_int_equal(cxt_check(f.r, CHUNK, 4, 0), -1);
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_true(st.op_timeouts >= (one_sided ? 2u : 3u));
    assert_int_equal(st.ops_in_flight, 0);
    unmake(&f);
}

/* ---- restart under the same identity ---- */

static void restart_cycle(fixture_t *f, int peer_connects, int clean, uint32_t seed)
{
    cx_event_t ev;
    uint64_t inc_old = 0;
    const char *eurl = cx_engine_local_url(f->e);
    char url[CX_URL_MAX], lid[CX_URL_MAX];
    snprintf(url, sizeof url, "%s", f->p.url);
    snprintf(lid, sizeof lid, "%s", f->p.lid);
    uint16_t port = f->p.port;
    if (clean) {
        char rep[64];
        assert_int_equal(cxt_peer_cmd(&f->p, 5000, rep, sizeof rep, "QUIT"), 0);
        assert_int_equal(cxt_wait_event(f->e, lid, CX_EVENT_LEFT, 5000, &ev, NULL), CX_OK);
        cxt_peer_stop(&f->p);
    } else {
        cxt_peer_crash(&f->p);
        assert_int_equal(cxt_wait_event(f->e, lid, CX_EVENT_FAILED, 5000, &ev, NULL), CX_OK);
    }
    inc_old = ev.incarnation;
    uint64_t t0 = cxt_now_ns();
    if (start_peer(f, port, seed, 0, 0, peer_connects ? eurl : NULL))
        fail_msg("restart on port %u failed (is the port reusable at once?)", port);
    assert_string_equal(f->p.url, url);
    unsigned seen = 0;
    int rc = cxt_wait_event(f->e, lid, CX_EVENT_JOINED, 8000, &ev, &seen);
    double ms = cxt_ms_since(t0);
    if (rc)
        fail_msg("no JOINED within 8 s of the restart (%s, peer %s; seen 0x%x)", clean ? "after LEFT" : "after kill -9",
                 peer_connects ? "connects" : "passive", seen);
    fprintf(stderr, "JOINED %.1f ms after restart (%s, peer %s)\n", ms, clean ? "after LEFT" : "after kill -9",
            peer_connects ? "connects" : "passive");
    assert_string_equal(ev.url, url);
    if (inc_old) assert_true(ev.incarnation != inc_old);
    assert_int_equal(cx_peer_state(f->e, lid), CX_PEER_UP);
    /* The new process's bytes, under the old name. */
    memset(f->r, 0, CHUNK);
    assert_int_equal(cx_read(f->e, lid, f->r, f->p.base + 4096, CHUNK), CX_OK);
    assert_int_equal(cxt_check(f->r, CHUNK, seed, 4096), -1);
    cxt_fill(f->r, CHUNK, 9, 0);
    assert_int_equal(cx_write(f->e, url, f->r, f->p.base, CHUNK), CX_OK);
    char rep[128], want[64];
    assert_int_equal(cxt_peer_cmd(&f->p, 5000, rep, sizeof rep, "HASH 0 %zu", CHUNK), 0);
    snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(f->r, CHUNK));
    assert_string_equal(rep, want);
    /* And the peer can use us again. */
    assert_int_equal(
        cxt_peer_cmd(&f->p, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 4096 0", eurl, (uintptr_t)f->r), 0);
}

static void test_restart_same_identity(void **state)
{
    (void)state;
    fixture_t f;
    assert_int_equal(make(&f, 0, 0, 10000), 0);
    uint64_t inc = cx_engine_incarnation(f.e);
    cx_engine_t *survivor = f.e;
    assert_int_equal(start_peer(&f, 0, 4, 0, 0, NULL), 0);
    cx_event_t ev;
    connect_up(&f, &ev);
    assert_int_equal(cx_read(f.e, f.p.lid, f.r, f.p.base, CHUNK), CX_OK);
    restart_cycle(&f, 0, 0, 21); /* kill -9, passive restart: the survivor reconnects */
    restart_cycle(&f, 1, 0, 22); /* kill -9, the restarted peer connects itself */
    restart_cycle(&f, 1, 1, 23); /* clean close, the restarted peer connects itself */
    assert_ptr_equal(f.e, survivor);
    assert_int_equal(cx_engine_incarnation(f.e), inc); /* the survivor never restarted */
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_true(st.peer_joins >= 3);
    assert_int_equal(st.peers_up, 1);
    assert_int_equal(st.ops_in_flight, 0);
    unmake(&f);
}

/* ---- killed in the middle of sending to us ---- */

/* A peer killed while it writes into our receive path, 10 times over: three reads (the peer
 * sends the data back, on UCX's shared-memory transports as messages into our receive FIFO) and
 * messages (their acks) keep it writing to us, and the kill comes at a different moment each
 * round. Each time the same identity rejoins, and its first read, a write, its read of us and a
 * message from it must go through. What it guards: UCX 1.13's posix FIFO, where a sender killed
 * between claiming a slot and filling it stopped every later message to us (from every peer)
 * for good; without the backend's rotation this failed in about half of the runs (ucx_shm), one
 * kill in 10-20 leaving such a slot. */
static void test_killed_mid_send(void **state)
{
    (void)state;
    fixture_t f;
    assert_int_equal(make(&f, 0, 0, 5000), 0);
    assert_int_equal(start_peer(&f, 0, 40, 0, 0, NULL), 0);
    cx_event_t ev;
    connect_up(&f, &ev);
    const char *eurl = cx_engine_local_url(f.e);
    enum { NW = 4 };
    /* CXT_MIDSEND_ROUNDS: fewer rounds (default 10) where each costs more (the sanitizer run) */
    const char *rs = getenv("CXT_MIDSEND_ROUNDS");
    const int ROUNDS = rs && atoi(rs) > 0 && atoi(rs) < 1000 ? atoi(rs) : 10;
    static const int kinds[NW] = { CX_OPK_READ, CX_OPK_READ, CX_OPK_READ, CX_OPK_MSG };
    for (int round = 0; round < ROUNDS; round++) {
        worker_t w[NW];
        pthread_t th[NW];
        workers_start(&f, w, th, kinds, NW, 1, 2); /* restart_cycle uses the first chunk */
        usleep(1000 + 1700 * (unsigned)round);     /* somewhere else in the peer's send loop each round */
        cxt_peer_signal(&f.p, SIGKILL);
        if (workers_end(w, th, NW)) fail_msg("round %d: an op was still running 10 s after the kill", round);
        for (int i = 0; i < NW; i++) {
            if (atomic_load(&w[i].ok) < 2)
                fail_msg("round %d: worker %d did %d ops before the kill (%s)", round, i, atomic_load(&w[i].ok),
                         cx_strerror(w[i].last_rc));
            if (w[i].last_rc != CX_EPEER)
                fail_msg("round %d: worker %d ended with %s, expected CX_EPEER", round, i, cx_strerror(w[i].last_rc));
        }
        /* kill (again), FAILED, restart under the same LID, read / write / the peer reads us */
        uint32_t seed = 41 + (uint32_t)round;
        restart_cycle(&f, round & 1, 0, seed);
        /* and a message from the new process reaches us */
        char rep[64];
        assert_int_equal(cxt_peer_cmd(&f.p, 5000, rep, sizeof rep, "SEND %s 4096 %u", eurl, seed), 0);
        cx_msg_t m;
        int rc = cx_recv_msg(f.e, &m, 5000);
        if (rc) fail_msg("round %d: no message from the rejoined peer within 5 s (%s)", round, cx_strerror(rc));
        assert_int_equal(m.len, 4096);
        assert_int_equal(cxt_check(m.data, m.len, seed, 0), -1);
        cx_msg_release(&m);
        fprintf(stderr, "round %d: killed mid-send, rejoined, read and message through\n", round);
    }
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_int_equal(st.ops_in_flight, 0);
    assert_int_equal(st.op_timeouts, 0);
    unmake(&f);
}

/* Unregister waits until every connected peer has dropped the region (REG_DEL_ACK), so that no
 * peer reaches the memory once the caller may free it. A stopped peer cannot ack: unregister
 * returns once the heartbeat declares it failed, not at the op timeout, and says CX_OK. */
static void test_unregister_waits_for_peers(void **state)
{
    (void)state;
    fixture_t f;
    const uint32_t hb = 100, hbt = 1000, opt = 10000;
    cx_event_t ev;
    make_up(&f, hb, hbt, opt, &ev);
    char lid[CX_URL_MAX], rep[128];
    cx_url_t u;
    assert_int_equal(cx_url_parse(cx_engine_local_url(f.e), &u, NULL, 0), CX_OK);
    cx_lid_format(&u.lid, lid, sizeof lid);
    uint8_t *x = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(x != MAP_FAILED);
    for (int round = 0; round < 3; round++) {
        cxt_fill(x, 65536, 60 + (uint32_t)round, 0);
        assert_int_equal(cx_register_memory(f.e, x, 65536), CX_OK);
        /* The peer reads it (it may have to ask which region holds it: REG_QUERY) ... */
        int rc = cxt_peer_cmd(&f.p, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 4096 0", lid, (uintptr_t)x);
        if (rc) fail_msg("round %d: the peer could not read a registered region: '%s'", round, rep);
        /* ... and once unregister has returned, at once, it cannot any more. */
        uint64_t t0 = cxt_now_ns();
        assert_int_equal(cx_unregister_memory(f.e, x), CX_OK);
        double ms = cxt_ms_since(t0);
        rc = cxt_peer_cmd(&f.p, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 4096 0", lid, (uintptr_t)x);
        fprintf(stderr, "round %d: unregister took %.2f ms; the peer's read then: '%s'\n", round, ms, rep);
        if (rc != CX_EINVAL)
            fail_msg("round %d: peer read of an unregistered region: '%s', expected ERR -4", round, rep);
    }
    /* A stopped peer owes its ack: unregister waits for the heartbeat's FAILED, no longer. */
    assert_int_equal(cx_register_memory(f.e, x, 65536), CX_OK);
    assert_int_equal(cxt_peer_cmd(&f.p, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 4096 0", lid, (uintptr_t)x), 0);
    cxt_drain_events(f.e);
    cxt_peer_signal(&f.p, SIGSTOP);
    uint64_t t0 = cxt_now_ns();
    int rc = cx_unregister_memory(f.e, x);
    double ms = cxt_ms_since(t0);
    fprintf(stderr, "unregister with a stopped peer: %s after %.1f ms (heartbeat timeout %u ms)\n", cx_strerror(rc), ms,
            hbt);
    int failed = cxt_wait_event(f.e, f.p.lid, CX_EVENT_FAILED, 3000, &ev, NULL);
    cxt_peer_signal(&f.p, SIGCONT);
    assert_int_equal(rc, CX_OK);
    assert_int_equal(failed, 0);
    if (ms < hbt * 0.5 || ms > hbt + 3000.0) fail_msg("unregister took %.1f ms with a stopped peer", ms);
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_int_equal(st.regions, 1);
    munmap(x, 65536);
    unmake(&f);
}

/* ---- ops at the rejoin ---- */

/* A peer killed and restarted under the same identity and port, many times: as soon as the new
 * process says READY, and before the survivor has read any event about it, a read, a write and a
 * put_signal to it. cx_connect first (it reads no event): it returns at once when the rejoin is
 * in, and waits for it otherwise (an op to a peer still FAILED is CX_EPEER by design). Each op
 * must then complete with 0 and the new process's data: the read its pattern, the write what
 * its HASH says, the put_signal's message checked against its memory on arrival. The op
 * timeout is 5 s, so an op that hangs fails the round in 5 s with CX_ETIMEDOUT, named.
 * CXT_REJOIN_ROUNDS sets the rounds (default 20). Odd rounds wait until the survivor has the
 * death before restarting, even rounds restart at once (the new HELLO fails the old
 * incarnation); in half of them the new process dials us itself; in every third the kill comes
 * with reads and messages in flight (they must end with CX_EPEER). */
static void test_ops_at_rejoin(void **state)
{
    (void)state;
    const uint32_t opt = 5000;
    fixture_t f;
    assert_int_equal(make(&f, 0, 0, opt), 0);
    assert_int_equal(start_peer(&f, 0, 50, 0, 0, NULL), 0);
    cx_event_t ev;
    connect_up(&f, &ev);
    const char *eurl = cx_engine_local_url(f.e);
    uint16_t port = f.p.port;
    int rounds = 20;
    const char *rs = getenv("CXT_REJOIN_ROUNDS");
    if (rs && atoi(rs) > 0) rounds = atoi(rs) > 1000 ? 1000 : atoi(rs);
    if (rounds > 20) alarm(60 + 5 * (unsigned)rounds); /* the watchdog, for the longer run */
    int waited = 0;
    double worst = 0;
    for (int r = 0; r < rounds; r++) {
        uint32_t seed = 100 + (uint32_t)r;
        int dials = r % 4 >= 2, busy = r % 3 == 2;
        if (busy) {
            enum { NW = 3 };
            static const int kinds[NW] = { CX_OPK_READ, CX_OPK_READ, CX_OPK_MSG };
            worker_t w[NW];
            pthread_t th[NW];
            workers_start(&f, w, th, kinds, NW, 4, 2); /* chunks 4..6: clear of the checks below */
            cxt_peer_signal(&f.p, SIGKILL);
            if (workers_end(w, th, NW)) fail_msg("round %d: an op was still running 10 s after the kill", r);
            for (int i = 0; i < NW; i++)
                if (w[i].last_rc != CX_EPEER)
                    fail_msg("round %d: an op in flight at the kill ended with %s, expected CX_EPEER", r,
                             cx_strerror(w[i].last_rc));
        }
        cxt_peer_crash(&f.p);
        if (r & 1) {
            uint64_t tw = cxt_now_ns();
            while (cx_peer_state(f.e, f.p.lid) == CX_PEER_UP && cxt_ms_since(tw) < 5000) usleep(1000);
            if (cx_peer_state(f.e, f.p.lid) == CX_PEER_UP)
                fail_msg("round %d: the killed peer is still UP after 5 s", r);
        }
        if (start_peer(&f, port, seed, 0, 0, dials ? eurl : NULL))
            fail_msg("round %d: restart on port %u failed", r, port);
        /* READY: no event read since the kill. */
        uint64_t t0 = cxt_now_ns();
        int up = cx_peer_state(f.e, f.p.lid) == CX_PEER_UP;
        int rc = cx_connect(f.e, f.p.url, (int)opt);
        if (rc)
            fail_msg("round %d: cx_connect to the restarted peer: %s after %.0f ms", r, cx_strerror(rc),
                     cxt_ms_since(t0));
        waited += !up;
        const char *what[3] = { "read", "write", "put_signal" };
        double ms[3];
        for (int k = 0; k < 3; k++) {
            uint64_t tk = cxt_now_ns();
            if (k == 0) {
                memset(f.r, 0, CHUNK);
                rc = cx_read(f.e, f.p.lid, f.r, f.p.base + 4096, CHUNK);
            } else if (k == 1) {
                cxt_fill(f.r + CHUNK, CHUNK, seed + 1000, 0);
                rc = cx_write(f.e, f.p.url, f.r + CHUNK, f.p.base + CHUNK, CHUNK);
            } else {
                cxt_fill(f.r + 2 * CHUNK, 65536, seed + 2000, 0);
                char msg[128];
                snprintf(msg, sizeof msg, "CHK %" PRIx64 " %d %" PRIx64, f.p.base + 2 * CHUNK, 65536,
                         cxt_hash(f.r + 2 * CHUNK, 65536));
                cx_op_t *op = NULL;
                rc = cx_put_signal(f.e, f.p.lid, f.r + 2 * CHUNK, f.p.base + 2 * CHUNK, 65536, msg, strlen(msg), &op);
                if (rc == CX_OK) rc = cx_op_wait(op, (int)opt + 10000);
            }
            ms[k] = cxt_ms_since(tk);
            if (ms[k] > worst) worst = ms[k];
            if (rc)
                fail_msg("round %d of %d: %s to the restarted peer (%s, %s, state %s at READY): %s after %.0f ms "
                         "(op timeout %u ms)",
                         r, rounds, what[k], dials ? "it dialled us" : "passive",
                         r & 1 ? "death seen first" : "restarted at once", up ? "UP" : "not UP", cx_strerror(rc), ms[k],
                         opt);
        }
        long long bad = cxt_check(f.r, CHUNK, seed, 4096);
        if (bad != -1) fail_msg("round %d: byte %lld of the read is not the new process's", r, bad);
        char rep[128], want[64], line[512];
        assert_int_equal(cxt_peer_cmd(&f.p, 5000, rep, sizeof rep, "HASH %zu %zu", CHUNK, CHUNK), 0);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(f.r + CHUNK, CHUNK));
        if (strcmp(rep, want)) fail_msg("round %d: after the write the peer has '%s', expected '%s'", r, rep, want);
        if (cxt_peer_expect(&f.p, "MSG ", 5000, line, sizeof line))
            fail_msg("round %d: the put_signal's message did not reach the peer", r);
        if (!strstr(line, " CHK OK")) fail_msg("round %d: put_signal: the peer said '%s'", r, line);
        fprintf(stderr, "round %d: %s%s, %s, %s at READY: read %.1f, write %.1f, put_signal %.1f ms\n", r,
                busy ? "killed mid-transfer, " : "", dials ? "dialled us" : "passive",
                r & 1 ? "death seen first" : "restarted at once", up ? "UP" : "not UP", ms[0], ms[1], ms[2]);
        cxt_drain_events(f.e);
    }
    fprintf(stderr, "%d rounds: all ops completed; cx_connect waited for the rejoin in %d; slowest op %.1f ms\n",
            rounds, waited, worst);
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_int_equal(st.ops_in_flight, 0);
    unmake(&f);
}

/* ---- unregister under a large read ---- */

#define BIGR ((size_t)64 << 20)

/* The peer reads a 64 MiB region of ours again and again; we unregister it in the middle of one
 * of those reads and at once overwrite the memory. Unregister waits for every peer's REG_DEL_ACK
 * (docs/semantics.md, "Ops"): the read in flight may complete before (with 0 and the old bytes)
 * or fail (any error code), but no read may complete with 0 carrying a byte written after
 * unregister returned, the peer must not crash, and its next read must be refused (CX_EINVAL).
 * The pair stays UP. Three rounds, unregister at a different moment of the read each time. */
static void test_unregister_during_large_read(void **state)
{
    (void)state;
    fixture_t f;
    assert_int_equal(make(&f, 0, 0, 20000), 0);
    cxt_peer_opts_t o = { .replica = 1, .region = BIGR, .seed = 4 };
    assert_int_equal(cxt_peer_start(&f.p, &o, 10000), 0);
    cx_event_t ev;
    connect_up(&f, &ev);
    char lid[CX_URL_MAX], rep[256], line[128];
    cx_url_t u;
    assert_int_equal(cx_url_parse(cx_engine_local_url(f.e), &u, NULL, 0), CX_OK);
    cx_lid_format(&u.lid, lid, sizeof lid);
    uint8_t *x = mmap(NULL, BIGR, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(x != MAP_FAILED);
    for (int round = 0; round < 3; round++) {
        uint32_t seed = 70 + (uint32_t)round;
        cxt_fill(x, BIGR, seed, 0);
        assert_int_equal(cx_register_memory(f.e, x, BIGR), CX_OK);
        assert_int_equal(
            cxt_peer_send(&f.p, "READLOOP %s 0x%" PRIxPTR " %zu 1000 20000 %u", lid, (uintptr_t)x, BIGR, seed), 0);
        if (cxt_peer_expect(&f.p, "LOOP 1", 20000, line, sizeof line)) {
            cxt_peer_reply(&f.p, 1000, rep, sizeof rep);
            fail_msg("round %d: the peer's first 64 MiB read did not complete within 20 s ('%s')", round, rep);
        }
        usleep(1000 + 6000 * (unsigned)round); /* into the next read, somewhere else each round */
        uint64_t t0 = cxt_now_ns();
        int rc = cx_unregister_memory(f.e, x);
        double ms = cxt_ms_since(t0);
        const unsigned late = 0xE0u + (unsigned)round;
        memset(x, (int)late, BIGR); /* ours again: nobody may read this */
        int lrc = cxt_peer_reply(&f.p, 30000, rep, sizeof rep);
        fprintf(stderr, "round %d: unregister %s after %.2f ms; the peer's loop: '%s'\n", round, cx_strerror(rc), ms,
                rep);
        if (lrc == CX_ETIMEDOUT) fail_msg("round %d: the peer's read loop did not end within 30 s", round);
        assert_int_equal(rc, CX_OK);
        long long reads = -1, bad = -1, first_bad = -1, off = -1;
        unsigned byte = 0;
        int end_rc = 0;
        if (sscanf(rep, "OK reads=%lld bad=%lld first_bad=%lld off=%lld byte=%x rc=%d", &reads, &bad, &first_bad, &off,
                   &byte, &end_rc) != 6)
            fail_msg("round %d: the peer answered '%s'", round, rep);
        if (bad)
            fail_msg("round %d: %lld of %lld reads completed with 0 but not with the region's bytes: read %lld, "
                     "first wrong byte at offset %lld is 0x%02x%s (unregister returned after %.2f ms)",
                     round, bad, reads, first_bad, off, byte,
                     byte == late ? ", the value written after unregister returned" : "", ms);
        if (end_rc == 0)
            fail_msg("round %d: %lld reads of an unregistered region completed, none was refused", round, reads);
        assert_true(reads >= 1);
        rc = cxt_peer_cmd(&f.p, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 4096 0", lid, (uintptr_t)x);
        if (rc != CX_EINVAL) fail_msg("round %d: the peer's read after unregister: '%s', expected ERR -4", round, rep);
        if (cx_peer_state(f.e, f.p.lid) != CX_PEER_UP)
            fail_msg("round %d: the peer is no longer UP after an unregister under its read", round);
    }
    assert_int_equal(cxt_peer_cmd(&f.p, 10000, rep, sizeof rep, "STATS"), 0); /* it is alive */
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_int_equal(st.regions, 1);
    assert_int_equal(st.peer_failures, 0);
    munmap(x, BIGR);
    unmake(&f);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kill9_during_transfers, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_sigstop_suspect_failed_timeout, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_restart_same_identity, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_killed_mid_send, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_unregister_waits_for_peers, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_unregister_during_large_read, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_ops_at_rejoin, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    /* CXT_FILTER=test_name (wildcards allowed) runs a subset. */
    if (getenv("CXT_FILTER")) cmocka_set_test_filter(getenv("CXT_FILTER"));
    return cxt_run_tests(tests, NULL, NULL);
}
