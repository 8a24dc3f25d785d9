/* NIC per GPU on synthetic sysfs trees of real layouts (fixtures/NAME.layout). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "connex/connex.h"
#include "fixture.h"
#include "synth.h"

static cx_probe_t P;
static cx_decision_t D;

typedef struct {
    char dir[256];
} fx_t;

static int fx_setup(void **state, const char *layout)
{
    fx_t *f = calloc(1, sizeof *f);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", CX_FIXTURES, layout);
    if (!f || cx_fixture_make(path, f->dir, sizeof f->dir)) {
        free(f);
        return -1;
    }
    *state = f;
    memset(&P, 0, sizeof P);
    return cx_probe_sysfs(&P, f->dir) == CX_OK ? 0 : -1;
}
static int dgx_setup(void **s)
{
    return fx_setup(s, "dgx-h100-8gpu-8nic.layout");
}
static int hgx_setup(void **s)
{
    return fx_setup(s, "hgx-8gpu-4nic.layout");
}
static int p4d_setup(void **s)
{
    return fx_setup(s, "p4d-24xlarge-efa.layout");
}
static int roce_setup(void **s)
{
    return fx_setup(s, "roce-2gpu-1nic.layout");
}
static int fx_teardown(void **state)
{
    fx_t *f = *state;
    int rc = cx_fixture_remove(f->dir);
    free(f);
    return rc;
}

static const char *nic_of(int g)
{
    return D.nic_of_gpu[g] >= 0 ? P.rdma[D.nic_of_gpu[g]].name : "-";
}

static void map(unsigned caps, const char *override, int want_rc)
{
    memset(&D, 0, sizeof D);
    for (int i = 0; i < CX_SEL_MAX_GPU; i++) D.nic_of_gpu[i] = -1;
    assert_int_equal(cx_select_nics(&P, caps, override, &D), want_rc);
}

static void dgx_sysfs(void **s)
{
    (void)s;
    assert_int_equal(P.n_gpu, 8);
    assert_int_equal(P.n_rdma, 12);
    assert_int_equal(P.peermem, 1);
    assert_string_equal(P.rdma[0].name, "mlx5_0"); /* version order: mlx5_10 after mlx5_9 */
    assert_string_equal(P.rdma[10].name, "mlx5_10");
    assert_string_equal(P.rdma[0].driver, "mlx5_core");
    assert_string_equal(P.rdma[0].pci.bdf, "0000:18:00.0");
    assert_int_equal(P.rdma[0].link, CX_LINK_IB);
    assert_int_equal(P.rdma[0].active_port, 1);
    assert_int_equal(P.rdma[0].pci.depth, 5);
    assert_string_equal(P.rdma[0].pci.chain[0], "pci0000:15");
    assert_int_equal(P.rdma[1].link, CX_LINK_ETH); /* mlx5_1: storage, RoCE */
    assert_int_equal(P.rdma[8].active_port, 0);    /* mlx5_8: port down */
    assert_string_equal(P.gpu[0].pci.bdf, "0000:1b:00.0");
    assert_int_equal(P.gpu[7].pci.numa, 1);
}

static void dgx_one_nic_per_gpu(void **s)
{
    (void)s;
    map(CX_CAP_IB, NULL, CX_OK);
    const char *want[8] = { "mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11" };
    for (int g = 0; g < 8; g++) assert_string_equal(nic_of(g), want[g]);
    assert_string_equal(D.net_devices, "mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,mlx5_10:1,mlx5_11:1");
    assert_non_null(strstr(D.reasons, "nic: GPU0 0000:1b:00.0 -> mlx5_0 (same PCIe switch)"));
    /* RoCE-eligible too: the storage NICs sit on other root complexes and stay unused */
    map(CX_CAP_IB | CX_CAP_ROCE, NULL, CX_OK);
    for (int g = 0; g < 8; g++) assert_string_equal(nic_of(g), want[g]);
}

static void dgx_restricted(void **s)
{
    (void)s;
    map(CX_CAP_IB, "mlx5_0,mlx5_3", CX_OK);
    int n0 = 0, n3 = 0;
    for (int g = 0; g < 8; g++) {
        n0 += !strcmp(nic_of(g), "mlx5_0");
        n3 += !strcmp(nic_of(g), "mlx5_3");
    }
    assert_string_equal(nic_of(0), "mlx5_0");
    assert_string_equal(nic_of(1), "mlx5_3");
    assert_int_equal(n0, 4); /* the far GPUs are spread, not piled on one NIC */
    assert_int_equal(n3, 4);
    assert_string_equal(D.net_devices, "mlx5_0:1,mlx5_3:1");
    assert_non_null(strstr(D.reasons, "(other NUMA node)"));
}

static void dgx_pinned(void **s)
{
    (void)s;
    map(CX_CAP_IB, "gpu0=mlx5_11, 1=mlx5_0:1", CX_OK);
    assert_string_equal(nic_of(0), "mlx5_11");
    assert_string_equal(nic_of(1), "mlx5_0");
    assert_string_equal(nic_of(2), "mlx5_4");
    assert_non_null(strstr(D.reasons, "-> mlx5_11 (pinned by CONNEX_NET_DEVICES)"));
}

static void dgx_bad_overrides(void **s)
{
    (void)s;
    map(CX_CAP_IB, "mlx5_99", CX_EINVAL);
    assert_non_null(strstr(D.error, "no RDMA device 'mlx5_99' (have: mlx5_0,mlx5_1,"));
    map(CX_CAP_IB, "gpu9=mlx5_0", CX_EINVAL);
    assert_non_null(strstr(D.error, "gpu9, but 8 GPU(s) found"));
    map(CX_CAP_IB, "gpux=mlx5_0", CX_EINVAL);
    assert_non_null(strstr(D.error, "not a GPU index"));
    map(CX_CAP_IB, "mlx5_0:2", CX_EINVAL);
    assert_non_null(strstr(D.error, "port 2 is not its active port"));
    map(CX_CAP_IB, "mlx5_0:x", CX_EINVAL);
    map(CX_CAP_IB | CX_CAP_ROCE, "mlx5_8", CX_EINVAL);
    assert_non_null(strstr(D.error, "mlx5_8 has no active port"));
    map(CX_CAP_IB, "mlx5_1", CX_EINVAL); /* RoCE NIC, IB backend */
}

static void dgx_full_decision(void **s)
{
    (void)s;
    /* the sysfs tree plus what UCX and the build would say on such a host */
    synth_built(&P, "ucx,libfabric,zmq");
    P.ucx.probed = P.ucx.loaded = 1;
    P.ucx_caps = CX_CAP_TCP | CX_CAP_SHM | CX_CAP_IB | CX_CAP_ROCE;
    P.ucx_cuda = 1;
    P.fi_tcp = 1;
    cx_select_opts_t o = { 0 };
    assert_int_equal(cx_select_decide_opts(&P, &o, &D), CX_OK);
    assert_string_equal(D.be[0].backend, "ucx");
    assert_int_equal(D.gpudirect, 1);
    assert_string_equal(nic_of(5), "mlx5_9");
    o.net_devices = "mlx5_42";
    assert_int_equal(cx_select_decide_opts(&P, &o, &D), CX_EINVAL);
    assert_int_equal(D.n, 0);
    assert_non_null(strstr(D.reasons, "error: CONNEX_NET_DEVICES: no RDMA device 'mlx5_42'"));
}

static void hgx_two_gpus_per_nic(void **s)
{
    (void)s;
    assert_int_equal(P.n_gpu, 8);
    assert_int_equal(P.n_rdma, 4);
    assert_int_equal(P.peermem, 0);
    map(CX_CAP_IB, NULL, CX_OK);
    for (int g = 0; g < 8; g++) {
        char want[16];
        snprintf(want, sizeof want, "mlx5_%d", g / 2);
        assert_string_equal(nic_of(g), want);
    }
    /* a NIC whose port is down: its GPUs go to the NIC on the same NUMA node */
    P.rdma[0].active_port = 0;
    map(CX_CAP_IB, NULL, CX_OK);
    assert_string_equal(nic_of(0), "mlx5_1");
    assert_string_equal(nic_of(1), "mlx5_1");
    assert_non_null(strstr(D.reasons, "(same NUMA node)"));
    assert_string_equal(D.net_devices, "mlx5_1:1,mlx5_2:1,mlx5_3:1");
}

static void p4d_efa(void **s)
{
    (void)s;
    assert_int_equal(P.n_rdma, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(P.rdma[i].link, CX_LINK_EFA);
        assert_string_equal(P.rdma[i].driver, "efa");
    }
    assert_string_equal(P.rdma[0].name, "rdmap16s27");
    map(CX_CAP_EFA, NULL, CX_OK);
    const char *want[8] = { "rdmap16s27",  "rdmap16s27",  "rdmap32s27",  "rdmap32s27",
                            "rdmap144s27", "rdmap144s27", "rdmap160s27", "rdmap160s27" };
    for (int g = 0; g < 8; g++) assert_string_equal(nic_of(g), want[g]);
    /* IB-eligible only: EFA NICs are not candidates */
    map(CX_CAP_IB | CX_CAP_ROCE, NULL, CX_OK);
    assert_string_equal(nic_of(0), "-");
    assert_non_null(strstr(D.reasons, "nic: no eligible RDMA NIC"));

    /* the full decision on such a host: libfabric/efa, FI_HMEM, GDR */
    synth_built(&P, "ucx,libfabric,zmq");
    P.fabric.probed = P.fabric.loaded = 1;
    P.fi_efa = P.fi_efa_hmem = P.fi_tcp = 1;
    snprintf(P.fi_providers, sizeof P.fi_providers, "efa,tcp;ofi_rxm,shm");
    P.peermem = 1;
    assert_int_equal(cx_select_decide(&P, NULL, &D), CX_OK);
    assert_string_equal(D.be[0].backend, "libfabric");
    assert_string_equal(D.be[0].variant, "efa");
    assert_int_equal(D.gpudirect, 1);
    assert_string_equal(D.net_devices, "rdmap16s27:1,rdmap32s27:1,rdmap144s27:1,rdmap160s27:1");
}

static void roce_root_complex(void **s)
{
    (void)s;
    map(CX_CAP_ROCE, NULL, CX_OK);
    assert_string_equal(nic_of(0), "mlx5_0");
    assert_string_equal(nic_of(1), "mlx5_0");
    assert_non_null(strstr(D.reasons, "(same root complex)"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(dgx_sysfs, dgx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(dgx_one_nic_per_gpu, dgx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(dgx_restricted, dgx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(dgx_pinned, dgx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(dgx_bad_overrides, dgx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(dgx_full_decision, dgx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(hgx_two_gpus_per_nic, hgx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(p4d_efa, p4d_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(roce_root_complex, roce_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
