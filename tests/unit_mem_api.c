/* The public memory calls (cx_mem_kind, cx_mem_alloc/free, cx_mem_copy) on host and simulated
 * device memory, and cx_peer_first_region between two engines of this process: the first region
 * a peer announced, the next one once that is unregistered, (0, 0) for a peer with none,
 * CX_EPEER for an unknown or departed peer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "connex/connex.h"
#include "cx_gpu.h"

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static cx_engine_t *engine(const char *model)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.backend = "zmq";
    c.heartbeat_ms = 100;
    c.heartbeat_timeout_ms = 1000;
    c.connect_timeout_ms = 2000;
    cx_engine_t *e = NULL;
    assert_int_equal(cx_engine_create(&c, &e), CX_OK);
    return e;
}

static void test_mem_kinds_alloc_copy(void **state)
{
    (void)state;
    char host[64] = "host bytes";
    assert_int_equal(cx_mem_kind(host, sizeof host), CX_MEM_HOST);
    assert_int_equal(cx_mem_kind(NULL, 8), CX_EINVAL);

    void *p = (void *)1;
    assert_int_equal(cx_mem_alloc(CX_MEM_HOST, 0, 64, &p), CX_EINVAL);
    assert_null(p);
    assert_int_equal(cx_mem_alloc(CX_MEM_SIM, 0, 0, &p), CX_EINVAL);
    assert_int_equal(cx_mem_alloc(CX_MEM_SIM, -1, 64, &p), CX_EINVAL);
    assert_int_equal(cx_mem_alloc(CX_MEM_SIM, 0, 64, NULL), CX_EINVAL);
    cx_gpu_sim_enable(0);
    assert_int_equal(cx_mem_alloc(CX_MEM_SIM, 0, 64, &p), CX_EUNSUPPORTED);
    if (cx_gpu_cuda_devices() == 0) assert_int_equal(cx_mem_alloc(CX_MEM_CUDA, 0, 64, &p), CX_EUNSUPPORTED);

    cx_gpu_sim_enable(1);
    size_t before = cx_gpu_sim_bytes();
    assert_int_equal(cx_mem_alloc(CX_MEM_SIM, 0, 10000, &p), CX_OK);
    assert_non_null(p);
    assert_int_equal(cx_mem_kind(p, 10000), CX_MEM_SIM);
    assert_int_equal(cx_mem_kind(p, 10001), CX_EINVAL); /* runs past the allocation */
    assert_int_equal(cx_mem_copy(p, host, sizeof host), CX_OK);
    char back[64] = "";
    assert_int_equal(cx_mem_copy(back, p, sizeof back), CX_OK);
    assert_string_equal(back, "host bytes");
    assert_int_equal(cx_mem_copy(NULL, host, 8), CX_EINVAL);
    assert_int_equal(cx_mem_copy(back, host, 0), CX_OK);
    cx_mem_free(p);
    cx_mem_free(NULL);
    assert_int_equal(cx_gpu_sim_bytes(), before);
    cx_gpu_sim_enable(0);
}

/* Polls (bounded) until a's view of b's first region has length want_len. */
static int first_len_becomes(cx_engine_t *a, const char *b, uint64_t want_len, uint64_t *addr)
{
    uint64_t len = 0;
    for (int i = 0; i < 500; i++) {
        if (cx_peer_first_region(a, b, addr, &len) == CX_OK && len == want_len) return 1;
        sleep_ms(10);
    }
    return 0;
}

static void test_peer_first_region(void **state)
{
    (void)state;
    cx_engine_t *a = engine("fr-a"), *b = engine("fr-b"), *c = engine("fr-c");
    char b_url[CX_URL_MAX], c_url[CX_URL_MAX];
    snprintf(b_url, sizeof b_url, "%s", cx_engine_local_url(b));
    snprintf(c_url, sizeof c_url, "%s", cx_engine_local_url(c));
    uint64_t addr = 1, len = 1;

    assert_int_equal(cx_peer_first_region(a, "fr-b|0|0|0", &addr, &len), CX_EPEER); /* unknown */
    assert_int_equal(addr, 0);
    assert_int_equal(len, 0);
    assert_int_equal(cx_peer_first_region(a, "not a peer", &addr, &len), CX_EINVAL);
    assert_int_equal(cx_peer_first_region(a, b_url, NULL, &len), CX_EINVAL);
    assert_int_equal(cx_peer_first_region(NULL, b_url, &addr, &len), CX_EINVAL);
    assert_int_equal(cx_peer_first_region(a, b_url, &addr, &len), CX_EPEER); /* not connected */

    static char r1[4096], r2[8192];
    assert_int_equal(cx_register_memory(b, r1, sizeof r1), CX_OK);
    assert_int_equal(cx_connect(a, b_url, 5000), CX_OK);
    assert_int_equal(cx_register_memory(b, r2, sizeof r2), CX_OK);
    assert_int_equal(cx_peer_first_region(a, b_url, &addr, &len), CX_OK);
    assert_int_equal(addr, (uintptr_t)r1);
    assert_int_equal(len, sizeof r1);
    assert_int_equal(cx_peer_first_region(a, "fr-b|0|0|0", &addr, &len), CX_OK); /* by LID now */
    assert_int_equal(addr, (uintptr_t)r1);

    assert_int_equal(cx_unregister_memory(b, r1), CX_OK);
    assert_true(first_len_becomes(a, b_url, sizeof r2, &addr));
    assert_int_equal(addr, (uintptr_t)r2);

    assert_int_equal(cx_connect(a, c_url, 5000), CX_OK); /* a peer with no region */
    addr = len = 1;
    assert_int_equal(cx_peer_first_region(a, c_url, &addr, &len), CX_OK);
    assert_int_equal(addr, 0);
    assert_int_equal(len, 0);

    cx_engine_destroy(b); /* BYE: b has left */
    int rc = CX_OK;
    for (int i = 0; i < 500 && rc == CX_OK; i++) {
        rc = cx_peer_first_region(a, b_url, &addr, &len);
        if (rc == CX_OK) sleep_ms(10);
    }
    assert_int_equal(rc, CX_EPEER);
    cx_engine_destroy(c);
    cx_engine_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mem_kinds_alloc_copy),
        cmocka_unit_test(test_peer_first_region),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
