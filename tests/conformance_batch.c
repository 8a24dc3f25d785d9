/* Conformance, batches (cx_batch_*): batches of 1 to 1024 entries and mixed sizes from 1 B to
 * 16 MiB both ways, checked byte for byte (locally with the pattern, remotely by hash); entries
 * to two peers in one batch; entries over many regions and both peers in no order; a bad entry
 * refuses the whole batch and nothing moves; a batch put_signal's message arrives only after all
 * its data; kill -9 of one peer mid-batch (its entries CX_EPEER, the other peer's fine); a
 * stopped peer (its entries time out, nothing lands late); the target unregistering a region
 * while entries move in it (CX_OK or CX_EINVAL each, nothing reaches it after its unregister
 * returned), and this side unregistering its own (freed at once). Backend: CONNEX_BACKEND (the
 * test process and its peers all use it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxt.h"

#define RS ((size_t)40 << 20) /* both sides' regions */
#define TSEED 7
#define PSEED 3
#define P2SEED 5
#define MAXE 1024

static cx_engine_t *E;
static uint8_t *R;
static cxt_peer_t P, P2;
static char E_LID[CX_URL_MAX];
static cx_batch_entry_t ents[MAXE];
static int st[MAXE];

static int start_peer(cxt_peer_t *p, uint32_t replica, uint32_t seed, uint32_t hbt, uint32_t opt)
{
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->in_fd = p->out_fd = -1;
    cxt_peer_opts_t o = {
        .replica = replica, .region = RS, .seed = seed, .hb_ms = 1000, .hb_timeout_ms = hbt, .op_timeout_ms = opt
    };
    return cxt_peer_start(p, &o, 10000);
}

static int connect_up(cx_engine_t *e, cxt_peer_t *p)
{
    int rc = cx_connect(e, p->url, 5000);
    if (rc) {
        fprintf(stderr, "connect %s: %s\n", p->url, cx_strerror(rc));
        return -1;
    }
    cx_event_t ev;
    return cxt_wait_event(e, p->lid, CX_EVENT_UP, 5000, &ev, NULL) ? -1 : 0;
}

static int group_setup(void **state)
{
    (void)state;
    if (cxt_engine(&E, "tester", 0, 1000, 10000, 60000)) return -1;
    cx_url_t u;
    if (cx_url_parse(cx_engine_local_url(E), &u, NULL, 0)) return -1;
    cx_lid_format(&u.lid, E_LID, sizeof E_LID);
    R = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (R == MAP_FAILED) return -1;
    if (cx_register_memory(E, R, RS)) return -1;
    if (start_peer(&P, 1, PSEED, 10000, 0) || start_peer(&P2, 2, P2SEED, 10000, 0)) return -1;
    return connect_up(E, &P) || connect_up(E, &P2) ? -1 : 0;
}

static int group_teardown(void **state)
{
    (void)state;
    cxt_peer_stop(&P);
    cxt_peer_stop(&P2);
    if (E) {
        cx_unregister_memory(E, R);
        cx_engine_destroy(E);
    }
    if (R && R != MAP_FAILED) munmap(R, RS);
    return 0;
}

/* n entries laid end to end from offset `off` on both sides (so odd sizes land unaligned), the
 * size of entry i sizes[i % nsizes]. Returns the bytes covered. */
static size_t lay(size_t n, const size_t *sizes, size_t nsizes, const cxt_peer_t *p, size_t off)
{
    size_t o = off;
    for (size_t i = 0; i < n; i++) {
        size_t len = sizes[i % nsizes];
        ents[i] = (cx_batch_entry_t){ .peer = p->url, .local = R + o, .remote = p->base + o, .len = len };
        o += len;
    }
    assert_true(o <= RS);
    return o - off;
}

static void expect_all(size_t n, int want, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (st[i] != want)
            fail_msg("%s: entry %zu ended %s, expected %s", what, i, cx_strerror(st[i]), cx_strerror(want));
}

static void check_remote(cxt_peer_t *p, size_t off, size_t len, const char *what)
{
    char rep[256], want[64];
    assert_int_equal(cxt_peer_cmd(p, 30000, rep, sizeof rep, "HASH %zu %zu", off, len), 0);
    snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(R + off, len));
    if (strcmp(rep, want)) fail_msg("%s: the peer's bytes differ (hash '%s', expected '%s')", what, rep, want);
}

static void refill_peer(cxt_peer_t *p, uint32_t seed)
{
    char rep[128];
    assert_int_equal(cxt_peer_cmd(p, 30000, rep, sizeof rep, "FILL %u", seed), 0);
}

static const size_t mixed[] = { 1, 7, 4096, 16385, 65537, 1u << 20, (16u << 20) + 3, 100, 3 };
static const size_t small4k[] = { 4096 };
static const size_t blk16k[] = { 16384 };

struct shape {
    size_t n;
    const size_t *sizes;
    size_t nsizes;
    const char *name;
};
static const struct shape shapes[] = {
    { 1, small4k, 1, "1 x 4 KiB" },       { 9, mixed, 9, "mixed 1 B .. 16 MiB" },
    { 128, blk16k, 1, "128 x 16 KiB" },   { 1024, mixed, 5, "1024 mixed 1 B .. 64 KiB" },
    { 1024, small4k, 1, "1024 x 4 KiB" },
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

static void test_batch_read_sizes(void **state)
{
    (void)state;
    for (size_t s = 0; s < NSHAPES; s++) {
        const struct shape *sh = &shapes[s];
        size_t off = 4096 + 13;
        size_t bytes = lay(sh->n, sh->sizes, sh->nsizes, &P, off);
        memset(R, 0, off + bytes + 64);
        uint64_t t0 = cxt_now_ns();
        int rc = cx_batch_read(E, ents, sh->n, st);
        double ms = cxt_ms_since(t0);
        if (rc) fail_msg("batch read %s: %s", sh->name, cx_strerror(rc));
        expect_all(sh->n, CX_OK, sh->name);
        long long bad = cxt_check(R + off, bytes, PSEED, off);
        if (bad >= 0) fail_msg("batch read %s: byte %lld differs", sh->name, bad);
        for (size_t i = 0; i < off; i++) assert_int_equal(R[i], 0); /* nothing outside */
        for (size_t i = 0; i < 64; i++) assert_int_equal(R[off + bytes + i], 0);
        fprintf(stderr, "batch read  %-28s %10zu B %8.3f ms\n", sh->name, bytes, ms);
    }
}

static void test_batch_write_sizes(void **state)
{
    (void)state;
    for (size_t s = 0; s < NSHAPES; s++) {
        const struct shape *sh = &shapes[s];
        size_t off = 8192 + 5;
        size_t bytes = lay(sh->n, sh->sizes, sh->nsizes, &P, off);
        cxt_fill(R, RS, TSEED + (uint32_t)s, 0);
        cx_op_t *op = NULL;
        uint64_t t0 = cxt_now_ns();
        /* The async form, in both classes. */
        int rc = s & 1 ? cx_batch_write_async(E, ents, sh->n, CX_CLASS_BACKGROUND, st, &op)
                       : cx_batch_write(E, ents, sh->n, st);
        if (!rc && op) rc = cx_op_wait(op, -1);
        double ms = cxt_ms_since(t0);
        if (rc) fail_msg("batch write %s: %s", sh->name, cx_strerror(rc));
        expect_all(sh->n, CX_OK, sh->name);
        check_remote(&P, off, bytes, sh->name);
        fprintf(stderr, "batch write %-28s %10zu B %8.3f ms\n", sh->name, bytes, ms);
    }
    refill_peer(&P, PSEED);
}

/* One batch, entries alternating between two peers, read then written back crosswise. */
static void test_batch_two_peers(void **state)
{
    (void)state;
    enum { N = 64, LEN = 65536 + 11 };
    for (size_t i = 0; i < N; i++) {
        const cxt_peer_t *p = i & 1 ? &P2 : &P;
        ents[i] = (cx_batch_entry_t){
            .peer = i & 2 ? p->lid : p->url, .local = R + i * LEN, .remote = p->base + i * LEN, .len = LEN
        };
    }
    memset(R, 0, N * LEN);
    cx_op_t *op = NULL;
    assert_int_equal(cx_batch_read_async(E, ents, N, CX_CLASS_CRITICAL, st, &op), CX_OK);
    assert_int_equal(cx_op_wait(op, -1), CX_OK);
    expect_all(N, CX_OK, "two peers read");
    for (size_t i = 0; i < N; i++) {
        long long bad = cxt_check(R + i * LEN, LEN, i & 1 ? P2SEED : PSEED, i * LEN);
        if (bad >= 0) fail_msg("two peers: entry %zu byte %lld differs", i, bad);
    }
    cxt_fill(R, N * LEN, TSEED, 0);
    assert_int_equal(cx_batch_write(E, ents, N, st), CX_OK);
    expect_all(N, CX_OK, "two peers write");
    /* Each peer holds the even or odd blocks: compare block by block. */
    for (size_t i = 0; i < N; i += 7) check_remote(i & 1 ? &P2 : &P, i * LEN, LEN, "two peers write");
    refill_peer(&P, PSEED);
    refill_peer(&P2, P2SEED);
}

/* Entries over many regions in one batch: NREG local regions (beside R) and two peers, so that
 * the engine groups them by peer and region pair (more pairs than it fills at once: some entries
 * go alone), entries in no order (remote ranges descending, local regions interleaved), sizes
 * from 1 B to 16 KiB; then one pair with more entries than a group holds. Read, checked byte for
 * byte, written back with fresh bytes, checked by hash; the engine counts every entry. */
static void test_batch_many_regions(void **state)
{
    (void)state;
    enum { NREG = 20, RLEN = 262144, N = 200, M = 700, LEN = 4096 };
    uint8_t *L = mmap(NULL, (size_t)NREG * RLEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(L != MAP_FAILED);
    for (int r = 0; r < NREG; r++) assert_int_equal(cx_register_memory(E, L + (size_t)r * RLEN, RLEN), CX_OK);
    size_t used[NREG] = { 0 };
    size_t roff[N];
    const cxt_peer_t *pe[N];
    for (size_t i = 0; i < N; i++) {
        size_t reg = (i * 7) % NREG, len = 1 + (i * 2654435761u) % 16384;
        assert_true(used[reg] + len <= RLEN); /* N / NREG entries of 16 KiB at most a region */
        pe[i] = i % 3 == 1 ? &P2 : &P;
        roff[i] = (size_t)(N - i) * 20000; /* descending, apart: no two entries overlap */
        ents[i] = (cx_batch_entry_t){
            .peer = pe[i]->url, .local = L + reg * RLEN + used[reg], .remote = pe[i]->base + roff[i], .len = len
        };
        used[reg] += len;
    }
    cx_stats_t s0, s1;
    assert_int_equal(cx_stats(E, &s0), CX_OK);
    memset(L, 0, (size_t)NREG * RLEN);
    assert_int_equal(cx_batch_read(E, ents, N, st), CX_OK);
    expect_all(N, CX_OK, "many regions read");
    for (size_t i = 0; i < N; i++) {
        long long bad = cxt_check(ents[i].local, ents[i].len, pe[i] == &P2 ? P2SEED : PSEED, roff[i]);
        if (bad >= 0) fail_msg("many regions: entry %zu byte %lld differs", i, bad);
    }
    assert_int_equal(cx_stats(E, &s1), CX_OK);
    assert_int_equal(s1.ops[CX_OPK_READ] - s0.ops[CX_OPK_READ], N);
    cxt_fill(L, (size_t)NREG * RLEN, TSEED + 77, 0);
    cx_op_t *op = NULL;
    assert_int_equal(cx_batch_write_async(E, ents, N, CX_CLASS_CRITICAL, st, &op), CX_OK);
    assert_int_equal(cx_op_wait(op, -1), CX_OK);
    expect_all(N, CX_OK, "many regions write");
    for (size_t i = 0; i < N; i += 3) {
        char rep[256], want[64];
        assert_int_equal(
            cxt_peer_cmd((cxt_peer_t *)pe[i], 30000, rep, sizeof rep, "HASH %zu %zu", roff[i], ents[i].len), 0);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(ents[i].local, ents[i].len));
        if (strcmp(rep, want)) fail_msg("many regions: entry %zu: the peer's bytes differ", i);
    }
    /* One peer and region pair, more entries than a group takes, every other block. */
    for (size_t i = 0; i < M; i++)
        ents[i] =
            (cx_batch_entry_t){ .peer = P.url, .local = R + 2 * i * LEN, .remote = P.base + 2 * i * LEN, .len = LEN };
    refill_peer(&P, PSEED);
    memset(R, 0, 2 * M * LEN);
    assert_int_equal(cx_batch_read(E, ents, M, st), CX_OK);
    expect_all(M, CX_OK, "one pair read");
    for (size_t i = 0; i < M; i++) {
        long long bad = cxt_check(R + 2 * i * LEN, LEN, PSEED, 2 * i * LEN);
        if (bad >= 0) fail_msg("one pair: entry %zu byte %lld differs", i, bad);
        for (size_t k = 0; k < LEN; k += 512) assert_int_equal(R[(2 * i + 1) * LEN + k], 0); /* the gaps */
    }
    for (int r = 0; r < NREG; r++) assert_int_equal(cx_unregister_memory(E, L + (size_t)r * RLEN), CX_OK);
    munmap(L, (size_t)NREG * RLEN);
    refill_peer(&P, PSEED);
    refill_peer(&P2, P2SEED);
}

/* A bad entry anywhere refuses the batch: CX_EINVAL for every entry, and nothing moved. */
static void test_batch_bad_entry(void **state)
{
    (void)state;
    enum { N = 16, LEN = 4096 };
    static uint8_t unreg[LEN];
    char rep[128], before[128];
    assert_int_equal(cxt_peer_cmd(&P, 30000, before, sizeof before, "HASH 0 %d", N * LEN), 0);
    cxt_fill(R, N * LEN, TSEED + 50, 0);
    const char *faults[] = {
        "unregistered local", "zero length", "out of range", "unknown peer", "wraps", "NULL local"
    };
    for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
        size_t bad = (f * 5 + 3) % N;
        for (size_t i = 0; i < N; i++)
            ents[i] = (cx_batch_entry_t){ .peer = P.url, .local = R + i * LEN, .remote = P.base + i * LEN, .len = LEN };
        switch (f) {
        case 0: ents[bad].local = unreg; break;
        case 1: ents[bad].len = 0; break;
        case 2: ents[bad].remote = P.base + RS - 100; break;
        case 3: ents[bad].peer = "nobody|9|9|9"; break;
        case 4: ents[bad].remote = UINT64_MAX - 10; break;
        default: ents[bad].local = NULL; break;
        }
        for (size_t i = 0; i < N; i++) st[i] = 12345;
        int rc = cx_batch_write(E, ents, N, st);
        if (rc != CX_EINVAL) fail_msg("batch with a bad entry (%s) returned %s", faults[f], cx_strerror(rc));
        expect_all(N, CX_EINVAL, faults[f]);
        cx_op_t *op = NULL;
        rc = cx_batch_read_async(E, ents, N, CX_CLASS_CRITICAL, st, &op);
        if (rc == CX_OK) rc = cx_op_wait(op, 30000);
        if (rc != CX_EINVAL) fail_msg("async batch with a bad entry (%s) returned %s", faults[f], cx_strerror(rc));
        rc = cx_batch_put_signal(E, P.url, ents, N, "no", 2, CX_CLASS_CRITICAL, st, &op);
        if (rc == CX_OK) rc = cx_op_wait(op, 30000);
        if (rc != CX_EINVAL) fail_msg("batch put_signal with a bad entry (%s) returned %s", faults[f], cx_strerror(rc));
        assert_int_equal(cxt_peer_cmd(&P, 30000, rep, sizeof rep, "HASH 0 %d", N * LEN), 0);
        if (strcmp(rep, before)) fail_msg("a refused batch (%s) moved bytes to the peer", faults[f]);
    }
    /* The arguments themselves. */
    cx_op_t *op = NULL;
    assert_int_equal(cx_batch_read(E, ents, 0, st), CX_EINVAL);
    assert_int_equal(cx_batch_read(E, NULL, 4, st), CX_EINVAL);
    assert_int_equal(cx_batch_read(NULL, ents, 4, st), CX_EINVAL);
    assert_int_equal(cx_batch_read(E, ents, (size_t)CX_BATCH_MAX + 1, NULL), CX_EINVAL);
    assert_int_equal(cx_batch_read_async(E, ents, 4, (cx_class_t)7, st, &op), CX_EINVAL);
    assert_null(op);
    assert_int_equal(cx_batch_read_async(E, ents, 4, CX_CLASS_CRITICAL, st, NULL), CX_EINVAL);
    /* A put_signal entry naming another peer. */
    for (size_t i = 0; i < 4; i++)
        ents[i] = (cx_batch_entry_t){ .peer = i == 2 ? P2.url : NULL, .local = R, .remote = P.base, .len = 64 };
    assert_int_equal(cx_batch_put_signal(E, P.url, ents, 4, "x", 1, CX_CLASS_CRITICAL, st, &op), CX_EINVAL);
    /* Nothing was queued at the peer either: a batch put_signal that works comes next. */
    cxt_peer_drain(&P, 50);
    assert_int_equal(cxt_peer_expect(&P, "MSG ", 200, rep, sizeof rep), CX_ETIMEDOUT);
}

/* The message of a batch put_signal covers every entry's bytes: the peer checks its hash the
 * moment the message arrives, over fresh bytes that an early signal would see. */
static void test_batch_put_signal(void **state)
{
    (void)state;
    static const size_t sz[] = { 1, 4096, 65537, 1u << 20, 3, 16384 };
    const size_t counts[] = { 1, 2, 64, 150 };
    char rep[256], line[512];
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        size_t n = counts[c], off = 4096 + 1;
        assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED + 100 + (unsigned)c), 0);
        cxt_fill(R, RS, TSEED + 10 + (uint32_t)c, 0);
        size_t bytes = lay(n, sz, 6, &P, off);
        for (size_t i = 0; i < n; i++) ents[i].peer = c & 1 ? P.url : NULL;
        char msg[128];
        snprintf(msg, sizeof msg, "CHK %" PRIx64 " %zu %" PRIx64, P.base + off, bytes, cxt_hash(R + off, bytes));
        cx_op_t *op = NULL;
        uint64_t t0 = cxt_now_ns();
        int rc = cx_batch_put_signal(E, P.url, ents, n, msg, strlen(msg), CX_CLASS_CRITICAL, st, &op);
        if (rc) fail_msg("batch put_signal of %zu: %s", n, cx_strerror(rc));
        rc = cx_op_wait(op, -1);
        double ms = cxt_ms_since(t0);
        if (rc) fail_msg("batch put_signal of %zu completed with %s", n, cx_strerror(rc));
        expect_all(n, CX_OK, "put_signal");
        if (cxt_peer_expect(&P, "MSG ", 20000, line, sizeof line)) fail_msg("batch put_signal of %zu: no message", n);
        char want[256];
        snprintf(want, sizeof want, "MSG %s %zu %" PRIx64 " CHK OK", E_LID, strlen(msg), cxt_hash(msg, strlen(msg)));
        if (strcmp(line, want)) fail_msg("batch put_signal of %zu: peer said '%s', expected '%s'", n, line, want);
        fprintf(stderr, "batch put_signal %4zu entries %9zu B %8.3f ms\n", n, bytes, ms);
    }
    refill_peer(&P, PSEED);
}

/* The unregister tests move ents[0..n) as one async batch (*op) or as n single async ops. */
#define MID_MAX 256
static cx_op_t *mid_ops[MID_MAX];

static const char *mid_what(int reading, int single)
{
    return single ? (reading ? "async reads" : "async writes") : (reading ? "batch read" : "batch write");
}

static void mid_start(size_t n, int reading, int single, cx_op_t **op)
{
    const char *what = mid_what(reading, single);
    assert_true(n <= MID_MAX);
    *op = NULL;
    if (!single) {
        int rc = reading ? cx_batch_read_async(E, ents, n, CX_CLASS_CRITICAL, st, op)
                         : cx_batch_write_async(E, ents, n, CX_CLASS_CRITICAL, st, op);
        if (rc) fail_msg("%s: %s", what, cx_strerror(rc));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const cx_batch_entry_t *x = &ents[i];
        int rc = reading ? cx_read_async(E, x->peer, x->local, x->remote, x->len, CX_CLASS_CRITICAL, &mid_ops[i])
                         : cx_write_async(E, x->peer, x->local, x->remote, x->len, CX_CLASS_CRITICAL, &mid_ops[i]);
        if (rc) fail_msg("%s: op %zu: %s", what, i, cx_strerror(rc));
    }
}

/* Waits for what mid_start started: each status in st[], every one CX_OK or CX_EINVAL (the
 * batch's own status agreeing). Returns how many ended CX_EINVAL. */
static int mid_wait(size_t n, int reading, int single, cx_op_t *op)
{
    const char *what = mid_what(reading, single);
    int rc = CX_OK, bad = 0;
    if (!single) {
        rc = cx_op_wait(op, 60000);
        if (rc == CX_EINPROGRESS) fail_msg("%s: not ended 60 s after the unregister", what);
    } else {
        for (size_t i = 0; i < n; i++) {
            st[i] = cx_op_wait(mid_ops[i], 60000);
            if (st[i] == CX_EINPROGRESS) fail_msg("%s: op %zu not ended 60 s after the unregister", what, i);
        }
    }
    for (size_t i = 0; i < n; i++) {
        bad += st[i] == CX_EINVAL;
        if (st[i] != CX_OK && st[i] != CX_EINVAL)
            fail_msg("%s: entry %zu ended %s, expected CX_OK or CX_EINVAL", what, i, cx_strerror(st[i]));
    }
    if (!single) assert_int_equal(rc, bad ? CX_EINVAL : CX_OK);
    return bad;
}

/* A region unregistered while a batch of ours (or single async ops) moves bytes in it, by the
 * target (target_side) or by this side, both ways: every entry ends CX_OK (its bytes right) or
 * CX_EINVAL, never another error; the unregister returns, and the memory is unmapped the moment
 * it did, so that a byte of a transfer that still reached it would kill that process. The pair
 * stays up and usable. */
static void unregister_mid_transfer(int target_side)
{
    enum { N = MID_MAX, LEN = 64 << 10, ROUNDS = 4 };
    const char *side = target_side ? "target" : "local";
    char rep[256];
    int refused = 0;
    double unreg_ms_max = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int reading = round & 1, single = round >= 2;
        uint32_t seed = (target_side ? 40 : 70) + (uint32_t)round;
        const char *what = mid_what(reading, single);
        uint8_t *loc = R, *m = NULL;
        uint64_t rem = P.base;
        if (target_side) {
            assert_int_equal(cxt_peer_cmd(&P, 30000, rep, sizeof rep, "XREG %d %u", N * LEN, seed), 0);
            rem = strtoull(rep + 3, NULL, 16);
            assert_true(rem != 0);
        } else {
            m = mmap(NULL, (size_t)N * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            assert_true(m != MAP_FAILED);
            assert_int_equal(cx_register_memory(E, m, (size_t)N * LEN), CX_OK);
            loc = m;
        }
        if (reading)
            memset(loc, 0, (size_t)N * LEN);
        else
            cxt_fill(loc, (size_t)N * LEN, seed, 0);
        for (size_t i = 0; i < N; i++)
            ents[i] = (cx_batch_entry_t){ .peer = P.url, .local = loc + i * LEN, .remote = rem + i * LEN, .len = LEN };
        cx_op_t *op;
        mid_start(N, reading, single, &op);
        uint64_t t0 = cxt_now_ns();
        int urc = target_side ? cxt_peer_cmd(&P, 60000, rep, sizeof rep, "XUNREG 0x%" PRIx64, rem)
                              : cx_unregister_memory(E, m);
        double ums = cxt_ms_since(t0);
        if (urc) fail_msg("%s: the %s side's unregister returned %d", what, side, urc);
        if (m) munmap(m, (size_t)N * LEN);
        if (ums > unreg_ms_max) unreg_ms_max = ums;
        refused += mid_wait(N, reading, single, op);
        /* What completed is right: read into R from the target's region, or written to the
         * peer's from ours (sampled through the peer's hash). */
        for (size_t i = 0; target_side && reading && i < N; i++) {
            long long at = st[i] == CX_OK ? cxt_check(R + i * LEN, LEN, seed, i * LEN) : -1;
            if (at >= 0) fail_msg("%s: entry %zu: byte %lld differs", what, i, at);
        }
        for (size_t i = 0; !target_side && !reading && i < N; i += 37) {
            if (st[i] != CX_OK) continue;
            uint8_t chk[256];
            char want[64];
            cxt_fill(chk, sizeof chk, seed, i * LEN);
            assert_int_equal(cxt_peer_cmd(&P, 30000, rep, sizeof rep, "HASH %zu %zu", i * LEN, sizeof chk), 0);
            snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(chk, sizeof chk));
            if (strcmp(rep, want)) fail_msg("%s: entry %zu completed, but the peer's bytes differ", what, i);
        }
        /* Gone: refused whole. */
        assert_int_equal(cx_batch_read(E, ents, 1, st), CX_EINVAL);
        /* The pair goes on. */
        assert_int_equal(cx_read(E, P.url, R, P.base + 4096, 8192), CX_OK);
        if (target_side) assert_int_equal(cxt_check(R, 8192, PSEED, 4096), -1); /* ours wrote it otherwise */
        cx_peer_state_t ps = cx_peer_state(E, P.lid);
        assert_true(ps == CX_PEER_UP || ps == CX_PEER_SUSPECT);
    }
    refill_peer(&P, PSEED);
    fprintf(stderr, "%s unregister mid-transfer: %d of %d entries CX_EINVAL, unregister took at most %.1f ms\n", side,
            refused, ROUNDS * N, unreg_ms_max);
}

static void test_batch_target_unregisters(void **state)
{
    (void)state;
    unregister_mid_transfer(1);
}

static void test_batch_local_unregister(void **state)
{
    (void)state;
    unregister_mid_transfer(0);
}

/* kill -9 of one of two peers while a batch to both moves: the dead one's entries end CX_EPEER
 * (or completed before the kill: then their bytes are right), the live one's all complete. */
static void test_batch_kill9(void **state)
{
    (void)state;
    cxt_peer_t K;
    assert_int_equal(start_peer(&K, 7, 11, 0, 0), 0);
    assert_int_equal(connect_up(E, &K), 0);
    enum { N = 64, LEN = 1u << 19 };
    for (size_t i = 0; i < N; i++) {
        const cxt_peer_t *p = i & 1 ? &K : &P;
        ents[i] = (cx_batch_entry_t){ .peer = p->lid, .local = R + i * LEN, .remote = p->base + i * LEN, .len = LEN };
    }
    memset(R, 0, N * LEN);
    cx_op_t *op = NULL;
    uint64_t t0 = cxt_now_ns();
    assert_int_equal(cx_batch_read_async(E, ents, N, CX_CLASS_CRITICAL, st, &op), CX_OK);
    cxt_peer_signal(&K, SIGKILL);
    int rc = cx_op_wait(op, 20000);
    double ms = cxt_ms_since(t0);
    if (rc == CX_EINPROGRESS) {
        /* Which entries held it: the op timeout (60 s) ends them, then the statuses say. */
        rc = cx_op_wait(op, 70000);
        int live_ok = 0, dead_epeer = 0;
        for (size_t i = 0; i < N; i++) {
            live_ok += !(i & 1) && st[i] == CX_OK;
            dead_epeer += (i & 1) && st[i] == CX_EPEER;
        }
        cxt_peer_reap(&K, 5000);
        fail_msg("a batch to a killed peer still ran 20 s on; it ended %s after %.1f s with %d of %d live-peer "
                 "entries CX_OK, %d of %d killed-peer entries CX_EPEER",
                 cx_strerror(rc), cxt_ms_since(t0) / 1000, live_ok, N / 2, dead_epeer, N / 2);
    }
    cxt_peer_reap(&K, 5000);
    int dead = 0;
    for (size_t i = 0; i < N; i++) {
        if (!(i & 1)) {
            if (st[i] != CX_OK) fail_msg("entry %zu to the live peer ended %s", i, cx_strerror(st[i]));
        } else if (st[i] == CX_EPEER) {
            dead++;
            continue;
        } else if (st[i] != CX_OK) {
            fail_msg("entry %zu to the killed peer ended %s, expected CX_OK or CX_EPEER", i, cx_strerror(st[i]));
        }
        long long bad = cxt_check(R + i * LEN, LEN, i & 1 ? 11 : PSEED, i * LEN);
        if (bad >= 0) fail_msg("entry %zu: byte %lld differs", i, bad);
    }
    assert_int_equal(rc, dead ? CX_EPEER : CX_OK);
    fprintf(stderr, "kill -9 mid-batch: %d of %d entries to the killed peer CX_EPEER, batch done in %.1f ms\n", dead,
            N / 2, ms);
    /* Once it is failed, its entries fail at once, the live peer's still move. */
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(E, K.lid, CX_EVENT_FAILED, 5000, &ev, NULL), 0);
    t0 = cxt_now_ns();
    assert_int_equal(cx_batch_read(E, ents, 8, st), CX_EPEER);
    for (size_t i = 0; i < 8; i++) assert_int_equal(st[i], i & 1 ? CX_EPEER : CX_OK);
    if (cxt_ms_since(t0) > 2000) fail_msg("a batch with a failed peer's entries took %.1f ms", cxt_ms_since(t0));
    cxt_peer_crash(&K); /* reaped already: frees what is left */
}

/* A stopped peer: its entries time out at the op timeout (its data connection closed first:
 * nothing lands after the batch returned), a live peer's entries in the same batch complete.
 * Over shared memory a read may complete one-sided, without the stopped target: then it must be
 * right. */
static void test_batch_sigstop(void **state)
{
    (void)state;
    const uint32_t opt = 1000;
    cx_engine_t *e = NULL;
    assert_int_equal(cxt_engine(&e, "stopper", 3, 1000, 10000, opt), 0);
    uint8_t *r = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(r != MAP_FAILED);
    assert_int_equal(cx_register_memory(e, r, RS), CX_OK);
    cxt_peer_t S;
    assert_int_equal(start_peer(&S, 8, 13, 10000, 0), 0);
    assert_int_equal(connect_up(e, &S), 0);
    assert_int_equal(connect_up(e, &P), 0);
    enum { N = 32, LEN = 1u << 18 };
    for (size_t i = 0; i < N; i++) {
        const cxt_peer_t *p = i & 1 ? &S : &P;
        ents[i] = (cx_batch_entry_t){ .peer = p->lid, .local = r + i * LEN, .remote = p->base + i * LEN, .len = LEN };
    }
    /* One batch while it runs, so the pair is warm; a loaded host (a sanitizer build beside
     * other tests) may take longer than the short op timeout for the first: a few tries. */
    int rc0 = CX_ETIMEDOUT;
    for (int i = 0; i < 5 && rc0 == CX_ETIMEDOUT; i++) rc0 = cx_batch_read(e, ents, 2, st);
    assert_int_equal(rc0, CX_OK);
    memset(r, 0, N * LEN);
    cxt_peer_signal(&S, SIGSTOP);
    uint64_t t0 = cxt_now_ns();
    cx_op_t *bop = NULL;
    assert_int_equal(cx_batch_read_async(e, ents, N, CX_CLASS_CRITICAL, st, &bop), CX_OK);
    /* Part way to the op timeout: what is in flight counts entries, whether they went alone or
     * in runs (engine.h, cx_op_inflight_n); those that time out are among them. */
    usleep(opt * 1000 / 5);
    cx_stats_t sts;
    assert_int_equal(cx_stats(e, &sts), CX_OK);
    int rc = cx_op_wait(bop, (int)opt + 20000); /* the op timeout ends it well before */
    double ms = cxt_ms_since(t0);
    if (rc == CX_EINPROGRESS) {
        cxt_peer_signal(&S, SIGCONT);
        fail_msg("the batch to a stopped peer had not ended %.1f ms after its start", ms);
    }
    int timed_out = 0;
    for (size_t i = 0; i < N; i++) {
        if (st[i] == CX_ETIMEDOUT && (i & 1)) {
            timed_out++;
            continue;
        }
        if (st[i] != CX_OK) {
            cxt_peer_signal(&S, SIGCONT);
            fail_msg("entry %zu (%s peer) ended %s", i, i & 1 ? "stopped" : "live", cx_strerror(st[i]));
        }
        long long bad = cxt_check(r + i * LEN, LEN, i & 1 ? 13 : PSEED, i * LEN);
        if (bad >= 0) fail_msg("entry %zu: byte %lld differs", i, bad);
    }
    fprintf(stderr,
            "stopped peer: %d of %d entries timed out, batch %s after %.1f ms (op timeout %u ms); %llu in flight "
            "after %u ms\n",
            timed_out, N / 2, cx_strerror(rc), ms, opt, (unsigned long long)sts.ops_in_flight, opt / 5);
    if (sts.ops_in_flight < (uint64_t)timed_out || sts.ops_in_flight > N) {
        cxt_peer_signal(&S, SIGCONT);
        fail_msg("%llu ops in flight with %d entries waiting for a stopped peer (of %d)",
                 (unsigned long long)sts.ops_in_flight, timed_out, N);
    }
    if (!timed_out && !cxt_may_be_one_sided()) {
        cxt_peer_signal(&S, SIGCONT);
        fail_msg("entries to a stopped peer completed on a variant without a one-sided path");
    }
    assert_int_equal(rc, timed_out ? CX_ETIMEDOUT : CX_OK);
    if (timed_out && (ms < opt * 0.8 || ms > opt + 3000.0)) {
        cxt_peer_signal(&S, SIGCONT);
        fail_msg("the batch timed out after %.1f ms (op timeout %u ms)", ms, opt);
    }
    /* Resumed, the stopped peer answers what it was asked: none of it may land now. */
    cxt_peer_signal(&S, SIGCONT);
    usleep(300 * 1000);
    for (size_t i = 1; i < N; i += 2) {
        if (st[i] != CX_ETIMEDOUT) continue;
        for (size_t k = 0; k < LEN; k += 512)
            if (r[i * LEN + k]) fail_msg("entry %zu: a timed-out read landed after the batch returned", i);
    }
    cxt_peer_stop(&S);
    cx_unregister_memory(e, r);
    cx_engine_destroy(e);
    munmap(r, RS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_batch_read_sizes, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_batch_write_sizes, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_batch_two_peers, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_batch_many_regions, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_batch_bad_entry, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_batch_put_signal, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_batch_target_unregisters, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_batch_local_unregister, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_batch_kill9, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_batch_sigstop, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    /* CXT_FILTER=test_name (wildcards allowed) runs a subset. */
    if (getenv("CXT_FILTER")) cmocka_set_test_filter(getenv("CXT_FILTER"));
    return cxt_run_tests(tests, group_setup, group_teardown);
}
