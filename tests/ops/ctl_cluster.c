/* connex-ctl against a few engines (cx_peer processes): the table and --json list every engine
 * and its peers; a peer killed with kill -9 shows as failed at its survivors and unreachable
 * itself (exit status 3); `watch` prints FAILED and JOINED as a peer is killed and restarted;
 * with a token, the query without it or with a wrong one is refused and with it answered; an
 * engine that is not there or never answers is reported within the timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl_wire.h"
#include "cxt.h"
#include "cxt_etcd.h"
#include "stable_port.h"

#define HB 200
#define HBT 1000
#define OUT_MAX (256u << 10)

static char g_out[OUT_MAX];

/* Runs connex-ctl with these arguments (a shell line: quote URLs); its stdout in g_out.
 * Returns its exit status (-1: it did not exit normally). */
static int ctl(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int ctl(const char *fmt, ...)
{
    char args[2048], cmd[2400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "exec %s %s", CX_CTL_PATH, args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(g_out, 1, sizeof g_out - 1, f);
    g_out[n] = 0;
    int st = pclose(f);
    print_message("$ connex-ctl %s\n%s", args, g_out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The line of g_out that holds all of a, b and c (b, c may be NULL), or NULL. */
static const char *line_with(const char *a, const char *b, const char *c)
{
    static char l[1024];
    for (const char *p = g_out; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        snprintf(l, sizeof l, "%.*s", (int)(n < sizeof l ? n : sizeof l - 1), p);
        if (strstr(l, a) && (!b || strstr(l, b)) && (!c || strstr(l, c))) return l;
        p += n + (e != NULL);
    }
    return NULL;
}

static void start(cxt_peer_t *p, uint32_t replica, const char *connect, uint16_t port)
{
    cxt_peer_opts_t o = { .model = "ca",
                          .replica = replica,
                          .hb_ms = HB,
                          .hb_timeout_ms = HBT,
                          .op_timeout_ms = 5000,
                          .seed = replica + 1,
                          .region = 1 << 16,
                          .connect = connect,
                          .port = port };
    assert_int_equal(cxt_peer_start(p, &o, 15000), 0);
}

/* Waits (bounded) until connex-ctl shows `what` on the line of `peer` under engine url. */
static void wait_shown(const char *url, const char *peer, const char *what)
{
    uint64_t t0 = cxt_now_ns();
    while (cxt_ms_since(t0) < 10000) {
        ctl("--url '%s'", url);
        if (line_with(peer, what, NULL)) return;
        usleep(100 * 1000);
    }
    fail_msg("connex-ctl never showed %s as %s at %s", peer, what, url);
}

static void test_list(void **state)
{
    (void)state;
    cxt_peer_t p0, p1, p2;
    start(&p0, 0, NULL, 0);
    start(&p1, 1, p0.url, 0);
    start(&p2, 2, p0.url, 0);
    wait_shown(p0.url, "ca|0|0|2", " up ");

    assert_int_equal(ctl("--peers '%s,%s,%s'", p0.url, p1.url, p2.url), 0);
    assert_non_null(line_with("directory: static", "3 engines", NULL));
    assert_non_null(line_with(p1.url, "up", "backends zmq"));
    assert_non_null(line_with("ca|0|0|1", " up ", "zmq")); /* a peer row */

    assert_int_equal(ctl("--peers '%s,%s,%s' --json", p0.url, p1.url, p2.url), 0);
    assert_non_null(strstr(g_out, "{\"directory\": \"static\", \"engines\": ["));
    assert_non_null(strstr(g_out, "\"lid\": \"ca|0|0|2\", \"url\": \"127.0.0.1:"));
    assert_non_null(strstr(g_out, "\"state\": \"up\", \"backend\": \"zmq\""));
    assert_null(strstr(g_out, "\"reachable\": false"));
    assert_null(strstr(g_out, "connex-ctl")); /* its own engine is not listed */

    /* kill -9: failed at its survivor, unreachable itself, exit status 3 */
    cxt_peer_crash(&p2);
    wait_shown(p0.url, "ca|0|0|2", " failed ");
    assert_int_equal(ctl("--peers '%s,%s,%s' --timeout-ms 1000", p0.url, p1.url, p2.url), 3);
    assert_non_null(line_with(p2.url, "UNREACHABLE", "connect"));
    const char *row = line_with("    ca|0|0|2", "failed", NULL);
    assert_non_null(row);
    unsigned long long fails = 0, joins = 9;
    assert_int_equal(sscanf(strstr(row, "Z") + 1, "%llu %llu", &fails, &joins), 2);
    assert_true(fails == 1 && joins == 0);
    assert_int_equal(ctl("--url '%s' --json --timeout-ms 1000", p2.url), 3);
    assert_non_null(strstr(g_out, "\"reachable\": false"));
    cxt_peer_stop(&p1);
    cxt_peer_stop(&p0);
}

/* Reads the watcher's output until a line holds both a and b (bounded). */
static int expect(int fd, char *acc, size_t *len, const char *a, const char *b, int timeout_ms)
{
    uint64_t t0 = cxt_now_ns();
    for (;;) {
        acc[*len] = 0;
        for (char *p = acc; *p;) {
            char *e = strchr(p, '\n');
            if (!e) break;
            *e = 0;
            int hit = strstr(p, a) && (!b || strstr(p, b));
            *e = '\n';
            if (hit) return 0;
            p = e + 1;
        }
        int left = timeout_ms - (int)cxt_ms_since(t0);
        struct pollfd pf = { fd, POLLIN, 0 };
        if (left <= 0 || poll(&pf, 1, left) <= 0) return -1;
        ssize_t n = read(fd, acc + *len, OUT_MAX - 1 - *len);
        if (n <= 0) return -1;
        *len += (size_t)n;
    }
}

static void test_watch(void **state)
{
    (void)state;
    cxt_peer_t p0, p1, p1b;
    start(&p0, 0, NULL, 0);
    uint16_t port = cx_bench_stable_port("127.0.0.1");
    start(&p1, 1, p0.url, port);
    wait_shown(p0.url, "ca|0|0|1", " up ");
    int pfd[2];
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        execl(CX_CTL_PATH, "connex-ctl", "--url", p0.url, "watch", "--duration-ms", "60000", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    int fd = pfd[0];
    size_t len = 0;
    assert_int_equal(expect(fd, g_out, &len, "watching", "1 peers", 10000), 0);
    cxt_peer_crash(&p1);
    assert_int_equal(expect(fd, g_out, &len, " failed ", "ca|0|0|1", 10000), 0);
    start(&p1b, 1, p0.url, port); /* the same LID, a new incarnation */
    assert_int_equal(expect(fd, g_out, &len, " joined ", "ca|0|0|1", 10000), 0);
    cxt_peer_stop(&p1b);
    assert_int_equal(expect(fd, g_out, &len, " left ", "ca|0|0|1", 10000), 0);
    /* the engine it watches goes: it says so, and goes on trying */
    cxt_peer_stop(&p0);
    assert_int_equal(expect(fd, g_out, &len, " lost ", NULL, 10000), 0);
    print_message("%.*s", (int)len, g_out);
    kill(pid, SIGTERM); /* watch runs until killed */
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    close(fd);
}

static void test_auth(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    char tpl[512];
    snprintf(tpl, sizeof tpl, "%s/cxctlXXXXXX", tmp && *tmp ? tmp : P_tmpdir);
    assert_non_null(mkdtemp(tpl));
    char good[600], bad[600];
    snprintf(good, sizeof good, "%s/good", tpl);
    snprintf(bad, sizeof bad, "%s/bad", tpl);
    FILE *g = fopen(good, "w");
    fputs("s3cret-token\n", g);
    fclose(g);
    g = fopen(bad, "w");
    fputs("not-the-token\n", g);
    fclose(g);
    chmod(good, 0600);
    chmod(bad, 0600);

    setenv("CONNEX_AUTH_TOKEN", "s3cret-token", 1); /* the peers inherit it */
    cxt_peer_t p0, p1;
    start(&p0, 0, NULL, 0);
    start(&p1, 1, p0.url, 0);
    unsetenv("CONNEX_AUTH_TOKEN");
    assert_int_equal(ctl("--url '%s' --timeout-ms 3000", p0.url), 3);
    assert_non_null(line_with(p0.url, "UNREACHABLE", "authentication"));
    assert_int_equal(ctl("--url '%s' --token-file %s --timeout-ms 3000", p0.url, bad), 3);
    assert_non_null(line_with(p0.url, "UNREACHABLE", "wrong token"));
    uint64_t t0 = cxt_now_ns();
    int rc;
    while ((rc = ctl("--url '%s' --token-file %s", p0.url, good)) == 0 && !line_with("ca|0|0|1", " up ", NULL) &&
           cxt_ms_since(t0) < 10000)
        usleep(100 * 1000);
    assert_int_equal(rc, 0);
    assert_non_null(line_with("ca|0|0|1", " up ", "zmq"));
    char reply[512];
    assert_int_equal(cxt_peer_cmd(&p0, 5000, reply, sizeof reply, "STATS"), 0);
    print_message("p0: %s\n", reply);
    cxt_peer_stop(&p1);
    cxt_peer_stop(&p0);
    unlink(good);
    unlink(bad);
    rmdir(tpl);
}

static void test_unreachable(void **state)
{
    (void)state;
    int hold;
    uint16_t refusing = cxt_refusing_port(&hold);
    /* a port that accepts (the kernel's backlog) and never answers */
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(ls, 4), 0);
    socklen_t sl = sizeof a;
    getsockname(ls, (struct sockaddr *)&a, &sl);
    uint64_t t0 = cxt_now_ns();
    assert_int_equal(ctl("--url '127.0.0.1:%u#ca|0|0|7' --url '127.0.0.1:%u#ca|0|0|8' --timeout-ms 700", refusing,
                         ntohs(a.sin_port)),
                     3);
    double ms = cxt_ms_since(t0);
    assert_non_null(line_with("ca|0|0|7", "UNREACHABLE", "refused"));
    assert_non_null(line_with("ca|0|0|8", "UNREACHABLE", "no answer in time"));
    assert_true(ms < 5000);
    /* bad usage */
    assert_int_equal(ctl("--timeout-ms"), 1);
    assert_int_equal(ctl("--url 'not a url'"), 0); /* said on stderr, nothing to ask */
    close(ls);
    close(hold);
}

/* The directory in a real etcd: engines that register there are listed with their revision as
 * version, connex-ctl's own engine is not, and every engine listed is asked. */
static void test_etcd_directory(void **state)
{
    (void)state;
    cxt_etcd_t x;
    int rc = cxt_etcd_start(&x, 15000);
    if (rc == 1) cxt_skip("etcd", "%s missing", CXT_ETCD_BIN);
    assert_int_equal(rc, 0);
    setenv("CONNEX_DIRECTORY", x.endpoint, 1); /* the peers inherit it */
    cxt_peer_t p0, p1;
    start(&p0, 0, NULL, 0);
    start(&p1, 1, p0.url, 0);
    unsetenv("CONNEX_DIRECTORY");
    wait_shown(p0.url, "ca|0|0|1", " up ");
    assert_int_equal(ctl("--directory %s --json", x.endpoint), 0);
    assert_non_null(strstr(g_out, "{\"directory\": \"etcd\", \"engines\": ["));
    assert_null(strstr(g_out, "connex-ctl"));
    assert_null(strstr(g_out, "\"reachable\": false"));
    assert_int_equal(ctl("--directory %s", x.endpoint), 0);
    assert_non_null(line_with("directory: etcd", "2 engines", NULL));
    const char *row = line_with(p1.url, " up ", "backends zmq");
    assert_non_null(row);
    unsigned long long version = 0;
    assert_int_equal(sscanf(row + strlen(p1.lid), " %*s %llu", &version), 1);
    assert_true(version > 0); /* etcd's revision */
    assert_non_null(line_with("    ca|0|0|0", " up ", "zmq"));
    cxt_peer_stop(&p1);
    cxt_peer_stop(&p0);
    cxt_etcd_stop(&x);
}

/* A raw connection to the engine at port that sends one frame of `type` with body b. */
static int raw_frame(uint16_t port, uint8_t type, const void *b, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    uint8_t f[CX_CTL_HDR + 64];
    cx_ctl_hdr(f, (uint32_t)n, type);
    memcpy(f + CX_CTL_HDR, b, n);
    assert_int_equal(send(fd, f, CX_CTL_HDR + n, MSG_NOSIGNAL), (ssize_t)(CX_CTL_HDR + n));
    return fd;
}

/* What comes back within ms: 1 a frame of `type`, 0 the connection closed, -1 nothing. */
static int answer(int fd, uint8_t type, int ms)
{
    struct pollfd pf = { fd, POLLIN, 0 };
    if (poll(&pf, 1, ms) <= 0) return -1;
    uint8_t h[CX_CTL_HDR];
    ssize_t n = recv(fd, h, sizeof h, MSG_WAITALL);
    if (n <= 0) return 0;
    uint32_t blen;
    uint8_t t;
    if (n != CX_CTL_HDR || cx_ctl_hdr_parse(h, &blen, &t) || t != type || blen > OUT_MAX) return -1;
    return recv(fd, g_out, blen, MSG_WAITALL) == (ssize_t)blen ? 1 : -1; /* the body, read */
}

static void test_hostile_queries(void **state)
{
    (void)state;
    cxt_peer_t p0;
    start(&p0, 0, NULL, 0);
    /* a malformed query is closed */
    uint8_t two[2] = { 0, 0 }, bad = 7, watch = CX_STATUS_WATCH;
    int fd = raw_frame(p0.port, CX_CTL_STATUS_QUERY, two, 2);
    assert_int_equal(answer(fd, CX_CTL_STATUS_REPLY, 3000), 0);
    close(fd);
    fd = raw_frame(p0.port, CX_CTL_STATUS_QUERY, &bad, 1);
    assert_int_equal(answer(fd, CX_CTL_STATUS_REPLY, 3000), 0);
    close(fd);
    /* eight watchers, not nine */
    int w[9];
    for (int i = 0; i < 8; i++) {
        w[i] = raw_frame(p0.port, CX_CTL_STATUS_QUERY, &watch, 1);
        assert_int_equal(answer(w[i], CX_CTL_STATUS_REPLY, 3000), 1);
    }
    w[8] = raw_frame(p0.port, CX_CTL_STATUS_QUERY, &watch, 1);
    assert_int_equal(answer(w[8], CX_CTL_STATUS_REPLY, 3000), 0);
    close(w[8]);
    /* a watcher stays past the HELLO timeout, and is closed when it tries to become a peer */
    usleep((HBT + 500) * 1000);
    struct pollfd pf = { w[0], POLLIN, 0 };
    assert_int_equal(poll(&pf, 1, 0), 0);
    uint8_t junk[16] = { 0 };
    uint8_t f[CX_CTL_HDR + sizeof junk];
    cx_ctl_hdr(f, sizeof junk, CX_CTL_HELLO);
    memcpy(f + CX_CTL_HDR, junk, sizeof junk);
    assert_int_equal(send(w[0], f, sizeof f, MSG_NOSIGNAL), (ssize_t)sizeof f);
    assert_int_equal(answer(w[0], CX_CTL_STATUS_EVENT, 3000), 0);
    for (int i = 0; i < 8; i++) close(w[i]);
    /* the engine is none the worse */
    assert_int_equal(ctl("--url '%s'", p0.url), 0);
    cxt_peer_stop(&p0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_list, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_watch, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_auth, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_unreachable, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_etcd_directory, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_hostile_queries, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    return cxt_run_tests(tests, NULL, NULL);
}
