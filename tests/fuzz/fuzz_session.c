/* libFuzzer target: a whole engine's control port, with its state kept from frame to frame.
 *
 * fuzz_ctl runs the decoders alone; this one sends each input, as a peer's byte stream, to the
 * control port of a real engine (ZeroMQ backend) and so drives what the decoders feed: the
 * HELLO handshake and the peer table (a known LID with a new incarnation is a rejoin), REG_ADD /
 * REG_DEL / REG_QUERY against the regions a HELLO brought, REFUSE, BYE, heartbeats, and frames
 * that come in the wrong state. The engine lives across inputs (made anew every
 * CX_FUZZ_SESSION_RENEW inputs), so one input's peers and regions meet the next one's frames.
 * After each input the engine must still answer (cx_stats, cx_peer_list) and hold no op.
 *
 * A HELLO names addresses the engine then dials (the peer's URL, its backends' blobs), so the
 * engine runs in a network namespace of its own where only loopback exists: nothing the input
 * names is reachable beyond this process. Without one (not root) the target does not run: the
 * replay test exits 77 (ctest: Skipped), or fails when CONNEX_TEST_REQUIRE names netns. */
#include "connex/connex.h"

#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CX_FUZZ_SESSION_RENEW 2000 /* inputs per engine: peers of old inputs do not pile up */

static cx_engine_t *g_e;
static uint16_t g_port;
static int g_inputs;
static uint8_t *g_region;

static int loopback_up(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    int rc = ioctl(s, SIOCGIFFLAGS, &ifr);
    if (rc == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        rc = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    close(s);
    return rc;
}

static void no_namespace(void)
{
    const char *req = getenv("CONNEX_TEST_REQUIRE");
    if (req && strstr(req, "netns")) {
        fprintf(stderr,
                "fuzz_session: no network namespace of its own (%s), and "
                "CONNEX_TEST_REQUIRE names netns\n",
                strerror(errno));
        exit(1);
    }
    fprintf(stderr, "fuzz_session: skipped: no network namespace of its own (%s; root needed)\n", strerror(errno));
    exit(77);
}

static void engine_up(void)
{
    cx_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.model = "llama"; /* the identity the seeds' HELLOs dial (mkseeds.c) */
    cfg.stage = 2;
    cfg.listen_ip = "127.0.0.1";
    cfg.backend = "zmq";
    cfg.heartbeat_ms = 100000; /* no timers firing between inputs */
    cfg.heartbeat_timeout_ms = 300000;
    cfg.op_timeout_ms = 1000;
    cfg.connect_timeout_ms = 200;
    if (cx_engine_create(&cfg, &g_e) != CX_OK) {
        fprintf(stderr, "fuzz_session: cx_engine_create failed\n");
        abort();
    }
    if (!g_region && !(g_region = aligned_alloc(4096, 1 << 16))) abort();
    if (cx_register_memory(g_e, g_region, 1 << 16) != CX_OK) abort(); /* REG_QUERY has one */
    cx_url_t u;
    if (cx_url_parse(cx_engine_local_url(g_e), &u, NULL, 0) != CX_OK) abort();
    g_port = u.port;
}

static void setup(void)
{
    /* engine logs would drown the fuzzer's output; this process's own setting, not a library's */
    setenv("CONNEX_LOG", "error", 0);
    if (unshare(CLONE_NEWNET) != 0 || loopback_up() != 0) no_namespace();
    engine_up();
}

/* The input as one connection's bytes: sent, then our end closed, then the engine's answer read
 * until it closes or 50 ms pass. */
static void one_connection(const uint8_t *data, size_t size)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return;
    struct timeval tv = { 0, 50000 };
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(g_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) {
        size_t off = 0;
        for (int tries = 0; off < size && tries < 64; tries++) {
            ssize_t n = send(s, data + off, size - off, MSG_NOSIGNAL);
            if (n <= 0) break;
            off += (size_t)n;
        }
        shutdown(s, SHUT_WR);
        char buf[4096];
        for (int tries = 0; tries < 64; tries++)
            if (recv(s, buf, sizeof buf, 0) <= 0) break;
    }
    close(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_e) setup();
    if (++g_inputs % CX_FUZZ_SESSION_RENEW == 0) {
        cx_unregister_memory(g_e, g_region);
        cx_engine_destroy(g_e);
        g_e = NULL;
        engine_up();
    }
    one_connection(data, size);
    /* Still answering, and nothing left hanging: both calls go through the progress thread. */
    cx_stats_t st;
    if (cx_stats(g_e, &st) != CX_OK) abort();
    cx_peer_info_t info[8];
    if (cx_peer_list(g_e, info, 8) < 0) abort();
    if (st.regions != 1) abort();
    return 0;
}
