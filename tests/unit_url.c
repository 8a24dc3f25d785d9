/* Identity URL and LID parsing: every accepted form round-trips; every malformed form returns
 * CX_EINVAL with a message that names the fault. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "connex/connex.h"

typedef struct {
    const char *s;
    const char *host;
    unsigned port;
    int v6;
    const char *model;
    uint32_t stage, shard, replica;
} good_url_t;

static const good_url_t good_urls[] = {
    { "127.0.0.1:5000#m|0|0|0", "127.0.0.1", 5000, 0, "m", 0, 0, 0 },
    { "[::1]:5000#m|0|0|0", "::1", 5000, 1, "m", 0, 0, 0 },
    { "10.0.0.2:51001#llama-8b|1|2|3", "10.0.0.2", 51001, 0, "llama-8b", 1, 2, 3 },
    { "0.0.0.0:1#a|0|0|0", "0.0.0.0", 1, 0, "a", 0, 0, 0 },
    { "255.255.255.255:65535#Z9|4294967295|4294967295|4294967295", "255.255.255.255", 65535, 0, "Z9", 4294967295u,
      4294967295u, 4294967295u },
    { "[fe80::1:2]:80#org/model_v1.2:chat|7|0|1", "fe80::1:2", 80, 1, "org/model_v1.2:chat", 7, 0, 1 },
    { "[::ffff:127.0.0.1]:9#x|1|1|1", "::ffff:127.0.0.1", 9, 1, "x", 1, 1, 1 },
};

static void test_url_good(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof good_urls / sizeof good_urls[0]; i++) {
        const good_url_t *g = &good_urls[i];
        cx_url_t u;
        char err[256] = "";
        memset(&u, 0x5a, sizeof u);
        int rc = cx_url_parse(g->s, &u, err, sizeof err);
        if (rc) fail_msg("'%s' refused: %s", g->s, err);
        assert_string_equal(u.host, g->host);
        assert_int_equal(u.port, g->port);
        assert_int_equal(u.is_ipv6, g->v6);
        assert_string_equal(u.lid.model, g->model);
        assert_int_equal(u.lid.stage, g->stage);
        assert_int_equal(u.lid.shard, g->shard);
        assert_int_equal(u.lid.replica, g->replica);
        char back[CX_URL_MAX];
        assert_int_equal(cx_url_format(&u, back, sizeof back), CX_OK);
        assert_string_equal(back, g->s);
        /* Round trip: formatting then parsing gives the same URL again. */
        cx_url_t u2;
        assert_int_equal(cx_url_parse(back, &u2, NULL, 0), CX_OK);
        assert_string_equal(u2.host, u.host);
        assert_int_equal(u2.port, u.port);
        assert_int_equal(cx_lid_cmp(&u2.lid, &u.lid), 0);
    }
}

static void test_url_model_max_len(void **state)
{
    (void)state;
    char model[CX_MODEL_MAX + 2], url[CX_URL_MAX + 64], err[256];
    cx_url_t u;
    memset(model, 'a', CX_MODEL_MAX - 1);
    model[CX_MODEL_MAX - 1] = 0; /* 63 characters: the longest allowed */
    snprintf(url, sizeof url, "127.0.0.1:5000#%s|0|0|0", model);
    assert_int_equal(cx_url_parse(url, &u, err, sizeof err), CX_OK);
    assert_int_equal(strlen(u.lid.model), CX_MODEL_MAX - 1);
    model[CX_MODEL_MAX - 1] = 'a';
    model[CX_MODEL_MAX] = 0; /* 64: one too many */
    snprintf(url, sizeof url, "127.0.0.1:5000#%s|0|0|0", model);
    err[0] = 0;
    assert_int_equal(cx_url_parse(url, &u, err, sizeof err), CX_EINVAL);
    assert_non_null(strstr(err, "model"));
    /* The longest IPv6 URL with the longest model fits CX_URL_MAX and formats back. */
    model[CX_MODEL_MAX - 1] = 0;
    snprintf(url, sizeof url,
             "[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535#%s|4294967295|4294967295|4294967295", model);
    assert_true(strlen(url) < CX_URL_MAX);
    assert_int_equal(cx_url_parse(url, &u, err, sizeof err), CX_OK);
    char back[CX_URL_MAX];
    assert_int_equal(cx_url_format(&u, back, sizeof back), CX_OK);
}

typedef struct {
    const char *s;
    const char *word;
} bad_t; /* word: expected in the message */

static const bad_t bad_urls[] = {
    { "", "#" },
    { "127.0.0.1:5000", "#" },       /* no identity */
    { "127.0.0.1#m|0|0|0", "port" }, /* no port */
    { ":5000#m|0|0|0", "address" },  /* empty address */
    { "127.0.0.1:0#m|0|0|0", "port" },
    { "127.0.0.1:65536#m|0|0|0", "port" },
    { "127.0.0.1:99999999999#m|0|0|0", "port" },
    { "127.0.0.1:50a0#m|0|0|0", "port" },
    { "127.0.0.1:-1#m|0|0|0", "port" },
    { "127.0.0.1:+80#m|0|0|0", "port" },
    { "127.0.0.1:05000#m|0|0|0", "port" }, /* two spellings of one identity */
    { "127.0.0.1:#m|0|0|0", "port" },
    { "127.0.0.1:5000:6000#m|0|0|0", "port" },
    { "localhost:5000#m|0|0|0", "localhost" }, /* host names are not identities */
    { "example.com:5000#m|0|0|0", "example.com" },
    { "256.0.0.1:5000#m|0|0|0", "256.0.0.1" },
    { "1.2.3:5000#m|0|0|0", "1.2.3" },
    { "::1:5000#m|0|0|0", "bracket" }, /* IPv6 without brackets */
    { "fe80::1:5000#m|0|0|0", "bracket" },
    { "[::1:5000#m|0|0|0", "]" },
    { "[::1]5000#m|0|0|0", "port" },
    { "[::1]:#m|0|0|0", "port" },
    { "[]:5000#m|0|0|0", "address" },
    { "[127.0.0.1]:5000#m|0|0|0", "127.0.0.1" }, /* IPv4 in brackets */
    { "[::zz]:5000#m|0|0|0", "::zz" },
    { "127.0.0.1:5000#|0|0|0", "model" },
    { "127.0.0.1:5000#m|0|0", "field" },
    { "127.0.0.1:5000#m", "field" },
    { "127.0.0.1:5000#", "field" },
    { "127.0.0.1:5000#m|0|0|0|", "field" },
    { "127.0.0.1:5000#m|0|0|0|1", "field" },
    { "127.0.0.1:5000#m|0|0|0x", "replica" }, /* trailing garbage */
    { "127.0.0.1:5000#m|0|0|0 ", "replica" },
    { "127.0.0.1:5000#m|0|0|0#1", "replica" },
    { " 127.0.0.1:5000#m|0|0|0", "address" }, /* spaces */
    { "127.0.0.1 :5000#m|0|0|0", "address" },
    { "127.0.0.1: 5000#m|0|0|0", "port" },
    { "127.0.0.1:5000 #m|0|0|0", "port" },
    { "127.0.0.1:5000#m |0|0|0", "model" },
    { "127.0.0.1:5000#m|0 |0|0", "stage" },
    { "127.0.0.1:5000#m| 0|0|0", "stage" },
    { "127.0.0.1:5000#m||0|0", "stage" },
    { "127.0.0.1:5000#m|a|0|0", "stage" },
    { "127.0.0.1:5000#m|-1|0|0", "stage" },
    { "127.0.0.1:5000#m|4294967296|0|0", "stage" }, /* uint32 overflow */
    { "127.0.0.1:5000#m|0|99999999999|0", "shard" },
    { "127.0.0.1:5000#m|0|0|01", "replica" },
    { "127.0.0.1:5000#bad!model|0|0|0", "model" },
    { "127.0.0.1:5000#m\tx|0|0|0", "model" },
};

/* Reports every bad case before failing, so one run shows the whole list. */
static void test_url_bad(void **state)
{
    (void)state;
    int failures = 0;
    for (size_t i = 0; i < sizeof bad_urls / sizeof bad_urls[0]; i++) {
        cx_url_t u;
        char err[256] = "";
        int rc = cx_url_parse(bad_urls[i].s, &u, err, sizeof err);
        if (rc != CX_EINVAL) {
            print_error("'%s' accepted (rc %d)\n", bad_urls[i].s, rc);
            failures++;
        } else if (!err[0]) {
            print_error("'%s': empty error message\n", bad_urls[i].s);
            failures++;
        } else if (!strstr(err, bad_urls[i].word)) {
            print_error("'%s': message '%s' does not mention '%s'\n", bad_urls[i].s, err, bad_urls[i].word);
            failures++;
        }
        /* Without an err buffer it still fails cleanly. */
        assert_int_equal(cx_url_parse(bad_urls[i].s, &u, NULL, 0), CX_EINVAL);
    }
    assert_int_equal(failures, 0);
}

static void test_url_too_long_and_null(void **state)
{
    (void)state;
    char url[CX_URL_MAX + 100], err[256] = "";
    cx_url_t u;
    memset(url, 0, sizeof url);
    strcpy(url, "127.0.0.1:5000#");
    memset(url + strlen(url), 'm', CX_URL_MAX);
    assert_int_equal(cx_url_parse(url, &u, err, sizeof err), CX_EINVAL);
    assert_true(err[0] != 0);
    err[0] = 0;
    assert_int_equal(cx_url_parse(NULL, &u, err, sizeof err), CX_EINVAL);
    assert_true(err[0] != 0);
    err[0] = 0;
    assert_int_equal(cx_url_parse("127.0.0.1:5000#m|0|0|0", NULL, err, sizeof err), CX_EINVAL);
    assert_true(err[0] != 0);
    /* A tiny err buffer is truncated, not overrun. */
    char tiny[4] = { 'x', 'x', 'x', 'x' };
    assert_int_equal(cx_url_parse("nope", &u, tiny, 3), CX_EINVAL);
    assert_int_equal(tiny[3], 'x');
    assert_true(memchr(tiny, 0, 3) != NULL);
}

static void test_url_format_small_buffer(void **state)
{
    (void)state;
    cx_url_t u;
    assert_int_equal(cx_url_parse("[::1]:5000#model|1|2|3", &u, NULL, 0), CX_OK);
    char buf[CX_URL_MAX];
    assert_int_equal(cx_url_format(&u, buf, sizeof buf), CX_OK);
    size_t need = strlen(buf) + 1;
    assert_int_equal(cx_url_format(&u, buf, need - 1), CX_EINVAL);
    assert_int_equal(cx_url_format(&u, buf, need), CX_OK);
    assert_int_equal(cx_url_format(NULL, buf, sizeof buf), CX_EINVAL);
    assert_int_equal(cx_url_format(&u, NULL, sizeof buf), CX_EINVAL);
}

static void test_lid_good_and_roundtrip(void **state)
{
    (void)state;
    static const char *good[] = { "m|0|0|0", "llama-8b|1|2|3", "a.b_c-d/e:f|4294967295|0|7", "X|10|200|3000" };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cx_lid_t l;
        char err[256] = "", back[CX_URL_MAX];
        if (cx_lid_parse(good[i], &l, err, sizeof err)) fail_msg("'%s' refused: %s", good[i], err);
        assert_int_equal(cx_lid_format(&l, back, sizeof back), CX_OK);
        assert_string_equal(back, good[i]);
        size_t need = strlen(back) + 1;
        assert_int_equal(cx_lid_format(&l, back, need - 1), CX_EINVAL);
    }
    cx_lid_t l;
    assert_int_equal(cx_lid_parse("llama|1|2|3", &l, NULL, 0), CX_OK);
    assert_string_equal(l.model, "llama");
    assert_int_equal(l.stage, 1);
    assert_int_equal(l.shard, 2);
    assert_int_equal(l.replica, 3);
    assert_int_equal(cx_lid_format(NULL, (char[8]){ 0 }, 8), CX_EINVAL);
}

static void test_lid_bad(void **state)
{
    (void)state;
    static const char *bad[] = {
        "",          "m",        "m|0",      "m|0|0",    "|0|0|0",   "m|0|0|0|",         "m|0|0|0|0",
        "m|x|0|0",   "m|0|0|-1", "m|0|0|0 ", " m|0|0|0", "m|00|0|0", "m|4294967296|0|0", "127.0.0.1:5000#m|0|0|0",
        "m m|0|0|0", "m|0||0",   "m|0|0|",   "|||",      NULL
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cx_lid_t l;
        char err[256] = "";
        int rc = cx_lid_parse(bad[i], &l, err, sizeof err);
        if (rc != CX_EINVAL) fail_msg("LID '%s' accepted", bad[i] ? bad[i] : "(null)");
        if (!err[0]) fail_msg("LID '%s': empty error message", bad[i] ? bad[i] : "(null)");
    }
    char model[CX_MODEL_MAX + 16];
    memset(model, 'q', CX_MODEL_MAX);
    strcpy(model + CX_MODEL_MAX, "|0|0|0");
    cx_lid_t l;
    char err[256] = "";
    assert_int_equal(cx_lid_parse(model, &l, err, sizeof err), CX_EINVAL);
    assert_non_null(strstr(err, "model"));
}

static void test_lid_cmp_total_order(void **state)
{
    (void)state;
    /* Sorted ascending; every pair must compare consistently with its position. */
    static const char *sorted[] = { "a|0|0|0",  "a|0|0|1", "a|0|1|0", "a|1|0|0", "a|4294967295|0|0",
                                    "ab|0|0|0", "b|0|0|0", "b|2|0|0", "b|10|0|0" };
    size_t n = sizeof sorted / sizeof sorted[0];
    cx_lid_t l[16];
    for (size_t i = 0; i < n; i++) assert_int_equal(cx_lid_parse(sorted[i], &l[i], NULL, 0), CX_OK);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < n; j++) {
            int c = cx_lid_cmp(&l[i], &l[j]);
            if (i == j)
                assert_int_equal(c, 0);
            else if (i < j) {
                if (c >= 0) fail_msg("%s !< %s", sorted[i], sorted[j]);
            } else if (c <= 0)
                fail_msg("%s !> %s", sorted[i], sorted[j]);
        }
    }
    /* Equality ignores whatever follows the model's NUL. */
    cx_lid_t x, y;
    memset(&x, 1, sizeof x);
    memset(&y, 2, sizeof y);
    assert_int_equal(cx_lid_parse("same|1|2|3", &x, NULL, 0), CX_OK);
    assert_int_equal(cx_lid_parse("same|1|2|3", &y, NULL, 0), CX_OK);
    assert_int_equal(cx_lid_cmp(&x, &y), 0);
}

static void test_strerror_and_event_names(void **state)
{
    (void)state;
    for (int rc = -12; rc <= 1; rc++) {
        const char *s = cx_strerror(rc);
        assert_non_null(s);
        assert_true(s[0] != 0);
    }
    assert_string_equal(cx_event_name(CX_EVENT_UP), "up");
    assert_string_equal(cx_event_name(CX_EVENT_JOINED), "joined");
    assert_string_equal(cx_event_name(CX_EVENT_FAILED), "failed");
    assert_string_equal(cx_event_name(CX_EVENT_SUSPECT), "suspect");
    assert_string_equal(cx_event_name(CX_EVENT_LEFT), "left");
    assert_non_null(cx_event_name((cx_event_type_t)99));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url_good),
        cmocka_unit_test(test_url_model_max_len),
        cmocka_unit_test(test_url_bad),
        cmocka_unit_test(test_url_too_long_and_null),
        cmocka_unit_test(test_url_format_small_buffer),
        cmocka_unit_test(test_lid_good_and_roundtrip),
        cmocka_unit_test(test_lid_bad),
        cmocka_unit_test(test_lid_cmp_total_order),
        cmocka_unit_test(test_strerror_and_event_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
