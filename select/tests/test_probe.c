/* The real probe never fails for want of a library or driver, and the reports say what it saw. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "connex/backend.h"
#include "connex/connex.h"
#include "fixture.h"
#include "synth.h"

static cx_probe_t P;
static cx_decision_t D;

static void this_host(void **s)
{
    (void)s;
    setenv("CONNEX_PROBE_CUDA", "0", 1); /* keep cuInit out of a unit test */
    assert_int_equal(cx_probe_host(&P, NULL), CX_OK);
    unsetenv("CONNEX_PROBE_CUDA");
    assert_string_equal(P.sysfs_root, "/sys");
    assert_non_null(strchr(P.host_id, '/'));
    for (int i = 0; i < P.n_built; i++)
        assert_true(!strcmp(P.built[i], "ucx") || !strcmp(P.built[i], "libfabric") || !strcmp(P.built[i], "zmq"));
    assert_true(P.verbs.probed);
    assert_string_equal(P.cuda.note, "skipped (CONNEX_PROBE_CUDA=0)");
    int rc = cx_select_decide(&P, NULL, &D);
    assert_int_equal(rc, P.n_built ? CX_OK : CX_EUNSUPPORTED);
    if (rc == CX_OK) {
        assert_true(D.n >= 1);
        assert_true(D.be[D.n - 1].caps & (CX_CAP_TCP | CX_CAP_SHM));
    }
}

static void missing_sysfs(void **s)
{
    (void)s;
    assert_int_equal(cx_probe_host(&P, "/nonexistent-sysfs"), CX_OK);
    assert_int_equal(P.n_rdma, 0);
    assert_int_equal(P.n_gpu, 0);
    assert_non_null(strstr(P.notes, "no /nonexistent-sysfs/class/infiniband"));
    assert_int_equal(cx_probe_host(NULL, NULL), CX_EINVAL);
    assert_int_equal(cx_probe_sysfs(NULL, NULL), CX_EINVAL);
}

static void fixture_probe(void **s)
{
    (void)s;
    char dir[256], path[512];
    snprintf(path, sizeof path, "%s/p4d-24xlarge-efa.layout", CX_FIXTURES);
    assert_int_equal(cx_fixture_make(path, dir, sizeof dir), 0);
    setenv("CONNEX_PROBE_CUDA", "0", 1);
    assert_int_equal(cx_probe_host(&P, dir), CX_OK);
    unsetenv("CONNEX_PROBE_CUDA");
    assert_int_equal(P.n_rdma, 4);
    assert_int_equal(P.n_gpu, 8);
    assert_int_equal(P.gpu[0].ordinal, -1); /* seen on PCI only */
    /* libibverbs only sees the real /sys: a synthetic tree is not cross-checked */
    assert_false(P.verbs.probed);
    assert_int_equal(P.rdma[0].verbs_ok, -1);
    assert_int_equal(P.rdma[0].link, CX_LINK_EFA);
    assert_int_equal(cx_fixture_remove(dir), 0);
}

static void reports(void **s)
{
    (void)s;
    synth_host(&P, H_IB_GPU_PEERMEM);
    snprintf(P.notes, sizeof P.notes, "a \"quoted\" note\\with\tcontrol\n");
    int rc = cx_select_decide(&P, NULL, &D);
    assert_int_equal(rc, CX_OK);
    size_t need = cx_select_report_json(&P, &D, rc, NULL, 0);
    char *buf = malloc(need + 1);
    assert_non_null(buf);
    assert_int_equal(cx_select_report_json(&P, &D, rc, buf, need + 1), need);
    assert_int_equal(strlen(buf), need);
    assert_non_null(strstr(buf, "\"backends\":[{\"backend\":\"ucx\",\"variant\":\"\",\"reaches\":\"tcp,shm,ib,gdr\"}"));
    assert_non_null(strstr(buf, "\"gpudirect\":true"));
    assert_non_null(strstr(buf, "a \\\"quoted\\\" note\\\\with\\u0009control"));
    assert_non_null(strstr(buf, "\"nic_of_gpu\":[\"mlx5_0\"]"));
    int depth = 0, instr = 0;
    for (const char *c = buf; *c; c++) {
        if (instr) {
            if (*c == '\\')
                c++;
            else if (*c == '"')
                instr = 0;
            continue;
        }
        if (*c == '"')
            instr = 1;
        else if (*c == '{' || *c == '[')
            depth++;
        else if (*c == '}' || *c == ']')
            depth--;
        assert_true(depth >= 0);
    }
    assert_int_equal(depth, 0);
    assert_false(instr);
    free(buf);

    char small[32];
    need = cx_select_report_text(&P, &D, rc, small, sizeof small);
    assert_true(need > sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);
    need = cx_select_report_text(&P, &D, rc, NULL, 0);
    buf = malloc(need + 1);
    assert_non_null(buf);
    cx_select_report_text(&P, &D, rc, buf, need + 1);
    assert_non_null(strstr(buf, "  1. ucx"));
    assert_non_null(strstr(buf, "gpudirect: on"));
    assert_non_null(strstr(buf, "  - rule rdma:"));
    free(buf);

    /* a failed decision reports its error */
    synth_host(&P, H_NO_BACKENDS);
    rc = cx_select_decide(&P, NULL, &D);
    char out[8192];
    cx_select_report_json(&P, &D, rc, out, sizeof out);
    assert_non_null(strstr(out, "\"ok\":false"));
    assert_non_null(strstr(out, "\"error\":\"no usable backend (built: none)\""));
    cx_select_log(&P, &D, rc); /* must not crash on a failed decision */
}

static void engine_entry(void **s)
{
    (void)s;
    const struct cx_backend_ops *ops[CX_SEL_MAX_BE];
    setenv("CONNEX_PROBE_CUDA", "0", 1);
    setenv("CONNEX_SYSFS_ROOT", "/nonexistent-sysfs", 1);
    unsetenv("CONNEX_NET_DEVICES");
    unsetenv("CONNEX_GDR");
    unsetenv("CONNEX_FI_PROVIDER");
    setenv("CONNEX_BACKEND", "bogus", 1);
    assert_int_equal(cx_select_for_engine("zmq", ops, CX_SEL_MAX_BE, &D), CX_EINVAL);
    assert_non_null(strstr(D.error, "CONNEX_BACKEND=bogus"));
    unsetenv("CONNEX_BACKEND");
    int n = cx_select_for_engine(NULL, ops, CX_SEL_MAX_BE, &D);
    if (n > 0) {
        assert_int_equal(n, D.n);
        for (int i = 0; i < n; i++) assert_string_equal(ops[i]->name, D.be[i].backend);
        /* the config's backend is honoured when the environment does not override it */
        assert_int_equal(cx_select_for_engine(D.be[n - 1].backend, ops, CX_SEL_MAX_BE, NULL), 1);
    } else {
        assert_int_equal(n, CX_EUNSUPPORTED); /* a build without backends */
    }
    assert_int_equal(cx_select_for_engine(NULL, NULL, 0, NULL), CX_EINVAL);
    unsetenv("CONNEX_SYSFS_ROOT");
    unsetenv("CONNEX_PROBE_CUDA");
}

static void caps_names(void **s)
{
    (void)s;
    char b[64];
    assert_int_equal(cx_select_caps_str(0, b, sizeof b), 0);
    assert_string_equal(b, "");
    cx_select_caps_str(CX_CAP_TCP | CX_CAP_EFA | CX_CAP_GDR, b, sizeof b);
    assert_string_equal(b, "tcp,efa,gdr");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(this_host), cmocka_unit_test(missing_sysfs), cmocka_unit_test(fixture_probe),
        cmocka_unit_test(reports),   cmocka_unit_test(engine_entry),  cmocka_unit_test(caps_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
