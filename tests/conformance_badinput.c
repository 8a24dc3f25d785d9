/* Conformance, bad input: every misuse of the API gets a clear error code (and a log line), never
 * a crash or a hang; garbage on the control port leaves the engine working. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cxt.h"

#define RS ((size_t)1 << 20)
#define PSEED 8

static cx_engine_t *E;
static uint8_t *R;
static cxt_peer_t P;

static int group_setup(void **state)
{
    (void)state;
    if (cxt_engine(&E, "victim", 0, 0, 0, 10000)) return -1;
    R = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (R == MAP_FAILED) return -1;
    if (cx_register_memory(E, R, RS)) return -1;
    cxt_peer_opts_t o = { .replica = 1, .region = RS, .seed = PSEED };
    if (cxt_peer_start(&P, &o, 10000)) return -1;
    if (cx_connect(E, P.url, 5000)) return -1;
    return cxt_wait_event(E, P.lid, CX_EVENT_UP, 5000, NULL, NULL) ? -1 : 0;
}

static int group_teardown(void **state)
{
    (void)state;
    cxt_peer_stop(&P);
    if (E) cx_engine_destroy(E);
    if (R && R != MAP_FAILED) munmap(R, RS);
    return 0;
}

/* The engine and the pair still work: one checked read each way. */
static void still_works(void)
{
    char rep[128];
    /* Earlier successful writes changed the peer's bytes: restore them first. */
    assert_int_equal(cxt_peer_cmd(&P, 10000, rep, sizeof rep, "FILL %u", PSEED), 0);
    memset(R, 0, 4096);
    int rc = cx_read(E, P.lid, R, P.base + 100, 4096);
    if (rc) fail_msg("engine broken afterwards: read %s", cx_strerror(rc));
    assert_int_equal(cxt_check(R, 4096, PSEED, 100), -1);
    cx_url_t u;
    assert_int_equal(cx_url_parse(cx_engine_local_url(E), &u, NULL, 0), CX_OK);
    char lid[CX_URL_MAX];
    cx_lid_format(&u.lid, lid, sizeof lid);
    rc = cxt_peer_cmd(&P, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 4096 0", lid, (uintptr_t)R);
    if (rc) fail_msg("peer cannot read from us afterwards: %s", rep);
}

/* Each op kind with the given arguments; all must return want. */
static void all_ops(const char *peer, void *loc, uint64_t rem, size_t len, int want, const char *what)
{
    int rc = cx_read(E, peer, loc, rem, len);
    if (rc != want) fail_msg("%s: read returned %d (%s), expected %s", what, rc, cx_strerror(rc), cx_strerror(want));
    rc = cx_write(E, peer, loc, rem, len);
    if (rc != want) fail_msg("%s: write returned %d (%s), expected %s", what, rc, cx_strerror(rc), cx_strerror(want));
    cx_op_t *op = NULL;
    rc = cx_put_signal(E, peer, loc, rem, len, "m", 1, &op);
    if (rc == CX_OK) {
        assert_non_null(op);
        rc = cx_op_wait(op, 10000);
    }
    if (rc != want)
        fail_msg("%s: put_signal returned %d (%s), expected %s", what, rc, cx_strerror(rc), cx_strerror(want));
}

static void test_unregistered_local(void **state)
{
    (void)state;
    uint8_t *heap = malloc(8192);
    assert_non_null(heap);
    all_ops(P.lid, heap, P.base, 4096, CX_EINVAL, "unregistered local buffer");
    all_ops(P.lid, R + RS - 100, P.base, 200, CX_EINVAL, "local buffer straddling the region end");
    all_ops(P.lid, R - 1, P.base, 16, CX_EINVAL, "local buffer starting before the region");
    free(heap);
    all_ops(P.lid, R + RS - 100, P.base, 100, CX_OK, "local range ending exactly at the region end");
    still_works();
}

static void test_remote_out_of_range(void **state)
{
    (void)state;
    all_ops(P.lid, R, P.base + RS, 1, CX_EINVAL, "remote range just past the region");
    all_ops(P.lid, R, P.base + RS - 10, 20, CX_EINVAL, "remote range straddling the region end");
    all_ops(P.lid, R, P.base - 10, 20, CX_EINVAL, "remote range straddling the region start");
    all_ops(P.lid, R, 0x1000, 16, CX_EINVAL, "remote range in no region");
    all_ops(P.lid, R, P.base + 10, UINT64_MAX - 5, CX_EINVAL, "remote length wrapping around");
    all_ops(P.lid, R, P.base + RS - 10, 10, CX_OK, "remote range ending exactly at the region end");
    cx_stats_t st;
    assert_int_equal(cx_stats(E, &st), CX_OK);
    assert_int_equal(st.ops_in_flight, 0);
    still_works();
}

static void test_zero_length(void **state)
{
    (void)state;
    all_ops(P.lid, R, P.base, 0, CX_EINVAL, "length 0");
    still_works();
}

static void test_unknown_peer(void **state)
{
    (void)state;
    /* A bare LID never seen: nothing to connect to. */
    all_ops("nobody|9|9|9", R, P.base, 16, CX_EINVAL, "unknown bare LID");
    assert_int_equal(cx_send_msg(E, "nobody|9|9|9", "x", 1), CX_EINVAL);
    /* A well-formed URL where nobody listens: CX_EPEER after at most the connect timeout. */
    char url[CX_URL_MAX];
    int hold;
    uint16_t dead = cxt_refusing_port(&hold);
    assert_true(dead != 0);
    snprintf(url, sizeof url, "127.0.0.1:%u#ghost|0|0|0", dead);
    uint64_t t0 = cxt_now_ns();
    int rc = cx_read(E, url, R, 0x1000, 16);
    double ms = cxt_ms_since(t0);
    if (rc != CX_EPEER) fail_msg("read from a URL nobody listens on: %s, expected CX_EPEER", cx_strerror(rc));
    if (ms > 7000) fail_msg("took %.0f ms (connect timeout 5 s)", ms);
    t0 = cxt_now_ns();
    assert_int_equal(cx_connect(E, url, 1000), CX_EPEER);
    assert_true(cxt_ms_since(t0) < 3000);
    close(hold);
    /* A URL naming a port that does listen, but under another identity: never an alias. */
    snprintf(url, sizeof url, "127.0.0.1:%u#impostor|0|0|0", P.port);
    rc = cx_connect(E, url, 3000);
    if (rc == CX_OK) fail_msg("connect to %s succeeded although %s listens there", url, P.lid);
    if (rc != CX_EPEER && rc != CX_EINVAL) fail_msg("identity mismatch gave %s", cx_strerror(rc));
    rc = cx_read(E, url, R, P.base, 16);
    if (rc == CX_OK) fail_msg("read through a mismatched identity succeeded");
    assert_int_equal(cx_peer_state(E, P.lid), CX_PEER_UP);
    still_works();
}

static void test_malformed_urls(void **state)
{
    (void)state;
    static const char *bad[] = { "",
                                 "127.0.0.1",
                                 "127.0.0.1:5000",
                                 "localhost:5000#m|0|0|0",
                                 "127.0.0.1:0#m|0|0|0",
                                 "127.0.0.1:5000#m|0|0",
                                 "::1:5000#m|0|0|0",
                                 "m|0|0",
                                 "m|0|0|0|0",
                                 "127.0.0.1:5000#m|0|0|0 ",
                                 "|||" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = cx_read(E, bad[i], R, P.base, 16);
        if (rc != CX_EINVAL) fail_msg("read peer '%s': %s, expected CX_EINVAL", bad[i], cx_strerror(rc));
        assert_int_equal(cx_write(E, bad[i], R, P.base, 16), CX_EINVAL);
        assert_int_equal(cx_send_msg(E, bad[i], "x", 1), CX_EINVAL);
        assert_int_equal(cx_connect(E, bad[i], 100), CX_EINVAL);
        assert_int_equal(cx_peer_state(E, bad[i]), CX_PEER_UNKNOWN);
    }
    still_works();
}

static void test_null_args(void **state)
{
    (void)state;
    cx_op_t *op = NULL;
    assert_int_equal(cx_read(NULL, P.lid, R, P.base, 16), CX_EINVAL);
    assert_int_equal(cx_read(E, NULL, R, P.base, 16), CX_EINVAL);
    assert_int_equal(cx_read(E, P.lid, NULL, P.base, 16), CX_EINVAL);
    assert_int_equal(cx_write(NULL, P.lid, R, P.base, 16), CX_EINVAL);
    assert_int_equal(cx_write(E, NULL, R, P.base, 16), CX_EINVAL);
    assert_int_equal(cx_write(E, P.lid, NULL, P.base, 16), CX_EINVAL);
    assert_int_equal(cx_put_signal(NULL, P.lid, R, P.base, 16, "m", 1, &op), CX_EINVAL);
    assert_int_equal(cx_put_signal(E, NULL, R, P.base, 16, "m", 1, &op), CX_EINVAL);
    assert_int_equal(cx_put_signal(E, P.lid, NULL, P.base, 16, "m", 1, &op), CX_EINVAL);
    assert_int_equal(cx_put_signal(E, P.lid, R, P.base, 16, NULL, 1, &op), CX_EINVAL);
    assert_int_equal(cx_put_signal(E, P.lid, R, P.base, 16, "m", 1, NULL), CX_EINVAL);
    assert_int_equal(cx_put_signal(E, P.lid, R, P.base, 16, "m", CX_MSG_MAX + 1ull, &op), CX_EINVAL);
    assert_int_equal(cx_op_wait(NULL, 0), CX_EINVAL);
    assert_int_equal(cx_send_msg(NULL, P.lid, "x", 1), CX_EINVAL);
    assert_int_equal(cx_send_msg(E, NULL, "x", 1), CX_EINVAL);
    assert_int_equal(cx_send_msg(E, P.lid, NULL, 1), CX_EINVAL);
    assert_int_equal(cx_send_msg(E, P.lid, R, CX_MSG_MAX + 1ull), CX_EINVAL);
    cx_msg_t m;
    cx_event_t ev;
    cx_stats_t st;
    assert_int_equal(cx_recv_msg(NULL, &m, 0), CX_EINVAL);
    assert_int_equal(cx_recv_msg(E, NULL, 0), CX_EINVAL);
    assert_int_equal(cx_wait_event(NULL, &ev, 0), CX_EINVAL);
    assert_int_equal(cx_wait_event(E, NULL, 0), CX_EINVAL);
    assert_int_equal(cx_stats(NULL, &st), CX_EINVAL);
    assert_int_equal(cx_stats(E, NULL), CX_EINVAL);
    assert_int_equal(cx_connect(NULL, P.url, 100), CX_EINVAL);
    assert_int_equal(cx_connect(E, NULL, 100), CX_EINVAL);
    assert_int_equal(cx_register_memory(NULL, R, 16), CX_EINVAL);
    assert_int_equal(cx_register_memory(E, NULL, 16), CX_EINVAL);
    assert_int_equal(cx_register_memory(E, R, 0), CX_EINVAL);
    assert_int_equal(cx_unregister_memory(NULL, R), CX_EINVAL);
    assert_int_equal(cx_unregister_memory(E, NULL), CX_EINVAL);
    assert_int_equal(cx_peer_state(NULL, P.lid), CX_PEER_UNKNOWN);
    assert_int_equal(cx_peer_state(E, NULL), CX_PEER_UNKNOWN);
    assert_null(cx_peer_backend(NULL, P.lid));
    assert_null(cx_peer_backend(E, NULL));
    cx_msg_release(NULL);
    cx_engine_destroy(NULL);
    assert_non_null(cx_strerror(12345));
    /* An empty message with no buffer is a valid message. */
    assert_int_equal(cx_send_msg(E, P.lid, NULL, 0), CX_OK);
    char line[256];
    assert_int_equal(cxt_peer_expect(&P, "MSG ", 5000, line, sizeof line), 0);
    still_works();
}

static void test_bad_engine_config(void **state)
{
    (void)state;
    cx_engine_t *e = (cx_engine_t *)0x1;
    cx_config_t c;
    memset(&c, 0, sizeof c);
    assert_int_equal(cx_engine_create(NULL, &e), CX_EINVAL);
    c.model = "ok";
    assert_int_equal(cx_engine_create(&c, NULL), CX_EINVAL);
    static const char *models[] = { NULL,  "",    "bad model",
                                    "a|b", "x#y", "0123456789012345678901234567890123456789012345678901234567890123" };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        c.model = models[i];
        e = NULL;
        int rc = cx_engine_create(&c, &e);
        if (rc != CX_EINVAL) fail_msg("model '%s' accepted (%d)", models[i] ? models[i] : "(null)", rc);
        assert_null(e);
    }
    c.model = "ok";
    c.listen_ip = "localhost";
    assert_int_equal(cx_engine_create(&c, &e), CX_EINVAL);
    c.listen_ip = "127.0.0.1";
    c.port = P.port; /* taken */
    e = NULL;
    int rc = cx_engine_create(&c, &e);
    if (rc == CX_OK) {
        cx_engine_destroy(e);
        fail_msg("two engines bound one port");
    }
    c.port = 0;
    still_works();                   /* failed creates closed nothing of E's */
    if (!getenv("CONNEX_BACKEND")) { /* the environment overrides cfg.backend */
        c.backend = "nosuchbackend";
        e = NULL;
        rc = cx_engine_create(&c, &e);
        if (rc != CX_EINVAL && rc != CX_EUNSUPPORTED) fail_msg("backend 'nosuchbackend': %s", cx_strerror(rc));
        assert_null(e);
    }
}

static void test_registration_errors(void **state)
{
    (void)state;
    assert_int_equal(cx_register_memory(E, R, RS), CX_EINVAL);            /* duplicate */
    assert_int_equal(cx_register_memory(E, R + 4096, 4096), CX_EINVAL);   /* inside */
    assert_int_equal(cx_register_memory(E, R + RS - 1, 4096), CX_EINVAL); /* overlaps the end */
    uint8_t *x = malloc(4096);
    assert_non_null(x);
    assert_int_equal(cx_unregister_memory(E, x), CX_EINVAL);     /* never registered */
    assert_int_equal(cx_unregister_memory(E, R + 1), CX_EINVAL); /* not a region start */
    assert_int_equal(cx_register_memory(E, x, 4096), CX_OK);
    cx_stats_t st;
    assert_int_equal(cx_stats(E, &st), CX_OK);
    assert_int_equal(st.regions, 2);
    assert_int_equal(st.registered_bytes, RS + 4096);
    assert_int_equal(cx_unregister_memory(E, x), CX_OK);
    assert_int_equal(cx_unregister_memory(E, x), CX_EINVAL); /* twice */
    assert_int_equal(cx_stats(E, &st), CX_OK);
    assert_int_equal(st.regions, 1);
    assert_int_equal(st.registered_bytes, RS);
    /* The peer cannot reach the region we dropped. */
    char rep[128], lid[CX_URL_MAX];
    cx_url_t u;
    assert_int_equal(cx_url_parse(cx_engine_local_url(E), &u, NULL, 0), CX_OK);
    cx_lid_format(&u.lid, lid, sizeof lid);
    int rc = cxt_peer_cmd(&P, 10000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 64 0", lid, (uintptr_t)x);
    if (rc != CX_EINVAL) fail_msg("peer read of an unregistered region: '%s', expected ERR -4", rep);
    free(x);
    still_works();
}

/* Raw TCP to a control port, send bytes, close. Returns 0 when the bytes went out. */
static int poke(uint16_t port, const void *buf, size_t len, int linger_ms)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (connect(s, (struct sockaddr *)&a, sizeof a)) {
        close(s);
        return -1;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t k = send(s, (const uint8_t *)buf + off, len - off, MSG_NOSIGNAL);
        if (k <= 0) break; /* the engine may cut us off: that is a fine answer */
        off += (size_t)k;
    }
    if (linger_ms) {
        struct pollfd pf = { .fd = s, .events = POLLIN };
        poll(&pf, 1, linger_ms);
    }
    close(s);
    return 0;
}

static uint16_t port_of(const char *url)
{
    cx_url_t u;
    return cx_url_parse(url, &u, NULL, 0) ? 0 : u.port;
}

static void test_garbage_on_control_port(void **state)
{
    (void)state;
    uint16_t ports[2] = { port_of(cx_engine_local_url(E)), P.port };
    cx_stats_t st0;
    assert_int_equal(cx_stats(E, &st0), CX_OK);
    uint8_t rnd[65536];
    srand(99);
    for (size_t i = 0; i < sizeof rnd; i++) rnd[i] = (uint8_t)rand();
    /* Frame headers: u32 length, u8 type, u8 version, u16 reserved. */
    uint8_t huge[8] = { 0xff, 0xff, 0xff, 0xff, 1, 1, 0, 0 }; /* 4 GiB HELLO */
    uint8_t big[8] = { 0, 0, 0, 4, 1, 1, 0, 0 };              /* 64 MiB, then nothing */
    uint8_t badver[8] = { 16, 0, 0, 0, 1, 99, 0, 0 };
    uint8_t badtype[24] = { 16, 0, 0, 0, 200, 1, 0, 0 };
    uint8_t shorthello[24] = { 16, 0, 0, 0, 1, 1, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0xff, 0xff, 0xff, 0xff };
    uint8_t hb_first[8] = { 0, 0, 0, 0, 7, 1, 0, 0 }; /* heartbeat before HELLO */
    uint8_t bye_first[8] = { 0, 0, 0, 0, 8, 1, 0, 0 };
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int k = 0; k < 2; k++) {
        uint16_t port = ports[k];
        assert_true(port != 0);
        assert_int_equal(poke(port, rnd, sizeof rnd, 0), 0);
        assert_int_equal(poke(port, rnd, 7, 50), 0);
        assert_int_equal(poke(port, huge, sizeof huge, 100), 0);
        assert_int_equal(poke(port, big, sizeof big, 0), 0);
        assert_int_equal(poke(port, badver, sizeof badver, 100), 0);
        assert_int_equal(poke(port, badtype, sizeof badtype, 100), 0);
        assert_int_equal(poke(port, shorthello, sizeof shorthello, 100), 0);
        assert_int_equal(poke(port, hb_first, sizeof hb_first, 100), 0);
        assert_int_equal(poke(port, bye_first, sizeof bye_first, 100), 0);
        assert_int_equal(poke(port, http, strlen(http), 100), 0);
        assert_int_equal(poke(port, "", 0, 0), 0); /* connect, close */
        for (int i = 0; i < 50; i++) assert_int_equal(poke(port, rnd + i * 16, 16 + (size_t)i, 0), 0);
    }
    /* A connection that says nothing and stays open must not block anyone else. */
    int idle = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons(ports[0]),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    assert_int_equal(connect(idle, (struct sockaddr *)&a, sizeof a), 0);
    still_works();
    /* A new peer can still connect to us while the idle connection is open. */
    cxt_peer_t q;
    cxt_peer_opts_t o = { .replica = 2, .region = 4096, .seed = 1, .connect = cx_engine_local_url(E) };
    assert_int_equal(cxt_peer_start(&q, &o, 10000), 0);
    int rc = cxt_wait_event(E, q.lid, CX_EVENT_UP, 5000, NULL, NULL);
    cxt_peer_stop(&q);
    close(idle);
    if (rc) fail_msg("a new peer could not connect after the garbage");
    /* The peer processes survived too. */
    assert_int_equal(kill(P.pid, 0), 0);
    cx_stats_t st;
    assert_int_equal(cx_stats(E, &st), CX_OK);
    assert_int_equal(st.peers_up >= 1, 1);
    fprintf(stderr, "after garbage: rejected_requests=%" PRIu64 " peer_failures=%" PRIu64 "\n", st.rejected_requests,
            st.peer_failures);
    assert_int_equal(st.peer_failures, st0.peer_failures); /* garbage is not a peer failing */
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unregistered_local, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_remote_out_of_range, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_zero_length, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_unknown_peer, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_malformed_urls, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_null_args, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_registration_errors, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_garbage_on_control_port, cxt_watchdog_setup, cxt_watchdog_teardown),
        /* Last: a create that fails must not disturb the live engine (if it does, only this
         * case and the teardown see it). */
        cmocka_unit_test_setup_teardown(test_bad_engine_config, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    /* CXT_FILTER=test_name (wildcards allowed) runs a subset. */
    if (getenv("CXT_FILTER")) cmocka_set_test_filter(getenv("CXT_FILTER"));
    return cxt_run_tests(tests, group_setup, group_teardown);
}
