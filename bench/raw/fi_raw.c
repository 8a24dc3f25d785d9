/* fi_raw: the raw libfabric baseline for connex-c's libfabric backend.
 *
 * Two processes (this one forks the target), one FI_EP_RDM endpoint each, the same provider and
 * the same calls the backend makes: fi_read, and fi_writemsg with FI_DELIVERY_COMPLETE (the
 * backend's write completes when the data is at the target; -W measures plain fi_write too).
 * On shm the backend's direct mode writes with a plain fi_writemsg, which the provider copies
 * into the target inside the post (backends/libfabric/fi_shm.c): so does "write" here, unless
 * CONNEX_FI_SHM_DIRECT=0 (as for the backend).
 * One op at a time, like cx_read / cx_write; the target busy-polls its CQ (manual-progress
 * providers such as tcp;ofi_rxm serve reads only while the target drives its CQ).
 *
 * usage: fi_raw [-p provider] [-a address] [-s size,size,...] [-t seconds per size] [-n ops per size] [-W]
 *               [-b blocks per call]
 *   default provider: $CONNEX_FI_PROVIDER, else tcp;ofi_rxm; address (tcp only) 127.0.0.1;
 *   sizes 4096,16384,1048576,16777216; 2 s per size, at most -n ops (default and cap 100000)
 *   -b N: each timed op is N blocks of the size laid end to end, posted back to back (FI_MORE on
 *   all but the last, as the backend posts a batch), then N completions waited for: the raw
 *   counterpart of connex-bench transfer --batch N.
 * Output: one line per op and size: p50 and mean latency per call, bandwidth = the call's bytes /
 * mean.
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXSZ ((size_t)16 << 20)
#define MAXBATCH 65536

static size_t g_region = MAXSZ; /* both sides' buffer: MAXSZ, or the largest batch */
#define MAXITER 100000

struct fab {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_ep *ep;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_mr *mr;
    void *buf;
};

/* What the target tells the initiator over the socketpair. */
struct hello {
    uint64_t addr, key;
    size_t name_len;
    uint8_t name[256];
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what, int r)
{
    fprintf(stderr, "fi_raw: %s: %s\n", what, r ? fi_strerror(-r) : strerror(errno));
    exit(2);
}

static void fab_open(struct fab *f, const char *prov, const char *ip)
{
    struct fi_info *h = fi_allocinfo();
    if (!h) die("fi_allocinfo", -FI_ENOMEM);
    h->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->fabric_attr->prov_name = strdup(prov);
    /* tcp binds to the given address, as the backend binds to the engine's listen address */
    const char *node = !strncmp(prov, "tcp", 3) ? ip : NULL;
    int r = fi_getinfo(FI_VERSION(1, 17), node, NULL, node ? FI_SOURCE : 0, h, &f->info);
    fi_freeinfo(h);
    if (r) die("fi_getinfo", r);
    struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_CONTEXT, .size = 1024 };
    struct fi_av_attr aa = { .type = FI_AV_TABLE };
    if ((r = fi_fabric(f->info->fabric_attr, &f->fabric, NULL)) ||
        (r = fi_domain(f->fabric, f->info, &f->domain, NULL)) || (r = fi_cq_open(f->domain, &ca, &f->cq, NULL)) ||
        (r = fi_av_open(f->domain, &aa, &f->av, NULL)) || (r = fi_endpoint(f->domain, f->info, &f->ep, NULL)) ||
        (r = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV)) || (r = fi_ep_bind(f->ep, &f->av->fid, 0)) ||
        (r = fi_enable(f->ep)))
        die("endpoint setup", r);
    f->buf = aligned_alloc(4096, g_region);
    if (!f->buf) die("aligned_alloc", -FI_ENOMEM);
    memset(f->buf, 0x5a, g_region);
    /* requested_key 1: unique in this domain, which providers without FI_MR_PROV_KEY need */
    if ((r = fi_mr_reg(f->domain, f->buf, g_region, FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 1, 0,
                       &f->mr, NULL)))
        die("fi_mr_reg", r);
    if (f->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
        if ((r = fi_mr_bind(f->mr, &f->ep->fid, 0)) || (r = fi_mr_enable(f->mr))) die("fi_mr_bind", r);
    }
}

static void fab_close(struct fab *f)
{
    fi_close(&f->mr->fid);
    fi_close(&f->ep->fid);
    fi_close(&f->av->fid);
    fi_close(&f->cq->fid);
    fi_close(&f->domain->fid);
    fi_close(&f->fabric->fid);
    fi_freeinfo(f->info);
    free(f->buf);
}

/* The target: publish address and key, then drive the CQ until told to stop. */
static int target(const char *prov, const char *ip, int sock)
{
    struct fab f;
    fab_open(&f, prov, ip);
    struct hello h;
    memset(&h, 0, sizeof h);
    h.name_len = sizeof h.name;
    int r = fi_getname(&f.ep->fid, h.name, &h.name_len);
    if (r) die("fi_getname", r);
    h.addr = (f.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)f.buf : 0;
    h.key = fi_mr_key(f.mr);
    if (write(sock, &h, sizeof h) != (ssize_t)sizeof h) die("write hello", 0);
    struct fi_cq_entry e[16];
    char c;
    for (;;) {
        fi_cq_read(f.cq, e, 16);
        ssize_t n = recv(sock, &c, 1, MSG_DONTWAIT);
        if (n == 1 || n == 0) break;
    }
    fab_close(&f);
    return 0;
}

static int wait_one(struct fab *f)
{
    struct fi_cq_entry e;
    for (;;) {
        ssize_t n = fi_cq_read(f->cq, &e, 1);
        if (n == 1) return 0;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry ee;
            memset(&ee, 0, sizeof ee);
            fi_cq_readerr(f->cq, &ee, 0);
            fprintf(stderr, "fi_raw: CQ error %s\n", fi_strerror(ee.err));
            return -1;
        }
        if (n != -FI_EAGAIN) return -1;
    }
}

enum { OP_READ, OP_WRITE_DC, OP_WRITE };

static int g_write_flags = FI_DELIVERY_COMPLETE | FI_COMPLETION;

/* One op on block `off` of both buffers; more: FI_MORE (another post follows at once). */
static int post_at(struct fab *f, int op, size_t len, size_t off, int more, fi_addr_t peer, const struct hello *h,
                   struct fi_context2 *ctx)
{
    void *desc = fi_mr_desc(f->mr);
    char *lb = (char *)f->buf + off;
    uint64_t ra = h->addr + off;
    ssize_t r;
    struct iovec iov = { .iov_base = lb, .iov_len = len };
    struct fi_rma_iov riov = { .addr = ra, .len = len, .key = h->key };
    struct fi_msg_rma m = { .msg_iov = &iov,
                            .desc = &desc,
                            .iov_count = 1,
                            .addr = peer,
                            .rma_iov = &riov,
                            .rma_iov_count = 1,
                            .context = ctx };
    do {
        if (op == OP_READ && more)
            r = fi_readmsg(f->ep, &m, FI_COMPLETION | FI_MORE);
        else if (op == OP_READ)
            r = fi_read(f->ep, lb, len, desc, peer, ra, h->key, ctx);
        else if (op == OP_WRITE && !more)
            r = fi_write(f->ep, lb, len, desc, peer, ra, h->key, ctx);
        else
            r = fi_writemsg(f->ep, &m,
                            (op == OP_WRITE ? FI_COMPLETION : (uint64_t)g_write_flags) | (more ? FI_MORE : 0));
        if (r == -FI_EAGAIN) fi_cq_read(f->cq, NULL, 0);
    } while (r == -FI_EAGAIN);
    return (int)r;
}

static int post(struct fab *f, int op, size_t len, fi_addr_t peer, const struct hello *h, struct fi_context2 *ctx)
{
    return post_at(f, op, len, 0, 0, peer, h, ctx);
}

/* One call: nb blocks (1: a single op), each posted, then every completion waited for. */
static int call(struct fab *f, int op, size_t len, int nb, fi_addr_t peer, const struct hello *h,
                struct fi_context2 *ctx)
{
    if (nb <= 1) return post(f, op, len, peer, h, ctx) || wait_one(f);
    for (int k = 0; k < nb; k++)
        if (post_at(f, op, len, (size_t)k * len, k + 1 < nb, peer, h, &ctx[k])) return -1;
    for (int k = 0; k < nb; k++)
        if (wait_one(f)) return -1;
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *prov = getenv("CONNEX_FI_PROVIDER");
    if (!prov || !*prov) prov = "tcp;ofi_rxm";
    char sizes_s[256] = "4096,16384,1048576,16777216";
    double per_size = 2.0;
    int plain_write = 0;
    int max_ops = MAXITER;
    const char *ip = "127.0.0.1";
    int o;
    int nb = 0;
    while ((o = getopt(argc, argv, "p:a:s:t:n:b:Wh")) != -1) {
        switch (o) {
        case 'p': prov = optarg; break;
        case 'a': ip = optarg; break;
        case 's': snprintf(sizes_s, sizeof sizes_s, "%s", optarg); break;
        case 't': per_size = atof(optarg); break;
        case 'W': plain_write = 1; break;
        case 'b':
            nb = atoi(optarg);
            if (nb < 0 || nb > MAXBATCH) {
                fprintf(stderr, "fi_raw: -b %s: not in 0..%d\n", optarg, MAXBATCH);
                return 1;
            }
            break;
        case 'n':
            max_ops = atoi(optarg);
            if (max_ops < 5 || max_ops > MAXITER) max_ops = MAXITER;
            break;
        default:
            fprintf(stderr,
                    "usage: %s [-p provider] [-a tcp address] [-s sizes] [-t seconds] [-n ops] [-W] [-b blocks]\n",
                    argv[0]);
            return 1;
        }
    }
    size_t sizes[16];
    int ns = 0;
    for (char *t = strtok(sizes_s, ","); t && ns < 16; t = strtok(NULL, ",")) {
        sizes[ns] = strtoull(t, NULL, 0);
        if (!sizes[ns] || sizes[ns] > MAXSZ) {
            fprintf(stderr, "fi_raw: size %s out of range (1..%zu)\n", t, MAXSZ);
            return 1;
        }
        if (nb > 1 && sizes[ns] * (size_t)nb > g_region) g_region = sizes[ns] * (size_t)nb;
        ns++;
    }
    struct fi_context2 *ctxs = calloc(nb > 1 ? (size_t)nb : 1, sizeof *ctxs);
    if (!ctxs) die("calloc", -FI_ENOMEM);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) die("socketpair", 0);
    pid_t pid = fork();
    if (pid < 0) die("fork", 0);
    if (pid == 0) {
        close(sv[0]);
        _exit(target(prov, ip, sv[1]));
    }
    close(sv[1]);
    struct fab f;
    fab_open(&f, prov, ip);
    struct hello h;
    if (read(sv[0], &h, sizeof h) != (ssize_t)sizeof h) die("read hello", 0);
    fi_addr_t peer;
    if (fi_av_insert(f.av, h.name, 1, &peer, 0, NULL) != 1) die("fi_av_insert", -FI_EINVAL);
    const char *direct = getenv("CONNEX_FI_SHM_DIRECT");
    if (!strcmp(f.info->fabric_attr->prov_name, "shm") && !(direct && !strcmp(direct, "0")))
        g_write_flags = FI_COMPLETION;
    char shape[48] = "one op at a time";
    if (nb > 1) snprintf(shape, sizeof shape, "%d blocks per call", nb);
    printf("# fi_raw provider=%s (%s), %s, target busy-polls its CQ, write = %s\n", f.info->fabric_attr->prov_name,
           f.info->domain_attr->name, shape,
           g_write_flags == FI_COMPLETION ? "plain fi_writemsg (shm direct)" : "delivery-complete");
    static double lat[MAXITER];
    int ops[3] = { OP_READ, OP_WRITE_DC, OP_WRITE };
    const char *names[3] = { "read", "write", "write_plain" };
    int rc = 0;
    for (int k = 0; k < (plain_write ? 3 : 2) && !rc; k++) {
        for (int s = 0; s < ns && !rc; s++) {
            size_t len = sizes[s];
            /* warm-up: connection setup, caches */
            for (int i = 0; i < 5 && !rc; i++) rc = call(&f, ops[k], len, nb, peer, &h, ctxs);
            int n = 0;
            double t0 = now_s();
            while (n < max_ops && !rc && (n < 5 || now_s() - t0 < per_size)) {
                double a = now_s();
                rc = call(&f, ops[k], len, nb, peer, &h, ctxs);
                lat[n++] = now_s() - a;
            }
            double total = now_s() - t0;
            if (rc) break;
            qsort(lat, (size_t)n, sizeof lat[0], cmp_d);
            double mean = total / n;
            printf("%-11s %9zu B  iters %6d  p50 %9.2f us  mean %9.2f us  bw %8.1f MB/s\n", names[k], len, n,
                   lat[n / 2] * 1e6, mean * 1e6, (double)len * (nb > 1 ? nb : 1) / mean / 1e6);
            fflush(stdout);
        }
    }
    if (write(sv[0], "x", 1) != 1) {
        /* the target also stops on EOF */
    }
    close(sv[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    fab_close(&f);
    free(ctxs);
    if (rc) fprintf(stderr, "fi_raw: an op failed\n");
    return rc ? 2 : (WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 2);
}
