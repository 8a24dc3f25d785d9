/* connex-bench results: kept in memory while the run goes on, then printed as aligned tables,
 * written as JSON and plotted with gnuplot (bandwidth and p50 latency against size, one line per
 * backend, one panel per op). */
#include "bench.h"
#include "json_str.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define MAX_ROWS 2048
#define MAX_FO 64
#define MAX_SOAK 16

static cx_bench_row_t rows[MAX_ROWS];
static int nrows;
static int cur_round;
static cx_bench_fo_row_t fos[MAX_FO];
static int nfos;
static cx_bench_soak_t soaks[MAX_SOAK];
static int nsoaks;

void cx_bench_set_round(int round)
{
    cur_round = round;
}

void cx_bench_add_row(const cx_bench_row_t *r)
{
    if (nrows < MAX_ROWS) {
        rows[nrows] = *r;
        rows[nrows++].round = cur_round;
    }
}
int cx_bench_nrows(void)
{
    return nrows;
}
const cx_bench_row_t *cx_bench_rows(void)
{
    return rows;
}
void cx_bench_add_fo(const cx_bench_fo_row_t *r)
{
    if (nfos < MAX_FO) fos[nfos++] = *r;
}
void cx_bench_add_soak(const cx_bench_soak_t *s)
{
    if (nsoaks < MAX_SOAK) soaks[nsoaks++] = *s;
}

static const char *op_order[] = { "read", "write", "put_signal", "copy", "h2d", "d2h", "-" };

static int op_rank(const char *op)
{
    for (int i = 0; i < 7; i++)
        if (!strcmp(op, op_order[i])) return i;
    return 7;
}

/* Grouped by op and size so every backend and baseline for one quantity sit together; within a
 * group, connex rows first in run order, then baselines. */
static int cmp_rows(const void *a, const void *b)
{
    const cx_bench_row_t *x = *(cx_bench_row_t *const *)a, *y = *(cx_bench_row_t *const *)b;
    int d = op_rank(x->op) - op_rank(y->op);
    if (d) return d;
    if (x->size != y->size) return x->size < y->size ? -1 : 1;
    if (x->baseline != y->baseline) return x->baseline - y->baseline;
    return x < y ? -1 : x > y;
}

static const char *us(double v, char *b, size_t n)
{
    if (v <= 0)
        snprintf(b, n, "-");
    else if (v >= 10000)
        snprintf(b, n, "%.1f ms", v / 1e3);
    else
        snprintf(b, n, "%.1f us", v);
    return b;
}

void cx_bench_print_transfer(void)
{
    const cx_bench_row_t **s = malloc(sizeof *s * (size_t)(nrows ? nrows : 1));
    if (!s) return;
    for (int i = 0; i < nrows; i++) s[i] = &rows[i];
    qsort(s, (size_t)nrows, sizeof *s, cmp_rows);
    printf("\n%-10s %8s  %-26s %-9s %6s %11s %11s %11s %9s  %s\n", "op", "size", "backend", "pair", "iters", "p50",
           "p99", "max", "GB/s", "result");
    printf("%-10s %8s  %-26s %-9s %6s %11s %11s %11s %9s  %s\n", "----------", "--------", "--------------------------",
           "---------", "------", "-----------", "-----------", "-----------", "---------", "------------------------");
    const char *prev_op = "";
    for (int i = 0; i < nrows; i++) {
        const cx_bench_row_t *r = s[i];
        if (*prev_op && strcmp(prev_op, r->op)) putchar('\n');
        prev_op = r->op;
        char sz[32] = "-", a[32], b[32], c[32], bw[32] = "-";
        if (r->size) cx_bench_human(r->size, sz, sizeof sz);
        if (r->gbps > 0) snprintf(bw, sizeof bw, "%.3f", r->gbps);
        char name[64];
        if (!r->baseline && (r->mem_local != CX_MEM_HOST || r->mem_remote != CX_MEM_HOST))
            snprintf(name, sizeof name, "%s [%s,%s]", r->backend, cx_bench_mem_name(r->mem_local),
                     cx_bench_mem_name(r->mem_remote));
        else
            snprintf(name, sizeof name, "%s", r->backend);
        printf("%-10s %8s  %-26s %-9s %6d %11s %11s %11s %9s  %s\n", r->op, sz, name, r->baseline ? "-" : r->pair,
               r->iters, us(r->p50_us, a, sizeof a), us(r->p99_us, b, sizeof b), us(r->max_us, c, sizeof c), bw,
               r->note);
    }
    free(s);
}

/* A staged row (transfer --mem) and what bounds it in the same run and round: the same variant,
 * op, size and shape host to host, and the device's copy rate (the slower direction of every
 * device kind the row stages through); ratio = GB/s / min(host, copy). */
typedef struct cx_bench_staged {
    const cx_bench_row_t *r;
    double host, copy, ratio;
} cx_bench_staged_t;

static double copy_rate(const cx_bench_row_t *r, int kind)
{
    char name[40];
    snprintf(name, sizeof name, "copy_%s", cx_bench_mem_name(kind));
    double g = 0;
    for (int i = 0; i < nrows; i++)
        if (rows[i].baseline && rows[i].size == r->size && rows[i].round == r->round &&
            !strcmp(rows[i].backend, name) && rows[i].gbps > 0 && (g == 0 || rows[i].gbps < g))
            g = rows[i].gbps;
    return g;
}

static int staged_rows(cx_bench_staged_t *out, int max)
{
    int n = 0;
    for (int i = 0; i < nrows && n < max; i++) {
        const cx_bench_row_t *r = &rows[i];
        if (r->baseline || (r->mem_local == CX_MEM_HOST && r->mem_remote == CX_MEM_HOST) || r->gbps <= 0) continue;
        cx_bench_staged_t s = { r, 0, 0, 0 };
        for (int j = 0; j < nrows; j++) {
            const cx_bench_row_t *h = &rows[j];
            if (!h->baseline && h->mem_local == CX_MEM_HOST && h->mem_remote == CX_MEM_HOST && h->size == r->size &&
                h->round == r->round && h->batch == r->batch && h->async == r->async && !strcmp(h->op, r->op) &&
                !strcmp(h->backend, r->backend))
                s.host = h->gbps;
        }
        double cl = r->mem_local != CX_MEM_HOST ? copy_rate(r, r->mem_local) : 0;
        double cr = r->mem_remote != CX_MEM_HOST ? copy_rate(r, r->mem_remote) : 0;
        s.copy = cl && cr ? (cl < cr ? cl : cr) : cl ? cl : cr;
        double bound = s.host && s.copy ? (s.host < s.copy ? s.host : s.copy) : s.host ? s.host : s.copy;
        s.ratio = bound > 0 ? r->gbps / bound : 0;
        out[n++] = s;
    }
    return n;
}

void cx_bench_print_staged(void)
{
    static cx_bench_staged_t st[MAX_ROWS];
    int n = staged_rows(st, MAX_ROWS);
    printf("\nstaged (--mem) beside host to host and the device's copy rate, GB/s; x bound = staged / "
           "min(host, copy)\n");
    printf("%-14s %-10s %8s %-10s %9s %9s %9s %8s\n", "backend", "op", "size", "mem", "staged", "host", "copy",
           "x bound");
    for (int i = 0; i < n; i++) {
        const cx_bench_row_t *r = st[i].r;
        char sz[32], mem[24];
        cx_bench_human(r->size, sz, sizeof sz);
        snprintf(mem, sizeof mem, "%s,%s", cx_bench_mem_name(r->mem_local), cx_bench_mem_name(r->mem_remote));
        printf("%-14s %-10s %8s %-10s %9.3f %9.3f %9.3f %8.2f\n", r->backend, r->op, sz, mem, r->gbps, st[i].host,
               st[i].copy, st[i].ratio);
    }
}

static const char *ms3(const cx_bench_dist_t *d, char *b, size_t n)
{
    if (d->n <= 0)
        snprintf(b, n, "-");
    else
        snprintf(b, n, "%.1f/%.1f/%.1f", d->p50 / 1e3, d->p99 / 1e3, d->max / 1e3);
    return b;
}

void cx_bench_print_failover(void)
{
    printf("\ntimes in ms, p50/p99/max over the runs\n");
    printf("%-14s %-9s %5s %-22s %-22s %-22s %-22s %-22s  %s\n", "backend", "fault", "ok", "fault->first event",
           "fault->FAILED", "fault->in-flight op", "start->1st transfer", "engine up->1st xfer", "notes");
    for (int i = 0; i < nfos; i++) {
        const cx_bench_fo_row_t *f = &fos[i];
        char a[64], b[64], c[64], d[64], e[64], ok[16];
        snprintf(ok, sizeof ok, "%d/%d", f->ok, f->runs);
        printf("%-14s %-9s %5s %-22s %-22s %-22s %-22s %-22s  %s\n", f->backend, f->fault, ok,
               ms3(&f->to_event, a, sizeof a), ms3(&f->to_failed, b, sizeof b), ms3(&f->to_ops, c, sizeof c),
               ms3(&f->to_rejoin, d, sizeof d), ms3(&f->up_rejoin, e, sizeof e), f->note);
    }
}

void cx_bench_print_targets(uint32_t hb_ms, uint32_t hb_to_ms)
{
    /* The targets, checked against what was measured; a verdict, not an exit status
     * (the numbers depend on the host and its load). */
    printf("\ntargets (this host, loopback):\n");
    for (int i = 0; i < nfos; i++) {
        const cx_bench_fo_row_t *f = &fos[i];
        if (f->to_failed.n <= 0) continue;
        if (!strcmp(f->fault, "sigkill"))
            printf("  %-14s SIGKILL -> FAILED p99 %.1f ms (target < 5 ms): %s\n", f->backend, f->to_failed.p99 / 1e3,
                   f->to_failed.p99 < 5000 ? "met" : "MISSED");
        else if (!strcmp(f->fault, "sigstop"))
            printf("  %-14s SIGSTOP -> FAILED %.0f..%.0f ms, SUSPECT p50 %.0f ms (timeout %u, interval %u: FAILED "
                   "expected in [%u, %u]): %s\n",
                   f->backend, f->to_failed.p50 / 1e3, f->to_failed.max / 1e3, f->to_event.p50 / 1e3, hb_to_ms, hb_ms,
                   hb_to_ms - hb_ms, hb_to_ms + hb_ms,
                   f->to_failed.max / 1e3 <= hb_to_ms + hb_ms && f->to_failed.p50 / 1e3 >= hb_to_ms - hb_ms ? "met"
                                                                                                            : "MISSED");
        if (f->up_rejoin.n > 0)
            printf("  %-14s %-8s rejoin: engine up -> first transfer p99 %.1f ms (target < 50 ms): %s; "
                   "process start -> first transfer p99 %.1f ms\n",
                   f->backend, f->fault, f->up_rejoin.p99 / 1e3, f->up_rejoin.p99 < 50000 ? "met" : "MISSED",
                   f->to_rejoin.p99 / 1e3);
    }
}

static const char *const soak_kinds[CX_SOAK_KINDS] = { "read", "write", "put_signal", "batch" };

void cx_bench_print_soak(void)
{
    printf("\n%-14s %9s %-11s %-23s %-34s %-16s %-18s %-18s %s\n", "backend", "kills", "fds s/w/e", "RSS KiB s/w/e",
           "ops ok/EPEER/ETIMEDOUT/unreg/other", "kill->FAILED", "start->xfer", "engine up->xfer", "verdict");
    for (int i = 0; i < nsoaks; i++) {
        const cx_bench_soak_t *s = &soaks[i];
        char a[48], b[64], c[96], e[64], f[64], g[64], cy[24];
        uint64_t t[CX_SOAK_RESULTS] = { 0 };
        for (int k = 0; k < CX_SOAK_KINDS; k++)
            for (int r = 0; r < CX_SOAK_RESULTS; r++) t[r] += s->ops[k][r];
        snprintf(cy, sizeof cy, "%d/%d", s->done, s->cycles);
        snprintf(a, sizeof a, "%ld/%ld/%ld", s->fds_start, s->fds_warm, s->fds_end);
        snprintf(b, sizeof b, "%ld/%ld/%ld", s->rss_start, s->rss_warm, s->rss_end);
        snprintf(c, sizeof c, "%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64, t[CX_SOAK_OK],
                 t[CX_SOAK_EPEER], t[CX_SOAK_ETIMEDOUT], t[CX_SOAK_EARLY], t[CX_SOAK_OTHER]);
        printf("%-14s %9s %-11s %-23s %-34s %-16s %-18s %-18s %s\n", s->backend, cy, a, b, c,
               ms3(&s->to_failed, e, sizeof e), ms3(&s->to_rejoin, f, sizeof f), ms3(&s->up_rejoin, g, sizeof g),
               s->verdict);
    }
    printf("\nper op kind (ok/EPEER/ETIMEDOUT/unreg/other, bad data); unreg: CX_EINVAL for an op started before "
           "the restarted peer had registered its region:\n");
    for (int i = 0; i < nsoaks; i++) {
        const cx_bench_soak_t *s = &soaks[i];
        printf("  %-14s", s->backend);
        for (int k = 0; k < CX_SOAK_KINDS; k++)
            printf(" %s %" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 " %" PRIu64 ";", soak_kinds[k],
                   s->ops[k][CX_SOAK_OK], s->ops[k][CX_SOAK_EPEER], s->ops[k][CX_SOAK_ETIMEDOUT],
                   s->ops[k][CX_SOAK_EARLY], s->ops[k][CX_SOAK_OTHER], s->ops[k][CX_SOAK_BADDATA]);
        for (int c = 1; c < 16; c++)
            if (s->other_codes[c]) printf(" %s: %" PRIu64, c < 15 ? cx_strerror(-c) : "other", s->other_codes[c]);
        if (s->up_rejoin.n)
            printf(" rejoin p50 %.1f ms from start, %.1f ms from engine up (target < 50 ms): %s",
                   s->to_rejoin.p50 / 1e3, s->up_rejoin.p50 / 1e3, s->to_rejoin.p50 < 50000 ? "met" : "MISSED");
        printf("\n");
    }
}

static void jdist(FILE *f, const char *name, const cx_bench_dist_t *d);

static void soak_json(FILE *f, const cx_bench_soak_t *s)
{
    fprintf(f,
            "{\"backend\": \"%s\", \"kills\": %d, \"done\": %d, \"threads\": %d, \"seed\": %" PRIu64
            ", \"seconds\": %.1f, \"crash_signal\": %d, \"fds\": {\"start\": %ld, \"warm\": %ld, \"end\": %ld, "
            "\"max\": %ld}, \"rss_kib\": {\"start\": %ld, \"warm\": %ld, \"end\": %ld, \"max\": %ld}, "
            "\"regions\": [%ld, %ld], \"registered_bytes\": [%ld, %ld], \"ops\": {",
            s->backend, s->cycles, s->done, s->threads, s->seed, s->seconds, s->crashed, s->fds_start, s->fds_warm,
            s->fds_end, s->fds_max, s->rss_start, s->rss_warm, s->rss_end, s->rss_max, s->regions_start, s->regions_end,
            s->rbytes_start, s->rbytes_end);
    for (int k = 0; k < CX_SOAK_KINDS; k++)
        fprintf(f,
                "%s\"%s\": {\"ok\": %" PRIu64 ", \"epeer\": %" PRIu64 ", \"etimedout\": %" PRIu64
                ", \"unregistered\": %" PRIu64 ", \"other\": %" PRIu64 ", \"bad_data\": %" PRIu64 "}",
                k ? ", " : "", soak_kinds[k], s->ops[k][CX_SOAK_OK], s->ops[k][CX_SOAK_EPEER],
                s->ops[k][CX_SOAK_ETIMEDOUT], s->ops[k][CX_SOAK_EARLY], s->ops[k][CX_SOAK_OTHER],
                s->ops[k][CX_SOAK_BADDATA]);
    fputs("}, \"other_codes\": {", f);
    for (int c = 1, n = 0; c < 16; c++)
        if (s->other_codes[c]) fprintf(f, "%s\"%d\": %" PRIu64, n++ ? ", " : "", c < 15 ? -c : 0, s->other_codes[c]);
    fputs("}, ", f);
    jdist(f, "kill_to_failed", &s->to_failed);
    fputs(", ", f);
    jdist(f, "start_to_first_transfer", &s->to_rejoin);
    fputs(", ", f);
    jdist(f, "engine_up_to_first_transfer", &s->up_rejoin);
    fputs(", \"verdict\": ", f);
    fputc('"', f);
    for (const char *p = s->verdict; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', f);
        if ((unsigned char)*p >= 0x20) fputc(*p, f);
    }
    fputs("\"}", f);
}

void cx_bench_soak_json_line(void)
{
    fputs("{\"soak\": [", stdout);
    for (int i = 0; i < nsoaks; i++) {
        if (i) fputs(", ", stdout);
        soak_json(stdout, &soaks[i]);
    }
    fputs("]}\n", stdout);
    fflush(stdout);
}

/* ------------------------------------------------------------------ JSON */

static void jdist(FILE *f, const char *name, const cx_bench_dist_t *d)
{
    fprintf(f, "\"%s\": {\"n\": %d, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f}", name, d->n, d->p50 / 1e3,
            d->p99 / 1e3, d->max / 1e3);
}

int cx_bench_write_json(const cx_bench_opts_t *o, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return -1;
    }
    struct utsname u;
    uname(&u);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    char ts[64];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f, "{\n  \"tool\": \"connex-bench\", \"date\": \"%s\", \"host\": ", ts);
    cx_json_str(f, host);
    fprintf(f, ", \"kernel\": ");
    cx_json_str(f, u.release);
    fprintf(f, ", \"cpus\": %ld,\n  \"command\": ", sysconf(_SC_NPROCESSORS_ONLN));
    cx_json_str(f, o->cmdline);
    fprintf(f, ",\n  \"transfer\": [");
    for (int i = 0; i < nrows; i++) {
        const cx_bench_row_t *r = &rows[i];
        fprintf(f, "%s\n    {\"backend\": ", i ? "," : "");
        cx_json_str(f, r->backend);
        fprintf(f, ", \"pair\": ");
        cx_json_str(f, r->pair);
        fprintf(f, ", \"baseline\": %s, \"op\": ", r->baseline ? "true" : "false");
        cx_json_str(f, r->op);
        fprintf(f,
                ", \"size\": %zu, \"iters\": %d, \"p50_us\": %.3f, \"p99_us\": %.3f, \"max_us\": %.3f, "
                "\"gbps\": %.4f, \"round\": %d, \"batch\": %d, \"async\": %s, \"mem_local\": \"%s\", "
                "\"mem_remote\": \"%s\", \"result\": ",
                r->size, r->iters, r->p50_us, r->p99_us, r->max_us, r->gbps, r->round, r->batch,
                r->async ? "true" : "false", cx_bench_mem_name(r->mem_local), cx_bench_mem_name(r->mem_remote));
        cx_json_str(f, r->note);
        fputc('}', f);
    }
    static cx_bench_ratio_t rs[MAX_ROWS];
    int nr = cx_bench_ratios(rs, MAX_ROWS);
    fprintf(f, "\n  ],\n  \"vs_raw\": [");
    for (int i = 0; i < nr; i++) {
        fprintf(f, "%s\n    {\"backend\": ", i ? "," : "");
        cx_json_str(f, rs[i].backend);
        fprintf(f, ", \"raw\": ");
        cx_json_str(f, rs[i].raw);
        fprintf(f, ", \"op\": ");
        cx_json_str(f, rs[i].op);
        fprintf(f,
                ", \"size\": %zu, \"batch\": %d, \"async\": %s, \"rounds\": %d, \"p50_us\": %.3f, "
                "\"raw_p50_us\": %.3f, \"ratio\": %.3f, \"ratio_min\": %.3f, \"ratio_max\": %.3f, "
                "\"ratio_best\": %.3f}",
                rs[i].size, rs[i].batch, rs[i].async ? "true" : "false", rs[i].n, rs[i].cx_p50, rs[i].raw_p50,
                rs[i].ratio, rs[i].lo, rs[i].hi, rs[i].best);
    }
    static cx_bench_staged_t st[MAX_ROWS];
    int ns = staged_rows(st, MAX_ROWS);
    fprintf(f, "\n  ],\n  \"staged\": [");
    for (int i = 0; i < ns; i++) {
        const cx_bench_row_t *r = st[i].r;
        fprintf(f, "%s\n    {\"backend\": ", i ? "," : "");
        cx_json_str(f, r->backend);
        fprintf(f, ", \"op\": ");
        cx_json_str(f, r->op);
        fprintf(f,
                ", \"size\": %zu, \"round\": %d, \"mem_local\": \"%s\", \"mem_remote\": \"%s\", \"gbps\": %.4f, "
                "\"host_gbps\": %.4f, \"copy_gbps\": %.4f, \"vs_bound\": %.3f}",
                r->size, r->round, cx_bench_mem_name(r->mem_local), cx_bench_mem_name(r->mem_remote), r->gbps,
                st[i].host, st[i].copy, st[i].ratio);
    }
    fprintf(f, "\n  ],\n  \"failover\": [");
    for (int i = 0; i < nfos; i++) {
        const cx_bench_fo_row_t *r = &fos[i];
        fprintf(f, "%s\n    {\"backend\": ", i ? "," : "");
        cx_json_str(f, r->backend);
        fprintf(f, ", \"fault\": ");
        cx_json_str(f, r->fault);
        fprintf(f, ", \"runs\": %d, \"ok\": %d, ", r->runs, r->ok);
        jdist(f, "fault_to_first_event", &r->to_event);
        fputs(", ", f);
        jdist(f, "fault_to_failed", &r->to_failed);
        fputs(", ", f);
        jdist(f, "fault_to_inflight_return", &r->to_ops);
        fputs(", ", f);
        jdist(f, "start_to_first_transfer", &r->to_rejoin);
        fputs(", ", f);
        jdist(f, "engine_up_to_first_transfer", &r->up_rejoin);
        fprintf(f, ", \"note\": ");
        cx_json_str(f, r->note);
        fputc('}', f);
    }
    fprintf(f, "\n  ],\n  \"soak\": [");
    for (int i = 0; i < nsoaks; i++) {
        fprintf(f, "%s\n    ", i ? "," : "");
        soak_json(f, &soaks[i]);
    }
    fprintf(f, "\n  ]\n}\n");
    int bad = ferror(f);
    if (fclose(f) || bad) {
        fprintf(stderr, "connex-bench: writing %s failed\n", path);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ gnuplot */

/* One data file per (op, backend) in a private temporary directory; memcpy ("copy") is drawn
 * in every panel as the host's limit. */
/* The directory for scratch files: $TMPDIR, else the system's (P_tmpdir). */
static const char *tmp_base(void)
{
    const char *t = getenv("TMPDIR");
    return t && *t ? t : P_tmpdir;
}

int cx_bench_plot(const char *png)
{
    char dir[160];
    if (snprintf(dir, sizeof dir, "%s/connex-bench-plot.XXXXXX", tmp_base()) >= (int)sizeof dir) {
        fprintf(stderr, "connex-bench: TMPDIR too long for the plot's scratch directory\n");
        return -1;
    }
    if (!mkdtemp(dir)) {
        perror("connex-bench: mkdtemp");
        return -1;
    }
    char script[256];
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    FILE *g = fopen(script, "w");
    if (!g) {
        perror(script);
        return -1;
    }
    fprintf(g, "set terminal pngcairo size 1800,1000 noenhanced font ',9'\nset output '%s'\n", png);
    fprintf(g,
            "set multiplot layout 2,3 title 'connex-bench transfer (p50)'\nset logscale x 2\n"
            "set key top left font ',8'\nset grid\nset format x '%%.0s%%cB'\n");
    static const char *ops[] = { "read", "write", "put_signal" };
    int files = 0;
    for (int row = 0; row < 2; row++) {
        for (int oi = 0; oi < 3; oi++) {
            fprintf(g, "set title '%s: %s'\nset xlabel 'bytes'\n", ops[oi], row ? "p50 latency" : "bandwidth at p50");
            if (row)
                fprintf(g, "set ylabel 'microseconds'\nset logscale y 10\n");
            else
                fprintf(g, "set ylabel 'GB/s'\nunset logscale y\n");
            /* Distinct backends of this op (plus memcpy). */
            char names[64][40];
            int nn = 0;
            for (int i = 0; i < nrows && nn < 64; i++) {
                const cx_bench_row_t *r = &rows[i];
                if ((strcmp(r->op, ops[oi]) && strcmp(r->op, "copy")) || r->p50_us <= 0 || r->round) continue;
                int seen = 0;
                for (int k = 0; k < nn; k++) seen |= !strcmp(names[k], r->backend);
                if (!seen) snprintf(names[nn++], sizeof names[0], "%s", r->backend);
            }
            if (!nn) {
                fprintf(g, "set label 1 'no data' at graph 0.5,0.5\nplot NaN notitle\nunset label 1\n");
                continue;
            }
            fprintf(g, "plot ");
            for (int k = 0; k < nn; k++) {
                char dat[300];
                snprintf(dat, sizeof dat, "%s/%d_%d_%d.dat", dir, row, oi, k);
                FILE *d = fopen(dat, "w");
                if (!d) continue;
                for (int i = 0; i < nrows; i++) {
                    const cx_bench_row_t *r = &rows[i];
                    if (strcmp(r->backend, names[k]) || (strcmp(r->op, ops[oi]) && strcmp(r->op, "copy")) ||
                        r->p50_us <= 0 || r->round)
                        continue;
                    fprintf(d, "%zu %.6f %.3f\n", r->size, r->gbps, r->p50_us);
                }
                fclose(d);
                files++;
                fprintf(g, "%s'%s' using 1:%d with linespoints title '%s'", k ? ", " : "", dat, row ? 3 : 2, names[k]);
            }
            fprintf(g, "\n");
        }
    }
    fprintf(g, "unset multiplot\n");
    fclose(g);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>&1", script);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
    struct stat st;
    if (rc || stat(png, &st) || st.st_size == 0) {
        fprintf(stderr, "connex-bench: gnuplot failed (status %d; is gnuplot installed? Debian: gnuplot-nox)\n", rc);
        return -1;
    }
    fprintf(stderr, "connex-bench: plot written to %s (%d series)\n", png, files);
    return 0;
}
