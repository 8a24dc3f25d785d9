/* The process of a same-host peer: why in proc.h. */
#include "proc.h"

#include "connex/backend.h"
#include "connex/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

void cx_proc_init(cx_proc_t *pr)
{
    pr->pid = 0;
    pr->pidfd = -1;
    pr->exited = 0;
}

void cx_proc_forget(cx_proc_t *pr)
{
    if (pr->pid && pr->pidfd >= 0) close(pr->pidfd);
    cx_proc_init(pr);
}

/* The pidfd turns readable when the process has exited (a zombie included). */
static int pidfd_exited(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP));
}

void cx_proc_follow(cx_proc_t *pr, uint32_t pid)
{
    if (pid && pr->pid == pid && pr->pidfd >= 0 && !pr->exited && !pidfd_exited(pr->pidfd)) return;
    cx_proc_forget(pr);
    if (!pid) return;
    pr->pid = pid;
#ifdef SYS_pidfd_open
    /* Always close-on-exec. Opened before anything else looks at the pid: what it names from
     * here on is that process, whatever reuses the number after it exits. */
    pr->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (pr->pidfd < 0 && errno == ESRCH) pr->exited = 1;
    if (pr->pidfd < 0 && errno != ESRCH) cx_debug("process %u: no pidfd: %s", pid, strerror(errno));
#endif
}

/* T: stopped by a signal, t: by a tracer; Z, X: exited. 0 when it cannot be read. */
static char stat_state(uint32_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold anything but the last ')' */
    return p && p[1] == ' ' ? p[2] : 0;
}

int cx_proc_state(cx_proc_t *pr)
{
    if (!pr->pid) return CX_PROC_UNKNOWN;
    if (pr->exited) return CX_PROC_EXITED;
    if (pr->pid == (uint32_t)getpid()) return CX_PROC_ALIVE;
    char s = stat_state(pr->pid);
    /* The pidfd is looked at after /proc: not yet readable, the process it names was the one
     * read. A zombie leader whose other threads still run is not exited: the pidfd says when. */
    if (pr->pidfd >= 0 ? pidfd_exited(pr->pidfd) : s == 'Z' || s == 'X') {
        pr->exited = 1;
        return CX_PROC_EXITED;
    }
    if (pr->pidfd < 0 && !s) return CX_PROC_UNKNOWN; /* no pidfd, and /proc says nothing */
    return s == 'T' || s == 't' ? CX_PROC_STOPPED : CX_PROC_ALIVE;
}

int cx_proc_exit_fd(const cx_proc_t *pr)
{
    if (!pr->pid || pr->pidfd < 0) return -1;
    int fd = fcntl(pr->pidfd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) cx_warn("process %u: cannot hand out its pidfd: %s", pr->pid, strerror(errno));
    return fd;
}
