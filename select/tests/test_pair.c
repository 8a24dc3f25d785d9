/* Per-pair choice: heterogeneous pairs, symmetry, and the advertisement format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "connex/connex.h"
#include "synth.h"

static cx_probe_t P;
static cx_decision_t A, B;

/* What host type a chooses with host type b, checked from both ends. */
static const char *pair_of(int ta, int tb, int same_host, char *why, size_t len)
{
    synth_host(&P, ta);
    assert_int_equal(cx_select_decide(&P, NULL, &A), CX_OK);
    synth_host(&P, tb);
    assert_int_equal(cx_select_decide(&P, NULL, &B), CX_OK);
    int oa[CX_SEL_MAX_BE], ob[CX_SEL_MAX_BE];
    int na = cx_select_pair(A.be, A.n, B.be, B.n, same_host, oa, why, len);
    int nb = cx_select_pair(B.be, B.n, A.be, A.n, same_host, ob, NULL, 0);
    assert_int_equal(na, nb);
    if (!na) return NULL;
    /* both ends agree on the whole fallback order, not just the first */
    for (int i = 0; i < na; i++) assert_string_equal(A.be[oa[i]].backend, B.be[ob[i]].backend);
    return A.be[oa[0]].backend;
}

static void heterogeneous_pairs(void **s)
{
    (void)s;
    char why[512];
    /* EFA and InfiniBand share no RDMA fabric: they meet on TCP */
    assert_string_equal(pair_of(H_EFA_HMEM, H_IB_GPU_PEERMEM, 0, why, sizeof why), "ucx");
    assert_non_null(strstr(why, "libfabric: not shared"));
    assert_non_null(strstr(why, "ucx tcp"));
    assert_string_equal(pair_of(H_IB_GPU_PEERMEM, H_IB_GPU_PEERMEM, 0, why, sizeof why), "ucx");
    assert_non_null(strstr(why, "ucx rdma (ib)"));
    assert_string_equal(pair_of(H_EFA_HMEM, H_EFA_NOHMEM, 0, why, sizeof why), "libfabric");
    assert_non_null(strstr(why, "libfabric rdma (efa)"));
    /* IB host with a laptop: the fastest TCP path both have (libfabric tcp 3.6 > UCX tcp 1.1) */
    assert_string_equal(pair_of(H_IB_GPU_PEERMEM, H_TCP, 0, why, sizeof why), "libfabric");
    assert_non_null(strstr(why, "libfabric tcp, then ucx tcp, then zmq tcp"));
    /* IB and RoCE ports cannot talk RDMA to each other */
    assert_string_equal(pair_of(H_IB_GPU_PEERMEM, H_ROCE, 0, why, sizeof why), "libfabric");
    assert_string_equal(pair_of(H_ROCE, H_ROCE, 0, why, sizeof why), "ucx");
    assert_string_equal(pair_of(H_TCP, H_TCP, 0, why, sizeof why), "libfabric");
    /* same host: the local path measured fastest between two processes (libfabric over
     * loopback 1.9 GB/s; UCX, which runs one tcp/lo lane there, 1.1), RDMA loopback first */
    assert_string_equal(pair_of(H_TCP, H_TCP, 1, why, sizeof why), "libfabric");
    assert_non_null(strstr(why, "libfabric tcp, then ucx same host (one tcp/lo lane)"));
    assert_string_equal(pair_of(H_EFA_HMEM, H_EFA_HMEM, 1, why, sizeof why), "libfabric");
    assert_non_null(strstr(why, "libfabric rdma (efa)"));
    assert_string_equal(pair_of(H_IB_GPU_PEERMEM, H_IB_GPU_PEERMEM, 1, why, sizeof why), "ucx");
}

static void symmetric_everywhere(void **s)
{
    (void)s;
    for (int a = 0; a < H_COUNT; a++)
        for (int b = 0; b < H_COUNT; b++)
            for (int sh = 0; sh < 2; sh++) {
                if (a == H_NO_BACKENDS || b == H_NO_BACKENDS) continue;
                assert_non_null(pair_of(a, b, sh, NULL, 0)); /* zmq at worst */
            }
}

static void nothing_in_common(void **s)
{
    (void)s;
    cx_choice_t z = { "zmq", "", CX_CAP_TCP }, u = { "ucx", "", CX_CAP_TCP | CX_CAP_SHM };
    int order[CX_SEL_MAX_BE];
    char why[128];
    assert_int_equal(cx_select_pair(&z, 1, &u, 1, 0, order, why, sizeof why), 0);
    assert_non_null(strstr(why, "zmq: not shared"));
    /* libfabric with different providers is no common backend */
    cx_choice_t fe = { "libfabric", "efa", CX_CAP_EFA }, ft = { "libfabric", "tcp;ofi_rxm", CX_CAP_TCP };
    assert_int_equal(cx_select_pair(&fe, 1, &ft, 1, 0, order, NULL, 0), 0);
    cx_choice_t ft2 = { "libfabric", "tcp", CX_CAP_TCP };
    assert_int_equal(cx_select_pair(&ft2, 1, &ft, 1, 0, order, NULL, 0), 1);
    assert_int_equal(cx_select_pair(NULL, 1, &ft, 1, 0, order, NULL, 0), 0);
}

static void advertisement_format(void **s)
{
    (void)s;
    cx_choice_t c = { "libfabric", "tcp;ofi_rxm", CX_CAP_TCP | CX_CAP_GDR }, d;
    char buf[96];
    assert_int_equal(cx_choice_format(&c, buf, sizeof buf), CX_OK);
    assert_string_equal(buf, "libfabric/tcp;ofi_rxm/0x21");
    assert_int_equal(cx_choice_parse(buf, &d), CX_OK);
    assert_string_equal(d.backend, "libfabric");
    assert_string_equal(d.variant, "tcp;ofi_rxm");
    assert_int_equal(d.caps, 0x21);
    assert_int_equal(cx_choice_parse("ucx//0x3", &d), CX_OK);
    assert_string_equal(d.variant, "");
    assert_int_equal(cx_choice_format(&c, buf, 8), CX_EINVAL);
    const char *bad[] = { "",       "ucx",    "ucx/",      "ucx//",        "ucx//0x",
                          "ucx//3", "/x/0x1", "ucx//0x1g", "ucx//0x10000", "averyveryverylongbackendname//0x1",
                          NULL };
    for (int i = 0; bad[i]; i++) {
        if (cx_choice_parse(bad[i], &d) != CX_EINVAL) {
            print_error("accepted '%s'\n", bad[i]);
            fail();
        }
    }
    assert_int_equal(cx_choice_parse(NULL, &d), CX_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(heterogeneous_pairs),
        cmocka_unit_test(symmetric_everywhere),
        cmocka_unit_test(nothing_in_common),
        cmocka_unit_test(advertisement_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
