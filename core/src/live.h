/* Same-host death watch: a peer process on this host that dies is reported FAILED within
 * microseconds, before the kernel has torn down its memory.
 *
 * Why: a SIGKILLed process closes its sockets only in exit_files(), after exit_mm() has unmapped
 * its whole address space. A process holding tens of GiB of registered memory (KV caches, weights)
 * takes milliseconds to seconds to get there, and only then does any peer see a reset. exit_mm()
 * starts by walking the dying threads' robust futex lists, though: the kernel marks each robust
 * mutex they hold FUTEX_OWNER_DIED and wakes a waiter. So each engine keeps one robust,
 * process-shared mutex in a memfd page, held by its progress thread for the engine's life, and
 * advertises (pid, fd) in HELLO. A peer on the same host maps that page through /proc/<pid>/fd/<fd>
 * and waits on the mutex's futex word from a small thread; OWNER_DIED means the process is gone.
 * A clean close releases the mutex (the watcher just stops: BYE gives LEFT).
 *
 * Everything here is best effort: another user, another pid namespace, a non-glibc libc or
 * CONNEX_SAME_HOST_WATCH=0 leave the peer to the usual paths (connection reset, heartbeats). */
#ifndef CX_LIVE_H
#define CX_LIVE_H

#include <stdint.h>

typedef struct cx_engine cx_engine_t;
typedef struct cx_peer cx_peer_t;
typedef struct cx_live cx_live_t;
typedef struct cx_live_watch cx_live_watch_t;

/* Engine create: the memfd page and the eventfd watchers wake the progress thread with.
 * Never fails the engine: without it, *pid and *fd advertise nothing (0, -1). */
void cx_live_open(cx_engine_t *e);
/* What HELLO advertises: this process (always) and the page's fd (-1: no page). */
void cx_live_advert(const cx_engine_t *e, uint32_t *pid, int32_t *fd);
/* Progress thread, first and last thing it does: take and release the mutex. */
void cx_live_hold(cx_engine_t *e);
void cx_live_release(cx_engine_t *e);
/* Progress thread: a HELLO from a same-host peer advertised (pid, fd) for incarnation inc.
 * Starts a watch unless one already follows that incarnation; a watch of an older one stops. */
void cx_live_watch(cx_engine_t *e, cx_peer_t *p, uint32_t pid, int32_t fd, uint64_t inc);
/* 1 when w (an epoll event's pointer) is the watchers' eventfd. Compares addresses only: the
 * pointer may be a connection closed by an earlier event of the same batch. */
int cx_live_is_watch(const cx_engine_t *e, const void *w);
/* Progress thread: the eventfd fired. Joins finished watchers; each that saw its process die
 * fails the peer, if the peer still is that incarnation. */
void cx_live_reap(cx_engine_t *e);
/* Progress thread: cx_live_reap when a watcher has reported a death it has not reaped yet. Called
 * before commands are started, so a caller that saw the FAILED finds the peer failed. */
void cx_live_reap_pending(cx_engine_t *e);
/* A death the watch reported is not reaped yet (any thread). */
int cx_live_death_pending(const cx_engine_t *e);
/* Progress thread: 1 when a running watch follows p's current incarnation. */
int cx_live_watching(cx_engine_t *e, const cx_peer_t *p);
/* Engine destroy, after the progress thread ended: stops and joins every watcher. */
void cx_live_stop_all(cx_engine_t *e);
/* Engine free: unmaps the page, closes the fds. */
void cx_live_close(cx_engine_t *e);

#endif
