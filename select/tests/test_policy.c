/* The policy on synthetic probes: every host type, the overrides, and the failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "connex/connex.h"
#include "synth.h"

static cx_probe_t P;
static cx_decision_t D;

static void assert_order(const cx_decision_t *d, const char *a, const char *b, const char *c)
{
    const char *want[3] = { a, b, c };
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (want[i]) n++;
    assert_int_equal(d->n, n);
    for (int i = 0; i < n; i++) {
        assert_string_equal(d->be[i].backend, want[i]);
        assert_ptr_equal(d->backends[i], d->be[i].backend);
    }
}

static void assert_reason(const cx_decision_t *d, const char *needle)
{
    if (!strstr(d->reasons, needle)) {
        print_error("reason '%s' missing in:\n%s", needle, d->reasons);
        fail();
    }
}

static void ib_gpu_peermem(void **s)
{
    (void)s;
    synth_host(&P, H_IB_GPU_PEERMEM);
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_order(&D, "ucx", "libfabric", "zmq");
    assert_true(D.be[0].caps & CX_CAP_IB);
    assert_true(D.be[0].caps & CX_CAP_GDR);
    assert_string_equal(D.be[1].variant, "tcp;ofi_rxm");
    assert_int_equal(D.gpudirect, 1);
    assert_string_equal(D.same_host, "ucx");
    assert_string_equal(D.net_devices, "mlx5_0:1"); /* mlx5_1's port is down */
    assert_int_equal(D.nic_of_gpu[0], 0);
    assert_reason(&D, "rule rdma: active port(s) mlx5_0:1 (InfiniBand) -> ucx");
    assert_reason(&D, "gpudirect: on: ucx");
    assert_reason(&D, "nvidia_peermem");
    assert_string_equal(D.error, "");
}

static void ib_with_libfabric_verbs_too(void **s)
{
    (void)s;
    synth_host(&P, H_IB_GPU_PEERMEM);
    P.fi_verbs = 1;
    snprintf(P.fi_providers, sizeof P.fi_providers, "verbs;ofi_rxm,tcp;ofi_rxm,shm");
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    /* UCX drives the RDMA ports; libfabric stays the fast TCP path for non-RDMA peers */
    assert_order(&D, "ucx", "libfabric", "zmq");
    assert_string_equal(D.be[1].variant, "tcp;ofi_rxm");
}

static void ib_ucx_without_cuda(void **s)
{
    (void)s;
    synth_host(&P, H_IB_GPU_PEERMEM);
    P.ucx_cuda = 0;
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_string_equal(D.be[0].backend, "ucx");
    assert_int_equal(D.gpudirect, 0);
    assert_false(D.be[0].caps & CX_CAP_GDR);
    assert_reason(&D, "UCX has no cuda_copy transport");
}

static void ib_no_peermem_but_dmabuf(void **s)
{
    (void)s;
    synth_host(&P, H_IB_GPU_PEERMEM);
    P.peermem = 0;
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_int_equal(D.gpudirect, 0);
    assert_reason(&D, "neither nvidia_peermem loaded nor dma-buf");
    P.gpu[0].dmabuf_attr = 1;
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_int_equal(D.gpudirect, 1);
    assert_reason(&D, "dma-buf");
}

static void roce(void **s)
{
    (void)s;
    synth_host(&P, H_ROCE);
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_order(&D, "ucx", "libfabric", "zmq");
    assert_true(D.be[0].caps & CX_CAP_ROCE);
    assert_false(D.be[0].caps & CX_CAP_IB);
    assert_reason(&D, "(RoCE) -> ucx (rc/dc, RoCE)");
    assert_reason(&D, "gpudirect: off: no GPU");
    assert_string_equal(D.net_devices, "mlx5_0:1");
}

static void efa_with_hmem(void **s)
{
    (void)s;
    synth_host(&P, H_EFA_HMEM);
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_order(&D, "libfabric", "ucx", "zmq");
    assert_string_equal(D.be[0].variant, "efa");
    assert_true(D.be[0].caps & CX_CAP_EFA);
    assert_false(D.be[1].caps & CX_CAP_RDMA); /* UCX does not drive EFA */
    assert_int_equal(D.gpudirect, 1);
    assert_string_equal(D.net_devices, "rdmap16s27:1");
    assert_reason(&D, "rule efa: active EFA device(s) rdmap16s27:1 (EFA)");
    assert_reason(&D, "libfabric runs efa only (one provider per instance): TCP peers use ucx");
}

static void efa_without_hmem(void **s)
{
    (void)s;
    synth_host(&P, H_EFA_NOHMEM);
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_string_equal(D.be[0].variant, "efa");
    assert_int_equal(D.gpudirect, 0);
    assert_reason(&D, "lacks FI_HMEM");
    assert_reason(&D, "staged through pinned host memory");
}

static void efa_nic_without_provider(void **s)
{
    (void)s;
    synth_host(&P, H_EFA_HMEM);
    P.fi_efa = 0;
    snprintf(P.fi_providers, sizeof P.fi_providers, "tcp;ofi_rxm,shm");
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_order(&D, "libfabric", "ucx", "zmq");
    assert_string_equal(D.be[0].variant, "tcp;ofi_rxm");
    assert_reason(&D, "libfabric lists no efa provider");
    assert_int_equal(D.gpudirect, 0);
}

static void tcp_only(void **s)
{
    (void)s;
    synth_host(&P, H_TCP);
    assert_int_equal(cx_select_decide(&P, "auto", &D), CX_OK);
    assert_order(&D, "libfabric", "ucx", "zmq");
    assert_string_equal(D.be[0].variant, "tcp;ofi_rxm");
    assert_int_equal(D.gpudirect, 0);
    assert_string_equal(D.net_devices, "");
    assert_reason(&D, "rule tcp: libfabric is the fastest TCP path measured (3.6 GB/s");
    assert_reason(&D, "rule same-host: libfabric/tcp;ofi_rxm, the fastest opened path measured");
    assert_string_equal(D.same_host, "libfabric");
}

static void tcp_only_zmq_only(void **s)
{
    (void)s;
    synth_host(&P, H_TCP);
    synth_built(&P, "zmq");
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_order(&D, "zmq", NULL, NULL);
    assert_string_equal(D.same_host, "");
    assert_reason(&D, "rule tcp: zmq");
}

static void no_backends_built(void **s)
{
    (void)s;
    synth_host(&P, H_NO_BACKENDS);
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_EUNSUPPORTED);
    assert_int_equal(D.n, 0);
    assert_string_equal(D.error, "no usable backend (built: none)");
    assert_reason(&D, "error: no usable backend");
}

static void forced_unavailable(void **s)
{
    (void)s;
    synth_host(&P, H_IB_GPU_PEERMEM);
    synth_built(&P, "zmq");
    assert_int_equal(cx_select_decide(&P, "ucx", &D), CX_EUNSUPPORTED);
    assert_int_equal(D.n, 0);
    assert_non_null(strstr(D.error, "the ucx backend is not built"));
    assert_non_null(strstr(D.error, "built: zmq"));
    assert_non_null(strstr(D.error, "libucx-dev"));

    /* built, but the runtime has no usable provider: an error, not a quiet fall back to zmq */
    synth_host(&P, H_TCP);
    P.fi_tcp = 0;
    P.fi_shm = 0;
    P.fi_providers[0] = 0;
    assert_int_equal(cx_select_decide(&P, "libfabric", &D), CX_EUNSUPPORTED);
    assert_non_null(strstr(D.error, "no usable RDM provider"));

    synth_host(&P, H_TCP);
    P.ucx.loaded = 0;
    snprintf(P.ucx.note, sizeof P.ucx.note, "libuct.so.0 not loadable: no such file");
    assert_int_equal(cx_select_decide(&P, "ucx", &D), CX_EUNSUPPORTED);
    assert_string_equal(D.error, "CONNEX_BACKEND=ucx: libuct.so.0 not loadable: no such file");

    assert_int_equal(cx_select_decide(&P, "verbs", &D), CX_EINVAL);
    assert_non_null(strstr(D.error, "CONNEX_BACKEND=verbs not understood"));
}

static void forced_available(void **s)
{
    (void)s;
    synth_host(&P, H_IB_GPU_PEERMEM);
    assert_int_equal(cx_select_decide(&P, "zmq", &D), CX_OK);
    assert_order(&D, "zmq", NULL, NULL);
    assert_int_equal(D.gpudirect, 0);
    assert_reason(&D, "forced: CONNEX_BACKEND=zmq");
    assert_reason(&D, "no RDMA path");

    assert_int_equal(cx_select_decide(&P, "libfabric", &D), CX_OK);
    assert_order(&D, "libfabric", NULL, NULL);
    assert_string_equal(D.be[0].variant, "tcp;ofi_rxm");

    synth_host(&P, H_EFA_HMEM);
    assert_int_equal(cx_select_decide(&P, "libfabric", &D), CX_OK);
    assert_string_equal(D.be[0].variant, "efa");
    assert_int_equal(D.gpudirect, 1);
}

static void gdr_override(void **s)
{
    (void)s;
    cx_select_opts_t o = { 0 };
    synth_host(&P, H_IB_GPU_PEERMEM);
    o.gdr = "0";
    assert_int_equal(cx_select_decide_opts(&P, &o, &D), CX_OK);
    assert_int_equal(D.gpudirect, 0);
    assert_reason(&D, "gpudirect: off (CONNEX_GDR=0)");
    o.gdr = "1";
    assert_int_equal(cx_select_decide_opts(&P, &o, &D), CX_OK);
    assert_int_equal(D.gpudirect, 1);
    o.gdr = "yes";
    assert_int_equal(cx_select_decide_opts(&P, &o, &D), CX_EINVAL);
    assert_non_null(strstr(D.error, "CONNEX_GDR=yes not understood"));

    synth_host(&P, H_TCP);
    synth_gpu(&P, "0000:01:00.0");
    o.gdr = "1";
    assert_int_equal(cx_select_decide_opts(&P, &o, &D), CX_EUNSUPPORTED);
    assert_non_null(strstr(D.error, "CONNEX_GDR=1 but GPUDirect cannot work"));
    assert_int_equal(D.n, 0);
}

static void fi_provider_override(void **s)
{
    (void)s;
    cx_select_opts_t o = { 0 };
    synth_host(&P, H_TCP);
    o.fi_provider = "efa";
    assert_int_equal(cx_select_decide_opts(&P, &o, &D), CX_EUNSUPPORTED);
    assert_non_null(strstr(D.error, "CONNEX_FI_PROVIDER=efa"));
    assert_non_null(strstr(D.error, "tcp;ofi_rxm,shm"));
    o.fi_provider = "shm";
    assert_int_equal(cx_select_decide_opts(&P, &o, &D), CX_OK);
    assert_string_equal(D.be[0].backend, "ucx"); /* libfabric/shm cannot reach other hosts */
    assert_int_equal(D.n, 3);
    assert_reason(&D, "provider shm forced");
}

static void ib_without_verbs_provider(void **s)
{
    (void)s;
    synth_host(&P, H_IB_GPU_PEERMEM);
    P.rdma[0].verbs_ok = 0;
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_order(&D, "libfabric", "ucx", "zmq");
    assert_reason(&D, "mlx5_0 has an active port but no ibverbs provider");
}

static void ib_ucx_without_ib_transports(void **s)
{
    (void)s;
    synth_host(&P, H_IB_GPU_PEERMEM);
    P.ucx_caps &= ~(unsigned)CX_CAP_IB;
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_false(D.be[0].caps & CX_CAP_RDMA);
    assert_reason(&D, "UCX lists no rc/dc/ud transport");
    assert_reason(&D, "no built backend reaches them");

    /* libfabric verbs steps in where UCX cannot */
    P.fi_verbs = 1;
    snprintf(P.fi_providers, sizeof P.fi_providers, "verbs;ofi_rxm,tcp;ofi_rxm,shm");
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_string_equal(D.be[0].backend, "libfabric");
    assert_string_equal(D.be[0].variant, "verbs;ofi_rxm");
    assert_reason(&D, "-> libfabric/verbs;ofi_rxm");
}

static void deterministic(void **s)
{
    (void)s;
    static cx_decision_t d2;
    for (int t = 0; t < H_COUNT; t++) {
        synth_host(&P, t);
        int a = cx_select_decide(&P, NULL, &D);
        int b = cx_select_decide(&P, NULL, &d2);
        assert_int_equal(a, b);
        assert_int_equal(D.n, d2.n);
        assert_string_equal(D.reasons, d2.reasons);
        assert_int_equal(memcmp(D.be, d2.be, sizeof D.be), 0);
    }
    assert_int_equal(cx_select_decide(NULL, NULL, &D), CX_EINVAL);
    assert_int_equal(cx_select_decide(&P, NULL, NULL), CX_EINVAL);
}

static void opts_from_env(void **s)
{
    (void)s;
    cx_select_opts_t o;
    unsetenv("CONNEX_BACKEND");
    setenv("CONNEX_NET_DEVICES", "mlx5_0", 1);
    cx_select_opts_from_env(&o, "zmq");
    assert_string_equal(o.backend, "zmq");
    assert_string_equal(o.net_devices, "mlx5_0");
    setenv("CONNEX_BACKEND", "ucx", 1);
    cx_select_opts_from_env(&o, "zmq");
    assert_string_equal(o.backend, "ucx"); /* the environment wins over the config */
    unsetenv("CONNEX_BACKEND");
    unsetenv("CONNEX_NET_DEVICES");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ib_gpu_peermem),
        cmocka_unit_test(ib_with_libfabric_verbs_too),
        cmocka_unit_test(ib_ucx_without_cuda),
        cmocka_unit_test(ib_no_peermem_but_dmabuf),
        cmocka_unit_test(roce),
        cmocka_unit_test(efa_with_hmem),
        cmocka_unit_test(efa_without_hmem),
        cmocka_unit_test(efa_nic_without_provider),
        cmocka_unit_test(tcp_only),
        cmocka_unit_test(tcp_only_zmq_only),
        cmocka_unit_test(no_backends_built),
        cmocka_unit_test(forced_unavailable),
        cmocka_unit_test(forced_available),
        cmocka_unit_test(gdr_override),
        cmocka_unit_test(fi_provider_override),
        cmocka_unit_test(ib_without_verbs_provider),
        cmocka_unit_test(ib_ucx_without_ib_transports),
        cmocka_unit_test(deterministic),
        cmocka_unit_test(opts_from_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
