/* connex-bench failover: per backend variant, a peer process is (a) killed with SIGKILL, (b)
 * stopped with SIGSTOP, (c) cut off by taking its veth down (root only), each while a thread
 * keeps a read in flight to it. Measured per run: fault -> first event (FAILED for SIGKILL,
 * SUSPECT otherwise) and -> FAILED, fault -> the in-flight read returned, and after a restart
 * under the same identity and port, process start (and engine up) -> first good transfer after
 * JOINED. Event times are the engine's own CLOCK_MONOTONIC stamps. */
#include "bench.h"
#include "bench_netns.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define FO_REGION ((size_t)4 << 20)
#define FO_XFER ((size_t)1 << 20)

enum { F_KILL, F_STOP, F_LINK };
static const char *fault_names[] = { "sigkill", "sigstop", "linkdown" };

typedef struct inflight {
    cx_engine_t *e;
    const char *url;
    uint64_t base;
    uint8_t *buf;
    atomic_int started, done;
    int rc;
    uint64_t t_ret;
} inflight_t;

static void *inflight_main(void *arg)
{
    inflight_t *f = arg;
    for (;;) {
        int rc = cx_read(f->e, f->url, f->buf, f->base, FO_XFER);
        atomic_store(&f->started, 1);
        if (rc) {
            f->t_ret = cx_bench_now_ns();
            f->rc = rc;
            atomic_store(&f->done, 1);
            return NULL;
        }
    }
}

/* Events until FAILED (bounded), noting when SUSPECT came first. */
static int wait_failed(cx_engine_t *e, int ms, uint64_t *t_suspect, uint64_t *t_failed)
{
    uint64_t deadline = cx_bench_now_ns() + (uint64_t)ms * 1000000ull;
    *t_suspect = 0;
    while (cx_bench_now_ns() < deadline) {
        cx_event_t ev;
        if (cx_wait_event(e, &ev, 50)) continue;
        uint64_t t = ev.time_ns ? ev.time_ns : cx_bench_now_ns();
        if (ev.type == CX_EVENT_SUSPECT && !*t_suspect) *t_suspect = t;
        if (ev.type == CX_EVENT_FAILED) {
            *t_failed = t;
            return 0;
        }
    }
    return CX_ETIMEDOUT;
}

typedef struct samples {
    uint64_t ev[1024], fail[1024], ops[1024], rejoin[1024], uprejoin[1024];
    int n[5];
} samples_t;

static void push(uint64_t *a, int *n, uint64_t v)
{
    if (*n < 1024) a[(*n)++] = v;
}

/* All runs of one fault on the current variant. listen_ip/netns set for the link-down case. */
static void scenario(const cx_bench_opts_t *o, const char *vname, int fault, const char *listen_ip,
                     const cx_bench_netns_t *ns, cx_bench_fo_row_t *row)
{
    memset(row, 0, sizeof *row);
    snprintf(row->backend, sizeof row->backend, "%s", vname);
    snprintf(row->fault, sizeof row->fault, "%s", fault_names[fault]);
    row->runs = o->runs;
    samples_t *s = calloc(1, sizeof *s);
    cx_engine_t *e = NULL;
    uint8_t *buf = mmap(NULL, 2 * FO_XFER, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int rc = cx_bench_engine(&e, listen_ip, o->hb_ms, o->hb_timeout_ms, 10000);
    if (rc || !s || buf == MAP_FAILED) {
        snprintf(row->note, sizeof row->note, "skipped: engine: %s", cx_strerror(rc ? rc : CX_ENOMEM));
        goto out;
    }
    cx_register_memory(e, buf, 2 * FO_XFER);
    cx_bench_child_opts_t co = { .listen_ip = ns ? CX_BENCH_NS_IP_B : NULL,
                                 .region = FO_REGION,
                                 .seed = 3,
                                 .connect = cx_engine_local_url(e),
                                 .hb_ms = o->hb_ms,
                                 .hb_timeout_ms = o->hb_timeout_ms,
                                 .netns = ns ? ns->ns_b : NULL };
    cx_bench_child_t ch = { .pid = -1, .in = -1, .out = -1 };
    if (cx_bench_spawn(o, &ch, &co) || cx_connect(e, ch.url, 10000)) {
        snprintf(row->note, sizeof row->note, "FAIL: first peer did not come up");
        if (ch.pid > 0) cx_bench_stop(&ch);
        goto out;
    }
    co.port = ch.port; /* restarts reuse the identity and the port */
    char last_rc[48] = "";
    int fail_wait_ms = (int)(o->hb_timeout_ms * 3 + 5000);
    for (int r = 0; r < o->runs; r++) {
        cx_bench_progress(o, "failover %-14s %-8s run %d/%d", vname, fault_names[fault], r + 1, o->runs);
        inflight_t f = { .e = e, .url = ch.url, .base = ch.base, .buf = buf };
        pthread_t th;
        pthread_create(&th, NULL, inflight_main, &f);
        for (int i = 0; i < 500 && !atomic_load(&f.started); i++) usleep(2000);
        usleep(5000);
        uint64_t tf = cx_bench_now_ns();
        if (fault == F_KILL)
            kill(ch.pid, SIGKILL);
        else if (fault == F_STOP)
            kill(ch.pid, SIGSTOP);
        else
            cx_bench_netns_link(ns, 0);
        uint64_t ts = 0, tfail = 0;
        int ok = wait_failed(e, fail_wait_ms, &ts, &tfail) == 0;
        if (ok) {
            push(s->fail, &s->n[1], tfail - tf);
            if (fault == F_KILL)
                push(s->ev, &s->n[0], tfail - tf);
            else if (ts)
                push(s->ev, &s->n[0], ts - tf);
            else
                snprintf(row->note, sizeof row->note, "FAILED without SUSPECT first");
        } else {
            snprintf(row->note, sizeof row->note, "FAIL: no FAILED within %d ms", fail_wait_ms);
        }
        /* The in-flight read must come back on its own (bounded by the op timeout). */
        for (int i = 0; i < 1500 && !atomic_load(&f.done); i++) usleep(10000);
        if (!atomic_load(&f.done)) {
            snprintf(row->note, sizeof row->note, "FAIL: in-flight read did not return in 15 s");
            kill(ch.pid, SIGKILL); /* gives the read its CX_EPEER so the thread can be joined */
            ok = 0;
        } else {
            push(s->ops, &s->n[2], f.t_ret > tf ? f.t_ret - tf : 0);
            snprintf(last_rc, sizeof last_rc, "in-flight read: %s", cx_strerror(f.rc));
        }
        pthread_join(th, NULL);
        if (fault != F_KILL) kill(ch.pid, SIGKILL);
        cx_bench_reap(&ch);
        if (fault == F_LINK) cx_bench_netns_link(ns, 1);
        /* Restart under the same identity; the first transfer after JOINED. */
        if (cx_bench_spawn(o, &ch, &co)) {
            snprintf(row->note, sizeof row->note, "FAIL: restart did not start");
            break;
        }
        cx_event_t ev;
        if (cx_bench_wait_event(e, CX_EVENT_JOINED, 10000, &ev)) {
            snprintf(row->note, sizeof row->note, "FAIL: no JOINED within 10 s of restart");
            ok = 0;
        }
        int xrc = -1;
        uint64_t t_ok = 0, dl = cx_bench_now_ns() + 5000000000ull;
        while (xrc && cx_bench_now_ns() < dl) {
            xrc = cx_read(e, ch.url, buf + FO_XFER, ch.base, 4096);
            if (xrc) usleep(1000);
        }
        t_ok = cx_bench_now_ns();
        if (xrc || !cx_bench_check(buf + FO_XFER, 4096, 3, 0)) {
            snprintf(row->note, sizeof row->note, "FAIL: no good transfer after rejoin (%s)", cx_strerror(xrc));
            ok = 0;
        } else {
            push(s->rejoin, &s->n[3], t_ok - ch.t_spawn_ns);
            push(s->uprejoin, &s->n[4], t_ok > ch.t_engine_ns ? t_ok - ch.t_engine_ns : 0);
        }
        cx_event_t junk;
        while (cx_wait_event(e, &junk, 0) == 0) {}
        row->ok += ok;
    }
    if (ch.pid > 0) cx_bench_stop(&ch);
    row->to_event = cx_bench_dist(s->ev, s->n[0]);
    row->to_failed = cx_bench_dist(s->fail, s->n[1]);
    row->to_ops = cx_bench_dist(s->ops, s->n[2]);
    row->to_rejoin = cx_bench_dist(s->rejoin, s->n[3]);
    row->up_rejoin = cx_bench_dist(s->uprejoin, s->n[4]);
    if (!row->note[0]) snprintf(row->note, sizeof row->note, "%s", last_rc);
out:
    if (e) {
        if (buf != MAP_FAILED) cx_unregister_memory(e, buf);
        cx_engine_destroy(e);
    }
    if (buf != MAP_FAILED) munmap(buf, 2 * FO_XFER);
    free(s);
}

/* The link-down runs happen in a forked process that entered ns_a; the row comes back through
 * a pipe (a plain struct between two copies of the same program). */
static void linkdown(const cx_bench_opts_t *o, const char *vname, const cx_bench_netns_t *ns, cx_bench_fo_row_t *row)
{
    int p[2];
    memset(row, 0, sizeof *row);
    snprintf(row->backend, sizeof row->backend, "%s", vname);
    snprintf(row->fault, sizeof row->fault, "linkdown");
    row->runs = o->runs;
    if (pipe(p)) {
        snprintf(row->note, sizeof row->note, "FAIL: pipe");
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        cx_bench_fo_row_t r;
        if (cx_bench_netns_enter(ns)) {
            r = *row;
            snprintf(r.note, sizeof r.note, "FAIL: setns into %s", ns->ns_a);
        } else {
            scenario(o, vname, F_LINK, CX_BENCH_NS_IP_A, ns, &r);
        }
        ssize_t w = write(p[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1); /* not exit(): the namespaces belong to the parent */
    }
    close(p[1]);
    ssize_t got = pid > 0 ? read(p[0], row, sizeof *row) : -1;
    close(p[0]);
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    cx_bench_netns_link(ns, 1); /* a helper that died mid-run leaves the link down */
    if (got != (ssize_t)sizeof *row) {
        memset(row, 0, sizeof *row);
        snprintf(row->backend, sizeof row->backend, "%s", vname);
        snprintf(row->fault, sizeof row->fault, "linkdown");
        row->runs = o->runs;
        snprintf(row->note, sizeof row->note, "FAIL: the namespace run died (%s %d)",
                 WIFSIGNALED(st) ? "signal" : "exit status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
}

static int row_bad(const cx_bench_fo_row_t *r)
{
    return !strncmp(r->note, "FAIL", 4) || (strncmp(r->note, "skipped", 7) && r->ok != r->runs);
}

int cx_bench_failover(const cx_bench_opts_t *o)
{
    const cx_bench_variant_t *vs[16];
    int nv = cx_bench_variants(o->backend, vs, 16), bad = 0;
    if (nv < 0) return 2;
    cx_bench_netns_t ns;
    char why[128] = "";
    int have_ns = (o->faults & (1u << F_LINK)) && cx_bench_netns_setup(&ns, why, sizeof why) == 0;
    if (!have_ns && (o->faults & (1u << F_LINK))) fprintf(stderr, "connex-bench: link-down fault %s\n", why);
    for (int i = 0; i < nv; i++) {
        cx_bench_variant_env(vs[i], 1);
        cx_bench_fo_row_t row;
        for (int f = F_KILL; f <= F_LINK; f++) {
            if (!(o->faults & (1u << f))) continue;
            if (f == F_LINK && (!have_ns || vs[i]->shm)) {
                /* Two processes of one host that share memory stay connected whatever happens to
                 * a link: taking the veth down cuts only the control channel, and the numbers
                 * would be those of namespace artifacts (UCX's FIFO wake-ups go through unix
                 * sockets, which do not cross network namespaces), not of a partition. */
                memset(&row, 0, sizeof row);
                snprintf(row.backend, sizeof row.backend, "%s", vs[i]->name);
                snprintf(row.fault, sizeof row.fault, "linkdown");
                snprintf(row.note, sizeof row.note, "%s", vs[i]->shm ? "skipped: shared memory crosses no link" : why);
            } else if (f == F_LINK) {
                linkdown(o, vs[i]->name, &ns, &row);
            } else {
                scenario(o, vs[i]->name, f, NULL, NULL, &row);
            }
            bad |= row_bad(&row);
            cx_bench_add_fo(&row);
        }
        cx_bench_variant_env(vs[i], 0);
    }
    cx_bench_netns_cleanup();
    cx_bench_progress_done(o);
    printf("\nfailover: heartbeat %u ms, timeout %u ms (SUSPECT expected one interval before FAILED); %d runs each\n",
           o->hb_ms, o->hb_timeout_ms, o->runs);
    cx_bench_print_failover();
    cx_bench_print_targets(o->hb_ms, o->hb_timeout_ms);
    if (o->json && cx_bench_write_json(o, o->json)) bad = 1;
    return bad;
}
