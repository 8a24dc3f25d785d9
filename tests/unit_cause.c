/* The core's reading of a backend's failure report (core/src/cause.h): each cause, injected
 * against each peer state, gives its verdict; an xfer's status reaches the caller as CX_EPEER
 * only once the core failed the peer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cause.h"

static const cx_peer_state_t live[] = { CX_PEER_UP, CX_PEER_SUSPECT };
static const cx_peer_state_t not_live[] = { CX_PEER_UNKNOWN, CX_PEER_CONNECTING, CX_PEER_FAILED, CX_PEER_LEFT };

static void test_peer_gone_fails(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof live / sizeof *live; i++)
        assert_int_equal(cx_cause_verdict(CX_CAUSE_PEER_GONE, live[i]), CX_VERDICT_FAIL);
}

static void test_transport_probes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof live / sizeof *live; i++)
        assert_int_equal(cx_cause_verdict(CX_CAUSE_TRANSPORT, live[i]), CX_VERDICT_PROBE);
}

static void test_local_leaves_peer(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof live / sizeof *live; i++)
        assert_int_equal(cx_cause_verdict(CX_CAUSE_LOCAL, live[i]), CX_VERDICT_LOCAL);
}

/* A cause the core does not know is unclear: probed, never failed on its word alone. */
static void test_unknown_cause_probes(void **state)
{
    (void)state;
    static const int odd[] = { 0, 4, -1, 1000 };
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
        assert_int_equal(cx_cause_verdict(odd[i], CX_PEER_UP), CX_VERDICT_PROBE);
        assert_string_equal(cx_cause_name(odd[i]), "unknown cause");
    }
}

/* A peer that is not UP or SUSPECT has had its verdict: later reports change nothing. */
static void test_not_live_ignored(void **state)
{
    (void)state;
    static const int causes[] = { CX_CAUSE_PEER_GONE, CX_CAUSE_TRANSPORT, CX_CAUSE_LOCAL };
    for (size_t i = 0; i < sizeof not_live / sizeof *not_live; i++)
        for (size_t k = 0; k < sizeof causes / sizeof *causes; k++)
            assert_int_equal(cx_cause_verdict(causes[k], not_live[i]), CX_VERDICT_IGNORE);
}

static void test_op_status(void **state)
{
    (void)state;
    assert_int_equal(cx_cause_op_status(CX_EPEER, 1), CX_EPEER);
    assert_int_equal(cx_cause_op_status(CX_EPEER, 0), CX_ERR);
    static const int pass[] = { CX_OK, CX_ERR, CX_ENOMEM, CX_EAGAIN, CX_EINVAL, CX_ETIMEDOUT, CX_ECLOSED };
    for (size_t i = 0; i < sizeof pass / sizeof *pass; i++) {
        assert_int_equal(cx_cause_op_status(pass[i], 0), pass[i]);
        assert_int_equal(cx_cause_op_status(pass[i], 1), pass[i]);
    }
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(cx_cause_name(CX_CAUSE_PEER_GONE), "peer gone");
    assert_string_equal(cx_cause_name(CX_CAUSE_TRANSPORT), "transport");
    assert_string_equal(cx_cause_name(CX_CAUSE_LOCAL), "local");
    assert_string_equal(cx_verdict_name(CX_VERDICT_FAIL), "failed");
    assert_string_equal(cx_verdict_name(CX_VERDICT_PROBE), "suspect and probe");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_gone_fails),
        cmocka_unit_test(test_transport_probes),
        cmocka_unit_test(test_local_leaves_peer),
        cmocka_unit_test(test_unknown_cause_probes),
        cmocka_unit_test(test_not_live_ignored),
        cmocka_unit_test(test_op_status),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
