/* Baselines in the same run as the backends: single-thread memcpy (the host's memory limit), the
 * raw TCP and ZeroMQ loops (bench_rawnet.c), the raw UCX / libfabric loops of bench/raw (found
 * next to this executable) and ucx_perftest when installed, each under the transport of the
 * variant it is compared with. */
#include "bench.h"

#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void run_memcpy(const cx_bench_opts_t *o)
{
    size_t cap = 0;
    for (int i = 0; i < o->nsizes; i++)
        if (o->sizes[i] > cap) cap = o->sizes[i];
    uint8_t *a = mmap(NULL, 2 * cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t *samples = calloc((size_t)o->iters + 1, sizeof *samples);
    if (a == MAP_FAILED || !samples) {
        free(samples);
        return;
    }
    memset(a, 3, 2 * cap); /* fault every page in before timing */
    for (int s = 0; s < o->nsizes; s++) {
        size_t size = o->sizes[s];
        char hs[32];
        cx_bench_progress(o, "baseline memcpy %8s", cx_bench_human(size, hs, sizeof hs));
        for (int i = 0; i < 3; i++) memcpy(a + cap, a, size);
        int n = 0;
        uint64_t t_end = cx_bench_now_ns() + (uint64_t)o->budget_ms * 1000000ull;
        while (n < o->iters && (n < 3 || cx_bench_now_ns() < t_end)) {
            uint64_t t0 = cx_bench_now_ns();
            memcpy(a + cap, a, size);
            __asm__ __volatile__("" ::"r"(a) : "memory"); /* the copy may not be elided */
            samples[n++] = cx_bench_now_ns() - t0;
        }
        cx_bench_row_t r;
        memset(&r, 0, sizeof r);
        snprintf(r.backend, sizeof r.backend, "memcpy");
        snprintf(r.op, sizeof r.op, "copy");
        r.size = size;
        r.baseline = 1;
        cx_bench_row_fill(&r, samples, n);
        snprintf(r.note, sizeof r.note, "1 thread, same buffers each time");
        cx_bench_add_row(&r);
    }
    free(samples);
    munmap(a, 2 * cap);
}

/* ucx_raw prints "<op> <bytes> <p50 us> <MB/s>", fi_raw "<op> <bytes> B  iters <n>  p50 <us> us ...";
 * only p50 is known for either. */
static void run_raw_tool(const cx_bench_opts_t *o, const cx_bench_variant_t *v, const char *tool)
{
    char dir[4096], path[4200], cmd[4700];
    snprintf(dir, sizeof dir, "%s", o->self);
    snprintf(path, sizeof path, "%s/%s", dirname(dir), tool);
    if (access(path, X_OK)) return; /* not built on this host */
    /* The same sizes, and as many timed ops and as much time per point as connex-c's rows get:
     * the first ops after connecting are slow (wireup, page faults), and 20 of them measured
     * a 4 KiB shm get at 10x its steady p50. */
    int iters = o->iters;
    char sz[256] = "";
    size_t used = 0;
    for (int i = 0; i < o->nsizes && used < sizeof sz - 24; i++)
        if (o->sizes[i] <= ((size_t)16 << 20)) /* the raw tools' largest */
            used += (size_t)snprintf(sz + used, sizeof sz - used, "%s%zu", used ? "," : "", o->sizes[i]);
    if (!used) return;
    /* transfer --batch N: the raw loop posts the same N blocks per call and waits for all. */
    if (!strcmp(tool, "fi_raw"))
        snprintf(cmd, sizeof cmd, "timeout 120 '%s' -s %s -t %.3f -n %d -b %d 2>&1", path, sz, o->budget_ms / 1000.0,
                 iters, o->batch);
    else
        snprintf(cmd, sizeof cmd, "UCX_RAW_BATCH=%d timeout 120 '%s' %d %s %d 2>&1", o->batch, path, iters, sz,
                 o->budget_ms);
    cx_bench_progress(o, "baseline %s under %s", tool, v->name);
    cx_bench_variant_env(v, 1);
    FILE *f = popen(cmd, "r");
    cx_bench_variant_env(v, 0);
    if (!f) return;
    char line[512], name[40];
    snprintf(name, sizeof name, "%s(%s)", tool, v->name);
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        char op[32];
        unsigned long long bytes;
        double p50;
        int it = iters;
        double mbs;
        if (sscanf(line, "%31s %llu B iters %d p50 %lf", op, &bytes, &it, &p50) != 4 &&
            sscanf(line, "%31s %llu %lf %lf %d", op, &bytes, &p50, &mbs, &it) < 3)
            continue;
        if (p50 <= 0) continue;
        if (strcmp(op, "read") && strcmp(op, "write")) continue;
        if (!cx_bench_list_has(o->ops, op)) continue;
        cx_bench_row_t r;
        memset(&r, 0, sizeof r);
        snprintf(r.backend, sizeof r.backend, "%s", name);
        snprintf(r.op, sizeof r.op, "%.15s", op);
        r.size = (size_t)bytes;
        r.iters = it;
        r.p50_us = p50;
        r.batch = o->batch;
        r.gbps = (double)bytes * (o->batch ? o->batch : 1) / (p50 * 1e3);
        r.baseline = 1;
        if (o->batch)
            snprintf(r.note, sizeof r.note, "p50 only, %d blocks per call", o->batch);
        else
            snprintf(r.note, sizeof r.note, "p50 only");
        cx_bench_add_row(&r);
        got++;
    }
    int st = pclose(f);
    if (!got) {
        cx_bench_row_t r;
        memset(&r, 0, sizeof r);
        snprintf(r.backend, sizeof r.backend, "%s", name);
        snprintf(r.op, sizeof r.op, "-");
        r.baseline = 1;
        snprintf(r.note, sizeof r.note, "no result (exit status %d)", st);
        cx_bench_add_row(&r);
    }
}

static uint16_t free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t l = sizeof a;
    uint16_t p = 0;
    if (s >= 0 && bind(s, (void *)&a, sizeof a) == 0 && getsockname(s, (void *)&a, &l) == 0) p = ntohs(a.sin_port);
    if (s >= 0) close(s);
    return p;
}

/* One ucx_perftest pair: a server (killed afterwards) and the client whose "Final:" line holds
 * iterations, p50 latency (us), average and overall latency, then bandwidths (MB/s). */
static void perftest_point(const cx_bench_opts_t *o, const cx_bench_variant_t *v, const char *op, size_t size)
{
    const char *test = !strcmp(op, "read") ? "ucp_get" : "ucp_put_bw";
    uint16_t port = free_port();
    int n = o->iters;
    while (n > 5 && (double)n * (double)size > (double)(256u << 20)) n /= 2;
    char ps[16], ss[32], ns[16];
    snprintf(ps, sizeof ps, "%u", port);
    snprintf(ss, sizeof ss, "%zu", size);
    snprintf(ns, sizeof ns, "%d", n);
    cx_bench_variant_env(v, 1);
    pid_t srv = fork();
    if (srv == 0) {
        int dn = open("/dev/null", 1);
        if (dn >= 0) {
            dup2(dn, 1);
            dup2(dn, 2);
        }
        execlp("timeout", "timeout", "60", "ucx_perftest", "-p", ps, (char *)NULL);
        _exit(127);
    }
    usleep(300000); /* the server's listen; the client retries once below */
    char cmd[512], line[512];
    double p50 = 0;
    for (int attempt = 0; attempt < 2 && p50 <= 0; attempt++) {
        if (attempt) usleep(1000000);
        snprintf(cmd, sizeof cmd, "timeout 60 ucx_perftest 127.0.0.1 -p %s -t %s -s %s -n %s 2>&1", ps, test, ss, ns);
        FILE *f = popen(cmd, "r");
        if (!f) break;
        while (fgets(line, sizeof line, f)) {
            int it;
            double lat50, avg, overall;
            /* Both tests keep many ops outstanding (ucp_get over shm: 0.04 us "p50" at 4 KiB,
             * 22 M ops/s), so no per-op latency is measured: the elapsed time per op
             * ("overall") is the figure, a pipelined rate, not comparable to one op's p50. */
            if (sscanf(line, " Final: %d %lf %lf %lf", &it, &lat50, &avg, &overall) == 4) p50 = overall;
        }
        pclose(f);
    }
    cx_bench_variant_env(v, 0);
    if (srv > 0) {
        kill(srv, SIGTERM);
        waitpid(srv, NULL, 0);
    }
    cx_bench_row_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.backend, sizeof r.backend, "ucx_perftest(%s)", v->name);
    snprintf(r.op, sizeof r.op, "%s", op);
    r.size = size;
    r.baseline = 1;
    r.iters = n;
    r.p50_us = p50;
    r.gbps = p50 > 0 ? (double)size / (p50 * 1e3) : 0;
    snprintf(r.note, sizeof r.note, "%s",
             p50 > 0 ? (!strcmp(op, "read") ? "ucp_get, pipelined time/op" : "ucp_put_bw, pipelined time/op")
                     : "no result");
    cx_bench_add_row(&r);
}

static int have_perftest(void)
{
    return system("command -v ucx_perftest >/dev/null 2>&1") == 0;
}

void cx_bench_baselines(const cx_bench_opts_t *o, const cx_bench_variant_t *const *vs, int nv)
{
    if (!strcmp(o->baselines, "none")) return;
    if (cx_bench_list_has(o->baselines, "memcpy")) run_memcpy(o);
    cx_bench_rawnet(o);
    int perftest = cx_bench_list_has(o->baselines, "perftest") && have_perftest();
    for (int i = 0; i < nv; i++) {
        if (!vs[i]->raw) continue;
        if (!strcmp(vs[i]->raw, "ucx") && cx_bench_list_has(o->baselines, "ucx_raw")) run_raw_tool(o, vs[i], "ucx_raw");
        if (!strcmp(vs[i]->raw, "fi") && cx_bench_list_has(o->baselines, "fi_raw")) run_raw_tool(o, vs[i], "fi_raw");
        if (!strcmp(vs[i]->raw, "ucx") && perftest) {
            for (int s = 0; s < o->nsizes; s++) {
                char hs[32];
                cx_bench_progress(o, "baseline ucx_perftest(%s) %s", vs[i]->name,
                                  cx_bench_human(o->sizes[s], hs, sizeof hs));
                if (cx_bench_list_has(o->ops, "read")) perftest_point(o, vs[i], "read", o->sizes[s]);
                if (cx_bench_list_has(o->ops, "write")) perftest_point(o, vs[i], "write", o->sizes[s]);
            }
        }
    }
}
