/* Listening on every interface: an engine with listen_ip 0.0.0.0 advertises a routable address
 * (core/src/advertise.h), and a peer reaches it through that address: connect by the URL, UP on
 * both sides, a write and a read in each direction with the bytes checked. Run once per backend
 * variant (tests/CMakeLists.txt), so that each backend's address blob is the advertised one too.
 *   test_loopback_advertised: CONNEX_ADVERTISE_IP=127.0.0.1, the peer on 127.0.0.1.
 *   test_ipv6_loopback_advertised: the same on ::, advertising ::1.
 *   test_default_advertised: without it, the URL carries an interface address, not 0.0.0.0.
 *   test_netns_advertised: the peer in a network namespace of its own, joined to ours by a veth
 *     pair (both created here, removed at the end); CONNEX_ADVERTISE_IP is our veth end's
 *     address. Needs root, iproute2 and `ip netns add` (cxt_skip "root" / "netns" otherwise). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "advertise.h"
#include "cxt.h"

#define RS (1u << 20)

static char g_ns[32], g_va[16], g_vb[16], g_ip_a[32], g_ip_b[32];
static int g_have_ns;

/* A veth pair, our end 10.214.N.1, the namespace's 10.214.N.2, both running (LOWER_UP: UCX
 * lists only running interfaces). */
static int setup_net(void)
{
    int id = (int)(getpid() % 200) + 20;
    for (int i = 0; i < 200; i++, id = id >= 219 ? 20 : id + 1) {
        char probe[96];
        snprintf(probe, sizeof probe, "ip -o addr show 2>/dev/null | grep -q ' 10\\.214\\.%d\\.'", id);
        if (system(probe) != 0) break;
    }
    snprintf(g_ns, sizeof g_ns, "cxadv%d", (int)getpid());
    snprintf(g_va, sizeof g_va, "cxaa%d", (int)getpid() % 100000);
    snprintf(g_vb, sizeof g_vb, "cxab%d", (int)getpid() % 100000);
    snprintf(g_ip_a, sizeof g_ip_a, "10.214.%d.1", id);
    snprintf(g_ip_b, sizeof g_ip_b, "10.214.%d.2", id);
    if (cxt_sh("ip netns add %s", g_ns)) return -1;
    g_have_ns = 1;
    if (cxt_sh("ip link add %s type veth peer name %s", g_va, g_vb) || cxt_sh("ip link set %s netns %s", g_vb, g_ns) ||
        cxt_sh("ip addr add %s/24 dev %s", g_ip_a, g_va) || cxt_sh("ip link set %s up", g_va) ||
        cxt_sh("ip -n %s addr add %s/24 dev %s", g_ns, g_ip_b, g_vb) || cxt_sh("ip -n %s link set %s up", g_ns, g_vb) ||
        cxt_sh("ip -n %s link set lo up", g_ns))
        return -1;
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "ip -o link show dev %s | grep -q LOWER_UP && ip -n %s -o link show dev %s | grep -q LOWER_UP", g_va, g_ns,
             g_vb);
    for (int i = 0; i < 300; i++) {
        if (system(cmd) == 0) return 0;
        usleep(10000);
    }
    fprintf(stderr, "advertise: the veth pair has no carrier after 3 s\n");
    return -1;
}

static void teardown_net(void)
{
    if (!g_have_ns) return;
    cxt_sh("ip link del %s 2>/dev/null || true", g_va); /* removes both ends */
    cxt_sh("ip netns del %s", g_ns);
    g_have_ns = 0;
}

/* An engine listening on `listen` (0.0.0.0 or ::), with CONNEX_ADVERTISE_IP=adv (NULL: unset)
 * for its create only: the peers started later must not inherit it. */
static cx_engine_t *wildcard_engine_on(const char *listen, const char *model, const char *adv)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.listen_ip = listen;
    c.heartbeat_ms = 200;
    c.heartbeat_timeout_ms = 2000;
    c.op_timeout_ms = 10000;
    if (adv)
        setenv("CONNEX_ADVERTISE_IP", adv, 1);
    else
        unsetenv("CONNEX_ADVERTISE_IP");
    cx_engine_t *e = NULL;
    int rc = cx_engine_create(&c, &e);
    unsetenv("CONNEX_ADVERTISE_IP");
    if (rc) fail_msg("engine on %s (advertising %s): %s", listen, adv ? adv : "the default", cx_strerror(rc));
    return e;
}

static cx_engine_t *wildcard_engine(const char *model, const char *adv)
{
    return wildcard_engine_on("0.0.0.0", model, adv);
}

/* The URL's host is `host`: "host:port#..." (IPv4 only here). */
static void assert_url_host(const char *url, const char *host)
{
    size_t n = strlen(host);
    if (strncmp(url, host, n) || url[n] != ':') fail_msg("URL %s does not advertise %s", url, host);
}

/* The peer (started with o) connects to e by its URL; both see UP; it writes into our region
 * and reads from it, we read from its region; every byte checked. */
static void pair_through_url(cx_engine_t *e, cxt_peer_opts_t *o)
{
    const char *url = cx_engine_local_url(e);
    cx_url_t u;
    assert_int_equal(cx_url_parse(url, &u, NULL, 0), 0);
    char lid[CX_URL_MAX];
    cx_lid_format(&u.lid, lid, sizeof lid);
    uint8_t *buf = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(buf != MAP_FAILED);
    cxt_fill(buf, RS, 7, 0);
    assert_int_equal(cx_register_memory(e, buf, RS), 0);

    cxt_peer_t p;
    o->region = RS;
    o->seed = 42;
    assert_int_equal(cxt_peer_start(&p, o, 10000), 0);
    char rep[256], line[512];
    int rc = cxt_peer_cmd(&p, 15000, rep, sizeof rep, "CONNECT %s 10000", url);
    if (rc) fail_msg("peer: connect to %s: %s (%s)", url, cx_strerror(rc), rep);
    if (cxt_peer_expect(&p, "EVENT up ", 10000, line, sizeof line)) fail_msg("peer: no UP for %s", url);
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_UP, 10000, &ev, NULL), 0);

    /* the peer writes its bytes [0, 4096) at our offset 8192, then reads our [65536, +4096) */
    rc = cxt_peer_cmd(&p, 15000, rep, sizeof rep, "WRITE %s 0x%" PRIxPTR " 4096 0", lid, (uintptr_t)buf + 8192);
    if (rc) fail_msg("peer: write to %s: %s (%s)", url, cx_strerror(rc), rep);
    assert_int_equal(cxt_check(buf + 8192, 4096, 42, 0), -1);
    rc = cxt_peer_cmd(&p, 15000, rep, sizeof rep, "READ %s 0x%" PRIxPTR " 4096 65536", lid, (uintptr_t)buf + 65536);
    if (rc) fail_msg("peer: read from %s: %s (%s)", url, cx_strerror(rc), rep);
    char want[32];
    snprintf(want, sizeof want, "%" PRIx64, cxt_hash(buf + 65536, 4096));
    if (!strstr(rep, want)) fail_msg("peer: read from %s: hash %s, want %s", url, rep, want);
    /* and this side reads the peer */
    assert_int_equal(cx_read(e, p.lid, buf, p.base + 4096, 4096), 0);
    assert_int_equal(cxt_check(buf, 4096, 42, 4096), -1);
    const char *be = cx_peer_backend(e, p.lid);
    fprintf(stderr, "advertise: %s reached through %s over %s\n", p.lid, url, be ? be : "?");

    cxt_peer_stop(&p);
    assert_int_equal(cx_unregister_memory(e, buf), 0);
    munmap(buf, RS);
}

static void test_loopback_advertised(void **state)
{
    (void)state;
    cx_engine_t *e = wildcard_engine("adv-lo", "127.0.0.1");
    assert_url_host(cx_engine_local_url(e), "127.0.0.1");
    cxt_peer_opts_t o = { .model = "adv-lo-peer", .replica = 1 };
    pair_through_url(e, &o);
    cx_engine_destroy(e);
}

/* The IPv6 wildcard: URL "[::1]:port#...", a peer on ::1 connects by it. */
static void test_ipv6_loopback_advertised(void **state)
{
    (void)state;
    cx_engine_t *e = wildcard_engine_on("::", "adv-lo6", "::1");
    const char *url = cx_engine_local_url(e);
    if (strncmp(url, "[::1]:", 6)) fail_msg("URL %s does not advertise [::1]", url);
    cxt_peer_opts_t o = { .model = "adv-lo6-peer", .replica = 3, .listen_ip = "::1" };
    pair_through_url(e, &o);
    cx_engine_destroy(e);
}

static void test_default_advertised(void **state)
{
    (void)state;
    char want[CX_IP_MAX];
    static cx_opts_t o;
    assert_int_equal(cx_opts_load(&o), CX_OK);
    assert_int_equal(cx_advertise_resolve(&o, "0.0.0.0", NULL, want, sizeof want), 0);
    assert_false(cx_ip_is_wildcard(want));
    cx_engine_t *e = wildcard_engine("adv-default", NULL);
    assert_url_host(cx_engine_local_url(e), want);
    cx_engine_destroy(e);
}

static void test_netns_advertised(void **state)
{
    (void)state;
    const char *cap, *skip_why = cxt_netns_why_skip(&cap);
    if (skip_why) cxt_skip(cap, "advertise: %s", skip_why);
    assert_int_equal(setup_net(), 0);
    cx_engine_t *e = wildcard_engine("adv-ns", g_ip_a);
    assert_url_host(cx_engine_local_url(e), g_ip_a);
    /* The peer sees only its veth end: it can reach us through the advertised address alone. */
    cxt_peer_opts_t o = {
        .model = "adv-ns-peer", .replica = 2, .listen_ip = g_ip_b, .netns = g_ns, .net_devices = g_vb
    };
    pair_through_url(e, &o);
    cx_engine_destroy(e);
    teardown_net();
}

static int teardown(void **state)
{
    teardown_net();
    return cxt_watchdog_teardown(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_loopback_advertised, cxt_watchdog_setup, teardown),
        cmocka_unit_test_setup_teardown(test_ipv6_loopback_advertised, cxt_watchdog_setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_advertised, cxt_watchdog_setup, teardown),
        cmocka_unit_test_setup_teardown(test_netns_advertised, cxt_watchdog_setup, teardown),
    };
    return cxt_run_tests(tests, NULL, NULL);
}
