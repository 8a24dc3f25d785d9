/* connex-bench utilities: time, sizes, percentiles, the progress line, data patterns, process
 * probes and the table of backend variants. */
#include "bench.h"

#include <ctype.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t cx_bench_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

int cx_bench_parse_size(const char *s, size_t *out)
{
    char *end;
    if (!s || !isdigit((unsigned char)*s)) return -1;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K':
        shift = 10;
        end++;
        break;
    case 'M':
        shift = 20;
        end++;
        break;
    case 'G':
        shift = 30;
        end++;
        break;
    default: return -1;
    }
    if (*end == 'i' || *end == 'B') end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end || v == 0 || v > (1ull << 40) >> shift) return -1;
    *out = (size_t)(v << shift);
    return 0;
}

int cx_bench_parse_sizes(const char *s, cx_bench_opts_t *o)
{
    char buf[512];
    if (strlen(s) >= sizeof buf) return -1;
    snprintf(buf, sizeof buf, "%s", s);
    o->nsizes = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        size_t v;
        if (o->nsizes == CX_BENCH_MAX_SIZES || cx_bench_parse_size(t, &v)) {
            fprintf(stderr, "connex-bench: bad size '%s' (use e.g. 4K,16K,16M; at most %d sizes, 1 TiB)\n", t,
                    CX_BENCH_MAX_SIZES);
            return -1;
        }
        o->sizes[o->nsizes++] = v;
    }
    return o->nsizes ? 0 : -1;
}

const char *cx_bench_human(size_t n, char *buf, size_t len)
{
    if (n >= (1u << 20) && n % (1u << 20) == 0)
        snprintf(buf, len, "%zu MiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0)
        snprintf(buf, len, "%zu KiB", n >> 10);
    else
        snprintf(buf, len, "%zu B", n);
    return buf;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentiles: with 200 samples p99 is the second largest, not an interpolation. */
cx_bench_dist_t cx_bench_dist(uint64_t *ns, int n)
{
    cx_bench_dist_t d = { n, 0, 0, 0 };
    if (n <= 0) return d;
    qsort(ns, (size_t)n, sizeof *ns, cmp_u64);
    int i50 = (n * 50 + 99) / 100 - 1, i99 = (n * 99 + 99) / 100 - 1;
    d.p50 = (double)ns[i50 < 0 ? 0 : i50] / 1e3;
    d.p99 = (double)ns[i99 < 0 ? 0 : i99] / 1e3;
    d.max = (double)ns[n - 1] / 1e3;
    return d;
}

void cx_bench_row_fill(cx_bench_row_t *r, uint64_t *ns, int n)
{
    cx_bench_dist_t d = cx_bench_dist(ns, n);
    r->iters = n;
    r->p50_us = d.p50;
    r->p99_us = d.p99;
    r->max_us = d.max;
    r->gbps = d.p50 > 0 ? (double)r->size / (d.p50 * 1e3) : 0;
}

void cx_bench_progress(const cx_bench_opts_t *o, const char *fmt, ...)
{
    if (o->quiet) return;
    char line[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* On a terminal one line is rewritten; in a log every step gets its own line. */
    if (isatty(2))
        fprintf(stderr, "\r\033[K%s", line);
    else
        fprintf(stderr, "%s\n", line);
}

void cx_bench_progress_done(const cx_bench_opts_t *o)
{
    if (!o->quiet && isatty(2)) fprintf(stderr, "\r\033[K");
}

int cx_bench_list_has(const char *list, const char *name)
{
    if (!list || !strcmp(list, "all")) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        if (l == n && !strncmp(p, name, n)) return 1;
        if (!c) break;
        p = c + 1;
    }
    return 0;
}

static inline uint64_t word(uint32_t seed, uint64_t i)
{
    return (i + ((uint64_t)seed << 40) + 1) * 0x9E3779B97F4A7C15ULL;
}

void cx_bench_fill(void *buf, size_t len, uint32_t seed)
{
    uint64_t *w = buf;
    for (size_t i = 0; i < len / 8; i++) w[i] = word(seed, i);
}

void cx_bench_fill_at(void *buf, size_t len, uint32_t seed, size_t off)
{
    uint64_t *w = buf;
    for (size_t i = 0; i < len / 8; i++) w[i] = word(seed, off / 8 + i);
}

/* buf holds the bytes of a region filled with seed, from byte offset off (a multiple of 8). */
int cx_bench_check(const void *buf, size_t len, uint32_t seed, size_t off)
{
    const uint64_t *w = buf;
    for (size_t i = 0; i < len / 8; i++)
        if (w[i] != word(seed, off / 8 + i)) return 0;
    return 1;
}

long cx_bench_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    long n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n - 1; /* the directory's own fd */
}

long cx_bench_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &v) == 1) break;
    fclose(f);
    return v;
}

/* The conformance suite's variants: the transport inside a backend changes the numbers by 10x,
 * so "ucx" alone would say little. */
static const cx_bench_variant_t variants[] = {
    { "ucx_shm", "ucx", { "UCX_TLS=posix,cma,self", NULL }, "ucx", 1 },
    { "ucx_tcp", "ucx", { "UCX_TLS=tcp,self", NULL }, "ucx", 0 },
    { "libfabric_shm", "libfabric", { "CONNEX_FI_PROVIDER=shm", NULL }, "fi", 1 },
    { "libfabric_tcp", "libfabric", { "CONNEX_FI_PROVIDER=tcp;ofi_rxm", NULL }, "fi", 0 },
    { "zmq", "zmq", { NULL }, NULL, 0 },
};

int cx_bench_variants(const char *list, const cx_bench_variant_t **out, int max)
{
    int n = 0;
    const int nv = (int)(sizeof variants / sizeof variants[0]);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list ? list : "all");
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int hit = 0;
        for (int i = 0; i < nv; i++) {
            if (strcmp(t, "all") && strcmp(t, variants[i].name) && strcmp(t, variants[i].backend)) continue;
            hit = 1;
            int dup = 0;
            for (int k = 0; k < n; k++) dup |= out[k] == &variants[i];
            if (!dup && n < max) out[n++] = &variants[i];
        }
        if (!hit) {
            fprintf(stderr,
                    "connex-bench: unknown backend '%s' (all, ucx, ucx_shm, ucx_tcp, libfabric, "
                    "libfabric_shm, libfabric_tcp, zmq)\n",
                    t);
            return -1;
        }
    }
    return n;
}

void cx_bench_variant_env(const cx_bench_variant_t *v, int set)
{
    if (set)
        setenv("CONNEX_BACKEND", v->backend, 1);
    else
        unsetenv("CONNEX_BACKEND");
    for (int i = 0; i < CX_BENCH_MAX_ENV && v->env[i]; i++) {
        char k[64];
        const char *eq = strchr(v->env[i], '=');
        snprintf(k, sizeof k, "%.*s", (int)(eq - v->env[i]), v->env[i]);
        if (set)
            setenv(k, eq + 1, 1);
        else
            unsetenv(k);
    }
}

int cx_bench_parse_mem(const char *s)
{
    int k = !strcmp(s, "host") ? CX_MEM_HOST : !strcmp(s, "sim") ? CX_MEM_SIM : !strcmp(s, "cuda") ? CX_MEM_CUDA : -1;
    if (k == CX_MEM_SIM) setenv("CONNEX_GPU_SIM", "1", 1); /* before any engine: the device is read once */
    return k;
}

const char *cx_bench_mem_name(int kind)
{
    return kind == CX_MEM_SIM ? "sim" : kind == CX_MEM_CUDA ? "cuda" : "host";
}
