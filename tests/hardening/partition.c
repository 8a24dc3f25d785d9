/* Partition: the peer runs in a network namespace of its own, joined to ours by a veth pair
 * (both created here, removed at the end). Taking the link down in the middle of a stream of
 * reads gives no RST, only silence: the heartbeat must raise SUSPECT then FAILED within its
 * timeout, every op must return (CX_EPEER or CX_ETIMEDOUT, none hangs), and bringing the link back
 * must let the pair reconnect (JOINED) and transfer correct data again.
 * Needs root, iproute2 (`ip`) and `ip netns add`; skipped (cxt_skip: "root", "netns") otherwise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxt.h"

#define HB_MS 200
#define HBT_MS 1000
#define OP_TIMEOUT_MS 2000
#define RS (4u << 20)

static char g_ns[32], g_va[16], g_vb[16], g_ip_a[32], g_ip_b[32];
static int g_have_ns;

/* `ip link set up` returns before the veth has its carrier; UCX lists only interfaces that are
 * running, so a process started in that gap advertises no address on the veth and cannot be
 * reached over it. Wait (bounded) until both ends say LOWER_UP. */
static int wait_link_running(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "ip -o link show dev %s | grep -q LOWER_UP && ip -n %s -o link show dev %s | grep -q LOWER_UP", g_va, g_ns,
             g_vb);
    for (int i = 0; i < 300; i++) {
        if (system(cmd) == 0) return 0;
        usleep(10000);
    }
    fprintf(stderr, "partition: the veth pair has no carrier after 3 s\n");
    return -1;
}

static int setup_net(void)
{
    /* A /24 of our own: a run that crashed leaves its namespace and veth (and subnet) behind. */
    int id = (int)(getpid() % 200) + 20;
    for (int i = 0; i < 200; i++, id = id >= 219 ? 20 : id + 1) {
        char probe[96];
        snprintf(probe, sizeof probe, "ip -o addr show 2>/dev/null | grep -q ' 10\\.213\\.%d\\.'", id);
        if (system(probe) != 0) break;
    }
    snprintf(g_ns, sizeof g_ns, "cxpart%d", (int)getpid());
    snprintf(g_va, sizeof g_va, "cxpa%d", (int)getpid() % 100000);
    snprintf(g_vb, sizeof g_vb, "cxpb%d", (int)getpid() % 100000);
    snprintf(g_ip_a, sizeof g_ip_a, "10.213.%d.1", id);
    snprintf(g_ip_b, sizeof g_ip_b, "10.213.%d.2", id);
    if (cxt_sh("ip netns add %s", g_ns)) return -1;
    g_have_ns = 1;
    if (cxt_sh("ip link add %s type veth peer name %s", g_va, g_vb) || cxt_sh("ip link set %s netns %s", g_vb, g_ns) ||
        cxt_sh("ip addr add %s/24 dev %s", g_ip_a, g_va) || cxt_sh("ip link set %s up", g_va) ||
        cxt_sh("ip -n %s addr add %s/24 dev %s", g_ns, g_ip_b, g_vb) || cxt_sh("ip -n %s link set %s up", g_ns, g_vb) ||
        cxt_sh("ip -n %s link set lo up", g_ns))
        return -1;
    return wait_link_running();
}

static void teardown_net(void)
{
    if (!g_have_ns) return;
    cxt_sh("ip link del %s 2>/dev/null || true", g_va); /* removes both ends */
    cxt_sh("ip netns del %s", g_ns);
    g_have_ns = 0;
}

/* The peer runs in the namespace through `ip netns exec`, which also gives it the namespace's own
 * /sys (UCX lists its TCP interfaces in /sys/class/net: a process that only setns()ed sees the
 * host's interfaces there and advertises addresses it does not have). */
static int start_peer_in_ns(cxt_peer_t *p, cxt_peer_opts_t *o)
{
    o->netns = g_ns;
    o->net_devices = g_vb; /* its veth only: see survivor_up */
    return cxt_peer_start(p, o, 10000);
}

typedef struct {
    cx_engine_t *e;
    cxt_peer_t *p;
    uint8_t *buf;
    atomic_int stop;
    atomic_long ok, epeer, etimedout, other;
    atomic_long worst_ms; /* longest single op */
} streamer_t;

static void *stream_main(void *arg)
{
    streamer_t *s = arg;
    while (!atomic_load(&s->stop)) {
        uint64_t t0 = cxt_now_ns();
        int rc = cx_read(s->e, s->p->lid, s->buf, s->p->base, 256u << 10);
        long ms = (long)cxt_ms_since(t0);
        if (ms > atomic_load(&s->worst_ms)) atomic_store(&s->worst_ms, ms);
        if (rc == 0)
            atomic_fetch_add(&s->ok, 1);
        else if (rc == CX_EPEER)
            atomic_fetch_add(&s->epeer, 1);
        else if (rc == CX_ETIMEDOUT)
            atomic_fetch_add(&s->etimedout, 1);
        else {
            atomic_fetch_add(&s->other, 1);
            fprintf(stderr, "partition: read: %d\n", rc);
        }
        if (rc) usleep(20000); /* a failed peer answers at once: do not spin */
    }
    return NULL;
}

/* The namespaces, and this process's engine on the veth with one registered buffer (skips the
 * case where namespaces cannot be made). */
static void survivor_up_t(const char *model, uint32_t hb, uint32_t hbt, uint32_t opt, cx_engine_t **e, uint8_t **buf)
{
    const char *cap, *skip_why = cxt_netns_why_skip(&cap);
    if (skip_why) cxt_skip(cap, "partition: %s", skip_why);
    assert_int_equal(setup_net(), 0);
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.listen_ip = g_ip_a;
    c.heartbeat_ms = hb;
    c.heartbeat_timeout_ms = hbt;
    c.op_timeout_ms = opt;
    /* UCX over TCP advertises every interface it lists and may pick a lane the other side
     * cannot reach (this host's lo or eth0 from inside the namespace): both ends use the veth
     * only, as a host with several networks would name its NIC (CONNEX_NET_DEVICES). The peers
     * started later do not inherit it. */
    setenv("CONNEX_NET_DEVICES", g_va, 1);
    int rc = cx_engine_create(&c, e);
    unsetenv("CONNEX_NET_DEVICES");
    assert_int_equal(rc, 0);
    *buf = mmap(NULL, RS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(*buf != MAP_FAILED);
    assert_int_equal(cx_register_memory(*e, *buf, RS), 0);
}

static void survivor_up(const char *model, cx_engine_t **e, uint8_t **buf)
{
    survivor_up_t(model, HB_MS, HBT_MS, OP_TIMEOUT_MS, e, buf);
}

static void test_link_down_then_up(void **state)
{
    (void)state;
    cx_engine_t *e = NULL;
    uint8_t *buf = NULL;
    survivor_up("part", &e, &buf);

    cxt_peer_t p;
    cxt_peer_opts_t o = { .model = "part-peer",
                          .replica = 1,
                          .region = RS,
                          .seed = 42,
                          .listen_ip = g_ip_b,
                          .hb_ms = HB_MS,
                          .hb_timeout_ms = HBT_MS,
                          .op_timeout_ms = OP_TIMEOUT_MS };
    assert_int_equal(start_peer_in_ns(&p, &o), 0);
    assert_int_equal(cx_connect(e, p.url, 5000), 0);
    assert_int_equal(cx_read(e, p.lid, buf, p.base, 4096), 0);
    assert_int_equal(cxt_check(buf, 4096, 42, 0), -1);
    cxt_drain_events(e);

    streamer_t s;
    memset(&s, 0, sizeof s);
    s.e = e;
    s.p = &p;
    s.buf = buf;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stream_main, &s), 0);
    usleep(300000);
    assert_true(atomic_load(&s.ok) > 0);

    /* The peer's side of the cable goes dark: no RST, no FIN, just silence. */
    uint64_t t_down = cxt_now_ns();
    assert_int_equal(cxt_sh("ip -n %s link set %s down", g_ns, g_vb), 0);
    unsigned seen = 0;
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_FAILED, HBT_MS + 2000, &ev, &seen), 0);
    double failed_ms = cxt_ms_since(t_down);
    printf("partition: FAILED %.0f ms after link down (heartbeat timeout %d ms), reason '%s'\n", failed_ms, HBT_MS,
           ev.reason);
    assert_true(seen & (1u << CX_EVENT_SUSPECT)); /* SUSPECT came first */
    assert_true(failed_ms <= HBT_MS + 500);
    /* Ops issued during the partition return too. */
    usleep(500000);
    long failed_ops = atomic_load(&s.epeer) + atomic_load(&s.etimedout);
    assert_true(failed_ops > 0);

    /* Link back: the pair finds itself again. */
    cxt_drain_events(e);
    uint64_t t_up = cxt_now_ns();
    assert_int_equal(cxt_sh("ip -n %s link set %s up", g_ns, g_vb), 0);
    assert_int_equal(wait_link_running(), 0);
    assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_JOINED, 10000, &ev, NULL), 0);
    printf("partition: JOINED %.0f ms after link up\n", cxt_ms_since(t_up));
    atomic_store(&s.stop, 1);
    pthread_join(th, NULL);
    printf("partition: reads ok %ld, CX_EPEER %ld, CX_ETIMEDOUT %ld, other %ld, longest op %ld ms\n",
           atomic_load(&s.ok), atomic_load(&s.epeer), atomic_load(&s.etimedout), atomic_load(&s.other),
           atomic_load(&s.worst_ms));
    assert_int_equal(atomic_load(&s.other), 0);
    assert_true(atomic_load(&s.worst_ms) <= OP_TIMEOUT_MS + 1000); /* no op hung */
    memset(buf, 0, 65536);
    assert_int_equal(cx_read(e, p.lid, buf, p.base + 1000, 65536), 0);
    assert_int_equal(cxt_check(buf, 65536, 42, 1000), -1);

    cxt_peer_stop(&p);
    cx_engine_destroy(e);
    munmap(buf, RS);
    teardown_net();
}

/* What the failover bench does, several times over (libfabric 1.17 crashed in fi_av_remove at
 * the second cycle's FAILED): a stream of reads, the peer's link goes down,
 * heartbeat timeout (FAILED), the peer is killed while the link is still down, the link comes
 * back, the peer restarts under the same identity and port and dials us again (JOINED), data is
 * correct again, and the next cycle repeats on the rejoined peer. Every op must return and this
 * process must survive every cycle. */
#define CYCLES 4

static void test_link_down_kill_restart_cycles(void **state)
{
    (void)state;
    cx_engine_t *e = NULL;
    uint8_t *buf = NULL;
    survivor_up("partc", &e, &buf);

    char me[CX_URL_MAX];
    snprintf(me, sizeof me, "%s", cx_engine_local_url(e));
    cxt_peer_t p;
    cxt_peer_opts_t o = { .model = "partc-peer",
                          .replica = 2,
                          .region = RS,
                          .seed = 77,
                          .listen_ip = g_ip_b,
                          .hb_ms = HB_MS,
                          .hb_timeout_ms = HBT_MS,
                          .op_timeout_ms = OP_TIMEOUT_MS,
                          .connect = me };
    assert_int_equal(start_peer_in_ns(&p, &o), 0);
    assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_UP, 10000, NULL, NULL), 0);
    o.port = p.port; /* every restart: same identity, same port */

    for (int cyc = 0; cyc < CYCLES; cyc++) {
        uint64_t t_cycle = cxt_now_ns();
        streamer_t s;
        memset(&s, 0, sizeof s);
        s.e = e;
        s.p = &p;
        s.buf = buf;
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, stream_main, &s), 0);
        for (int i = 0; i < 100 && atomic_load(&s.ok) < 3; i++) usleep(20000);
        assert_true(atomic_load(&s.ok) > 0);

        /* Link down with reads in flight: FAILED (after SUSPECT) within the heartbeat timeout. */
        cxt_drain_events(e);
        uint64_t t_down = cxt_now_ns();
        assert_int_equal(cxt_sh("ip -n %s link set %s down", g_ns, g_vb), 0);
        unsigned seen = 0;
        cx_event_t ev;
        assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_FAILED, HBT_MS + 2000, &ev, &seen), 0);
        double failed_ms = cxt_ms_since(t_down);
        assert_true(seen & (1u << CX_EVENT_SUSPECT));
        usleep(300000); /* ops issued against the FAILED peer return too */
        atomic_store(&s.stop, 1);
        pthread_join(th, NULL);
        assert_int_equal(atomic_load(&s.other), 0);
        assert_true(atomic_load(&s.epeer) + atomic_load(&s.etimedout) > 0);
        assert_true(atomic_load(&s.worst_ms) <= OP_TIMEOUT_MS + 1000); /* no op hung */

        /* Killed while its link is down (its sockets die without a word), link back, restart
         * under the same identity and port: it dials us, we see JOINED. */
        cxt_peer_crash(&p);
        assert_int_equal(cxt_sh("ip -n %s link set %s up", g_ns, g_vb), 0);
        assert_int_equal(wait_link_running(), 0);
        assert_int_equal(wait_link_running(), 0);
        cxt_drain_events(e);
        uint64_t t_up = cxt_now_ns();
        assert_int_equal(start_peer_in_ns(&p, &o), 0);
        assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_JOINED, 10000, &ev, NULL), 0);
        double joined_ms = cxt_ms_since(t_up);

        /* The restarted process's region: right bytes, first try. */
        memset(buf, 0, 65536);
        assert_int_equal(cx_read(e, p.lid, buf, p.base + 4096u * (unsigned)cyc, 65536), 0);
        assert_int_equal(cxt_check(buf, 65536, 77, 4096u * (unsigned)cyc), -1);
        printf("partition: cycle %d: FAILED %.0f ms after link down, JOINED %.0f ms after restart; reads "
               "ok %ld, CX_EPEER %ld, CX_ETIMEDOUT %ld, longest %ld ms; cycle %.0f ms\n",
               cyc + 1, failed_ms, joined_ms, atomic_load(&s.ok), atomic_load(&s.epeer), atomic_load(&s.etimedout),
               atomic_load(&s.worst_ms), cxt_ms_since(t_cycle));
        fflush(stdout);
    }

    cxt_peer_stop(&p);
    cx_engine_destroy(e);
    munmap(buf, RS);
    teardown_net();
}

/* The op timeout well below the heartbeat timeout: while the link is cut, an op ends with
 * exactly CX_ETIMEDOUT (the peer is not failed yet, so never CX_EPEER), and because the data
 * connection is closed first, nothing of a timed-out read lands in our buffer afterwards, even
 * once the link is back and the peer's queued answer could arrive. To have that answer really
 * in flight, the peer's side of the link is slowed to 2 MB/s (tc tbf, when tc has it) so a 4 MiB
 * read is still streaming when the link goes down. */
#define PT_HBT_MS 8000
#define PT_OPT_MS 600

static void expect_timeout(int rc, uint64_t t0, const char *what)
{
    double ms = cxt_ms_since(t0);
    printf("partition: %s with the link down: %s after %.0f ms (op timeout %d ms)\n", what, cx_strerror(rc), ms,
           PT_OPT_MS);
    fflush(stdout);
    if (rc != CX_ETIMEDOUT) fail_msg("%s with the link down: %s, expected CX_ETIMEDOUT", what, cx_strerror(rc));
    if (ms < PT_OPT_MS * 0.8 || ms > PT_OPT_MS + 1500.0)
        fail_msg("%s timed out after %.0f ms with a %d ms op timeout", what, ms, PT_OPT_MS);
}

static void test_op_timeout_below_heartbeat(void **state)
{
    (void)state;
    cx_engine_t *e = NULL;
    uint8_t *buf = NULL;
    survivor_up_t("partt", HB_MS, PT_HBT_MS, PT_OPT_MS, &e, &buf);
    cxt_peer_t p;
    cxt_peer_opts_t o = { .model = "partt-peer",
                          .replica = 3,
                          .region = RS,
                          .seed = 61,
                          .listen_ip = g_ip_b,
                          .hb_ms = HB_MS,
                          .hb_timeout_ms = PT_HBT_MS,
                          .op_timeout_ms = PT_OPT_MS };
    assert_int_equal(start_peer_in_ns(&p, &o), 0);
    assert_int_equal(cx_connect(e, p.url, 5000), 0);
    assert_int_equal(cx_read(e, p.lid, buf, p.base, 65536), 0);
    assert_int_equal(cxt_check(buf, 65536, 61, 0), -1);
    cxt_drain_events(e);

    int slow =
        cxt_sh("ip netns exec %s tc qdisc add dev %s root tbf rate 16mbit burst 64kb latency 2000ms", g_ns, g_vb) == 0;
    if (!slow) printf("partition: no tc tbf here: the read may end before the cut\n");
    memset(buf, 0x5c, RS);
    cx_op_t *op = NULL;
    uint64_t t0 = cxt_now_ns();
    assert_int_equal(cx_read_async(e, p.lid, buf, p.base, RS, CX_CLASS_CRITICAL, &op), 0);
    usleep(200000);
    assert_int_equal(cxt_sh("ip -n %s link set %s down", g_ns, g_vb), 0);
    uint64_t t_down = cxt_now_ns();
    int rc = cx_op_wait(op, PT_OPT_MS + 5000);
    size_t landed = 0;
    for (size_t i = 0; i < RS; i++) landed += buf[i] != 0x5c;
    uint8_t *snap = malloc(RS);
    assert_non_null(snap);
    memcpy(snap, buf, RS);
    printf("partition: a 4 MiB read cut %.0f ms in: %s after %.0f ms, %zu bytes in place when it returned\n",
           (double)(t_down - t0) / 1e6, cx_strerror(rc), cxt_ms_since(t0), landed);
    if (rc == CX_OK) {
        printf("partition: the read completed before the cut: no answer in flight to check\n");
        assert_int_equal(cxt_check(buf, RS, 61, 0), -1);
    } else {
        expect_timeout(rc, t0, "a 4 MiB read");
    }

    /* With the link down: each kind of op, exactly CX_ETIMEDOUT. */
    static uint8_t sentinel[65536];
    memset(buf, 0x5c, 65536);
    memset(sentinel, 0x5c, sizeof sentinel);
    t0 = cxt_now_ns();
    expect_timeout(cx_read(e, p.lid, buf, p.base, 65536), t0, "read");
    t0 = cxt_now_ns();
    expect_timeout(cx_write(e, p.lid, buf + 65536, p.base, 65536), t0, "write");
    t0 = cxt_now_ns();
    rc = cx_put_signal(e, p.lid, buf + 65536, p.base, 65536, "cut", 3, &op);
    if (rc == 0) rc = cx_op_wait(op, PT_OPT_MS + 5000);
    expect_timeout(rc, t0, "put_signal");
    t0 = cxt_now_ns();
    expect_timeout(cx_send_msg(e, p.lid, "cut", 3), t0, "message");
    cx_peer_state_t ps = cx_peer_state(e, p.lid);
    printf("partition: %.0f ms after the cut the peer is %s\n", cxt_ms_since(t_down),
           ps == CX_PEER_UP            ? "UP"
               : ps == CX_PEER_SUSPECT ? "SUSPECT"
                                       : "neither UP nor SUSPECT");
    if (ps != CX_PEER_UP && ps != CX_PEER_SUSPECT) fail_msg("the peer failed before its heartbeat timeout");

    /* Link back before the heartbeat timeout; whatever the peer still had queued may now
     * arrive: none of it may land in the buffers of the ops that timed out. */
    if (slow) cxt_sh("ip netns exec %s tc qdisc del dev %s root", g_ns, g_vb);
    assert_int_equal(cxt_sh("ip -n %s link set %s up", g_ns, g_vb), 0);
    assert_int_equal(wait_link_running(), 0);
    usleep(2500000);
    size_t late = 0, first = 0;
    for (size_t i = 65536; i < RS; i++)
        if (buf[i] != snap[i] && !late++) first = i;
    for (size_t i = 0; i < 65536; i++)
        if (buf[i] != 0x5c && !late++) first = i;
    free(snap);
    if (late) fail_msg("%zu bytes landed in timed-out reads' buffers after they returned (first at %zu)", late, first);
    assert_memory_equal(buf, sentinel, sizeof sentinel);

    /* The peer was never declared failed; the data path comes back with the next op. */
    cx_stats_t st;
    assert_int_equal(cx_stats(e, &st), 0);
    printf("partition: op timeouts %llu, peer failures %llu\n", (unsigned long long)st.op_timeouts,
           (unsigned long long)st.peer_failures);
    assert_int_equal(st.peer_failures, 0);
    assert_true(st.op_timeouts >= 4);
    rc = CX_ETIMEDOUT;
    for (int i = 0; i < 5 && rc; i++) { /* the data path reconnects on the link just restored */
        memset(buf, 0, 65536);
        rc = cx_read(e, p.lid, buf, p.base + 1000, 65536);
        if (rc) printf("partition: read after the link came back: %s\n", cx_strerror(rc));
    }
    assert_int_equal(rc, 0);
    assert_int_equal(cxt_check(buf, 65536, 61, 1000), -1);
    fflush(stdout);

    cxt_peer_stop(&p);
    cx_engine_destroy(e);
    munmap(buf, RS);
    teardown_net();
}

static int teardown(void **state)
{
    teardown_net();
    return cxt_watchdog_teardown(state);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_link_down_then_up, cxt_watchdog_setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_down_kill_restart_cycles, cxt_watchdog_setup, teardown),
        cmocka_unit_test_setup_teardown(test_op_timeout_below_heartbeat, cxt_watchdog_setup, teardown),
    };
    if (getenv("CXT_FILTER")) cmocka_set_test_filter(getenv("CXT_FILTER"));
    if (getenv("CXT_SKIP")) cmocka_set_skip_filter(getenv("CXT_SKIP")); /* run as its own test */
    return cxt_run_tests(tests, NULL, NULL);
}
