/* shm provider (libfabric 1.17): spinlocks that a killed process left held.
 *
 * The provider guards each endpoint's 16 MiB shared region with a pthread spinlock inside the
 * region itself. A sender takes the target's lock to queue a command, an endpoint takes its
 * own to progress. A process SIGKILLed inside either critical section leaves the lock held for
 * ever, and the next thread to take it spins for ever: our progress thread, with every op,
 * heartbeat and failure report of the engine behind it (conformance_failure's
 * test_killed_mid_send hung in 1-2 runs of 10 kills: a peer killed while sending to us held
 * our own region's lock; another run spun in fi_read on the dead peer's lock).
 *
 * Nothing inside the provider can tell a dead holder from a slow one, so this file does it from
 * outside, with what only we know: which processes have exited. A guard thread waits on an
 * exit fd per shm peer (the core's, cx_core_peer_exit_fd: its same-host watch follows the
 * peer's process); once a peer has exited, it looks at two locks, the dead peer's region's
 * and our own, and releases one that stays held through CX_FI_GUARD_HELD_MS of samples (a live
 * holder keeps it for microseconds; a dead one never lets go).
 *
 * The lock is found, not assumed: at open the guard maps the head of our own region, finds the
 * field that holds the region's address in our process (the provider's base_addr, which the
 * spinlock follows) and checks our pid beside it. A layout it does not recognise turns the
 * guard off with a log line. Each peer's region head is mapped by the guard itself (4 KiB),
 * so it stays valid whatever the provider unmaps; the lock is taken and released with the
 * values glibc's own pthread_spin_* use (learned from a spinlock of ours at start). */
#include "fi_int.h"
#include "connex/options.h"

#include "connex/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CX_FI_GUARD_HEAD 4096u  /* bytes of a region's head the guard maps */
#define CX_FI_GUARD_HELD_MS 50  /* held in every 1 ms sample this long: released */
#define CX_FI_GUARD_LOOK_MS 200 /* a lock still busy but seen free is left after this */

/* A peer's slot lives from connect until the peer has exited and its locks were looked at, or,
 * once the endpoint is dropped, for CX_FI_GUARD_KEEP_NS: the core drops a peer as soon as its
 * death begins, before it has exited, and a stopped or cut-off peer may never exit. */
#define CX_FI_GUARD_KEEP_NS 30000000000ull

typedef struct cx_fi_gpeer {
    uint64_t tok;           /* epoll data: slots move in the array */
    const void *id;         /* the backend's endpoint, NULL once dropped */
    uint64_t keep_until_ns; /* dropped: freed then at the latest */
    int exited;             /* looked at after its exit: freed when dropped */
    int exit_fd;            /* the core's: readable once the peer's process has exited */
    uint8_t *head;          /* our own mapping of the peer region's head */
    char name[64];
} cx_fi_gpeer_t;

struct cx_fi_guard {
    pthread_t th;
    int epfd, stopfd;
    pthread_mutex_t mu; /* peers: the progress thread adds and drops, the guard looks */
    cx_fi_gpeer_t *peers;
    int npeers, cap;
    uint64_t next_tok;
    uint8_t *self; /* our own region's head */
    char self_name[64];
    size_t lock_off;
    int unlocked, locked; /* glibc's values of a free and a held spinlock */
    uint8_t version;      /* the region layout's version byte (offset 0) */
    uint64_t released;
};

/* A trylock with glibc's own values: 1 if the lock was free (and is free again). */
static int cx_fi_guard_free(struct cx_fi_guard *g, uint8_t *head)
{
    return cx_fi_lock_try((int *)(void *)(head + g->lock_off), g->unlocked, g->locked);
}

/* A live holder keeps a region's lock for a command's worth of copying (a microsecond or two);
 * this waits out about 20 us of it, then the caller goes round the engine's loop instead. */
#define CX_FI_LOCK_SPINS 512

static inline void cx_fi_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

int cx_fi_lock_wait(const cx_backend_t *b, const int *lockw)
{
    for (int i = 0; i < CX_FI_LOCK_SPINS; i++) {
        cx_fi_cpu_relax();
        if (__atomic_load_n(lockw, __ATOMIC_RELAXED) == b->lock_free) return 0;
    }
    return 1;
}

static uint8_t *cx_fi_guard_map(const char *name)
{
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return NULL;
    void *p = mmap(NULL, CX_FI_GUARD_HEAD, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* Where libfabric mapped region `name` in this process, 0 if nowhere. */
static uintptr_t cx_fi_guard_mapped_at(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f) return 0;
    char line[512], want[80];
    snprintf(want, sizeof want, "/dev/shm/%s", name);
    uintptr_t at = 0;
    while (!at && fgets(line, sizeof line, f)) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        size_t n = strlen(line), w = strlen(want);
        unsigned long long lo;
        if (n > w && !strcmp(line + n - w, want) && line[n - w - 1] == ' ' && sscanf(line, "%llx-", &lo) == 1)
            at = (uintptr_t)lo;
    }
    fclose(f);
    return at;
}

/* The lock's offset in our own region's head: the 8-byte field equal to the region's address
 * here (base_addr), the int after it is the spinlock; our pid must sit before it. */
static int cx_fi_guard_layout(struct cx_fi_guard *g)
{
    uintptr_t at = cx_fi_guard_mapped_at(g->self_name);
    if (!at) return -1;
    for (size_t k = 8; k + 8 + sizeof(int) <= 256; k += 8) {
        uint64_t v;
        memcpy(&v, g->self + k, sizeof v);
        if (v != (uint64_t)at) continue;
        int pid_seen = 0;
        for (size_t o = 0; o + sizeof(int) <= k; o += sizeof(int)) {
            int p;
            memcpy(&p, g->self + o, sizeof p);
            pid_seen |= p == (int)getpid();
        }
        if (!pid_seen) return -1;
        g->lock_off = k + 8;
        g->version = g->self[0];
        /* Free now (nobody talks to us yet): a value that is neither free nor held is not a
         * glibc spinlock, and the guard stays off. */
        for (int i = 0; i < 100; i++) {
            if (cx_fi_guard_free(g, g->self)) return 0;
            usleep(100);
        }
        return -1;
    }
    return -1;
}

static cx_fi_gpeer_t *cx_fi_guard_slot(struct cx_fi_guard *g, uint64_t tok)
{
    for (int i = 0; i < g->npeers; i++)
        if (g->peers[i].tok == tok) return &g->peers[i];
    return NULL;
}

/* With mu held. */
static void cx_fi_guard_free_slot(struct cx_fi_guard *g, cx_fi_gpeer_t *p)
{
    epoll_ctl(g->epfd, EPOLL_CTL_DEL, p->exit_fd, NULL);
    close(p->exit_fd);
    munmap(p->head, CX_FI_GUARD_HEAD);
    *p = g->peers[--g->npeers];
}

static void cx_fi_guard_expire(struct cx_fi_guard *g)
{
    uint64_t now = cx_fi_now_ns();
    for (int i = 0; i < g->npeers;) {
        if (!g->peers[i].id && now >= g->peers[i].keep_until_ns)
            cx_fi_guard_free_slot(g, &g->peers[i]);
        else
            i++;
    }
}

static void cx_fi_guard_release(struct cx_fi_guard *g, uint8_t *head, const char *what, const char *dead)
{
    __atomic_store_n((int *)(void *)(head + g->lock_off), g->unlocked, __ATOMIC_RELEASE);
    g->released++;
    cx_warn("libfabric: shm: released the spinlock of %s, held since %s was killed (%d ms "
            "of samples); see backends/libfabric/README.md, \"Spinlocks of killed processes\"",
            what, dead, CX_FI_GUARD_HELD_MS);
}

/* A peer has exited: its region's lock and ours, sampled every ms. The slot is looked up at
 * every sample: it stays until this is done, but it moves in the array. */
static void cx_fi_guard_dead(struct cx_fi_guard *g, uint64_t tok, const char *name)
{
    int held_peer = 0, held_self = 0, done_peer = 0, done_self = 0;
    for (int ms = 0; ms < CX_FI_GUARD_LOOK_MS && !(done_peer && done_self); ms++) {
        pthread_mutex_lock(&g->mu);
        cx_fi_gpeer_t *p = cx_fi_guard_slot(g, tok);
        if (!p || p->head[0] != g->version) done_peer = 1;
        if (!done_peer) {
            held_peer = cx_fi_guard_free(g, p->head) ? 0 : held_peer + 1;
            done_peer = !held_peer;
            if (held_peer >= CX_FI_GUARD_HELD_MS) {
                cx_fi_guard_release(g, p->head, p->name, name);
                done_peer = 1;
            }
        }
        if (!done_self) {
            held_self = cx_fi_guard_free(g, g->self) ? 0 : held_self + 1;
            done_self = !held_self;
            if (held_self >= CX_FI_GUARD_HELD_MS) {
                cx_fi_guard_release(g, g->self, "our own region", name);
                done_self = 1;
            }
        }
        pthread_mutex_unlock(&g->mu);
        if (!(done_peer && done_self)) {
            struct timespec ts = { 0, 1000000 };
            nanosleep(&ts, NULL);
        }
    }
}

static void *cx_fi_guard_main(void *arg)
{
    struct cx_fi_guard *g = arg;
    for (;;) {
        struct epoll_event ev[8];
        int n = epoll_wait(g->epfd, ev, 8, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return NULL;
        for (int i = 0; i < n; i++) {
            uint64_t tok = ev[i].data.u64;
            if (!tok) return NULL; /* the stop eventfd */
            char name[64] = "a peer";
            pthread_mutex_lock(&g->mu);
            cx_fi_gpeer_t *p = cx_fi_guard_slot(g, tok);
            if (p) {
                epoll_ctl(g->epfd, EPOLL_CTL_DEL, p->exit_fd, NULL); /* exited once is exited */
                snprintf(name, sizeof name, "%s", p->name);
            }
            pthread_mutex_unlock(&g->mu);
            if (!p) continue;
            cx_fi_guard_dead(g, tok, name);
            pthread_mutex_lock(&g->mu);
            if ((p = cx_fi_guard_slot(g, tok))) {
                if (p->id)
                    p->exited = 1;
                else
                    cx_fi_guard_free_slot(g, p);
            }
            pthread_mutex_unlock(&g->mu);
        }
    }
}

void cx_fi_guard_start(cx_backend_t *b, const char *self_name)
{
    if (strcmp(b->prov, "shm") || !self_name) return;
    if (!cx_opts_num(b->opts, "CONNEX_FI_SHM_GUARD", NULL)) return;
    struct cx_fi_guard *g = calloc(1, sizeof *g);
    if (!g) return;
    g->epfd = g->stopfd = -1;
    snprintf(g->self_name, sizeof g->self_name, "%s", self_name);
    pthread_spinlock_t probe;
    pthread_spin_init(&probe, PTHREAD_PROCESS_SHARED);
    g->unlocked = (int)probe;
    pthread_spin_lock(&probe);
    g->locked = (int)probe;
    pthread_spin_unlock(&probe);
    pthread_spin_destroy(&probe);
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 0 };
    if (sizeof(pthread_spinlock_t) != sizeof(int) || g->unlocked == g->locked ||
        !(g->self = cx_fi_guard_map(self_name)) || cx_fi_guard_layout(g) ||
        (g->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 || (g->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->stopfd, &ev)) {
        cx_info("libfabric: shm: region layout not recognised: a spinlock left held by a "
                "killed peer is not released (the guard is off)");
        goto fail;
    }
    pthread_mutex_init(&g->mu, NULL);
    if (pthread_create(&g->th, NULL, cx_fi_guard_main, g)) {
        pthread_mutex_destroy(&g->mu);
        goto fail;
    }
    cx_debug("libfabric: shm: spinlock guard on (lock at offset %zu, layout version %u)", g->lock_off, g->version);
    b->guard = g;
    b->self_lockw = (const int *)(const void *)(g->self + g->lock_off);
    b->lock_free = g->unlocked;
    b->lock_held = g->locked;
    return;
fail:
    if (g->self) munmap(g->self, CX_FI_GUARD_HEAD);
    if (g->epfd >= 0) close(g->epfd);
    if (g->stopfd >= 0) close(g->stopfd);
    free(g);
}

const int *cx_fi_guard_self(cx_backend_t *b, const char *name)
{
    struct cx_fi_guard *g = b->guard;
    if (!g) return NULL;
    uint8_t *head = cx_fi_guard_map(name);
    if (!head) return NULL;
    if (head[0] != g->version) { /* the same library wrote it: a layout of its own */
        munmap(head, CX_FI_GUARD_HEAD);
        return NULL;
    }
    pthread_mutex_lock(&g->mu);
    uint8_t *old = g->self;
    g->self = head;
    snprintf(g->self_name, sizeof g->self_name, "%s", name);
    pthread_mutex_unlock(&g->mu);
    munmap(old, CX_FI_GUARD_HEAD);
    return (const int *)(const void *)(head + g->lock_off);
}

const int *cx_fi_guard_add(cx_backend_t *b, const void *id, int exit_fd, const char *name)
{
    struct cx_fi_guard *g = b->guard;
    if (!g) {
        if (exit_fd >= 0) close(exit_fd);
        return NULL;
    }
    cx_fi_gpeer_t p = { .id = id, .exit_fd = exit_fd };
    snprintf(p.name, sizeof p.name, "%s", name);
    p.head = cx_fi_guard_map(name);
    pthread_mutex_lock(&g->mu);
    cx_fi_guard_expire(g);
    p.tok = ++g->next_tok;
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = p.tok };
    if (g->npeers == g->cap) {
        int cap = g->cap ? 2 * g->cap : 8;
        cx_fi_gpeer_t *np = realloc(g->peers, (size_t)cap * sizeof *np);
        if (np) {
            g->peers = np;
            g->cap = cap;
        }
    }
    int ok = g->npeers < g->cap && p.exit_fd >= 0 && p.head && !epoll_ctl(g->epfd, EPOLL_CTL_ADD, p.exit_fd, &ev);
    if (ok) g->peers[g->npeers++] = p;
    pthread_mutex_unlock(&g->mu);
    if (!ok) {
        cx_info("libfabric: shm: no spinlock guard for %s (%s)", name,
                p.exit_fd < 0 ? "the core does not follow its process"
                    : !p.head ? "region not mapped"
                              : "no room");
        if (p.exit_fd >= 0) close(p.exit_fd);
        if (p.head) munmap(p.head, CX_FI_GUARD_HEAD);
        return NULL;
    }
    /* The mapping lives as long as the slot, and the slot at least as long as the endpoint
     * (cx_fi_guard_del). A layout of another version is not ours to read. */
    return p.head[0] == g->version ? (const int *)(const void *)(p.head + g->lock_off) : NULL;
}

void cx_fi_guard_del(cx_backend_t *b, const void *id)
{
    struct cx_fi_guard *g = b->guard;
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->npeers; i++) {
        cx_fi_gpeer_t *p = &g->peers[i];
        if (p->id != id) continue;
        if (p->exited) {
            cx_fi_guard_free_slot(g, p);
        } else {
            p->id = NULL; /* watched until it exits, or for CX_FI_GUARD_KEEP_NS */
            p->keep_until_ns = cx_fi_now_ns() + CX_FI_GUARD_KEEP_NS;
        }
        break;
    }
    cx_fi_guard_expire(g);
    pthread_mutex_unlock(&g->mu);
}

void cx_fi_guard_stop(cx_backend_t *b)
{
    struct cx_fi_guard *g = b->guard;
    if (!g) return;
    uint64_t one = 1;
    if (write(g->stopfd, &one, sizeof one) != (ssize_t)sizeof one)
        cx_warn("libfabric: shm: guard stop: %s", strerror(errno));
    pthread_join(g->th, NULL);
    b->self_lockw = NULL; /* the mappings go now */
    for (cx_bep_t *ep = b->eps; ep; ep = ep->next) ep->lockw = NULL;
    for (int i = 0; i < g->npeers; i++) {
        close(g->peers[i].exit_fd);
        munmap(g->peers[i].head, CX_FI_GUARD_HEAD);
    }
    if (g->released) cx_info("libfabric: shm: the guard released %" PRIu64 " spinlock(s) of killed peers", g->released);
    free(g->peers);
    munmap(g->self, CX_FI_GUARD_HEAD);
    close(g->epfd);
    close(g->stopfd);
    pthread_mutex_destroy(&g->mu);
    free(g);
    b->guard = NULL;
}
