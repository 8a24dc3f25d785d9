/* Raw UCX baseline for connex-c's UCX backend: ucp_get_nbx / ucp_put_nbx(+flush) between two
 * processes (fork) over worker-address endpoints, on the transports UCX_TLS selects.
 *
 * Same setup as the backend: features RMA|AM|WAKEUP, endpoints with UCP_ERR_HANDLING_MODE_PEER
 * (falling back to NONE where UCX_TLS leaves no transport able to handle peer failure),
 * ucp_mem_map'ed malloc memory on both sides, a write is a put followed by an endpoint flush
 * (the data is at the target when it completes). The target spins in ucp_worker_progress.
 *
 * usage: ucx_raw [iters [sizes [budget_ms]]]
 *        iters per point (default 200), sizes in bytes, comma-separated, at most 16 MiB (default
 *        4096,16384,1048576,16777216), budget per point in ms (default 2000; at least 3 timed ops).
 *        A warm-up of iters/10 ops (3..20) runs first: the first ops after connecting pay for
 *        wireup and page faults (20 timed ops of a 4 KiB shm get measured 5.8 us, 2000 0.56 us).
 *        Prints p50 latency and bandwidth.
 * env:   UCX_TLS as usual; UCX_RAW_ERR=none forces UCP_ERR_HANDLING_MODE_NONE.
 *        UCX_RAW_BATCH=N: each timed op is N blocks of the size laid end to end (N gets then a
 *        wait for all; N puts then one flush), the raw counterpart of connex-bench transfer
 *        --batch N; p50 is per call, MB/s counts all N blocks.
 */
#define _GNU_SOURCE
#include <ucp/api/ucp.h>

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXSZ (16u << 20)
#define DIE(...)                                  \
    do {                                          \
        fprintf(stderr, "ucx_raw: " __VA_ARGS__); \
        fputc('\n', stderr);                      \
        exit(2);                                  \
    } while (0)
#define CK(st, what)                                                  \
    do {                                                              \
        ucs_status_t s_ = (st);                                       \
        if (s_ != UCS_OK) DIE("%s: %s", what, ucs_status_string(s_)); \
    } while (0)

static ucp_context_h ctx;
static ucp_worker_h wrk;
static int err_peer = 1;

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static void xwrite(int fd, const void *p, size_t n)
{
    if (write(fd, &n, sizeof n) != (ssize_t)sizeof n || write(fd, p, n) != (ssize_t)n) DIE("pipe write");
}

static size_t xread(int fd, void *p, size_t cap)
{
    size_t n, got = 0;
    if (read(fd, &n, sizeof n) != (ssize_t)sizeof n || n > cap) DIE("pipe read");
    while (got < n) {
        ssize_t k = read(fd, (char *)p + got, n - got);
        if (k <= 0) DIE("pipe read");
        got += (size_t)k;
    }
    return n;
}

static ucs_status_t wait_req(ucs_status_ptr_t r)
{
    if (r == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    ucs_status_t st;
    while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS) ucp_worker_progress(wrk);
    ucp_request_free(r);
    return st;
}

static void err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg;
    (void)ep;
    fprintf(stderr, "ucx_raw: endpoint error %s\n", ucs_status_string(st));
}

static void init(void)
{
    ucp_config_t *cfg;
    CK(ucp_config_read(NULL, NULL, &cfg), "ucp_config_read");
    ucp_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    CK(ucp_init(&p, cfg, &ctx), "ucp_init");
    ucp_config_release(cfg);
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    CK(ucp_worker_create(ctx, &wp, &wrk), "ucp_worker_create");
}

static ucp_ep_h connect_to(const void *addr)
{
    ucp_ep_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = addr;
    p.err_mode = err_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    p.err_handler.cb = err_cb;
    ucp_ep_h ep;
    ucs_status_t st = ucp_ep_create(wrk, &p, &ep);
    if (st == UCS_ERR_UNREACHABLE && err_peer) { /* same fallback as the backend */
        p.field_mask &= ~(uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER;
        p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        st = ucp_ep_create(wrk, &p, &ep);
    }
    CK(st, "ucp_ep_create");
    return ep;
}

static void *map(size_t len, ucp_mem_h *memh)
{
    void *buf = aligned_alloc(4096, len);
    if (!buf) DIE("out of memory");
    memset(buf, 0x5a, len);
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = buf;
    mp.length = len;
    CK(ucp_mem_map(ctx, &mp, memh), "ucp_mem_map");
    return buf;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 200;
    if (iters < 5) iters = 5;
    size_t sizes[16] = { 4096, 16384, 1u << 20, 16u << 20 };
    int nsizes = 4;
    if (argc > 2) {
        nsizes = 0;
        char *save = NULL, *list = strdup(argv[2]);
        for (char *tok = strtok_r(list, ",", &save); tok && nsizes < 16; tok = strtok_r(NULL, ",", &save)) {
            unsigned long long v = strtoull(tok, NULL, 10);
            if (v == 0 || v > MAXSZ) DIE("size %s: not in 1..%u", tok, MAXSZ);
            sizes[nsizes++] = (size_t)v;
        }
        free(list);
        if (!nsizes) DIE("no sizes in '%s'", argv[2]);
    }
    double budget_us = (argc > 3 ? atof(argv[3]) : 2000.0) * 1000.0;
    int warm = iters / 10 < 3 ? 3 : iters / 10 > 20 ? 20 : iters / 10;
    const char *e = getenv("UCX_RAW_ERR");
    if (e && strcmp(e, "none") == 0) err_peer = 0;
    int nb = getenv("UCX_RAW_BATCH") ? atoi(getenv("UCX_RAW_BATCH")) : 0;
    if (nb < 0 || nb > 65536) DIE("UCX_RAW_BATCH=%d: not in 0..65536", nb);
    size_t maxsz = 0;
    for (int s = 0; s < nsizes; s++)
        if (sizes[s] > maxsz) maxsz = sizes[s];
    size_t region = nb && maxsz * (size_t)nb > MAXSZ ? maxsz * (size_t)nb : MAXSZ;
    ucs_status_ptr_t *reqs = calloc(nb ? (size_t)nb : 1, sizeof *reqs);
    if (!reqs) DIE("out of memory");
    int to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent)) DIE("pipe");
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) DIE("fork");
    init();
    static unsigned char blob[8192];
    ucp_address_t *wa;
    size_t wal;
    CK(ucp_worker_get_address(wrk, &wa, &wal), "ucp_worker_get_address");
    if (pid == 0) { /* target */
        ucp_mem_h memh;
        void *buf = map(region, &memh);
        void *rk;
        size_t rkl;
        CK(ucp_rkey_pack(ctx, memh, &rk, &rkl), "ucp_rkey_pack");
        uint64_t a = (uint64_t)(uintptr_t)buf;
        xwrite(to_parent[1], wa, wal);
        xwrite(to_parent[1], rk, rkl);
        xwrite(to_parent[1], &a, sizeof a);
        ucp_rkey_buffer_release(rk);
        xread(to_child[0], blob, sizeof blob);
        ucp_ep_h ep = connect_to(blob);
        /* serve until the parent closes the pipe */
        fcntl(to_child[0], F_SETFL, O_NONBLOCK);
        for (;;) {
            for (int i = 0; i < 1000; i++) ucp_worker_progress(wrk);
            char c;
            ssize_t k = read(to_child[0], &c, 1);
            if (k == 0 || (k == 1 && c == 'q')) break;
        }
        ucp_request_param_t cp;
        memset(&cp, 0, sizeof cp);
        cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
        (void)wait_req(ucp_ep_close_nbx(ep, &cp));
        ucp_mem_unmap(ctx, memh);
        ucp_worker_release_address(wrk, wa);
        ucp_worker_destroy(wrk);
        ucp_cleanup(ctx);
        _exit(0);
    }
    /* initiator */
    size_t n = xread(to_parent[0], blob, sizeof blob);
    ucp_ep_h ep = connect_to(blob);
    (void)n;
    xwrite(to_child[1], wa, wal);
    static unsigned char rkb[4096];
    xread(to_parent[0], rkb, sizeof rkb);
    uint64_t raddr;
    xread(to_parent[0], &raddr, sizeof raddr);
    ucp_rkey_h rkey;
    CK(ucp_ep_rkey_unpack(ep, rkb, &rkey), "ucp_ep_rkey_unpack");
    ucp_mem_h memh;
    void *lbuf = map(region, &memh);

    printf("# ucx_raw: UCX %s, UCX_TLS=%s, err mode %s, %d iterations per point\n", ucp_get_version_string(),
           getenv("UCX_TLS") ? getenv("UCX_TLS") : "(default)", err_peer ? "peer" : "none", iters);
    printf("%-6s %10s %12s %12s %8s\n", "op", "bytes", "p50_us", "MB/s(p50)", "iters");
    double *t = malloc(sizeof(double) * (size_t)iters);
    for (int op = 0; op < 2; op++) {
        for (int s = 0; s < nsizes; s++) {
            size_t sz = sizes[s];
            int it = iters;
            double t_end = 0;
            for (int i = -warm; i < it; i++) {
                if (i == 0)
                    t_end = now_us() + budget_us;
                else if (i >= 3 && now_us() > t_end) {
                    it = i;
                    break;
                }
                ucp_request_param_t p;
                memset(&p, 0, sizeof p);
                p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
                p.memh = memh;
                double t0 = now_us();
                if (nb && op == 0) {
                    for (int k = 0; k < nb; k++)
                        reqs[k] =
                            ucp_get_nbx(ep, (char *)lbuf + (size_t)k * sz, sz, raddr + (uint64_t)k * sz, rkey, &p);
                    for (int k = 0; k < nb; k++) CK(wait_req(reqs[k]), "get");
                } else if (nb) {
                    for (int k = 0; k < nb; k++) {
                        ucs_status_ptr_t r =
                            ucp_put_nbx(ep, (char *)lbuf + (size_t)k * sz, sz, raddr + (uint64_t)k * sz, rkey, &p);
                        if (UCS_PTR_IS_ERR(r)) CK(UCS_PTR_STATUS(r), "put");
                        if (r) ucp_request_free(r);
                    }
                    memset(&p, 0, sizeof p);
                    CK(wait_req(ucp_ep_flush_nbx(ep, &p)), "flush");
                } else if (op == 0) {
                    CK(wait_req(ucp_get_nbx(ep, lbuf, sz, raddr, rkey, &p)), "get");
                } else {
                    ucs_status_ptr_t r = ucp_put_nbx(ep, lbuf, sz, raddr, rkey, &p);
                    if (UCS_PTR_IS_ERR(r)) CK(UCS_PTR_STATUS(r), "put");
                    if (r) ucp_request_free(r);
                    memset(&p, 0, sizeof p);
                    CK(wait_req(ucp_ep_flush_nbx(ep, &p)), "flush");
                }
                if (i >= 0) t[i] = now_us() - t0;
            }
            qsort(t, (size_t)it, sizeof *t, cmp_d);
            double p50 = t[it / 2];
            printf("%-6s %10zu %12.2f %12.1f %8d\n", op == 0 ? "read" : "write", sz, p50,
                   (double)sz * (nb ? nb : 1) / p50, it);
        }
    }
    fflush(stdout);
    free(t);
    free(reqs);
    ucp_rkey_destroy(rkey);
    if (write(to_child[1], "q", 1) != 1) kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    ucp_request_param_t cp;
    memset(&cp, 0, sizeof cp);
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = err_peer ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    (void)wait_req(ucp_ep_close_nbx(ep, &cp));
    ucp_mem_unmap(ctx, memh);
    ucp_worker_release_address(wrk, wa);
    ucp_worker_destroy(wrk);
    ucp_cleanup(ctx);
    return 0;
}
