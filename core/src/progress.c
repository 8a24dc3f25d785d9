/* The progress thread: one epoll loop over the listening socket, the control connections, the
 * command eventfd, the tick timerfd and every backend's wake-up fd. Never sleep-and-poll: a
 * one-sided read over TCP completes only when the target's progress thread runs. */
#include "engine.h"

#include "connex/log.h"
#include "cx_sched.h"
#include "drive.h"
#include "staging.h"
#include "live.h"
#include "spin.h"
#include "mobility/mobility.h"
#include "batch.h"

#include <errno.h>
#include <sched.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

int cx_watch_add(cx_engine_t *e, int fd, uint32_t events, cx_watch_t *w)
{
    struct epoll_event ev = { .events = events, .data.ptr = w };
    if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev)) {
        cx_error("epoll add fd %d: %s", fd, strerror(errno));
        return CX_ERR;
    }
    return CX_OK;
}

int cx_watch_mod(cx_engine_t *e, int fd, uint32_t events, cx_watch_t *w)
{
    struct epoll_event ev = { .events = events, .data.ptr = w };
    return epoll_ctl(e->epfd, EPOLL_CTL_MOD, fd, &ev) ? CX_ERR : CX_OK;
}

void cx_watch_del(cx_engine_t *e, int fd)
{
    epoll_ctl(e->epfd, EPOLL_CTL_DEL, fd, NULL);
}

/* Ops a driving caller left here (drive.h): on their way again, from the progress thread, before
 * anything submitted after them. */
static void run_handoff(cx_engine_t *e)
{
    while (e->handoff) {
        cx_op_t *op = e->handoff;
        e->handoff = op->hnext;
        op->hnext = NULL;
        op->stage = OPS_QUEUED;
        cx_op_go(e, op);
    }
    atomic_store(&e->handoff_waiting, 0);
}

int cx_progress_drain(cx_engine_t *e)
{
    if (!e->driving) run_handoff(e);
    for (;;) {
        /* A FAILED its caller saw is a failed peer here too: the progress thread reaps first. */
        if (!e->driving)
            cx_live_reap_pending(e);
        else if (cx_live_death_pending(e))
            return 0;
        pthread_mutex_lock(&e->qmu);
        cx_op_t *op = e->qhead;
        if (e->driving) {
            /* Up to the first exec: its function may need the progress thread (drive.c). */
            cx_op_t *last = NULL, *o = op;
            while (o && o->kind != CX_OPK_EXEC) {
                last = o;
                o = o->next;
            }
            if (!last)
                op = NULL;
            else {
                last->next = NULL;
                e->qhead = o;
                if (!o) e->qtail = NULL;
            }
        } else {
            e->qhead = e->qtail = NULL;
        }
        int rest = e->qhead != NULL; /* driving: an exec and what follows it */
        pthread_mutex_unlock(&e->qmu);
        if (!op) return !rest;
        while (op) {
            cx_op_t *n = op->next;
            op->next = op->prev = NULL;
            cx_op_start(e, op);
            op = n;
        }
    }
}

int cx_progress_drain_commands(cx_engine_t *e)
{
    uint64_t v;
    /* Read before draining: a submit after the read writes it again. */
    if (!e->driving) atomic_store(&e->cmd_kicked, 0);
    if ((!e->driving || atomic_exchange(&e->cmd_kicked, 0)) && read(e->cmdfd, &v, sizeof v) < 0 && errno != EAGAIN)
        cx_error("eventfd read: %s", strerror(errno));
    return cx_progress_drain(e);
}

/* Polling, the backends' turns between two looks at epoll (and a yield: spin.c), each a syscall:
 * a request that arrives while this thread is in one waits for it. Looking after every 16 turns,
 * and at once after a turn that found work, put those syscalls right where the next request of
 * a caller that waits for each reply lands: 4 KiB ucx_shm reads locked into 2.0-2.3 us for
 * thousands of ops, against 1.0-1.1 in runs where they did not. The raw loop looks at its pipe
 * after 1000 turns. */
#define CX_POLL_SLICE_NS (20 * CX_NS_PER_US)
/* Within a slice: queued commands started every CX_POLL_DRAIN_EVERY turns (as a driving caller
 * does), the clock read every CX_POLL_CLOCK_EVERY (a turn is cheaper than a vDSO call). Powers of
 * two. */
#define CX_POLL_DRAIN_EVERY 4u
#define CX_POLL_CLOCK_EVERY 16u

static int progress_backends(cx_engine_t *e)
{
    int more = 0;
    for (int i = 0; i < e->nb; i++)
        if (!e->driving || !e->be[i].ops->thread_bound) more |= e->be[i].ops->progress(e->be[i].b) > 0;
    return more;
}

int cx_progress_turn(cx_engine_t *e, int poll)
{
    int more = 0;
    /* Before the backends' turn: an op submitted after it would wait for the next wake-up (the
     * turn arms the wait fds). */
    if (!e->driving) run_handoff(e);
    if (!poll)
        more = progress_backends(e);
    else
        for (int i = 0; i < e->nb; i++) {
            const struct cx_backend_ops *o = e->be[i].ops;
            if (e->driving && o->thread_bound) continue;
            more |= (o->poll ? o->poll(e->be[i].b) : o->progress(e->be[i].b)) > 0;
        }
    if (e->want_ep) cx_peers_want_ep(e);     /* after the backends: requests they hold for an endpoint */
    if (!e->driving) cx_staging_progress(e); /* after the backends: their completions free staging slots */
    more |= cx_groups_progress(e);           /* after the backends: their completions end steps' children */
    more |= cx_sched_pump(e) > 0;            /* after the backends: their completions free credits */
    /* After both: their completions end a batch's phase. One ended by what the batches started
     * (an entry refused at once) is taken at the next turn, without sleeping. */
    cx_batches_progress(e);
    more |= e->batch_ready != NULL;
    /* Messages delivered this turn, and by the control connections' events before it, wake their
     * receiver only now, after the backends sent their acks (queue.h). */
    cx_msgq_wake(&e->msgq);
    return more;
}

static void tick(cx_engine_t *e)
{
    uint64_t v;
    if (read(e->timerfd, &v, sizeof v) < 0 && errno != EAGAIN) cx_error("timerfd read: %s", strerror(errno));
    uint64_t now = cx_now_ns();
    cx_peers_tick(e, now);
    cx_ops_tick(e, now);
    cx_dir_tick(e, now);
    cx_groups_tick(e, now);
    cx_metrics_tick(e, now);
}

static int is_backend_watch(const cx_engine_t *e, const cx_watch_t *w)
{
    for (int i = 0; i < e->nb; i++)
        if (w == &e->be[i].w) return 1; /* progressed below, every iteration */
    return 0;
}

/* Woken by `w` while a caller drives: whether to ask it to let go (cx_progress_main). Not for its
 * backends, which it polls itself, nor for commands: a driving caller starts them as it drains
 * the queue every few polls (drive.c), all but an exec, which only this thread runs. Asking for
 * the ops a caller queued while this thread held the lock, which that caller then drives
 * itself, took the lock from it op after op. */
static int wants_lock(cx_engine_t *e, const cx_watch_t *w)
{
    if (is_backend_watch(e, w) || w == &e->dw) return 0; /* the drive timer: only_drive_events */
    if (w != &e->cw) return 1;
    pthread_mutex_lock(&e->qmu);
    int exec = 0;
    for (const cx_op_t *o = e->qhead; o && !exec; o = o->next) exec = o->kind == CX_OPK_EXEC;
    pthread_mutex_unlock(&e->qmu);
    return exec;
}

/* Of a batch of events that wants no lock, while a caller drives: the command eventfd, which the
 * caller reads as it drains the queue (nothing there for this thread to wait for), the drive
 * timer, which the caller moves again as it lets go, and the wake-ups of the backends it polls
 * itself (all but thread-bound ones). Returns 0 when the batch holds anything else, 2 when it
 * holds a backend's wake-up. */
static int only_drive_events(cx_engine_t *e, const struct epoll_event *evs, int n)
{
    int backend = 0;
    for (int i = 0; i < n; i++) {
        const cx_watch_t *w = evs[i].data.ptr;
        int b = 0;
        for (int k = 0; k < e->nb && !b; k++) b = w == &e->be[k].w && !e->be[k].ops->thread_bound;
        if (b)
            backend = 1;
        else if (w != &e->cw && w != &e->dw)
            return 0;
    }
    for (int i = 0; i < n; i++)
        if (evs[i].data.ptr == &e->dw) cx_drive_timer_fired(e); /* else it stays readable */
    return 1 + backend;
}

/* epoll_wait, for at most a drive tick with `tick` (epoll_pwait2: microseconds; a kernel before
 * 5.11 has none, and then the tick is a millisecond). */
static int wait_events(cx_engine_t *e, struct epoll_event *evs, int max, int timeout_ms, int tick)
{
    static atomic_int no_pwait2;
    if (tick && timeout_ms && !atomic_load(&no_pwait2)) {
        struct timespec ts = { 0, CX_DRIVE_TICK_US * 1000l };
        int n = epoll_pwait2(e->epfd, evs, max, &ts, NULL);
        if (n >= 0 || errno != ENOSYS) return n;
        atomic_store(&no_pwait2, 1);
    }
    return epoll_wait(e->epfd, evs, max, tick && timeout_ms ? 1 : timeout_ms);
}

/* Woken after it stopped polling: a backend's wake-up that came within the window means the
 * window was too short for this peer's pace. A backend that serves one-sided ops inside its
 * poll (libfabric: the provider moves the data in fi_cq_read and reports nothing) never tells
 * this thread it did work, so the window ran out between a peer's requests and every third
 * one or so woke it (measured: 4 KiB libfabric_tcp writes, an epoll_ctl pair per 2 ops at the
 * target). Doubled up to 16 x CONNEX_POLL_US, halved back when the wake-ups come late. */
static void window_fit(cx_engine_t *e, const struct epoll_event *evs, int n, uint64_t now)
{
    int backend = 0;
    for (int i = 0; i < n && !backend; i++) backend = is_backend_watch(e, evs[i].data.ptr);
    if (!backend) return;
    uint64_t gap = now - e->pslept_ns;
    e->pslept_ns = 0;
    if (gap < e->pwin_ns)
        e->pwin_ns = e->pwin_ns * 2 > 16 * e->spin_ns ? 16 * e->spin_ns : e->pwin_ns * 2;
    else if (gap > 4 * e->pwin_ns)
        e->pwin_ns = e->pwin_ns / 2 < e->spin_ns ? e->spin_ns : e->pwin_ns / 2;
}

static cx_conn_t *conn_of(cx_engine_t *e, const cx_watch_t *w)
{
    for (cx_conn_t *k = e->conns; k; k = k->next)
        if (&k->w == w) return k;
    return NULL;
}

static void fail_everything(cx_engine_t *e)
{
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        cx_peer_drop_ep(e, p, CX_ECLOSED);
        cx_peer_ops_fail(e, p, CX_ECLOSED);
    }
}

void *cx_progress_main(void *arg)
{
    cx_engine_t *e = arg;
    struct epoll_event evs[64];
    int more = 0;
    /* Held for every iteration, dropped only while sleeping: callers drive the transports in
     * between (drive.h). */
    cx_live_hold(e); /* before any HELLO goes out: it advertises this mutex. Held for
                        * good, so taken before plock: one lock order */
    pthread_mutex_lock(&e->plock);
    e->ready = 1;
    int polling = 0; /* the last iteration polled */
    while (!atomic_load(&e->stop)) {
        int rest_ms = cx_sched_timeout_ms(e, 1000); /* until a timer of ours is due */
        int timeout = more ? 0 : cx_spin_timeout_ms(e, cx_now_ns(), rest_ms);
        /* Callers drive, or this thread polled: about to sleep, the drive timer wakes this
         * thread while callers drive, else the transports are armed first, and it goes round
         * again if that found work (drive.h). */
        if (timeout && e->unarmed) timeout = cx_drive_sleep_ms(e, timeout);
        if (timeout && polling) e->pslept_ns = cx_now_ns();
        polling = 0;
        pthread_mutex_unlock(&e->plock);
        int n, ticking = 0; /* ticking: a drive tick at most, not a timer of ours */
        for (;;) {
            n = wait_events(e, evs, 64, timeout, ticking);
            if (!pthread_mutex_trylock(&e->plock)) break;
            /* A caller is driving. For anything but its backends' wake-ups (which it polls
             * itself: asking it to let go for those would hand every completion back to this
             * thread), ask it to let go (drive.c): heartbeats and deaths wait for nobody. */
            int want = n < 0 || (n == 0 && timeout > 0 && !ticking); /* a timer of ours ran out */
            /* Ops a caller left for this thread (a connect, a thread-bound backend, device
             * memory, and every op behind one): only this thread starts them, and callers that
             * keep driving would keep them waiting for its next timer (up to a second: messages
             * to a live peer stuck behind a reconnect to a stopped one, while one-sided writes
             * to it went on completing at once, conformance_hol). */
            want |= atomic_load(&e->handoff_waiting);
            for (int i = 0; i < n && !want; i++) want = wants_lock(e, evs[i].data.ptr);
            int mine = want ? 0 : only_drive_events(e, evs, n);
            if (mine) {
                /* A caller has the transports: it polls them now, and starts what was queued.
                 * Waiting for the lock would take it as the caller lets go, this thread's
                 * wake-up on the CPU the peer polls on, for every op (measured: 4 KiB shm
                 * reads at 21-30 us, against 1-2), and its next op would queue behind this
                 * thread's iteration again, which arms the transports again: a state that
                 * lasted for thousands of ops. Polling, this thread looks once more after a
                 * tick; else, or after that, it sleeps until one of its fds or timers calls:
                 * the caller wakes it as it lets go when it must, else the drive timer does
                 * (drive.h). Waking every tick instead took the CPU from the caller or the
                 * peer every 200 us, a 25-45 us op each time. The command eventfd stays
                 * readable only until the caller drains the queue, a backend's wait fd until
                 * the caller, polling, takes it out of the set: let the caller run. */
                if (!timeout) {
                    timeout = 1;
                    ticking = 1;
                } else if (ticking) {
                    timeout = rest_ms;
                    ticking = 0;
                }
                if (mine == 2) sched_yield();
                continue;
            }
            if (want) {
                atomic_store(&e->pwant, 1);
                /* A caller asleep on the transports (drive.c) sees pwant only when it wakes. */
                uint64_t one = 1;
                if (atomic_load(&e->sleeping) && write(e->letgofd, &one, sizeof one) < 0 && errno != EAGAIN)
                    cx_error("eventfd: %s", strerror(errno));
            }
            pthread_mutex_lock(&e->plock);
            atomic_store(&e->pwant, 0);
            break;
        }
        run_handoff(e); /* what callers left while this thread slept goes first */
        if (n < 0 && errno != EINTR) {
            cx_error("epoll_wait: %s", strerror(errno));
            break;
        }
        /* A death seen by the same-host watch goes first: the same batch may hold the dead
         * process's connection closing, which would report it with less to say. */
        for (int i = 0; i < n; i++)
            if (cx_live_is_watch(e, evs[i].data.ptr)) cx_live_reap(e);
        for (int i = 0; i < n; i++) {
            cx_watch_t *w = evs[i].data.ptr;
            if (w == &e->lw)
                cx_accept_all(e);
            else if (w == &e->cw)
                cx_progress_drain_commands(e);
            else if (w == &e->tw)
                tick(e);
            else if (w == &e->dw)
                cx_drive_timer_fired(e); /* acted on at the loop's top */
            else if (cx_live_is_watch(e, w))
                continue; /* reaped above */
            else if (cx_metrics_is_watch(e, w))
                cx_metrics_event(e, w, evs[i].events);
            else if (!is_backend_watch(e, w)) {
                /* A control connection. One closed by an earlier event of this batch is freed:
                 * find it by address before touching it. */
                cx_conn_t *c = conn_of(e, w);
                if (!c) continue;
                if (evs[i].events & EPOLLOUT) cx_conn_writable(e, c);
                if ((evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && conn_of(e, w))
                    cx_conn_readable(e, c);
            }
        }
        /* Backends such as ZeroMQ signal edge-style: events may be pending after our own sends,
         * so every iteration gives each backend a turn. */
        uint64_t now = cx_now_ns();
        /* Within the poll window the backends poll without arming (a syscall or more each),
         * like a raw loop spinning on its worker; epoll still sees the control sockets. */
        if (e->pslept_ns && n > 0) window_fit(e, evs, n, now);
        int polled = e->spin_ns && now - e->last_work_ns < e->pwin_ns && !atomic_load(&e->drivers);
        polling = polled;
        /* Polling: the backends' wait fds out of the epoll set, as for a driving caller. One
         * signalled once stays readable until the backend arms again: every epoll_wait then
         * returned it, and this thread went back to epoll after every turn (measured: an
         * epoll_wait per 2.5 us on a shm target, 4 KiB reads at 2.0-3.0 us against 1.0).
         * Armed and back in the set when the window ends (drive.c). */
        if (polled) cx_drive_unwatch(e);
        /* Polling, or unarmed (callers drive, drive.h): and every CX_DRIVE_FULL_MS a full turn,
         * which runs what backends do only there (timers, UCX worker rotation, libfabric's
         * dead-peer reports), for a peer that never stops polling or callers that never stop
         * driving. */
        int poll = polled || e->unarmed;
        if (poll && now - e->full_turn_ns >= cx_ms_to_ns(CX_DRIVE_FULL_MS)) poll = 0;
        if (!poll) e->full_turn_ns = now;
        more = cx_progress_turn(e, poll);
        if (polled && n == 0) {
            /* Polling: turn after turn for a slice, without the syscalls, until a caller wants
             * the transports (drivers: it drives them itself, drive.h). Queued commands are
             * started every few turns, as a driving caller does. */
            uint64_t end = now + CX_POLL_SLICE_NS;
            for (unsigned k = 1; !atomic_load(&e->drivers); k++) {
                if (cx_progress_turn(e, 1)) {
                    more = 1;
                    e->last_work_ns = cx_now_ns();
                }
                if (!(k % CX_POLL_DRAIN_EVERY)) cx_progress_drain(e);
                if (!(k % CX_POLL_CLOCK_EVERY) && cx_now_ns() >= end) break;
            }
        }
        if (n > 0 || more) e->last_work_ns = now; /* poll a while before sleeping (spin.h) */
    }
    fail_everything(e);
    progress_backends(e);
    cx_live_release(e); /* a clean end: same-host watchers stop without a report */
    pthread_mutex_unlock(&e->plock);
    return NULL;
}
