/* The peer side of every measurement: this program re-exec'd with --child (or started by hand as
 * `connex-bench serve` on another host). It registers one region filled with a known pattern,
 * answers messages (INFO: where the region is; COUNT: how many other messages arrived; FILL: the
 * pattern written again; CHK: does a range hold a given pattern, asked after a write; PSIG: a
 * put_signal's message, its range checked as it arrives and the verdict sent back) and lives until its stdin closes (child) or until
 * SIGINT/SIGTERM (serve). */
#include "bench.h"
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
#include <unistd.h>

int cx_bench_engine(cx_engine_t **e, const char *listen_ip, uint32_t hb_ms, uint32_t hb_to_ms, uint32_t op_to_ms)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = CX_BENCH_MODEL;
    c.listen_ip = listen_ip;
    c.heartbeat_ms = hb_ms;
    c.heartbeat_timeout_ms = hb_to_ms;
    c.op_timeout_ms = op_to_ms;
    return cx_engine_create(&c, e);
}

int cx_bench_wait_event(cx_engine_t *e, cx_event_type_t type, int ms, cx_event_t *out)
{
    uint64_t deadline = cx_bench_now_ns() + (uint64_t)ms * 1000000ull;
    for (;;) {
        uint64_t t = cx_bench_now_ns();
        if (t >= deadline) return CX_ETIMEDOUT;
        cx_event_t ev;
        if (cx_wait_event(e, &ev, (int)((deadline - t) / 1000000 + 1))) continue;
        if (ev.type == type) {
            if (out) *out = ev;
            return CX_OK;
        }
    }
}

/* ------------------------------------------------------------------ peer process */

typedef struct peer {
    cx_engine_t *e;
    uint8_t *reg;
    size_t len;
    uint32_t seed;
    int mem;         /* CX_MEM_* of reg */
    uint8_t *shadow; /* device memory: the host copy that fills and checks go through */
    atomic_int stop;
} peer_t;

/* The pattern into the region: through the host copy when it is device memory. */
static int peer_fill(peer_t *p)
{
    if (!p->shadow) {
        cx_bench_fill(p->reg, p->len, p->seed);
        return CX_OK;
    }
    cx_bench_fill(p->shadow, p->len, p->seed);
    return cx_mem_copy(p->reg, p->shadow, p->len);
}

/* CHK/PSIG OFF LEN SEED: does [OFF, OFF+LEN) of the region hold cx_bench_fill's pattern of SEED? */
static int peer_check(const peer_t *p, const char *args, unsigned long long *off, unsigned long long *len)
{
    unsigned seed;
    if (sscanf(args, "%llu %llu %u", off, len, &seed) != 3 || *off % 8 || *off > p->len || *len > p->len - *off)
        return 0;
    if (p->shadow && cx_mem_copy(p->shadow + *off, p->reg + *off, (size_t)*len)) return 0;
    return cx_bench_check((p->shadow ? p->shadow : p->reg) + *off, (size_t)*len, seed, (size_t)*off);
}

static void *peer_msgs(void *arg)
{
    peer_t *p = arg;
    uint64_t count = 0;
    while (!atomic_load(&p->stop)) {
        cx_msg_t m;
        if (cx_recv_msg(p->e, &m, 100)) continue;
        char ans[128] = "", txt[96];
        snprintf(txt, sizeof txt, "%.*s", (int)(m.len < sizeof txt ? m.len : sizeof txt - 1), (const char *)m.data);
        if (m.len == 4 && !memcmp(m.data, "INFO", 4))
            snprintf(ans, sizeof ans, "INFO %" PRIxPTR " %zu %u", (uintptr_t)p->reg, p->len, p->seed);
        else if (m.len == 5 && !memcmp(m.data, "COUNT", 5))
            snprintf(ans, sizeof ans, "COUNT %" PRIu64, count);
        else if (m.len == 4 && !memcmp(m.data, "FILL", 4)) {
            int rc = peer_fill(p); /* the pattern back, after writes */
            snprintf(ans, sizeof ans, rc ? "FILL failed" : "FILL done");
        } else if (!strncmp(txt, "CHK ", 4) || !strncmp(txt, "PSIG ", 5)) {
            /* A write's bytes (CHK, asked after it) or a put_signal's (PSIG, its own message,
             * checked as it arrives: the data must be in place before the signal). */
            unsigned long long off = 0, len = 0;
            int psig = txt[0] == 'P';
            int ok = peer_check(p, txt + (psig ? 5 : 4), &off, &len);
            if (psig) count++;
            snprintf(ans, sizeof ans, "%s %s %llu %llu", psig ? "PSIG" : "CHK", ok ? "ok" : "bad", off, len);
        } else
            count++;
        if (*ans) {
            int rc = cx_send_msg(p->e, m.from_url, ans, strlen(ans) + 1);
            if (rc) fprintf(stderr, "connex-bench peer: reply to %s: %s\n", m.from_url, cx_strerror(rc));
        }
        cx_msg_release(&m);
    }
    return NULL;
}

/* Events nobody reads would only be dropped; reading them keeps the engine's counters clean. */
static void *peer_events(void *arg)
{
    peer_t *p = arg;
    while (!atomic_load(&p->stop)) {
        cx_event_t ev;
        cx_wait_event(p->e, &ev, 100);
    }
    return NULL;
}

/* extra: small regions registered after the main one (serve --extra-regions), as a serving
 * process registers each layer's K and V: the peer's lookup of the main one must not slow. */
static int run_peer(const char *listen_ip, uint16_t port, size_t region, uint32_t seed, const char *connect,
                    uint32_t hb, uint32_t hbto, int serve, int extra, int mem)
{
    peer_t p;
    memset(&p, 0, sizeof p);
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = CX_BENCH_MODEL;
    c.stage = 1;
    c.listen_ip = listen_ip;
    c.port = port;
    c.heartbeat_ms = hb;
    c.heartbeat_timeout_ms = hbto;
    int rc = cx_engine_create(&c, &p.e);
    if (rc) {
        fprintf(stderr, "connex-bench peer: engine: %s\n", cx_strerror(rc));
        return 1;
    }
    uint64_t t_engine = cx_bench_now_ns();
    p.len = region;
    p.seed = seed;
    p.mem = mem;
    /* CX_BENCH_PEER_ADDR (hex): the region at that address, so a restarted peer's remote
     * addresses stay what the survivor's threads already use (soak); elsewhere if it is taken. */
    const char *fixed = getenv("CX_BENCH_PEER_ADDR");
    void *want = fixed && *fixed ? (void *)(uintptr_t)strtoull(fixed, NULL, 16) : NULL;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_FIXED_NOREPLACE
    if (want) flags |= MAP_FIXED_NOREPLACE;
#endif
    if (mem != CX_MEM_HOST) {
        /* Device memory (transfer --mem): the region where the requested device allocates it. */
        void *d = NULL;
        p.shadow = malloc(region);
        if (!p.shadow || (rc = cx_mem_alloc(mem, 0, region, &d))) {
            fprintf(stderr, "connex-bench peer: %zu bytes of %s memory: %s\n", region, cx_bench_mem_name(mem),
                    cx_strerror(p.shadow ? rc : CX_ENOMEM));
            return 1;
        }
        p.reg = d;
    } else {
        p.reg = mmap(want, region, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (p.reg == MAP_FAILED && want)
            p.reg = mmap(NULL, region, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p.reg == MAP_FAILED) {
            perror("connex-bench peer: mmap");
            return 1;
        }
    }
    if ((rc = peer_fill(&p))) {
        fprintf(stderr, "connex-bench peer: fill: %s\n", cx_strerror(rc));
        return 1;
    }
    if ((rc = cx_register_memory(p.e, p.reg, region))) {
        fprintf(stderr, "connex-bench peer: register %zu bytes: %s\n", region, cx_strerror(rc));
        return 1;
    }
    uint64_t t_registered = cx_bench_now_ns();
    uint8_t *xm = NULL;
    if (extra > 0) {
        xm = mmap(NULL, (size_t)extra * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (xm == MAP_FAILED) {
            perror("connex-bench peer: mmap");
            return 1;
        }
        for (int i = 0; i < extra; i++)
            if ((rc = cx_register_memory(p.e, xm + (size_t)i * 4096, 4096))) {
                fprintf(stderr, "connex-bench peer: extra region %d: %s\n", i, cx_strerror(rc));
                return 1;
            }
    }
    pthread_t tm, te;
    pthread_create(&tm, NULL, peer_msgs, &p);
    pthread_create(&te, NULL, peer_events, &p);
    if (connect && (rc = cx_connect(p.e, connect, 5000)))
        fprintf(stderr, "connex-bench peer: connect %s: %s\n", connect, cx_strerror(rc));
    printf("READY %s %" PRIxPTR " %zu %" PRIu64 " %" PRIu64 "\n", cx_engine_local_url(p.e), (uintptr_t)p.reg, region,
           t_engine, t_registered);
    fflush(stdout);
    if (serve) {
        sigset_t ss;
        sigemptyset(&ss);
        sigaddset(&ss, SIGINT);
        sigaddset(&ss, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &ss, NULL);
        int sig;
        sigwait(&ss, &sig);
    } else {
        char buf[64];
        while (read(0, buf, sizeof buf) > 0) {} /* until the bench closes our stdin */
    }
    atomic_store(&p.stop, 1);
    pthread_join(tm, NULL);
    pthread_join(te, NULL);
    cx_unregister_memory(p.e, p.reg);
    for (int i = 0; i < extra; i++) cx_unregister_memory(p.e, xm + (size_t)i * 4096);
    cx_engine_destroy(p.e);
    if (p.shadow) {
        cx_mem_free(p.reg);
        free(p.shadow);
    } else
        munmap(p.reg, region);
    if (xm) munmap(xm, (size_t)extra * 4096);
    return 0;
}

/* --child <port> <listen ip|-> <region> <seed> <connect url|-> <hb ms> <hb timeout ms> <mem> */
int cx_bench_child_main(int argc, char **argv)
{
    int mem = argc == 10 ? cx_bench_parse_mem(argv[9]) : -1;
    if (mem < 0) {
        fprintf(stderr, "connex-bench --child: 8 arguments expected\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the bench */
    signal(SIGPIPE, SIG_IGN);
    const char *ip = strcmp(argv[3], "-") ? argv[3] : NULL;
    const char *conn = strcmp(argv[6], "-") ? argv[6] : NULL;
    return run_peer(ip, (uint16_t)atoi(argv[2]), strtoull(argv[4], NULL, 10), (uint32_t)atoi(argv[5]), conn,
                    (uint32_t)atoi(argv[7]), (uint32_t)atoi(argv[8]), 0, 0, mem);
}

int cx_bench_serve_main(const cx_bench_opts_t *o, int argc, char **argv)
{
    const char *ip = NULL;
    uint16_t port = 0;
    size_t region = o->nsizes ? o->sizes[o->nsizes - 1] : (size_t)64 << 20;
    int extra = 0, mem = CX_MEM_HOST;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--listen") && i + 1 < argc)
            ip = argv[++i];
        else if (!strcmp(argv[i], "--port") && i + 1 < argc)
            port = (uint16_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--region") && i + 1 < argc) {
            if (cx_bench_parse_size(argv[++i], &region)) {
                fprintf(stderr, "connex-bench serve: bad --region\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--extra-regions") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 100000) {
                fprintf(stderr, "connex-bench serve: --extra-regions 0..100000\n");
                return 2;
            }
            extra = (int)v;
        } else if (!strcmp(argv[i], "--mem") && i + 1 < argc) {
            if ((mem = cx_bench_parse_mem(argv[++i])) < 0) {
                fprintf(stderr, "connex-bench serve: --mem host, sim or cuda\n");
                return 2;
            }
        }
    }
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr,
            "connex-bench serve: run `connex-bench transfer --peer <URL printed below>` elsewhere; "
            "Ctrl-C ends\n");
    return run_peer(ip, port, region, 1, NULL, o->hb_ms, o->hb_timeout_ms, 1, extra, mem);
}

/* ------------------------------------------------------------------ spawning */

int cx_bench_spawn(const cx_bench_opts_t *o, cx_bench_child_t *c, const cx_bench_child_opts_t *co)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC)) return -1;
    if (pipe2(out, O_CLOEXEC)) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    char port[16], region[32], seed[16], hb[16], hbto[16];
    /* Failover and soak restart the child on the port it first had: see stable_port.h. */
    snprintf(port, sizeof port, "%u", co->port || co->netns ? co->port : cx_bench_stable_port(co->listen_ip));
    snprintf(region, sizeof region, "%zu", co->region);
    snprintf(seed, sizeof seed, "%u", co->seed);
    snprintf(hb, sizeof hb, "%u", co->hb_ms);
    snprintf(hbto, sizeof hbto, "%u", co->hb_timeout_ms);
    const char *argv[16];
    int n = 0;
    if (co->netns) {
        argv[n++] = "ip";
        argv[n++] = "netns";
        argv[n++] = "exec";
        argv[n++] = co->netns;
    }
    argv[n++] = o->self;
    argv[n++] = "--child";
    argv[n++] = port;
    argv[n++] = co->listen_ip ? co->listen_ip : "-";
    argv[n++] = region;
    argv[n++] = seed;
    argv[n++] = co->connect ? co->connect : "-";
    argv[n++] = hb;
    argv[n++] = hbto;
    argv[n++] = cx_bench_mem_name(co->mem);
    argv[n] = NULL;
    pid_t me = getpid();
    c->t_spawn_ns = cx_bench_now_ns();
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != me) _exit(1);
        dup2(in[0], 0);
        dup2(out[1], 1);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->pid = pid;
    c->in = in[1];
    c->out = out[0];
    /* Libraries may print to stdout before READY (UCX logs there): lines are read until READY. */
    char line[512], *ready = NULL;
    size_t len = 0;
    uint64_t deadline = cx_bench_now_ns() + 20000000000ull; /* UCX start-up on a loaded box */
    while (!ready) {
        char *nl = memchr(line, '\n', len);
        if (nl) {
            *nl = 0;
            if (!strncmp(line, "READY ", 6)) {
                ready = line;
                break;
            }
            if (!o->quiet) fprintf(stderr, "peer: %s\n", line);
            len -= (size_t)(nl + 1 - line);
            memmove(line, nl + 1, len);
            continue;
        }
        if (len >= sizeof line - 1) len = 0; /* an overlong line is not READY */
        struct pollfd pf = { .fd = c->out, .events = POLLIN };
        uint64_t t = cx_bench_now_ns();
        if (t >= deadline) break;
        int pr = poll(&pf, 1, (int)((deadline - t) / 1000000 + 1));
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) break;
        ssize_t k = read(c->out, line + len, sizeof line - 1 - len);
        if (k <= 0) break;
        len += (size_t)k;
    }
    unsigned long long base, rlen, te, tr = 0;
    if (!ready || sscanf(ready, "READY %159s %llx %llu %llu %llu", c->url, &base, &rlen, &te, &tr) < 4) {
        fprintf(stderr, "connex-bench: the peer process did not send READY within 20 s\n");
        kill(pid, SIGKILL);
        cx_bench_reap(c);
        return -1;
    }
    c->base = base;
    c->len = (size_t)rlen;
    c->t_engine_ns = te;
    c->t_registered_ns = tr;
    cx_url_t u;
    if (cx_url_parse(c->url, &u, NULL, 0) == 0) {
        c->port = u.port;
        cx_lid_format(&u.lid, c->lid, sizeof c->lid);
    }
    return 0;
}

void cx_bench_reap(cx_bench_child_t *c)
{
    if (c->pid > 0) {
        for (int i = 0; i < 500; i++) { /* 5 s, then SIGKILL */
            if (waitpid(c->pid, NULL, WNOHANG) == c->pid) {
                c->pid = -1;
                break;
            }
            usleep(10000);
        }
        if (c->pid > 0) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, NULL, 0);
            c->pid = -1;
        }
    }
    if (c->in >= 0) close(c->in);
    if (c->out >= 0) close(c->out);
    c->in = c->out = -1;
}

void cx_bench_stop(cx_bench_child_t *c)
{
    if (c->in >= 0) close(c->in);
    c->in = -1;
    cx_bench_reap(c);
}
