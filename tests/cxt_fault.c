/* Faults on threads other than the test's, made visible.
 *
 * cmocka catches SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGSYS around every test with signal(),
 * keeps its "Test failed with exception" line in a thread-local buffer and longjmps back into the
 * test runner. On the thread that runs the test that works. On another thread (an engine's
 * progress thread, a library's own) the line stays in that thread's buffer, the longjmp lands on
 * the test thread's stack from the wrong thread, and the process ends with status 255 and no
 * word: a crash that looked like a test that stopped talking.
 *
 * The harness therefore stands between cmocka and the kernel: this signal() installs cxt_fault
 * for those signals and remembers what cmocka asked for. A fault on the test's thread goes to
 * cmocka's handler as before; one on any other thread prints "cxt: Caught signal N (...)" with
 * the thread and a backtrace, then dies of the signal, so ctest reports a crash (tests/run.sh
 * counts it as one). Test programs only: the library installs no handler. */
#include "cxt_fault.h"

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

typedef void (*cxt_handler_t)(int);

static cxt_handler_t asked[NSIG]; /* what the caller of signal() installed, per fault signal */
static pthread_t test_thread;
static int test_thread_set;

static int is_fault(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGSYS;
}

static size_t put_str(char *b, size_t at, size_t cap, const char *s)
{
    while (*s && at + 1 < cap) b[at++] = *s++;
    return at;
}

static size_t put_num(char *b, size_t at, size_t cap, long v)
{
    char d[24];
    int n = 0;
    unsigned long u = v < 0 ? (unsigned long)-v : (unsigned long)v;
    do d[n++] = (char)('0' + u % 10);
    while ((u /= 10) && n < (int)sizeof d);
    if (v < 0 && at + 1 < cap) b[at++] = '-';
    while (n && at + 1 < cap) b[at++] = d[--n];
    return at;
}

static void cxt_fault(int sig)
{
    if (test_thread_set && pthread_equal(pthread_self(), test_thread) && asked[sig]) {
        asked[sig](sig);
        return;
    }
    char m[256];
    size_t n = put_str(m, 0, sizeof m, "\ncxt: Caught signal ");
    n = put_num(m, n, sizeof m, sig);
    n = put_str(m, n, sizeof m, " (");
    n = put_str(m, n, sizeof m, sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
    n = put_str(m, n, sizeof m, ") on thread ");
    n = put_num(m, n, sizeof m, (long)gettid());
    n = put_str(m, n, sizeof m, " of pid ");
    n = put_num(m, n, sizeof m, (long)getpid());
    n = put_str(m, n, sizeof m, ", not the test's: a crash inside the process\n");
    if (write(2, m, n) < 0) _exit(4);
    void *f[48];
    int k = backtrace(f, 48);
    backtrace_symbols_fd(f, k, 2);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(sig, &sa, NULL);
    raise(sig); /* a synchronous fault also comes back as its instruction runs again */
}

/* Default visibility (the build hides symbols by default): libcmocka's calls bind to this one. */
__attribute__((visibility("default"))) cxt_handler_t signal(int sig, cxt_handler_t h)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* glibc's signal(): BSD semantics */
    int mine = sig > 0 && sig < NSIG && is_fault(sig) && h != SIG_DFL && h != SIG_IGN && h != SIG_ERR;
    sa.sa_handler = mine ? cxt_fault : h;
    if (mine && !test_thread_set) {
        /* cmocka installs its handlers from the thread that runs the tests. backtrace() loads
         * its unwinder at the first call: not inside a handler. */
        test_thread = pthread_self();
        test_thread_set = 1;
        void *f[2];
        (void)backtrace(f, 2);
    }
    if (sigaction(sig, &sa, &old)) return SIG_ERR;
    cxt_handler_t before = old.sa_handler == cxt_fault ? asked[sig] : old.sa_handler;
    if (sig > 0 && sig < NSIG && is_fault(sig)) asked[sig] = mine ? h : NULL;
    return before;
}

int cxt_fault_installed(void)
{
    struct sigaction cur;
    return !sigaction(SIGSEGV, NULL, &cur) && cur.sa_handler == cxt_fault;
}
