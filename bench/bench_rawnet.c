/* Raw network baselines, two processes on 127.0.0.1 with no connex in between:
 *  - TCP: write = send the bytes, wait for a 1-byte ack; read = send a 9-byte request, receive
 *    the bytes. This is the ceiling every TCP-based backend (zmq, ucx tcp, libfabric tcp) lives
 *    under on this host.
 *  - ZeroMQ DEALER/ROUTER: the same two exchanges as multipart messages; what the zmq backend
 *    could do with the library alone.
 * Both answer in the bench's row format; the server side is a forked child.
 * With transfer --batch N, TCP moves N blocks per call: N requests sent back to back (reads: N
 * headers in one send, then N blocks received; writes: N headers and blocks, then N acks), the
 * raw counterpart of a batch to a zmq peer; the ZeroMQ loop stays one block per call and is left
 * out. */
#include "bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef CX_BENCH_HAVE_ZMQ
#include <zmq.h>
#endif

typedef int (*xfer_fn)(void *ctx, char op, uint8_t *buf, size_t size);

/* transfer --batch: blocks per call (1: one) */
static int blocks(const cx_bench_opts_t *o)
{
    return o->batch > 1 ? o->batch : 1;
}

/* The shared timed loop: the same warm-up, iteration and time bounds as connex's points. */
static void loop(const cx_bench_opts_t *o, const char *name, void *ctx, xfer_fn fn, uint8_t *buf)
{
    uint64_t *samples = calloc((size_t)o->iters + 1, sizeof *samples);
    if (!samples) return;
    for (int opi = 0; opi < 2; opi++) {
        char op = opi ? 'W' : 'R';
        if (!cx_bench_list_has(o->ops, opi ? "write" : "read")) continue;
        for (int s = 0; s < o->nsizes; s++) {
            size_t size = o->sizes[s];
            cx_bench_row_t r;
            memset(&r, 0, sizeof r);
            snprintf(r.backend, sizeof r.backend, "%s", name);
            snprintf(r.op, sizeof r.op, "%s", opi ? "write" : "read");
            r.size = size;
            r.baseline = 1;
            r.batch = o->batch;
            char hs[32];
            cx_bench_progress(o, "baseline %-10s %-6s %8s", name, r.op, cx_bench_human(size, hs, sizeof hs));
            int rc = 0, warm = o->iters / 10 < 2 ? 2 : o->iters / 10 > 20 ? 20 : o->iters / 10;
            for (int i = 0; i < warm && !rc; i++) rc = fn(ctx, op, buf, size);
            int n = 0;
            uint64_t t_end = cx_bench_now_ns() + (uint64_t)o->budget_ms * 1000000ull;
            while (!rc && n < o->iters && (n < 3 || cx_bench_now_ns() < t_end)) {
                uint64_t t0 = cx_bench_now_ns();
                rc = fn(ctx, op, buf, size);
                samples[n++] = cx_bench_now_ns() - t0;
            }
            if (rc)
                snprintf(r.note, sizeof r.note, "FAIL: baseline transfer failed");
            else {
                cx_bench_row_fill(&r, samples, n);
                r.gbps *= blocks(o);
                if (o->batch)
                    snprintf(r.note, sizeof r.note, "raw loop, 2 processes, %d blocks per call", o->batch);
                else
                    snprintf(r.note, sizeof r.note, "raw loop, 2 processes");
            }
            cx_bench_add_row(&r);
            if (rc) {
                free(samples);
                return;
            }
        }
    }
    free(samples);
}

static size_t max_size(const cx_bench_opts_t *o)
{
    size_t m = 0;
    for (int i = 0; i < o->nsizes; i++)
        if (o->sizes[i] > m) m = o->sizes[i];
    return m;
}

/* ------------------------------------------------------------------ TCP */

static int full_io(int fd, void *p, size_t n, int wr)
{
    uint8_t *b = p;
    while (n) {
        ssize_t k = wr ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static void tcp_server(int ls, uint8_t *buf, size_t cap)
{
    int c = accept(ls, NULL, NULL);
    if (c < 0) _exit(1);
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint8_t hdr[9];
    while (full_io(c, hdr, sizeof hdr, 0) == 0) {
        uint64_t size;
        memcpy(&size, hdr + 1, 8);
        if (size > cap) _exit(1);
        if (hdr[0] == 'W') {
            if (full_io(c, buf, size, 0) || full_io(c, "A", 1, 1)) _exit(1);
        } else if (full_io(c, buf, size, 1)) {
            _exit(1);
        }
    }
    _exit(0);
}

typedef struct tcp_ctx {
    int fd, nb;    /* nb blocks per call, laid end to end in buf */
    uint8_t *hdrs; /* nb read requests, sent in one go */
} tcp_ctx_t;

static int tcp_xfer(void *ctx, char op, uint8_t *buf, size_t size)
{
    tcp_ctx_t *t = ctx;
    uint64_t s = size;
    if (op == 'W') {
        uint8_t hdr[9] = { 'W' };
        memcpy(hdr + 1, &s, 8);
        for (int k = 0; k < t->nb; k++)
            if (full_io(t->fd, hdr, sizeof hdr, 1) || full_io(t->fd, buf + (size_t)k * size, size, 1)) return -1;
        for (int k = 0; k < t->nb; k++) {
            char ack;
            if (full_io(t->fd, &ack, 1, 0)) return -1;
        }
        return 0;
    }
    for (int k = 0; k < t->nb; k++) {
        t->hdrs[k * 9] = 'R';
        memcpy(t->hdrs + k * 9 + 1, &s, 8);
    }
    if (full_io(t->fd, t->hdrs, (size_t)t->nb * 9, 1)) return -1;
    return full_io(t->fd, buf, (size_t)t->nb * size, 0);
}

static void run_tcp(const cx_bench_opts_t *o)
{
    size_t cap = max_size(o), lcap = cap * (size_t)blocks(o);
    uint8_t *buf = mmap(NULL, lcap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return;
    memset(buf, 1, lcap);
    tcp_ctx_t t = { .fd = -1, .nb = blocks(o), .hdrs = malloc((size_t)blocks(o) * 9) };
    if (!t.hdrs) {
        munmap(buf, lcap);
        return;
    }
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &al)) {
        perror("connex-bench: tcp baseline");
        if (ls >= 0) close(ls);
        munmap(buf, lcap);
        free(t.hdrs);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        tcp_server(ls, buf, cap);
    }
    close(ls);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    t.fd = fd;
    if (pid > 0 && fd >= 0 && connect(fd, (void *)&a, sizeof a) == 0) loop(o, "raw_tcp", &t, tcp_xfer, buf);
    if (fd >= 0) close(fd);
    if (pid > 0) waitpid(pid, NULL, 0); /* EOF ends the server */
    munmap(buf, lcap);
    free(t.hdrs);
}

/* ------------------------------------------------------------------ ZeroMQ */

#ifdef CX_BENCH_HAVE_ZMQ
static void zmq_server(int pfd, size_t cap)
{
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_ROUTER);
    char ep[128] = "";
    size_t epl = sizeof ep;
    if (zmq_bind(s, "tcp://127.0.0.1:*") || zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &epl)) _exit(1);
    if (write(pfd, ep, sizeof ep) != (ssize_t)sizeof ep) _exit(1);
    close(pfd);
    uint8_t *buf = malloc(cap);
    if (!buf) _exit(1);
    memset(buf, 2, cap);
    for (;;) {
        zmq_msg_t id, hdr, data;
        zmq_msg_init(&id);
        zmq_msg_init(&hdr);
        if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&hdr, s, 0) != 9) _exit(0);
        uint8_t h[9];
        memcpy(h, zmq_msg_data(&hdr), 9);
        uint64_t size;
        memcpy(&size, h + 1, 8);
        if (h[0] == 'Q' || size > cap) _exit(0);
        if (h[0] == 'W') {
            zmq_msg_init(&data);
            if (zmq_msg_recv(&data, s, 0) < 0) _exit(1);
            memcpy(buf, zmq_msg_data(&data), zmq_msg_size(&data)); /* lands in memory, as a write does */
            zmq_msg_close(&data);
            zmq_msg_send(&id, s, ZMQ_SNDMORE);
            zmq_send(s, "A", 1, 0);
        } else {
            zmq_msg_send(&id, s, ZMQ_SNDMORE);
            zmq_send(s, buf, size, 0);
        }
        zmq_msg_close(&hdr);
    }
}

typedef struct zctx {
    void *s;
} zctx_t;

static int zmq_xfer(void *ctx, char op, uint8_t *buf, size_t size)
{
    zctx_t *z = ctx;
    uint8_t hdr[9];
    hdr[0] = (uint8_t)op;
    uint64_t s = size;
    memcpy(hdr + 1, &s, 8);
    if (zmq_send(z->s, hdr, 9, op == 'W' ? ZMQ_SNDMORE : 0) != 9) return -1;
    if (op == 'W') {
        char ack;
        if (zmq_send(z->s, buf, size, 0) != (int)size) return -1;
        return zmq_recv(z->s, &ack, 1, 0) == 1 ? 0 : -1;
    }
    return zmq_recv(z->s, buf, size, 0) == (int)size ? 0 : -1;
}

static void run_zmq(const cx_bench_opts_t *o)
{
    size_t cap = max_size(o);
    int p[2];
    if (pipe(p)) return;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        zmq_server(p[1], cap);
    }
    close(p[1]);
    char ep[128];
    int ok = pid > 0 && read(p[0], ep, sizeof ep) == (ssize_t)sizeof ep;
    close(p[0]);
    uint8_t *buf = ok ? mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (buf != MAP_FAILED) {
        memset(buf, 1, cap);
        void *ctx = zmq_ctx_new();
        zctx_t z = { zmq_socket(ctx, ZMQ_DEALER) };
        int linger = 0;
        zmq_setsockopt(z.s, ZMQ_LINGER, &linger, sizeof linger);
        if (zmq_connect(z.s, ep) == 0) {
            loop(o, "raw_zmq", &z, zmq_xfer, buf);
            uint8_t q[9] = { 'Q' };
            zmq_send(z.s, q, 9, 0);
        }
        zmq_close(z.s);
        zmq_ctx_term(ctx);
        munmap(buf, cap);
    }
    if (pid > 0) {
        for (int i = 0; i < 300 && waitpid(pid, NULL, WNOHANG) != pid; i++) usleep(10000);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}
#endif

void cx_bench_rawnet(const cx_bench_opts_t *o)
{
    if (cx_bench_list_has(o->baselines, "tcp")) run_tcp(o);
#ifdef CX_BENCH_HAVE_ZMQ
    if (cx_bench_list_has(o->baselines, "zmq") && !o->batch) run_zmq(o);
#endif
}
