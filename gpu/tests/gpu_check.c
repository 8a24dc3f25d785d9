/* connex-gpu-check: staging bandwidth against plain copies, on a GPU (or the sim with --sim).
 *
 * For each size from 16 KiB to 64 MiB it measures, on device 0:
 *   d2h, h2d  plain synchronous cuMemcpy between device memory and pinned host memory
 *   d2d       plain cuMemcpy device to device (what a GPU-to-GPU copy costs without a network)
 *   net       memcpy between two pinned slots: the "network" of this loopback
 *   staged    device -> D2H -> slot -> net -> slot -> H2D -> device through two staging
 *             pipelines (sender and receiver), chunked and overlapped as the core drives them
 * and prints staged / min(copy engine, net), the target being >= 80% at 16 MiB.
 * Every staged transfer is checked byte for byte. Exit: 0 ok, 1 failure, 2 no GPU. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cx_stage.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- the loopback "network" between a sender and a receiver pipeline ---- */

#define MAXQ 2048
struct side {
    cx_stage_chunk_t q[MAXQ];
    int n;
    int done, status;
};

static void on_chunk(const cx_stage_chunk_t *c)
{
    struct side *s = c->job_arg;
    if (s->n < MAXQ) s->q[s->n++] = *c;
}

static void on_done(void *arg, cx_stage_job_t *job, int status)
{
    (void)job;
    struct side *s = arg;
    s->done = 1;
    s->status = status;
}

static int staged_copy(cx_stage_t *a, cx_stage_t *b, void *src, void *dst, size_t len)
{
    static struct side sa, sb;
    memset(&sa, 0, sizeof sa);
    memset(&sb, 0, sizeof sb);
    cx_stage_cbs_t ca = { on_chunk, on_done, &sa }, cb = { on_chunk, on_done, &sb };
    cx_stage_job_t *ja, *jb;
    if (cx_stage_start(a, CX_STAGE_OUT, src, len, CX_STAGE_LAST_AFTER_ALL, &ca, &ja) ||
        cx_stage_start(b, CX_STAGE_IN, dst, len, 0, &cb, &jb))
        return CX_ERR;
    double t0 = now_s();
    while (!(sa.done && sb.done)) {
        if (now_s() - t0 > 30) {
            fprintf(stderr, "staged copy of %zu bytes did not finish in 30 s\n", len);
            return CX_ETIMEDOUT;
        }
        cx_stage_progress(a);
        cx_stage_progress(b);
        if (sa.done && sb.done) break;
        int matched = 0;
        for (int i = 0; i < sa.n; i++) {
            for (int k = 0; k < sb.n; k++) {
                if (sb.q[k].index != sa.q[i].index) continue;
                memcpy(sb.q[k].host, sa.q[i].host, sa.q[i].len);
                uint32_t idx = sa.q[i].index;
                sa.q[i] = sa.q[--sa.n];
                sb.q[k] = sb.q[--sb.n];
                cx_stage_chunk_done(ja, idx, CX_OK);
                cx_stage_chunk_done(jb, idx, CX_OK);
                matched = 1;
                i = -1;
                break;
            }
        }
        if (!matched) {
            struct pollfd p[2] = { { cx_stage_fd(a), POLLIN, 0 }, { cx_stage_fd(b), POLLIN, 0 } };
            poll(p, 2, 100);
        }
    }
    return sa.status ? sa.status : sb.status;
}

/* ---- measurement ---- */

typedef int (*op_fn)(void *ctx);
struct cpy {
    void *dst, *src;
    size_t len;
    cx_stage_t *a, *b;
};

static int op_memcpy(void *ctx)
{
    struct cpy *c = ctx;
    return cx_gpu_memcpy(c->dst, c->src, c->len);
}
static int op_host(void *ctx)
{
    struct cpy *c = ctx;
    memcpy(c->dst, c->src, c->len);
    return 0;
}
static int op_staged(void *ctx)
{
    struct cpy *c = ctx;
    return staged_copy(c->a, c->b, c->src, c->dst, c->len);
}

/* GB/s: best of several runs, each at least ~20 ms or 3 iterations. */
static double bw(op_fn f, void *ctx, size_t len)
{
    if (f(ctx)) return -1; /* warm-up */
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        int iters = 0;
        double t0 = now_s(), t;
        do {
            if (f(ctx)) return -1;
            iters++;
            t = now_s() - t0;
        } while (t < 0.02 || iters < 3);
        double g = (double)len * iters / t / 1e9;
        if (g > best) best = g;
    }
    return best;
}

static void pattern(unsigned char *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(i * 2654435761u >> 13) ^ (unsigned char)seed;
}

int main(int argc, char **argv)
{
    int kind = CX_MEM_CUDA;
    size_t min = 16 << 10, max = 64 << 20;
    cx_stage_cfg_t cfg = { 0 };
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sim"))
            kind = CX_MEM_SIM;
        else if (!strcmp(argv[i], "--max") && i + 1 < argc)
            max = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
            cfg.chunk = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--slots") && i + 1 < argc)
            cfg.slots = (uint32_t)strtoul(argv[++i], NULL, 0);
        else {
            fprintf(stderr, "usage: %s [--sim] [--max BYTES] [--chunk BYTES] [--slots N]\n", argv[0]);
            return 1;
        }
    }
    printf("gpu: %s\n", cx_gpu_status());
    if (kind == CX_MEM_CUDA && cx_gpu_init() != CX_OK) {
        fprintf(stderr,
                "connex-gpu-check: no usable GPU here (%s); --sim runs the same on the "
                "simulated device\n",
                cx_gpu_status());
        return 2;
    }
    if (kind == CX_MEM_SIM) cx_gpu_sim_enable(1);
    cx_stage_t *a, *b;
    if (cx_stage_create(kind, 0, &cfg, &a) || cx_stage_create(kind, 0, &cfg, &b)) {
        fprintf(stderr, "connex-gpu-check: cannot create the staging pipelines\n");
        return 1;
    }
    cx_stage_stats_t ss;
    cx_stage_get_stats(a, &ss);
    cx_gdr_info_t gi;
    cx_gdr_caps_t caps = { 1, 1, 1 }; /* "if the backend could": what the machine allows */
    cx_gdr_decide(kind, 0, &caps, &gi);
    printf("staging: %s, chunk %zu bytes, %u slots per side; GPUDirect (for an RDMA backend): %s\n",
           cx_mem_kind_name(kind), ss.chunk, ss.slots, gi.reason);

    void *src, *dst;
    cx_pinned_t h1, h2;
    unsigned char *ref = malloc(max), *got = malloc(max);
    if (!ref || !got || cx_gpu_dev_alloc(kind, 0, max, &src) || cx_gpu_dev_alloc(kind, 0, max, &dst) ||
        cx_pinned_alloc(max, &h1) || cx_pinned_alloc(max, &h2)) {
        fprintf(stderr, "connex-gpu-check: cannot allocate %zu bytes\n", max);
        return 1;
    }
    pattern(ref, max, 1);
    if (cx_gpu_memcpy(src, ref, max)) return 1;

    printf("\n%10s %9s %9s %9s %9s %9s %12s\n", "bytes", "d2h", "h2d", "d2d", "net", "staged", "staged/min");
    printf("%10s %9s %9s %9s %9s %9s %12s\n", "", "GB/s", "GB/s", "GB/s", "GB/s", "GB/s", "(ce,net)");
    int fails = 0;
    double ratio16 = -1;
    for (size_t len = min; len <= max; len *= 4) {
        struct cpy d2h = { h1.p, src, len, 0, 0 }, h2d = { dst, h1.p, len, 0, 0 };
        struct cpy d2d = { dst, src, len, 0, 0 };
        size_t nlen = len < ss.chunk ? len : ss.chunk; /* the network moves one chunk at a time */
        struct cpy net = { h2.p, h1.p, nlen, 0, 0 };
        struct cpy st = { dst, src, len, a, b };
        double g_d2h = bw(op_memcpy, &d2h, len), g_h2d = bw(op_memcpy, &h2d, len);
        double g_d2d = bw(op_memcpy, &d2d, len), g_net = bw(op_host, &net, nlen);
        cx_gpu_memset(dst, 0, len);
        double g_st = bw(op_staged, &st, len);
        memset(got, 0, len);
        if (g_st < 0 || cx_gpu_memcpy(got, dst, len) || memcmp(got, ref, len)) {
            printf("%10zu staged copy FAILED (data differs or error)\n", len);
            fails++;
            continue;
        }
        double ce = g_d2h < g_h2d ? g_d2h : g_h2d;
        double lim = ce < g_net ? ce : g_net;
        double r = g_st / lim;
        if (len == (size_t)16 << 20) ratio16 = r;
        printf("%10zu %9.2f %9.2f %9.2f %9.2f %9.2f %11.0f%%\n", len, g_d2h, g_h2d, g_d2d, g_net, g_st, 100 * r);
    }
    cx_stage_get_stats(a, &ss);
    printf("\nsender staged d2h %llu bytes; ", (unsigned long long)ss.d2h_bytes);
    cx_stage_get_stats(b, &ss);
    printf("receiver staged h2d %llu bytes\n", (unsigned long long)ss.h2d_bytes);
    if (kind == CX_MEM_SIM)
        printf("(sim: the copy engines are CPU threads sharing cores with the network memcpy, so "
               "these ratios say nothing about a GPU)\n");
    if (ratio16 >= 0)
        printf("target: staged at 16 MiB >= 80%% of min(copy engine, network): %.0f%% -> %s\n", 100 * ratio16,
               ratio16 >= 0.8 ? "MET" : "NOT MET");
    cx_stage_destroy(a);
    cx_stage_destroy(b);
    cx_gpu_dev_free(src);
    cx_gpu_dev_free(dst);
    cx_pinned_free(&h1);
    cx_pinned_free(&h2);
    free(ref);
    free(got);
    return fails ? 1 : 0;
}
