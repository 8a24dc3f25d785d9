/* The etcd directory against a real etcd on loopback (started here, killed at the end; skipped
 * when /usr/bin/etcd is missing): registration and clean close, a kill -9 losing its entry with
 * its lease, a SIGSTOPped replica expiring (FAILED, LEFT) and coming back on SIGCONT (JOINED), a
 * replica restarted under the same LID at a new port followed without being told (MOVED, and ops
 * by bare LID reach the new process, an op waiting through the restart included), and etcd
 * itself going away and coming back. Leases are 1 s; every wait is bounded and generous. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxt.h"
#include "cxt_etcd.h"

#define HB_MS 200
#define HBT_MS 1000
#define LEASE_MS 1000
#define BUF (64u << 10)

static cxt_etcd_t g_etcd = { .pid = -1 };
static int g_have_etcd;
static char g_buf[BUF] __attribute__((aligned(4096)));

static int group_setup(void **state)
{
    (void)state;
    int rc = cxt_etcd_start(&g_etcd, 15000);
    if (rc == 1) {
        fprintf(stderr, "mobility_etcd: %s missing: the etcd tests are skipped (CI installs etcd-server)\n",
                CXT_ETCD_BIN);
        return 0;
    }
    if (rc) return -1;
    g_have_etcd = 1;
    /* Before any engine or thread exists: the engines here and the peers spawned inherit them. */
    setenv("CONNEX_DIRECTORY", g_etcd.endpoint, 1);
    setenv("CONNEX_LEASE_MS", "1000", 1);
    fprintf(stderr, "mobility_etcd: etcd at %s (pid %d, data %s)\n", g_etcd.endpoint, (int)g_etcd.pid, g_etcd.dir);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    cxt_etcd_stop(&g_etcd);
    return 0;
}

static void need_etcd(void)
{
    if (!g_have_etcd) cxt_skip("etcd", "%s missing (CI installs etcd-server)", CXT_ETCD_BIN);
}

static cx_engine_t *engine_hbt(const char *model, uint32_t hbt_ms)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.heartbeat_ms = HB_MS;
    c.heartbeat_timeout_ms = hbt_ms;
    c.op_timeout_ms = 5000;
    c.connect_timeout_ms = 3000;
    c.lease_ms = LEASE_MS;
    cxt_apply_test_env(&c);
    cx_engine_t *e = NULL;
    assert_int_equal(cx_engine_create(&c, &e), CX_OK);
    assert_string_equal(cx_directory_kind(e), "etcd");
    return e;
}

static cx_engine_t *engine(const char *model)
{
    return engine_hbt(model, HBT_MS);
}

static void peer(cxt_peer_t *p, const char *model, uint32_t seed)
{
    cxt_peer_opts_t o = {
        .model = model, .hb_ms = HB_MS, .hb_timeout_ms = HBT_MS, .op_timeout_ms = 5000, .seed = seed, .region = 1u << 20
    };
    assert_int_equal(cxt_peer_start(p, &o, 15000), 0);
}

/* Polls cx_directory_list until it holds `want` entries for the pattern (and, when url is not
 * NULL and want is 1, that URL). Returns the milliseconds it took, or -1 past timeout_ms. */
static double wait_listed(cx_engine_t *e, const char *pat, int want, const char *url, int timeout_ms)
{
    uint64_t t0 = cxt_now_ns();
    while (cxt_ms_since(t0) < timeout_ms) {
        cx_dir_entry_t v[4];
        int n = cx_directory_list(e, pat, v, 4);
        assert_true(n >= 0);
        if (n == want && (!url || want != 1 || !strcmp(v[0].url, url))) return cxt_ms_since(t0);
        usleep(10000);
    }
    return -1;
}

static void read_check(cx_engine_t *e, const char *lid, const cxt_peer_t *p, uint32_t seed)
{
    memset(g_buf, 0, 4096);
    int rc = cx_read(e, lid, g_buf, p->base, 4096);
    assert_int_equal(rc, CX_OK);
    assert_int_equal(cxt_check(g_buf, 4096, seed, 0), -1);
}

static void test_register_and_clean_close(void **state)
{
    (void)state;
    need_etcd();
    cx_engine_t *a = engine("dA"), *b = engine("dB");
    double t = wait_listed(b, "dA|*|*|*", 1, cx_engine_local_url(a), 5000);
    assert_true(t >= 0);
    assert_true(wait_listed(a, "dB|0|0|0", 1, cx_engine_local_url(b), 5000) >= 0);
    cx_dir_entry_t v[8];
    assert_true(cx_directory_list(a, NULL, v, 8) >= 2);
    uint64_t t0 = cxt_now_ns();
    cx_engine_destroy(a);
    double destroy_ms = cxt_ms_since(t0);
    double gone = wait_listed(b, "dA|*|*|*", 0, NULL, 5000);
    fprintf(stderr, "mobility_etcd: clean close: destroy %.1f ms, entry gone at the other engine %.1f ms later\n",
            destroy_ms, gone);
    assert_true(gone >= 0 && gone < 1000);
    cx_stats_t st;
    /* Counted by the progress thread when it applies a change, at its next tick. */
    for (int i = 0; i < 100; i++) {
        assert_int_equal(cx_stats(b, &st), CX_OK);
        if (st.directory_changes >= 2) break;
        usleep(20000);
    }
    assert_true(st.directory_changes >= 2);
    cx_engine_destroy(b);
}

static void test_kill9_expires(void **state)
{
    (void)state;
    need_etcd();
    cx_engine_t *e = engine("k9obs");
    cxt_peer_t p;
    peer(&p, "k9", 1);
    assert_true(wait_listed(e, "k9|0|0|0", 1, p.url, 5000) >= 0);
    assert_int_equal(cx_connect(e, "k9|0|0|0", 5000), CX_OK); /* by bare LID, via the directory */
    cxt_drain_events(e);
    uint64_t t0 = cxt_now_ns();
    cxt_peer_crash(&p);
    /* The transport sees the death at once (FAILED); the lease runs out after it (LEFT). */
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(e, "k9|0|0|0", CX_EVENT_FAILED, 4000, &ev, NULL), CX_OK);
    assert_int_equal(cxt_wait_event(e, "k9|0|0|0", CX_EVENT_LEFT, 6000, &ev, NULL), CX_OK);
    assert_non_null(strstr(ev.reason, "lease expired"));
    double left = cxt_ms_since(t0);
    double gone = wait_listed(e, "k9|0|0|0", 0, NULL, 6000);
    fprintf(stderr, "mobility_etcd: kill -9: LEFT (lease expired) %.1f ms after the kill (lease %d ms)\n", left,
            LEASE_MS);
    assert_true(gone >= 0 && left < 4000);
    cxt_peer_stop(&p);
    cx_engine_destroy(e);
}

static void test_sigstop_expires_and_returns(void **state)
{
    (void)state;
    need_etcd();
    /* A heartbeat timeout longer than the lease: the DELETE comes while the peer is still
     * SUSPECT here, and LEFT must follow once the transport fails it. */
    cx_engine_t *e = engine_hbt("ssobs", 2500);
    assert_int_equal(cx_register_memory(e, g_buf, BUF), CX_OK);
    cxt_peer_t p;
    peer(&p, "ss", 2);
    assert_true(wait_listed(e, "ss|0|0|0", 1, p.url, 5000) >= 0);
    /* Never told the URL: the bare LID resolves through the directory. */
    assert_int_equal(cx_connect(e, "ss|0|0|0", 5000), CX_OK);
    read_check(e, "ss|0|0|0", &p, 2);
    cxt_drain_events(e);

    uint64_t t0 = cxt_now_ns();
    cxt_peer_signal(&p, SIGSTOP);
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(e, "ss|0|0|0", CX_EVENT_FAILED, 6000, &ev, NULL), CX_OK);
    double t_failed = cxt_ms_since(t0);
    assert_int_equal(cxt_wait_event(e, "ss|0|0|0", CX_EVENT_LEFT, 6000, &ev, NULL), CX_OK);
    double t_left = cxt_ms_since(t0);
    assert_non_null(strstr(ev.reason, "lease expired"));
    assert_int_equal(wait_listed(e, "ss|0|0|0", 0, NULL, 1000) >= 0, 1);
    assert_int_equal(cx_peer_state(e, "ss|0|0|0"), CX_PEER_LEFT);
    fprintf(stderr, "mobility_etcd: SIGSTOP: FAILED after %.0f ms, LEFT (lease expired) after %.0f ms\n", t_failed,
            t_left);

    t0 = cxt_now_ns();
    cxt_peer_signal(&p, SIGCONT);
    assert_int_equal(cxt_wait_event(e, "ss|0|0|0", CX_EVENT_JOINED, 8000, &ev, NULL), CX_OK);
    double t_joined = cxt_ms_since(t0);
    assert_true(wait_listed(e, "ss|0|0|0", 1, p.url, 5000) >= 0);
    fprintf(stderr, "mobility_etcd: SIGCONT: JOINED after %.0f ms, registered again\n", t_joined);
    int rc = CX_ERR;
    for (int i = 0; i < 20 && rc != CX_OK; i++) {
        rc = cx_read(e, "ss|0|0|0", g_buf, p.base, 4096);
        if (rc) usleep(100000);
    }
    assert_int_equal(rc, CX_OK);
    assert_int_equal(cxt_check(g_buf, 4096, 2, 0), -1);
    cxt_peer_stop(&p);
    assert_int_equal(cx_unregister_memory(e, g_buf), CX_OK);
    cx_engine_destroy(e);
}

struct conn_arg {
    cx_engine_t *e;
    int rc;
};
static void *connect_thread(void *arg)
{
    struct conn_arg *a = arg;
    a->rc = cx_connect(a->e, "mg|0|0|0", 15000);
    return NULL;
}

static void test_migration(void **state)
{
    (void)state;
    need_etcd();
    cx_engine_t *e = engine("mgobs");
    assert_int_equal(cx_register_memory(e, g_buf, BUF), CX_OK);
    cxt_peer_t p1, p2;
    peer(&p1, "mg", 11);
    assert_true(wait_listed(e, "mg|0|0|0", 1, p1.url, 5000) >= 0);
    read_check(e, "mg|0|0|0", &p1, 11);
    cxt_drain_events(e);
    cxt_peer_crash(&p1);
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(e, "mg|0|0|0", CX_EVENT_FAILED, 4000, &ev, NULL), CX_OK);

    /* An op waiting on the replica while it is down: it must run once the new one is found. */
    struct conn_arg ca = { e, CX_ERR };
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, connect_thread, &ca), 0);
    usleep(100000);
    uint64_t t0 = cxt_now_ns();
    peer(&p2, "mg", 22);
    assert_int_not_equal(p1.port, p2.port);
    assert_int_equal(cxt_wait_event(e, "mg|0|0|0", CX_EVENT_MOVED, 6000, &ev, NULL), CX_OK);
    double t_moved = cxt_ms_since(t0);
    assert_string_equal(ev.url, p2.url);
    assert_non_null(strstr(ev.reason, "directory"));
    pthread_join(th, NULL);
    double t_conn = cxt_ms_since(t0);
    assert_int_equal(ca.rc, CX_OK);
    fprintf(stderr,
            "mobility_etcd: migration: MOVED %.0f ms after the new process started (incl. its start), "
            "waiting connect done at %.0f ms\n",
            t_moved, t_conn);
    read_check(e, "mg|0|0|0", &p2, 22);
    assert_int_equal(cx_peer_state(e, "mg|0|0|0"), CX_PEER_UP);
    cxt_peer_stop(&p2);
    cxt_peer_stop(&p1);
    assert_int_equal(cx_unregister_memory(e, g_buf), CX_OK);
    cx_engine_destroy(e);
}

/* A rolling restart: the replica closes cleanly (LEFT), its successor registers the same LID at
 * a new port: MOVED, then it is dialled (JOINED) and bare-LID ops reach it. */
static void test_clean_restart_elsewhere(void **state)
{
    (void)state;
    need_etcd();
    cx_engine_t *e = engine("crobs");
    assert_int_equal(cx_register_memory(e, g_buf, BUF), CX_OK);
    cxt_peer_t p1, p2;
    peer(&p1, "cr", 41);
    assert_true(wait_listed(e, "cr|0|0|0", 1, p1.url, 5000) >= 0);
    read_check(e, "cr|0|0|0", &p1, 41);
    cxt_drain_events(e);
    cxt_peer_stop(&p1);
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(e, "cr|0|0|0", CX_EVENT_LEFT, 4000, &ev, NULL), CX_OK);
    assert_non_null(strstr(ev.reason, "BYE"));
    assert_true(wait_listed(e, "cr|0|0|0", 0, NULL, 3000) >= 0);
    peer(&p2, "cr", 42);
    unsigned seen = 0;
    assert_int_equal(cxt_wait_event(e, "cr|0|0|0", CX_EVENT_JOINED, 6000, &ev, &seen), CX_OK);
    assert_true(seen & (1u << CX_EVENT_MOVED));
    assert_string_equal(ev.url, p2.url);
    read_check(e, "cr|0|0|0", &p2, 42);
    cxt_peer_stop(&p2);
    assert_int_equal(cx_unregister_memory(e, g_buf), CX_OK);
    cx_engine_destroy(e);
}

/* The directory thread, its curl handles and sockets go with the engine. */
static void test_fds_flat(void **state)
{
    (void)state;
    need_etcd();
    cx_engine_destroy(engine("fdw")); /* warm-up: one-time initialisations open what they open */
    int before = cxt_count_fds();
    for (int i = 0; i < 3; i++) {
        cx_engine_t *a = engine("fdA"), *b = engine("fdB");
        assert_true(wait_listed(b, "fdA|0|0|0", 1, cx_engine_local_url(a), 5000) >= 0);
        cx_engine_destroy(a);
        assert_true(wait_listed(b, "fdA|0|0|0", 0, NULL, 2000) >= 0);
        cx_engine_destroy(b);
    }
    /* The engines' fds close in destroy; allow a moment for anything else in the process. */
    int after = cxt_count_fds();
    for (int i = 0; i < 100 && after != before; i++) {
        usleep(20000);
        after = cxt_count_fds();
    }
    assert_int_equal(after, before);
}

/* etcd dies: the engines keep what they know; etcd back: they register again and watch again. */
static void test_etcd_goes_away(void **state)
{
    (void)state;
    need_etcd();
    cx_engine_t *a = engine("gwA"), *b = engine("gwB");
    assert_true(wait_listed(b, "gwA|0|0|0", 1, cx_engine_local_url(a), 5000) >= 0);
    assert_int_equal(cxt_etcd_restart(&g_etcd, 0, 15000), 0); /* down */
    usleep(1500000);
    assert_true(wait_listed(b, "gwA|0|0|0", 1, cx_engine_local_url(a), 100) >= 0); /* kept */
    assert_int_equal(cxt_etcd_restart(&g_etcd, 1, 15000), 0);                      /* back, same port, same data */
    uint64_t t0 = cxt_now_ns();
    /* Both re-register; then a clean close must reach the other engine through the new watch. */
    cx_engine_t *c = engine("gwC");
    assert_true(wait_listed(b, "gwC|0|0|0", 1, cx_engine_local_url(c), 8000) >= 0);
    fprintf(stderr, "mobility_etcd: etcd back: the other engine's watch saw a new entry after %.0f ms\n",
            cxt_ms_since(t0));
    cx_engine_destroy(a);
    assert_true(wait_listed(b, "gwA|0|0|0", 0, NULL, 5000) >= 0);
    cx_engine_destroy(c);
    cx_engine_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_register_and_clean_close, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_kill9_expires, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_sigstop_expires_and_returns, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_migration, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_clean_restart_elsewhere, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_fds_flat, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_etcd_goes_away, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    return cxt_run_tests(tests, group_setup, group_teardown);
}
