/* connex-bench transfer: every backend variant, one after the other in one run, against a peer
 * process: warm-up, then per op and size a timed loop (bounded in iterations and time); every op,
 * warm-up included, is checked outside its own timing. The raw baselines run in the same invocation. */
#include "bench.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { OP_READ, OP_WRITE, OP_PUTSIG };
static const char *op_names[] = { "read", "write", "put_signal" };

typedef struct target {
    const char *url;
    uint64_t base;
    size_t len;
    uint32_t seed;
    uint32_t op_seed; /* the next write's or put_signal's own pattern */
    int lmem, rmem;   /* CX_MEM_* of the local buffer and of the peer's region */
    uint8_t *shadow;  /* local device memory: the host copy that fills and checks go through */
} target_t;

/* The local buffer's bytes from / into host memory (outside any timing). */
static int loc_put(const target_t *t, uint8_t *loc, size_t size)
{
    return t->shadow ? cx_mem_copy(loc, t->shadow, size) : CX_OK;
}
static uint8_t *loc_host(const target_t *t, uint8_t *loc)
{
    return t->shadow ? t->shadow : loc;
}

/* Bounded wait for a message that starts with prefix (the peer's replies); others are dropped. */
static int await_reply(cx_engine_t *e, const char *prefix, char *ans, size_t n, int ms)
{
    uint64_t deadline = cx_bench_now_ns() + (uint64_t)ms * 1000000ull;
    size_t pl = strlen(prefix);
    while (cx_bench_now_ns() < deadline) {
        cx_msg_t m;
        if (cx_recv_msg(e, &m, 200)) continue;
        int hit = m.len > pl && !memcmp(m.data, prefix, pl);
        if (hit) snprintf(ans, n, "%.*s", (int)(m.len < n ? m.len : n - 1), (const char *)m.data);
        cx_msg_release(&m);
        if (hit) return 0;
    }
    return CX_ETIMEDOUT;
}

/* A message round trip to the peer: "INFO", "FILL", "CHK ...". */
static int ask(cx_engine_t *e, const char *url, const char *q, char *ans, size_t n)
{
    int rc = cx_send_msg(e, url, q, strlen(q));
    if (rc) return rc;
    char prefix[8];
    snprintf(prefix, sizeof prefix, "%.*s", (int)strcspn(q, " "), q);
    return await_reply(e, prefix, ans, n, 10000);
}

/* How a point moves its bytes: one op per call (nb 0), or nb blocks laid end to end, in one
 * batch (cx_batch_*) or as nb async ops waited for one by one (async). The arrays are the
 * point's, allocated outside the timing. */
typedef struct shape {
    int nb, async;
    cx_batch_entry_t *ents;
    cx_op_t **ops;
    int *st;
} shape_t;

static int timed_many(cx_engine_t *e, target_t *t, uint8_t *loc, int op, size_t size, size_t roff, const char *msg,
                      const shape_t *sh)
{
    int rc = CX_OK;
    if (!sh->async) {
        for (int k = 0; k < sh->nb; k++)
            sh->ents[k] = (cx_batch_entry_t){ .peer = t->url,
                                              .local = loc + (size_t)k * size,
                                              .remote = t->base + roff + (size_t)k * size,
                                              .len = size };
        if (op == OP_READ) return cx_batch_read(e, sh->ents, (size_t)sh->nb, sh->st);
        if (op == OP_WRITE) return cx_batch_write(e, sh->ents, (size_t)sh->nb, sh->st);
        cx_op_t *h = NULL;
        rc = cx_batch_put_signal(e, t->url, sh->ents, (size_t)sh->nb, msg, strlen(msg) + 1, CX_CLASS_CRITICAL, sh->st,
                                 &h);
        return rc ? rc : cx_op_wait(h, -1);
    }
    int n = 0;
    for (; n < sh->nb && rc == CX_OK; n++) {
        uint8_t *l = loc + (size_t)n * size;
        uint64_t r = t->base + roff + (size_t)n * size;
        rc = op == OP_READ ? cx_read_async(e, t->url, l, r, size, CX_CLASS_CRITICAL, &sh->ops[n])
                           : cx_write_async(e, t->url, l, r, size, CX_CLASS_CRITICAL, &sh->ops[n]);
    }
    if (rc) n--; /* the last one did not start */
    for (int k = 0; k < n; k++) {
        int r = cx_op_wait(sh->ops[k], -1);
        if (rc == CX_OK) rc = r;
    }
    return rc;
}

/* One op at remote offset roff: prepared, timed (*ns), then checked, all three bounded. Reads land
 * in a buffer filled with a sentinel first and are compared with the peer's pattern; a write or
 * put_signal sends a pattern of its own (seeded per op) that the peer checks in its memory (after
 * the write, on a CHK message; as the put_signal's message arrives). Returns the op's status, or
 * CX_ERR with *bad saying what the check found. */
static int one_op(cx_engine_t *e, target_t *t, uint8_t *loc, int op, size_t bsize, size_t roff, uint64_t *ns, char *bad,
                  size_t badlen, const shape_t *sh)
{
    char msg[96], ans[96];
    uint32_t seed = 0;
    size_t size = sh->nb ? bsize * (size_t)sh->nb : bsize; /* every byte of the call, checked as one range */
    if (op == OP_READ) {
        memset(loc_host(t, loc), 0xA5, size);
    } else {
        seed = t->op_seed++;
        if (seed == t->seed) seed = t->op_seed++; /* never the peer's own pattern */
        cx_bench_fill_at(loc_host(t, loc), size, seed, roff);
        snprintf(msg, sizeof msg, "PSIG %zu %zu %u", roff, size, seed);
    }
    int rc = loc_put(t, loc, size);
    if (rc) return rc;
    uint64_t t0 = cx_bench_now_ns();
    if (sh->nb) {
        rc = timed_many(e, t, loc, op, bsize, roff, msg, sh);
    } else if (op == OP_READ) {
        rc = cx_read(e, t->url, loc, t->base + roff, size);
    } else if (op == OP_WRITE) {
        rc = cx_write(e, t->url, loc, t->base + roff, size);
    } else {
        cx_op_t *h = NULL;
        rc = cx_put_signal(e, t->url, loc, t->base + roff, size, msg, strlen(msg) + 1, &h);
        if (rc == CX_OK) rc = cx_op_wait(h, -1);
    }
    *ns = cx_bench_now_ns() - t0;
    if (rc) return rc;
    if (op == OP_READ) {
        if (t->shadow && cx_mem_copy(t->shadow, loc, size))
            snprintf(bad, badlen, "device copy failed");
        else if (!cx_bench_check(loc_host(t, loc), size, t->seed, roff))
            snprintf(bad, badlen, "data differs");
    } else if (op == OP_WRITE) {
        snprintf(msg, sizeof msg, "CHK %zu %zu %u", roff, size, seed);
        if (ask(e, t->url, msg, ans, sizeof ans))
            snprintf(bad, badlen, "no CHK reply");
        else if (strncmp(ans, "CHK ok", 6))
            snprintf(bad, badlen, "written data not at the peer");
    } else {
        if (await_reply(e, "PSIG", ans, sizeof ans, 10000))
            snprintf(bad, badlen, "no PSIG reply");
        else if (strncmp(ans, "PSIG ok", 7))
            snprintf(bad, badlen, "data not in place when the signal arrived");
    }
    return *bad ? CX_ERR : CX_OK;
}

/* Peers the engine knows but never reaches (nobody listens on port 9 of 127.0.0.1), as a member
 * of a large deployment knows hundreds: each op must still find its own peer at once. */
static void add_idle_peers(cx_engine_t *e, int n)
{
    for (int k = 0; k < n; k++) {
        char u[CX_URL_MAX];
        snprintf(u, sizeof u, "127.0.0.1:9#idle|%d|%d|%d", k % 61, k % 7, k);
        (void)cx_connect(e, u, 1); /* refused: the peer stays known */
    }
}

/* CONNEX_BENCH_SAMPLES=DIR: every timed op's latency and start (CLOCK_MONOTONIC ns, the clock of
 * `perf record -k CLOCK_MONOTONIC`), a line each, for looking at slow phases (bench/README.md). */
static void dump_samples(const char *vname, int op, size_t size, const uint64_t *samples, const uint64_t *starts, int n)
{
    const char *dir = getenv("CONNEX_BENCH_SAMPLES");
    if (!dir || !*dir) return;
    char path[512];
    snprintf(path, sizeof path, "%s/%s-%d-%zu.txt", dir, vname, op, size);
    FILE *f = fopen(path, "w");
    if (!f) return;
    for (int i = 0; i < n; i++) fprintf(f, "%" PRIu64 " %" PRIu64 "\n", samples[i], starts[i]);
    fclose(f);
}

static void point(const cx_bench_opts_t *o, cx_engine_t *e, target_t *t, uint8_t *loc, const char *vname,
                  const char *pair, int op, size_t size, uint64_t *samples, int *pdone, int ptotal, const shape_t *sh)
{
    size_t total = sh->nb ? size * (size_t)sh->nb : size;
    uint64_t *starts = samples + o->iters + 1;
    cx_bench_row_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.backend, sizeof r.backend, "%s", vname);
    snprintf(r.pair, sizeof r.pair, "%s", pair);
    snprintf(r.op, sizeof r.op, "%s%s", op_names[op], sh->async ? ".async" : "");
    r.size = size;
    r.mem_local = t->lmem;
    r.mem_remote = t->rmem;
    char hs[32];
    cx_bench_progress(o, "[%3d/%3d] %-14s %-10s %8s", ++*pdone, ptotal, vname, r.op,
                      cx_bench_human(size, hs, sizeof hs));
    if (total > t->len) {
        snprintf(r.note, sizeof r.note, "skipped: peer region is %zu bytes", t->len);
        cx_bench_add_row(&r);
        return;
    }
    /* Ops land at distinct remote offsets (4 KiB apart, wrapping inside the peer's region; always
     * a multiple of 4 KiB, which the pattern checks need: a multiple of 8). */
    size_t slots = (t->len - total) / 4096 + 1;
    char bad[96] = "";
    uint64_t ns;
    /* Warm-up: connections, registration caches, page faults; bounded like the loop. */
    int rc = 0, warm = 0, wmax = o->iters / 10 < 2 ? 2 : o->iters / 10 > 20 ? 20 : o->iters / 10;
    uint64_t t_end = cx_bench_now_ns() + (uint64_t)o->budget_ms * 250000ull;
    while (warm < wmax && !rc && (warm < 1 || cx_bench_now_ns() < t_end)) {
        rc = one_op(e, t, loc, op, size, ((size_t)warm % slots) * 4096, &ns, bad, sizeof bad, sh);
        warm += !rc;
    }
    int n = 0, failed_op = -1;
    cx_stats_t s0, s1;
    int have_st = cx_stats(e, &s0) == CX_OK;
    /* The budget counts the timed ops' own time; the checks between them add to the wall time,
     * which is capped at 10x the budget (at least 3 ops are always done). */
    uint64_t spent = 0, budget = (uint64_t)o->budget_ms * 1000000ull, wall_end = cx_bench_now_ns() + 10 * budget;
    while (!rc && n < o->iters && (n < 3 || (spent < budget && cx_bench_now_ns() < wall_end))) {
        starts[n] = cx_bench_now_ns();
        rc = one_op(e, t, loc, op, size, ((size_t)(warm + n) % slots) * 4096, &ns, bad, sizeof bad, sh);
        samples[n] = ns;
        spent += ns;
        if (rc) failed_op = warm + n;
        n += !rc;
    }
    if (rc && failed_op < 0) failed_op = warm;
    dump_samples(vname, op, size, samples, starts, n);
    /* How many timed ops ended on their own caller's thread (docs/semantics.md, "Threads and
     * polling"): the rest went through the progress thread and paid its wake-ups. */
    int driven = have_st && n && cx_stats(e, &s1) == CX_OK
        ? (int)((s1.ops_driven_done - s0.ops_driven_done) * 100 / (uint64_t)n)
        : -1;
    /* Writes and put_signals overwrote the peer's pattern that reads check: ask for it back. */
    char ans[32];
    if (op != OP_READ && ask(e, t->url, "FILL", ans, sizeof ans) && !rc) {
        rc = CX_ERR;
        snprintf(bad, sizeof bad, "the peer did not restore its pattern");
    }
    if (rc) {
        /* Which op: the index counts warm-up ops too (every one is checked). */
        snprintf(r.note, sizeof r.note, "FAIL: op %d: %s", failed_op, *bad ? bad : cx_strerror(rc));
        cx_bench_add_row(&r);
        fprintf(stderr, "connex-bench: %s %s %s failed verification: %s\n", vname, op_names[op], hs, r.note);
        return;
    }
    cx_bench_row_fill(&r, samples, n);
    r.gbps *= sh->nb ? sh->nb : 1; /* every block of the call */
    r.batch = sh->nb;
    r.async = sh->async;
    static const char *const oks[] = { "ok (every op verified)", "ok (every op checked at the peer)",
                                       "ok (every op checked on arrival)" };
    snprintf(r.note, sizeof r.note, "%s", oks[op]);
    size_t nl = strlen(r.note);
    if (sh->nb)
        snprintf(r.note + nl, sizeof r.note - nl, ", %d x %s per call%s", sh->nb, hs,
                 sh->async ? " (async ops)" : " (batch)");
    else if (driven >= 0)
        snprintf(r.note + nl, sizeof r.note - nl, ", %d%% driven", driven);
    cx_bench_add_row(&r);
}

static int ops_mask(const char *ops)
{
    int m = 0;
    for (int i = 0; i < 3; i++)
        if (cx_bench_list_has(ops, op_names[i])) m |= 1 << i;
    return m;
}

/* One variant (or the remote peer): an engine, a peer, every op and size. */
static int run_variant(const cx_bench_opts_t *o, const char *vname, int lmem, int rmem, int *pdone, int ptotal)
{
    size_t maxsz = 0;
    for (int i = 0; i < o->nsizes; i++)
        if (o->sizes[i] > maxsz) maxsz = o->sizes[i];
    if (o->batch) maxsz *= (size_t)o->batch;
    shape_t one = { 0 }, bat = { .nb = o->batch }, asy = { .nb = o->batch, .async = 1 };
    if (o->batch) {
        bat.ents = calloc((size_t)o->batch, sizeof *bat.ents);
        bat.st = calloc((size_t)o->batch, sizeof *bat.st);
        asy.ops = calloc((size_t)o->batch, sizeof *asy.ops);
    }
    cx_bench_row_t skip;
    memset(&skip, 0, sizeof skip);
    snprintf(skip.backend, sizeof skip.backend, "%s", vname);
    snprintf(skip.op, sizeof skip.op, "-");
    cx_engine_t *e;
    int rc = cx_bench_engine(&e, NULL, o->hb_ms, o->hb_timeout_ms, 30000);
    if (rc) {
        snprintf(skip.note, sizeof skip.note, "skipped: engine: %s", cx_strerror(rc));
        cx_bench_add_row(&skip);
        return 0;
    }
    uint8_t *loc = MAP_FAILED;
    target_t t = { .lmem = lmem, .rmem = rmem };
    if (lmem == CX_MEM_HOST) {
        loc = mmap(NULL, maxsz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    } else {
        void *d = NULL;
        if ((rc = cx_mem_alloc(lmem, 0, maxsz, &d)) == CX_OK) loc = d;
        t.shadow = loc == MAP_FAILED ? NULL : malloc(maxsz);
        if (!t.shadow && loc != MAP_FAILED) {
            cx_mem_free(loc);
            loc = MAP_FAILED;
        }
        if (loc == MAP_FAILED) {
            snprintf(skip.note, sizeof skip.note, "skipped: %zu bytes of %s memory: %s", maxsz, cx_bench_mem_name(lmem),
                     cx_strerror(rc ? rc : CX_ENOMEM));
            cx_bench_add_row(&skip);
            cx_engine_destroy(e);
            return 0;
        }
    }
    uint64_t *samples = calloc(2 * ((size_t)o->iters + 1), sizeof *samples); /* latencies, then starts */
    int failed = 0;
    cx_bench_child_t ch = { .pid = -1, .in = -1, .out = -1 };
    char info[128];
    if (loc == MAP_FAILED || !samples || (o->batch && (!bat.ents || !bat.st || !asy.ops))) {
        fprintf(stderr, "connex-bench: out of memory\n");
        failed = 1;
        goto out;
    }
    if (!t.shadow) memset(loc, 0, maxsz);
    t.op_seed = 1000;
    if ((rc = cx_register_memory(e, loc, maxsz))) {
        snprintf(skip.note, sizeof skip.note, "FAIL: register: %s", cx_strerror(rc));
        cx_bench_add_row(&skip);
        failed = 1;
        goto out;
    }
    if (o->peer) {
        t.url = o->peer;
        unsigned long long b, l;
        unsigned s;
        if ((rc = cx_connect(e, o->peer, 10000)) || (rc = ask(e, o->peer, "INFO", info, sizeof info)) ||
            sscanf(info, "INFO %llx %llu %u", &b, &l, &s) != 3) {
            snprintf(skip.note, sizeof skip.note, "FAIL: peer %s: %s", o->peer, cx_strerror(rc ? rc : CX_ERR));
            cx_bench_add_row(&skip);
            failed = 1;
            goto out;
        }
        t.base = b;
        t.len = (size_t)l;
        t.seed = s;
    } else {
        cx_bench_child_opts_t co = { .region = maxsz,
                                     .seed = 7,
                                     .connect = cx_engine_local_url(e),
                                     .hb_ms = o->hb_ms,
                                     .hb_timeout_ms = o->hb_timeout_ms,
                                     .mem = rmem };
        if (cx_bench_spawn(o, &ch, &co)) {
            snprintf(skip.note, sizeof skip.note, "FAIL: peer process did not start");
            cx_bench_add_row(&skip);
            failed = 1;
            goto out;
        }
        if ((rc = cx_connect(e, ch.url, 10000))) {
            snprintf(skip.note, sizeof skip.note, "FAIL: connect: %s", cx_strerror(rc));
            cx_bench_add_row(&skip);
            failed = 1;
            goto out;
        }
        t.url = ch.url;
        t.base = ch.base;
        t.len = ch.len;
        t.seed = 7;
    }
    add_idle_peers(e, o->idle_peers);
    const char *pair = cx_peer_backend(e, t.url);
    char pairb[16];
    snprintf(pairb, sizeof pairb, "%s", pair ? pair : "?");
    int mask = ops_mask(o->ops);
    /* Reads first: they check the peer's pattern, which writes overwrite. */
    for (int op = 0; op < 3; op++) {
        if (!(mask & (1 << op))) continue;
        for (int s = 0; s < o->nsizes; s++) {
            point(o, e, &t, loc, vname, pairb, op, o->sizes[s], samples, pdone, ptotal, o->batch ? &bat : &one);
            /* The same blocks as async ops, waited for one by one: what a caller did without batches. */
            if (o->batch && op != OP_PUTSIG)
                point(o, e, &t, loc, vname, pairb, op, o->sizes[s], samples, pdone, ptotal, &asy);
        }
    }
out:
    if (ch.pid > 0) cx_bench_stop(&ch);
    if (loc != MAP_FAILED) cx_unregister_memory(e, loc);
    cx_engine_destroy(e);
    if (t.shadow) {
        cx_mem_free(loc);
        free(t.shadow);
    } else if (loc != MAP_FAILED)
        munmap(loc, maxsz);
    free(samples);
    free(bat.ents);
    free(bat.st);
    free(asy.ops);
    return failed;
}

/* The device's copy rate at each size, host to device and back (cx_mem_copy: what a staged op's
 * copies cost without the wire), as baseline rows "copy_<kind>" with op h2d / d2h. */
void cx_bench_copy_rates(const cx_bench_opts_t *o)
{
    int kinds[2] = { o->mem_local, o->mem_remote };
    for (int k = 0; k < 2; k++) {
        int kind = kinds[k];
        if (kind == CX_MEM_HOST || (k == 1 && kind == kinds[0])) continue;
        for (int si = 0; si < o->nsizes; si++) {
            size_t size = o->sizes[si];
            void *d = NULL;
            uint8_t *h = malloc(size);
            uint64_t *ns = calloc((size_t)o->iters + 1, sizeof *ns);
            int rc = h && ns ? cx_mem_alloc(kind, 0, size, &d) : CX_ENOMEM;
            for (int dir = 0; dir < 2; dir++) {
                cx_bench_row_t r;
                memset(&r, 0, sizeof r);
                snprintf(r.backend, sizeof r.backend, "copy_%s", cx_bench_mem_name(kind));
                snprintf(r.op, sizeof r.op, "%s", dir ? "d2h" : "h2d");
                r.size = size;
                r.baseline = 1;
                r.mem_local = dir ? CX_MEM_HOST : kind;
                r.mem_remote = dir ? kind : CX_MEM_HOST;
                int n = 0;
                if (!rc) {
                    memset(h, 0x5A, size);
                    (void)(dir ? cx_mem_copy(h, d, size) : cx_mem_copy(d, h, size)); /* warm-up */
                    uint64_t spent = 0, budget = (uint64_t)o->budget_ms * 1000000ull;
                    while (!rc && n < o->iters && (n < 3 || spent < budget)) {
                        uint64_t t0 = cx_bench_now_ns();
                        rc = dir ? cx_mem_copy(h, d, size) : cx_mem_copy(d, h, size);
                        ns[n] = cx_bench_now_ns() - t0;
                        spent += ns[n];
                        n += !rc;
                    }
                }
                if (rc || !n) {
                    snprintf(r.note, sizeof r.note, "skipped: %s", cx_strerror(rc ? rc : CX_ERR));
                } else {
                    cx_bench_row_fill(&r, ns, n);
                    snprintf(r.note, sizeof r.note, "cx_mem_copy, synchronous");
                    /* The simulated device's copies are memcpy; its copy engine, which staging
                     * uses, runs at CONNEX_GPU_SIM_GBPS: the lower of the two is its rate. */
                    const char *g = getenv("CONNEX_GPU_SIM_GBPS");
                    double rated = kind == CX_MEM_SIM && g ? strtod(g, NULL) : 0;
                    if (rated > 0 && rated < r.gbps) {
                        r.gbps = rated;
                        snprintf(r.note, sizeof r.note, "copy engine at CONNEX_GPU_SIM_GBPS=%g", rated);
                    }
                }
                cx_bench_add_row(&r);
            }
            cx_mem_free(d);
            free(h);
            free(ns);
        }
    }
}

int cx_bench_transfer(const cx_bench_opts_t *o)
{
    const cx_bench_variant_t *vs[16];
    int nv = 0;
    if (!o->peer && (nv = cx_bench_variants(o->backend, vs, 16)) < 0) return 2;
    int mask = ops_mask(o->ops), nops = 0;
    for (int i = 0; i < 3; i++) nops += ((mask >> i) & 1) * (o->batch && i != OP_PUTSIG ? 2 : 1);
    if (!nops) {
        fprintf(stderr, "connex-bench: --ops: none of read,write,put_signal\n");
        return 2;
    }
    int rounds = o->rounds > 0 ? o->rounds : 1;
    /* Staged memory (--mem): each variant host to host first, the reference of the same run. */
    int staged = o->mem_local != CX_MEM_HOST || o->mem_remote != CX_MEM_HOST;
    int total = (o->peer ? 1 : nv) * nops * o->nsizes * rounds * (staged && !o->peer ? 2 : 1), done = 0, failed = 0;
    for (int round = 0; round < rounds; round++) {
        cx_bench_set_round(round);
        /* odd rounds: the baselines first, so neither side always runs right after the other */
        if (!o->peer && round % 2) cx_bench_baselines(o, vs, nv);
        if (o->peer) {
            failed |= run_variant(o, "remote", o->mem_local, o->mem_remote, &done, total);
        } else {
            for (int i = 0; i < nv; i++) {
                cx_bench_variant_env(vs[i], 1);
                if (staged) failed |= run_variant(o, vs[i]->name, CX_MEM_HOST, CX_MEM_HOST, &done, total);
                failed |= run_variant(o, vs[i]->name, o->mem_local, o->mem_remote, &done, total);
                cx_bench_variant_env(vs[i], 0);
            }
        }
        if (!o->peer && !(round % 2)) cx_bench_baselines(o, vs, nv);
        if (staged) cx_bench_copy_rates(o);
    }
    cx_bench_progress_done(o);
    if (rounds == 1)
        cx_bench_print_transfer();
    else
        printf("\n(%d rounds: every row is in --json FILE; the table pairs each round's rows)\n", rounds);
    cx_bench_print_ratios(rounds);
    if (staged) cx_bench_print_staged();
    for (int i = 0; i < cx_bench_nrows(); i++)
        if (!strncmp(cx_bench_rows()[i].note, "FAIL", 4)) failed = 1;
    if (o->json && cx_bench_write_json(o, o->json)) failed = 1;
    if (o->plot && cx_bench_plot(o->plot)) failed = 1;
    return failed;
}
