/* connex-bench soak: the survivor under load while one peer identity is killed (SIGKILL) and
 * restarted N times, per backend variant.
 *
 * The survivor runs in a process of its own (forked per variant), so that a crash of it is
 * reported (the signal) and the next variant still runs. In it, SOAK_THREADS threads keep
 * reads, writes, put_signals and batches (SOAK_BATCH async reads and writes issued, then each
 * waited for) going to the peer the whole time. Per cycle: the peer process starts under the
 * same identity and port (its region at the same address), the threads' first good transfer
 * after the restart is timed from the process start and from its engine's start, the threads
 * run on for a random moment within --kill-window-ms, then SIGKILL. After the last kill the
 * peer starts once more and the end sample is taken.
 *
 * Verdict (FAIL, exit 1): an op ended with anything but 0, CX_EPEER or CX_ETIMEDOUT (CX_EINVAL
 * from a restarted peer for an op that started before it had registered its region is counted
 * apart, as "unregistered", and is not a failure: the remote range did not exist yet), a read
 * returned 0 with other bytes than the peer's, the survivor crashed, a cycle did not complete
 * (no FAILED within 5 s of the kill, no good transfer within 20 s of the restart), or a resource
 * grew: fds end above warm + SOAK_FD_SLACK, RSS above warm + SOAK_RSS_SLACK_KIB, regions or
 * registered bytes other than at the start. */
#include "bench.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SOAK_THREADS 4
#define SOAK_BATCH 8
#define SOAK_REGION ((size_t)4 << 20)  /* the peer's: reads from the first half, writes into the second */
#define SOAK_SLICE ((size_t)512 << 10) /* per thread: a read and a write slice, here and there */
#define SOAK_SEED 10
#define SOAK_FD_SLACK 4
#define SOAK_RSS_SLACK_KIB (16L * 1024)
#define SOAK_PEER_ADDR 0x200000000000ull /* where every peer process maps its region */

typedef struct soak_ctx {
    cx_engine_t *e;
    const char *url;
    uint64_t base;
    uint8_t *loc;
    atomic_int stop;
    _Atomic uint64_t reap_ns;  /* the last killed peer was reaped: later ops reach the new one */
    _Atomic uint64_t first_ok; /* first good op started after reap_ns */
    _Atomic uint64_t gen;      /* peer processes reaped so far: the index of the current one */
    _Atomic uint64_t *reg_ns;  /* per peer process: when it registered its region (0: not known yet) */
    int ngen;
    _Atomic uint64_t ops[CX_SOAK_KINDS][CX_SOAK_RESULTS];
    _Atomic uint64_t codes[16];
} soak_ctx_t;

typedef struct worker {
    soak_ctx_t *x;
    int id;
    uint64_t rng;
    pthread_t th;
} worker_t;

static uint64_t rnd(uint64_t *s) /* xorshift64* */
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* CX_EINVAL for an op started at t_start in peer generation g: did the op start before that
 * process had registered its region? Waits (bounded) until the main thread knows when it did. */
static int early(soak_ctx_t *x, uint64_t g, uint64_t t_start)
{
    if ((int)g >= x->ngen) return 0;
    for (int i = 0; i < 30000 && !atomic_load(&x->reg_ns[g]) && !atomic_load(&x->stop); i++) usleep(1000);
    uint64_t r = atomic_load(&x->reg_ns[g]);
    return r && t_start < r;
}

/* Counts an op's end; a good one started after the last reap may be the rejoin's first. */
static int note(soak_ctx_t *x, int kind, int rc, uint64_t t_start, uint64_t g)
{
    int r = rc == CX_OK                           ? CX_SOAK_OK
        : rc == CX_EPEER                          ? CX_SOAK_EPEER
        : rc == CX_ETIMEDOUT                      ? CX_SOAK_ETIMEDOUT
        : rc == CX_EINVAL && early(x, g, t_start) ? CX_SOAK_EARLY
                                                  : CX_SOAK_OTHER;
    atomic_fetch_add(&x->ops[kind][r], 1);
    if (r == CX_SOAK_OTHER) atomic_fetch_add(&x->codes[rc < 0 && rc > -15 ? -rc : 15], 1);
    if (rc == CX_OK && t_start >= atomic_load(&x->reap_ns)) {
        uint64_t z = 0;
        atomic_compare_exchange_strong(&x->first_ok, &z, cx_bench_now_ns());
    }
    return rc;
}

static void check_read(soak_ctx_t *x, int kind, const uint8_t *buf, size_t len, size_t roff)
{
    if (!cx_bench_check(buf, len, SOAK_SEED, roff)) atomic_fetch_add(&x->ops[kind][CX_SOAK_BADDATA], 1);
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    soak_ctx_t *x = w->x;
    static const size_t sizes[] = { 4096, 16384, 65536, 262144 };
    uint8_t *rd = x->loc + (size_t)w->id * 2 * SOAK_SLICE, *wr = rd + SOAK_SLICE;
    uint64_t wr_remote = x->base + SOAK_REGION / 2 + (size_t)w->id * SOAK_SLICE;
    cx_bench_fill(wr, SOAK_SLICE, 1000 + (uint32_t)w->id);
    for (uint64_t it = 0; !atomic_load(&x->stop); it++) {
        int kind = (int)(it % CX_SOAK_KINDS), rc = CX_OK;
        size_t len = sizes[rnd(&w->rng) % 4];
        size_t roff = (size_t)(rnd(&w->rng) % ((SOAK_REGION / 2 - len) / 4096 + 1)) * 4096;
        uint64_t g = atomic_load(&x->gen), t0 = cx_bench_now_ns();
        if (kind == CX_SOAK_READ) {
            memset(rd, 0xA5, len);
            rc = note(x, kind, cx_read(x->e, x->url, rd, x->base + roff, len), t0, g);
            if (rc == CX_OK) check_read(x, kind, rd, len, roff);
        } else if (kind == CX_SOAK_WRITE) {
            rc = note(x, kind, cx_write(x->e, x->url, wr, wr_remote, len), t0, g);
        } else if (kind == CX_SOAK_PUTSIG) {
            cx_op_t *op = NULL;
            rc = cx_put_signal(x->e, x->url, wr, wr_remote, len, "soak", 4, &op);
            if (rc == CX_OK) rc = cx_op_wait(op, -1);
            note(x, kind, rc, t0, g);
        } else {
            /* A batch: async reads and writes issued back to back, in one class, then waited. */
            cx_class_t cls = (it / CX_SOAK_KINDS) % 2 ? CX_CLASS_BACKGROUND : CX_CLASS_CRITICAL;
            cx_op_t *ops[SOAK_BATCH];
            size_t chunk = SOAK_SLICE / SOAK_BATCH, boff[SOAK_BATCH];
            for (int k = 0; k < SOAK_BATCH; k++) {
                ops[k] = NULL;
                boff[k] = (size_t)(rnd(&w->rng) % ((SOAK_REGION / 2 - chunk) / 4096 + 1)) * 4096;
                int irc;
                if (k % 2 == 0) {
                    memset(rd + (size_t)k * chunk, 0xA5, chunk);
                    irc = cx_read_async(x->e, x->url, rd + (size_t)k * chunk, x->base + boff[k], chunk, cls, &ops[k]);
                } else {
                    irc = cx_write_async(x->e, x->url, wr + (size_t)k * chunk, wr_remote + (size_t)k * chunk, chunk,
                                         cls, &ops[k]);
                }
                if (irc) {
                    note(x, kind, irc, t0, g);
                    ops[k] = NULL;
                    rc = irc;
                }
            }
            for (int k = 0; k < SOAK_BATCH; k++) {
                if (!ops[k]) continue;
                int wrc = note(x, kind, cx_op_wait(ops[k], -1), t0, g);
                if (wrc == CX_OK && k % 2 == 0) check_read(x, kind, rd + (size_t)k * chunk, chunk, boff[k]);
                if (wrc) rc = wrc;
            }
        }
        if (rc) usleep(1000); /* the peer is down: do not spin against it */
    }
    return NULL;
}

static void sample(cx_engine_t *e, long *fds, long *rss, long *regions, long *rbytes)
{
    cx_stats_t st;
    memset(&st, 0, sizeof st);
    cx_stats(e, &st);
    *fds = cx_bench_count_fds();
    *rss = cx_bench_rss_kib();
    if (regions) *regions = (long)st.regions;
    if (rbytes) *rbytes = (long)st.registered_bytes;
}

/* Waits (bounded) for the first good op after the restart; 0 and its time, or -1. */
static int wait_first_ok(soak_ctx_t *x, uint64_t t_spawn, uint64_t *t_ok)
{
    uint64_t deadline = cx_bench_now_ns() + 20000000000ull;
    while (cx_bench_now_ns() < deadline) {
        uint64_t v = atomic_load(&x->first_ok);
        if (v && v < t_spawn)
            atomic_compare_exchange_strong(&x->first_ok, &v, 0); /* the old process's */
        else if (v) {
            *t_ok = v;
            return 0;
        }
        usleep(500);
    }
    return -1;
}

static void soak_variant(const cx_bench_opts_t *o, const char *vname, cx_bench_soak_t *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->backend, sizeof s->backend, "%s", vname);
    s->cycles = o->cycles;
    s->threads = SOAK_THREADS;
    s->seed = o->seed ? o->seed : (cx_bench_now_ns() ^ ((uint64_t)getpid() << 32)) | 1;
    uint64_t rng = s->seed;
    uint64_t *fails = calloc((size_t)o->cycles, sizeof *fails), *joins = calloc((size_t)o->cycles + 1, sizeof *joins),
             *ups = calloc((size_t)o->cycles + 1, sizeof *ups);
    int nf = 0, nj = 0, warm_at = o->cycles >= 50 ? 10 : o->cycles / 5; /* kills before the warm sample */
    static soak_ctx_t x;
    memset(&x, 0, sizeof x);
    worker_t w[SOAK_THREADS];
    int nw = 0;
    cx_bench_child_t ch = { .pid = -1, .in = -1, .out = -1 };
    size_t loclen = (size_t)SOAK_THREADS * 2 * SOAK_SLICE;
    uint8_t *buf = mmap(NULL, loclen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int rc = cx_bench_engine(&x.e, NULL, o->hb_ms, o->hb_timeout_ms, 10000);
    if (rc || !fails || !joins || !ups || buf == MAP_FAILED) {
        snprintf(s->verdict, sizeof s->verdict, "skipped: engine: %s", cx_strerror(rc ? rc : CX_ENOMEM));
        goto out;
    }
    x.loc = buf;
    x.ngen = o->cycles + 1;
    x.reg_ns = calloc((size_t)x.ngen, sizeof *x.reg_ns);
    if (!x.reg_ns) {
        snprintf(s->verdict, sizeof s->verdict, "skipped: out of memory");
        goto out;
    }
    if ((rc = cx_register_memory(x.e, buf, loclen))) {
        snprintf(s->verdict, sizeof s->verdict, "FAIL: register: %s", cx_strerror(rc));
        goto out;
    }
    sample(x.e, &s->fds_start, &s->rss_start, &s->regions_start, &s->rbytes_start);
    char addr[32];
    snprintf(addr, sizeof addr, "%llx", (unsigned long long)SOAK_PEER_ADDR);
    setenv("CX_BENCH_PEER_ADDR", addr, 1);
    cx_bench_child_opts_t co = { .region = SOAK_REGION,
                                 .seed = SOAK_SEED,
                                 .connect = cx_engine_local_url(x.e),
                                 .hb_ms = o->hb_ms,
                                 .hb_timeout_ms = o->hb_timeout_ms };
    uint64_t t0 = cx_bench_now_ns();
    /* Cycle c starts peer process c and kills it; the one started at c == cycles is the end sample. */
    for (int c = 0; c <= o->cycles; c++) {
        if (c < o->cycles) cx_bench_progress(o, "soak %-14s kill %d/%d", vname, c + 1, o->cycles);
        if (cx_bench_spawn(o, &ch, &co)) {
            snprintf(s->verdict, sizeof s->verdict, "FAIL: cycle %d: peer did not start", c);
            break;
        }
        co.port = ch.port;
        atomic_store(&x.reg_ns[c], ch.t_registered_ns ? ch.t_registered_ns : ch.t_spawn_ns);
        if (c == 0) {
            if ((rc = cx_connect(x.e, ch.url, 10000))) {
                snprintf(s->verdict, sizeof s->verdict, "FAIL: connect: %s", cx_strerror(rc));
                break;
            }
            static char url[CX_URL_MAX];
            snprintf(url, sizeof url, "%s", ch.url);
            x.url = url;
            x.base = ch.base;
            for (; nw < SOAK_THREADS; nw++) {
                w[nw] = (worker_t){ .x = &x, .id = nw, .rng = rnd(&rng) | 1 };
                if (pthread_create(&w[nw].th, NULL, worker_main, &w[nw])) break;
            }
        } else if (ch.base != x.base) {
            snprintf(s->verdict, sizeof s->verdict, "FAIL: cycle %d: the peer's region moved (%" PRIx64 ")", c,
                     ch.base);
            break;
        }
        uint64_t t_ok;
        if (wait_first_ok(&x, ch.t_spawn_ns, &t_ok)) {
            snprintf(s->verdict, sizeof s->verdict, "FAIL: cycle %d: no good transfer within 20 s of the restart", c);
            break;
        }
        if (c) {
            joins[nj] = t_ok - ch.t_spawn_ns;
            ups[nj++] = t_ok > ch.t_engine_ns ? t_ok - ch.t_engine_ns : 0;
        }
        if (c == warm_at) sample(x.e, &s->fds_warm, &s->rss_warm, NULL, NULL);
        long f, r;
        sample(x.e, &f, &r, NULL, NULL);
        if (f > s->fds_max) s->fds_max = f;
        if (r > s->rss_max) s->rss_max = r;
        if (c == o->cycles) {
            /* The end sample, with the peer up as in the warm one; a backend may close sockets
             * from its own thread: up to 2 s for the fds to settle. */
            for (int i = 0; i < 200; i++) {
                sample(x.e, &s->fds_end, &s->rss_end, &s->regions_end, &s->rbytes_end);
                if (s->fds_end <= s->fds_warm + SOAK_FD_SLACK) break;
                usleep(10000);
            }
            break;
        }
        /* The kill at a random moment while the threads' ops are in flight. */
        uint64_t pause_us = o->kill_window_ms ? rnd(&rng) % ((uint64_t)o->kill_window_ms * 1000) : 0;
        usleep((useconds_t)pause_us);
        uint64_t tk = cx_bench_now_ns();
        kill(ch.pid, SIGKILL);
        cx_event_t ev;
        int nofail = cx_bench_wait_event(x.e, CX_EVENT_FAILED, 5000, &ev);
        cx_bench_reap(&ch);
        atomic_store(&x.reap_ns, cx_bench_now_ns());
        atomic_store(&x.first_ok, 0);
        atomic_store(&x.gen, (uint64_t)c + 1);
        if (nofail) {
            snprintf(s->verdict, sizeof s->verdict, "FAIL: cycle %d: no FAILED within 5 s of SIGKILL", c);
            break;
        }
        uint64_t tf = ev.time_ns ? ev.time_ns : cx_bench_now_ns();
        fails[nf++] = tf > tk ? tf - tk : 0;
        s->done = c + 1;
    }
    atomic_store(&x.stop, 1);
    for (int i = 0; i < nw; i++) pthread_join(w[i].th, NULL); /* each op ends within the op timeout */
    if (ch.pid > 0) cx_bench_stop(&ch);
    s->seconds = (double)(cx_bench_now_ns() - t0) / 1e9;
    s->to_failed = cx_bench_dist(fails, nf);
    s->to_rejoin = cx_bench_dist(joins, nj);
    s->up_rejoin = cx_bench_dist(ups, nj);
    uint64_t other = 0, bad = 0;
    for (int k = 0; k < CX_SOAK_KINDS; k++)
        for (int r = 0; r < CX_SOAK_RESULTS; r++) s->ops[k][r] = atomic_load(&x.ops[k][r]);
    for (int k = 0; k < CX_SOAK_KINDS; k++) other += s->ops[k][CX_SOAK_OTHER], bad += s->ops[k][CX_SOAK_BADDATA];
    for (int i = 0; i < 16; i++) s->other_codes[i] = atomic_load(&x.codes[i]);
    if (!s->verdict[0]) {
        if (other)
            snprintf(s->verdict, sizeof s->verdict,
                     "FAIL: %" PRIu64 " ops ended otherwise than 0, "
                     "CX_EPEER or CX_ETIMEDOUT",
                     other);
        else if (bad)
            snprintf(s->verdict, sizeof s->verdict, "FAIL: %" PRIu64 " reads returned wrong data", bad);
        else if (s->fds_end > s->fds_warm + SOAK_FD_SLACK)
            snprintf(s->verdict, sizeof s->verdict, "FAIL: fds grew (%ld -> %ld)", s->fds_warm, s->fds_end);
        else if (s->rss_end > s->rss_warm + SOAK_RSS_SLACK_KIB)
            snprintf(s->verdict, sizeof s->verdict, "FAIL: RSS grew by %ld KiB", s->rss_end - s->rss_warm);
        else if (s->regions_end != s->regions_start || s->rbytes_end != s->rbytes_start)
            snprintf(s->verdict, sizeof s->verdict, "FAIL: registrations changed");
        else
            snprintf(s->verdict, sizeof s->verdict, "ok (flat)");
    }
out:
    unsetenv("CX_BENCH_PEER_ADDR");
    if (x.e) {
        if (buf != MAP_FAILED) cx_unregister_memory(x.e, buf);
        cx_engine_destroy(x.e);
    }
    if (buf != MAP_FAILED) munmap(buf, loclen);
    free(fails);
    free(joins);
    free(ups);
    free((void *)x.reg_ns);
}

/* The survivor in a process of its own: its result comes back through a pipe, a crash as the
 * signal that ended it. */
static void soak_isolated(const cx_bench_opts_t *o, const char *vname, cx_bench_soak_t *s)
{
    int p[2];
    if (pipe(p)) {
        soak_variant(o, vname, s);
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        soak_variant(o, vname, s);
        const char *b = (const char *)s;
        size_t left = sizeof *s;
        while (left) {
            ssize_t k = write(p[1], b, left);
            if (k <= 0) break;
            b += k, left -= (size_t)k;
        }
        _exit(0);
    }
    close(p[1]);
    memset(s, 0, sizeof *s);
    size_t got = 0;
    if (pid > 0) {
        while (got < sizeof *s) {
            ssize_t k = read(p[0], (char *)s + got, sizeof *s - got);
            if (k <= 0) break;
            got += (size_t)k;
        }
    }
    close(p[0]);
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    if (pid < 0 || got != sizeof *s) {
        memset(s, 0, sizeof *s);
        snprintf(s->backend, sizeof s->backend, "%s", vname);
        s->cycles = o->cycles;
        if (pid > 0 && WIFSIGNALED(st)) {
            s->crashed = WTERMSIG(st);
            snprintf(s->verdict, sizeof s->verdict, "FAIL: CRASH: the survivor died of signal %d (%s)", s->crashed,
                     strsignal(s->crashed));
        } else {
            /* A library's own fault handler (libfabric's, UCX's) prints a backtrace on stderr
             * and exits: a crash all the same. */
            s->crashed = -1;
            snprintf(s->verdict, sizeof s->verdict,
                     "FAIL: CRASH: the survivor exited (status %d) without a result "
                     "(a fault handler's backtrace on stderr?)",
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        }
    }
}

int cx_bench_soak(const cx_bench_opts_t *o)
{
    const cx_bench_variant_t *vs[16];
    int nv = cx_bench_variants(o->backend, vs, 16), bad = 0;
    if (nv < 0) return 2;
    for (int i = 0; i < nv; i++) {
        cx_bench_variant_env(vs[i], 1);
        cx_bench_soak_t s;
        soak_isolated(o, vs[i]->name, &s);
        cx_bench_variant_env(vs[i], 0);
        if (strncmp(s.verdict, "ok", 2) && strncmp(s.verdict, "skipped", 7)) bad = 1;
        cx_bench_add_soak(&s);
    }
    cx_bench_progress_done(o);
    printf("\nsoak: %d threads of reads, writes, put_signals and batches of %d async ops against a peer killed "
           "(SIGKILL) at a random moment and restarted; ops by result; fds and RSS at start/warm/end (max); "
           "times in ms p50/p99/max\n",
           SOAK_THREADS, SOAK_BATCH);
    cx_bench_print_soak();
    cx_bench_soak_json_line();
    if (o->json && cx_bench_write_json(o, o->json)) bad = 1;
    return bad;
}
