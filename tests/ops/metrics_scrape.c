/* Metrics: cx_stats_format's text checked by a strict parser of the exposition format
 * (prom_check.c), and the CONNEX_METRICS listener scraped over HTTP while reads run to a peer
 * process: counters that grow between scrapes, a latency histogram per op and backend, the
 * peer's state, and after a kill -9 its FAILED counted. Anything but GET /metrics is refused
 * (404, 405, 431), a silent client is closed after the listener's timeout and the next one is
 * served, and a bad CONNEX_METRICS fails the engine's create with CX_EINVAL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cxt.h"
#include "prom_check.h"
#include "stable_port.h"

#define BUF (256u << 10)
static char g_buf[BUF] __attribute__((aligned(4096)));

/* One HTTP exchange on 127.0.0.1:port: sends req, reads until the server closes (at most
 * timeout_ms). Returns the status code (0: no answer) and the body in a malloc'ed *body. */
static int http(uint16_t port, const char *req, size_t req_len, int timeout_ms, char **body)
{
    *body = NULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return 0;
    }
    if (req_len && send(fd, req, req_len, MSG_NOSIGNAL) != (ssize_t)req_len) {
        close(fd);
        return 0;
    }
    size_t cap = 1 << 16, len = 0;
    char *r = malloc(cap);
    uint64_t t0 = cxt_now_ns();
    for (;;) {
        int left = timeout_ms - (int)cxt_ms_since(t0);
        struct pollfd pf = { fd, POLLIN, 0 };
        if (left <= 0 || poll(&pf, 1, left) <= 0) break;
        if (len + 4096 > cap) r = realloc(r, cap *= 2);
        ssize_t n = recv(fd, r + len, cap - len - 1, 0);
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fd);
    r[len] = 0;
    int code = 0;
    if (sscanf(r, "HTTP/1.1 %d", &code) != 1) code = 0;
    char *b = strstr(r, "\r\n\r\n");
    if (b) {
        *body = strdup(b + 4);
        /* Content-Length agrees with the body */
        char *cl = strstr(r, "Content-Length: ");
        if (!cl || strtoul(cl + 16, NULL, 10) != strlen(b + 4)) code = -code;
    }
    free(r);
    return code;
}

static int get(uint16_t port, const char *path, char **body)
{
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n", path);
    return http(port, req, (size_t)n, 5000, body);
}

static void must_parse(const char *text)
{
    char err[512];
    const char *bad = prom_check(text, err, sizeof err);
    if (bad) fprintf(stderr, "exposition format: %s\n", bad);
    assert_null(bad);
}

struct traffic {
    cx_engine_t *e;
    const char *peer;
    uint64_t base;
    atomic_int stop;
    int ok, bad;
};
static void *traffic_main(void *arg)
{
    struct traffic *t = arg;
    while (!atomic_load(&t->stop)) {
        int rc = cx_read(t->e, t->peer, g_buf, t->base, 4096);
        if (rc == CX_OK)
            t->ok++;
        else
            t->bad++;
        if (cx_write(t->e, t->peer, g_buf + 8192, t->base + 8192, 65536) == CX_OK)
            t->ok++;
        else
            t->bad++;
    }
    return NULL;
}

static cx_engine_t *engine_with_metrics(const char *model, const char *spec)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.heartbeat_ms = 200;
    c.heartbeat_timeout_ms = 1000;
    c.op_timeout_ms = 5000;
    cxt_apply_test_env(&c);
    if (spec) setenv("CONNEX_METRICS", spec, 1);
    cx_engine_t *e = NULL;
    int rc = cx_engine_create(&c, &e);
    unsetenv("CONNEX_METRICS");
    assert_int_equal(rc, CX_OK);
    return e;
}

static void test_scrape_under_traffic(void **state)
{
    (void)state;
    uint16_t port = cx_bench_stable_port("127.0.0.1");
    assert_true(port > 0);
    char spec[64];
    snprintf(spec, sizeof spec, "127.0.0.1:%u", port);
    cx_engine_t *e = engine_with_metrics("mobs", spec);
    assert_int_equal(cx_register_memory(e, g_buf, BUF), CX_OK);

    cxt_peer_t p;
    cxt_peer_opts_t o = {
        .model = "mtgt", .hb_ms = 200, .hb_timeout_ms = 1000, .op_timeout_ms = 5000, .seed = 5, .region = BUF
    };
    assert_int_equal(cxt_peer_start(&p, &o, 15000), 0);
    assert_int_equal(cx_connect(e, p.url, 10000), CX_OK);
    const char *backend = cx_peer_backend(e, p.lid);
    assert_non_null(backend);

    /* cx_stats_format: snprintf's contract, and the format */
    int need = cx_stats_format(e, NULL, 0);
    assert_true(need > 0);
    char small[32];
    assert_int_equal(cx_stats_format(e, small, sizeof small), need);
    assert_int_equal(strlen(small), sizeof small - 1);
    char *full = malloc((size_t)need + 4096);
    int got = cx_stats_format(e, full, (size_t)need + 4096);
    assert_true(got > 0 && got < need + 4096);
    must_parse(full);
    free(full);
    assert_int_equal(cx_stats_format(NULL, NULL, 0), CX_EINVAL);

    struct traffic t = { .e = e, .peer = p.lid, .base = p.base };
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, traffic_main, &t), 0);
    double last_reads = -1;
    char series[256];
    snprintf(series, sizeof series, "connex_peer_state{peer=\"%s\",state=\"up\"}", p.lid);
    for (int i = 0; i < 6; i++) {
        usleep(150 * 1000);
        char *body;
        uint64_t t0 = cxt_now_ns();
        int code = get(port, "/metrics", &body);
        double ms = cxt_ms_since(t0);
        assert_int_equal(code, 200);
        must_parse(body);
        double reads = prom_sum(body, "connex_ops_total", "op=\"read\"");
        double up;
        assert_int_equal(prom_value(body, series, &up), 0);
        assert_true(up == 1.0);
        char hist[160];
        snprintf(hist, sizeof hist, "op=\"read\",backend=\"%s\"", backend);
        double hcount = prom_sum(body, "connex_op_latency_seconds_count", hist);
        print_message("scrape %d: %zu bytes in %.2f ms, %.0f reads, histogram count %.0f\n", i, strlen(body), ms, reads,
                      hcount);
        assert_true(reads > last_reads); /* traffic runs while it is scraped */
        if (i == 5) assert_true(hcount > 0);
        assert_true(hcount <= reads); /* one ok read in 8 is timed */
        last_reads = reads;
        free(body);
    }
    atomic_store(&t.stop, 1);
    pthread_join(th, NULL);
    assert_true(t.ok > 0);
    assert_int_equal(t.bad, 0);

    /* per-peer counters and the histogram's buckets match what was done */
    char *body;
    assert_int_equal(get(port, "/metrics", &body), 200);
    must_parse(body);
    char s2[256];
    double v;
    snprintf(s2, sizeof s2, "connex_peer_ops_total{peer=\"%s\",op=\"write\"}", p.lid);
    assert_int_equal(prom_value(body, s2, &v), 0);
    assert_true(v >= t.ok / 2 - 1);
    snprintf(s2, sizeof s2, "connex_peer_bytes_total{peer=\"%s\",op=\"write\"}", p.lid);
    double bytes;
    assert_int_equal(prom_value(body, s2, &bytes), 0);
    assert_true(bytes == v * 65536);
    snprintf(s2, sizeof s2, "connex_op_latency_seconds_bucket{op=\"write\",backend=\"%s\",le=\"+Inf\"}", backend);
    double inf;
    assert_int_equal(prom_value(body, s2, &inf), 0);
    print_message("writes: %.0f, timed: %.0f\n", v, inf);
    assert_true(inf > v / 16 && inf < v / 4); /* one in 8, picked at random */
    free(body);

    /* the peer dies: FAILED is counted, for it and for the engine */
    cxt_peer_crash(&p);
    cx_event_t ev;
    assert_int_equal(cxt_wait_event(e, p.lid, CX_EVENT_FAILED, 5000, &ev, NULL), CX_OK);
    assert_int_equal(get(port, "/metrics", &body), 200);
    must_parse(body);
    snprintf(s2, sizeof s2, "connex_peer_failures_total{peer=\"%s\"}", p.lid);
    assert_int_equal(prom_value(body, s2, &v), 0);
    assert_true(v == 1.0);
    snprintf(s2, sizeof s2, "connex_peer_state{peer=\"%s\",state=\"failed\"}", p.lid);
    assert_int_equal(prom_value(body, s2, &v), 0);
    assert_true(v == 1.0);
    assert_int_equal(prom_value(body, "connex_failures_total", &v), 0);
    assert_true(v >= 1.0);
    snprintf(s2, sizeof s2, "connex_peer_state_since_timestamp_seconds{peer=\"%s\"}", p.lid);
    assert_int_equal(prom_value(body, s2, &v), 0);
    assert_true(v > 1.6e9);
    free(body);
    cx_engine_destroy(e);
}

static void test_refuses_the_rest(void **state)
{
    (void)state;
    uint16_t port = cx_bench_stable_port("127.0.0.1");
    char spec[64];
    snprintf(spec, sizeof spec, "127.0.0.1:%u", port);
    cx_engine_t *e = engine_with_metrics("mref", spec);
    char *body;
    assert_int_equal(get(port, "/", &body), 404);
    free(body);
    assert_int_equal(get(port, "/metrics/x", &body), 404);
    free(body);
    assert_int_equal(get(port, "/metrics?name[]=x", &body), 200); /* a query string is ignored */
    free(body);
    const char post[] = "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
    assert_int_equal(http(port, post, sizeof post - 1, 5000, &body), 405);
    free(body);
    const char junk[] = "\x16\x03\x01 hello\r\n\r\n";
    assert_int_equal(http(port, junk, sizeof junk - 1, 5000, &body), 400);
    free(body);
    /* a header that never ends: refused once the bound is reached */
    size_t big = 64 << 10;
    char *huge = malloc(big);
    memcpy(huge, "GET /metrics HTTP/1.1\r\nX: ", 26);
    memset(huge + 26, 'a', big - 26);
    int code = http(port, huge, 8192, 5000, &body);
    assert_int_equal(code, 431);
    free(body);
    free(huge);
    /* a silent client holds the listener no longer than its timeout; the next one waits, then is served */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    usleep(50 * 1000);
    uint64_t t0 = cxt_now_ns();
    code = get(port, "/metrics", &body);
    double waited = cxt_ms_since(t0);
    print_message("behind a silent client: served after %.0f ms\n", waited);
    assert_int_equal(code, 200);
    assert_true(waited > 1000 && waited < 4900);
    must_parse(body);
    free(body);
    char c;
    struct pollfd pf = { fd, POLLIN, 0 };
    assert_int_equal(poll(&pf, 1, 1000), 1);
    assert_true(recv(fd, &c, 1, 0) <= 0); /* closed by the listener */
    close(fd);
    cx_engine_destroy(e);
    /* gone with its engine */
    assert_int_equal(get(port, "/metrics", &body), 0);
    free(body);
}

static void test_bad_value(void **state)
{
    (void)state;
    const char *bad[] = { "127.0.0.1", "localhost:9100", "127.0.0.1:99999", "127.0.0.1:",
                          ":9100",     "::1:9100",       "[::1]",           "127.0.0.1:91x" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cx_config_t c;
        memset(&c, 0, sizeof c);
        c.model = "mbad";
        cxt_apply_test_env(&c);
        setenv("CONNEX_METRICS", bad[i], 1);
        cx_engine_t *e = NULL;
        int rc = cx_engine_create(&c, &e);
        unsetenv("CONNEX_METRICS");
        if (rc != CX_EINVAL) fprintf(stderr, "CONNEX_METRICS=%s: %d\n", bad[i], rc);
        assert_int_equal(rc, CX_EINVAL);
        assert_null(e);
    }
    /* IPv6 in brackets is accepted (where the host has ::1) */
    cx_engine_t *e = NULL;
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "mv6";
    cxt_apply_test_env(&c);
    setenv("CONNEX_METRICS", "[::1]:0", 1);
    int rc = cx_engine_create(&c, &e);
    unsetenv("CONNEX_METRICS");
    assert_int_equal(rc, CX_OK);
    cx_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scrape_under_traffic, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_refuses_the_rest, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_bad_value, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    return cxt_run_tests(tests, NULL, NULL);
}
