/* shm (libfabric 1.17): a new endpoint, so a new region, when a stopped process holds ours.
 *
 * Every peer queues its commands to us in one region under one spinlock. A peer stopped inside
 * that critical section (SIGSTOP, a debugger, a frozen cgroup) keeps the lock until it is
 * continued: we cannot read our CQ (the provider would spin on the lock), and no other peer
 * can post to us, for as long as it stays stopped, even after the heartbeat declared it failed
 * (conformance_hol caught it, backends/libfabric/README.md). Taking the lock from it is not
 * safe: continued, it would finish writing into a queue we read.
 *
 * So once our lock has been held CONNEX_FI_SHM_ROTATE_MS (200 ms) while a peer process is stopped (or ten
 * times that, whoever holds it: a live holder preempted that long is as good as stopped), we
 * open a second endpoint on the same
 * CQ and address vector (a fresh region under a new name, "-<generation>" appended), close the
 * old one (measured: the provider unmaps and unlinks its region without touching the lock),
 * and tell every peer the new address with a message (ADDR) sent from the new endpoint. A peer
 * moves its address-vector entry, and its queued ops post there. The stopped process, once
 * continued, finishes its post into the old region, which only it still maps, and moves too.
 *
 * What is lost: what the old region held unread when the lock was taken (a message or an ack a
 * peer had queued an instant before). Its sender times out, as it would have while we could not
 * read. In direct mode nothing of ours waits in the old endpoint: the provider completes every
 * RMA and every send inside the post, so its completions are in the CQ already. Without direct
 * mode (FI_HMEM, no CMA) ops wait on the peer's answer in our region, and there is no rotation.
 */
#include "fi_int.h"
#include "connex/options.h"

#include "connex/log.h"
#include "connex/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* CONNEX_FI_SHM_ROTATE_MS defaults to 200 (core/src/options.c): a live holder keeps the lock for
 * microseconds. */
#define CX_FI_ROT_ANY 10              /* rot_any_ns = this x rot_ns */
#define CX_FI_ROT_LOOK_NS 50000000ull /* peers' process states looked at every 50 ms */
#define CX_FI_ROT_RETRY_NS 1000000000ull

void cx_fi_rot_init(cx_backend_t *b)
{
    b->rot_ns = 0;
    if (strcmp(b->prov, "shm") || !b->self_lockw)
        return; /* the guard (fi_guard.c) tells us the lock is held: without it, never */
    long ms = (long)cx_opts_num(b->opts, "CONNEX_FI_SHM_ROTATE_MS", NULL); /* 0..600000, default 200 */
    if (ms && (!b->shm_direct || (b->mr_mode & FI_MR_ENDPOINT))) {
        cx_info("libfabric: shm: no new region when ours is held (%s)",
                !b->shm_direct ? "direct mode off: ops wait in our region" : "FI_MR_ENDPOINT");
        return;
    }
    b->rot_ns = (uint64_t)ms * 1000000ull;
    b->rot_any_ns = CX_FI_ROT_ANY * b->rot_ns;
}

int cx_fi_rot_due(cx_backend_t *b, uint64_t now)
{
    uint64_t held = now - b->wedged_ns;
    if (held >= b->rot_any_ns) return 1;
    if (held < b->rot_ns || now < b->rot_look_ns) return 0;
    /* Only a process that maps our region can hold its lock: one of our shm peers, nearly
     * always. A stopped one is the holder we are waiting for; a preempted live one lets go
     * soon, and losing what the old region holds would cost its senders an op timeout. The
     * core's same-host watch knows the process (stopped by a signal or a tracer). */
    b->rot_look_ns = now + CX_FI_ROT_LOOK_NS;
    for (cx_bep_t *ep = b->eps; ep; ep = ep->next)
        if (ep->pid && cx_core_peer_process(b->core, ep->peer) == CX_PROC_STOPPED) return 1;
    return 0;
}

int cx_fi_rotate(cx_backend_t *b)
{
    uint64_t t0 = cx_fi_now_ns();
    if (t0 < b->rot_next_ns) return -1;
    uint32_t gen = b->rot_gen + 1;
    size_t nfd0;
    int *fd0 = cx_fi_fd_list(&nfd0);
    cx_fi_epn_t n;
    int r = cx_fi_ep_open(b, gen, &n);
    cx_fi_fd_cloexec_new(fd0, nfd0);
    free(fd0);
    const int *lw = r ? NULL : n.shm[0] ? cx_fi_guard_self(b, n.shm) : NULL;
    if (!lw) {
        if (!r) fi_close(&n.ep->fid);
        b->rot_next_ns = t0 + CX_FI_ROT_RETRY_NS;
        cx_warn("libfabric: shm: our region's spinlock is held, and a new endpoint could not be "
                "made (%s): ops wait for the holder; retried in 1 s",
                r ? cx_fi_strerror(-r) : "its region is not one the guard knows");
        return -1;
    }
    struct fid_ep *old = b->ep;
    char old_name[64];
    memcpy(old_name, b->shm_self, sizeof old_name);
    b->ep = n.ep;
    b->rot_gen = gen;
    memcpy(b->shm_self, n.shm, sizeof b->shm_self);
    memcpy(b->addr, n.addr, n.addr_len);
    b->addr_len = n.addr_len;
    b->self_lockw = lw;
    uint64_t held_ms = (t0 - b->wedged_ns) / 1000000u;
    b->wedged_ns = 0;
    b->wedge_logged = 0;
    /* The old endpoint's receives come back cancelled, or not at all: fi_cq.c posts them on the
     * new one, and cx_fi_rot_leftovers whatever the first full drain did not return. */
    fi_close(&old->fid);
    b->rot_sweep = 1;
    int told = 0;
    for (cx_bep_t *ep = b->eps; ep; ep = ep->next, told++) cx_fi_rot_tell(b, ep);
    cx_warn("libfabric: shm: our region's spinlock was held for %llu ms by another process (one "
            "stopped inside the provider?): moved to a new region, %s (generation %u), %d "
            "peer(s) told, in %.1f ms; what %s held unread is lost, its senders time out; see "
            "backends/libfabric/README.md, \"A new region when one is held\"",
            (unsigned long long)held_ms, n.shm, gen, told, (double)(cx_fi_now_ns() - t0) / 1e6, old_name);
    return 0;
}

void cx_fi_rot_leftovers(cx_backend_t *b)
{
    b->rot_sweep = 0;
    for (int i = 0; i < CX_FI_NRX; i++) {
        cx_fi_rx_t *rx = &b->rx[i];
        if (rx->posted && rx->gen != b->rot_gen) { /* dropped with the endpoint, no entry */
            rx->posted = 0;
            cx_fi_rx_post(b, rx);
        }
    }
    /* An op of ours still waiting on the closed endpoint will never complete (none should: in
     * direct mode every op completes inside its post). */
    for (cx_fi_op_t *op = b->all, *next; op; op = next) {
        next = op->anext;
        if (!op->posted || op->gen == b->rot_gen) continue;
        cx_warn("libfabric: shm: op kind %d was still posted on the endpoint a rotation closed: "
                "failed",
                op->kind);
        op->gen = b->rot_gen;
        cx_fi_op_done(b, op, CX_EPEER);
        next = b->all; /* the walk may have freed or added ops: start over (bounded: each
                            op is done once) */
    }
}

void cx_fi_rot_tell(cx_backend_t *b, cx_bep_t *ep)
{
    cx_fi_op_t *op = cx_fi_op_new(b, CX_FOP_ACK, NULL, ep);
    if (!op) {
        cx_error("libfabric: shm: out of memory telling a peer our new region: its ops to us "
                 "time out");
        return;
    }
    op->mtype = CX_FM_ADDR;
    int r = cx_fi_start(b, op);
    if (r) {
        cx_warn("libfabric: shm: telling a peer our new region: %s", cx_fi_strerror(-r));
        cx_fi_op_free(b, op);
    }
}

/* The newest name a peer told us, by its process and incarnation. */
static cx_fi_moved_t *cx_fi_moved_find(cx_backend_t *b, uint32_t pid, uint64_t inc)
{
    for (int i = 0; i < CX_FI_MOVED; i++)
        if (b->moved[i].pid == pid && b->moved[i].inc == inc) return &b->moved[i];
    return NULL;
}

static void cx_fi_moved_keep(cx_backend_t *b, uint32_t pid, uint64_t inc, uint32_t gen, const char *name)
{
    cx_fi_moved_t *m = cx_fi_moved_find(b, pid, inc);
    if (m && m->gen >= gen) return;
    if (!m) {
        m = &b->moved[0];
        for (int i = 1; i < CX_FI_MOVED; i++)
            if (b->moved[i].at_ns < m->at_ns) m = &b->moved[i];
    }
    m->pid = pid;
    m->inc = inc;
    m->gen = gen;
    m->at_ns = cx_fi_now_ns();
    snprintf(m->name, sizeof m->name, "%s", name);
}

const char *cx_fi_rot_newest(cx_backend_t *b, const char *name, uint32_t *gen)
{
    uint32_t pid;
    uint64_t inc;
    *gen = 0;
    if (cx_fi_shm_parse(name, &pid, &inc, gen)) return name;
    cx_fi_moved_t *m = cx_fi_moved_find(b, pid, inc);
    if (!m || m->gen <= *gen) return name;
    *gen = m->gen;
    return m->name;
}

/* The peer's endpoint is `name` (generation gen) from now on. */
static void cx_fi_rot_move(cx_backend_t *b, cx_bep_t *ep, const char *name, uint32_t gen)
{
    if (gen <= ep->peer_gen) return; /* late, or told twice */
    fi_addr_t fa;
    int n = fi_av_insert(b->av, name, 1, &fa, 0, NULL);
    if (n != 1) {
        cx_warn("libfabric: shm: a peer's new region %s: fi_av_insert failed (%d); its ops "
                "time out",
                name, n);
        return;
    }
    cx_fi_av_later_cancel(b, fa);
    cx_fi_av_remove_later(b, ep->fa); /* its old region: what it queued there drains first */
    ep->fa = fa;
    ep->peer_gen = gen;
    cx_fi_guard_del(b, ep);
    ep->lockw = ep->pid ? cx_fi_guard_add(b, ep, cx_core_peer_exit_fd(b->core, ep->peer), name) : NULL;
    cx_fi_shm_remember(ep, name, strlen(name) + 1);
    if (ep->nq) cx_fi_kick(b); /* its queued ops post to the new region */
    cx_info("libfabric: shm: peer process %u moved to region %s (generation %u)", ep->pid, name, gen);
}

void cx_fi_rot_on_addr(cx_backend_t *b, uint64_t inc, uint64_t gen, const uint8_t *body, size_t len)
{
    cx_fi_addr_t a;
    char name[64];
    uint32_t pid = 0, ngen = 0;
    uint64_t ninc = 0;
    int bad = cx_fi_addr_get(body, len, &a) || strcmp(a.prov, b->prov) || a.fmt != b->info->addr_format ||
        a.name_len >= sizeof name || memchr(a.name, 0, a.name_len) != (const void *)(a.name + a.name_len - 1);
    if (!bad) {
        memcpy(name, a.name, a.name_len);
        /* Only a connex name, of the process and engine that sent it, at the generation the
         * header says: nothing else may redirect what we post to that peer. */
        bad = cx_fi_shm_parse(name, &pid, &ninc, &ngen) || ninc != inc || pid != a.pid || !ngen || ngen != gen;
    }
    if (bad) {
        cx_warn("libfabric: malformed address update (%zu bytes) from incarnation %016llx "
                "dropped",
                len, (unsigned long long)inc);
        return;
    }
    cx_fi_moved_keep(b, pid, inc, ngen, name);
    void *peer = cx_core_peer_by_incarnation(b->core, inc);
    cx_bep_t *ep = peer ? cx_fi_ep_by_peer(b, peer) : NULL;
    if (ep && ep->pid == pid) cx_fi_rot_move(b, ep, name, ngen);
}
