/* The CONNEX_* options table (connex/options.h): the parser's rules for each type, the getters,
 * cx_engine_create refusing a bad value, and README.md's configuration table listing exactly the
 * table's variables (argv[1]: the README). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "connex/connex.h"
#include "connex/options.h"
#include "engine.h" /* e->opts: the table an engine hands its backends */

static const char *g_readme;

static void parse_ok(const char *name, const char *s, unsigned long long want)
{
    const cx_opt_def_t *d = cx_opt_find(name);
    assert_non_null(d);
    unsigned long long v = 12345;
    char err[256] = "";
    assert_int_equal(cx_opt_parse(d, s, &v, NULL, err, sizeof err), CX_OK);
    assert_int_equal(v, want);
}

static void parse_bad(const char *name, const char *s, const char *allowed)
{
    const cx_opt_def_t *d = cx_opt_find(name);
    assert_non_null(d);
    char err[256] = "";
    assert_int_equal(cx_opt_parse(d, s, NULL, NULL, err, sizeof err), CX_EINVAL);
    /* The message names the variable, the value and what is allowed. */
    char want[128];
    snprintf(want, sizeof want, "%s=%s", name, s);
    assert_non_null(strstr(err, want));
    assert_non_null(strstr(err, allowed));
}

static void test_parse(void **state)
{
    (void)state;
    parse_ok("CONNEX_POLL_US", "0", 0);
    parse_ok("CONNEX_POLL_US", "100000", 100000);
    parse_bad("CONNEX_POLL_US", "100001", "0..100000");
    parse_bad("CONNEX_POLL_US", "-1", "0..100000");
    parse_bad("CONNEX_POLL_US", "5x", "0..100000");
    parse_bad("CONNEX_POLL_US", " 7", "0..100000");
    parse_bad("CONNEX_POLL_US", "99999999999999999999999", "0..100000");
    parse_ok("CONNEX_STAGE_CHUNK", "64K", 64 << 10);
    parse_ok("CONNEX_STAGE_CHUNK", "1g", 1ull << 30);
    parse_bad("CONNEX_STAGE_CHUNK", "2G", "1..1073741824");
    parse_bad("CONNEX_STAGE_CHUNK", "0", "1..1073741824");
    parse_bad("CONNEX_STAGE_CHUNK", "4Q", "K/M/G");
    parse_bad("CONNEX_STAGE_SLOTS", "8K", "1..1024"); /* suffixes only for bytes */
    parse_ok("CONNEX_DRIVE", "0", 0);
    parse_ok("CONNEX_DRIVE", "on", 1);
    parse_ok("CONNEX_DRIVE", "Yes", 1);
    parse_bad("CONNEX_DRIVE", "2", "0|1");
    parse_ok("CONNEX_LOG", "debug", 3);
    parse_ok("CONNEX_LOG", "WARN", 1);
    parse_ok("CONNEX_LOG", "2", 2);
    parse_bad("CONNEX_LOG", "verbose", "error|warn|info|debug");
    parse_ok("CONNEX_GDR", "auto", 0);
    parse_ok("CONNEX_GDR", "off", 1);
    parse_ok("CONNEX_GDR", "1", 2);
    parse_bad("CONNEX_GDR", "maybe", "auto|0|1");
    parse_ok("CONNEX_FI_TCP_READ", "writeback", 2);
    parse_bad("CONNEX_FI_TCP_READ", "rdma", "auto|rma|writeback");
    double f = -1;
    const cx_opt_def_t *g = cx_opt_find("CONNEX_GPU_SIM_GBPS");
    assert_int_equal(cx_opt_parse(g, "2.5", NULL, &f, NULL, 0), CX_OK);
    assert_true(f == 2.5);
    assert_int_equal(cx_opt_parse(g, "-1", NULL, &f, NULL, 0), CX_EINVAL);
    assert_int_equal(cx_opt_parse(g, "fast", NULL, &f, NULL, 0), CX_EINVAL);
}

/* Every entry: a CONNEX_* name, doc, component; a default that parses; enums with words. */
static void test_table(void **state)
{
    (void)state;
    size_t n;
    const cx_opt_def_t *t = cx_opt_table(&n);
    assert_true(n > 30);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(strncmp(t[i].name, "CONNEX_", 7), 0);
        assert_non_null(t[i].doc);
        assert_non_null(t[i].component);
        assert_true(cx_opt_find(t[i].name) == &t[i]); /* no name twice */
        if (t[i].type == CX_OPT_ENUM) assert_non_null(t[i].allowed);
        if (t[i].dflt && t[i].type != CX_OPT_STRING) {
            unsigned long long v;
            double f;
            if (cx_opt_parse(&t[i], t[i].dflt, &v, &f, NULL, 0))
                fail_msg("%s: default %s does not parse", t[i].name, t[i].dflt);
        }
    }
}

static void test_getters(void **state)
{
    (void)state;
    unsigned long long v = 7;
    unsetenv("CONNEX_FI_POLL_US");
    assert_int_equal(cx_opt_get_num("CONNEX_FI_POLL_US", &v), 0);
    assert_int_equal(v, 100);
    setenv("CONNEX_FI_POLL_US", "250", 1);
    assert_int_equal(cx_opt_get_num("CONNEX_FI_POLL_US", &v), 1);
    assert_int_equal(v, 250);
    setenv("CONNEX_FI_POLL_US", "lots", 1);
    assert_int_equal(cx_opt_get_num("CONNEX_FI_POLL_US", &v), CX_EINVAL);
    assert_int_equal(v, 100); /* the default */
    unsetenv("CONNEX_FI_POLL_US");
    const char *s = "x";
    assert_int_equal(cx_opt_get_str("CONNEX_LIBCUDA", &s), 0);
    assert_string_equal(s, "libcuda.so.1");
    assert_int_equal(cx_opt_get_str("CONNEX_HOST_ID", &s), 0);
    assert_null(s);
    setenv("CONNEX_HOST_ID", "h1", 1);
    assert_int_equal(cx_opt_get_str("CONNEX_HOST_ID", &s), 1);
    assert_string_equal(s, "h1");
    unsetenv("CONNEX_HOST_ID");
    assert_int_equal(cx_opt_get_num("CONNEX_NOT_AN_OPTION", &v), CX_EINVAL);
}

/* A bad value anywhere in the table: cx_engine_create refuses before it starts anything. */
static void test_engine_refuses(void **state)
{
    (void)state;
    cx_config_t cfg = { .model = "opts" };
    cx_engine_t *e = (cx_engine_t *)1;
    setenv("CONNEX_UCX_ROTATE_GRACE_MS", "soon", 1);
    assert_int_equal(cx_engine_create(&cfg, &e), CX_EINVAL);
    assert_null(e);
    unsetenv("CONNEX_UCX_ROTATE_GRACE_MS");
    setenv("CONNEX_FI_TCP_READ", "rdma", 1);
    assert_int_equal(cx_engine_create(&cfg, &e), CX_EINVAL);
    unsetenv("CONNEX_FI_TCP_READ");
    /* The report marks it. */
    setenv("CONNEX_STAGE_SLOTS", "0", 1);
    size_t need = cx_options_report(NULL, 0);
    char *buf = malloc(need + 1);
    assert_non_null(buf);
    assert_int_equal(cx_options_report(buf, need + 1), need);
    const char *line = strstr(buf, "CONNEX_STAGE_SLOTS ");
    assert_non_null(line);
    assert_non_null(strstr(line, "BAD"));
    free(buf);
    unsetenv("CONNEX_STAGE_SLOTS");
}

/* cx_engine_create with stderr captured: the log lines it wrote, in buf. */
static int create_logged(const cx_config_t *cfg, cx_engine_t **e, char *buf, size_t len)
{
    FILE *t = tmpfile();
    assert_non_null(t);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(t), 2) >= 0);
    int rc = cx_engine_create(cfg, e);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(t);
    size_t n = fread(buf, 1, len - 1, t);
    buf[n] = 0;
    fclose(t);
    return rc;
}

/* A bad value of a backend's variable fails create with CX_EINVAL, and the log names the
 * variable, its value and what is allowed. */
static void test_engine_names_bad_variable(void **state)
{
    (void)state;
    cx_config_t cfg = { .model = "opts", .listen_ip = "127.0.0.1" };
    cx_engine_t *e = (cx_engine_t *)1;
    static char log[16384];
    setenv("CONNEX_FI_POLL_US", "abc", 1);
    assert_int_equal(create_logged(&cfg, &e, log, sizeof log), CX_EINVAL);
    unsetenv("CONNEX_FI_POLL_US");
    assert_null(e);
    assert_non_null(strstr(log, "CONNEX_FI_POLL_US=abc is not valid: expected an integer in 0..1000000"));
    assert_non_null(strstr(log, "not created"));
}

/* The table an engine hands to the selection and to its backends (cx_backend_params_t.opts) is
 * the environment at create: a value set afterwards, number or text, does not reach it. */
static void test_engine_table_frozen(void **state)
{
    (void)state;
    cx_config_t cfg = { .model = "opts", .listen_ip = "127.0.0.1" };
    cx_engine_t *e = NULL;
    setenv("CONNEX_FI_POLL_US", "250", 1);
    setenv("CONNEX_LIBCUDA", "libcuda-at-create.so", 1);
    int rc = cx_engine_create(&cfg, &e);
    if (rc == CX_EUNSUPPORTED) { /* no backend can run here */
        unsetenv("CONNEX_FI_POLL_US");
        unsetenv("CONNEX_LIBCUDA");
        skip();
    }
    assert_int_equal(rc, CX_OK);
    setenv("CONNEX_FI_POLL_US", "999", 1);
    setenv("CONNEX_LIBCUDA", "libcuda-later.so", 1);
    const cx_opts_t *o = &e->opts;
    int set = 0;
    assert_int_equal(cx_opts_num(o, "CONNEX_FI_POLL_US", &set), 250);
    assert_true(set);
    assert_string_equal(cx_opts_str(o, "CONNEX_LIBCUDA"), "libcuda-at-create.so");
    for (int i = 0; i < e->nb; i++) assert_non_null(e->be[i].b);
    cx_engine_destroy(e);
    unsetenv("CONNEX_FI_POLL_US");
    unsetenv("CONNEX_LIBCUDA");
}

/* A loaded table holds copies of the text values, and the bad values with their text. */
static void test_load(void **state)
{
    (void)state;
    static cx_opts_t o;
    setenv("CONNEX_HOST_ID", "h-load", 1);
    setenv("CONNEX_GDR", "maybe", 1);
    assert_int_equal(cx_opts_load(&o), CX_EINVAL);
    assert_int_equal(o.bad, 1);
    assert_true(cx_opts_bad(&o, "CONNEX_GDR"));
    assert_string_equal(cx_opts_str(&o, "CONNEX_GDR"), "maybe");
    assert_int_equal(cx_opts_num(&o, "CONNEX_GDR", NULL), 0); /* the default: auto */
    setenv("CONNEX_HOST_ID", "h-other", 1);
    assert_string_equal(cx_opts_str(&o, "CONNEX_HOST_ID"), "h-load");
    unsetenv("CONNEX_GDR");
    unsetenv("CONNEX_HOST_ID");
    assert_int_equal(cx_opts_load(&o), CX_OK);
    assert_null(cx_opts_str(&o, "CONNEX_HOST_ID"));
    assert_string_equal(cx_opts_str(&o, "CONNEX_LIBCUDA"), "libcuda.so.1");
    assert_false(cx_opts_bad(&o, "CONNEX_GDR"));
    /* text values beyond CX_OPT_TEXT bytes together: refused, naming the variable */
    static char big[CX_OPT_TEXT + 16];
    memset(big, 'p', sizeof big - 1);
    big[sizeof big - 1] = 0;
    setenv("CONNEX_PEERS", big, 1);
    assert_int_equal(cx_opts_load(&o), CX_EINVAL);
    assert_true(cx_opts_bad(&o, "CONNEX_PEERS"));
    assert_null(cx_opts_str(&o, "CONNEX_PEERS"));
    unsetenv("CONNEX_PEERS");
}

/* README.md, section "Configuration": the rows of its table whose first cell names CONNEX_*
 * variables. Every name there is in the options table and every table entry is there. */
static void test_readme(void **state)
{
    (void)state;
    FILE *f = fopen(g_readme, "r");
    if (!f) fail_msg("cannot open %s", g_readme);
    char line[4096];
    int in = 0;
    size_t n;
    const cx_opt_def_t *t = cx_opt_table(&n);
    int *seen = calloc(n, sizeof *seen);
    assert_non_null(seen);
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "## ", 3)) in = !strncmp(line, "## Configuration", 16);
        if (!in || strncmp(line, "| `CONNEX_", 10)) continue;
        rows++;
        char *end = strstr(line + 1, " | "); /* the first cell only */
        if (end) *end = 0;
        for (char *p = strstr(line, "CONNEX_"); p; p = strstr(p, "CONNEX_")) {
            char name[64];
            size_t l = strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
            snprintf(name, sizeof name, "%.*s", (int)l, p);
            const cx_opt_def_t *d = cx_opt_find(name);
            if (!d) fail_msg("README.md lists %s, which the options table does not", name);
            seen[d - t] = 1;
            p += l;
        }
    }
    fclose(f);
    assert_true(rows > 0);
    for (size_t i = 0; i < n; i++)
        if (!seen[i]) fail_msg("%s is in the options table but not in README.md's table", t[i].name);
    free(seen);
}

int main(int argc, char **argv)
{
    g_readme = argc > 1 ? argv[1] : "README.md";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_engine_refuses),
        cmocka_unit_test(test_readme),
        cmocka_unit_test(test_engine_names_bad_variable),
        cmocka_unit_test(test_engine_table_frozen),
        cmocka_unit_test(test_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
