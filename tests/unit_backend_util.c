/* The helpers backends share (backends/util/): the ack table finds an op by the id its answer
 * names, also among ids that share a bucket; the op cache is bounded and hands out zeroed
 * records; a target-answered read takes only the part it expects, in order and inside the
 * window asked for, and the target cuts an answer into parts that cover it exactly; same-host
 * copies reach a child's memory only while the advertised process owns the pid, and say why
 * not otherwise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "connex/connex.h"
#include "util/acktab.h"
#include "util/cma.h"
#include "util/objcache.h"
#include "util/rread.h"

typedef struct {
    int tag;
    cx_ack_link_t ack;
} op_t;

static void test_acktab_collisions(void **state)
{
    (void)state;
    static cx_acktab_t t;
    memset(&t, 0, sizeof t);
    op_t ops[8];
    for (int i = 0; i < 8; i++) {
        memset(&ops[i], 0, sizeof ops[i]);
        ops[i].tag = i;
        cx_acktab_add(&t, &ops[i].ack, 7 + (uint64_t)i * CX_ACKTAB_BUCKETS); /* one bucket */
    }
    for (int i = 0; i < 8; i++) {
        cx_ack_link_t *l = cx_acktab_find(&t, 7 + (uint64_t)i * CX_ACKTAB_BUCKETS);
        assert_non_null(l);
        assert_int_equal(cx_container_of(l, op_t, ack)->tag, i);
    }
    assert_null(cx_acktab_find(&t, 7 + 8 * (uint64_t)CX_ACKTAB_BUCKETS));
    cx_ack_link_t *l = cx_acktab_take(&t, 7 + 3 * (uint64_t)CX_ACKTAB_BUCKETS);
    assert_ptr_equal(l, &ops[3].ack);
    assert_int_equal(l->linked, 0);
    assert_null(cx_acktab_take(&t, 7 + 3 * (uint64_t)CX_ACKTAB_BUCKETS)); /* an answer twice */
    cx_acktab_del(&t, &ops[3].ack);                                       /* not linked: no-op */
    cx_acktab_del(&t, &ops[5].ack);
    assert_null(cx_acktab_find(&t, 7 + 5 * (uint64_t)CX_ACKTAB_BUCKETS));
    for (int i = 0; i < 8; i++)
        if (i != 3 && i != 5) assert_non_null(cx_acktab_take(&t, 7 + (uint64_t)i * CX_ACKTAB_BUCKETS));
    for (unsigned b = 0; b < CX_ACKTAB_BUCKETS; b++) assert_null(t.b[b]);
}

static void test_objcache_bounded_zeroed(void **state)
{
    (void)state;
    cx_objcache_t c;
    cx_objcache_init(&c, 64, 2);
    unsigned char *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = cx_objcache_get(&c);
        assert_non_null(p[i]);
        memset(p[i], 0xab, 64);
    }
    for (int i = 0; i < 4; i++) cx_objcache_put(&c, p[i]);
    assert_int_equal(c.n, 2); /* the other two were freed (ASan would see a leak otherwise) */
    unsigned char *q = cx_objcache_get(&c);
    for (int i = 0; i < 64; i++) assert_int_equal(q[i], 0);
    assert_int_equal(c.n, 1);
    cx_objcache_put(&c, q);
    cx_objcache_put(&c, NULL);
    cx_objcache_drain(&c);
    assert_int_equal(c.n, 0);
    assert_null(c.head);
}

static void test_rread_windows_in_order(void **state)
{
    (void)state;
    enum { TOTAL = 10000, WIN = 4096, PART = 1000 };
    static uint8_t src[TOTAL], dst[TOTAL];
    for (int i = 0; i < TOTAL; i++) src[i] = (uint8_t)(i * 31 + 7);
    memset(dst, 0, sizeof dst);
    cx_rread_t r = { 0 };
    size_t off, n, windows = 0;
    int last = 0;
    while ((n = cx_rread_window(&r, TOTAL, WIN, &off))) {
        windows++;
        assert_true(windows <= 3);
        for (size_t i = 0, np = cx_rread_parts(n, PART); i < np; i++) {
            size_t po, pl = cx_rread_part(n, PART, i, &po);
            assert_true(pl > 0 && pl <= PART);
            last = cx_rread_take(&r, dst, TOTAL, off + po, src + off + po, pl);
            assert_true(last == CX_RREAD_MORE || last == CX_RREAD_ASK || last == CX_RREAD_DONE);
        }
        if (last == CX_RREAD_DONE) break;
        assert_int_equal(last, CX_RREAD_ASK);
    }
    assert_int_equal(last, CX_RREAD_DONE);
    assert_int_equal(windows, 3);
    assert_memory_equal(src, dst, TOTAL);
}

static void test_rread_refuses_bad_parts(void **state)
{
    (void)state;
    uint8_t dst[100], part[100];
    memset(dst, 0x11, sizeof dst);
    memset(part, 0x22, sizeof part);
    cx_rread_t r = { 0 };
    size_t off;
    assert_int_equal(cx_rread_window(&r, 100, 50, &off), 50);
    assert_int_equal(off, 0);
    assert_int_equal(cx_rread_take(&r, dst, 100, 10, part, 10), CX_RREAD_BAD); /* out of order */
    assert_int_equal(cx_rread_take(&r, dst, 100, 0, part, 0), CX_RREAD_BAD);   /* empty */
    assert_int_equal(cx_rread_take(&r, dst, 100, 0, part, 51), CX_RREAD_BAD);  /* past the window */
    for (int i = 0; i < 100; i++) assert_int_equal(dst[i], 0x11);              /* nothing landed */
    assert_int_equal(cx_rread_take(&r, dst, 100, 0, part, 50), CX_RREAD_ASK);
    assert_int_equal(cx_rread_take(&r, dst, 100, 50, part, 1), CX_RREAD_BAD); /* not asked for */
    assert_int_equal(dst[50], 0x11);
}

static void test_rread_parts_cover(void **state)
{
    (void)state;
    assert_int_equal(cx_rread_parts(0, 8), 1); /* a refusal still answers once */
    size_t off;
    assert_int_equal(cx_rread_part(0, 8, 0, &off), 0);
    const size_t ns[] = { 1, 7, 8, 9, 64, 65 };
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
        size_t sum = 0, np = cx_rread_parts(ns[k], 8);
        for (size_t i = 0; i < np; i++) {
            size_t len = cx_rread_part(ns[k], 8, i, &off);
            assert_int_equal(off, sum);
            assert_true(len > 0 && len <= 8);
            sum += len;
        }
        assert_int_equal(sum, ns[k]);
    }
}

/* Our own process: the advertisement round-trips, the probe checks the cookie, and a copy
 * names a wrong cookie, an unmapped range and a zero pid for what they are. */
static void test_cma_self(void **state)
{
    (void)state;
    static cx_cma_self_t self;
    assert_int_equal(cx_cma_self_init(&self), CX_OK);
    uint8_t adv[CX_CMA_ADV_LEN];
    cx_cma_adv_put(&self, adv);
    cx_cma_peer_t p;
    cx_cma_adv_get(adv, &p);
    assert_int_equal(p.pid, (uint32_t)getpid());
    assert_int_equal(p.cookie_addr, (uint64_t)(uintptr_t)self.cookie);
    assert_int_equal(p.ok, 0);
    uint8_t src[4096], dst[4096];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 13 + 1);
    assert_int_equal(cx_cma_read(&p, dst, (uint64_t)(uintptr_t)src, sizeof src), CX_EINVAL); /* not probed */
    if (cx_cma_peer_probe(&p) == CX_EUNSUPPORTED) skip(); /* no cross-memory attach here (seccomp) */
    assert_int_equal(p.ok, 1);
    memset(dst, 0, sizeof dst);
    assert_int_equal(cx_cma_read(&p, dst, (uint64_t)(uintptr_t)src, sizeof src), CX_OK);
    assert_memory_equal(dst, src, sizeof src);
    memset(dst, 0, sizeof dst);
    assert_int_equal(cx_cma_write(&p, (uint64_t)(uintptr_t)dst, src, sizeof src), CX_OK);
    assert_memory_equal(dst, src, sizeof src);
    /* a vector: three segments of different lengths, each to its place */
    uint8_t v[3][1000];
    memset(v, 0, sizeof v);
    cx_cma_seg_t seg[3] = { { v[0], (uint64_t)(uintptr_t)(src + 7), 1 },
                            { v[1], (uint64_t)(uintptr_t)(src + 100), 999 },
                            { v[2], (uint64_t)(uintptr_t)(src + 3000), 1000 } };
    assert_int_equal(cx_cma_copyv(&p, 0, seg, 3), CX_OK);
    assert_int_equal(v[0][0], src[7]);
    assert_memory_equal(v[1], src + 100, 999);
    assert_memory_equal(v[2], src + 3000, 1000);
    memset(dst, 0, sizeof dst);
    for (int i = 0; i < 3; i++) seg[i].remote = (uint64_t)(uintptr_t)(dst + (seg[i].remote - (uint64_t)(uintptr_t)src));
    assert_int_equal(cx_cma_copyv(&p, 1, seg, 3), CX_OK);
    assert_int_equal(dst[7], src[7]);
    assert_memory_equal(dst + 100, src + 100, 999);
    assert_memory_equal(dst + 3000, src + 3000, 1000);
    assert_int_equal(dst[6], 0);
    seg[1].len = 0; /* an empty segment is refused */
    assert_int_equal(cx_cma_copyv(&p, 0, seg, 3), CX_EINVAL);
    assert_int_equal(cx_cma_copyv(&p, 0, seg, CX_CMA_SEGS_MAX + 1), CX_EINVAL);
    /* an unmapped page */
    uint8_t *hole = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(hole != MAP_FAILED);
    assert_int_equal(munmap(hole + 4096, 4096), 0);
    assert_int_equal(cx_cma_read(&p, dst, (uint64_t)(uintptr_t)(hole + 2048), 4096), CX_EINVAL);
    assert_int_equal(cx_cma_write(&p, (uint64_t)(uintptr_t)(hole + 4096), src, 16), CX_EINVAL);
    munmap(hole, 4096);
    /* another cookie: the pid is somebody else now (a record that never matched it) */
    cx_cma_peer_t q = p;
    q.cookie[1] ^= 1;
    q.matched_ns = 0;
    assert_int_equal(cx_cma_read(&q, dst, (uint64_t)(uintptr_t)src, 16), CX_EPEER);
    assert_int_equal(cx_cma_write(&q, (uint64_t)(uintptr_t)dst, src, 16), CX_EPEER);
    assert_int_equal(cx_cma_peer_probe(&q), CX_EUNSUPPORTED);
    assert_int_equal(q.ok, 0);
    q = p;
    q.pid = 0;
    assert_int_equal(cx_cma_peer_probe(&q), CX_EINVAL);
    /* A write within CX_CMA_COOKIE_NS of the cookie's last match does not read it again; the
     * first one after reads it, and fails if it changed. */
    q = p;
    assert_int_equal(cx_cma_read(&q, dst, (uint64_t)(uintptr_t)src, 16), CX_OK);
    assert_true(q.matched_ns != 0);
    q.cookie[1] ^= 1; /* as if the pid had been taken right after the match */
    assert_int_equal(cx_cma_write(&q, (uint64_t)(uintptr_t)dst, src, 16), CX_OK);
    usleep(CX_CMA_COOKIE_NS / 1000 + 1000);
    assert_int_equal(cx_cma_write(&q, (uint64_t)(uintptr_t)dst, src, 16), CX_EPEER);
    assert_int_equal(q.matched_ns, 0);
    assert_int_equal(cx_cma_write(&q, (uint64_t)(uintptr_t)dst, src, 16), CX_EPEER); /* each one reads it now */
}

/* A child (which inherits the cookie at the same address): its memory, not ours, both ways;
 * once it is dead and reaped, CX_EPEER. */
static void test_cma_child(void **state)
{
    (void)state;
    static cx_cma_self_t self;
    static uint8_t buf[65536];
    assert_int_equal(cx_cma_self_init(&self), CX_OK);
    memset(buf, 0x11, sizeof buf);
    int ready[2], done[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(done), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 7 + 5);
        char c = 'r';
        if (write(ready[1], &c, 1) != 1) _exit(1);
        if (read(done[0], &c, 1) != 1) _exit(1);
        /* what the parent wrote: 0x5A from 1 KiB for 4 KiB */
        for (size_t i = 0; i < sizeof buf; i++)
            if (buf[i] != (i >= 1024 && i < 5120 ? 0x5A : (uint8_t)(i * 7 + 5))) _exit(2);
        _exit(0);
    }
    /* our ends of the child's: a child that dies early ends the read below (EOF), not hangs it */
    close(ready[1]);
    close(done[0]);
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    uint8_t adv[CX_CMA_ADV_LEN];
    cx_cma_adv_put(&self, adv);
    cx_cma_peer_t p;
    cx_cma_adv_get(adv, &p);
    p.pid = (uint32_t)pid;
    int rc = cx_cma_peer_probe(&p);
    if (rc == CX_EUNSUPPORTED) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        skip();
    }
    assert_int_equal(rc, CX_OK);
    static uint8_t got[65536], w[4096];
    assert_int_equal(cx_cma_read(&p, got, (uint64_t)(uintptr_t)buf, sizeof got), CX_OK);
    for (size_t i = 0; i < sizeof got; i++)
        if (got[i] != (uint8_t)(i * 7 + 5)) fail_msg("byte %zu of the child's memory differs", i);
    memset(w, 0x5A, sizeof w);
    assert_int_equal(cx_cma_write(&p, (uint64_t)(uintptr_t)(buf + 1024), w, sizeof w), CX_OK);
    for (size_t i = 0; i < sizeof buf; i++) assert_int_equal(buf[i], 0x11); /* ours untouched */
    assert_int_equal(write(done[1], "d", 1), 1);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(cx_cma_read(&p, got, (uint64_t)(uintptr_t)buf, 16), CX_EPEER);
    assert_int_equal(cx_cma_write(&p, (uint64_t)(uintptr_t)buf, w, 16), CX_EPEER);
    close(ready[0]);
    close(done[1]);
}

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test(test_acktab_collisions),
        cmocka_unit_test(test_objcache_bounded_zeroed),
        cmocka_unit_test(test_rread_windows_in_order),
        cmocka_unit_test(test_rread_refuses_bad_parts),
        cmocka_unit_test(test_rread_parts_cover),
        cmocka_unit_test(test_cma_self),
        cmocka_unit_test(test_cma_child),
    };
    return cmocka_run_group_tests(t, NULL, NULL);
}
