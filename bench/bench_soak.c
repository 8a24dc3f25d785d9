/* connex-bench soak: N kill -9 and rejoin cycles of one peer identity against one survivor, per
 * backend variant. Every cycle moves data (checked) and samples the survivor's open fds, RSS,
 * registered regions and registered bytes. Verdict: fds, regions and registered bytes must end
 * where they began (fds may settle asynchronously: the last sample waits up to 2 s for it), and
 * RSS may not grow by more than 8 MiB plus 1 KiB per cycle (allocator noise, not a leak). */
#include "bench.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SOAK_REGION ((size_t)1 << 20)
#define SOAK_XFER 65536

static void track(long v, long *first, long *last, long *max, int c)
{
    if (c == 0) *first = *max = v;
    *last = v;
    if (v > *max) *max = v;
}

static void soak_variant(const cx_bench_opts_t *o, const char *vname, cx_bench_soak_t *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->backend, sizeof s->backend, "%s", vname);
    s->cycles = o->cycles;
    uint64_t *fails = calloc((size_t)o->cycles, sizeof *fails), *joins = calloc((size_t)o->cycles, sizeof *joins);
    int nf = 0, nj = 0;
    cx_engine_t *e = NULL;
    uint8_t *buf = mmap(NULL, SOAK_REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int rc = cx_bench_engine(&e, NULL, o->hb_ms, o->hb_timeout_ms, 10000);
    if (rc || !fails || !joins || buf == MAP_FAILED) {
        snprintf(s->verdict, sizeof s->verdict, "skipped: engine: %s", cx_strerror(rc ? rc : CX_ENOMEM));
        goto out;
    }
    if ((rc = cx_register_memory(e, buf, SOAK_REGION))) {
        snprintf(s->verdict, sizeof s->verdict, "FAIL: register: %s", cx_strerror(rc));
        goto out;
    }
    cx_bench_child_opts_t co = { .region = SOAK_REGION, .connect = cx_engine_local_url(e), .hb_ms = o->hb_ms,
                                 .hb_timeout_ms = o->hb_timeout_ms };
    uint64_t t0 = cx_bench_now_ns();
    for (int c = 0; c < o->cycles; c++) {
        cx_bench_progress(o, "soak %-14s cycle %d/%d", vname, c + 1, o->cycles);
        cx_bench_child_t ch = { .pid = -1, .in = -1, .out = -1 };
        co.seed = 10 + (uint32_t)c;
        if (cx_bench_spawn(o, &ch, &co)) {
            snprintf(s->verdict, sizeof s->verdict, "FAIL: cycle %d: peer did not start", c);
            break;
        }
        co.port = ch.port;
        cx_event_t ev;
        if (c == 0 ? cx_connect(e, ch.url, 10000) != CX_OK : cx_bench_wait_event(e, CX_EVENT_JOINED, 10000, &ev) != CX_OK) {
            snprintf(s->verdict, sizeof s->verdict, "FAIL: cycle %d: no %s", c, c ? "JOINED" : "connection");
            cx_bench_stop(&ch);
            break;
        }
        rc = cx_read(e, ch.url, buf, ch.base, SOAK_XFER);
        if (rc || !cx_bench_check(buf, SOAK_XFER, co.seed, 0)) {
            snprintf(s->verdict, sizeof s->verdict, "FAIL: cycle %d: read %s", c, rc ? cx_strerror(rc) : "data differs");
            cx_bench_stop(&ch);
            break;
        }
        if (c) joins[nj++] = cx_bench_now_ns() - ch.t_spawn_ns;
        cx_stats_t st;
        cx_stats(e, &st);
        long fds = cx_bench_count_fds();
        if (c == o->cycles - 1 && fds != s->fds_first)   /* a backend may close sockets from its thread */
            for (int i = 0; i < 200 && fds != s->fds_first; i++) { usleep(10000); fds = cx_bench_count_fds(); }
        track(fds, &s->fds_first, &s->fds_last, &s->fds_max, c);
        track(cx_bench_rss_kib(), &s->rss_first, &s->rss_last, &s->rss_max, c);
        track((long)st.regions, &s->regions_first, &s->regions_last, &s->regions_max, c);
        track((long)st.registered_bytes, &s->rbytes_first, &s->rbytes_last, &s->rbytes_max, c);
        uint64_t tk = cx_bench_now_ns();
        kill(ch.pid, SIGKILL);
        uint64_t tfail = 0;
        if (cx_bench_wait_event(e, CX_EVENT_FAILED, 5000, &ev)) {
            snprintf(s->verdict, sizeof s->verdict, "FAIL: cycle %d: no FAILED within 5 s of SIGKILL", c);
            cx_bench_reap(&ch);
            break;
        }
        tfail = ev.time_ns ? ev.time_ns : cx_bench_now_ns();
        fails[nf++] = tfail > tk ? tfail - tk : 0;
        cx_bench_reap(&ch);
        s->done = c + 1;
    }
    s->seconds = (double)(cx_bench_now_ns() - t0) / 1e9;
    s->to_failed = cx_bench_dist(fails, nf);
    s->to_rejoin = cx_bench_dist(joins, nj);
    if (!s->verdict[0]) {
        long rss_slack = 8 * 1024 + o->cycles;
        if (s->fds_last > s->fds_first) snprintf(s->verdict, sizeof s->verdict, "FAIL: fds grew");
        else if (s->regions_last > s->regions_first) snprintf(s->verdict, sizeof s->verdict, "FAIL: regions grew");
        else if (s->rbytes_last > s->rbytes_first) snprintf(s->verdict, sizeof s->verdict, "FAIL: registered bytes grew");
        else if (s->rss_last > s->rss_first + rss_slack)
            snprintf(s->verdict, sizeof s->verdict, "FAIL: RSS grew by %ld KiB", s->rss_last - s->rss_first);
        else snprintf(s->verdict, sizeof s->verdict, "ok (flat)");
    }
out:
    if (e) {
        if (buf != MAP_FAILED) cx_unregister_memory(e, buf);
        cx_engine_destroy(e);
    }
    if (buf != MAP_FAILED) munmap(buf, SOAK_REGION);
    free(fails);
    free(joins);
}

int cx_bench_soak(const cx_bench_opts_t *o)
{
    const cx_bench_variant_t *vs[16];
    int nv = cx_bench_variants(o->backend, vs, 16), bad = 0;
    if (nv < 0) return 2;
    for (int i = 0; i < nv; i++) {
        cx_bench_variant_env(vs[i], 1);
        cx_bench_soak_t s;
        soak_variant(o, vs[i]->name, &s);
        cx_bench_variant_env(vs[i], 0);
        if (strncmp(s.verdict, "ok", 2) && strncmp(s.verdict, "skipped", 7)) bad = 1;
        cx_bench_add_soak(&s);
    }
    cx_bench_progress_done(o);
    printf("\nsoak: SIGKILL and rejoin cycles; f/l/max = first/last/max sample of the survivor; times p50/p99/max\n");
    cx_bench_print_soak();
    if (o->json && cx_bench_write_json(o, o->json)) bad = 1;
    return bad;
}
