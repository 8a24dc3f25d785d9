/* Which libraries a process loads: libfabric only once an engine opens its backend; libcrypto
 * only for an engine with an auth token, libcurl only for the etcd directory (core/src/dl_libs.c).
 *
 * Loading libfabric.so.1 costs about 200 ms on Debian 12 (its PSM dependencies time the CPU clock
 * in their constructors), so libconnex does not link it: the backend dlopens it at its first open
 * (backends/libfabric/fi_dl.c). The tests run in this order in one process, because once loaded
 * it stays. */
#include <connex/connex.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mapped(const char *lib)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, lib) != NULL;
    fclose(f);
    return found;
}

extern char **environ;

/* The process's handler of each signal, to see that an engine leaves them as they were. */
typedef struct { void *h[NSIG]; } sigs_t;

static void sigs_snapshot(sigs_t *s)
{
    for (int i = 1; i < NSIG; i++) {
        struct sigaction sa;
        s->h[i] = NULL;
        if (i == SIGKILL || i == SIGSTOP || sigaction(i, NULL, &sa)) continue;
        s->h[i] = (sa.sa_flags & SA_SIGINFO) ? (void *)sa.sa_sigaction : (void *)sa.sa_handler;
    }
}

static void sigs_same(const sigs_t *a, const sigs_t *b)
{
    for (int i = 1; i < NSIG; i++)
        if (a->h[i] != b->h[i]) fail_msg("the handler of signal %d (%s) changed", i, strsignal(i));
}

/* The process environment as one string, entries sorted, for before/after comparisons. */
static char *env_snapshot(void)
{
    size_t n = 0, len = 1;
    for (char **v = environ; *v; v++, n++) len += strlen(*v) + 1;
    char **sorted = calloc(n ? n : 1, sizeof *sorted);
    char *out = calloc(len, 1);
    assert_non_null(sorted);
    assert_non_null(out);
    for (size_t i = 0; i < n; i++) sorted[i] = environ[i];
    for (size_t i = 1; i < n; i++)   /* insertion sort: a few dozen entries */
        for (size_t j = i; j > 0 && strcmp(sorted[j - 1], sorted[j]) > 0; j--) {
            char *t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    for (size_t i = 0; i < n; i++) {
        strcat(out, sorted[i]);
        strcat(out, "\n");
    }
    free(sorted);
    return out;
}

/* Loading libconnex (linked into this test) changed nothing: the environment is still the one
 * the process was started with (/proc/self/environ: the block exec gave it). Runs first. */
static void test_load_leaves_environment(void **state)
{
    (void)state;
    FILE *f = fopen("/proc/self/environ", "r");
    assert_non_null(f);
    static char block[1 << 16];
    size_t n = fread(block, 1, sizeof block - 1, f);
    fclose(f);
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += block[i] == 0;
    size_t live = 0;
    for (char **v = environ; *v; v++) {
        live++;
        int found = 0;
        for (size_t i = 0; i < n && !found; i += strlen(block + i) + 1) found = !strcmp(block + i, *v);
        if (!found) fail_msg("set since exec, by a library's load: %s", *v);
    }
    assert_int_equal(live, count);
}

static cx_engine_t *engine(const char *backend)
{
    setenv("CONNEX_BACKEND", backend, 1);
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "libload";
    c.listen_ip = "127.0.0.1";
    cx_engine_t *e = NULL;
    assert_int_equal(cx_engine_create(&c, &e), CX_OK);
    assert_non_null(e);
    assert_string_equal(cx_engine_backends(e), backend);
    return e;
}

/* A ZeroMQ engine: registers, is destroyed, and libfabric, libcrypto and libcurl were never in
 * the process. */
static void test_zmq_engine_leaves_libfabric_unloaded(void **state)
{
    (void)state;
    assert_false(mapped("libfabric.so"));
    setenv("CONNEX_BACKEND", "zmq", 1);
    char *env0 = env_snapshot();
    cx_engine_t *e = engine("zmq");
    static char buf[4096];
    assert_int_equal(cx_register_memory(e, buf, sizeof buf), CX_OK);
    assert_int_equal(cx_unregister_memory(e, buf), CX_OK);
    assert_false(mapped("libfabric.so"));
    assert_false(mapped("libpsm"));
    assert_false(mapped("libcrypto.so"));
    assert_false(mapped("libcurl.so"));
    cx_engine_destroy(e);
    assert_false(mapped("libfabric.so"));
    /* loading the library and running an engine leave the environment as it was */
    char *env1 = env_snapshot();
    assert_string_equal(env0, env1);
    free(env0);
    free(env1);
}

/* An engine with a token loads libcrypto for its HMAC, and only then. */
static void test_auth_token_loads_libcrypto(void **state)
{
    (void)state;
    setenv("CONNEX_BACKEND", "zmq", 1);
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "libload";
    c.listen_ip = "127.0.0.1";
    c.auth_token = "libload-token-0123456789abcdef";
    cx_engine_t *e = NULL;
    assert_int_equal(cx_engine_create(&c, &e), CX_OK);
    assert_true(mapped("libcrypto.so"));
    assert_false(mapped("libcurl.so"));
    cx_engine_destroy(e);
}

#ifdef CX_HAVE_LIBFABRIC
/* Every entry of `after` that is not in `before` sets one of the allowed names. */
static void env_only_added(const char *before, const char *after, const char *const *allowed)
{
    const char *l = after;
    while (*l) {
        const char *e = strchr(l, '\n');
        size_t n = (size_t)(e - l);
        int known = 0;
        for (const char *b = before; *b && !known;) {
            const char *be = strchr(b, '\n');
            known = (size_t)(be - b) == n && !memcmp(b, l, n);
            b = be + 1;
        }
        if (!known) {
            int ok = 0;
            for (int i = 0; allowed[i] && !ok; i++)
                ok = !strncmp(l, allowed[i], strlen(allowed[i])) && l[strlen(allowed[i])] == '=';
            if (!ok) fail_msg("the engine changed the environment: %.*s", (int)n, l);
        }
        l = e + 1;
    }
}

/* The libfabric backend loads the library itself, then runs as before. */
static void test_libfabric_engine_loads_it(void **state)
{
    (void)state;
    setenv("CONNEX_FI_PROVIDER", "tcp;ofi_rxm", 1);
    setenv("CONNEX_BACKEND", "libfabric", 1);
    /* a handler the application set stays its own (libfabric's shm provider sets SIGINT/TERM) */
    struct sigaction mine = { .sa_handler = SIG_IGN }, old;
    assert_int_equal(sigaction(SIGTERM, &mine, &old), 0);
    sigs_t s0, s1;
    sigs_snapshot(&s0);
    char *env0 = env_snapshot();
    cx_engine_t *e = engine("libfabric");
    sigs_snapshot(&s1);
    sigs_same(&s0, &s1);
    /* only what libfabric reads from the environment alone, where it was unset (fi_setup.c) */
    static const char *const fi_env[] = { "FI_AV_REMOVE_CLEANUP", "FI_OFI_RXM_MSG_RX_SIZE", "FI_HMEM", NULL };
    char *env1 = env_snapshot();
    env_only_added(env0, env1, fi_env);
    free(env0);
    free(env1);
    assert_true(mapped("libfabric.so"));
    static char buf[4096];
    assert_int_equal(cx_register_memory(e, buf, sizeof buf), CX_OK);
    assert_int_equal(cx_unregister_memory(e, buf), CX_OK);
    cx_engine_destroy(e);
    /* a second engine of the process finds it loaded */
    e = engine("libfabric");
    cx_engine_destroy(e);
    setenv("CONNEX_FI_PROVIDER", "shm", 1);
    e = engine("libfabric");
    cx_engine_destroy(e);
    sigs_snapshot(&s1);
    sigs_same(&s0, &s1);
    sigaction(SIGTERM, &old, NULL);
    unsetenv("CONNEX_FI_PROVIDER");
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_leaves_environment),
        cmocka_unit_test(test_zmq_engine_leaves_libfabric_unloaded),
        cmocka_unit_test(test_auth_token_loads_libcrypto),
#ifdef CX_HAVE_LIBFABRIC
        cmocka_unit_test(test_libfabric_engine_loads_it),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
