/* connex-demo: the loopback demo of the README.
 *
 * Two processes on 127.0.0.1: this one (the survivor) and a child (this program again, with
 * --child). It moves data with write, read and put_signal at a few sizes and checks every byte,
 * then kill -9s the child, reports the FAILED event and how long it took, restarts the child under
 * the same identity and port, reports JOINED and the time to the first good transfer, and prints
 * a summary table. Exit status 0 only when every step worked.
 *
 * Backend: CONNEX_BACKEND (auto, ucx, libfabric, zmq); default auto. Options: --quick (fewer
 * iterations, sizes up to 16 MiB). */
#include "connex/connex.h"
#include "stable_port.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REGION ((size_t)64 << 20)
#define MODEL "demo"

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Not periodic in i: a transfer that lands at a wrong offset cannot match. */
static inline uint8_t pat(uint32_t seed, uint64_t i)
{
    return (uint8_t)(((i ^ ((uint64_t)seed << 40)) * 0x9E3779B97F4A7C15ULL) >> 56);
}
static void fill(uint8_t *b, size_t n, uint32_t seed, uint64_t start)
{
    for (size_t i = 0; i < n; i++) b[i] = pat(seed, start + i);
}
static int check(const uint8_t *b, size_t n, uint32_t seed, uint64_t start)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != pat(seed, start + i)) return 0;
    return 1;
}
static uint64_t fnv(const uint8_t *b, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* ------------------------------------------------------------------ child */

static cx_engine_t *c_e;
static uint8_t *c_reg;
static atomic_int c_stop;

/* Verifies each put_signal message against memory as it arrives and answers "OK" or "BAD". */
static void *child_msgs(void *arg)
{
    (void)arg;
    while (!atomic_load(&c_stop)) {
        cx_msg_t m;
        if (cx_recv_msg(c_e, &m, 100)) continue;
        char txt[128];
        size_t n = m.len < sizeof txt - 1 ? m.len : sizeof txt - 1;
        memcpy(txt, m.data, n);
        txt[n] = 0;
        unsigned long long off, len, h;
        const char *ans = "BAD";
        if (sscanf(txt, "CHK %llu %llu %llx", &off, &len, &h) == 3 && off <= REGION && len <= REGION - off &&
            fnv(c_reg + off, len) == h)
            ans = "OK";
        cx_send_msg(c_e, m.from_url, ans, strlen(ans) + 1);
        cx_msg_release(&m);
    }
    return NULL;
}

static int child_main(uint16_t port, uint32_t seed, const char *parent)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = MODEL;
    c.stage = 1;
    c.port = port;
    int rc = cx_engine_create(&c, &c_e);
    if (rc) {
        fprintf(stderr, "child: engine: %s\n", cx_strerror(rc));
        return 1;
    }
    c_reg = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (c_reg == MAP_FAILED) return 1;
    fill(c_reg, REGION, seed, 0);
    if ((rc = cx_register_memory(c_e, c_reg, REGION))) {
        fprintf(stderr, "child: register: %s\n", cx_strerror(rc));
        return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, child_msgs, NULL);
    if (parent && (rc = cx_connect(c_e, parent, 5000)))
        fprintf(stderr, "child: connect %s: %s\n", parent, cx_strerror(rc));
    printf("READY %s %" PRIxPTR "\n", cx_engine_local_url(c_e), (uintptr_t)c_reg);
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {} /* until the parent closes our stdin */
    atomic_store(&c_stop, 1);
    pthread_join(t, NULL);
    cx_engine_destroy(c_e);
    return 0;
}

/* ------------------------------------------------------------------ parent */

typedef struct child {
    pid_t pid;
    int in, out;
    char url[CX_URL_MAX];
    uint64_t base;
    uint16_t port;
} child_t;

static int spawn(child_t *ch, const char *self, uint16_t port, uint32_t seed, const char *parent_url)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) return -1;
    char ps[16], ss[16];
    snprintf(ps, sizeof ps, "%u", port);
    snprintf(ss, sizeof ss, "%u", seed);
    pid_t me = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the demo */
        if (getppid() != me) _exit(1);
        dup2(in[0], 0);
        dup2(out[1], 1);
        execl(self, self, "--child", ps, ss, parent_url, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    ch->pid = pid;
    ch->in = in[1];
    ch->out = out[0];
    /* READY line, bounded wait. */
    char line[512];
    size_t len = 0;
    uint64_t deadline = now_ns() + 15000000000ull;
    while (len < sizeof line - 1 && !memchr(line, '\n', len)) {
        struct pollfd pf = { .fd = ch->out, .events = POLLIN };
        uint64_t t = now_ns();
        if (t >= deadline || poll(&pf, 1, (int)((deadline - t) / 1000000 + 1)) <= 0) break;
        ssize_t k = read(ch->out, line + len, sizeof line - 1 - len);
        if (k <= 0) break;
        len += (size_t)k;
    }
    line[len] = 0;
    unsigned long long base;
    if (sscanf(line, "READY %159s %llx", ch->url, &base) != 2) {
        fprintf(stderr, "demo: the child did not start (got '%s')\n", line);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    ch->base = base;
    cx_url_t u;
    if (cx_url_parse(ch->url, &u, NULL, 0) == 0) ch->port = u.port;
    return 0;
}

static void reap(child_t *ch, int sig)
{
    if (ch->pid <= 0) return;
    if (sig) kill(ch->pid, sig);
    close(ch->in);
    for (int i = 0; i < 500; i++) { /* 5 s, then SIGKILL */
        if (waitpid(ch->pid, NULL, WNOHANG) == ch->pid) {
            ch->pid = -1;
            break;
        }
        usleep(10000);
    }
    if (ch->pid > 0) {
        kill(ch->pid, SIGKILL);
        waitpid(ch->pid, NULL, 0);
        ch->pid = -1;
    }
    close(ch->out);
}

static int wait_ev(cx_engine_t *e, cx_event_type_t type, int ms, cx_event_t *out)
{
    uint64_t deadline = now_ns() + (uint64_t)ms * 1000000ull;
    for (;;) {
        uint64_t t = now_ns();
        if (t >= deadline) return CX_ETIMEDOUT;
        cx_event_t ev;
        if (cx_wait_event(e, &ev, (int)((deadline - t) / 1000000 + 1))) continue;
        char lid[CX_URL_MAX];
        cx_lid_format(&ev.peer, lid, sizeof lid);
        printf("  event %-7s %-14s %s\n", cx_event_name(ev.type), lid, ev.reason);
        if (ev.type == type) {
            if (out) *out = ev;
            return CX_OK;
        }
    }
}

typedef struct row {
    char op[24];
    size_t size;
    int iters;
    double p50_us, gbps;
    char result[64];
} row_t;
static row_t rows[64];
static int nrows, failures;

static void add_row(const char *op, size_t size, int iters, double p50_us, const char *result)
{
    row_t *r = &rows[nrows++];
    snprintf(r->op, sizeof r->op, "%s", op);
    r->size = size;
    r->iters = iters;
    r->p50_us = p50_us;
    r->gbps = size && p50_us > 0 ? (double)size / (p50_us * 1e3) : 0;
    snprintf(r->result, sizeof r->result, "%s", result);
    if (strncmp(result, "ok", 2)) failures++;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static const char *human(size_t n, char *buf, size_t len)
{
    if (n >= (1u << 20) && n % (1u << 20) == 0)
        snprintf(buf, len, "%zu MiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0)
        snprintf(buf, len, "%zu KiB", n >> 10);
    else
        snprintf(buf, len, "%zu B", n);
    return buf;
}

/* Asks the child to hash [off, off+len) of its region and compare with h: "OK" or "BAD".
 * 0 when the child answered OK. */
static int child_check(cx_engine_t *e, const child_t *ch, size_t off, size_t len, uint64_t h, const char **why)
{
    char msg[96];
    snprintf(msg, sizeof msg, "CHK %zu %zu %" PRIx64, off, len, h);
    if (cx_send_msg(e, ch->url, msg, strlen(msg))) {
        *why = "check request not sent";
        return -1;
    }
    cx_msg_t m;
    if (cx_recv_msg(e, &m, 10000)) {
        *why = "no check reply";
        return -1;
    }
    int ok = m.len >= 2 && !memcmp(m.data, "OK", 2);
    cx_msg_release(&m);
    if (!ok) *why = "peer's memory differs";
    return ok ? 0 : -1;
}

/* One op kind at one size: iters timed ops, every one verified outside its timing. Each write and
 * put_signal sends a pattern of its own (seeded per op), checked in the child's memory (a write
 * by a message after it, a put_signal when its message arrives); each read lands in a buffer
 * filled with a sentinel first and is compared with the child's pattern. Offsets differ per op. */
static void bench(cx_engine_t *e, const child_t *ch, uint8_t *loc, int kind, size_t size, int iters,
                  uint32_t child_seed)
{
    static const char *names[] = { "write", "read", "put_signal" };
    static uint32_t op_seed = 1000; /* never the child's seed: a fresh pattern per op */
    uint64_t *t = calloc((size_t)iters, sizeof *t);
    const char *res = "ok";
    char why[96];
    for (int i = 0; i < iters && t; i++) {
        size_t off = ((size_t)i * 4096) % (REGION - size + 1);
        int rc;
        char msg[96];
        if (kind == 1) {
            memset(loc + off, 0xA5, size);
        } else {
            fill(loc + off, size, op_seed++, off);
            snprintf(msg, sizeof msg, "CHK %zu %zu %" PRIx64, off, size, fnv(loc + off, size));
        }
        uint64_t t0 = now_ns();
        if (kind == 0) {
            rc = cx_write(e, ch->url, loc + off, ch->base + off, size);
        } else if (kind == 1) {
            rc = cx_read(e, ch->url, loc + off, ch->base + off, size);
        } else {
            cx_op_t *op = NULL;
            rc = cx_put_signal(e, ch->url, loc + off, ch->base + off, size, msg, strlen(msg), &op);
            if (rc == CX_OK) rc = cx_op_wait(op, -1);
        }
        t[i] = now_ns() - t0;
        if (rc) {
            snprintf(why, sizeof why, "FAIL: op %d: %s", i, cx_strerror(rc));
            res = why;
            break;
        }
        const char *bad = NULL;
        if (kind == 0) {
            child_check(e, ch, off, size, fnv(loc + off, size), &bad);
        } else if (kind == 1) {
            if (!check(loc + off, size, child_seed, off)) bad = "data differs";
        } else {
            /* The child checked the bytes when the signal arrived. */
            cx_msg_t m;
            if (cx_recv_msg(e, &m, 10000)) {
                bad = "no check reply";
            } else {
                if (m.len < 2 || memcmp(m.data, "OK", 2)) bad = "data not in place when the signal arrived";
                cx_msg_release(&m);
            }
        }
        if (bad) {
            snprintf(why, sizeof why, "FAIL: op %d: %s", i, bad);
            res = why;
            break;
        }
    }
    if (!strcmp(res, "ok"))
        res = kind == 0 ? "ok (checked at the peer)" : kind == 1 ? "ok (verified)" : "ok (checked on arrival)";
    double p50 = 0;
    if (t && strncmp(res, "FAIL", 4)) {
        qsort(t, (size_t)iters, sizeof *t, cmp_u64);
        p50 = (double)t[iters / 2] / 1e3;
    }
    add_row(names[kind], size, iters, p50, res);
    if (!strncmp(res, "FAIL", 4)) {
        char hs[32];
        fprintf(stderr, "demo: %s %s failed verification: %s\n", names[kind], human(size, hs, sizeof hs), res);
    }
    free(t);
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "--child"))
        return child_main((uint16_t)atoi(argv[2]), (uint32_t)atoi(argv[3]), argc > 4 ? argv[4] : NULL);
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    signal(SIGPIPE, SIG_IGN);
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        perror("readlink /proc/self/exe");
        return 1;
    }
    self[sl] = 0;

    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = MODEL;
    cx_engine_t *e;
    int rc = cx_engine_create(&c, &e);
    if (rc) {
        fprintf(stderr, "demo: engine: %s\n", cx_strerror(rc));
        return 1;
    }
    const char *be = getenv("CONNEX_BACKEND");
    printf("connex-demo: survivor %s, backends opened: %s (CONNEX_BACKEND=%s)\n", cx_engine_local_url(e),
           cx_engine_backends(e), be && *be ? be : "auto");
    /* Two halves: source/destination of the measured ops, and the first read after the rejoin. */
    uint8_t *loc = mmap(NULL, 2 * REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (loc == MAP_FAILED) return 1;
    fill(loc, REGION, 77, 0);
    if ((rc = cx_register_memory(e, loc, 2 * REGION))) {
        fprintf(stderr, "demo: register: %s\n", cx_strerror(rc));
        return 1;
    }

    child_t ch = { 0 };
    uint32_t seed = 5;
    uint64_t t0 = now_ns();
    /* The child comes back on this port after its kill -9: see stable_port.h. */
    if (spawn(&ch, self, cx_bench_stable_port(NULL), seed, cx_engine_local_url(e))) return 1;
    if (wait_ev(e, CX_EVENT_UP, 5000, NULL)) {
        fprintf(stderr, "demo: no UP from the child\n");
        failures++;
    }
    printf("child %d up at %s after %.1f ms, pair backend %s\n", (int)ch.pid, ch.url, (now_ns() - t0) / 1e6,
           cx_peer_backend(e, ch.url) ? cx_peer_backend(e, ch.url) : "?");

    static const size_t sizes[] = { 4096, 65536, 1u << 20, 16u << 20, 64u << 20 };
    static const int iters[] = { 200, 100, 30, 6, 3 };
    int nsizes = quick ? 4 : 5;
    /* Reads first: writes overwrite the child's pattern that reads verify against. */
    static const int order[3] = { 1, 0, 2 };
    for (int k = 0; k < 3; k++) {
        for (int s = 0; s < nsizes; s++) {
            int it = quick ? (iters[s] + 3) / 4 : iters[s];
            bench(e, &ch, loc, order[k], sizes[s], it, seed);
        }
    }

    /* ---- kill -9 ---- */
    printf("kill -9 %d\n", (int)ch.pid);
    uint64_t tk = now_ns();
    kill(ch.pid, SIGKILL);
    cx_event_t ev;
    rc = wait_ev(e, CX_EVENT_FAILED, 5000, &ev);
    double fail_ms = (now_ns() - tk) / 1e6;
    reap(&ch, 0);
    char res[64];
    if (rc)
        snprintf(res, sizeof res, "FAIL: no event in 5 s");
    else
        snprintf(res, sizeof res, "ok (%.40s)", ev.reason);
    add_row("kill -9 -> FAILED", 0, 1, rc ? 0 : fail_ms * 1e3, res);
    rc = cx_read(e, ch.url, loc, ch.base, 4096);
    add_row("op to dead peer", 4096, 1, 0, rc == CX_EPEER ? "ok (CX_EPEER)" : "FAIL: not CX_EPEER");

    /* ---- restart under the same identity and port ---- */
    uint64_t tr = now_ns();
    seed = 6;
    char old_url[CX_URL_MAX];
    snprintf(old_url, sizeof old_url, "%s", ch.url);
    if (spawn(&ch, self, ch.port, seed, NULL)) {
        add_row("restart -> JOINED", 0, 1, 0, "FAIL: child did not restart");
    } else {
        rc = wait_ev(e, CX_EVENT_JOINED, 8000, &ev);
        double join_ms = (now_ns() - tr) / 1e6;
        add_row("restart -> JOINED", 0, 1, rc ? 0 : join_ms * 1e3,
                rc                            ? "FAIL: no JOINED in 8 s"
                    : strcmp(ch.url, old_url) ? "FAIL: other URL"
                                              : "ok (same LID, port)");
        memset(loc + REGION, 0xA5, 1u << 20);
        rc = cx_read(e, ch.url, loc + REGION, ch.base, 1u << 20);
        double first_ms = (now_ns() - tr) / 1e6;
        int ok = rc == CX_OK && check(loc + REGION, 1u << 20, seed, 0);
        add_row("first read after", 1u << 20, 1, first_ms * 1e3, ok ? "ok (new process's data)" : "FAIL");
        reap(&ch, 0); /* clean close: stdin EOF, the child sends BYE */
        rc = wait_ev(e, CX_EVENT_LEFT, 5000, NULL);
        add_row("clean close -> LEFT", 0, 1, 0, rc ? "FAIL: no LEFT" : "ok");
    }

    cx_stats_t st;
    cx_stats(e, &st);
    printf("\n%-20s %9s %6s %12s %10s  %s\n", "operation", "size", "iters", "p50", "GB/s", "result");
    printf("%-20s %9s %6s %12s %10s  %s\n", "--------------------", "---------", "------", "------------", "----------",
           "------------------------");
    for (int i = 0; i < nrows; i++) {
        char sz[32] = "-", lat[32] = "-", bw[32] = "-";
        if (rows[i].size) human(rows[i].size, sz, sizeof sz);
        if (rows[i].p50_us > 0) {
            if (rows[i].p50_us >= 10000)
                snprintf(lat, sizeof lat, "%.1f ms", rows[i].p50_us / 1e3);
            else
                snprintf(lat, sizeof lat, "%.1f us", rows[i].p50_us);
        }
        if (rows[i].gbps > 0 && rows[i].iters > 1) snprintf(bw, sizeof bw, "%.3f", rows[i].gbps);
        printf("%-20s %9s %6d %12s %10s  %s\n", rows[i].op, sz, rows[i].iters, lat, bw, rows[i].result);
    }
    printf("\nsurvivor incarnation %016" PRIx64 " unchanged; peer failures %" PRIu64 ", joins %" PRIu64 "; %s\n",
           cx_engine_incarnation(e), st.peer_failures, st.peer_joins, failures ? "SOME STEPS FAILED" : "all steps ok");
    cx_unregister_memory(e, loc);
    cx_engine_destroy(e);
    munmap(loc, 2 * REGION);
    return failures ? 1 : 0;
}
