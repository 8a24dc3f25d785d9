/* Auto-selection end to end: real engines in two processes that stand in for different hosts
 * (CONNEX_HOST_ID) with different synthetic sysfs trees (CONNEX_SYSFS_ROOT: an InfiniBand DGX and
 * an EFA instance). Neither RDMA fabric exists here, so every pair must end on a TCP path both
 * sides advertise, say so in its UP event and in cx_peer_list; a same-host pair must take the
 * same-host rule, and a peer limited to one backend must pull the pair onto it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cxt.h"
#include "fixture.h"

static cx_engine_t *E;
static char IB[256], EFA[256];

static int group_setup(void **state)
{
    (void)state;
    if (cx_fixture_make(CX_FIXTURES "/dgx-h100-8gpu-8nic.layout", IB, sizeof IB)) return -1;
    if (cx_fixture_make(CX_FIXTURES "/p4d-24xlarge-efa.layout", EFA, sizeof EFA)) return -1;
    /* This process is "host A" with InfiniBand NICs; the probe runs once, at the first engine. */
    setenv("CONNEX_HOST_ID", "host-a", 1);
    setenv("CONNEX_SYSFS_ROOT", IB, 1);
    setenv("CONNEX_PROBE_CUDA", "0", 1);
    unsetenv("CONNEX_BACKEND");
    return cxt_engine(&E, "sel", 0, 200, 2000, 10000) ? -1 : 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (E) cx_engine_destroy(E);
    cx_fixture_remove(IB);
    cx_fixture_remove(EFA);
    return 0;
}

/* The first name of a comma-separated backend list. */
static void first_of(const char *list, char *out, size_t n)
{
    snprintf(out, n, "%s", list);
    char *c = strchr(out, ',');
    if (c) *c = 0;
}

/* Starts a peer as another process with the given host id, sysfs tree and backend limit, waits
 * for its UP event and checks the pair's backend on both the event and cx_peer_list. */
static void pair_case(const char *host, const char *sysfs, const char *backend, uint32_t replica, const char *expect)
{
    setenv("CONNEX_HOST_ID", host, 1);
    setenv("CONNEX_SYSFS_ROOT", sysfs, 1);
    if (backend) setenv("CONNEX_BACKEND", backend, 1);
    cxt_peer_t p;
    cxt_peer_opts_t o = { .model = "sel", .replica = replica, .region = 1 << 16, .seed = 3 };
    int rc = cxt_peer_start(&p, &o, 15000);
    setenv("CONNEX_HOST_ID", "host-a", 1);
    setenv("CONNEX_SYSFS_ROOT", IB, 1);
    unsetenv("CONNEX_BACKEND");
    assert_int_equal(rc, 0);

    assert_int_equal(cx_connect(E, p.url, 10000), CX_OK);
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(E, p.lid, CX_EVENT_UP, 5000, &ev, NULL), 0);
    char want[64];
    snprintf(want, sizeof want, "data over %s", expect);
    if (!strstr(ev.reason, want)) fail_msg("UP event says '%s', expected '%s'", ev.reason, want);
    const char *b = cx_peer_backend(E, p.lid);
    assert_non_null(b);
    assert_string_equal(b, expect);

    cx_peer_info_t info[8];
    int n = cx_peer_list(E, info, 8);
    assert_true(n >= 1);
    int found = 0;
    uint64_t inc = 0;
    for (int i = 0; i < n && i < 8; i++) {
        char lid[96];
        cx_lid_format(&info[i].lid, lid, sizeof lid);
        if (strcmp(lid, p.lid)) continue;
        found = 1;
        assert_int_equal(info[i].state, CX_PEER_UP);
        assert_string_equal(info[i].backend, expect);
        assert_true(info[i].why[0] != 0);
        assert_int_equal(info[i].same_host, strcmp(host, "host-a") == 0);
        assert_true(info[i].incarnation != 0);
        inc = info[i].incarnation;
        printf("pair with %s (%s): %s: %s\n", p.lid, host, info[i].backend, info[i].why);
    }
    assert_true(found);
    /* The pair works on that backend, both ways. */
    char reply[256];
    uint8_t *buf = malloc(4096);
    assert_non_null(buf);
    assert_int_equal(cx_register_memory(E, buf, 4096), CX_OK);
    assert_int_equal(cx_read(E, p.lid, buf, p.base, 4096), CX_OK);
    assert_int_equal(cxt_check(buf, 4096, p.seed, 0), -1);
    assert_int_equal(cxt_peer_cmd(&p, 10000, reply, sizeof reply, "SEND %s 64 5", cx_engine_local_url(E)), 0);
    cx_msg_t m;
    assert_int_equal(cx_recv_msg(E, &m, 5000), CX_OK);
    assert_int_equal(m.len, 64);
    assert_int_equal(m.step, 0);
    assert_true(m.from_incarnation == inc);
    cx_msg_release(&m);
    assert_int_equal(cx_unregister_memory(E, buf), CX_OK);
    free(buf);
    cxt_peer_stop(&p);
    assert_int_equal(cxt_wait_event(E, p.lid, CX_EVENT_LEFT, 5000, &ev, NULL), 0);
}

/* An InfiniBand host and an EFA host share no RDMA fabric: they end on TCP, through the first
 * backend of the TCP rule (both orders are the same here, the libraries being the same). */
static void test_ib_and_efa_hosts_end_on_tcp(void **state)
{
    (void)state;
    char want[32];
    first_of(cx_engine_backends(E), want, sizeof want);
    pair_case("host-b", EFA, NULL, 1, want);
}

/* Same host id: the same-host rule, the opened path measured fastest between two processes of
 * one host: libfabric (tcp;ofi_rxm over loopback) before UCX (one tcp/lo lane), when built. */
static void test_same_host_takes_fastest_local_path(void **state)
{
    (void)state;
    const char *list = cx_engine_backends(E);
    char want[32];
    if (strstr(list, "libfabric"))
        snprintf(want, sizeof want, "libfabric");
    else if (strstr(list, "ucx"))
        snprintf(want, sizeof want, "ucx");
    else
        first_of(list, want, sizeof want);
    pair_case("host-a", IB, NULL, 2, want);
}

/* A peer that can only do ZeroMQ (CONNEX_BACKEND=zmq) pulls the pair onto ZeroMQ. */
static void test_peer_limited_to_zmq(void **state)
{
    (void)state;
    if (!strstr(cx_engine_backends(E), "zmq")) skip();
    pair_case("host-c", EFA, "zmq", 3, "zmq");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ib_and_efa_hosts_end_on_tcp, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_same_host_takes_fastest_local_path, cxt_watchdog_setup,
                                        cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_peer_limited_to_zmq, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    return cxt_run_tests(tests, group_setup, group_teardown);
}
