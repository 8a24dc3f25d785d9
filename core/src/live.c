/* Same-host death watch through a robust futex: why and how in live.h. */
#include "live.h"
#include "connex/options.h"

#include "engine.h"
#include "connex/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/resource.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LIVE_MAGIC 0x564c5843u /* "CXLV" */
#define LIVE_VERSION 1
#define LIVE_PAGE 4096

/* The shared page. Only the mutex's futex word is touched across processes; the header lets a
 * watcher check that it mapped the page of the incarnation the HELLO named. */
typedef struct live_page {
    uint32_t magic, version;
    uint64_t incarnation;
    pthread_mutex_t mu;
} live_page_t;

struct cx_live_watch {
    cx_peer_t *peer; /* only its event gate fields are touched here (cx_event_gate) */
    cx_engine_t *e;
    cx_lid_t lid; /* the peer's, copied: the progress thread owns the peer */
    char url[CX_URL_MAX];
    uint64_t incarnation;
    uint32_t pid;
    live_page_t *page; /* the peer's page, mapped here */
    uint32_t owner;    /* the futex word's owner TID when the watch began */
    pthread_t th;
    atomic_int stop; /* set by the progress thread: end now */
    atomic_int done; /* set by the watcher as it ends */
    atomic_int died; /* it ended because the owner died */
    int efd;
    cx_live_watch_t *next;
};

struct cx_live {
    atomic_int dead; /* watchers that saw their process die, not yet reaped */
    int memfd, efd;
    live_page_t *page; /* ours */
    int held;
    cx_watch_t w;
    cx_live_watch_t *watches;
};

#if defined(__GLIBC__) && defined(__linux__)
/* glibc's pthread_mutex_t starts with the futex word the kernel's robust-list protocol works on
 * (owner TID | FUTEX_WAITERS | FUTEX_OWNER_DIED): part of glibc's ABI, in <bits/struct_mutex.h>. */
static uint32_t *futex_word(live_page_t *pg)
{
    return (uint32_t *)(void *)&pg->mu.__data.__lock;
}
#define LIVE_SUPPORTED 1
#else
static uint32_t *futex_word(live_page_t *pg)
{
    (void)pg;
    return NULL;
}
#define LIVE_SUPPORTED 0
#endif

static long futex(uint32_t *w, int op, uint32_t val, const struct timespec *ts)
{
    /* Not FUTEX_PRIVATE_FLAG: the word is shared between processes. */
    return syscall(SYS_futex, w, op, val, ts, NULL, 0);
}

static int enabled(const cx_engine_t *e)
{
    return LIVE_SUPPORTED && cx_opts_num(&e->opts, "CONNEX_SAME_HOST_WATCH", NULL); /* default 1 */
}

void cx_live_open(cx_engine_t *e)
{
    e->live = NULL;
    if (!enabled(e)) return;
    cx_live_t *l = calloc(1, sizeof *l);
    if (!l) return;
    l->memfd = l->efd = -1;
    l->memfd = (int)syscall(SYS_memfd_create, "connex-live", MFD_CLOEXEC);
    l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->memfd < 0 || l->efd < 0 || ftruncate(l->memfd, LIVE_PAGE)) goto fail;
    l->page = mmap(NULL, LIVE_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, l->memfd, 0);
    if (l->page == MAP_FAILED) {
        l->page = NULL;
        goto fail;
    }
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(&l->page->mu, &a);
    pthread_mutexattr_destroy(&a);
    if (rc) goto fail;
    l->page->incarnation = e->incarnation;
    l->page->version = LIVE_VERSION;
    atomic_thread_fence(memory_order_release);
    l->page->magic = LIVE_MAGIC;
    l->w = (cx_watch_t){ CX_W_LIVE, e, 0 };
    if (cx_watch_add(e, l->efd, EPOLLIN, &l->w)) goto fail;
    e->live = l;
    return;
fail:
    cx_debug("same-host death watch unavailable: %s", strerror(errno));
    if (l->page) munmap(l->page, LIVE_PAGE);
    if (l->memfd >= 0) close(l->memfd);
    if (l->efd >= 0) close(l->efd);
    free(l);
}

void cx_live_advert(const cx_engine_t *e, uint32_t *pid, int32_t *fd)
{
    /* The pid goes out even without a page: a same-host peer follows the process through it
     * (proc.h) whether or not the death watch runs. */
    *pid = (uint32_t)getpid();
    *fd = e->live && e->live->held ? e->live->memfd : -1;
}

void cx_live_hold(cx_engine_t *e)
{
    if (!e->live) return;
    int rc = pthread_mutex_lock(&e->live->page->mu);
    e->live->held = rc == 0;
    if (rc) cx_debug("same-host death watch: cannot take our mutex: %s", strerror(rc));
}

void cx_live_release(cx_engine_t *e)
{
    if (!e->live || !e->live->held) return;
    e->live->held = 0;
    pthread_mutex_unlock(&e->live->page->mu);
}

/* A death goes out from here, at once (why: cx_event_gate); the progress thread fails the peer's
 * ops and connections when it reaps the watch, and reaps before anything submitted later. */
static void death_reason(const cx_live_watch_t *w, char *why, size_t n)
{
    snprintf(why, n, "process %u exited (same-host watch)", w->pid);
}

static void report_death(cx_live_watch_t *w)
{
    cx_engine_t *e = w->e;
    char why[64];
    death_reason(w, why, sizeof why);
    cx_event_t ev;
    cx_event_fill(&ev, &w->lid, w->url, w->incarnation, CX_EVENT_FAILED, why);
    atomic_fetch_add(&e->live->dead, 1);
    pthread_mutex_lock(&e->evq.mu);
    int out = cx_event_gate(w->peer, CX_EVENT_FAILED, w->incarnation, 1);
    if (out) cx_evq_push_locked(&e->evq, &ev);
    pthread_mutex_unlock(&e->evq.mu);
    if (out) cx_warn("peer %s: failed: %s", w->url, why);
}

/* A short time slice for a thread that sleeps nearly always and must run at once when woken.
 * Linux 6.12+ (EEVDF) takes a SCHED_OTHER task's requested slice from sched_attr.sched_runtime
 * (0.1..100 ms, no privilege needed): an earlier virtual deadline, so its wake-up preempts a
 * busy thread instead of waiting for that one's slice to end at a tick (4 ms at HZ=250). Older
 * kernels ignore the field. Nice level kept. Measured (ucx_shm, a read in flight, 2 CPUs, 150
 * kills each): kill -> FAILED over 2 ms in 19 kills without it (p90 4.2 ms), 2 with it (p99
 * 3.8 ms, max 4.8). */
struct cx_sched_attr { /* the kernel's struct sched_attr, first version (48 bytes) */
    uint32_t size, sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
};

static void cx_thread_short_slice(void)
{
    struct cx_sched_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.sched_policy = SCHED_OTHER;
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, 0);
    if (nice == -1 && errno) return;
    a.sched_nice = nice;
    a.sched_runtime = 100000; /* ns */
#ifdef SYS_sched_setattr
    if (syscall(SYS_sched_setattr, 0, &a, 0))
        cx_debug("live: no short time slice for the watcher: %s", strerror(errno));
#endif
}

/* The watcher: sleeps on the owner's futex word until the owner dies (OWNER_DIED), lets go (the
 * word no longer names it) or we are told to stop. The kernel wakes only one waiter, and other
 * processes of this host may be watching the same word: each watcher passes the wake-up on. */
static void *watch_main(void *arg)
{
    cx_live_watch_t *w = arg;
    cx_thread_short_slice();
    uint32_t *word = futex_word(w->page);
    while (!atomic_load(&w->stop)) {
        uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        if (v & FUTEX_OWNER_DIED) {
            atomic_store(&w->died, 1);
            break;
        }
        if ((v & FUTEX_TID_MASK) != w->owner) break; /* released: a clean close */
        if (!(v & FUTEX_WAITERS)) {
            /* The owner wakes waiters (and the kernel, at its death, wakes one) only when this
             * bit says someone sleeps. */
            if (!__atomic_compare_exchange_n(word, &v, v | FUTEX_WAITERS, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                continue;
            v |= FUTEX_WAITERS;
        }
        /* Bounded, so a lost wake-up costs a second at most. */
        struct timespec ts = { 1, 0 };
        futex(word, FUTEX_WAIT, v, &ts);
    }
    futex(word, FUTEX_WAKE, INT_MAX, NULL);
    if (atomic_load(&w->died)) report_death(w);
    atomic_store(&w->done, 1);
    uint64_t one = 1;
    if (write(w->efd, &one, sizeof one) < 0) { /* the progress thread reaps at stop_all anyway */
    }
    return NULL;
}

/* Maps the page the peer advertised; NULL (and why, at debug level) when it is not the page of
 * that incarnation or cannot be opened. */
static live_page_t *map_peer_page(const cx_peer_t *p, uint32_t pid, int32_t fd, uint64_t inc)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%d", pid, fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0) {
        cx_debug("peer %s: no same-host death watch: %s: %s", p->url, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    live_page_t *pg = NULL;
    if (fstat(f, &st) == 0 && st.st_size >= LIVE_PAGE)
        pg = mmap(NULL, LIVE_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    close(f);
    if (!pg || pg == MAP_FAILED) {
        cx_debug("peer %s: no same-host death watch: %s is not a connex page", p->url, path);
        return NULL;
    }
    if (__atomic_load_n(&pg->magic, __ATOMIC_ACQUIRE) != LIVE_MAGIC || pg->version != LIVE_VERSION ||
        pg->incarnation != inc) {
        cx_debug("peer %s: no same-host death watch: %s belongs to another process", p->url, path);
        munmap(pg, LIVE_PAGE);
        return NULL;
    }
    return pg;
}

static void watch_free(cx_live_watch_t *w)
{
    munmap(w->page, LIVE_PAGE);
    free(w);
}

/* Stops a running watcher and joins it. */
static void watch_stop(cx_live_t *l, cx_live_watch_t *w)
{
    atomic_store(&w->stop, 1);
    futex(futex_word(w->page), FUTEX_WAKE, INT_MAX, NULL);
    pthread_join(w->th, NULL);
    if (atomic_load(&w->died)) atomic_fetch_sub(&l->dead, 1);
}

void cx_live_watch(cx_engine_t *e, cx_peer_t *p, uint32_t pid, int32_t fd, uint64_t inc)
{
    cx_live_t *l = e->live;
    if (!l || !pid || fd < 0) return;
    for (cx_live_watch_t **pp = &l->watches; *pp;) {
        cx_live_watch_t *w = *pp;
        if (w->peer != p) {
            pp = &w->next;
            continue;
        }
        if (w->incarnation == inc && !atomic_load(&w->done)) return; /* already followed */
        *pp = w->next; /* an older incarnation, or a finished watch: replaced */
        watch_stop(l, w);
        watch_free(w);
    }
    live_page_t *pg = map_peer_page(p, pid, fd, inc);
    if (!pg) return;
    uint32_t owner = __atomic_load_n(futex_word(pg), __ATOMIC_ACQUIRE);
    if ((owner & FUTEX_OWNER_DIED) || !(owner & FUTEX_TID_MASK)) {
        /* Dead or closing already: the connection's end reports it. */
        munmap(pg, LIVE_PAGE);
        return;
    }
    cx_live_watch_t *w = calloc(1, sizeof *w);
    if (!w) {
        munmap(pg, LIVE_PAGE);
        return;
    }
    w->peer = p;
    w->e = e;
    w->lid = p->lid;
    snprintf(w->url, sizeof w->url, "%s", p->url);
    w->incarnation = inc;
    w->pid = pid;
    w->page = pg;
    w->owner = owner & FUTEX_TID_MASK;
    w->efd = l->efd;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 64 * 1024);
    int rc = pthread_create(&w->th, &a, watch_main, w);
    pthread_attr_destroy(&a);
    if (rc) {
        cx_debug("peer %s: no same-host death watch: thread: %s", p->url, strerror(rc));
        watch_free(w);
        return;
    }
    w->next = l->watches;
    l->watches = w;
    cx_debug("peer %s: same-host death watch on pid %u", p->url, pid);
}

int cx_live_is_watch(const cx_engine_t *e, const void *w)
{
    return e->live && w == (const void *)&e->live->w;
}

void cx_live_reap(cx_engine_t *e)
{
    cx_live_t *l = e->live;
    if (!l) return;
    uint64_t v;
    if (read(l->efd, &v, sizeof v) < 0 && errno != EAGAIN) cx_error("live eventfd read: %s", strerror(errno));
    for (cx_live_watch_t **pp = &l->watches; *pp;) {
        cx_live_watch_t *w = *pp;
        /* One that saw its process die is at most a queue push from its end: joined now, so a
         * command that follows its FAILED finds the peer failed. */
        if (!atomic_load(&w->done) && !atomic_load(&w->died)) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        pthread_join(w->th, NULL);
        cx_peer_t *p = w->peer;
        if (atomic_load(&w->died)) atomic_fetch_sub(&l->dead, 1);
        if (atomic_load(&w->died) && p->incarnation == w->incarnation &&
            (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT)) {
            char why[64];
            death_reason(w, why, sizeof why);
            cx_peer_fail(e, p, why);
            /* Peers on other hosts would hear of it only once the kernel has unmapped it. */
            cx_peer_report_death(e, p);
        }
        watch_free(w);
    }
}

void cx_live_reap_pending(cx_engine_t *e)
{
    if (cx_live_death_pending(e)) cx_live_reap(e);
}

int cx_live_death_pending(const cx_engine_t *e)
{
    return e->live && atomic_load(&e->live->dead) > 0;
}

int cx_live_watching(cx_engine_t *e, const cx_peer_t *p)
{
    if (!e->live) return 0;
    for (cx_live_watch_t *w = e->live->watches; w; w = w->next)
        if (w->peer == p && w->incarnation == p->incarnation && !atomic_load(&w->done)) return 1;
    return 0;
}

void cx_live_stop_all(cx_engine_t *e)
{
    cx_live_t *l = e->live;
    if (!l) return;
    while (l->watches) {
        cx_live_watch_t *w = l->watches;
        l->watches = w->next;
        watch_stop(l, w);
        watch_free(w);
    }
}

void cx_live_close(cx_engine_t *e)
{
    cx_live_t *l = e->live;
    if (!l) return;
    cx_live_stop_all(e);
    if (l->page) {
        pthread_mutex_destroy(&l->page->mu);
        munmap(l->page, LIVE_PAGE);
    }
    close(l->memfd);
    close(l->efd);
    free(l);
    e->live = NULL;
}
