/* Caller-driven progress (drive.h). */
#include "drive.h"

#include "connex/log.h"
#include "live.h"
#include "spin.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cx_drive_handoff(cx_engine_t *e, cx_op_t *op)
{
    op->stage = OPS_HANDOFF;
    op->hnext = NULL;
    cx_op_t **pp = &e->handoff;
    while (*pp) pp = &(*pp)->hnext; /* in order: a few ops at most */
    *pp = op;
    atomic_store(&e->handoff_waiting, 1);
}

void cx_drive_handoff_drop(cx_engine_t *e, cx_op_t *op)
{
    for (cx_op_t **pp = &e->handoff; *pp; pp = &(*pp)->hnext)
        if (*pp == op) {
            *pp = op->hnext;
            op->hnext = NULL;
            if (!e->handoff) atomic_store(&e->handoff_waiting, 0);
            return;
        }
}

/* The progress thread sleeps with a timeout it chose before this caller ran: wake it when the
 * transports said there is more to do at once, or traffic held back is due before it would look. */
static void wake_progress(cx_engine_t *e)
{
    uint64_t one = 1;
    atomic_store(&e->cmd_kicked, 1);
    if (write(e->cmdfd, &one, sizeof one) < 0 && errno != EAGAIN) cx_error("eventfd: %s", strerror(errno));
}

/* While this caller polls the backends, their wait fds would wake the sleeping progress thread
 * for every completion the caller handles itself (a context switch, and on a small host a CPU the
 * target needs): take them out of its epoll set meanwhile. */
static void backend_watches(cx_engine_t *e, uint32_t events)
{
    for (int i = 0; i < e->nb; i++)
        if (e->be[i].w.kind && !e->be[i].ops->thread_bound)
            cx_watch_mod(e, e->be[i].ops->wait_fd(e->be[i].b), events, &e->be[i].w);
}

void cx_drive_unwatch(cx_engine_t *e)
{
    if (e->unarmed) return;
    backend_watches(e, 0);
    e->unarmed = 1;
    atomic_store(&e->left_polled, 1);
}

/* Under plock: armed again, then the wait fds back in the progress thread's epoll set: one still
 * readable from the polling would wake it at once, for nothing. Returns 1 when arming found work. */
static int rearm(cx_engine_t *e)
{
    /* Right after a turn that armed them all and found nothing more (a sleeping caller's op that
     * ended in it), another would only repeat the arming: on libfabric tcp a CQ read, a
     * fi_trywait and the timer's read, 5 to 7 syscalls per op. */
    int more = e->armed_clean ? 0 : cx_progress_turn(e, 0);
    e->armed_clean = 0;
    if (e->unarmed) {
        backend_watches(e, EPOLLIN);
        e->unarmed = 0;
        atomic_store(&e->left_polled, 0);
    }
    return more;
}

#define TICK_NS cx_us_to_ns(CX_DRIVE_TICK_US)
/* A driving caller reads the clock (and looks at other callers' commands and the progress
 * thread's wish to poll) every CX_DRIVE_CLOCK_EVERY polls; one waiting for the transports' lock
 * every CX_DRIVE_WAIT_CLOCK_EVERY tries, then yields. A poll is cheaper than a vDSO call. */
#define CX_DRIVE_CLOCK_EVERY 8u
#define CX_DRIVE_WAIT_CLOCK_EVERY 64u

/* Under plock: the drive timer due no sooner than a tick after `from_ns`. Set two ticks ahead, so
 * a caller that keeps driving moves it once a tick at most. */
static void push_timer(cx_engine_t *e, uint64_t from_ns)
{
    if (e->dtimer_due_ns >= from_ns + TICK_NS) return;
    uint64_t due = from_ns + 2 * TICK_NS;
    struct itimerspec its = { .it_value = cx_ns_timespec(due) };
    if (timerfd_settime(e->dtimerfd, TFD_TIMER_ABSTIME, &its, NULL)) {
        cx_error("drive timer: %s", strerror(errno));
        return;
    }
    e->dtimer_due_ns = due;
}

void cx_drive_timer_fired(cx_engine_t *e)
{
    uint64_t v;
    if (read(e->dtimerfd, &v, sizeof v) < 0 && errno != EAGAIN) cx_error("drive timer read: %s", strerror(errno));
}

int cx_drive_sleep_ms(cx_engine_t *e, int timeout_ms)
{
    int asked = atomic_exchange(&e->rearm_asked, 0);
    if (!e->unarmed) return timeout_ms;
    if (!asked && cx_drive_recent(e, cx_now_ns())) {
        push_timer(e, e->drove_ns);
        return timeout_ms;
    }
    return rearm(e) ? 0 : timeout_ms; /* the callers stopped driving */
}

/* Under plock: whether an op other than `op` is in flight. Its completion must wake the
 * progress thread at once, not when the drive timer fires. Only peers an op reached since the
 * last look can hold one (cx_peer_activate); those found idle leave the list, so each op pays
 * for the peers it used, not for every peer known. */
static int others_in_flight(cx_engine_t *e, const cx_op_t *op)
{
    for (cx_peer_t **pp = &e->active_peers; *pp;) {
        cx_peer_t *p = *pp;
        if (p->bg_head || p->cls_wait[0] || p->cls_wait[1]) return 1;
        int mine = 0;
        for (const cx_op_t *o = p->ops.next; o != &p->ops; o = o->next) {
            if (o != op) return 1;
            mine = 1;
        }
        if (mine) {
            pp = &p->active_next;
            continue;
        }
        *pp = p->active_next;
        p->active_next = NULL;
        p->active = 0;
    }
    return 0;
}

/* Under plock: whether polling the transports can end `op`. Not while the progress thread has
 * it (handed off, staged through the GPU ring, served over the control connection) or it waits
 * for its peer or region: a driving caller would only keep that thread from it (staging does
 * not even run while a caller drives). */
static int pollable(const cx_op_t *op)
{
    return op->stage == OPS_QUEUED || op->stage == OPS_IN_BACKEND || op->stage == OPS_WAIT_CREDIT ||
        op->stage == OPS_CHUNKED || op->stage == OPS_DONE;
}

/* Under plock, which it keeps: without a poll window, sleep on the transports' wait fds until
 * `op` is done, instead of letting go and sleeping on the op's condition variable. The op's
 * completion then wakes this thread directly: one wake-up where the hand-off takes two (the
 * progress thread's, then this caller's), and none at all for an op that the backend ends within
 * its post or its first progress (a same-host copy). The transports stay this caller's only while
 * nothing else needs them: the progress thread, woken by anything but their wait fds (a tick, a
 * control frame, a death, a queued exec), asks through `letgofd`, and this caller lets go at once
 * and waits for the op as before. Commands of other callers are started here, as a polling
 * caller starts them. Returns 1 when the queue holds what only the progress thread may start. */
static int sleep_locked(cx_engine_t *e, cx_op_t *op, uint64_t end, int *armed)
{
    *armed = 0;
    struct pollfd fds[CX_MAX_BACKENDS + 2];
    nfds_t n = 0;
    for (int i = 0; i < e->nb; i++)
        if (e->be[i].w.kind && !e->be[i].ops->thread_bound)
            fds[n++] = (struct pollfd){ .fd = e->be[i].ops->wait_fd(e->be[i].b), .events = POLLIN };
    if (!n) return 0;
    const nfds_t letgo = n, cmd = n + 1;
    fds[n++] = (struct pollfd){ .fd = e->letgofd, .events = POLLIN };
    fds[n++] = (struct pollfd){ .fd = e->cmdfd, .events = POLLIN };
    int left = 0;
    /* Ended within its post or by what has arrived already (a same-host copy): no arming, no
     * sleep, and the transports stay polled for this caller's next op (drive_locked). */
    cx_progress_turn(e, 1);
    if (op->kind == CX_OPK_READ) e->slow_reads = !cx_op_is_done(op);
    if (cx_op_is_done(op) || !pollable(op)) return 0;
    *armed = 1;
    cx_drive_unwatch(e); /* else every completion would wake the progress thread as well */
    atomic_store(&e->sleeping, 1);
    for (unsigned i = 0; i < CX_DRIVE_SLEEP_TURNS; i++) {
        int more = cx_progress_turn(e, 0); /* which arms the wait fds */
        if (cx_op_is_done(op) || !pollable(op) || e->handoff || atomic_load(&e->pwant)) {
            e->armed_clean = !more && !e->handoff;
            break;
        }
        if (more) continue;
        uint64_t now = cx_now_ns();
        if (now >= end) break;
        uint64_t ms = (end - now + CX_NS_PER_MS - 1) / CX_NS_PER_MS;
        int r = poll(fds, n, ms > 1000 ? 1000 : (int)ms);
        if (r < 0 && errno != EINTR) {
            cx_error("drive: poll: %s", strerror(errno));
            break;
        }
        uint64_t v;
        if (r > 0 && fds[letgo].revents) {
            if (read(e->letgofd, &v, sizeof v) < 0 && errno != EAGAIN) cx_error("eventfd read: %s", strerror(errno));
            break;
        }
        if (r > 0 && fds[cmd].revents) {
            /* Read here, whoever kicked it: readable, it would end every poll at once. */
            atomic_store(&e->cmd_kicked, 0);
            if (read(e->cmdfd, &v, sizeof v) < 0 && errno != EAGAIN) cx_error("eventfd read: %s", strerror(errno));
            if (!cx_progress_drain(e)) {
                left = 1;
                break;
            }
        }
    }
    atomic_store(&e->sleeping, 0);
    return left;
}

/* Under plock, which it releases: poll the transports until `op` is done or `end`. Done, with
 * nothing else in flight: the transports stay polled for this caller's next op (drive.h). Else
 * they are armed again before the caller lets go. `left`: the queue holds what only the progress
 * thread may start (cx_progress_drain), and this caller may have read the eventfd that would
 * wake it. `mine`: the op was not done yet as this caller took the lock (ops_driven_done).
 * `spin`: with `end` 0, poll for that long from now, the clock read only if the op is not done
 * within the first polls (a clock read is not free on a VM: most small shm ops need none). */
static void drive_locked(cx_engine_t *e, cx_op_t *op, uint64_t end, int left, int mine, uint64_t spin, int polled_only)
{
    int polled = 0;
    uint64_t seen = 0; /* the last clock read, a few polls ago at most */
    if (!cx_op_is_done(op) && (spin || (end && cx_now_ns() < end))) {
        cx_drive_unwatch(e);
        polled = 1;
        for (unsigned i = 1; !cx_op_is_done(op); i++) {
            cx_progress_turn(e, 1);
            if (!(i % CX_DRIVE_CLOCK_EVERY)) {
                seen = cx_now_ns();
                if (!end)
                    end = seen + spin; /* the window starts a few polls late */
                else if (seen >= end)
                    break;
                if (atomic_load(&e->pwant)) break;
                /* other callers' ops: the progress thread waits for us */
                if (!cx_progress_drain_commands(e)) left = 1;
            }
        }
    }
    int done = cx_op_is_done(op), wake;
    if (done && mine) e->st.ops_driven_done++;
    /* A caller that polled the transports (its window, or an op that ended at the first look
     * without one: `polled_only`) leaves them polled for its next op. One that armed them to
     * sleep on, or did neither, arms them as it lets go: left polled after a sleep, what the
     * backend still had to do for the op ran only with the caller's next op (16 KiB ucx_tcp
     * writes 125 us against 82). */
    int stay = done && (op->w.spin_ns || polled_only) && !left && !atomic_exchange(&e->rearm_asked, 0);
    /* Done at its start: what the start left (a backend that signals edge-style after its own
     * sends). What a poll finds is handled here: it is no reason to wake the progress thread
     * (a write's completion ack, every op: measured 30 us per 4 KiB shm write, against 1.3). */
    if (stay && !polled && !polled_only) cx_progress_turn(e, 1);
    if (stay && polled_only && !e->unarmed && !e->handoff && !others_in_flight(e, op)) {
        /* Armed as the op started, and done at the first look (a same-host copy): the arming
         * still holds, and a poll that consumed an event leaves the wait fd readable at worst,
         * one spare turn of the progress thread. Left polled instead, the fds would go out of
         * the progress thread's set and the drive timer would start (an epoll_ctl and a
         * timerfd_settime), and a thread that then waits for a message (the write, then a
         * message to check it) would have them armed again at once (cx_drive_waiting): two
         * more syscalls and a wake-up of the progress thread per op. */
        wake = e->sched_wake_ns != 0;
    } else if (stay && !e->handoff && !others_in_flight(e, op)) {
        cx_drive_unwatch(e);
        uint64_t now = seen ? seen : cx_now_ns();
        e->drove_ns = now;
        push_timer(e, now);
        wake = e->sched_wake_ns != 0;
        /* What backends do only in progress() (timers, UCX worker rotation, libfabric's
         * dead-peer reports), for callers that never stop driving: the progress thread sleeps. */
        if (now - e->full_turn_ns >= cx_ms_to_ns(CX_DRIVE_FULL_MS)) {
            e->full_turn_ns = now;
            wake |= cx_progress_turn(e, 0);
        }
    } else {
        int more = rearm(e);
        /* Not done within the window: the progress thread takes over, polling at once (spin.h),
         * as it would have had the op gone through it, instead of waking for the completion. */
        if (!done && op->w.spin_ns) e->last_work_ns = cx_now_ns();
        wake = more || left || e->sched_wake_ns || (!done && op->w.spin_ns) || e->handoff;
    }
    wake |= e->batch_ready != NULL; /* a batch's phase ended as this caller let go */
    e->armed_clean = 0;
    e->driving = 0;
    pthread_mutex_unlock(&e->plock);
    if (wake) wake_progress(e);
}

/* The transports' lock, when free and the progress thread is running. Not while a death the
 * same-host watch reported waits to be reaped: the progress thread fails the peer first, so an
 * op its caller starts after seeing that FAILED finds the peer failed (docs/semantics.md). */
static int take(cx_engine_t *e)
{
    if (atomic_load(&e->pwant) || cx_live_death_pending(e) || pthread_mutex_trylock(&e->plock)) return 0;
    if (e->ready && !atomic_load(&e->stop) && !cx_live_death_pending(e)) {
        e->driving = 1;
        return 1;
    }
    pthread_mutex_unlock(&e->plock); /* not started, or closing: cx_submit says which */
    return 0;
}

int cx_drive(cx_engine_t *e, cx_op_t *op, int wait)
{
    /* An exec's function may rely on running on the progress thread (the same-host watch's
     * mutex is that thread's). */
    if (!e->drive || op->kind == CX_OPK_EXEC || !take(e)) return 0;
    /* Ops queued before this one start first; behind an exec, this one queues too (in order). */
    if (!cx_progress_drain_commands(e)) {
        e->driving = 0;
        pthread_mutex_unlock(&e->plock);
        wake_progress(e); /* the exec, and what the drain handed off */
        return 0;
    }
    e->st.ops_driven++;
    /* Polling: the wait fds out of the progress thread's set before the op starts, not after,
     * or its first completion wakes that thread for nothing. So too for a read the caller will
     * sleep for, when the last one did not end at its start (a serving loop repeats its reads):
     * libfabric's tcp signals its CQ's wait fd for the send of the read's request inside the
     * post, and the progress thread woke at 9 reads in 10 (16 KiB: 127 -> 97 us p50 without
     * those wake-ups, on a host with 2 CPUs where the target's thread needs the other). Not for
     * messages: the reply a message asks for is the progress thread's to deliver, and a write
     * and its check message took 81 us with it asleep at the message's post against 67 us. */
    int sleep = wait && !op->w.spin_ns && e->drive_sleep;
    if (wait && (op->w.spin_ns || (sleep && op->kind == CX_OPK_READ && e->slow_reads))) cx_drive_unwatch(e);
    cx_op_start(e, op);
    /* Handed off (a thread-bound backend, a connect, device memory): the progress thread ends it. */
    int left = 0, armed = 1;
    sleep = sleep && pollable(op);
    if (sleep) left = sleep_locked(e, op, cx_drive_sleep_end(e), &armed);
    drive_locked(e, op, 0, left, 1, wait && op->stage != OPS_HANDOFF ? op->w.spin_ns : 0, !armed);
    return 1;
}

/* The progress thread holds the transports for one loop iteration at a time, and a caller that
 * finds them taken hands its op over (cx_submit): that write to the command eventfd wakes the
 * progress thread, which then takes the lock again for the op, and the next op of this caller
 * finds it taken as well. On a small host the thread runs there only when a CPU frees up, and
 * that pattern held for whole runs: 4 KiB libfabric shm writes at 17-27 us with 38-51% of the
 * ops driven, in 4 runs of 8, against 1.8-2.6 us and 87-99% in the others. The iteration that
 * holds the lock is usually about to end (a caller in a synchronous op keeps it from polling):
 * wait for it a little, without waking anybody. */
#define CX_DRIVE_SOON_NS (10 * CX_NS_PER_US)

int cx_drive_soon(cx_engine_t *e, cx_op_t *op)
{
    uint64_t end = 0;
    for (unsigned i = 1;; i++) {
        if (cx_drive(e, op, 1)) return 1;
        if (op->kind == CX_OPK_EXEC || !e->drive || atomic_load(&e->stop)) return 0;
        if (!end) end = cx_now_ns() + (op->w.spin_ns < CX_DRIVE_SOON_NS ? op->w.spin_ns : CX_DRIVE_SOON_NS);
        if (!(i % CX_DRIVE_CLOCK_EVERY)) {
            if (cx_now_ns() >= end) return 0;
            sched_yield();
        }
    }
}

void cx_drive_waiting(cx_engine_t *e)
{
    if (atomic_load(&e->left_polled) && !atomic_exchange(&e->rearm_asked, 1)) wake_progress(e);
}

int cx_drive_sleep_wait(cx_engine_t *e, cx_op_t *op, uint64_t limit_ns)
{
    if (!e->drive || !e->drive_sleep || cx_op_is_done(op) || !take(e)) return cx_op_is_done(op);
    int mine = !cx_op_is_done(op);
    int left = !cx_progress_drain_commands(e);
    uint64_t end = cx_drive_sleep_end(e), lim = limit_ns ? cx_now_ns() + limit_ns : 0;
    if (lim && lim < end) end = lim;
    int armed = 1;
    if (!left && pollable(op)) left = sleep_locked(e, op, end, &armed);
    drive_locked(e, op, 0, left, mine, 0, !armed);
    return cx_op_is_done(op);
}

int cx_drive_wait(cx_engine_t *e, cx_op_t *op, uint64_t window_ns)
{
    if (!e->drive || !window_ns) return cx_op_is_done(op);
    uint64_t end = cx_now_ns() + window_ns;
    for (unsigned i = 1; !cx_op_is_done(op); i++) {
        if (take(e)) {
            /* Done by the progress thread before this caller got the lock: not driven here
             * (ops_driven_done counted it once in a CI run of test_callers_drive, a ZeroMQ op
             * that only the progress thread runs). */
            int mine = !cx_op_is_done(op);
            int left = !cx_progress_drain_commands(e); /* this op, queued: start it now */
            drive_locked(e, op, left || !pollable(op) ? 0 : end, left, mine, 0, 0);
            break;
        }
        if (!(i % CX_DRIVE_WAIT_CLOCK_EVERY)) {
            if (cx_now_ns() >= end) break;
            sched_yield();
        }
    }
    return cx_op_is_done(op);
}
