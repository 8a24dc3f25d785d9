/* The directory without a server: the static membership (cfg.peers, CONNEX_PEERS), bad input at
 * create, cx_directory_list with patterns, LID patterns, the version rule (a stale change is
 * ignored), bare-LID resolution through the directory, and an unreachable etcd. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxt.h"
#include "engine.h"
#include "mobility/dir_impl.h"
#include "mobility/json_lite.h"

static int make(cx_engine_t **e, const char *model, const char *dir, const char *peers)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.directory = dir;
    c.peers = peers;
    c.backend = "zmq";
    c.connect_timeout_ms = 1000;
    return cx_engine_create(&c, e);
}

static void test_static_list(void **state)
{
    (void)state;
    cx_engine_t *e;
    const char *peers = "127.0.0.1:5001#a|0|0|0, 127.0.0.1:5002#a|0|1|0,[::1]:5003#b|1|0|0,,";
    assert_int_equal(make(&e, "me", "static", peers), CX_OK);
    assert_string_equal(cx_directory_kind(e), "static");
    cx_dir_entry_t v[8];
    assert_int_equal(cx_directory_list(e, NULL, v, 8), 4); /* three peers and this engine */
    assert_int_equal(cx_directory_list(e, "*|*|*|*", v, 8), 4);
    assert_int_equal(cx_directory_list(e, "a|*|*|*", v, 8), 2);
    assert_int_equal(cx_directory_list(e, "a|0|1|*", v, 8), 1);
    assert_string_equal(v[0].url, "127.0.0.1:5002#a|0|1|0");
    assert_true(v[0].version >= 1);
    assert_int_equal(cx_directory_list(e, "b|1|*|0", v, 8), 1);
    assert_string_equal(v[0].url, "[::1]:5003#b|1|0|0");
    assert_int_equal(cx_directory_list(e, "me|0|0|0", v, 8), 1);
    assert_string_equal(v[0].url, cx_engine_local_url(e));
    assert_int_equal(cx_directory_list(e, "zzz|*|*|*", v, 8), 0);
    assert_int_equal(cx_directory_list(e, "*|*|*|*", v, 1), 4); /* the count, even past max */
    assert_int_equal(cx_directory_list(e, "*|*|*|*", NULL, 0), 4);
    assert_int_equal(cx_directory_list(e, "a|x|*|*", v, 8), CX_EINVAL);
    assert_int_equal(cx_directory_list(e, "a|*", v, 8), CX_EINVAL);
    assert_int_equal(cx_directory_list(e, "*", v, 8), CX_EINVAL);
    assert_int_equal(cx_directory_list(e, NULL, NULL, 3), CX_EINVAL);
    assert_int_equal(cx_directory_list(NULL, NULL, v, 8), CX_EINVAL);
    cx_engine_destroy(e);
}

static void test_static_default_and_env(void **state)
{
    (void)state;
    cx_engine_t *e;
    unsetenv("CONNEX_DIRECTORY");
    setenv("CONNEX_PEERS", "127.0.0.1:6001#envp|0|0|0", 1);
    assert_int_equal(make(&e, "me", NULL, NULL), CX_OK);
    assert_string_equal(cx_directory_kind(e), "static");
    cx_dir_entry_t v[4];
    assert_int_equal(cx_directory_list(e, "envp|*|*|*", v, 4), 1);
    cx_engine_destroy(e);
    /* The config wins over the environment. */
    assert_int_equal(make(&e, "me", NULL, ""), CX_OK);
    assert_int_equal(cx_directory_list(e, NULL, v, 4), 1);
    cx_engine_destroy(e);
    setenv("CONNEX_PEERS", "127.0.0.1:6001#envp|0|0|0,127.0.0.1#nope|0|0|0", 1);
    assert_int_equal(make(&e, "me", NULL, NULL), CX_EINVAL);
    assert_null(e);
    unsetenv("CONNEX_PEERS");
}

static void test_static_bad(void **state)
{
    (void)state;
    cx_engine_t *e;
    static const char *bad[] = { "nonsense",
                                 "127.0.0.1:5001#a|0|0|0,bad",
                                 "127.0.0.1:0#a|0|0|0",
                                 "localhost:5001#a|0|0|0",
                                 "127.0.0.1:5001#a|0|0",
                                 "127.0.0.1:5001#a|0|0|0|9" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(make(&e, "me", "static", bad[i]), CX_EINVAL);
        assert_null(e);
    }
    static const char *baddir[] = { "zookeeper://127.0.0.1:2181", "etcd://",        "etcd://127.0.0.1",
                                    "etcd://127.0.0.1:2379/x",    "etcd://a:1,b:2", "STATIC" };
    for (size_t i = 0; i < sizeof baddir / sizeof baddir[0]; i++) {
        assert_int_equal(make(&e, "me", baddir[i], NULL), CX_EINVAL);
        assert_null(e);
    }
}

static void test_etcd_unreachable(void **state)
{
    (void)state;
    int hold;
    uint16_t port = cxt_refusing_port(&hold);
    assert_true(port > 0);
    char spec[64];
    snprintf(spec, sizeof spec, "etcd://127.0.0.1:%u", port);
    cx_engine_t *e;
    uint64_t t0 = cxt_now_ns();
    assert_int_equal(make(&e, "me", spec, NULL), CX_EPEER);
    assert_null(e);
    assert_true(cxt_ms_since(t0) < 5000);
    close(hold);
}

static void test_lid_patterns(void **state)
{
    (void)state;
    cx_lid_pat_t p;
    cx_lid_t l;
    char err[200];
    assert_int_equal(cx_lid_pat_parse("llama|1|*|*", &p, err, sizeof err), CX_OK);
    assert_int_equal(cx_lid_parse("llama|1|3|2", &l, err, sizeof err), CX_OK);
    assert_true(cx_lid_pat_match(&p, &l));
    assert_int_equal(cx_lid_parse("llama|2|3|2", &l, err, sizeof err), CX_OK);
    assert_false(cx_lid_pat_match(&p, &l));
    assert_int_equal(cx_lid_pat_parse("*|*|*|*", &p, err, sizeof err), CX_OK);
    assert_true(cx_lid_pat_match(&p, &l));
    assert_int_equal(cx_lid_pat_parse("*|2|3|2", &p, err, sizeof err), CX_OK);
    assert_true(cx_lid_pat_match(&p, &l));
    assert_int_equal(cx_lid_parse("other|2|3|2", &l, err, sizeof err), CX_OK);
    assert_true(cx_lid_pat_match(&p, &l));
    assert_int_equal(cx_lid_pat_parse("llama|2|3|2", &p, err, sizeof err), CX_OK);
    assert_false(cx_lid_pat_match(&p, &l));
    assert_int_not_equal(cx_lid_pat_parse("llama|**|3|2", &p, err, sizeof err), CX_OK);
    assert_int_not_equal(cx_lid_pat_parse("llama|1|2", &p, err, sizeof err), CX_OK);
    assert_int_not_equal(cx_lid_pat_parse("", &p, err, sizeof err), CX_OK);
    assert_int_not_equal(cx_lid_pat_parse(NULL, &p, err, sizeof err), CX_OK);
}

/* The version rule, on the table both implementations feed. */
static void test_stale_version(void **state)
{
    (void)state;
    cx_engine_t *e;
    assert_int_equal(make(&e, "me", "static", NULL), CX_OK);
    cx_dir_t *d = e->dir;
    cx_dir_entry_t a = { .version = 10 }, got;
    char err[200];
    assert_int_equal(cx_lid_parse("s|0|0|0", &a.lid, err, sizeof err), CX_OK);
    snprintf(a.url, sizeof a.url, "127.0.0.1:7001#s|0|0|0");
    assert_int_equal(cx_dir_table_apply(d, &a, CX_DIR_PUT), 1);
    assert_int_equal(cx_dir_table_apply(d, &a, CX_DIR_PUT), 0); /* a replay */
    cx_dir_entry_t old = a;
    old.version = 5;
    snprintf(old.url, sizeof old.url, "127.0.0.1:7002#s|0|0|0");
    assert_int_equal(cx_dir_table_apply(d, &old, CX_DIR_PUT), 0); /* a stale route */
    assert_int_equal(cx_dir_lookup(e, &a.lid, &got), CX_OK);
    assert_string_equal(got.url, "127.0.0.1:7001#s|0|0|0");
    old.version = 7;
    assert_int_equal(cx_dir_table_apply(d, &old, CX_DIR_DEL), 0); /* an old delete */
    assert_int_equal(cx_dir_lookup(e, &a.lid, &got), CX_OK);
    cx_dir_entry_t nw = old;
    nw.version = 11;
    assert_int_equal(cx_dir_table_apply(d, &nw, CX_DIR_PUT), 1); /* moved */
    assert_int_equal(cx_dir_lookup(e, &a.lid, &got), CX_OK);
    assert_string_equal(got.url, "127.0.0.1:7002#s|0|0|0");
    assert_int_equal(got.version, 11);
    nw.version = 12;
    assert_int_equal(cx_dir_table_apply(d, &nw, CX_DIR_DEL), 1);
    assert_int_equal(cx_dir_lookup(e, &a.lid, &got), CX_EINVAL);
    a.version = 9; /* older than the delete */
    assert_int_equal(cx_dir_table_apply(d, &a, CX_DIR_PUT), 0);
    assert_int_equal(cx_dir_lookup(e, &a.lid, &got), CX_EINVAL);
    cx_dir_entry_t v[4];
    assert_int_equal(cx_directory_list(e, "s|*|*|*", v, 4), 0);
    /* The progress thread counts what it applied. */
    cx_stats_t st;
    for (int i = 0; i < 100; i++) {
        assert_int_equal(cx_stats(e, &st), CX_OK);
        if (st.directory_changes >= 4) break;
        usleep(20000);
    }
    assert_true(st.directory_changes >= 4); /* self, the put, the move, the delete */
    cx_engine_destroy(e);
}

/* A bare LID the engine never saw but the directory lists is dialled at the listed URL: nobody
 * is there, so the op fails as a peer failure (CX_EPEER), not as a bad name (CX_EINVAL). */
static void test_bare_lid_resolves(void **state)
{
    (void)state;
    int hold;
    uint16_t port = cxt_refusing_port(&hold);
    char peers[96];
    snprintf(peers, sizeof peers, "127.0.0.1:%u#far|0|0|0", port);
    cx_engine_t *e;
    assert_int_equal(make(&e, "me", "static", peers), CX_OK);
    assert_int_equal(cx_send_msg(e, "far|0|0|0", "x", 1), CX_EPEER);
    assert_int_equal(cx_send_msg(e, "unlisted|0|0|0", "x", 1), CX_EINVAL);
    assert_int_equal(cx_send_msg(e, "me|0|0|0", "x", 1), CX_EINVAL); /* ourselves */
    cx_engine_destroy(e);
    close(hold);
}

/* The gateway's JSON and base64: what etcd sends is found, and malformed or truncated input is
 * "not found", never a read past the end (ASan runs this). */
static cx_js_t js(const char *s)
{
    return (cx_js_t){ s, s + strlen(s) };
}

static void test_json_lite(void **state)
{
    (void)state;
    const char *m = "{\"result\":{\"header\":{\"revision\":\"42\"},\"events\":[{\"kv\":{\"key\":\"YQ==\","
                    "\"mod_revision\":\"7\"}},{\"type\":\"DELETE\",\"kv\":{\"key\":\"Yg==\"}}],\"created\":true}}";
    cx_js_t res = cx_js_get(js(m), "result");
    assert_non_null(res.s);
    uint64_t v = 0;
    assert_int_equal(cx_js_u64(cx_js_get(cx_js_get(res, "header"), "revision"), &v), 0);
    assert_int_equal(v, 42);
    assert_true(cx_js_bool(cx_js_get(res, "created")));
    cx_js_t it = { 0, 0 }, ev;
    int n = 0;
    char buf[64];
    while (cx_js_next(cx_js_get(res, "events"), &it, &ev)) {
        assert_int_equal(cx_js_str(cx_js_get(cx_js_get(ev, "kv"), "key"), buf, sizeof buf), 0);
        n++;
    }
    assert_int_equal(n, 2);
    assert_int_equal(cx_js_str(cx_js_get(ev, "type"), buf, sizeof buf), 0);
    assert_string_equal(buf, "DELETE");
    assert_null(cx_js_get(res, "nope").s);
    /* Every prefix of the message is malformed: nothing is found past its end. */
    for (size_t l = 0; l < strlen(m); l++) {
        char *t = malloc(l + 1);
        memcpy(t, m, l);
        t[l] = 0;
        cx_js_t r = cx_js_get((cx_js_t){ t, t + l }, "result");
        if (r.s) assert_true(r.end <= t + l);
        cx_js_t e2 = { 0, 0 }, x;
        for (int k = 0; k < 10 && cx_js_next(cx_js_get(r, "events"), &e2, &x); k++) assert_true(x.end <= t + l);
        free(t);
    }
    static const char *bad[] = {
        "",       "{",         "}",           "[",
        "{\"a\"", "{\"a\":",   "{\"a\":[1,2", "{\"a\":\"x",
        "\"",     "{\"a\" 1}", "{1:2}",       "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_null(cx_js_get(js(bad[i]), "a").s);
        cx_js_t e3 = { 0, 0 }, x;
        assert_int_equal(cx_js_next(js(bad[i]), &e3, &x), 0);
    }
    assert_int_equal(cx_js_u64(js("\"12x\""), &v), -1);
    assert_int_equal(cx_js_u64(js("\"99999999999999999999999\""), &v), -1);
    assert_int_equal(cx_js_str(js("\"a\\\"b\""), buf, sizeof buf), -1); /* escapes: not ours */
    assert_int_equal(cx_js_str(js("\"abcdef\""), buf, 4), -1);          /* too long */

    char enc[64];
    uint8_t dec[64];
    static const char *plain[] = { "", "a", "ab", "abc", "/connex/lid/m|1|2|3" };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        size_t el = cx_b64_enc(plain[i], strlen(plain[i]), enc);
        assert_int_equal(el, 4 * ((strlen(plain[i]) + 2) / 3));
        int dl = cx_b64_dec(enc, el, dec, sizeof dec);
        assert_int_equal(dl, (int)strlen(plain[i]));
        assert_memory_equal(dec, plain[i], (size_t)dl);
    }
    assert_int_equal(cx_b64_dec("YW!j", 4, dec, sizeof dec), -1);
    assert_int_equal(cx_b64_dec("YWJjZGVm", 8, dec, 3), -1); /* does not fit */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lid_patterns),      cmocka_unit_test(test_json_lite),
        cmocka_unit_test(test_static_list),       cmocka_unit_test(test_static_default_and_env),
        cmocka_unit_test(test_static_bad),        cmocka_unit_test(test_stale_version),
        cmocka_unit_test(test_bare_lid_resolves), cmocka_unit_test(test_etcd_unreachable),
    };
    return cxt_run_tests(tests, NULL, NULL);
}
