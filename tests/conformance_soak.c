/* Conformance, soak: 100 kill -9 and rejoin cycles of one peer identity against one survivor.
 * With the peer dead, the survivor's open fds must come back to at most their first-cycle count
 * (with it up, to that count, or up to 2 more: transport connections to the live peer); its RSS
 * to within 8 MiB, its regions to what it registered; every cycle moves data that is checked.
 * CXT_SOAK_CYCLES overrides the count (e.g. 10 for a quick run). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxt.h"

#define RS ((size_t)1 << 20)
#define RSS_SLACK_KIB (8 * 1024)

/* Open fds once the dead peer's connections have closed: with want < 0, the count once it has
 * not changed for 300 ms (at most 3 s); else the count once it is at most want (at most 8 s: a
 * UCX worker retired by rotation lives out its 5 s grace). */
static int fds_after_death(int want)
{
    uint64_t t0 = cxt_now_ns(), still = t0;
    int n = cxt_count_fds(), last = n;
    for (;;) {
        if (want >= 0 ? n <= want || cxt_ms_since(t0) > 8000 : cxt_ms_since(still) > 300 || cxt_ms_since(t0) > 3000)
            return n;
        usleep(10000);
        n = cxt_count_fds();
        if (n != last) {
            last = n;
            still = cxt_now_ns();
        }
    }
}

static void test_kill_rejoin_cycles(void **state)
{
    (void)state;
    int cycles = 100;
    const char *env = getenv("CXT_SOAK_CYCLES");
    if (env && atoi(env) > 1) cycles = atoi(env);
    cx_engine_t *e;
    assert_int_equal(cxt_engine(&e, "survivor", 0, 0, 0, 10000), 0);
    uint64_t inc = cx_engine_incarnation(e);
    uint8_t *r = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(r != MAP_FAILED);
    assert_int_equal(cx_register_memory(e, r, RS), CX_OK);
    uint8_t *tmp = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(tmp != MAP_FAILED);
    const char *eurl = cx_engine_local_url(e);
    char elid[CX_URL_MAX];
    cx_url_t eu;
    assert_int_equal(cx_url_parse(eurl, &eu, NULL, 0), CX_OK);
    cx_lid_format(&eu.lid, elid, sizeof elid);

    int fd0 = -1, fdl0[512], nfdl0 = 0, fdd0 = -1, fdld0[512], nfdld0 = 0;
    long rss0 = -1;
    uint16_t port = 0;
    char url0[CX_URL_MAX] = "";
    double max_fail_ms = 0, max_join_ms = 0, sum_join_ms = 0;
    uint64_t t_all = cxt_now_ns();
    for (int c = 0; c < cycles; c++) {
        cxt_peer_t p;
        uint32_t seed = 100 + (uint32_t)c;
        /* Half the restarts connect on their own, half wait for the survivor to reconnect. */
        cxt_peer_opts_t o = {
            .replica = 1, .port = port, .region = RS, .seed = seed, .connect = (c % 2) ? eurl : NULL
        };
        uint64_t t0 = cxt_now_ns();
        if (cxt_peer_start(&p, &o, 10000)) fail_msg("cycle %d: peer did not start on port %u", c, port);
        if (c == 0) {
            port = p.port;
            snprintf(url0, sizeof url0, "%s", p.url);
            assert_int_equal(cx_connect(e, p.url, 5000), CX_OK);
            if (cxt_wait_event(e, p.lid, CX_EVENT_UP, 5000, NULL, NULL)) fail_msg("no UP");
        } else {
            assert_string_equal(p.url, url0);
            unsigned seen = 0;
            if (cxt_wait_event(e, p.lid, CX_EVENT_JOINED, 8000, NULL, &seen))
                fail_msg("cycle %d: no JOINED within 8 s (seen 0x%x)", c, seen);
            double jm = cxt_ms_since(t0);
            sum_join_ms += jm;
            if (jm > max_join_ms) max_join_ms = jm;
        }
        /* Data both ways, checked. */
        memset(r, 0, 65536);
        int rc = cx_read(e, p.lid, r, p.base + 333, 65536);
        if (rc) fail_msg("cycle %d: read %s", c, cx_strerror(rc));
        if (cxt_check(r, 65536, seed, 333) >= 0) fail_msg("cycle %d: read data wrong", c);
        cxt_fill(r, 65536, 7 + (uint32_t)c, 0);
        if ((rc = cx_write(e, p.lid, r, p.base, 65536))) fail_msg("cycle %d: write %s", c, cx_strerror(rc));
        char rep[128], want[64];
        assert_int_equal(cxt_peer_cmd(&p, 5000, rep, sizeof rep, "HASH 0 65536"), 0);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(r, 65536));
        if (strcmp(rep, want)) fail_msg("cycle %d: written data wrong at the peer", c);
        /* A region registered and dropped while the peer is up: the peer sees it come and go. */
        cxt_fill(tmp, 65536, 50 + (uint32_t)c, 0);
        assert_int_equal(cx_register_memory(e, tmp, 65536), CX_OK);
        rc = cxt_peer_cmd(&p, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 65536 0", elid, (uintptr_t)tmp);
        if (rc) fail_msg("cycle %d: peer read of a new region: %s", c, rep);
        snprintf(want, sizeof want, "OK %" PRIx64, cxt_hash(tmp, 65536));
        if (strcmp(rep, want)) fail_msg("cycle %d: peer read of a new region gave %s", c, rep);
        assert_int_equal(cx_unregister_memory(e, tmp), CX_OK);

        cx_stats_t st;
        assert_int_equal(cx_stats(e, &st), CX_OK);
        assert_int_equal(st.regions, 1);
        assert_int_equal(st.registered_bytes, RS);
        assert_int_equal(st.peers_up, 1);
        assert_int_equal(st.ops_in_flight, 0);
        if (c == 0) {
            fd0 = cxt_count_fds();
            nfdl0 = cxt_list_fds(fdl0, 512);
            if (nfdl0 > 512) nfdl0 = 512;
            rss0 = cxt_rss_kib();
        } else if (c == 1 || c == cycles - 1 || c % 10 == 0) {
            /* 8 s: a UCX worker retired by rotation lives out its 5 s grace (backends/ucx) */
            int fdn = cxt_fds_settle(fd0, 8000);
            long rssn = cxt_rss_kib();
            fprintf(stderr,
                    "cycle %3d: fds %d (first %d) rss %ld KiB (first %ld) joins %" PRIu64 " failures %" PRIu64 "\n", c,
                    fdn, fd0, rssn, rss0, st.peer_joins, st.peer_failures);
            if (fdn != fd0) {
                /* With the peer up, UCX over tcp now and then holds one connection more to it than
                 * in the first cycle (seen: one extra socket in 1 of 6 runs, at one checkpoint);
                 * that is no leak unless it outlives the peer, which the check after its death
                 * below decides. More than that is a leak either way. */
                cxt_fds_report(fdl0, nfdl0, "soak, peer up");
                if (fdn > fd0 + 2) fail_msg("cycle %d: %d fds open, %d in the first cycle", c, fdn, fd0);
            }
            if (rssn > rss0 + RSS_SLACK_KIB) fail_msg("cycle %d: RSS %ld KiB, first cycle %ld KiB", c, rssn, rss0);
        }
        /* Crash it mid-life. */
        uint64_t tk = cxt_now_ns();
        cxt_peer_crash(&p);
        if (cxt_wait_event(e, p.lid, CX_EVENT_FAILED, 5000, NULL, NULL))
            fail_msg("cycle %d: no FAILED within 5 s of kill -9", c);
        double fm = cxt_ms_since(tk);
        if (fm > max_fail_ms) max_fail_ms = fm;
        if (cx_read(e, p.lid, r, p.base, 16) != CX_EPEER) fail_msg("cycle %d: op to a dead peer did not fail", c);
        /* With the peer dead: back to what the first cycle left once its peer was dead. */
        if (c == 0) {
            fdd0 = fds_after_death(-1);
            nfdld0 = cxt_list_fds(fdld0, 512);
            if (nfdld0 > 512) nfdld0 = 512;
        } else if (c == 1 || c == cycles - 1 || c % 10 == 0) {
            int fdn = fds_after_death(fdd0);
            if (fdn != fdd0) fprintf(stderr, "cycle %3d: peer dead: fds %d (first %d)\n", c, fdn, fdd0);
            if (fdn > fdd0) {
                cxt_fds_report(fdld0, nfdld0, "soak, peer dead");
                fail_msg("cycle %d: %d fds open with the peer dead, %d in the first cycle", c, fdn, fdd0);
            }
        }
    }
    fprintf(stderr,
            "%d cycles in %.1f s; FAILED at most %.1f ms after kill; JOINED mean %.1f ms, max %.1f ms "
            "after restart\n",
            cycles, cxt_ms_since(t_all) / 1000, max_fail_ms, sum_join_ms / (cycles > 1 ? cycles - 1 : 1), max_join_ms);
    cx_stats_t st;
    assert_int_equal(cx_stats(e, &st), CX_OK);
    assert_int_equal(st.peer_failures, (uint64_t)cycles);
    assert_int_equal(st.peer_joins, (uint64_t)cycles - 1);
    assert_int_equal(st.regions, 1);
    assert_int_equal(st.ops_in_flight, 0);
    assert_int_equal(cx_engine_incarnation(e), inc);
    cx_unregister_memory(e, r);
    cx_engine_destroy(e);
    munmap(r, RS);
    munmap(tmp, 65536);
}

/* The whole soak is one test: give it 280 s unless told otherwise. */
static int soak_watchdog(void **state)
{
    if (!getenv("CXT_WATCHDOG_S")) setenv("CXT_WATCHDOG_S", "280", 1);
    return cxt_watchdog_setup(state);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kill_rejoin_cycles, soak_watchdog, cxt_watchdog_teardown),
    };
    /* CXT_FILTER=test_name (wildcards allowed) runs a subset. */
    if (getenv("CXT_FILTER")) cmocka_set_test_filter(getenv("CXT_FILTER"));
    return cxt_run_tests(tests, NULL, NULL);
}
