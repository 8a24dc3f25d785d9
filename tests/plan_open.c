/* The plan reaches the backends: on fixture hosts (CONNEX_SYSFS_ROOT: p4d with EFA, DGX with
 * InfiniBand, a RoCE workstation, a TCP-only VM), an engine's open hands each backend exactly what
 * the selection planned. Seen through the library loader seam: tests/fake_fabric stands in for
 * libfabric.so.1 (LD_LIBRARY_PATH, set by ctest) and logs the hints of each fi_getinfo the
 * backend's open makes (provider, domain, FI_HMEM, FI_MR_HMEM); ucp_config_modify is interposed
 * here and logs what UCX is configured with. Each case runs in a child process, because a process
 * probes its host once. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NOLOAD */
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "cxt.h"
#include "fixture.h"

static char LOG[256];

/* Interposed on libucp's: logs each setting the UCX backend makes, then does it. Exported: the
 * backend looks its UCX functions up in the process's global scope first (backends/ucx/ucx_dl.c),
 * and finds this one there; the real one is in libucp, which the backend loaded RTLD_LOCAL. */
__attribute__((visibility("default"))) ucs_status_t ucp_config_modify(ucp_config_t *config, const char *name,
                                                                      const char *value)
{
    ucs_status_t (*real)(ucp_config_t *, const char *, const char *);
    void *ucp = dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD);
    *(void **)(&real) = ucp ? dlsym(ucp, "ucp_config_modify") : NULL;
    FILE *f = LOG[0] ? fopen(LOG, "a") : NULL;
    if (f) {
        fprintf(f, "ucx %s=%s\n", name, value);
        fclose(f);
    }
    return real ? real(config, name, value) : UCS_ERR_UNSUPPORTED;
}

typedef struct plan_case {
    const char *layout;      /* fixture */
    const char *providers;   /* what the fake libfabric lists */
    const char *net_devices; /* CONNEX_NET_DEVICES, or NULL */
    const char *fi_provider; /* CONNEX_FI_PROVIDER, or NULL */
} plan_case_t;

/* Creates and destroys one engine on the case's host in a child; returns the log's text. */
static char *run_case(const plan_case_t *c)
{
    char fx[256], path[512];
    snprintf(path, sizeof path, "%s/%s", CX_FIXTURES, c->layout);
    assert_int_equal(cx_fixture_make(path, fx, sizeof fx), 0);
    const char *tmp = getenv("TMPDIR");
    snprintf(LOG, sizeof LOG, "%s/cx-plan-open-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int lfd = mkstemp(LOG);
    assert_true(lfd >= 0);
    close(lfd);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("CONNEX_SYSFS_ROOT", fx, 1);
        setenv("CONNEX_PROBE_CUDA", "0", 1);
        setenv("CX_FAKE_FI_PROVIDERS", c->providers, 1);
        setenv("CX_FAKE_FI_LOG", LOG, 1);
        unsetenv("CONNEX_BACKEND");
        if (c->net_devices) setenv("CONNEX_NET_DEVICES", c->net_devices, 1);
        if (c->fi_provider) setenv("CONNEX_FI_PROVIDER", c->fi_provider, 1);
        cx_engine_t *e = NULL;
        int rc = cxt_engine(&e, "plan", 0, 200, 2000, 10000);
        FILE *f = fopen(LOG, "a");
        if (f) {
            fprintf(f, "engine rc=%d backends=%s\n", rc, e ? cx_engine_backends(e) : "");
            fclose(f);
        }
        if (e) cx_engine_destroy(e);
        _exit(rc == CX_OK ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(cx_fixture_remove(fx), 0);
    FILE *f = fopen(LOG, "r");
    assert_non_null(f);
    static char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    unlink(LOG);
    LOG[0] = 0;
    printf("%s: %s", c->layout, text);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return text;
}

static void expect(const char *text, const char *line)
{
    if (strstr(text, line)) return;
    fprintf(stderr, "'%s' not in:\n", line);
    fputs(text, stderr);
    fail();
}

/* The first fi_getinfo of the backend's open: what the plan asked libfabric for. */
static void expect_first_open(const char *text, const char *line)
{
    const char *o = strstr(text, "open ");
    assert_non_null(o);
    size_t n = strcspn(o, "\n");
    if (strlen(line) != n || strncmp(o, line, n)) {
        print_error("first open is '%.*s', expected '%s'\n", (int)n, o, line);
        fail();
    }
}

/* p4d: efa on GPU 0's EFA, FI_HMEM asked (nvidia_peermem, efa grants FI_HMEM); UCX gets no EFA
 * device, only the engine's interface. */
static void test_efa_host(void **state)
{
    (void)state;
    plan_case_t c = { "p4d-24xlarge-efa.layout", "efa+hmem,tcp;ofi_rxm,shm", NULL, NULL };
    const char *t = run_case(&c);
    expect_first_open(t, "open prov=efa domain=rdmap16s27-rdm hmem=1 mr_hmem=1");
    /* multi-rail: every EFA is opened as a rail of its own, GPU 0's first */
    expect(t, "open prov=efa domain=rdmap32s27-rdm hmem=1 mr_hmem=1\n");
    expect(t, "open prov=efa domain=rdmap144s27-rdm hmem=1 mr_hmem=1\n");
    expect(t, "open prov=efa domain=rdmap160s27-rdm hmem=1 mr_hmem=1\n");
    assert_null(strstr(t, "prov=tcp")); /* no fallback to another provider */
    assert_null(strstr(t, "prov=verbs"));
    expect(t, "ucx NET_DEVICES=lo\n");
    expect(t, "engine rc=0 backends=ucx,zmq"); /* the fake opens nothing: the rest runs */
}

/* DGX where UCX has no RDMA transport: libfabric verbs;ofi_rxm on GPU 0's NIC with FI_HMEM; a
 * CONNEX_NET_DEVICES pin moves it, and UCX never sees the gpuN= form. */
static void test_ib_host(void **state)
{
    (void)state;
    plan_case_t c = { "dgx-h100-8gpu-8nic.layout", "verbs;ofi_rxm+hmem,tcp;ofi_rxm,shm", NULL, NULL };
    const char *t = run_case(&c);
    expect_first_open(t, "open prov=verbs;ofi_rxm domain=mlx5_0 hmem=1 mr_hmem=1");
    /* the rails: the eight compute NICs (those nearest a GPU), not the storage ones */
    expect(t, "open prov=verbs;ofi_rxm domain=mlx5_11 hmem=1 mr_hmem=1\n");
    assert_null(strstr(t, "domain=mlx5_1 "));
    assert_null(strstr(t, "domain=mlx5_2 "));
    plan_case_t pin = { "dgx-h100-8gpu-8nic.layout", "verbs;ofi_rxm+hmem,tcp;ofi_rxm,shm", "gpu0=mlx5_9,gpu1=mlx5_10",
                        NULL };
    t = run_case(&pin);
    expect_first_open(t, "open prov=verbs;ofi_rxm domain=mlx5_9 hmem=1 mr_hmem=1");
    assert_null(strstr(t, "NET_DEVICES=gpu"));
    expect(t, "ucx NET_DEVICES=lo\n");
    /* UCX given several NICs stripes its rendezvous over them: as many rails as NICs, up to 4 */
    plan_case_t two = { "dgx-h100-8gpu-8nic.layout", "verbs;ofi_rxm+hmem,tcp;ofi_rxm,shm", "mlx5_0:1,mlx5_3:1", NULL };
    t = run_case(&two);
    expect(t, "ucx NET_DEVICES=mlx5_0:1,mlx5_3:1\n");
    expect(t, "ucx MAX_RNDV_RAILS=2\n");
    plan_case_t six = { "dgx-h100-8gpu-8nic.layout", "verbs;ofi_rxm+hmem,tcp;ofi_rxm,shm",
                        "mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1", NULL };
    t = run_case(&six);
    expect(t, "ucx MAX_RNDV_RAILS=4\n");
    assert_null(strstr(run_case(&c), "MAX_RNDV_RAILS")); /* lo alone: one rail, UCX's default */
}

/* RoCE workstation without peermem or a dma-buf finding: verbs, GPU memory staged (no FI_HMEM). */
static void test_roce_host(void **state)
{
    (void)state;
    plan_case_t c = { "roce-2gpu-1nic.layout", "verbs;ofi_rxm,tcp;ofi_rxm,shm", NULL, NULL };
    const char *t = run_case(&c);
    expect_first_open(t, "open prov=verbs;ofi_rxm domain=mlx5_0 hmem=0 mr_hmem=0");
}

/* TCP only: tcp;ofi_rxm on the provider's own domain, no FI_HMEM; CONNEX_FI_PROVIDER is part of
 * the plan and opened as such. */
static void test_tcp_host(void **state)
{
    (void)state;
    plan_case_t c = { "tcp-only-2gpu.layout", "tcp;ofi_rxm,shm", NULL, NULL };
    const char *t = run_case(&c);
    expect_first_open(t, "open prov=tcp;ofi_rxm domain= hmem=0 mr_hmem=0");
    assert_null(strstr(t, "prov=efa"));
    plan_case_t shm = { "tcp-only-2gpu.layout", "tcp;ofi_rxm,shm", NULL, "shm" };
    t = run_case(&shm);
    expect_first_open(t, "open prov=shm domain= hmem=0 mr_hmem=0");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_efa_host, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_ib_host, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_roce_host, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_tcp_host, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
