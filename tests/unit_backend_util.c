/* The helpers backends share (backends/util/): the ack table finds an op by the id its answer
 * names, also among ids that share a bucket; the op cache is bounded and hands out zeroed
 * records; a target-answered read takes only the part it expects, in order and inside the
 * window asked for, and the target cuts an answer into parts that cover it exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "util/acktab.h"
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

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test(test_acktab_collisions),      cmocka_unit_test(test_objcache_bounded_zeroed),
        cmocka_unit_test(test_rread_windows_in_order), cmocka_unit_test(test_rread_refuses_bad_parts),
        cmocka_unit_test(test_rread_parts_cover),
    };
    return cmocka_run_group_tests(t, NULL, NULL);
}
