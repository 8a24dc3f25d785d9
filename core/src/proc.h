/* The process of a same-host peer, as the kernel sees it: part of the same-host watch (live.h).
 *
 * The death watch (live.c) tells the core the moment a peer process starts dying. A backend that
 * shares memory with a peer needs more: whether the process is stopped (SIGSTOP, a debugger), and
 * an fd that wakes its own thread once the process has exited for good (the kernel has torn its
 * memory down: locks it held in shared memory are free to take back). Both are answered here,
 * once, from a pidfd the core opens when a same-host HELLO names the peer's pid, and from
 * /proc/<pid>/stat; backends ask through cx_core_peer_process and cx_core_peer_exit_fd.
 *
 * No engine state: the fake core of the backend tests (tests/fake_core) answers with it too. */
#ifndef CX_PROC_H
#define CX_PROC_H

#include <stdint.h>

/* All zeroes is a valid "nothing followed", as after cx_proc_init: pidfd means something only
 * while pid is set. */
typedef struct cx_proc {
    uint32_t pid; /* 0: none followed */
    int pidfd;    /* -1: none (no pid, or a kernel without pidfd_open) */
    int exited;   /* seen exited: it stays so */
} cx_proc_t;

/* Nothing followed: pid 0, no pidfd. */
void cx_proc_init(cx_proc_t *pr);
/* Follows process pid (0: nothing) from now on; a different one followed before is let go. The
 * same pid still alive is kept as it is. */
void cx_proc_follow(cx_proc_t *pr, uint32_t pid);
/* Lets go of the process (closes the pidfd). */
void cx_proc_forget(cx_proc_t *pr);
/* CX_PROC_* (connex/backend.h): EXITED once the pidfd says so (without one: /proc shows a zombie),
 * STOPPED when /proc/<pid>/stat shows T or t, ALIVE otherwise, UNKNOWN when nothing is followed.
 * This process itself is ALIVE without a look: it is running this. */
int cx_proc_state(cx_proc_t *pr);
/* A new fd of the caller's (close-on-exec; the caller closes it) that turns readable once the
 * process has exited; -1 when there is no pidfd. */
int cx_proc_exit_fd(const cx_proc_t *pr);

#endif
