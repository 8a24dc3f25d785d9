/* connex-bench classes: latency of critical reads while a big background transfer runs to the
 * same peer. Per backend variant, one peer process and three phases, each with a fresh
 * engine: idle (critical reads only), background + classes on (the transfer is a background-class
 * cx_read_async, cut into chunks that yield to critical ops), background + classes off
 * (classes_off = 1: the transfer goes as one op, the baseline). While a phase runs, the background
 * transfer is restarted whenever it finishes, so every critical read has one running beside it;
 * reads go on until --iters samples or --budget-ms. Reported: p50/p99/max of the critical reads,
 * the ratio of each p99 to the idle p99, and the background throughput of the transfers that
 * ran entirely beside critical reads (the last one, finished after the reads, is not counted). */
#include "bench.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct cls_res {
    cx_bench_dist_t d;
    int bg_done;    /* background transfers completed during the phase */
    double bg_gbps; /* their throughput */
    uint64_t chunks, deferred;
    char note[96];
} cls_res_t;

static int engine(cx_engine_t **e, uint32_t replica, int classes_off, const cx_bench_opts_t *o)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = CX_BENCH_MODEL;
    c.replica = replica; /* a fresh identity per phase: the peer sees new engines, not restarts */
    c.heartbeat_ms = 1000;
    c.heartbeat_timeout_ms = 30000; /* a loaded 2-core box must not fail the pair mid-phase */
    c.op_timeout_ms = 120000;       /* 1 GiB in one op with classes off */
    c.classes_off = classes_off;
    c.background_chunk = o->cls_chunk;
    return cx_engine_create(&c, e);
}

/* phase: 0 idle, 1 background + classes on, 2 background + classes off */
static int phase(const cx_bench_opts_t *o, const cx_bench_child_t *ch, uint8_t *buf, size_t buflen, int ph,
                 uint32_t replica, cls_res_t *r)
{
    memset(r, 0, sizeof *r);
    cx_engine_t *e = NULL;
    int rc = engine(&e, replica, ph == 2, o);
    if (rc) {
        snprintf(r->note, sizeof r->note, "FAIL: engine: %s", cx_strerror(rc));
        return -1;
    }
    uint64_t *ns = calloc((size_t)o->iters, sizeof *ns);
    int n = 0, bad = 0;
    cx_op_t *bg = NULL;
    uint64_t bg_t0 = 0, bg_ns = 0;
    size_t crit_off = o->cls_bg; /* critical reads land after the background range */
    if (!ns) {
        rc = CX_ENOMEM;
        goto out;
    }
    if ((rc = cx_register_memory(e, buf, buflen))) goto out;
    if ((rc = cx_connect(e, ch->url, 10000))) goto out;
    /* Warm-up: the connection and the first region lookups out of the timed reads. */
    for (int i = 0; i < 5 && !rc; i++) rc = cx_read(e, ch->url, buf + crit_off, ch->base + crit_off, o->cls_crit);
    if (rc) goto out;
    uint64_t t_end = cx_bench_now_ns() + (uint64_t)o->budget_ms * 1000000ull;
    while (n < o->iters && cx_bench_now_ns() < t_end) {
        if (bg) {
            /* Finished since the last read: restart it before the next one, so every timed read
             * starts with a transfer running. */
            int w = cx_op_wait(bg, 0);
            if (w != CX_EINPROGRESS) {
                bg = NULL;
                if (w) {
                    rc = w;
                    goto out;
                }
                r->bg_done++;
                bg_ns += cx_bench_now_ns() - bg_t0;
            }
        }
        if (ph && !bg) {
            bg_t0 = cx_bench_now_ns();
            rc = cx_read_async(e, ch->url, buf, ch->base, o->cls_bg, CX_CLASS_BACKGROUND, &bg);
            if (rc) goto out;
            /* Let it get going before the first critical read. */
            struct timespec ts = { 0, 2000000 };
            nanosleep(&ts, NULL);
        }
        uint64_t t0 = cx_bench_now_ns();
        rc = cx_read(e, ch->url, buf + crit_off, ch->base + crit_off, o->cls_crit);
        uint64_t t1 = cx_bench_now_ns();
        if (rc) goto out;
        ns[n++] = t1 - t0;
    }
    if (!cx_bench_check(buf + crit_off, o->cls_crit, 1, crit_off)) bad = 1;
out:
    if (bg) {
        /* Not counted in the throughput: it ends without critical reads beside it. */
        int w = cx_op_wait(bg, -1);
        if (w != CX_OK && !rc)
            rc = w;
        else if (!rc && !cx_bench_check(buf, o->cls_bg, 1, 0))
            bad = 1;
    }
    if (!rc && r->bg_done && !cx_bench_check(buf, o->cls_bg, 1, 0)) bad = 1;
    cx_stats_t st;
    if (e && cx_stats(e, &st) == CX_OK) {
        r->chunks = st.background_chunks;
        r->deferred = st.background_deferred;
    }
    if (r->bg_done && bg_ns) r->bg_gbps = (double)o->cls_bg * r->bg_done / (double)bg_ns;
    r->d = cx_bench_dist(ns, n);
    if (rc)
        snprintf(r->note, sizeof r->note, "FAIL: %s", cx_strerror(rc));
    else if (bad)
        snprintf(r->note, sizeof r->note, "FAIL: data differs");
    else if (n == 0)
        snprintf(r->note, sizeof r->note, "FAIL: no read within --budget-ms");
    /* Classes off: each read may wait for a whole transfer, so a phase can end with few. */
    else if (n < 10)
        snprintf(r->note, sizeof r->note, "ok (verified; few samples: p99 = max)");
    else
        snprintf(r->note, sizeof r->note, "ok (verified)");
    if (e) {
        cx_unregister_memory(e, buf);
        cx_engine_destroy(e);
    }
    free(ns);
    return strncmp(r->note, "ok", 2) ? -1 : 0;
}

static int classes_variant(const cx_bench_opts_t *o, const cx_bench_variant_t *v)
{
    size_t buflen = o->cls_bg + o->cls_crit + 4096;
    uint8_t *buf = mmap(NULL, buflen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        printf("%-14s FAIL: no memory for %zu bytes\n", v->name, buflen);
        return -1;
    }
    cx_bench_child_t ch = { .pid = -1, .in = -1, .out = -1 };
    cx_bench_child_opts_t co = { .region = buflen, .seed = 1, .hb_ms = 1000, .hb_timeout_ms = 30000 };
    int bad = 0;
    if (cx_bench_spawn(o, &ch, &co)) {
        printf("%-14s skipped: the peer did not start (backend not usable here?)\n", v->name);
        munmap(buf, buflen);
        return 0;
    }
    static const char *names[3] = { "idle", "bg+classes on", "bg+classes off" };
    cls_res_t r[3];
    for (int ph = 0; ph < 3; ph++) {
        cx_bench_progress(o, "classes %-14s %s", v->name, names[ph]);
        if (phase(o, &ch, buf, buflen, ph, 20 + (uint32_t)ph, &r[ph])) bad = 1;
    }
    cx_bench_progress_done(o);
    cx_bench_stop(&ch);
    munmap(buf, buflen);
    for (int ph = 0; ph < 3; ph++) {
        char ratio[32] = "";
        if (ph && r[0].d.p99 > 0) snprintf(ratio, sizeof ratio, "%.2fx", r[ph].d.p99 / r[0].d.p99);
        char bgbw[32] = "";
        if (ph && r[ph].bg_done) snprintf(bgbw, sizeof bgbw, "%d x %.2f GB/s", r[ph].bg_done, r[ph].bg_gbps);
        printf("%-14s %-15s %6d %10.1f %10.1f %10.1f %8s  %-18s %8" PRIu64 " %8" PRIu64 "  %s\n", v->name, names[ph],
               r[ph].d.n, r[ph].d.p50, r[ph].d.p99, r[ph].d.max, ratio, bgbw, r[ph].chunks, r[ph].deferred, r[ph].note);
    }
    if (r[0].d.p99 > 0 && r[1].d.n)
        printf("%-14s target (classes on: p99 within 2x of idle): %s\n", v->name,
               r[1].d.p99 <= 2 * r[0].d.p99 ? "met" : "MISSED");
    fflush(stdout);
    return bad ? -1 : 0;
}

int cx_bench_classes(const cx_bench_opts_t *o)
{
    const cx_bench_variant_t *vs[16];
    int nv = cx_bench_variants(o->backend, vs, 16), bad = 0;
    if (nv < 0) return 2;
    char hb[32], hc[32], hk[32];
    size_t chunk = o->cls_chunk ? o->cls_chunk : (size_t)1 << 20; /* the engine's default */
    printf("classes: %s critical reads while %s background reads run to the same peer (chunk %s); "
           "latency in us, p99 ratio to idle\n",
           cx_bench_human(o->cls_crit, hc, sizeof hc), cx_bench_human(o->cls_bg, hb, sizeof hb),
           cx_bench_human(chunk, hk, sizeof hk));
    printf("%-14s %-15s %6s %10s %10s %10s %8s  %-18s %8s %8s  %s\n", "backend", "phase", "n", "p50", "p99", "max",
           "p99/idle", "background", "chunks", "deferred", "note");
    for (int i = 0; i < nv; i++) {
        cx_bench_variant_env(vs[i], 1);
        if (classes_variant(o, vs[i])) bad = 1;
        cx_bench_variant_env(vs[i], 0);
    }
    if (bad) printf("FAIL: a phase did not complete (see the notes above)\n");
    return bad;
}
