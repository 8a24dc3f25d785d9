/* Concurrency: 8 caller threads issue reads, writes, put_signals and messages to 4 peer
 * processes at once; one peer is killed (kill -9) in the middle. Every op must complete, with
 * 0 for live peers and 0 or CX_EPEER for the killed one; the data of every completed op is
 * checked (reads against the peer's pattern, writes by reading them back, put_signals by the
 * peer checking the bytes the moment the signal arrives). Run under TSan in CI. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxt.h"

#define NPEERS 4
#define NTHREADS 8
#define VICTIM 3
#define PREG (4u << 20)    /* each peer's region */
#define PAT_END (1u << 20) /* [0, 1 MiB) of a peer's region keeps its pattern: reads */
#define SLICE (128u << 10) /* then one slice per caller thread: writes and put_signals */
#define LREG (8u << 20)    /* local region: one MiB per thread */

static cx_engine_t *E;
static uint8_t *L;
static cxt_peer_t P[NPEERS];
static atomic_int g_stop, g_victim_dead;
static int g_secs = 3;

typedef struct {
    int id;
    unsigned seed;
    long ok[4], epeer[4], bad[4]; /* per kind: read, write, put_signal, msg */
    long victim_after_kill_epeer;
    unsigned ps_next;
    char why[256];
} worker_t;

typedef struct {
    int idx;
    atomic_int stop;
    long msgs, chk_ok, chk_bad;
} reader_t;

/* Drains a peer's stdout (its MSG lines) so it never blocks writing them, and counts the
 * put_signal checks it reports. */
static void *reader_main(void *arg)
{
    reader_t *r = arg;
    int fd = P[r->idx].out_fd;
    char buf[8192], line[512];
    size_t ll = 0;
    while (!atomic_load(&r->stop)) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        if (poll(&pfd, 1, 50) <= 0) continue;
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != '\n') {
                if (ll < sizeof line - 1) line[ll++] = buf[i];
                continue;
            }
            line[ll] = 0;
            ll = 0;
            if (strncmp(line, "MSG ", 4)) continue;
            r->msgs++;
            if (strstr(line, "CHK OK")) r->chk_ok++;
            if (strstr(line, "CHK BAD")) {
                r->chk_bad++;
                fprintf(stderr, "peer %d: %s\n", r->idx, line);
            }
        }
    }
    return NULL;
}

static int expect_rc(worker_t *w, int peer, int kind, int rc, const char *what)
{
    if (rc == 0) {
        w->ok[kind]++;
        return 0;
    }
    if (peer == VICTIM && rc == CX_EPEER) {
        w->epeer[kind]++;
        if (atomic_load(&g_victim_dead)) w->victim_after_kill_epeer++;
        return 1;
    }
    w->bad[kind]++;
    if (!w->why[0])
        snprintf(w->why, sizeof w->why, "thread %d: %s to peer %d: %d (%s)", w->id, what, peer, rc, cx_strerror(rc));
    return 1;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    uint8_t *loc = L + (size_t)w->id * (1u << 20);
    uint64_t t_end = cxt_now_ns() + (uint64_t)g_secs * 1000000000ull;
    for (unsigned it = 0; cxt_now_ns() < t_end && !atomic_load(&g_stop); it++) {
        int pi = (int)(rand_r(&w->seed) % NPEERS);
        cxt_peer_t *p = &P[pi];
        int kind = (int)((it + (unsigned)w->id) % 4);
        size_t len = 1 + rand_r(&w->seed) % (64u << 10);
        uint64_t slice = PAT_END + (uint64_t)w->id * SLICE;
        switch (kind) {
        case 0: { /* read from the pattern part, check every byte */
            uint64_t off = rand_r(&w->seed) % (PAT_END - len);
            int rc = cx_read(E, p->lid, loc, p->base + off, len);
            if (!expect_rc(w, pi, 0, rc, "read") && cxt_check(loc, len, p->seed, off) != -1) {
                w->bad[0]++;
                snprintf(w->why, sizeof w->why, "thread %d: read from peer %d: wrong bytes", w->id, pi);
            }
            break;
        }
        case 1: { /* write the first half of our slice, read it back */
            uint32_t s = rand_r(&w->seed);
            cxt_fill(loc, len, s, 0);
            int rc = cx_write(E, p->lid, loc, p->base + slice, len);
            if (expect_rc(w, pi, 1, rc, "write")) break;
            memset(loc + (512u << 10), 0, len);
            rc = cx_read(E, p->lid, loc + (512u << 10), p->base + slice, len);
            if (!expect_rc(w, pi, 0, rc, "read-back") && cxt_check(loc + (512u << 10), len, s, 0) != -1) {
                w->bad[1]++;
                snprintf(w->why, sizeof w->why, "thread %d: write to peer %d did not land", w->id, pi);
            }
            break;
        }
        case 2: { /* put_signal: the peer checks the bytes when the signal arrives */
            /* A slot of its own (64 per thread, reused round robin), so a later write does not
             * change the bytes before the peer's message thread gets to check them. */
            uint64_t dst = p->base + slice + (64u << 10) + (uint64_t)(w->ps_next++ % 64) * 1024u;
            len = 1 + len % 1024;
            cxt_fill(loc, len, rand_r(&w->seed), 0);
            char msg[128];
            snprintf(msg, sizeof msg, "CHK %llx %zu %llx", (unsigned long long)dst, len,
                     (unsigned long long)cxt_hash(loc, len));
            cx_op_t *op = NULL;
            int rc = cx_put_signal(E, p->lid, loc, dst, len, msg, strlen(msg), &op);
            if (rc == 0) rc = cx_op_wait(op, -1);
            expect_rc(w, pi, 2, rc, "put_signal");
            break;
        }
        default: {
            cxt_fill(loc, len, 77, 0);
            expect_rc(w, pi, 3, cx_send_msg(E, p->lid, loc, len), "send_msg");
        }
        }
    }
    return NULL;
}

static void test_eight_threads_four_peers_one_killed(void **state)
{
    (void)state;
    if (getenv("CXT_CONC_SECS")) g_secs = atoi(getenv("CXT_CONC_SECS"));
    assert_int_equal(cxt_engine(&E, "conc", 0, 0, 0, 10000), 0);
    L = mmap(NULL, LREG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(L != MAP_FAILED);
    assert_int_equal(cx_register_memory(E, L, LREG), 0);
    for (int i = 0; i < NPEERS; i++) {
        cxt_peer_opts_t o = {
            .model = "conc-peer", .replica = (uint32_t)i, .region = PREG, .seed = 100u + (uint32_t)i
        };
        assert_int_equal(cxt_peer_start(&P[i], &o, 10000), 0);
        assert_int_equal(cx_connect(E, P[i].url, 5000), 0);
    }
    reader_t rd[NPEERS];
    pthread_t rt[NPEERS], wt[NTHREADS];
    for (int i = 0; i < NPEERS; i++) {
        memset(&rd[i], 0, sizeof rd[i]);
        rd[i].idx = i;
        assert_int_equal(pthread_create(&rt[i], NULL, reader_main, &rd[i]), 0);
    }
    worker_t w[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].id = i;
        w[i].seed = 1234u + (unsigned)i;
        assert_int_equal(pthread_create(&wt[i], NULL, worker_main, &w[i]), 0);
    }
    /* The victim dies in the middle of the storm. */
    usleep((useconds_t)g_secs * 1000000u / 2);
    atomic_store(&rd[VICTIM].stop, 1);
    pthread_join(rt[VICTIM], NULL);
    uint64_t t_kill = cxt_now_ns();
    cxt_peer_crash(&P[VICTIM]);
    atomic_store(&g_victim_dead, 1);
    unsigned seen = 0;
    assert_int_equal(cxt_wait_event(E, P[VICTIM].lid, CX_EVENT_FAILED, 3000, NULL, &seen), 0);
    double fail_ms = cxt_ms_since(t_kill);

    /* Workers stop by themselves; the bound below is op_timeout (10 s) past the storm. */
    uint64_t t_join = cxt_now_ns();
    for (int i = 0; i < NTHREADS; i++) pthread_join(wt[i], NULL);
    double join_ms = cxt_ms_since(t_join);
    usleep(300000); /* last MSG lines */
    for (int i = 0; i < NPEERS; i++) {
        if (i == VICTIM) continue;
        atomic_store(&rd[i].stop, 1);
        pthread_join(rt[i], NULL);
    }

    long tot[4] = { 0 }, ep = 0, bad = 0, after = 0;
    for (int i = 0; i < NTHREADS; i++) {
        for (int k = 0; k < 4; k++) {
            tot[k] += w[i].ok[k];
            ep += w[i].epeer[k];
            bad += w[i].bad[k];
        }
        after += w[i].victim_after_kill_epeer;
        if (w[i].why[0]) fprintf(stderr, "%s\n", w[i].why);
    }
    long chk_ok = 0, chk_bad = 0;
    for (int i = 0; i < NPEERS; i++) {
        chk_ok += rd[i].chk_ok;
        chk_bad += rd[i].chk_bad;
    }
    printf("ops ok: read %ld write %ld put_signal %ld msg %ld; CX_EPEER from the victim %ld (%ld after the kill); "
           "wrong %ld; victim FAILED %.1f ms after kill -9; workers joined %.0f ms after; put_signal checks "
           "ok %ld bad %ld\n",
           tot[0], tot[1], tot[2], tot[3], ep, after, bad, fail_ms, join_ms, chk_ok, chk_bad);
    assert_int_equal(bad, 0);
    assert_int_equal(chk_bad, 0);
    for (int k = 0; k < 4; k++) assert_true(tot[k] > 0);
    assert_true(after > 0); /* ops to the dead peer fail, not hang */
    assert_true(fail_ms < 1500);
    assert_true(chk_ok > 0);
    cx_stats_t st;
    assert_int_equal(cx_stats(E, &st), 0);
    assert_int_equal(st.ops_in_flight, 0);
    assert_int_equal(st.peers_up, NPEERS - 1);

    for (int i = 0; i < NPEERS; i++)
        if (i != VICTIM) cxt_peer_stop(&P[i]);
    cx_engine_destroy(E);
    munmap(L, LREG);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_eight_threads_four_peers_one_killed, cxt_watchdog_setup,
                                        cxt_watchdog_teardown),
    };
    return cxt_run_tests(tests, NULL, NULL);
}
