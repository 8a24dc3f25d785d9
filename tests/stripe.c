/* libfabric multi-rail striping (backends/libfabric/fi_rail.c) on a host without RDMA NICs: the
 * tcp provider's domains are interfaces, so two rails are two interfaces. The test moves into a
 * network namespace of its own (unshare), with `lo` and a veth pair (cxs0 10.215.0.1, cxs1
 * 10.215.0.2), and runs two engines there with CONNEX_FI_RAILS=lo,cxs0: each opens one domain,
 * CQ, AV and endpoint per rail.
 *   test_stripes_both_rails: the pair's transport names both rails; 16 MiB writes and reads
 *     each way complete byte for byte, and at engine close the per-rail counters (info log)
 *     show that both rails carried bytes of the striped ops, and a 64 KiB op went over one.
 *   test_stripe_failure: CONNEX_FI_FAULT_RAIL=1:3 fails the third stripe sent on rail 1 as a
 *     transport error there: that 16 MiB write fails with an error that is not CX_EPEER (the
 *     peer is alive), the peer never becomes FAILED, and the next write on the pair completes
 *     byte for byte once the core has reconnected it.
 * Needs root and network namespaces (cxt_skip "root" / "netns" otherwise). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxt.h"

#define BIG (16u << 20)
#define SMALL (64u << 10)

static int g_net_ok;
static const char *g_skip_cap, *g_skip_why;

/* Our own namespace: lo up, a veth pair with an address on each end, both running. */
static int setup_net(void)
{
    if (unshare(CLONE_NEWNET)) {
        perror("stripe: unshare(CLONE_NEWNET)");
        return -1;
    }
    if (cxt_sh("ip link set lo up") || cxt_sh("ip link add cxs0 type veth peer name cxs1") ||
        cxt_sh("ip addr add 10.215.0.1/24 dev cxs0") || cxt_sh("ip addr add 10.215.0.2/24 dev cxs1") ||
        cxt_sh("ip link set cxs0 up") || cxt_sh("ip link set cxs1 up"))
        return -1;
    for (int i = 0; i < 300; i++) {
        if (system("ip -o link show dev cxs0 | grep -q LOWER_UP") == 0) return 0;
        usleep(10000);
    }
    fprintf(stderr, "stripe: the veth pair has no carrier after 3 s\n");
    return -1;
}

static cx_engine_t *engine(const char *model, const char *fault)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.listen_ip = "127.0.0.1";
    c.heartbeat_ms = 200;
    c.heartbeat_timeout_ms = 5000;
    c.op_timeout_ms = 20000;
    if (fault)
        setenv("CONNEX_FI_FAULT_RAIL", fault, 1);
    else
        unsetenv("CONNEX_FI_FAULT_RAIL");
    cx_engine_t *e = NULL;
    int rc = cx_engine_create(&c, &e);
    unsetenv("CONNEX_FI_FAULT_RAIL");
    if (rc) fail_msg("engine %s: %s", model, cx_strerror(rc));
    return e;
}

typedef struct pair {
    cx_engine_t *a, *b;
    char lid_a[CX_URL_MAX], lid_b[CX_URL_MAX];
    uint8_t *buf_a, *buf_b;
} pair_t;

static void lid_of(cx_engine_t *e, char *out)
{
    cx_url_t u;
    assert_int_equal(cx_url_parse(cx_engine_local_url(e), &u, NULL, 0), 0);
    cx_lid_format(&u.lid, out, CX_URL_MAX);
}

static void pair_open(pair_t *p, const char *fault)
{
    memset(p, 0, sizeof *p);
    p->a = engine("stripe-a", fault);
    p->b = engine("stripe-b", NULL);
    lid_of(p->a, p->lid_a);
    lid_of(p->b, p->lid_b);
    p->buf_a = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p->buf_b = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p->buf_a != MAP_FAILED && p->buf_b != MAP_FAILED);
    assert_int_equal(cx_register_memory(p->a, p->buf_a, BIG), 0);
    assert_int_equal(cx_register_memory(p->b, p->buf_b, BIG), 0);
    int rc = cx_connect(p->a, cx_engine_local_url(p->b), 15000);
    if (rc) fail_msg("connect: %s", cx_strerror(rc));
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(p->b, p->lid_a, CX_EVENT_UP, 15000, &ev, NULL), 0);
    assert_string_equal(cx_peer_backend(p->a, p->lid_b), "libfabric");
    cx_peer_info_t pi[4];
    int n = cx_peer_list(p->a, pi, 4);
    assert_int_equal(n, 1);
    fprintf(stderr, "stripe: pair over %s\n", pi[0].transport);
    if (!strstr(pi[0].transport, "/lo+cxs0")) fail_msg("the pair runs over %s, not both rails", pi[0].transport);
}

static void pair_close(pair_t *p)
{
    assert_int_equal(cx_unregister_memory(p->a, p->buf_a), 0);
    assert_int_equal(cx_unregister_memory(p->b, p->buf_b), 0);
    cx_engine_destroy(p->b);
    munmap(p->buf_a, BIG);
    munmap(p->buf_b, BIG);
}

/* A writes its pattern `seed` into B at offset 0, len bytes, and checks them there. */
static int write_checked(pair_t *p, uint32_t seed, size_t len)
{
    cxt_fill(p->buf_a, len, seed, 0);
    memset(p->buf_b, 0, len);
    int rc = cx_write(p->a, p->lid_b, p->buf_a, (uint64_t)(uintptr_t)p->buf_b, len);
    if (rc == CX_OK) assert_int_equal(cxt_check(p->buf_b, len, seed, 0), -1);
    return rc;
}

static void read_checked(pair_t *p, cx_engine_t *by, uint8_t *dst, uint8_t *src, const char *lid, uint32_t seed)
{
    cxt_fill(src, BIG, seed, 0);
    memset(dst, 0, BIG);
    int rc = cx_read(by, lid, dst, (uint64_t)(uintptr_t)src, BIG);
    if (rc) fail_msg("16 MiB read: %s", cx_strerror(rc));
    assert_int_equal(cxt_check(dst, BIG, seed, 0), -1);
    (void)p;
}

/* Destroys A with its stderr in a file, and returns each rail's byte count from the close log. */
static void destroy_counting(cx_engine_t *a, unsigned long long bytes[2], unsigned long long xfers[2])
{
    char path[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/cx-stripe-%d.log", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    fflush(stderr);
    int saved = dup(2);
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    cx_engine_destroy(a);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    bytes[0] = bytes[1] = xfers[0] = xfers[1] = 0;
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1024];
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        const char *r = strstr(line, "libfabric: rail ");
        int i;
        char dom[64];
        unsigned long long by, xf;
        if (r && sscanf(r, "libfabric: rail %d (%63[^)]): %llu bytes in %llu transfers", &i, dom, &by, &xf) == 4 &&
            i >= 0 && i < 2) {
            bytes[i] = by;
            xfers[i] = xf;
            seen |= 1 << i;
            fprintf(stderr, "stripe: rail %d (%s): %llu bytes in %llu transfers\n", i, dom, by, xf);
        }
    }
    fclose(f);
    unlink(path);
    assert_int_equal(seen, 3);
}

static void test_stripes_both_rails(void **state)
{
    (void)state;
    if (!g_net_ok) cxt_skip(g_skip_cap, "stripe: %s", g_skip_why);
    pair_t p;
    pair_open(&p, NULL);
    assert_int_equal(write_checked(&p, 11, BIG), CX_OK);
    read_checked(&p, p.a, p.buf_a, p.buf_b, p.lid_b, 12);
    /* and the other way: B's ops are striped by its own rails */
    cxt_fill(p.buf_b, BIG, 13, 0);
    memset(p.buf_a, 0, BIG);
    assert_int_equal(cx_write(p.b, p.lid_a, p.buf_b, (uint64_t)(uintptr_t)p.buf_a, BIG), 0);
    assert_int_equal(cxt_check(p.buf_a, BIG, 13, 0), -1);
    read_checked(&p, p.b, p.buf_b, p.buf_a, p.lid_a, 14);
    /* below CONNEX_STRIPE_MIN: one rail */
    assert_int_equal(write_checked(&p, 15, SMALL), CX_OK);
    unsigned long long by[2], xf[2];
    cx_engine_t *a = p.a;
    assert_int_equal(cx_unregister_memory(p.a, p.buf_a), 0);
    assert_int_equal(cx_unregister_memory(p.b, p.buf_b), 0);
    cx_engine_destroy(p.b);
    destroy_counting(a, by, xf);
    munmap(p.buf_a, BIG);
    munmap(p.buf_b, BIG);
    /* A's striped write and read: half of 32 MiB on each rail; the small write on one of them. */
    assert_true(by[0] >= BIG - (1u << 20) && by[1] >= BIG - (1u << 20));
    assert_int_equal(by[0] + by[1], 2ull * BIG + SMALL);
    assert_int_equal(xf[0] + xf[1], 5);
}

static void test_stripe_failure(void **state)
{
    (void)state;
    if (!g_net_ok) cxt_skip(g_skip_cap, "stripe: %s", g_skip_why);
    pair_t p;
    pair_open(&p, "1:3");
    assert_int_equal(write_checked(&p, 21, BIG), CX_OK);  /* rail 1: stripe 1 */
    read_checked(&p, p.a, p.buf_a, p.buf_b, p.lid_b, 22); /* stripe 2 */
    int rc = write_checked(&p, 23, BIG);                  /* stripe 3 fails */
    fprintf(stderr, "stripe: the write with a failed stripe: %s\n", cx_strerror(rc));
    assert_int_not_equal(rc, CX_OK);
    assert_int_not_equal(rc, CX_EPEER); /* the peer is alive: not its failure */
    /* The next write on the pair works once the core has probed the peer and reconnected. */
    uint64_t t0 = cxt_now_ns();
    int tries = 0;
    do {
        rc = write_checked(&p, 24, BIG);
        tries++;
        if (rc != CX_OK) usleep(100000);
    } while (rc != CX_OK && cxt_ms_since(t0) < 20000);
    fprintf(stderr, "stripe: next write %s after %d tries, %.0f ms\n", cx_strerror(rc), tries, cxt_ms_since(t0));
    assert_int_equal(rc, CX_OK);
    read_checked(&p, p.a, p.buf_a, p.buf_b, p.lid_b, 25);
    assert_int_not_equal(cx_peer_state(p.a, p.lid_b), CX_PEER_FAILED);
    unsigned seen = 0;
    cx_event_t ev;
    (void)cxt_wait_event(p.a, p.lid_b, CX_EVENT_FAILED, 200, &ev, &seen);
    assert_false(seen & (1u << CX_EVENT_FAILED));
    pair_close(&p);
    cx_engine_destroy(p.a);
}

int main(void)
{
    g_skip_why = cxt_netns_why_skip(&g_skip_cap);
    if (!g_skip_why) {
        g_net_ok = setup_net() == 0;
        if (!g_net_ok) {
            g_skip_cap = "netns";
            g_skip_why = "could not set up the namespace's interfaces";
        }
    }
    setenv("CONNEX_BACKEND", "libfabric", 1);
    setenv("CONNEX_FI_PROVIDER", "tcp;ofi_rxm", 1);
    setenv("CONNEX_FI_RAILS", "lo,cxs0", 1);
    setenv("CONNEX_LOG", "info", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stripes_both_rails, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_stripe_failure, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    return cxt_run_tests(tests, NULL, NULL);
}
