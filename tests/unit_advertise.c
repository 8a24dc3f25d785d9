/* The advertised address (core/src/advertise.h): the interface chooser on made-up interface
 * lists, the order of config field, CONNEX_ADVERTISE_IP and listen address, and a bad
 * CONNEX_ADVERTISE_IP refused at engine create with a log line naming it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "advertise.h"
#include "connex/connex.h"

#define IF4(n, a, up, lo, def)     \
    {                              \
        n, a, AF_INET, up, lo, def \
    }
#define IF6(n, a, up, lo, def)      \
    {                               \
        n, a, AF_INET6, up, lo, def \
    }

/* The directory for scratch files: $TMPDIR, else the system's (P_tmpdir). */
static const char *tmp_base(void)
{
    const char *t = getenv("TMPDIR");
    return t && *t ? t : P_tmpdir;
}

static const char *choose(const cx_ifaddr_t *ifs, int n, const char *listen)
{
    static char out[CX_IP_MAX];
    cx_advertise_choose(ifs, n, listen, out, sizeof out);
    return out;
}

static void test_default_route_wins(void **state)
{
    (void)state;
    const cx_ifaddr_t ifs[] = { IF4("lo", "127.0.0.1", 1, 1, 0), IF4("docker0", "172.17.0.1", 1, 0, 0),
                                IF4("eth0", "10.1.2.3", 1, 0, 1), IF4("eth1", "192.168.5.5", 1, 0, 0) };
    assert_string_equal(choose(ifs, 4, "0.0.0.0"), "10.1.2.3");
}

static void test_first_up_non_loopback(void **state)
{
    (void)state;
    /* no default route: the first UP non-loopback address; a down one and loopback are passed */
    const cx_ifaddr_t ifs[] = { IF4("lo", "127.0.0.1", 1, 1, 1), IF4("eth0", "10.1.2.3", 0, 0, 0),
                                IF4("eth1", "192.168.5.5", 1, 0, 0), IF4("eth2", "192.168.6.6", 1, 0, 0) };
    assert_string_equal(choose(ifs, 4, "0.0.0.0"), "192.168.5.5");
    /* a default route on a down interface does not count */
    const cx_ifaddr_t down[] = { IF4("eth0", "10.1.2.3", 0, 0, 1), IF4("eth1", "192.168.5.5", 1, 0, 0) };
    assert_string_equal(choose(down, 2, "0.0.0.0"), "192.168.5.5");
}

static void test_loopback_when_nothing_else(void **state)
{
    (void)state;
    const cx_ifaddr_t ifs[] = { IF4("lo", "127.0.0.1", 1, 1, 0), IF4("eth0", "10.1.2.3", 0, 0, 1) };
    assert_string_equal(choose(ifs, 2, "0.0.0.0"), "127.0.0.1");
    assert_string_equal(choose(NULL, 0, "0.0.0.0"), "127.0.0.1");
    assert_string_equal(choose(NULL, 0, "::"), "::1");
}

static void test_families(void **state)
{
    (void)state;
    const cx_ifaddr_t ifs[] = { IF6("eth0", "fe80::1", 1, 0, 1), IF4("eth0", "10.1.2.3", 1, 0, 1),
                                IF6("eth1", "2001:db8::5", 1, 0, 0), IF6("lo", "::1", 1, 1, 0) };
    /* 0.0.0.0: IPv4 only */
    assert_string_equal(choose(ifs, 4, "0.0.0.0"), "10.1.2.3");
    /* ::: IPv6 first, never link-local (it needs a scope), even on the default-route interface */
    assert_string_equal(choose(ifs, 4, "::"), "2001:db8::5");
    /* ::: IPv4 when no usable IPv6 address (a socket on :: takes IPv4 too) */
    assert_string_equal(choose(ifs, 2, "::"), "10.1.2.3");
}

static const char *resolve(const char *listen, const char *want, int *rc)
{
    static char out[CX_IP_MAX];
    out[0] = 0;
    static cx_opts_t o;
    (void)cx_opts_load(&o);
    *rc = cx_advertise_resolve(&o, listen, want, out, sizeof out);
    return out;
}

static void test_resolve_order(void **state)
{
    (void)state;
    int rc;
    unsetenv("CONNEX_ADVERTISE_IP");
    assert_string_equal(resolve("10.9.9.9", NULL, &rc), "10.9.9.9"); /* the listen address */
    assert_int_equal(rc, CX_OK);
    const char *w = resolve("0.0.0.0", NULL, &rc); /* an interface's */
    assert_int_equal(rc, CX_OK);
    assert_false(cx_ip_is_wildcard(w));
    setenv("CONNEX_ADVERTISE_IP", "10.4.4.4", 1);
    assert_string_equal(resolve("0.0.0.0", NULL, &rc), "10.4.4.4"); /* the variable wins */
    assert_int_equal(rc, CX_OK);
    assert_string_equal(resolve("127.0.0.1", NULL, &rc), "10.4.4.4"); /* over a listen address too */
    assert_string_equal(resolve("::", NULL, &rc), "10.4.4.4");        /* :: takes IPv4 */
    assert_int_equal(rc, CX_OK);
    assert_string_equal(resolve("0.0.0.0", "10.5.5.5", &rc), "10.5.5.5"); /* the config field first */
    assert_int_equal(rc, CX_OK);
    setenv("CONNEX_ADVERTISE_IP", "2001:db8::7", 1);
    assert_string_equal(resolve("::", NULL, &rc), "2001:db8::7");
    assert_int_equal(rc, CX_OK);
    unsetenv("CONNEX_ADVERTISE_IP");
}

static void test_resolve_refuses(void **state)
{
    (void)state;
    static const char *bad[] = { "myhost", "10.1.2", "0.0.0.0", "::", "10.1.2.3 ", "[::1]" };
    int rc;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("CONNEX_ADVERTISE_IP", bad[i], 1);
        resolve("0.0.0.0", NULL, &rc);
        assert_int_equal(rc, CX_EINVAL);
        unsetenv("CONNEX_ADVERTISE_IP");
        resolve("0.0.0.0", bad[i], &rc);
        assert_int_equal(rc, CX_EINVAL);
    }
    resolve("0.0.0.0", "2001:db8::1", &rc); /* IPv6 for an IPv4 listener */
    assert_int_equal(rc, CX_EINVAL);
    resolve("2001:db8::2", "10.1.1.1", &rc); /* IPv4 for one IPv6 address */
    assert_int_equal(rc, CX_EINVAL);
}

/* Engine create with CONNEX_ADVERTISE_IP=not-an-ip: CX_EINVAL, and stderr names the variable and
 * the value (checked before any backend opens: no backend needed). */
static void test_engine_create_refuses(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/cx_unit_advertise_XXXXXX", tmp_base());
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    dup2(fd, 2);
    setenv("CONNEX_ADVERTISE_IP", "not-an-ip", 1);
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "adv";
    c.listen_ip = "0.0.0.0";
    cx_engine_t *e = (cx_engine_t *)&c;
    int rc = cx_engine_create(&c, &e);
    unsetenv("CONNEX_ADVERTISE_IP");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char log[4096] = "";
    ssize_t n = pread(fd, log, sizeof log - 1, 0);
    close(fd);
    if (n > 0) log[n] = 0;
    assert_int_equal(rc, CX_EINVAL);
    assert_null(e);
    if (!strstr(log, "CONNEX_ADVERTISE_IP='not-an-ip'")) fail_msg("no log line names the variable: [%s]", log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_route_wins),
        cmocka_unit_test(test_first_up_non_loopback),
        cmocka_unit_test(test_loopback_when_nothing_else),
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_resolve_order),
        cmocka_unit_test(test_resolve_refuses),
        cmocka_unit_test(test_engine_create_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
