/* Migration with the embedded (static) directory: the survivor knows the replica's first URL
 * from its peer list only. The replica is killed and restarted under the same LID at a new port,
 * and it dials the survivor: the survivor follows it (MOVED), its directory says the new URL,
 * and ops by bare LID reach the new process without the test telling the survivor anything. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cxt.h"

#define HB_MS 200
#define HBT_MS 1000
#define BUF (64u << 10)

static char g_buf[BUF] __attribute__((aligned(4096)));

static void read_check(cx_engine_t *e, const char *lid, const cxt_peer_t *p, uint32_t seed)
{
    memset(g_buf, 0, 4096);
    assert_int_equal(cx_read(e, lid, g_buf, p->base, 4096), CX_OK);
    assert_int_equal(cxt_check(g_buf, 4096, seed, 0), -1);
}

static void test_static_restart_elsewhere(void **state)
{
    (void)state;
    cxt_peer_t p1, p2;
    cxt_peer_opts_t o = { .model = "st", .hb_ms = HB_MS, .hb_timeout_ms = HBT_MS, .op_timeout_ms = 5000, .seed = 31 };
    assert_int_equal(cxt_peer_start(&p1, &o, 15000), 0);

    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "stobs";
    c.heartbeat_ms = HB_MS;
    c.heartbeat_timeout_ms = HBT_MS;
    c.op_timeout_ms = 5000;
    c.directory = "static";
    c.peers = p1.url;
    cxt_apply_test_env(&c);
    cx_engine_t *e;
    assert_int_equal(cx_engine_create(&c, &e), CX_OK);
    assert_string_equal(cx_directory_kind(e), "static");
    assert_int_equal(cx_register_memory(e, g_buf, BUF), CX_OK);
    read_check(e, "st|0|0|0", &p1, 31); /* a bare LID: the directory knows where */
    cxt_drain_events(e);

    cxt_peer_crash(&p1);
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(e, "st|0|0|0", CX_EVENT_FAILED, 4000, &ev, NULL), CX_OK);

    o.seed = 32;
    o.connect = cx_engine_local_url(e);
    uint64_t t0 = cxt_now_ns();
    assert_int_equal(cxt_peer_start(&p2, &o, 15000), 0);
    assert_int_not_equal(p1.port, p2.port);
    assert_int_equal(cxt_wait_event(e, "st|0|0|0", CX_EVENT_MOVED, 5000, &ev, NULL), CX_OK);
    fprintf(stderr, "mobility_static: MOVED %.0f ms after the new process was started\n", cxt_ms_since(t0));
    assert_string_equal(ev.url, p2.url);
    read_check(e, "st|0|0|0", &p2, 32);
    cx_dir_entry_t v[2];
    assert_int_equal(cx_directory_list(e, "st|*|*|*", v, 2), 1);
    assert_string_equal(v[0].url, p2.url);
    assert_true(v[0].version >= 2);
    cx_stats_t st;
    /* Counted by the progress thread when it applies a change, at its next tick. */
    for (int i = 0; i < 100; i++) {
        assert_int_equal(cx_stats(e, &st), CX_OK);
        if (st.directory_changes >= 3) break;
        usleep(20000);
    }
    assert_true(st.directory_changes >= 3);

    cxt_peer_stop(&p2);
    cxt_peer_stop(&p1);
    assert_int_equal(cx_unregister_memory(e, g_buf), CX_OK);
    cx_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_static_restart_elsewhere, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    return cxt_run_tests(tests, NULL, NULL);
}
