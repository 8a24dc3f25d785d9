/* The plan on synthetic sysfs trees of real host types (fixtures/NAME.layout), with the library
 * findings such a host has: what each backend's open is given (provider, domain, devices,
 * GPUDirect and what it rests on), and which path a mixed pair of hosts agrees on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "connex/connex.h"
#include "fixture.h"
#include "synth.h"

enum { HOST_EFA, HOST_IB, HOST_ROCE, HOST_TCP };

/* The sysfs part from the fixture, the library part as such a host reports it. */
static void host(cx_probe_t *p, int kind)
{
    static const char *const layout[] = { "p4d-24xlarge-efa.layout", "dgx-h100-8gpu-8nic.layout",
                                          "roce-2gpu-1nic.layout", "tcp-only-2gpu.layout" };
    char path[512], dir[256];
    snprintf(path, sizeof path, "%s/%s", CX_FIXTURES, layout[kind]);
    assert_int_equal(cx_fixture_make(path, dir, sizeof dir), 0);
    memset(p, 0, sizeof *p);
    assert_int_equal(cx_probe_sysfs(p, dir), CX_OK);
    assert_int_equal(cx_fixture_remove(dir), 0);
    snprintf(p->host_id, sizeof p->host_id, "fixture-%d", kind);
    synth_built(p, "ucx,libfabric,zmq");
    cx_probe_lib_t *libs[] = { &p->verbs, &p->fabric, &p->ucx, &p->cuda };
    for (int i = 0; i < 4; i++) libs[i]->probed = libs[i]->loaded = 1;
    for (int i = 0; i < p->n_rdma; i++) p->rdma[i].verbs_ok = 1;
    snprintf(p->fi_providers, sizeof p->fi_providers, "tcp;ofi_rxm,shm");
    p->fi_tcp = p->fi_shm = 1;
    p->ucx_caps = CX_CAP_TCP | CX_CAP_SHM;
    for (int g = 0; g < p->n_gpu; g++) p->gpu[g].gdr_attr = 1;
    switch (kind) {
    case HOST_EFA: /* AWS libfabric, built with CUDA: efa with FI_HMEM */
        snprintf(p->fi_providers, sizeof p->fi_providers, "efa,tcp;ofi_rxm,shm");
        p->fi_efa = p->fi_efa_hmem = 1;
        break;
    case HOST_IB: /* MLNX UCX with CUDA: rc/dc/ud on the mlx5 ports */
        p->ucx_caps |= CX_CAP_IB | CX_CAP_ROCE;
        p->ucx_cuda = 1;
        break;
    case HOST_ROCE: /* no peermem, but the GPUs take dma-buf */
        p->ucx_caps |= CX_CAP_ROCE;
        p->ucx_cuda = 1;
        for (int g = 0; g < p->n_gpu; g++) p->gpu[g].dmabuf_attr = 1;
        break;
    default: break;
    }
}

static cx_probe_t P;
static cx_decision_t D;

static const cx_plan_be_t *plan_of(const char *backend)
{
    for (int i = 0; i < D.n; i++)
        if (!strcmp(D.be[i].backend, backend)) return &D.plan[i];
    print_error("no %s in the plan\n", backend);
    fail();
    return NULL;
}

static void decide(int kind, const char *net_devices)
{
    host(&P, kind);
    cx_select_opts_t o = { .net_devices = net_devices };
    assert_int_equal(cx_select_decide_opts(&P, &o, &D), CX_OK);
}

/* p4d: libfabric opens efa on GPU 0's EFA with FI_HMEM; UCX gets no RDMA device. */
static void efa_host(void **s)
{
    (void)s;
    decide(HOST_EFA, NULL);
    assert_int_equal(P.n_gpu, 8);
    assert_string_equal(D.be[0].backend, "libfabric");
    const cx_plan_be_t *f = plan_of("libfabric");
    assert_string_equal(f->provider, "efa");
    assert_string_equal(f->domain, "rdmap16s27-rdm");
    assert_int_equal(f->gpudirect, 1);
    assert_string_equal(f->gpudirect_via, "FI_HMEM (FI_HMEM_CUDA), nvidia_peermem");
    assert_string_equal(f->transports, "efa");
    const cx_plan_be_t *u = plan_of("ucx");
    assert_string_equal(u->devices, "");
    assert_int_equal(u->gpudirect, 0);
    assert_string_equal(u->gpudirect_via, "no RDMA path");
    /* the EFA of each GPU: two GPUs per PCIe switch with one EFA */
    assert_string_equal(P.rdma[D.nic_of_gpu[3]].name, "rdmap32s27");
    assert_string_equal(P.rdma[D.nic_of_gpu[7]].name, "rdmap160s27");
    char buf[4096];
    cx_select_report_plan(&P, &D, CX_OK, buf, sizeof buf);
    /* rails: every EFA, GPU 0's first; each GPU's own EFA for its memory */
    assert_string_equal(f->domains, "rdmap16s27-rdm,rdmap32s27-rdm,rdmap144s27-rdm,rdmap160s27-rdm");
    assert_string_equal(f->gpu_domains,
                        "0=rdmap16s27-rdm;1=rdmap16s27-rdm;2=rdmap32s27-rdm;3=rdmap32s27-rdm;"
                        "4=rdmap144s27-rdm;5=rdmap144s27-rdm;6=rdmap160s27-rdm;7=rdmap160s27-rdm");
    assert_non_null(strstr(buf,
                           "libfabric: provider efa, domain rdmap16s27-rdm, rails rdmap16s27-rdm,rdmap32s27-rdm,"
                           "rdmap144s27-rdm,rdmap160s27-rdm, over efa"));
    assert_non_null(strstr(buf, "cuda memory: GPUDirect (FI_HMEM (FI_HMEM_CUDA), nvidia_peermem)"));
    assert_non_null(strstr(buf, "gpu7 -> rdmap160s27"));
}

/* DGX: UCX first on the eight compute NICs (one per GPU, not the storage NICs); libfabric is
 * the TCP path; GPUDirect through the CUDA memory type. */
static void ib_host(void **s)
{
    (void)s;
    decide(HOST_IB, NULL);
    assert_string_equal(D.be[0].backend, "ucx");
    const cx_plan_be_t *u = plan_of("ucx");
    assert_string_equal(u->devices,
                        "mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,"
                        "mlx5_10:1,mlx5_11:1");
    assert_int_equal(u->devices_exact, 0);
    assert_int_equal(u->gpudirect, 1);
    assert_string_equal(u->gpudirect_via, "UCX CUDA memory type, nvidia_peermem");
    const cx_plan_be_t *f = plan_of("libfabric");
    assert_string_equal(f->provider, "tcp;ofi_rxm");
    assert_string_equal(f->domain, "");
    assert_int_equal(f->gpudirect, 0);
    /* gpu0=NIC pins are turned into device names before UCX sees them */
    decide(HOST_IB, "gpu0=mlx5_9,gpu1=mlx5_10");
    u = plan_of("ucx");
    assert_null(strchr(u->devices, '='));
    assert_non_null(strstr(u->devices, "mlx5_9:1"));
    assert_non_null(strstr(u->devices, "mlx5_10:1"));
    assert_string_equal(P.rdma[D.nic_of_gpu[0]].name, "mlx5_9");
    /* a plain list is the user's: as given */
    decide(HOST_IB, "mlx5_0:1,mlx5_1:1");
    u = plan_of("ucx");
    assert_string_equal(u->devices, "mlx5_0:1,mlx5_1:1");
    assert_int_equal(u->devices_exact, 1);
}

/* DGX with libfabric forced: verbs over the eight compute NICs as rails (not the storage
 * NICs), each GPU on its own NIC. */
static void ib_host_libfabric_rails(void **s)
{
    (void)s;
    host(&P, HOST_IB);
    snprintf(P.fi_providers, sizeof P.fi_providers, "verbs;ofi_rxm,tcp;ofi_rxm,shm");
    P.fi_verbs = P.fi_verbs_hmem = 1; /* rdma-core's libfabric, built with CUDA */
    cx_select_opts_t o = { .backend = "libfabric" };
    assert_int_equal(cx_select_decide_opts(&P, &o, &D), CX_OK);
    const cx_plan_be_t *f = plan_of("libfabric");
    assert_string_equal(f->provider, "verbs;ofi_rxm");
    assert_string_equal(f->domain, "mlx5_0");
    assert_string_equal(f->domains, "mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11");
    for (int g = 0; g < 8; g++) {
        char want[32];
        snprintf(want, sizeof want, "%d=%s", g, P.rdma[D.nic_of_gpu[g]].name);
        assert_non_null(strstr(f->gpu_domains, want));
    }
    assert_non_null(strstr(f->gpu_domains, "0=mlx5_0;"));
    assert_null(strstr(f->domains, "mlx5_1,"));
}

/* RoCE workstation: UCX on the one port, GPUDirect by dma-buf (no peermem module). */
static void roce_host(void **s)
{
    (void)s;
    decide(HOST_ROCE, NULL);
    assert_string_equal(D.be[0].backend, "ucx");
    const cx_plan_be_t *u = plan_of("ucx");
    assert_string_equal(u->devices, "mlx5_0:1");
    assert_string_equal(u->transports, "rc,dc,ud (roce),tcp,cma,posix");
    assert_int_equal(u->gpudirect, 1);
    assert_string_equal(u->gpudirect_via, "UCX CUDA memory type, dma-buf");
}

/* No RDMA device: every backend on TCP, GPU memory staged, no device handed to anyone. */
static void tcp_host(void **s)
{
    (void)s;
    decide(HOST_TCP, NULL);
    assert_int_equal(P.n_gpu, 2);
    assert_int_equal(D.gpudirect, 0);
    for (int i = 0; i < D.n; i++) {
        assert_string_equal(D.plan[i].devices, "");
        assert_string_equal(D.plan[i].domain, "");
        assert_int_equal(D.plan[i].gpudirect, 0);
    }
    assert_string_equal(plan_of("libfabric")->provider, "tcp;ofi_rxm");
    assert_string_equal(D.same_host, "libfabric");
}

/* What a pair agrees on, computed from both ends' advertisements. */
static const char *pair(int a, int b, char *why, size_t len)
{
    cx_decision_t A, B;
    host(&P, a);
    assert_int_equal(cx_select_decide(&P, NULL, &A), CX_OK);
    host(&P, b);
    assert_int_equal(cx_select_decide(&P, NULL, &B), CX_OK);
    int oa[CX_SEL_MAX_BE], ob[CX_SEL_MAX_BE];
    int na = cx_select_pair(A.be, A.n, B.be, B.n, 0, oa, why, len);
    assert_int_equal(cx_select_pair(B.be, B.n, A.be, A.n, 0, ob, NULL, 0), na);
    assert_true(na > 0);
    assert_string_equal(A.be[oa[0]].backend, B.be[ob[0]].backend);
    static char out[16];
    snprintf(out, sizeof out, "%s", A.be[oa[0]].backend);
    return out;
}

static void mixed_pairs(void **s)
{
    (void)s;
    char why[512];
    /* EFA and InfiniBand share no fabric: TCP, the fastest TCP path both opened */
    assert_string_equal(pair(HOST_EFA, HOST_IB, why, sizeof why), "ucx");
    assert_non_null(strstr(why, "ucx tcp"));
    assert_non_null(strstr(why, "libfabric: not shared"));
    /* two InfiniBand hosts: verbs (UCX rc/dc) */
    assert_string_equal(pair(HOST_IB, HOST_IB, why, sizeof why), "ucx");
    assert_non_null(strstr(why, "ucx rdma (ib)"));
    /* two EFA hosts: libfabric efa */
    assert_string_equal(pair(HOST_EFA, HOST_EFA, why, sizeof why), "libfabric");
    assert_non_null(strstr(why, "libfabric rdma (efa)"));
    /* an IB host with a TCP-only one: libfabric tcp */
    assert_string_equal(pair(HOST_IB, HOST_TCP, why, sizeof why), "libfabric");
    assert_non_null(strstr(why, "libfabric tcp"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(efa_host),  cmocka_unit_test(ib_host),  cmocka_unit_test(ib_host_libfabric_rails),
        cmocka_unit_test(roce_host), cmocka_unit_test(tcp_host), cmocka_unit_test(mixed_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
