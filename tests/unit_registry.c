/* The local region registry (core/src/region.h): no overlaps, exact-start removal, and lookups
 * that accept a range only when it lies wholly inside one region. The registry never touches the
 * memory it describes, so made-up addresses are fine here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "connex/backend.h"
#include "connex/connex.h"
#include "region.h"

#define A(x) ((void *)(uintptr_t)(x))

static int setup(void **state)
{
    cx_registry_t *r = malloc(sizeof *r);
    if (!r || cx_registry_init(r)) return -1;
    *state = r;
    return 0;
}

static int teardown(void **state)
{
    cx_registry_fini(*state); /* frees regions still registered (ASan checks) */
    free(*state);
    return 0;
}

static void test_add_find_boundaries(void **state)
{
    cx_registry_t *r = *state;
    cx_region_t *reg = NULL;
    assert_int_equal(cx_registry_add(r, A(0x10000), 4096, CX_MEM_HOST, &reg), CX_OK);
    assert_non_null(reg);
    assert_int_equal(reg->addr, 0x10000);
    assert_int_equal(reg->len, 4096);
    assert_int_equal(cx_registry_count(r), 1);
    assert_int_equal(r->bytes, 4096);

    pthread_rwlock_rdlock(&r->lock);
    assert_ptr_equal(cx_registry_find_locked(r, 0x10000, 4096), reg);       /* whole */
    assert_ptr_equal(cx_registry_find_locked(r, 0x10000, 1), reg);          /* first byte */
    assert_ptr_equal(cx_registry_find_locked(r, 0x10000 + 4095, 1), reg);   /* last byte */
    assert_ptr_equal(cx_registry_find_locked(r, 0x10000 + 100, 3996), reg); /* exactly to end */
    assert_null(cx_registry_find_locked(r, 0x10000 + 100, 3997));           /* one past end */
    assert_null(cx_registry_find_locked(r, 0x10000 + 4096, 1));             /* just after */
    assert_null(cx_registry_find_locked(r, 0x10000 - 1, 1));                /* just before */
    assert_null(cx_registry_find_locked(r, 0x10000 - 1, 2));                /* straddles start */
    assert_null(cx_registry_find_locked(r, 0x10000, 4097));
    assert_null(cx_registry_find_locked(r, 0x10000, 0));              /* zero length */
    assert_null(cx_registry_find_locked(r, 0x10000 + 8, UINT64_MAX)); /* wraps */
    assert_null(cx_registry_find_locked(r, 0x10000 + 8, UINT64_MAX - 0x10000));
    assert_null(cx_registry_find_locked(r, UINT64_MAX, 2));
    assert_null(cx_registry_find_locked(r, 0, 1));
    pthread_rwlock_unlock(&r->lock);

    int kind = -1;
    assert_int_equal(cx_registry_contains(r, 0x10010, 16, &kind), 1);
    assert_int_equal(kind, CX_MEM_HOST);
    assert_int_equal(cx_registry_contains(r, 0x10ff0, 32, NULL), 0);
}

static void test_bad_adds(void **state)
{
    cx_registry_t *r = *state;
    assert_int_equal(cx_registry_add(r, NULL, 4096, CX_MEM_HOST, NULL), CX_EINVAL);
    assert_int_equal(cx_registry_add(r, A(0x1000), 0, CX_MEM_HOST, NULL), CX_EINVAL);
    assert_int_equal(cx_registry_add(r, A(UINTPTR_MAX - 10), 100, CX_MEM_HOST, NULL), CX_EINVAL);
    assert_int_equal(cx_registry_add(r, A(0x1000), SIZE_MAX, CX_MEM_HOST, NULL), CX_EINVAL);
    assert_int_equal(cx_registry_count(r), 0);
    assert_int_equal(r->bytes, 0);
    /* The very last byte of the address space is a legal region end. */
    assert_int_equal(cx_registry_add(r, A(UINTPTR_MAX - 99), 99, CX_MEM_HOST, NULL), CX_OK);
    assert_int_equal(cx_registry_contains(r, UINT64_MAX - 99, 99, NULL), 1);
    assert_int_equal(cx_registry_contains(r, UINT64_MAX - 99, 100, NULL), 0);
}

static void test_overlap_and_duplicate(void **state)
{
    cx_registry_t *r = *state;
    assert_int_equal(cx_registry_add(r, A(0x20000), 0x1000, CX_MEM_HOST, NULL), CX_OK);
    assert_int_equal(cx_registry_add(r, A(0x20000), 0x1000, CX_MEM_HOST, NULL), CX_EINVAL);  /* dup */
    assert_int_equal(cx_registry_add(r, A(0x20000), 0x10, CX_MEM_HOST, NULL), CX_EINVAL);    /* same start */
    assert_int_equal(cx_registry_add(r, A(0x1f000), 0x1001, CX_MEM_HOST, NULL), CX_EINVAL);  /* over start */
    assert_int_equal(cx_registry_add(r, A(0x20fff), 0x10, CX_MEM_HOST, NULL), CX_EINVAL);    /* over end */
    assert_int_equal(cx_registry_add(r, A(0x20100), 0x10, CX_MEM_HOST, NULL), CX_EINVAL);    /* inside */
    assert_int_equal(cx_registry_add(r, A(0x10000), 0x20000, CX_MEM_HOST, NULL), CX_EINVAL); /* around */
    assert_int_equal(cx_registry_count(r), 1);
    /* Touching on either side is not overlapping. */
    assert_int_equal(cx_registry_add(r, A(0x1f000), 0x1000, CX_MEM_HOST, NULL), CX_OK);
    assert_int_equal(cx_registry_add(r, A(0x21000), 0x1000, CX_MEM_HOST, NULL), CX_OK);
    assert_int_equal(cx_registry_count(r), 3);
    assert_int_equal(r->bytes, 0x3000);
    /* A range across two adjacent regions is inside neither. */
    assert_int_equal(cx_registry_contains(r, 0x20ff0, 0x20, NULL), 0);
    assert_int_equal(cx_registry_contains(r, 0x1f000, 0x3000, NULL), 0);
    assert_int_equal(cx_registry_contains(r, 0x21000, 0x1000, NULL), 1);
}

static void test_remove(void **state)
{
    cx_registry_t *r = *state;
    cx_region_t *a = NULL, *b = NULL, *out = NULL;
    assert_int_equal(cx_registry_remove(r, A(0x30000), &out), CX_EINVAL); /* empty registry */
    assert_int_equal(cx_registry_add(r, A(0x30000), 0x1000, CX_MEM_HOST, &a), CX_OK);
    assert_int_equal(cx_registry_add(r, A(0x40000), 0x1000, CX_MEM_SIM, &b), CX_OK);
    uint64_t id_a = a->id;
    assert_true(a->id != b->id);
    assert_int_equal(cx_registry_remove(r, A(0x30001), &out), CX_EINVAL); /* interior */
    assert_int_equal(cx_registry_remove(r, A(0x2ffff), &out), CX_EINVAL);
    assert_int_equal(cx_registry_remove(r, A(0x31000), &out), CX_EINVAL); /* its end */
    assert_int_equal(cx_registry_remove(r, NULL, &out), CX_EINVAL);
    assert_int_equal(cx_registry_count(r), 2);
    out = NULL;
    assert_int_equal(cx_registry_remove(r, A(0x30000), &out), CX_OK);
    assert_ptr_equal(out, a);
    cx_region_free(out);
    assert_int_equal(cx_registry_count(r), 1);
    assert_int_equal(r->bytes, 0x1000);
    assert_int_equal(cx_registry_contains(r, 0x30000, 1, NULL), 0);
    assert_int_equal(cx_registry_remove(r, A(0x30000), &out), CX_EINVAL); /* twice */
    /* Re-adding the same range gets a new id: ids are never reused, so a stale remote key
     * can never name a new region. */
    cx_region_t *a2 = NULL;
    assert_int_equal(cx_registry_add(r, A(0x30000), 0x1000, CX_MEM_HOST, &a2), CX_OK);
    assert_true(a2->id != id_a);
    assert_true(a2->id != b->id);
    int kind = -1;
    assert_int_equal(cx_registry_contains(r, 0x40000, 0x1000, &kind), 1);
    assert_int_equal(kind, CX_MEM_SIM);
    /* Remove without taking the region: the registry frees it. */
    assert_int_equal(cx_registry_remove(r, A(0x40000), NULL), CX_OK);
    assert_int_equal(cx_registry_count(r), 1);
}

/* Many regions inserted out of order: every lookup finds exactly its own region. */
static void test_many_regions(void **state)
{
    cx_registry_t *r = *state;
    enum { N = 2000 };
    static uint32_t order[N];
    for (uint32_t i = 0; i < N; i++) order[i] = i;
    srand(12345);
    for (uint32_t i = N - 1; i > 0; i--) {
        uint32_t j = (uint32_t)rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    /* Region k: [0x100000 + k*0x1000, +0x800 + k%0x800): gaps between all of them. */
    for (uint32_t i = 0; i < N; i++) {
        uint32_t k = order[i];
        assert_int_equal(cx_registry_add(r, A(0x100000 + (uint64_t)k * 0x1000), 0x800 + k % 0x800, CX_MEM_HOST, NULL),
                         CX_OK);
    }
    assert_int_equal(cx_registry_count(r), N);
    pthread_rwlock_rdlock(&r->lock);
    for (uint32_t k = 0; k < N; k++) {
        uint64_t base = 0x100000 + (uint64_t)k * 0x1000, len = 0x800 + k % 0x800;
        cx_region_t *g = cx_registry_find_locked(r, base, len);
        assert_non_null(g);
        assert_int_equal(g->addr, base);
        assert_ptr_equal(cx_registry_find_locked(r, base + len - 1, 1), g);
        assert_null(cx_registry_find_locked(r, base + len - 1, 2));
        assert_null(cx_registry_find_locked(r, base + len, 1)); /* in the gap */
    }
    pthread_rwlock_unlock(&r->lock);
    for (uint32_t k = 0; k < N; k += 2)
        assert_int_equal(cx_registry_remove(r, A(0x100000 + (uint64_t)k * 0x1000), NULL), CX_OK);
    assert_int_equal(cx_registry_count(r), N / 2);
    for (uint32_t k = 0; k < N; k++)
        assert_int_equal(cx_registry_contains(r, 0x100000 + (uint64_t)k * 0x1000, 1, NULL), k % 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_add_find_boundaries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_adds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlap_and_duplicate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_regions, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
