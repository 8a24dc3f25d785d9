/* Authentication of the control channel (core/src/auth.h): right token, wrong token, no token
 * against a token, a token against none, a replayed handshake, a replayed HELLO, token files.
 * A refused peer must learn no regions or keys, the refusal is counted, and ops return CX_EAUTH.
 * Runs on the backend CONNEX_BACKEND names (ZeroMQ when unset): the handshake is the core's, the
 * same for every backend, and an authenticated pair must then move data on that backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "ctl_wire.h"
#include "cxt.h"

#define TOKEN_A "7f1c0a9e5b2d48c6a3e1f0b9d8c7e6a5"
#define TOKEN_B "00000000000000000000000000000000"
#define RS 65536

/* The backend under test: CONNEX_BACKEND (which the engine reads itself), else ZeroMQ. */
/* The directory for scratch files: $TMPDIR, else the system's (P_tmpdir). */
static const char *tmp_base(void)
{
    const char *t = getenv("TMPDIR");
    return t && *t ? t : P_tmpdir;
}

static const char *backend(void)
{
    const char *b = getenv("CONNEX_BACKEND");
    return b && *b ? b : "zmq";
}

static cx_engine_t *mk(const char *model, uint32_t replica, const char *token)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.replica = replica;
    c.backend = backend();
    c.auth_token = token;
    c.connect_timeout_ms = 3000;
    c.op_timeout_ms = 5000;
    cx_engine_t *e = NULL;
    int rc = cx_engine_create(&c, &e);
    if (rc) fprintf(stderr, "cx_engine_create(%s): %s\n", model, cx_strerror(rc));
    return e;
}

static cx_stats_t stats(cx_engine_t *e)
{
    cx_stats_t st;
    memset(&st, 0, sizeof st);
    assert_int_equal(cx_stats(e, &st), 0);
    return st;
}

static void lid_of(cx_engine_t *e, char *out, size_t n)
{
    snprintf(out, n, "%s", strchr(cx_engine_local_url(e), '#') + 1);
}

/* No UP/JOINED event for anybody within ms. */
static void assert_no_peer_event(cx_engine_t *e, int ms)
{
    cx_event_t ev;
    int rc = cx_wait_event(e, &ev, ms);
    if (rc == 0) fprintf(stderr, "unexpected event %s from %s\n", cx_event_name(ev.type), ev.url);
    assert_int_equal(rc, CX_ETIMEDOUT);
}

static void test_right_token(void **state)
{
    (void)state;
    cx_engine_t *a = mk("auth-a", 0, TOKEN_A), *b = mk("auth-b", 1, TOKEN_A);
    assert_non_null(a);
    assert_non_null(b);
    static uint8_t ra[RS], rb[RS];
    cxt_fill(ra, RS, 11, 0);
    assert_int_equal(cx_register_memory(a, ra, RS), 0);
    assert_int_equal(cx_register_memory(b, rb, RS), 0);
    assert_int_equal(cx_connect(b, cx_engine_local_url(a), 5000), 0);
    char la[CX_URL_MAX];
    lid_of(a, la, sizeof la);
    /* The pair is on the backend under test, and data moves both ways on it. */
    const char *pb = cx_peer_backend(b, la);
    fprintf(stderr, "authenticated pair on %s\n", pb ? pb : "(none)");
    assert_non_null(pb);
    assert_string_equal(pb, backend());
    assert_int_equal(cx_read(b, la, rb, (uint64_t)(uintptr_t)ra, RS), 0);
    assert_int_equal(cxt_check(rb, RS, 11, 0), -1);
    cxt_fill(rb, RS, 12, 0);
    assert_int_equal(cx_write(b, la, rb, (uint64_t)(uintptr_t)ra + 4096, RS - 4096), 0);
    assert_int_equal(cxt_check(ra + 4096, RS - 4096, 12, 0), -1);
    cx_op_t *op = NULL;
    assert_int_equal(cx_put_signal(b, la, rb, (uint64_t)(uintptr_t)ra, 4096, "signal", 6, &op), 0);
    assert_int_equal(cx_op_wait(op, 10000), 0);
    cx_msg_t m;
    assert_int_equal(cx_recv_msg(a, &m, 5000), 0);
    assert_int_equal(m.len, 6);
    assert_memory_equal(m.data, "signal", 6);
    cx_msg_release(&m);
    assert_int_equal(cxt_check(ra, 4096, 12, 0), -1);
    assert_int_equal(stats(a).auth_refused, 0);
    assert_int_equal(stats(b).auth_refused, 0);
    assert_int_equal(stats(a).peers_up, 1);
    cx_engine_destroy(b);
    cx_engine_destroy(a);
}

/* b tries a (with tokens ta, tb): refused with CX_EAUTH on the dialler, counted on both sides,
 * a never sees b as a peer and b learns none of a's regions. */
static void refused_pair(const char *ta, const char *tb)
{
    cx_engine_t *a = mk("auth-a", 0, ta), *b = mk("auth-b", 1, tb);
    assert_non_null(a);
    assert_non_null(b);
    static uint8_t ra[RS], rb[RS];
    assert_int_equal(cx_register_memory(a, ra, RS), 0);
    assert_int_equal(cx_register_memory(b, rb, RS), 0);
    uint64_t t0 = cxt_now_ns();
    assert_int_equal(cx_connect(b, cx_engine_local_url(a), 5000), CX_EAUTH);
    assert_true(cxt_ms_since(t0) < 2000); /* a refusal, not a timeout */
    /* Ops by URL dial again and are refused again, with the same code. */
    char url[CX_URL_MAX];
    snprintf(url, sizeof url, "%s", cx_engine_local_url(a));
    assert_int_equal(cx_read(b, url, rb, (uint64_t)(uintptr_t)ra, 64), CX_EAUTH);
    assert_int_equal(cx_send_msg(b, url, "x", 1), CX_EAUTH);
    cx_stats_t sa = stats(a), sb = stats(b);
    assert_true(sa.auth_refused >= 2);
    assert_true(sb.auth_refused >= 2);
    assert_int_equal(sa.peers_up, 0);
    assert_int_equal(sb.peers_up, 0);
    assert_no_peer_event(a, 200);
    cx_msg_t m;
    assert_int_equal(cx_recv_msg(a, &m, 100), CX_ETIMEDOUT);
    cx_engine_destroy(b);
    cx_engine_destroy(a);
}

static void test_wrong_token(void **state)
{
    (void)state;
    refused_pair(TOKEN_A, TOKEN_B);
}
static void test_no_token_against_token(void **state)
{
    (void)state;
    refused_pair(TOKEN_A, NULL);
}
static void test_token_against_no_token(void **state)
{
    (void)state;
    refused_pair(NULL, TOKEN_A);
}

/* ---- raw control connections: speak the protocol by hand ---- */

static int raw_connect(cx_engine_t *e)
{
    cx_url_t u;
    assert_int_equal(cx_url_parse(cx_engine_local_url(e), &u, NULL, 0), 0);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(u.port) };
    inet_pton(AF_INET, u.host, &sa.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void raw_send(int fd, uint8_t type, const void *body, size_t len, uint8_t *rec, size_t *reclen)
{
    uint8_t hdr[CX_CTL_HDR];
    cx_ctl_hdr(hdr, (uint32_t)len, type);
    assert_int_equal(send(fd, hdr, sizeof hdr, MSG_NOSIGNAL), (ssize_t)sizeof hdr);
    if (len) assert_int_equal(send(fd, body, len, MSG_NOSIGNAL), (ssize_t)len);
    if (rec) { /* keep the exact bytes, to replay them */
        memcpy(rec, hdr, sizeof hdr);
        memcpy(rec + sizeof hdr, body, len);
        *reclen = sizeof hdr + len;
    }
}

/* Exactly n bytes within timeout_ms: 0, or -1 on EOF/timeout. */
static int read_n(int fd, uint8_t *b, size_t n, int timeout_ms)
{
    size_t got = 0;
    uint64_t t0 = cxt_now_ns();
    while (got < n) {
        int left = timeout_ms - (int)cxt_ms_since(t0);
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        if (left <= 0 || poll(&pfd, 1, left) <= 0) return -1;
        ssize_t r = recv(fd, b + got, n - got, 0);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* One frame: its type, body in body (cap bytes). Returns the body length or -1. */
static long raw_recv(int fd, uint8_t *type, uint8_t *body, size_t cap)
{
    uint8_t hdr[CX_CTL_HDR];
    uint32_t blen;
    if (read_n(fd, hdr, sizeof hdr, 3000) || cx_ctl_hdr_parse(hdr, &blen, type) || blen > cap) return -1;
    if (read_n(fd, body, blen, 3000)) return -1;
    return (long)blen;
}

static void expect_refuse_eauth(int fd)
{
    uint8_t type, body[512];
    long n = raw_recv(fd, &type, body, sizeof body);
    assert_true(n >= 4);
    assert_int_equal(type, CX_CTL_REFUSE);
    cx_rd_t r;
    cx_rd_init(&r, body, (size_t)n);
    assert_int_equal((int32_t)cx_rd_u32(&r), CX_EAUTH);
    /* and then the acceptor closes: nothing else (no HELLO_ACK, no region) follows */
    uint8_t more;
    assert_int_equal(read_n(fd, &more, 1, 2000), -1);
}

static void auth_step(int fd, uint8_t step, const uint8_t *data, uint8_t *rec, size_t *reclen)
{
    cx_auth_frame_t f = { .step = step };
    memcpy(f.data, data, CX_AUTH_NONCE);
    uint8_t b[CX_AUTH_BODY];
    cx_auth_frame_put(b, &f);
    raw_send(fd, CX_CTL_AUTH, b, sizeof b, rec, reclen);
}

static void auth_expect(int fd, uint8_t step, uint8_t *data)
{
    uint8_t type, body[64];
    long n = raw_recv(fd, &type, body, sizeof body);
    assert_int_equal(type, CX_CTL_AUTH);
    cx_auth_frame_t f;
    assert_int_equal(cx_auth_frame_get(body, (size_t)n, &f), 0);
    assert_int_equal(f.step, step);
    memcpy(data, f.data, CX_AUTH_NONCE);
}

static void test_replayed_hello(void **state)
{
    (void)state;
    cx_engine_t *a = mk("auth-a", 0, TOKEN_A);
    assert_non_null(a);
    static uint8_t ra[RS];
    assert_int_equal(cx_register_memory(a, ra, RS), 0);
    cx_auth_t key;
    memset(&key, 0, sizeof key);
    memcpy(key.key, TOKEN_A, strlen(TOKEN_A));
    key.key_len = strlen(TOKEN_A);

    /* 1. A legitimate exchange, recorded. */
    uint8_t nd[CX_AUTH_NONCE], na1[CX_AUTH_NONCE], pa[CX_AUTH_MAC], proof[CX_AUTH_MAC];
    for (int i = 0; i < CX_AUTH_NONCE; i++) nd[i] = (uint8_t)(i * 7 + 1);
    uint8_t rec3[64], rec_hello[1024];
    size_t rec3_len = 0, rec_hello_len = 0;
    int fd = raw_connect(a);
    auth_step(fd, 1, nd, NULL, NULL);
    auth_expect(fd, 2, na1);
    assert_int_equal(cx_auth_proof(&key, 'D', nd, na1, proof), 0);
    auth_step(fd, 3, proof, rec3, &rec3_len);
    auth_expect(fd, 4, pa);
    assert_true(cx_auth_proof_ok(&key, 'A', nd, na1, pa)); /* the acceptor proved itself */
    cx_lid_t me = { .model = "raw", .replica = 9 }, target;
    char la[CX_URL_MAX];
    lid_of(a, la, sizeof la);
    assert_int_equal(cx_lid_parse(la, &target, NULL, 0), 0);
    uint8_t hb[512];
    cx_wr_t w;
    cx_wr_init(&w, hb, sizeof hb);
    cx_wire_put_hello_head(&w, 0x1234, &me, "127.0.0.1:9#raw|0|0|9", &target, "", 1000, 3000, 0, -1, 0, NULL, NULL,
                           NULL, NULL, 0);
    assert_true(w.ok);
    raw_send(fd, CX_CTL_HELLO, hb, w.len, rec_hello, &rec_hello_len);
    uint8_t type, body[4096];
    long n = raw_recv(fd, &type, body, sizeof body);
    assert_true(n > 0);
    assert_int_equal(type, CX_CTL_HELLO_ACK); /* proof accepted: the acceptor answers */
    cx_wire_hello_t h;
    char err[200];
    assert_int_equal(cx_wire_get_hello(body, (size_t)n, &h, err, sizeof err), 0);
    assert_int_equal(h.nregions, 1);
    close(fd);
    uint64_t base = stats(a).auth_refused;
    assert_int_equal(base, 0);

    /* 2. The recorded proof on a new connection: a fresh nonce_a, so it must fail. */
    uint8_t na2[CX_AUTH_NONCE];
    fd = raw_connect(a);
    auth_step(fd, 1, nd, NULL, NULL);
    auth_expect(fd, 2, na2);
    assert_memory_not_equal(na1, na2, CX_AUTH_NONCE);
    assert_int_equal(send(fd, rec3, rec3_len, MSG_NOSIGNAL), (ssize_t)rec3_len);
    expect_refuse_eauth(fd);
    close(fd);

    /* 3. The recorded HELLO alone, without the exchange. */
    fd = raw_connect(a);
    assert_int_equal(send(fd, rec_hello, rec_hello_len, MSG_NOSIGNAL), (ssize_t)rec_hello_len);
    expect_refuse_eauth(fd);
    close(fd);

    /* 4. The whole recorded dialler side, back to back (step 1, old step 3, HELLO). */
    fd = raw_connect(a);
    auth_step(fd, 1, nd, NULL, NULL);
    assert_int_equal(send(fd, rec3, rec3_len, MSG_NOSIGNAL), (ssize_t)rec3_len);
    assert_int_equal(send(fd, rec_hello, rec_hello_len, MSG_NOSIGNAL), (ssize_t)rec_hello_len);
    auth_expect(fd, 2, na2);
    expect_refuse_eauth(fd);
    close(fd);

    /* 5. Out of order and malformed AUTH frames. */
    fd = raw_connect(a);
    auth_step(fd, 3, proof, NULL, NULL);
    expect_refuse_eauth(fd);
    close(fd);
    fd = raw_connect(a);
    raw_send(fd, CX_CTL_AUTH, "garbage", 7, NULL, NULL);
    expect_refuse_eauth(fd);
    close(fd);

    /* 6. A huge frame before authentication is not buffered. */
    fd = raw_connect(a);
    uint8_t hdr[CX_CTL_HDR];
    cx_ctl_hdr(hdr, 32u << 20, CX_CTL_HELLO);
    assert_int_equal(send(fd, hdr, sizeof hdr, MSG_NOSIGNAL), (ssize_t)sizeof hdr);
    expect_refuse_eauth(fd);
    close(fd);

    assert_int_equal(stats(a).auth_refused, base + 6);
    /* Only the legitimate raw peer ever became a peer. */
    cx_event_t ev;
    assert_int_equal(cx_wait_event(a, &ev, 1000), 0);
    assert_string_equal(ev.peer.model, "raw");
    cx_engine_destroy(a);
}

/* CONNEX_AUTH_TOKEN_FILE: the token is the file's content without its trailing newline; a
 * missing or empty file makes engine creation fail clearly. */
static void test_token_file(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/cx-token-XXXXXX", tmp_base());
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, TOKEN_A "\n", strlen(TOKEN_A) + 1), (ssize_t)strlen(TOKEN_A) + 1);
    close(fd);
    unsetenv("CONNEX_AUTH_TOKEN");
    setenv("CONNEX_AUTH_TOKEN_FILE", path, 1);
    cx_engine_t *a = mk("auth-a", 0, NULL); /* token from the file */
    unsetenv("CONNEX_AUTH_TOKEN_FILE");
    cx_engine_t *b = mk("auth-b", 1, TOKEN_A); /* the same token, from the config */
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(cx_connect(b, cx_engine_local_url(a), 5000), 0);
    cx_engine_destroy(b);
    cx_engine_destroy(a);

    cx_engine_t *x = NULL;
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "auth-x";
    c.backend = backend();
    assert_int_equal(truncate(path, 0), 0);
    setenv("CONNEX_AUTH_TOKEN_FILE", path, 1);
    assert_int_equal(cx_engine_create(&c, &x), CX_EINVAL); /* empty */
    unlink(path);
    assert_int_equal(cx_engine_create(&c, &x), CX_EINVAL); /* missing */
    unsetenv("CONNEX_AUTH_TOKEN_FILE");
    c.auth_token = "";
    assert_int_equal(cx_engine_create(&c, &x), CX_EINVAL); /* empty in the config */
    assert_null(x);
}

/* A peer process given the token by environment (how deployments pass it) talks to an engine
 * given it by config; the same process without it is refused. */
static void test_env_token_peer_process(void **state)
{
    (void)state;
    cx_engine_t *a = mk("auth-a", 0, TOKEN_A);
    assert_non_null(a);
    static uint8_t ra[RS];
    assert_int_equal(cx_register_memory(a, ra, RS), 0);
    cxt_fill(ra, RS, 5, 0);
    char rep[256], la[CX_URL_MAX];
    lid_of(a, la, sizeof la);

    setenv("CONNEX_AUTH_TOKEN", TOKEN_A, 1);
    cxt_peer_t p;
    cxt_peer_opts_t o = { .model = "auth-p", .replica = 2, .region = RS, .seed = 3 };
    int rc = cxt_peer_start(&p, &o, 10000);
    unsetenv("CONNEX_AUTH_TOKEN");
    assert_int_equal(rc, 0);
    assert_int_equal(cxt_peer_cmd(&p, 10000, rep, sizeof rep, "CONNECT %s 5000", cx_engine_local_url(a)), 0);
    assert_int_equal(
        cxt_peer_cmd(&p, 10000, rep, sizeof rep, "READ %s 0x%llx 4096 0", la, (unsigned long long)(uintptr_t)ra), 0);
    cxt_peer_stop(&p);

    cxt_peer_t q;
    o.replica = 3;
    assert_int_equal(cxt_peer_start(&q, &o, 10000), 0);
    assert_int_equal(cxt_peer_cmd(&q, 10000, rep, sizeof rep, "CONNECT %s 5000", cx_engine_local_url(a)), CX_EAUTH);
    assert_int_equal(cxt_peer_cmd(&q, 10000, rep, sizeof rep, "READ %s 0x%llx 4096 0", cx_engine_local_url(a),
                                  (unsigned long long)(uintptr_t)ra),
                     CX_EAUTH);
    cxt_peer_stop(&q);
    assert_true(stats(a).auth_refused >= 2);
    cx_engine_destroy(a);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    /* The tests choose tokens themselves; one inherited from the shell would change them. */
    unsetenv("CONNEX_AUTH_TOKEN");
    unsetenv("CONNEX_AUTH_TOKEN_FILE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_right_token, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_wrong_token, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_no_token_against_token, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_token_against_no_token, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_replayed_hello, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_token_file, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_env_token_peer_process, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    if (getenv("CXT_FILTER")) cmocka_set_test_filter(getenv("CXT_FILTER"));
    return cxt_run_tests(tests, NULL, NULL);
}
