/* The harness's own checks (tests/cxt.c): a peer that crashes or exits non-zero fails the test
 * that reaped it, one the test killed does not; cxt_skip and cxt_run_tests give ctest's skip
 * code 77 only when every case was skipped, and a failure where CONNEX_TEST_REQUIRE names the
 * missing capability; a fault on a thread other than the test's kills the process with a line
 * that says so (tests/cxt_fault.c), one on the test's thread fails that test through cmocka.
 * Each scenario runs as a cmocka group in a forked child, whose exit status and stderr are
 * checked here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cxt.h"
#include "cxt_fault.h"

#if defined(__SANITIZE_THREAD__)
#define CXT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CXT_TSAN 1
#endif
#endif

/* Runs tests[] in a child with stderr captured (up to 20 s); its exit status, 1000 + the signal
 * that killed it, or -1. */
static int run_child(const struct CMUnitTest *tests, size_t n, const char *require, char *err, size_t cap)
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 2);
        unsetenv("CXT_FILTER");
        if (require)
            setenv("CONNEX_TEST_REQUIRE", require, 1);
        else
            unsetenv("CONNEX_TEST_REQUIRE");
        int rc = _cmocka_run_group_tests("child", tests, n, NULL, NULL);
        fflush(NULL);
        _exit(cxt_exit_status(rc, (int)n));
    }
    close(pfd[1]);
    size_t len = 0;
    uint64_t t0 = cxt_now_ns();
    while (cxt_ms_since(t0) < 20000) {
        struct pollfd p = { .fd = pfd[0], .events = POLLIN };
        if (poll(&p, 1, 1000) <= 0) continue;
        ssize_t k = read(pfd[0], err + len, cap - 1 - len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        len += (size_t)k;
        if (len == cap - 1) len = 0; /* keep the tail */
    }
    err[len] = 0;
    close(pfd[0]);
    int st = 0;
    for (int i = 0; i < 100 && waitpid(pid, &st, WNOHANG) == 0; i++) usleep(50000);
    if (waitpid(pid, &st, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        return -1;
    }
    fprintf(stderr, "--- child stderr (exit %d):\n%s---\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1, err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 1000 + WTERMSIG(st) : -1;
}

static void start(cxt_peer_t *p)
{
    cxt_peer_opts_t o = { .model = "unitpeer", .region = 4096 };
    assert_int_equal(cxt_peer_start(p, &o, 10000), 0);
}

/* A command the peer does not answer (it dies): the reply times out. */
static void end_with(cxt_peer_t *p, const char *cmd)
{
    cxt_peer_cmd(p, 300, NULL, 0, "%s", cmd);
}

static void peer_segv(void **s)
{
    (void)s;
    cxt_peer_t p;
    start(&p);
    end_with(&p, "DIE 11");
    cxt_peer_stop(&p);
}
static void peer_exit3(void **s)
{
    (void)s;
    cxt_peer_t p;
    start(&p);
    end_with(&p, "EXIT 3");
    cxt_peer_stop(&p);
}
static void peer_clean(void **s)
{
    (void)s;
    cxt_peer_t p;
    start(&p);
    cxt_peer_stop(&p);
}
static void peer_crashed_on_purpose(void **s)
{
    (void)s;
    cxt_peer_t p;
    start(&p);
    cxt_peer_crash(&p);
}
static void peer_sigkill_then_stop(void **s)
{
    (void)s;
    cxt_peer_t p;
    start(&p);
    cxt_peer_signal(&p, SIGKILL);
    cxt_peer_stop(&p);
}
static void peer_segv_then_killed(void **s) /* died on its own before the test's kill */
{
    (void)s;
    cxt_peer_t p;
    start(&p);
    end_with(&p, "DIE 11");
    cxt_peer_crash(&p);
}
static void skip_nothing(void **s)
{
    (void)s;
    cxt_skip("nothing", "this host has no nothing");
}
static void pass(void **s)
{
    (void)s;
}

static void *segv_thread(void *arg)
{
    (void)arg;
    raise(SIGSEGV);
    return NULL;
}
static void fault_on_other_thread(void **s)
{
    (void)s;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, segv_thread, NULL), 0);
    pthread_join(t, NULL);
}
#ifndef CXT_TSAN
static void fault_on_test_thread(void **s)
{
    (void)s;
    raise(SIGSEGV);
}
#endif

static void test_faults(void **s)
{
    (void)s;
    char err[32768];
    const struct CMUnitTest t[] = { cmocka_unit_test(pass), cmocka_unit_test(fault_on_other_thread),
                                    cmocka_unit_test(pass) };
    assert_int_equal(run_child(t, 3, NULL, err, sizeof err), 1000 + SIGSEGV);
    assert_non_null(strstr(err, "cxt: Caught signal 11 (SEGV) on thread "));
    assert_non_null(strstr(err, ", not the test's"));
#ifndef CXT_TSAN /* cmocka's handler allocates: ThreadSanitizer ends the child there (exit 66) */
    const struct CMUnitTest t2[] = { cmocka_unit_test(fault_on_test_thread), cmocka_unit_test(pass) };
    assert_int_equal(run_child(t2, 2, NULL, err, sizeof err), 1);
    assert_non_null(strstr(err, "Test failed with exception"));
    assert_null(strstr(err, "cxt: Caught signal"));
#endif
    assert_true(cxt_fault_installed()); /* around this test too */
}

static void test_peer_crash_fails(void **s)
{
    (void)s;
    char err[32768];
    const struct CMUnitTest t[] = { cmocka_unit_test(peer_segv) };
    assert_int_equal(run_child(t, 1, NULL, err, sizeof err), 1);
    assert_non_null(strstr(err, "crashed with signal 11"));
    const struct CMUnitTest t2[] = { cmocka_unit_test(peer_segv_then_killed) };
    assert_int_equal(run_child(t2, 1, NULL, err, sizeof err), 1);
    assert_non_null(strstr(err, "crashed with signal 11 (Segmentation fault) before it was killed"));
}

static void test_peer_exit_status_fails(void **s)
{
    (void)s;
    char err[32768];
    const struct CMUnitTest t[] = { cmocka_unit_test(peer_exit3) };
    assert_int_equal(run_child(t, 1, NULL, err, sizeof err), 1);
    assert_non_null(strstr(err, "exited with status 3"));
}

static void test_peer_clean_or_killed_passes(void **s)
{
    (void)s;
    char err[32768];
    const struct CMUnitTest t[] = { cmocka_unit_test(peer_clean), cmocka_unit_test(peer_crashed_on_purpose),
                                    cmocka_unit_test(peer_sigkill_then_stop) };
    assert_int_equal(run_child(t, 3, NULL, err, sizeof err), 0);
    assert_null(strstr(err, "cxt: peer unitpeer"));
}

static void test_skips(void **s)
{
    (void)s;
    char err[32768];
    const struct CMUnitTest all[] = { cmocka_unit_test(skip_nothing), cmocka_unit_test(skip_nothing) };
    assert_int_equal(run_child(all, 2, NULL, err, sizeof err), CXT_SKIP_EXIT);
    assert_non_null(strstr(err, "cxt: SKIPPED: needs nothing: this host has no nothing"));
    const struct CMUnitTest some[] = { cmocka_unit_test(skip_nothing), cmocka_unit_test(pass) };
    assert_int_equal(run_child(some, 2, NULL, err, sizeof err), 0);
    assert_int_equal(run_child(all, 2, "root,nothing", err, sizeof err), 2);
    assert_non_null(strstr(err, "cxt: required capability nothing missing"));
    assert_int_equal(run_child(all, 2, "root,nothingness", err, sizeof err), CXT_SKIP_EXIT);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_crash_fails),
        cmocka_unit_test(test_peer_exit_status_fails),
        cmocka_unit_test(test_peer_clean_or_killed_passes),
        cmocka_unit_test(test_skips),
        cmocka_unit_test(test_faults),
    };
    return cxt_run_tests(tests, NULL, NULL);
}
