/* A wedged receive FIFO under UCX over shared memory (backends/ucx/ucx_rot.c, cx_ucx_rescue), made
 * on purpose: run with UCX_TLS=posix,cma,self and CONNEX_UCX_FAULT_WEDGE=1 (tests/CMakeLists.txt),
 * which stops the backend from progressing a worker once a shared-memory peer of it was dropped,
 * as a peer killed between claiming a slot of its FIFO and filling it would.
 *
 * The test process E has a live peer B and a victim C. B is stopped, so that what E posts to it
 * waits on E's worker for B's answers: reads (bounced and answered by the target), a write, a
 * put_signal, a message (from a thread: cx_send_msg blocks) and a batch whose entries alternate
 * between B and C. C is killed: E drops it, its worker is wedged and rotates; B continues and
 * answers into the wedged FIFO. Asserts: once the retired worker's grace (1 s) is over, every op
 * to B completes within a few seconds, not at the op timeout (30 s): reads, the write, the
 * put_signal and the batch's entries to B with CX_OK and the right bytes; the message with CX_OK
 * or CX_ERR (delivered, its ack stuck: never posted twice), B having it exactly once; C's
 * entries CX_EPEER or CX_OK. The log shows the rescue. Then new ops to B work.
 *
 * With same-host copies (CONNEX_UCX_CMA, on unless "off") reads and writes never touch the
 * worker: they complete at once, stopped B or not, and the put_signal's data is in place before
 * its message is posted, which then waits on the wedged worker as the message does: CX_OK or
 * CX_ERR, B having it exactly once, after the data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxt.h"

#define RS ((size_t)8 << 20)
#define CHUNK 65536
#define NREAD 6
#define BIG (2u << 20) /* from CONNEX_UCX_READ_ANSWER_MIN on: answered by the target */
#define NB 16          /* batch entries, alternating B and C */
#define BOUND_MS 8000  /* far below the op timeout, generous for a loaded host */
#define OP_TIMEOUT_MS 30000
#define WOFF (6u << 20) /* where B's region is written (read nowhere) */

/* Counts the rescue lines and the ERROR lines, echoing the backend's notable ones. */
typedef struct {
    int rescues, errors;
} logc_t;

static void log_line(const char *line, void *arg)
{
    logc_t *c = arg;
    int err = strstr(line, " ERROR ") != NULL;
    c->errors += err;
    if (strstr(line, "still had ops of live peers")) c->rescues++;
    if (err || strstr(line, "ucx: worker") || strstr(line, "ucx_wedge:")) fputs(line, stderr);
}

typedef struct {
    cx_engine_t *e;
    const char *lid;
    char msg[100];
    int rc;
    double ms;
} sender_t;

static void *send_one(void *arg)
{
    sender_t *s = arg;
    uint64_t t0 = cxt_now_ns();
    s->rc = cx_send_msg(s->e, s->lid, s->msg, sizeof s->msg);
    s->ms = cxt_ms_since(t0);
    return NULL;
}

static void test_wedged_fifo_live_peer_ops(void **state)
{
    (void)state;
    const char *w = getenv("CONNEX_UCX_FAULT_WEDGE"), *be = getenv("CONNEX_BACKEND"), *tls = getenv("UCX_TLS");
    if (!w || strcmp(w, "1") || !be || strcmp(be, "ucx") || !tls || !strstr(tls, "posix"))
        cxt_skip("ucx_wedge",
                 "run with CONNEX_BACKEND=ucx, UCX_TLS=posix,cma,self and CONNEX_UCX_FAULT_WEDGE=1 "
                 "(tests/CMakeLists.txt)");
    cxt_log_capture("ucx_wedge");
    cx_engine_t *e;
    assert_int_equal(cxt_engine(&e, "wedged", 0, 0, 20000, OP_TIMEOUT_MS), 0);
    uint8_t *r = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(r != MAP_FAILED);
    assert_int_equal(cx_register_memory(e, r, RS), CX_OK);

    cxt_peer_t b, c;
    cxt_peer_opts_t bo = { .model = "live", .region = RS, .seed = 9 };
    cxt_peer_opts_t co = { .model = "victim", .region = RS, .seed = 11 };
    assert_int_equal(cxt_peer_start(&b, &bo, 10000), 0);
    assert_int_equal(cxt_peer_start(&c, &co, 10000), 0);
    assert_int_equal(cx_connect(e, b.url, 5000), CX_OK);
    assert_int_equal(cx_connect(e, c.url, 5000), CX_OK);
    assert_int_equal(cxt_wait_event(e, b.lid, CX_EVENT_UP, 5000, NULL, NULL), 0);
    assert_int_equal(cxt_wait_event(e, c.lid, CX_EVENT_UP, 5000, NULL, NULL), 0);
    /* both data paths up before B stops */
    assert_int_equal(cx_read(e, b.lid, r, b.base, CHUNK), CX_OK);
    assert_int_equal(cx_read(e, c.lid, r, c.base, CHUNK), CX_OK);

    /* layout of r: reads at 0, the big read at 1 MiB, the write's source at 4 MiB, the
     * put_signal's at 4 MiB + CHUNK, the batch at 5 MiB */
    uint8_t *rbuf = r, *bigbuf = r + (1u << 20), *wbuf = r + (4u << 20), *sbuf = wbuf + CHUNK, *bat = r + (5u << 20);
    memset(r, 0, RS);
    cxt_fill(wbuf, CHUNK, 77, 0);
    cxt_fill(sbuf, 4096, 78, 0);
    char sig[96];
    snprintf(sig, sizeof sig, "CHK %" PRIx64 " 4096 %" PRIx64, b.base + WOFF + CHUNK, cxt_hash(sbuf, 4096));

    cxt_peer_signal(&b, SIGSTOP);
    uint64_t t0 = cxt_now_ns();
    cx_op_t *rd[NREAD], *big, *wr, *ps, *bop;
    for (int i = 0; i < NREAD; i++)
        assert_int_equal(cx_read_async(e, b.lid, rbuf + (size_t)i * CHUNK, b.base + (uint64_t)i * CHUNK, CHUNK,
                                       CX_CLASS_CRITICAL, &rd[i]),
                         CX_OK);
    assert_int_equal(cx_read_async(e, b.lid, bigbuf, b.base + (1u << 20), BIG, CX_CLASS_CRITICAL, &big), CX_OK);
    assert_int_equal(cx_write_async(e, b.lid, wbuf, b.base + WOFF, CHUNK, CX_CLASS_CRITICAL, &wr), CX_OK);
    assert_int_equal(cx_put_signal(e, b.lid, sbuf, b.base + WOFF + CHUNK, 4096, sig, strlen(sig) + 1, &ps), CX_OK);
    sender_t snd = { .e = e, .lid = b.lid, .rc = -999 };
    cxt_fill(snd.msg, sizeof snd.msg, 79, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, send_one, &snd), 0);
    cx_batch_entry_t ents[NB];
    int st[NB];
    for (int i = 0; i < NB; i++) {
        const cxt_peer_t *p = i & 1 ? &c : &b;
        ents[i] = (cx_batch_entry_t){ .peer = p->lid,
                                      .local = bat + (size_t)i * CHUNK,
                                      .remote = p->base + (4u << 20) + (uint64_t)i * CHUNK,
                                      .len = CHUNK };
    }
    assert_int_equal(cx_batch_read_async(e, ents, NB, CX_CLASS_CRITICAL, st, &bop), CX_OK);
    usleep(100 * 1000); /* everything posted on E's worker, waiting for the stopped B */

    uint64_t t_kill = cxt_now_ns();
    cxt_peer_crash(&c);
    if (cxt_wait_event(e, c.lid, CX_EVENT_FAILED, 5000, NULL, NULL)) fail_msg("no FAILED for the killed peer");
    uint64_t t_failed = cxt_now_ns();
    usleep(200 * 1000); /* E's worker is wedged and rotated by now */
    cxt_peer_signal(&b, SIGCONT);

    int rc;
    for (int i = 0; i < NREAD; i++) {
        if ((rc = cx_op_wait(rd[i], BOUND_MS))) fail_msg("read %d from B: %s", i, cx_strerror(rc));
        if (cxt_check(rbuf + (size_t)i * CHUNK, CHUNK, 9, (uint64_t)i * CHUNK) >= 0) fail_msg("read %d: wrong data", i);
    }
    if ((rc = cx_op_wait(big, BOUND_MS))) fail_msg("2 MiB read from B: %s", cx_strerror(rc));
    if (cxt_check(bigbuf, BIG, 9, 1u << 20) >= 0) fail_msg("2 MiB read: wrong data");
    if ((rc = cx_op_wait(wr, BOUND_MS))) fail_msg("write to B: %s", cx_strerror(rc));
    const char *cma = getenv("CONNEX_UCX_CMA");
    int copies = !cma || strcmp(cma, "off"); /* ucx_cma.c */
    if ((rc = cx_op_wait(ps, BOUND_MS)) && !(copies && rc == CX_ERR)) fail_msg("put_signal to B: %s", cx_strerror(rc));
    rc = cx_op_wait(bop, BOUND_MS);
    if (rc == CX_EINPROGRESS) fail_msg("the batch still ran %d ms after the kill", BOUND_MS);
    double ms_all = cxt_ms_since(t0), ms_kill = cxt_ms_since(t_kill), ms_failed = cxt_ms_since(t_failed);
    int dead = 0;
    for (int i = 0; i < NB; i++) {
        if (!(i & 1)) {
            if (st[i] != CX_OK) fail_msg("batch entry %d to B: %s", i, cx_strerror(st[i]));
            if (cxt_check(bat + (size_t)i * CHUNK, CHUNK, 9, (4u << 20) + (uint64_t)i * CHUNK) >= 0)
                fail_msg("batch entry %d: wrong data", i);
        } else if (st[i] == CX_EPEER) {
            dead++;
        } else if (st[i] != CX_OK) {
            fail_msg("batch entry %d to the killed peer: %s", i, cx_strerror(st[i]));
        }
    }
    assert_int_equal(rc, dead ? CX_EPEER : CX_OK);
    /* the message: bounded like the rest (the join cannot hang past the op timeout) */
    pthread_join(th, NULL);
    if (snd.rc != CX_OK && snd.rc != CX_ERR) fail_msg("message to B: %s", cx_strerror(snd.rc));
    if (snd.ms > BOUND_MS + ms_all - ms_kill) fail_msg("message to B took %.0f ms", snd.ms);

    /* at B: the put_signal's message after its data, the message once */
    char line[512], rep[256], want[64];
    int got_sig = 0, got_msg = 0;
    uint64_t mh = cxt_hash(snd.msg, sizeof snd.msg);
    snprintf(want, sizeof want, " %" PRIx64, mh);
    while (cxt_peer_expect(&b, "MSG ", 1500, line, sizeof line) == 0) {
        if (strstr(line, "CHK ")) {
            got_sig++;
            if (!strstr(line, "CHK OK")) fail_msg("put_signal at B: %s", line);
        } else if (strstr(line, want)) {
            got_msg++;
        }
    }
    if (got_sig != 1) fail_msg("B got the put_signal's message %d times", got_sig);
    if (got_msg != 1) fail_msg("B got the message %d times (it ended %s)", got_msg, cx_strerror(snd.rc));
    assert_int_equal(cxt_peer_cmd(&b, 5000, rep, sizeof rep, "HASH %u %u", WOFF, CHUNK), 0);
    snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(wbuf, CHUNK));
    if (strcmp(rep, want)) fail_msg("written data wrong at B: %s", rep);

    /* and the pair still works */
    memset(rbuf, 0, CHUNK);
    assert_int_equal(cx_read(e, b.lid, rbuf, b.base, CHUNK), CX_OK);
    assert_true(cxt_check(rbuf, CHUNK, 9, 0) < 0);
    assert_int_equal(cx_send_msg(e, b.lid, snd.msg, sizeof snd.msg), CX_OK);

    fprintf(stderr,
            "ucx_wedge: ops to the live peer done %.0f ms after they started (%.0f ms after the kill, %.0f ms "
            "after its FAILED); message %s after %.0f ms; %d of %d entries to the killed peer CX_EPEER\n",
            ms_all, ms_kill, ms_failed, cx_strerror(snd.rc), snd.ms, dead, NB / 2);
    cxt_peer_stop(&b);
    cx_engine_destroy(e);
    munmap(r, RS);
    logc_t lc = { 0, 0 };
    cxt_log_release(log_line, &lc);
    if (lc.errors) fail_msg("%d ERROR lines in the log", lc.errors);
    if (lc.rescues < 1) fail_msg("no rescue of the wedged worker's ops logged");
}

static int teardown(void **state)
{
    cxt_log_abort(); /* a failed case: stderr back, the log's tail shown */
    return cxt_watchdog_teardown(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_wedged_fifo_live_peer_ops, cxt_watchdog_setup, teardown),
    };
    return cxt_run_tests(tests, NULL, NULL);
}
