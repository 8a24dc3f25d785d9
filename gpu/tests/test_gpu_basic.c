/* gpu/ basics: CUDA loading and how its absence is reported, the sim's memory, memory kinds,
 * GPUDirect decisions, pinned memory.
 * Modes: (none) everything that holds on any machine; "absent" with CONNEX_LIBCUDA pointing
 * nowhere; "stub" with the CUDA toolkit's stub libcuda (skipped, 77, when it is not there). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cx_gpu.h"

static void t_status_consistent(void **state)
{
    (void)state;
    int rc = cx_gpu_init();
    const char *s = cx_gpu_status();
    assert_non_null(s);
    assert_non_null(strstr(s, "cuda: "));
    assert_int_equal(cx_gpu_init(), rc); /* idempotent */
    if (rc == CX_OK) {
        assert_true(cx_gpu_cuda_devices() > 0);
        assert_null(strstr(s, "unavailable"));
    } else {
        assert_int_equal(rc, CX_EUNSUPPORTED);
        assert_int_equal(cx_gpu_cuda_devices(), 0);
        assert_non_null(strstr(s, "unavailable"));
        /* Without CUDA, asking for CUDA things fails cleanly. */
        void *p = (void *)1;
        assert_int_not_equal(cx_gpu_dev_alloc(CX_MEM_CUDA, 0, 4096, &p), CX_OK);
        assert_null(p);
        cx_ce_t *ce = (cx_ce_t *)1;
        assert_int_equal(cx_ce_create(CX_MEM_CUDA, 0, &ce), CX_EUNSUPPORTED);
        assert_null(ce);
    }
}

static void t_sim_off_then_on(void **state)
{
    (void)state;
    cx_gpu_sim_enable(0);
    assert_false(cx_gpu_sim_enabled());
    assert_null(cx_gpu_sim_alloc(4096));
    assert_non_null(strstr(cx_gpu_status(), "sim: off"));
    cx_gpu_sim_enable(1);
    assert_true(cx_gpu_sim_enabled());
    assert_non_null(strstr(cx_gpu_status(), "sim: on"));
    assert_null(cx_gpu_sim_alloc(0));
}

static void t_mem_kinds(void **state)
{
    (void)state;
    cx_gpu_sim_enable(1);
    size_t before = cx_gpu_sim_bytes();
    char *d = cx_gpu_sim_alloc(10000);
    assert_non_null(d);
    assert_int_equal(cx_gpu_sim_bytes(), before + 10000);
    char host[64];
    char *heap = malloc(1 << 20);
    assert_non_null(heap);

    assert_int_equal(cx_gpu_mem_kind(d, 10000), CX_MEM_SIM);
    assert_int_equal(cx_gpu_mem_kind(d + 9999, 1), CX_MEM_SIM);
    assert_int_equal(cx_gpu_mem_kind(d + 5000, 0), CX_MEM_SIM);
    assert_int_equal(cx_gpu_mem_kind(host, sizeof host), CX_MEM_HOST);
    assert_int_equal(cx_gpu_mem_kind(heap, 1 << 20), CX_MEM_HOST);
    cx_gpu_mem_t m;
    assert_int_equal(cx_gpu_mem_query(d + 100, 100, &m), CX_OK);
    assert_int_equal(m.kind, CX_MEM_SIM);
    assert_int_equal(m.base, (uintptr_t)d);
    assert_int_equal(m.size, 10000);

    /* Bad input: NULL, a range running past the end of a device allocation. */
    assert_int_equal(cx_gpu_mem_kind(NULL, 1), CX_EINVAL);
    assert_int_equal(cx_gpu_mem_kind(d, 10001), CX_EINVAL);
    assert_int_equal(cx_gpu_mem_kind(d + 9000, 1001), CX_EINVAL);
    assert_int_equal(cx_gpu_mem_kind(d + 1, SIZE_MAX), CX_EINVAL);

    /* Synchronous copies between kinds. */
    memset(heap, 0x5a, 10000);
    assert_int_equal(cx_gpu_memcpy(d, heap, 10000), CX_OK);
    assert_int_equal(cx_gpu_memset(d + 10, 1, 10), CX_OK);
    memset(heap, 0, 10000);
    assert_int_equal(cx_gpu_memcpy(heap, d, 10000), CX_OK);
    assert_int_equal(heap[9], 0x5a);
    assert_int_equal(heap[10], 1);
    assert_int_equal(heap[19], 1);
    assert_int_equal(heap[9999], 0x5a);
    assert_int_equal(cx_gpu_memcpy(heap, d, 10001), CX_EINVAL);

    cx_gpu_sim_free(d);
    assert_int_equal(cx_gpu_sim_bytes(), before);
    assert_int_equal(cx_gpu_mem_kind(heap, 16), CX_MEM_HOST);
    cx_gpu_sim_free(heap); /* not a sim allocation: logged, ignored, no crash */
    free(heap);

    void *p = NULL;
    assert_int_equal(cx_gpu_dev_alloc(CX_MEM_SIM, 0, 4096, &p), CX_OK);
    assert_int_equal(cx_gpu_mem_kind(p, 4096), CX_MEM_SIM);
    cx_gpu_dev_free(p);
    assert_int_equal(cx_gpu_dev_alloc(CX_MEM_HOST, 0, 4096, &p), CX_EINVAL);
    assert_int_equal(cx_gpu_dev_alloc(CX_MEM_SIM, 0, 0, &p), CX_EINVAL);
    assert_int_equal(cx_gpu_sim_bytes(), before);
    assert_string_equal(cx_mem_kind_name(CX_MEM_CUDA), "cuda");
}

static void t_pinned(void **state)
{
    (void)state;
    cx_pinned_t pm;
    assert_int_equal(cx_pinned_alloc(0, &pm), CX_EINVAL);
    assert_int_equal(cx_pinned_alloc(3 << 20, &pm), CX_OK);
    assert_non_null(pm.p);
    assert_int_equal((uintptr_t)pm.p % 4096, 0);
    memset(pm.p, 7, 3 << 20); /* all of it is writable */
    assert_int_equal(cx_gpu_mem_kind(pm.p, 3 << 20), CX_MEM_HOST);
    cx_pinned_free(&pm);
    assert_null(pm.p);
    cx_pinned_free(&pm); /* twice is harmless */
}

static void t_gdr(void **state)
{
    (void)state;
    cx_gdr_info_t gi;
    cx_gdr_caps_t rdma = { 1, 1, 1 }, tcp = { 0, 0, 0 };
    int mode;

    unsetenv("CONNEX_GDR");
    assert_int_equal(cx_gdr_mode(&mode), CX_OK);
    assert_int_equal(mode, CX_GDR_AUTO);
    assert_int_equal(cx_gdr_decide(CX_MEM_HOST, -1, &tcp, &gi), CX_OK);
    assert_int_equal(gi.use, 1);
    assert_int_equal(cx_gdr_decide(CX_MEM_SIM, 0, &rdma, &gi), CX_OK);
    assert_int_equal(gi.use, 0); /* auto stages sim memory */
    assert_non_null(strstr(gi.reason, "no GPUDirect"));
    assert_int_equal(cx_gdr_decide(CX_MEM_CUDA, 0, &tcp, &gi), CX_OK);
    assert_int_equal(gi.use, 0);
    assert_true(strlen(gi.reason) > 10);

    setenv("CONNEX_GDR", "1", 1);
    assert_int_equal(cx_gdr_mode(&mode), CX_OK);
    assert_int_equal(mode, CX_GDR_ON);
    assert_int_equal(cx_gdr_decide(CX_MEM_SIM, 0, &tcp, &gi), CX_OK);
    assert_int_equal(gi.use, 1);
    /* GPU memory over a backend without RDMA can never go direct: with =1 that is an error. */
    assert_int_equal(cx_gdr_decide(CX_MEM_CUDA, 0, &tcp, &gi), CX_EUNSUPPORTED);
    assert_int_equal(gi.use, 0);
    assert_non_null(strstr(gi.reason, "no GPUDirect"));
    if (cx_gpu_init() != CX_OK) {
        assert_int_equal(cx_gdr_decide(CX_MEM_CUDA, 0, &rdma, &gi), CX_EUNSUPPORTED);
        assert_non_null(strstr(gi.reason, "cuda"));
    }

    setenv("CONNEX_GDR", "0", 1);
    assert_int_equal(cx_gdr_decide(CX_MEM_SIM, 0, &rdma, &gi), CX_OK);
    assert_int_equal(gi.use, 0);
    assert_int_equal(cx_gdr_decide(CX_MEM_CUDA, 0, &rdma, &gi), CX_OK);
    assert_int_equal(gi.use, 0);
    assert_non_null(strstr(gi.reason, "CONNEX_GDR=0"));

    setenv("CONNEX_GDR", "maybe", 1);
    assert_int_equal(cx_gdr_mode(&mode), CX_EINVAL);
    assert_int_equal(cx_gdr_decide(CX_MEM_SIM, 0, &rdma, &gi), CX_EINVAL);
    setenv("CONNEX_GDR", "auto", 1);
    assert_int_equal(cx_gdr_decide(CX_MEM_SIM, 0, NULL, &gi), CX_OK);
    unsetenv("CONNEX_GDR");
}

/* CONNEX_LIBCUDA points at nothing: the reason names the library and the missing driver. */
static void t_absent(void **state)
{
    (void)state;
    assert_int_equal(cx_gpu_init(), CX_EUNSUPPORTED);
    const char *s = cx_gpu_status();
    assert_non_null(strstr(s, "unavailable"));
    assert_non_null(strstr(s, "/nonexistent/libcuda.so.1"));
    assert_non_null(strstr(s, "driver is not installed"));
    assert_int_equal(cx_gpu_cuda_devices(), 0);
    /* Host memory still works; CUDA memory is never reported. */
    char buf[16];
    assert_int_equal(cx_gpu_mem_kind(buf, sizeof buf), CX_MEM_HOST);
    cx_pinned_t pm;
    assert_int_equal(cx_pinned_alloc(4096, &pm), CX_OK);
    cx_pinned_free(&pm);
}

/* The toolkit's stub libcuda: loads, but cuInit says it is a stub. */
static void t_stub(void **state)
{
    (void)state;
    assert_int_equal(cx_gpu_init(), CX_EUNSUPPORTED);
    const char *s = cx_gpu_status();
    assert_non_null(strstr(s, "CUDA_ERROR_STUB_LIBRARY"));
    assert_non_null(strstr(s, "stub library"));
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "absent")) {
        const struct CMUnitTest t[] = { cmocka_unit_test(t_absent) };
        return cmocka_run_group_tests_name("gpu_cuda_absent", t, NULL, NULL);
    }
    if (argc > 1 && !strcmp(argv[1], "stub")) {
        static const char *paths[] = { "/usr/local/cuda/lib64/stubs/libcuda.so",
                                       "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so" };
        const char *found = NULL;
        for (int i = 0; i < 2 && !found; i++)
            if (access(paths[i], R_OK) == 0) found = paths[i];
        if (!found) {
            printf("no CUDA stub libcuda.so on this machine: skipped\n");
            return 77;
        }
        setenv("CONNEX_LIBCUDA", found, 1);
        const struct CMUnitTest t[] = { cmocka_unit_test(t_stub) };
        return cmocka_run_group_tests_name("gpu_cuda_stub", t, NULL, NULL);
    }
    const struct CMUnitTest t[] = {
        cmocka_unit_test(t_status_consistent),
        cmocka_unit_test(t_sim_off_then_on),
        cmocka_unit_test(t_mem_kinds),
        cmocka_unit_test(t_pinned),
        cmocka_unit_test(t_gdr),
    };
    return cmocka_run_group_tests_name("gpu_basic", t, NULL, NULL);
}
