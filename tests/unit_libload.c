/* Which libraries a process loads, and what loading them leaves behind: libfabric and UCX only
 * once an engine opens their backend (or the selection probes them); libcrypto only for an engine
 * with an auth token, libcurl only for the etcd directory (core/src/dl_libs.c).
 *
 * Loading libfabric.so.1 costs about 200 ms on Debian 12 (its PSM dependencies time the CPU clock
 * in their constructors), and libucs's constructor installs handlers for SIGSEGV, SIGBUS, SIGILL,
 * SIGFPE and SIGHUP: so libconnex links neither, the backends dlopen them at their first open
 * (backends/libfabric/fi_dl.c, backends/ucx/ucx_dl.c) and the process's signal dispositions are
 * put back after every such load. The tests run in this order in one process, because once loaded
 * a library stays; the UCX engine runs in a child, so that the selection probe after it is the
 * first to load UCX in this process. */
#include <connex/connex.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef CX_HAVE_SELECT
#include <cx_select.h>
#endif

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

/* The process's handler of each signal, to see that loading a library or running an engine
 * leaves them as they were. */
typedef struct {
    void *h[NSIG];
} sigs_t;

static void *sig_handler(int sig)
{
    struct sigaction sa;
    if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa)) return NULL;
    return (sa.sa_flags & SA_SIGINFO) ? (void *)sa.sa_sigaction : (void *)sa.sa_handler;
}

static void sigs_snapshot(sigs_t *s)
{
    for (int i = 1; i < NSIG; i++) s->h[i] = sig_handler(i);
}

/* The first signal whose handler differs, or 0. */
static int sigs_diff(const sigs_t *a, const sigs_t *b)
{
    for (int i = 1; i < NSIG; i++)
        if (a->h[i] != b->h[i]) return i;
    return 0;
}

static void sigs_same(const sigs_t *a, const sigs_t *b)
{
    int i = sigs_diff(a, b);
    if (i) fail_msg("the handler of signal %d (%s) changed", i, strsignal(i));
}

/* The application's own handlers, one plain and one SA_SIGINFO, on two of the signals libucs
 * takes. */
static void app_on_segv(int sig)
{
    (void)sig;
}

static void app_on_hup(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
    (void)uc;
}

static void app_handlers_set(struct sigaction old[2])
{
    struct sigaction segv = { .sa_handler = app_on_segv }, hup = { .sa_sigaction = app_on_hup, .sa_flags = SA_SIGINFO };
    assert_int_equal(sigaction(SIGSEGV, &segv, &old[0]), 0);
    assert_int_equal(sigaction(SIGHUP, &hup, &old[1]), 0);
}

static void app_handlers_put_back(const struct sigaction old[2])
{
    sigaction(SIGSEGV, &old[0], NULL);
    sigaction(SIGHUP, &old[1], NULL);
}

/* Right after load, before any engine: no signal has a handler from a UCX library (libucs's
 * constructor installed five when libconnex linked it), and UCX is not even mapped. */
static void test_load_leaves_signals(void **state)
{
    (void)state;
    for (int i = 1; i < NSIG; i++) {
        void *h = sig_handler(i);
        Dl_info di;
        if (!h || h == (void *)SIG_DFL || h == (void *)SIG_IGN || !dladdr(h, &di) || !di.dli_fname) continue;
        const char *base = strrchr(di.dli_fname, '/');
        base = base ? base + 1 : di.dli_fname;
        if (!strncmp(base, "libuc", 5))
            fail_msg("signal %d (%s) has a handler of %s since load", i, strsignal(i), di.dli_fname);
    }
    assert_false(mapped("libucs.so"));
    assert_false(mapped("libucp.so"));
    assert_false(mapped("libuct.so"));
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
    for (size_t i = 1; i < n; i++) /* insertion sort: a few dozen entries */
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
    assert_false(mapped("libucs.so"));
    cx_engine_destroy(e);
    assert_false(mapped("libfabric.so"));
    assert_false(mapped("libucs.so"));
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

#ifdef CX_HAVE_UCX
/* In the child only: no cmocka there (a failed assertion would run the remaining tests in it). */
#define CHILD_CHECK(c)                                                                        \
    do {                                                                                      \
        if (!(c)) {                                                                           \
            fprintf(stderr, "unit_libload (UCX child): %s:%d: %s\n", __FILE__, __LINE__, #c); \
            _exit(1);                                                                         \
        }                                                                                     \
    } while (0)

static int child_sigs_same(const sigs_t *a, const char *when)
{
    sigs_t now;
    sigs_snapshot(&now);
    int i = sigs_diff(a, &now);
    if (i)
        fprintf(stderr, "unit_libload (UCX child): %s, the handler of signal %d (%s) changed\n", when, i, strsignal(i));
    return i == 0;
}

static cx_engine_t *child_engine(const char *model)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.listen_ip = "127.0.0.1";
    cx_engine_t *e = NULL;
    CHILD_CHECK(cx_engine_create(&c, &e) == CX_OK && e);
    CHILD_CHECK(!strcmp(cx_engine_backends(e), "ucx"));
    return e;
}

/* Two UCX engines of one process: created, a write and a read between them, destroyed. */
static void child_ucx_engines(void)
{
    setenv("CONNEX_BACKEND", "ucx", 1);
    setenv("UCX_TLS", "tcp,self", 1);
    struct sigaction old[2];
    struct sigaction segv = { .sa_handler = app_on_segv }, hup = { .sa_sigaction = app_on_hup, .sa_flags = SA_SIGINFO };
    CHILD_CHECK(sigaction(SIGSEGV, &segv, &old[0]) == 0 && sigaction(SIGHUP, &hup, &old[1]) == 0);
    sigs_t s0;
    sigs_snapshot(&s0);
    cx_engine_t *a = child_engine("libload-a"), *b = child_engine("libload-b");
    CHILD_CHECK(mapped("libucs.so") && mapped("libucp.so"));
    CHILD_CHECK(child_sigs_same(&s0, "after the engines' create"));
    static unsigned char target[65536], src[65536], back[65536];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 7 + 1);
    char b_url[256];
    snprintf(b_url, sizeof b_url, "%s", cx_engine_local_url(b));
    CHILD_CHECK(cx_register_memory(b, target, sizeof target) == CX_OK);
    CHILD_CHECK(cx_register_memory(a, src, sizeof src) == CX_OK);
    CHILD_CHECK(cx_register_memory(a, back, sizeof back) == CX_OK);
    CHILD_CHECK(cx_connect(a, b_url, 10000) == CX_OK);
    uint64_t addr = 0, len = 0;
    CHILD_CHECK(cx_peer_first_region(a, b_url, &addr, &len) == CX_OK && len == sizeof target);
    CHILD_CHECK(!strcmp(cx_peer_backend(a, b_url), "ucx"));
    CHILD_CHECK(cx_write(a, b_url, src, addr, sizeof src) == CX_OK);
    CHILD_CHECK(cx_read(a, b_url, back, addr, sizeof back) == CX_OK);
    CHILD_CHECK(!memcmp(back, src, sizeof src) && !memcmp(target, src, sizeof src));
    CHILD_CHECK(child_sigs_same(&s0, "after a transfer"));
    cx_engine_destroy(a);
    cx_engine_destroy(b);
    CHILD_CHECK(child_sigs_same(&s0, "after the engines' destroy"));
    _exit(0);
}

/* (b) The application's SIGSEGV and SIGHUP handlers, and every other disposition, are the same
 * after UCX engines were created, transferred and were destroyed. In a child: this process must
 * not load UCX before the probe test below. */
static void test_ucx_engine_keeps_signals(void **state)
{
    (void)state;
    assert_false(mapped("libucs.so"));
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) child_ucx_engines();
    int st = 0;
    pid_t got = 0;
    struct timespec t0, now, nap = { 0, 20 * 1000 * 1000 };
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 2500 && !(got = waitpid(pid, &st, WNOHANG)); i++) { /* 50 s at most */
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 50) break;
        nanosleep(&nap, NULL);
    }
    if (got != pid) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        fail_msg("the UCX child did not finish in 50 s");
    }
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_false(mapped("libucs.so"));
}
#endif

#if defined(CX_HAVE_UCX) && defined(CX_HAVE_SELECT)
/* (c) The selection's probe, as connex-probe runs it, loads libuct (and with it libucs) itself:
 * the application's handlers stay. The first UCX load of this process. */
static void test_probe_keeps_signals(void **state)
{
    (void)state;
    assert_false(mapped("libucs.so"));
    struct sigaction old[2];
    app_handlers_set(old);
    sigs_t s0, s1;
    sigs_snapshot(&s0);
    static cx_probe_t p;
    assert_int_equal(cx_probe_host(&p, NULL), CX_OK);
    assert_true(mapped("libuct.so"));
    assert_true(mapped("libucs.so"));
    sigs_snapshot(&s1);
    sigs_same(&s0, &s1);
    app_handlers_put_back(old);
}
#endif

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
        cmocka_unit_test(test_load_leaves_signals),
#ifdef CX_HAVE_UCX
        cmocka_unit_test(test_ucx_engine_keeps_signals),
#endif
        cmocka_unit_test(test_zmq_engine_leaves_libfabric_unloaded),
        cmocka_unit_test(test_auth_token_loads_libcrypto),
#if defined(CX_HAVE_UCX) && defined(CX_HAVE_SELECT)
        cmocka_unit_test(test_probe_keeps_signals),
#endif
#ifdef CX_HAVE_LIBFABRIC
        cmocka_unit_test(test_libfabric_engine_loads_it),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
