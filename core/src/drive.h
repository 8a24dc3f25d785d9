/* Caller-driven progress: a caller that finds the transports free starts its op itself and, for
 * up to the poll window (spin.h), progresses them until the op is done, instead of handing the op
 * to the progress thread and waiting for two thread wake-ups.
 *
 * The progress thread owns the transports through `e->plock`: it holds the lock for the whole of
 * each loop iteration and drops it only while it sleeps in epoll_wait. A caller takes the lock
 * with a trylock, never waits for it, and while it holds it runs exactly what one progress
 * iteration runs after its events (every backend's turn, staging, groups, traffic classes), so
 * everything the progress thread owns stays single-owner. The control connections, timers and
 * same-host watch stay with the progress thread, and so do execs, connecting data endpoints,
 * GPU staging and thread-bound backends (backend.h): a caller hands such ops off. Without a poll
 * window, a caller sleeps on the transports' wait fds instead of polling them (drive.c,
 * sleep_locked), and the progress thread asks it to let go through `letgofd`. */
#ifndef CX_DRIVE_H
#define CX_DRIVE_H

#include "engine.h"

/* Start `op` on this thread when the transports are free; with `wait`, also progress them for up
 * to the op's poll window or until the op is done. Returns 1 when the op was started here (the
 * caller then waits for it as usual), 0 when it must go through cx_submit. */
int cx_drive(cx_engine_t *e, cx_op_t *op, int wait);

/* cx_drive(e, op, 1), tried again for a few microseconds while the progress thread holds the
 * transports (drive.c). */
int cx_drive_soon(cx_engine_t *e, cx_op_t *op);

/* How long a caller sleeps on the transports at most (drive.c, sleep_locked) before it lets go
 * and waits for its op as before; the progress thread's tick asks it to let go sooner. A bound
 * on the turns as well, for backends that keep reporting more work. */
#define CX_DRIVE_SLEEP_TICKS 2
#define CX_DRIVE_SLEEP_TURNS 4096u
static inline uint64_t cx_drive_sleep_end(const cx_engine_t *e)
{
    return cx_now_ns() + CX_DRIVE_SLEEP_TICKS * e->tick_ns;
}

/* Without a poll window (CONNEX_DRIVE_SLEEP): a caller that waits for `op` (cx_op_wait, an async
 * op or a batch) takes the transports when they are free and sleeps on their wait fds until the
 * op is done, for `limit_ns` at most (0: no limit but the sleep's own). Returns 1 when the op is
 * done. */
int cx_drive_sleep_wait(cx_engine_t *e, cx_op_t *op, uint64_t limit_ns);

/* A caller whose op went through cx_submit (the lock was busy), or that waits for an async op
 * (cx_op_wait): until the op is done or `window_ns` ends, take the lock when it comes free and
 * drive. An op handed off to the progress thread (device memory, a connect) is not polled for.
 * Returns 1 when the op is done. */
int cx_drive_wait(cx_engine_t *e, cx_op_t *op, uint64_t window_ns);

/* Under plock, on a driving caller: leave `op` (started, linked to its peer) for the progress
 * thread, which sends it on its way again (cx_op_go) at its next iteration: a data endpoint to
 * connect, a thread-bound backend, or device memory to stage. */
void cx_drive_handoff(cx_engine_t *e, cx_op_t *op);
/* Under plock: `op` ended while handed off (its peer failed, it timed out). */
void cx_drive_handoff_drop(cx_engine_t *e, cx_op_t *op);

/* Between the ops of callers that drive, the transports stay polled, not armed: arming costs
 * syscalls per op (UCX's, and the epoll_ctl that takes the wait fds out of the progress thread's
 * set while a caller polls), and an armed shared-memory FIFO makes the peer signal it for every
 * reply, a syscall there and a wake-up of our sleeping progress thread here. Meanwhile the
 * progress thread sleeps: a caller that lets go keeps the drive timer (a timerfd in its epoll
 * set) due one to two ticks ahead, a timerfd_settime per tick of driving at most, and once it
 * fires with no caller driving for a tick, the progress thread arms the transports again and
 * puts the wait fds back. So what arrives after the callers' last op (a peer's message, a peer's
 * read that our side must serve) waits at most two ticks, and none when a thread waits for it
 * (cx_drive_waiting). An earlier design woke the progress
 * thread every tick while callers drove instead: on a small host that wake-up took the CPU from
 * the caller or the peer every 200 us, a 25-45 us op each time. A caller whose op is not done as
 * it lets go, or that leaves other ops in flight, arms at once instead: their completions must
 * wake the progress thread, not wait for the timer. */
#define CX_DRIVE_TICK_US 200
#define CX_DRIVE_FULL_MS 10 /* a full turn (backend progress(), which arms) at least this often */

/* A thread about to block for what only the transports bring (cx_recv_msg, cx_wait_event):
 * where callers left them polled, not armed, the progress thread (or the caller driving now, as
 * it lets go) arms them at once rather than at the drive timer. A reply to a request the caller
 * had just sent waited up to two ticks for it: ucx_shm put_signal p99 467-521 us in 3 of 6
 * runs of the bench (which waits for the peer's reply to each), 81-136 us in 6 of 6 armed at
 * once. */
void cx_drive_waiting(cx_engine_t *e);

/* Under plock: callers drove within the last tick (the transports are theirs between ops). */
static inline int cx_drive_recent(const cx_engine_t *e, uint64_t now_ns)
{
    return e->unarmed && now_ns - e->drove_ns < cx_us_to_ns(CX_DRIVE_TICK_US);
}

/* Progress thread, under plock, before it sleeps for `timeout_ms` (> 0): while callers drive,
 * makes sure the drive timer will wake it; once they stopped, arms the transports again and
 * returns 0 when that found work. Returns the timeout to use. */
int cx_drive_sleep_ms(cx_engine_t *e, int timeout_ms);

/* Under plock: the backends' wait fds out of the progress thread's epoll set and the transports
 * left unarmed, for as long as callers keep driving or the progress thread polls; armed and back
 * in the set by cx_drive_sleep_ms once neither does. */
void cx_drive_unwatch(cx_engine_t *e);

/* Progress thread, with or without plock: the drive timer fired (reads its timerfd). */
void cx_drive_timer_fired(cx_engine_t *e);

#endif
