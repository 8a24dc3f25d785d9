/* What the core tells a backend of a peer's process (core/src/proc.h, cx_core_peer_process and
 * cx_core_peer_exit_fd): a forked child is ALIVE, STOPPED under SIGSTOP, ALIVE again after
 * SIGCONT and EXITED after kill -9, when its exit fd has turned readable; a peer of another
 * host, or one whose HELLO named no pid, is UNKNOWN and has no exit fd. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine.h"
#include "proc.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t child_start(void)
{
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (int i = 0; i < 600; i++) sleep(1); /* bounded: killed long before */
        _exit(0);
    }
    return c;
}

/* 1 once fd is readable, within timeout_ms. */
static int readable(int fd, int timeout_ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & (POLLIN | POLLHUP));
}

/* A same-host peer as a HELLO leaves it: its process followed (peer/hello.c). */
static cx_peer_t *peer_new(int same_host, uint32_t pid)
{
    cx_peer_t *p = calloc(1, sizeof *p);
    assert_non_null(p);
    cx_proc_init(&p->proc);
    p->same_host = same_host;
    cx_proc_follow(&p->proc, same_host ? pid : 0);
    return p;
}

static void peer_free(cx_peer_t *p)
{
    cx_proc_forget(&p->proc);
    free(p);
}

static void test_child_lifecycle(void **state)
{
    (void)state;
    cx_engine_t *e = calloc(1, sizeof *e);
    assert_non_null(e);
    cx_core_t *c = cx_core_of(e);
    pid_t pid = child_start();
    cx_peer_t *p = peer_new(1, (uint32_t)pid);
    if (p->proc.pidfd < 0) { /* a kernel before 5.3 */
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        peer_free(p);
        free(e);
        skip();
    }
    assert_int_equal(cx_core_peer_process(c, p), CX_PROC_ALIVE);
    int xfd = cx_core_peer_exit_fd(c, p);
    assert_true(xfd >= 0);
    assert_true(fcntl(xfd, F_GETFD) & FD_CLOEXEC);
    assert_false(readable(xfd, 0));

    int st = 0;
    assert_int_equal(kill(pid, SIGSTOP), 0);
    assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
    assert_true(WIFSTOPPED(st));
    assert_int_equal(cx_core_peer_process(c, p), CX_PROC_STOPPED);
    assert_false(readable(xfd, 0));

    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_int_equal(waitpid(pid, &st, WCONTINUED), pid);
    assert_true(WIFCONTINUED(st));
    /* Continued, it may not have run yet: /proc says so within a bounded wait. */
    int s = CX_PROC_STOPPED;
    for (int i = 0; i < 500 && (s = cx_core_peer_process(c, p)) == CX_PROC_STOPPED; i++) usleep(10000);
    assert_int_equal(s, CX_PROC_ALIVE);

    /* kill -9: the exit fd turns readable, the answer is EXITED, before and after the reap. */
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_true(readable(xfd, 10000));
    assert_int_equal(cx_core_peer_process(c, p), CX_PROC_EXITED);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    assert_int_equal(cx_core_peer_process(c, p), CX_PROC_EXITED);
    /* The fd handed out outlives the core's record. */
    peer_free(p);
    assert_true(readable(xfd, 0));
    close(xfd);

    /* A HELLO naming a pid that has exited and been reaped: EXITED at once. */
    p = peer_new(1, (uint32_t)pid);
    assert_int_equal(cx_core_peer_process(c, p), CX_PROC_EXITED);
    peer_free(p);
    free(e);
}

static void test_unknown(void **state)
{
    (void)state;
    cx_engine_t *e = calloc(1, sizeof *e);
    assert_non_null(e);
    cx_core_t *c = cx_core_of(e);
    pid_t pid = child_start();
    /* Another host: its pid names nothing here, whatever process has it. */
    cx_peer_t *p = peer_new(0, (uint32_t)pid);
    assert_int_equal(cx_core_peer_process(c, p), CX_PROC_UNKNOWN);
    assert_int_equal(cx_core_peer_exit_fd(c, p), -1);
    peer_free(p);
    /* Same host, but its HELLO named no pid (an older peer). */
    p = peer_new(1, 0);
    assert_int_equal(cx_core_peer_process(c, p), CX_PROC_UNKNOWN);
    assert_int_equal(cx_core_peer_exit_fd(c, p), -1);
    peer_free(p);
    assert_int_equal(cx_core_peer_process(c, NULL), CX_PROC_UNKNOWN);
    assert_int_equal(cx_core_peer_exit_fd(c, NULL), -1);
    /* This process, a peer engine in it: ALIVE without a look. */
    p = peer_new(1, (uint32_t)getpid());
    assert_int_equal(cx_core_peer_process(c, p), CX_PROC_ALIVE);
    peer_free(p);
    int st = 0;
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    free(e);
}

/* A record all zeroes is "nothing followed": forgetting it closes no fd (fd 0 included). */
static void test_zeroed_record(void **state)
{
    (void)state;
    cx_proc_t pr = { 0 };
    assert_int_equal(cx_proc_state(&pr), CX_PROC_UNKNOWN);
    assert_int_equal(cx_proc_exit_fd(&pr), -1);
    int saved = dup(0), pfd[2];
    assert_true(saved >= 0);
    assert_int_equal(pipe(pfd), 0);
    assert_int_equal(dup2(pfd[0], 0), 0);
    cx_proc_forget(&pr);
    assert_true(fcntl(0, F_GETFD) >= 0); /* still open */
    assert_int_equal(pr.pidfd, -1);
    assert_int_equal(dup2(saved, 0), 0);
    close(saved);
    close(pfd[0]);
    close(pfd[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_child_lifecycle),
        cmocka_unit_test(test_unknown),
        cmocka_unit_test(test_zeroed_record),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
