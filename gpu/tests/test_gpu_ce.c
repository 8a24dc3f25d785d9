/* The copy engine: asynchronous copies in both directions, in order per direction, completions
 * through the eventfd; bad input; destroy with copies in flight. Runs on the sim, or on CUDA
 * with CONNEX_GPU_TEST_KIND=cuda. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cx_gpu.h"

static int g_kind = CX_MEM_SIM;

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* Collect n completions within 5 s (bounded in count and time). */
static int collect(cx_ce_t *ce, cx_ce_done_t *out, int n)
{
    int got = 0;
    uint64_t t0 = now_ms();
    while (got < n && now_ms() - t0 < 5000) {
        struct pollfd p = { cx_ce_fd(ce), POLLIN, 0 };
        if (poll(&p, 1, 100) <= 0) continue;
        got += cx_ce_poll(ce, out + got, n - got);
    }
    return got;
}

static void t_copies(void **state)
{
    (void)state;
    cx_ce_t *ce;
    assert_int_equal(cx_ce_create(g_kind, 0, &ce), CX_OK);
    assert_true(cx_ce_fd(ce) >= 0);
    assert_int_equal(cx_ce_kind(ce), g_kind);
    enum { N = 16, LEN = 100003 };
    void *dev;
    assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, (size_t)N * LEN, &dev), CX_OK);
    cx_pinned_t src, dst;
    assert_int_equal(cx_pinned_alloc((size_t)N * LEN, &src), CX_OK);
    assert_int_equal(cx_pinned_alloc((size_t)N * LEN, &dst), CX_OK);
    for (size_t i = 0; i < (size_t)N * LEN; i++) ((unsigned char *)src.p)[i] = (unsigned char)(i * 7 + 3);
    memset(dst.p, 0, (size_t)N * LEN);

    for (int i = 0; i < N; i++)
        assert_int_equal(cx_ce_copy(ce, CX_CE_H2D, (char *)dev + (size_t)i * LEN, (char *)src.p + (size_t)i * LEN, LEN,
                                    (void *)(uintptr_t)(i + 1)),
                         CX_OK);
    cx_ce_done_t d[N];
    assert_int_equal(collect(ce, d, N), N);
    for (int i = 0; i < N; i++) { /* one direction completes in submission order */
        assert_int_equal((uintptr_t)d[i].cookie, i + 1);
        assert_int_equal(d[i].status, CX_OK);
    }
    assert_int_equal(cx_ce_inflight(ce), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(cx_ce_copy(ce, CX_CE_D2H, (char *)dev + (size_t)i * LEN, (char *)dst.p + (size_t)i * LEN, LEN,
                                    (void *)(uintptr_t)(100 + i)),
                         CX_OK);
    assert_int_equal(collect(ce, d, N), N);
    for (int i = 0; i < N; i++) assert_int_equal((uintptr_t)d[i].cookie, 100 + i);
    assert_memory_equal(src.p, dst.p, (size_t)N * LEN);

    /* Nothing pending: poll returns 0; a kick wakes the fd without a completion. */
    assert_int_equal(cx_ce_poll(ce, d, N), 0);
    cx_ce_kick(ce);
    struct pollfd p = { cx_ce_fd(ce), POLLIN, 0 };
    assert_int_equal(poll(&p, 1, 1000), 1);
    assert_int_equal(cx_ce_poll(ce, d, N), 0);
    assert_int_equal(poll(&p, 1, 0), 0);

    /* Bad input. */
    assert_int_equal(cx_ce_copy(ce, 7, dev, src.p, 1, NULL), CX_EINVAL);
    assert_int_equal(cx_ce_copy(ce, CX_CE_H2D, NULL, src.p, 1, NULL), CX_EINVAL);
    assert_int_equal(cx_ce_copy(ce, CX_CE_H2D, dev, NULL, 1, NULL), CX_EINVAL);
    assert_int_equal(cx_ce_copy(ce, CX_CE_H2D, dev, src.p, 0, NULL), CX_EINVAL);
    assert_int_equal(cx_ce_inflight(ce), 0);

    /* Polling fewer than are ready keeps the fd readable for the rest. */
    for (int i = 0; i < 4; i++) assert_int_equal(cx_ce_copy(ce, CX_CE_D2H, dev, dst.p, 4096, NULL), CX_OK);
    int got = 0;
    uint64_t t0 = now_ms();
    while (got < 4 && now_ms() - t0 < 5000) {
        if (poll(&p, 1, 100) <= 0) continue;
        got += cx_ce_poll(ce, d, 1);
    }
    assert_int_equal(got, 4);

    cx_ce_destroy(ce);
    cx_gpu_dev_free(dev);
    cx_pinned_free(&src);
    cx_pinned_free(&dst);
}

/* cx_gpu_memcpy / cx_gpu_memset into device memory are done when they return, also for the copy
 * engine's own streams: a D2H right after reads the new bytes (small copies are the ones a
 * driver may return from early). */
static void t_sync_copies_visible(void **state)
{
    (void)state;
    cx_ce_t *ce;
    assert_int_equal(cx_ce_create(g_kind, 0, &ce), CX_OK);
    enum { LEN = 16 << 10, ROUNDS = 64 };
    void *dev;
    assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, LEN, &dev), CX_OK);
    unsigned char *src = malloc(LEN); /* pageable, as a caller's buffer is */
    assert_non_null(src);
    cx_pinned_t dst;
    assert_int_equal(cx_pinned_alloc(LEN, &dst), CX_OK);
    cx_ce_done_t d;
    for (int k = 0; k < ROUNDS; k++) {
        if (k % 2) {
            assert_int_equal(cx_gpu_memset(dev, k, LEN), CX_OK);
            memset(src, k, LEN);
        } else {
            for (size_t i = 0; i < LEN; i++) src[i] = (unsigned char)(i * 13 + (size_t)k);
            assert_int_equal(cx_gpu_memcpy(dev, src, LEN), CX_OK);
        }
        assert_int_equal(cx_ce_copy(ce, CX_CE_D2H, dev, dst.p, LEN, NULL), CX_OK);
        assert_int_equal(collect(ce, &d, 1), 1);
        assert_int_equal(d.status, CX_OK);
        assert_memory_equal(dst.p, src, LEN);
    }
    cx_ce_destroy(ce);
    cx_gpu_dev_free(dev);
    free(src);
    cx_pinned_free(&dst);
}

/* Small copies (waited for in place on CUDA) and large ones (called back) mixed on one stream
 * still complete in submission order, and each moves its own bytes. */
static void t_mixed_sizes_in_order(void **state)
{
    (void)state;
    cx_ce_t *ce;
    assert_int_equal(cx_ce_create(g_kind, 0, &ce), CX_OK);
    enum { N = 12 };
    const size_t big = (size_t)4 << 20, small = 4096, stride = (size_t)4 << 20;
    void *dev;
    assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, stride * N, &dev), CX_OK);
    cx_pinned_t src, dst;
    assert_int_equal(cx_pinned_alloc(stride * N, &src), CX_OK);
    assert_int_equal(cx_pinned_alloc(stride * N, &dst), CX_OK);
    for (size_t i = 0; i < stride * N; i++) ((unsigned char *)src.p)[i] = (unsigned char)(i * 5 + 1);
    memset(dst.p, 0, stride * N);
    for (int dir = 0; dir < 2; dir++) {
        for (int i = 0; i < N; i++) {
            size_t len = i % 3 == 0 ? big : small;
            char *dv = (char *)dev + (size_t)i * stride;
            char *h = (char *)(dir == 0 ? src.p : dst.p) + (size_t)i * stride;
            assert_int_equal(cx_ce_copy(ce, dir == 0 ? CX_CE_H2D : CX_CE_D2H, dv, h, len, (void *)(uintptr_t)(i + 1)),
                             CX_OK);
        }
        cx_ce_done_t d[N];
        assert_int_equal(collect(ce, d, N), N);
        for (int i = 0; i < N; i++) {
            assert_int_equal((uintptr_t)d[i].cookie, i + 1);
            assert_int_equal(d[i].status, CX_OK);
        }
    }
    for (int i = 0; i < N; i++) {
        size_t len = i % 3 == 0 ? big : small;
        assert_memory_equal((char *)dst.p + (size_t)i * stride, (char *)src.p + (size_t)i * stride, len);
    }
    assert_int_equal(cx_ce_inflight(ce), 0);
    cx_ce_destroy(ce);
    cx_gpu_dev_free(dev);
    cx_pinned_free(&src);
    cx_pinned_free(&dst);
}

/* Destroy waits for copies still running (nothing is written after it returns). */
static void t_destroy_inflight(void **state)
{
    (void)state;
    cx_ce_t *ce;
    assert_int_equal(cx_ce_create(g_kind, 0, &ce), CX_OK);
    size_t len = 2 << 20;
    void *dev[2];
    cx_pinned_t h[2];
    for (int d = 0; d < 2; d++) { /* separate buffers per direction: the streams run concurrently */
        assert_int_equal(cx_gpu_dev_alloc(g_kind, 0, len, &dev[d]), CX_OK);
        assert_int_equal(cx_pinned_alloc(len, &h[d]), CX_OK);
    }
    for (int i = 0; i < 8; i++) {
        assert_int_equal(cx_ce_copy(ce, CX_CE_H2D, dev[0], h[0].p, len, NULL), CX_OK);
        assert_int_equal(cx_ce_copy(ce, CX_CE_D2H, dev[1], h[1].p, len, NULL), CX_OK);
    }
    assert_true(cx_ce_inflight(ce) > 0);
    cx_ce_destroy(ce);
    for (int d = 0; d < 2; d++) {
        cx_gpu_dev_free(dev[d]);
        cx_pinned_free(&h[d]);
    }
}

static void t_bad_create(void **state)
{
    (void)state;
    cx_ce_t *ce = (cx_ce_t *)1;
    assert_int_equal(cx_ce_create(CX_MEM_HOST, 0, &ce), CX_EINVAL);
    assert_null(ce);
    assert_int_equal(cx_ce_create(42, 0, &ce), CX_EINVAL);
}

int main(void)
{
    const char *k = getenv("CONNEX_GPU_TEST_KIND");
    if (k && !strcmp(k, "cuda"))
        g_kind = CX_MEM_CUDA;
    else
        cx_gpu_sim_enable(1);
    if (g_kind == CX_MEM_CUDA && cx_gpu_init() != CX_OK) {
        fprintf(stderr, "CONNEX_GPU_TEST_KIND=cuda but %s\n", cx_gpu_status());
        return 1;
    }
    const struct CMUnitTest t[] = {
        cmocka_unit_test(t_copies),
        cmocka_unit_test(t_sync_copies_visible),
        cmocka_unit_test(t_mixed_sizes_in_order),
        cmocka_unit_test(t_destroy_inflight),
        cmocka_unit_test(t_bad_create),
    };
    return cmocka_run_group_tests_name(g_kind == CX_MEM_CUDA ? "gpu_ce_cuda" : "gpu_ce_sim", t, NULL, NULL);
}
