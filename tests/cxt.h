/* Test helpers shared by the conformance executables and cx_peer: data patterns and hashes,
 * bounded waits for events, peer processes driven over a line protocol, fd/RSS probes.
 * Every wait here takes a timeout: a broken engine makes a test fail, never hang. */
#ifndef CXT_H
#define CXT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "connex/connex.h"

/* ---- data ---- */

/* Byte i of the pattern with this seed. Not periodic in i, so a transfer landing at a wrong
 * offset (even a multiple of 256) is caught. */
static inline uint8_t cxt_pat(uint32_t seed, uint64_t i)
{
    return (uint8_t)(((i ^ ((uint64_t)seed << 40)) * 0x9E3779B97F4A7C15ULL) >> 56);
}
void cxt_fill(void *buf, size_t len, uint32_t seed, uint64_t start);
/* Index of the first byte differing from the pattern, or -1 when all match. */
long long cxt_check(const void *buf, size_t len, uint32_t seed, uint64_t start);
uint64_t cxt_hash(const void *buf, size_t len); /* FNV-1a 64 */

/* ---- time ---- */
uint64_t cxt_now_ns(void);
static inline double cxt_ms_since(uint64_t t0)
{
    return (double)(cxt_now_ns() - t0) / 1e6;
}

/* ---- process probes ---- */
int cxt_count_fds(void);
/* fds settle asynchronously (a backend may close its sockets from its own thread): polls up to
 * ms for the count `want` before the caller calls it a leak. Returns the last count. */
int cxt_fds_settle(int want, int ms);
/* Prints (stderr) the fds open now that are not in known[], with what they point to, and those
 * of known[] that are gone: what a failed fd-count check leaked. */
void cxt_fds_report(const int *known, int nknown, const char *why);
long cxt_rss_kib(void);
/* Number of open fds >= 3 without FD_CLOEXEC and not in the `known` list (fds open before). */
int cxt_fds_without_cloexec(const int *known, int nknown);
int cxt_list_fds(int *out, int max);
/* Number of this process's TCP sockets with a local or remote port in ports[] (the engines'
 * control ports) that lack FD_CLOEXEC; *checked: how many such sockets there are. */
int cxt_sockets_without_cloexec(const uint16_t *ports, int nports, int *checked);

/* A TCP port on 127.0.0.1 where nobody listens, and nobody can start to: the socket stays bound
 * (not listening) in *hold until the caller closes it, so connects there are refused. A port that
 * is merely free can be taken by a parallel test's listener, which accepts and then hangs up. */
uint16_t cxt_refusing_port(int *hold);

/* ---- network namespaces ---- */

/* Runs a shell command line (printf-style); non-zero exit: printed with the command. */
int cxt_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Why a test that creates network namespaces cannot run here (NULL: it can), and the capability
 * missing in *cap ("root" or "netns", for cxt_skip). */
const char *cxt_netns_why_skip(const char **cap);

/* ---- events ---- */

/* Waits up to timeout_ms for an event of `type` about `lid` (bare LID string; NULL: any peer).
 * Other events are consumed; for the same peer their types are ORed into *seen (bit 1<<type)
 * when seen is not NULL. Returns 0 with *out filled, or CX_ETIMEDOUT. */
int cxt_wait_event(cx_engine_t *e, const char *lid, cx_event_type_t type, int timeout_ms, cx_event_t *out,
                   unsigned *seen);
void cxt_drain_events(cx_engine_t *e);

/* ---- peer processes (tests/cx_peer) ---- */

typedef struct cxt_peer_opts {
    const char *model; /* default "peer" */
    uint32_t stage, shard, replica;
    uint16_t port;                                /* 0: ephemeral */
    uint32_t hb_ms, hb_timeout_ms, op_timeout_ms; /* 0: engine defaults */
    size_t region;                                /* bytes; default 1 MiB */
    uint32_t seed;
    const char *connect;     /* URL to connect to at start (NULL: none) */
    const char *listen_ip;   /* NULL: the engine's default (127.0.0.1) */
    const char *mem;         /* region memory: host|sim|cuda (NULL: CONNEX_TEST_MEM, else host) */
    const char *host_id;     /* CONNEX_HOST_ID for it: stands in for a process on another host */
    uint32_t ballast_mib;    /* touched, unregistered memory it holds (its kill -9 takes longer) */
    const char *netns;       /* run it in this network namespace through `ip netns exec`, which
                                 also remounts /sys for it (UCX lists its interfaces there) */
    const char *net_devices; /* CONNEX_NET_DEVICES for it (NULL: inherited) */
} cxt_peer_opts_t;

#define CXT_STASH 256
typedef struct cxt_peer {
    pid_t pid;
    int in_fd, out_fd;
    char rbuf[8192];
    size_t rlen;
    char *stash[CXT_STASH]; /* async lines (EVENT, MSG) read while waiting for something else */
    int nstash;
    char url[CX_URL_MAX];
    char lid[CX_URL_MAX];
    uint16_t port;
    uint64_t base; /* the peer's region address */
    size_t len;
    uint32_t seed;
    int status; /* wait status once reaped */
    int killed; /* the test SIGKILLed it (cxt_peer_crash, cxt_peer_signal): its
                                 exit status is not checked */
} cxt_peer_t;

/* Starts tests/cx_peer and waits for its READY line. Returns 0 or -1 (message on stderr). */
int cxt_peer_start(cxt_peer_t *p, const cxt_peer_opts_t *o, int timeout_ms);
/* Sends one command line and waits for its "OK ..." or "ERR ..." reply (copied to reply).
 * Returns 0 for OK, the connex code after ERR, or CX_ETIMEDOUT / CX_ERR when no reply came. */
int cxt_peer_cmd(cxt_peer_t *p, int timeout_ms, char *reply, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The same in two halves: send the command line without waiting (0, or CX_ERR when the peer's
 * stdin is closed), then wait for its reply. For a command whose reply comes late (READLOOP)
 * while the test does something else meanwhile. */
int cxt_peer_send(cxt_peer_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cxt_peer_reply(cxt_peer_t *p, int timeout_ms, char *reply, size_t n);
/* Waits for an async line starting with prefix (stashed ones first). 0 or CX_ETIMEDOUT. */
int cxt_peer_expect(cxt_peer_t *p, const char *prefix, int timeout_ms, char *line, size_t n);
/* Reads and discards the peer's output for ms (keeps its stdout pipe from filling up). */
void cxt_peer_drain(cxt_peer_t *p, int ms);
/* Sends sig; SIGKILL marks the peer as killed on purpose (see below). */
void cxt_peer_signal(cxt_peer_t *p, int sig);
/* Reaps the process, SIGKILLing it after timeout_ms. Returns 0 when it exited by itself.
 *
 * Exit status. A peer the test did not SIGKILL itself must exit 0: one that exited with another
 * status, died on a signal or had to be killed at the deadline fails the running cmocka test
 * with "cxt: peer <lid> pid N exited with status S", "... crashed with signal N (name)" or
 * "... did not exit within N ms" (also on stderr). A sanitizer report in a peer ends it that
 * way too (ASan aborts with CI's abort_on_error=1, LSan exits 23). Checked wherever a peer is
 * reaped: here, cxt_peer_stop, cxt_peer_signal(SIGSTOP) finding it dead. Called from another
 * thread than the test's, the failure is printed and kept for cxt_run_tests' exit status. */
int cxt_peer_reap(cxt_peer_t *p, int timeout_ms);
/* Closes stdin (the peer exits cleanly), reaps it (SIGKILL after 5 s) and frees the stash;
 * fails the test unless the peer exited 0 (see cxt_peer_reap). */
void cxt_peer_stop(cxt_peer_t *p);
/* kill -9 and reap: the way a crashed process goes (killed on purpose: status not checked). */
void cxt_peer_crash(cxt_peer_t *p);

/* ---- the process's stderr, captured ----
 *
 * cxt_log_capture(tag): stderr (this process's engine log, and that of peers forked meanwhile,
 * which inherit it) goes to $TMPDIR/cx_<tag>.<pid>.log. cxt_log_release(line, arg): stderr back,
 * then line(text, arg) for each line of the log, which is then removed. cxt_log_abort(), from a
 * teardown after a failed case that did not reach the release: stderr back and the log's last 80
 * lines shown (the file kept when CXT_KEEP_LOG is set). */
void cxt_log_capture(const char *tag);
void cxt_log_release(void (*line)(const char *text, void *arg), void *arg);
void cxt_log_abort(void);

/* ---- skips and the exit status ----
 *
 * A case that cannot run here for a missing capability (cap: "root", "netns", "etcd",
 * "procfd", ...) calls cxt_skip(cap, why...): it prints "cxt: SKIPPED: needs <cap>: <why>" and
 * skips the case (cmocka's skip()). When the comma-separated list CONNEX_TEST_REQUIRE names cap
 * (CI sets it: .ci/run), the case fails instead with "cxt: required capability <cap> missing:
 * <why>". cxt_run_tests(tests, setup, teardown) replaces cmocka_run_group_tests in main and
 * gives main's exit status: the number of failed cases (cmocka's), plus peers found failed off
 * the test's thread (cxt_peer_reap); but CXT_SKIP_EXIT (77, ctest's SKIP_RETURN_CODE) when none
 * failed and every case selected (CXT_FILTER) was skipped by cxt_skip: ctest shows "Skipped",
 * not "Passed". A binary where some cases ran exits 0 and its output names the skipped ones. */
#define CXT_SKIP_EXIT 77
void cxt_skip_note(const char *cap, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define cxt_skip(cap, ...)               \
    do {                                 \
        cxt_skip_note(cap, __VA_ARGS__); \
        skip();                          \
    } while (0)
/* 1 when CONNEX_TEST_REQUIRE names cap. */
int cxt_required(const char *cap);
int cxt_exit_status(int failed, int selected);
/* Cases of tests[] that CXT_FILTER (cmocka_set_test_filter's wildcards) selects; sets the filter. */
int cxt_selected(const void *tests, size_t n, size_t size);
#define cxt_run_tests(tests, setup, teardown)                                                     \
    cxt_exit_status((cxt_selected(tests, sizeof(tests) / sizeof((tests)[0]), sizeof((tests)[0])), \
                     cmocka_run_group_tests(tests, setup, teardown)),                             \
                    cxt_selected(tests, sizeof(tests) / sizeof((tests)[0]), sizeof((tests)[0])))

/* cmocka setup function arming a watchdog: a test still running after CXT_WATCHDOG_S seconds
 * (default 120) is hung in the engine; the process says so and exits, instead of sitting until
 * ctest's TIMEOUT. Use it as the per-test setup. */
int cxt_watchdog_setup(void **state);
int cxt_watchdog_teardown(void **state);

/* Whether this variant's pair may run over shared memory, where a read or a write is copied by
 * the initiator itself (CMA, shared segments) and completes while the target is stopped
 * (docs/semantics.md "Failure detection", backends/libfabric/README.md "shm: direct mode"):
 * libfabric's shm provider, UCX with a shared-memory transport or UCX's own selection, or
 * auto-selection. ZeroMQ and the tcp variants need the target's CPU for every op. */
int cxt_may_be_one_sided(void);

/* Cluster runs: CONNEX_TEST_TLS replaces UCX_TLS, CONNEX_TEST_IP is the listen address (unless
 * the test chose one). Applied by cxt_engine and by cx_peer. */
void cxt_apply_test_env(cx_config_t *c);
/* Engine for the test process, backend and logging from the environment. */
int cxt_engine(cx_engine_t **e, const char *model, uint32_t replica, uint32_t hb_ms, uint32_t hb_timeout_ms,
               uint32_t op_timeout_ms);

#endif
