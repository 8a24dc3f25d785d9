/* Worker rotation: how the backend frees endpoints UCX keeps until the worker is destroyed.
 *
 * UCX 1.13 destroys an endpoint that has a remote connection only with its worker
 * (ucp_ep_disconnected), and cannot force-close one without peer error handling (shm-only
 * UCX_TLS): every dead peer incarnation would leave its endpoints (and their /dev/shm mappings)
 * behind for the engine's life. So the backend counts such "zombie" endpoints per worker, and
 * when the current worker holds CONNEX_UCX_ROTATE_ZOMBIES of them it rotates:
 *
 *   1. a new worker (same context and parameters, its event fd in our epoll set) becomes current:
 *      connect() creates endpoints there and address() returns its address (the core asks for
 *      it at every HELLO);
 *   2. every live endpoint gets a new ucp_ep from the new worker to the peer (new xfers use it)
 *      and sends the peer an address update (AM 13, ucx_wire.h) over the old one; the old
 *      ucp_ep is flush-closed once the xfers posted on it are done (messages posted after the
 *      rotation wait for those of the old one: order);
 *   3. the peer, on the update, does the same towards our new worker: a new ucp_ep to the new
 *      address, its old one closed once drained;
 *   4. the old worker is still progressed (peers may still reach it for a moment) until every
 *      ucp_ep of ours on it is closed and the grace period (CONNEX_UCX_ROTATE_GRACE_MS) passed;
 *      then ucp_worker_destroy frees its zombies. At most CX_UCX_MAX_OLD_WORKERS retired
 *      workers at once, and no more than one rotation per grace period.
 *
 * A second reason to rotate: a peer reached without error handling (UCX 1.13: over the posix or
 * sysv FIFO) was dropped. A sender claims a slot of our receive FIFO (a compare-and-swap of its
 * head), fills it, then flips the slot's owner bit; we read the slots in order. A sender killed
 * between the two leaves a slot that is never filled, and every message behind it, from every
 * peer, waits for good: the restarted peer's wireup reply among them, so its first op times
 * out. Seen in `connex-bench failover --backend ucx_shm` (one kill in 5-15 while it sends read
 * replies) and read off the FIFO of the stuck process (slot 50 of 64 still owned by the
 * previous lap, five wireup messages of later peers queued behind it). UCX has no way to skip
 * it, and we cannot tell a hole from a slow writer, so a dropped FIFO writer rotates the worker
 * at once: the new worker's FIFO is clean, and peers follow it (step 3).
 *
 * A peer may connect with an address older than our last rotation (a HELLO sent just before
 * it). The rule: once our worker has rotated, every connect sends an update with our current
 * worker, whatever the HELLO said (before the first rotation our address never changed); a receiver whose endpoint already reaches that worker ignores it (same address), and an
 * update that arrives before the receiver's own connect waits (up to CX_UCX_UPD_KEEP_MS) and is
 * taken by that connect. Updates carry the worker's generation, so a late one cannot move an
 * endpoint back to an older worker.
 */
#include "ucx_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#define CX_UCX_UPD_MAX 256 /* updates waiting for their endpoint, at most */

void cx_ucx_rot_init(cx_ucx_t *b)
{
    b->rotate_zombies = (int)cx_ucx_opt(b, "CONNEX_UCX_ROTATE_ZOMBIES");
    b->grace_ns = (uint64_t)cx_ucx_opt(b, "CONNEX_UCX_ROTATE_GRACE_MS") * 1000000ull;
    b->fault_wedge = cx_ucx_opt(b, "CONNEX_UCX_FAULT_WEDGE") != 0;
    if (b->fault_wedge)
        cx_warn("ucx: CONNEX_UCX_FAULT_WEDGE: a worker whose receive FIFO is in doubt will no longer be "
                "progressed (fault injection)");
}

/* A peer that could write into wk's receive FIFO is gone: a slot it claimed may never be filled.
 * CONNEX_UCX_FAULT_WEDGE makes that so for the tests: the worker is no longer progressed (out of
 * the epoll set too, or its pending events would wake the thread for nothing), as if everything
 * sent to it queued behind such a slot. */
void cx_ucx_wk_doubt(cx_ucx_t *b, cx_ucx_wk_t *wk)
{
    wk->rx_doubt = CX_UCX_DOUBT_GONE;
    if (!b->fault_wedge || wk->wedged) return;
    wk->wedged = 1;
    if (wk->efd >= 0 && epoll_ctl(b->epfd, EPOLL_CTL_DEL, wk->efd, NULL) != 0)
        cx_warn("ucx: epoll_ctl(DEL): %s", strerror(errno));
    wk->efd = -1; /* UCX's: closed with the worker */
    cx_warn("ucx: worker generation %u wedged (CONNEX_UCX_FAULT_WEDGE)", wk->gen);
}

/* Endpoints of dead peers count 1; ucp_eps retired because a live peer's worker rotated count
 * 1/4: each rotation leaves one of those at every live same-host peer, and counting them fully
 * would let N >= threshold + 1 such peers keep rotating each other (with the 1/4, 4 * threshold
 * + 1 of them); they are freed with the next rotation either way. */
static int cx_ucx_want_rotation(const cx_ucx_t *b)
{
    const cx_ucx_wk_t *wk = b->cur;
    return wk->rx_doubt ||
        (b->rotate_zombies && 4 * (wk->zombies - wk->retired) + wk->retired >= 4 * b->rotate_zombies);
}

/* How long a retired worker (and the ucp_eps retired on it) stays: the grace, shortened for a
 * worker whose FIFO is in doubt. A wedged FIFO delivers nothing however long we wait, and a kill
 * and rejoin every second would otherwise hold CX_UCX_MAX_OLD_WORKERS retired workers and delay
 * the next rotation while the restarted peer connects to the doubtful one. */
static uint64_t cx_ucx_grace(const cx_ucx_t *b, const cx_ucx_wk_t *wk)
{
    uint64_t d = (uint64_t)CX_UCX_DOUBT_GRACE_MS * 1000000ull;
    return wk->rx_doubt && d < b->grace_ns ? d : b->grace_ns;
}

static int cx_ucx_rotate(cx_ucx_t *b, uint64_t now);

static void cx_ucx_hung_del(cx_ucx_t *b, int i)
{
    free(b->hung[i].addr);
    b->hung[i] = b->hung[--b->n_hung];
}

static int cx_ucx_hung_find(const cx_ucx_t *b, const void *peer)
{
    for (int i = 0; i < b->n_hung; i++)
        if (b->hung[i].peer == peer) return i;
    return -1;
}

/* The current worker's FIFO is in doubt: a dead writer may have left a slot unfilled. */
static void cx_ucx_doubt_cur(cx_ucx_t *b, const char *why)
{
    if (!b->cur->rx_doubt)
        cx_debug("ucx: a peer reached over shared memory %s: the worker rotates (a slot of its "
                 "receive FIFO that peer claimed may not be filled)",
                 why);
    cx_ucx_wk_doubt(b, b->cur);
    cx_ucx_signal(b);
}

/* The core drops ep. If the peer could write into our receive FIFO from one of its ucp_eps (no
 * error handling: posix/sysv lanes), and it failed, left or restarted (CX_EPEER), it may have
 * died mid-send: that worker's FIFO is in doubt (see the top of this file), and the current
 * one rotates at once. One whose op timed out (CX_ETIMEDOUT) may be alive, or hung mid-send: it
 * is only remembered, since rotating at each timeout of a stopped peer (every reconnect, every
 * op) moved the live peers again and again, and a stopped peer woken after several rotations
 * made UCX 1.13 abort on a wireup reply (`remote_id == remote_ep_id`, conformance_hol,
 * once in about 12 runs). If it then fails, or comes back as another process, its worker is
 * in doubt after all (here, or cx_ucx_hung_connect). Engine close: nothing. */
void cx_ucx_rx_doubt(cx_ucx_t *b, const cx_bep_t *ep, int why)
{
    if (why != CX_EPEER && why != CX_ETIMEDOUT) return;
    int shm_cur = 0, h = cx_ucx_hung_find(b, ep->peer);
    for (cx_ucx_ue_t *ue = ep->ue; ue; ue = ue == ep->ue ? ep->old : ue->next) {
        if (ue->peer_mode) continue; /* tcp / RDMA lanes: no shared FIFO */
        if (why == CX_EPEER) cx_ucx_wk_doubt(b, ue->wk);
        shm_cur |= ue->wk == b->cur;
    }
    if (why == CX_EPEER) {
        if (h >= 0 && b->hung[h].gen == b->cur->gen) shm_cur = 1;
        if (h >= 0) cx_ucx_hung_del(b, h);
        if (shm_cur) cx_ucx_doubt_cur(b, "is gone");
        return;
    }
    if (!shm_cur) return;
    if (h < 0 && b->n_hung == CX_UCX_HUNG_MAX) cx_ucx_hung_del(b, 0); /* the oldest goes */
    if (h < 0)
        h = b->n_hung++;
    else
        free(b->hung[h].addr);
    cx_ucx_hung_t *r = &b->hung[h];
    r->peer = ep->peer;
    r->gen = b->cur->gen;
    r->len = 0;
    if ((r->addr = malloc(ep->paddr_len))) {
        memcpy(r->addr, ep->paddr, ep->paddr_len);
        r->len = ep->paddr_len;
    }
}

/* connect() to a peer remembered as timed out: another worker address means the process it
 * was is gone (restarted; or it rotated its worker, and a rotation too many costs only time).
 * Rotate now, so the new endpoint starts on a clean FIFO. */
void cx_ucx_hung_connect(cx_ucx_t *b, void *peer, const void *addr, size_t len)
{
    int h = cx_ucx_hung_find(b, peer);
    if (h < 0) return;
    cx_ucx_hung_t *r = &b->hung[h];
    int same = r->len == len && !memcmp(r->addr, addr, len);
    if (same && r->gen == b->cur->gen) return; /* the same process, back: still in doubt */
    int cur = r->gen == b->cur->gen;
    cx_ucx_hung_del(b, h);
    if (!cur) return;
    cx_ucx_doubt_cur(b, "that timed out is back as another process");
    if (b->n_old < CX_UCX_MAX_OLD_WORKERS) (void)cx_ucx_rotate(b, cx_ucx_now_ns());
}

void cx_ucx_hung_free(cx_ucx_t *b)
{
    while (b->n_hung) cx_ucx_hung_del(b, b->n_hung - 1);
}

void cx_ucx_zombie(cx_ucx_t *b, cx_ucx_wk_t *wk, int retired)
{
    wk->zombies++;
    wk->retired += retired != 0;
    if (wk == b->cur && cx_ucx_want_rotation(b)) cx_ucx_signal(b);
}

/* ---- control sends (acks, updates): their buffer lives until UCX is done with it ---- */

cx_ucx_ctl_t *cx_ucx_ctl_new(cx_ucx_t *b, cx_ucx_wk_t *wk, size_t len)
{
    cx_ucx_ctl_t *c = malloc(sizeof *c + len);
    if (!c) return NULL;
    c->wk = wk;
    c->buf = (uint8_t *)(c + 1);
    c->pin = NULL;
    c->refs = 1;
    c->prev = b->ctl.prev;
    c->next = &b->ctl;
    b->ctl.prev->next = c;
    b->ctl.prev = c;
    return c;
}

void cx_ucx_ctl_free(cx_ucx_ctl_t *c)
{
    c->prev->next = c->next;
    c->next->prev = c->prev;
    cx_core_region_unpin(c->pin);
    free(c);
}

void cx_ucx_ctl_unref(cx_ucx_ctl_t *c)
{
    if (--c->refs <= 0) cx_ucx_ctl_free(c);
}

void cx_ucx_ctl_send_cb(void *req, ucs_status_t st, void *user)
{
    (void)st;
    cx_ucx_lib.ucp_request_free(req);
    cx_ucx_ctl_unref(user);
}

/* ---- address updates ---- */

int cx_ucx_send_update(cx_ucx_t *b, cx_ucx_ue_t *ue)
{
    const uint8_t *wa;
    size_t n;
    if (cx_ucx_blob_get(b->cur->addr, b->cur->addr_len, CX_UCX_ADDR_MAGIC, &wa, &n)) return CX_ERR;
    size_t cap = 18 + n;
    cx_ucx_ctl_t *c = cx_ucx_ctl_new(b, ue->wk, cap);
    if (!c) return CX_ENOMEM;
    cx_wr_t w;
    cx_wr_init(&w, c->buf, cap);
    cx_ucx_upd_put(&w, &(cx_ucx_upd_hdr_t){ .inc = b->inc, .gen = b->cur->gen, .addr = wa, .addr_len = n });
    ucp_request_param_t p;
    cx_ucx_param(&p, c, cx_ucx_ctl_send_cb, NULL);
    ucs_status_ptr_t r = cx_ucx_lib.ucp_am_send_nbx(ue->ep, CX_UCX_AM_UPD, NULL, 0, c->buf, w.len, &p);
    if (UCS_PTR_IS_ERR(r)) {
        cx_warn("ucx: sending an address update failed: %s", cx_ucx_lib.ucs_status_string(UCS_PTR_STATUS(r)));
        cx_ucx_ctl_free(c);
        return CX_EPEER;
    }
    if (!r) cx_ucx_ctl_free(c);
    return CX_OK;
}

static void cx_ucx_upd_del(cx_ucx_t *b, cx_ucx_upd_t **pp)
{
    cx_ucx_upd_t *u = *pp;
    *pp = u->next;
    free(u->addr);
    free(u);
    (void)b;
}

/* Inside ucp_worker_progress: only record it (cx_ucx_upd_drain applies it). */
ucs_status_t cx_ucx_am_upd(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                           const ucp_am_recv_param_t *prm)
{
    (void)hdr;
    (void)hlen;
    cx_ucx_t *b = ((cx_ucx_wk_t *)arg)->b;
    if (prm->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        cx_error("ucx: dropped an address update sent by rendezvous (%zu bytes)", len);
        return UCS_OK;
    }
    cx_ucx_upd_hdr_t h;
    if (cx_ucx_upd_get(data, len, &h)) {
        cx_error("ucx: dropped a malformed address update (%zu bytes)", len);
        return UCS_OK;
    }
    int n = 0;
    for (cx_ucx_upd_t **pp = &b->upd; *pp;) {
        if ((*pp)->inc == h.inc && (*pp)->gen <= h.gen) { /* superseded */
            cx_ucx_upd_del(b, pp);
            continue;
        }
        if ((*pp)->inc == h.inc) return UCS_OK; /* a newer one is here already */
        n++;
        pp = &(*pp)->next;
    }
    if (n >= CX_UCX_UPD_MAX) {
        cx_warn("ucx: %d address updates wait for their endpoint: dropped one", n);
        return UCS_OK;
    }
    cx_ucx_upd_t *u = calloc(1, sizeof *u);
    if (!u || !(u->addr = malloc(h.addr_len))) {
        free(u);
        cx_error("ucx: out of memory holding an address update");
        return UCS_OK;
    }
    memcpy(u->addr, h.addr, h.addr_len);
    u->len = h.addr_len;
    u->inc = h.inc;
    u->gen = h.gen;
    u->deadline_ns = cx_ucx_now_ns() + (uint64_t)CX_UCX_UPD_KEEP_MS * 1000000ull;
    u->next = b->upd;
    b->upd = u;
    cx_ucx_signal(b);
    return UCS_OK;
}

/* The peer's worker is now u: follow it unless we are there already (or it is older). */
static void cx_ucx_upd_apply(cx_ucx_t *b, cx_bep_t *ep, const cx_ucx_upd_t *u)
{
    if (u->gen < ep->peer_gen) return;
    ep->peer_gen = u->gen;
    if (u->len == ep->paddr_len && !memcmp(u->addr, ep->paddr, u->len)) return;
    uint8_t *a = malloc(u->len);
    if (!a) {
        cx_error("ucx: out of memory following a peer's new worker");
        return;
    }
    memcpy(a, u->addr, u->len);
    free(ep->paddr);
    ep->paddr = a;
    ep->paddr_len = u->len;
    cx_debug("ucx: a peer's worker moved (generation %u): new endpoint", u->gen);
    (void)cx_ucx_retarget(b, ep);
}

void cx_ucx_upd_drain(cx_ucx_t *b)
{
    uint64_t now = 0;
    for (cx_ucx_upd_t **pp = &b->upd; *pp;) {
        cx_ucx_upd_t *u = *pp;
        void *peer = cx_core_peer_by_incarnation(b->core, u->inc);
        cx_bep_t *ep = peer ? cx_ucx_ep_of_peer(b, peer) : NULL;
        if (ep) {
            *pp = u->next; /* unlinked first: the retarget may send (never re-enters here) */
            cx_ucx_upd_apply(b, ep, u);
            free(u->addr);
            free(u);
            continue;
        }
        if (!now) now = cx_ucx_now_ns();
        if (now > u->deadline_ns) { /* no endpoint came for it (the peer went away) */
            cx_debug("ucx: dropped an address update of %016llx: no endpoint to it", (unsigned long long)u->inc);
            cx_ucx_upd_del(b, pp);
            continue;
        }
        pp = &u->next;
    }
}

void cx_ucx_upd_take(cx_ucx_t *b, void *peer, cx_bep_t *ep)
{
    for (cx_ucx_upd_t **pp = &b->upd; *pp;) {
        cx_ucx_upd_t *u = *pp;
        if (cx_core_peer_by_incarnation(b->core, u->inc) != peer) {
            pp = &u->next;
            continue;
        }
        if (u->gen >= ep->peer_gen) { /* newer than the HELLO's (or the same worker) */
            free(ep->paddr);
            ep->paddr = u->addr;
            ep->paddr_len = u->len;
            ep->peer_gen = u->gen;
            u->addr = NULL;
        }
        cx_ucx_upd_del(b, pp);
    }
}

void cx_ucx_upd_free(cx_ucx_t *b)
{
    while (b->upd) cx_ucx_upd_del(b, &b->upd);
}

/* ---- endpoints and workers ---- */

int cx_ucx_retarget(cx_ucx_t *b, cx_bep_t *ep)
{
    if (ep->failed) return CX_EPEER;
    int rc;
    cx_ucx_ue_t *ue = cx_ucx_ue_new(b, ep, ep->paddr, ep->paddr_len, &rc);
    if (!ue) {
        cx_warn("ucx: could not move an endpoint to the current worker (status %d); it stays", rc);
        return rc;
    }
    cx_ucx_ue_t *old = ep->ue;
    old->retired_ns = cx_ucx_now_ns();
    old->next = ep->old;
    ep->old = old;
    ep->ue = ue;
    ep->peer_mode = ue->peer_mode;
    b->retiring = 1;
    /* over the old one: it reaches the worker the peer sends to us from (or a newer one) */
    (void)cx_ucx_send_update(b, old);
    return CX_OK;
}

static int cx_ucx_rotate(cx_ucx_t *b, uint64_t now)
{
    b->last_rotate_ns = now;
    uint64_t t0 = cx_ucx_now_ns();
    cx_ucx_wk_t *nw = cx_ucx_wk_new(b, b->cur->gen + 1);
    if (!nw) {
        cx_warn("ucx: worker rotation failed (no new worker); retrying in %llu ms",
                (unsigned long long)(b->grace_ns / 1000000ull));
        return CX_ENOMEM;
    }
    uint64_t t_wk = cx_ucx_now_ns();
    cx_ucx_wk_t *old = b->cur;
    old->retired_ns = now;
    old->next = b->old;
    b->old = old;
    b->n_old++;
    b->cur = nw;
    b->rotations++;
    int moved = 0;
    for (cx_bep_t *ep = b->eps.next; ep != &b->eps; ep = ep->next)
        if (ep->ue && ep->ue->wk != nw && !ep->failed && cx_ucx_retarget(b, ep) == CX_OK) moved++;
    /* The cost, on the progress thread: the new worker and one ucp_ep per live peer. */
    cx_info("ucx: worker rotated (generation %u, %s) in %.2f ms (the new worker %.2f ms): %d live "
            "endpoints moved; the old worker's %d zombie endpoints are freed when it goes, after %llu ms",
            nw->gen, old->rx_doubt ? "a shared-memory peer is gone: its receive FIFO is in doubt" : "zombies",
            (double)(cx_ucx_now_ns() - t0) / 1e6, (double)(t_wk - t0) / 1e6, moved, old->zombies,
            (unsigned long long)(cx_ucx_grace(b, old) / 1000000ull));
    return CX_OK;
}

/* Retiring ucp_eps are closed once their xfers are done and the grace period passed; held
 * messages start when they may. Why the grace: UCX pairs our ucp_ep with the peer's between the
 * same two workers, and drops what arrives for a closed one (UCP_WORKER_GET_VALID_EP_BY_ID), so
 * closing ours at once would drop what the peer still sends on its end before it has our
 * update. Measured: without it, about one put_signal in a few thousand never arrived. */
static void cx_ucx_retire_tick(cx_ucx_t *b)
{
    int more = 0;
    uint64_t now = cx_ucx_now_ns();
    for (cx_bep_t *ep = b->eps.next; ep != &b->eps; ep = ep->next) {
        for (cx_ucx_ue_t **pp = &ep->old; *pp;) {
            cx_ucx_ue_t *ue = *pp;
            uint64_t at = ue->retired_ns + cx_ucx_grace(b, ue->wk);
            if (ue->inflight || now < at) {
                if (!ue->inflight) cx_ucx_arm_timer(b, (long)((at - now) / 1000000ull) + 1);
                pp = &ue->next;
                continue;
            }
            *pp = ue->next;
            cx_ucx_ue_close(b, ue, 0);
        }
        if (ep->held) cx_ucx_start_held(b, ep);
        if (ep->old || ep->held) more = 1;
    }
    b->retiring = more;
}

/* An op still posted on a worker about to be destroyed (cx_ucx_rescue). One whose xfer may be
 * posted again hands it to a new op in its place in the endpoint's list, marked MOVED; the old
 * op ends without an xfer (kept, while a UCX request names it, until the worker is destroyed:
 * a get's bounce buffer with it). A message already sent cannot be: it ends with CX_ERR.
 * Returns 1 when moved. */
static int cx_ucx_take_off(cx_ucx_t *b, cx_ucx_op_t *op)
{
    cx_xfer_t *x = op->x;
    int again = x->kind == CX_XFER_READ || x->kind == CX_XFER_WRITE ||
        (x->kind == CX_XFER_PUT_SIGNAL && op->stage != CX_UCX_OPS_AM);
    cx_ucx_op_t *nop = again ? cx_objcache_get(&b->free_ops) : NULL;
    if (!nop) { /* a message the peer may have delivered (its ack is what is missing), or no memory */
        cx_ucx_op_finish(b, op, CX_ERR);
        return 0;
    }
    nop->b = b;
    nop->x = x;
    nop->ep = op->ep;
    nop->stage = CX_UCX_OPS_MOVED;
    nop->next = op->next;
    nop->prev = op->prev;
    op->prev->next = nop;
    op->next->prev = nop;
    op->next = op->prev = NULL;
    op->x = NULL;
    op->ep = NULL;
    int keep = op->pending > 0;
    cx_ucx_op_finish(b, op, CX_ERR); /* out of the ack table; freed here unless UCX names it */
    if (keep) cx_ucx_list_add(&b->zombies, op);
    return 1;
}

/* Does an op of an endpoint still wait on wk? */
static int cx_ucx_wk_posted(const cx_ucx_t *b, const cx_ucx_wk_t *wk)
{
    for (const cx_bep_t *ep = b->eps.next; ep != &b->eps; ep = ep->next)
        for (const cx_ucx_op_t *op = ep->ops.next; op != &ep->ops; op = op->next)
            if (op->ue && op->ue->wk == wk && !op->finished) return 1;
    return 0;
}

/* A retired worker whose receive FIFO is in doubt (a dead peer may have left a slot of it
 * unfilled) had its grace, and ops of live peers are still posted on it: their answers (a get's
 * data, a flush's completion, a message's ack) queue behind that slot and never come. So
 * everything of it ends now: reads, writes and put_signals whose message is not sent yet are
 * taken off, the worker is destroyed (nothing posted on it can move or land after that: UCX
 * keeps no request of it, reads no caller's buffer for it, copies nothing into one), and they
 * are posted again on their endpoint's current ucp_ep. A read is idempotent; a write writes the
 * same bytes, and the copy of the first that may already be in the peer's FIFO lands before the
 * second's, which the flush waits for (same FIFO), or never (a FIFO of the peer wedged the same
 * way dies with its worker). A message (or put_signal) already sent may have been delivered, its
 * ack being what is stuck: posting it again could deliver it twice, so it ends with CX_ERR,
 * which the core turns into the verdict's status (CX_EPEER if the peer fails meanwhile).
 * Returns CX_EAGAIN (nothing done) when no op waits there, or while an endpoint still has its
 * current ucp_ep there. */
static int cx_ucx_rescue(cx_ucx_t *b, cx_ucx_wk_t *wk)
{
    if (!cx_ucx_wk_posted(b, wk)) return CX_EAGAIN; /* retiring ucp_eps only: they close on their own */
    for (cx_bep_t *ep = b->eps.next; ep != &b->eps; ep = ep->next)
        if (ep->ue && ep->ue->wk == wk && (ep->failed || cx_ucx_retarget(b, ep) != CX_OK)) return CX_EAGAIN;
    int moved = 0, ended = 0;
    for (cx_bep_t *ep = b->eps.next; ep != &b->eps; ep = ep->next) {
        for (cx_ucx_op_t *op = ep->ops.next, *nx; op != &ep->ops; op = nx) {
            nx = op->next; /* op is replaced in place or taken off: nx stays */
            if (!op->ue || op->ue->wk != wk || op->finished) continue;
            if (cx_ucx_take_off(b, op))
                moved++;
            else
                ended++;
        }
        for (cx_ucx_ue_t **pp = &ep->old; *pp;) {
            cx_ucx_ue_t *ue = *pp;
            if (ue->wk != wk) {
                pp = &ue->next;
                continue;
            }
            *pp = ue->next;
            cx_ucx_ue_close(b, ue, 1);
        }
    }
    for (cx_ucx_wk_t **pp = &b->old; *pp; pp = &(*pp)->next) {
        if (*pp == wk) {
            *pp = wk->next;
            b->n_old--;
            break;
        }
    }
    uint32_t gen = wk->gen;
    int z = wk->zombies;
    uint64_t t0 = cx_ucx_now_ns();
    cx_ucx_wk_destroy(b, wk);
    b->zombies_freed += (uint64_t)z;
    b->rescued += (uint64_t)moved;
    for (cx_bep_t *ep = b->eps.next; ep != &b->eps; ep = ep->next) cx_ucx_start_moved(b, ep);
    b->retiring = 1; /* messages held behind the ones that ended may go */
    cx_ucx_signal(b);
    cx_info("ucx: worker generation %u (its receive FIFO in doubt) still had ops of live peers after its "
            "grace: %d posted again on the current worker, %d messages ended (CX_ERR: the peer may have "
            "them); destroyed in %.2f ms with %d zombie endpoints (%llu ops posted again in all)",
            gen, moved, ended, (double)(cx_ucx_now_ns() - t0) / 1e6, z, (unsigned long long)b->rescued);
    return CX_OK;
}

void cx_ucx_rot_tick(cx_ucx_t *b)
{
    if (b->retiring) cx_ucx_retire_tick(b);
    if (!b->old && !cx_ucx_want_rotation(b)) return;
    uint64_t now = cx_ucx_now_ns();
    for (cx_ucx_wk_t **pp = &b->old; *pp;) {
        cx_ucx_wk_t *wk = *pp;
        uint64_t at = wk->retired_ns + cx_ucx_grace(b, wk);
        if (wk->open_ues && wk->rx_doubt && now >= at && cx_ucx_rescue(b, wk) == CX_OK) continue; /* *pp moved on */
        if (wk->open_ues) { /* its endpoints' xfers still running: their completions call */
            /* in doubt, they may never complete: come back for them at the grace's end */
            if (wk->rx_doubt) cx_ucx_arm_timer(b, now < at ? (long)((at - now) / 1000000ull) + 1 : 100);
            pp = &wk->next;
            continue;
        }
        if (now < at) {
            cx_ucx_arm_timer(b, (long)((at - now) / 1000000ull) + 1);
            pp = &wk->next;
            continue;
        }
        *pp = wk->next;
        b->n_old--;
        int z = wk->zombies;
        uint32_t gen = wk->gen;
        uint64_t t0 = cx_ucx_now_ns();
        cx_ucx_wk_destroy(b, wk);
        b->zombies_freed += (uint64_t)z;
        cx_info("ucx: worker rotated: %d zombie endpoints freed (generation %u destroyed in %.2f ms; "
                "%llu rotations, %llu freed in all)",
                z, gen, (double)(cx_ucx_now_ns() - t0) / 1e6, (unsigned long long)b->rotations,
                (unsigned long long)b->zombies_freed);
    }
    if (cx_ucx_want_rotation(b)) {
        if (b->n_old >= CX_UCX_MAX_OLD_WORKERS) return; /* a destroy calls again */
        /* zombies can wait; a dead writer's doubt cannot (every message to us may be stuck),
         * but still not more often than CX_UCX_DOUBT_GAP_MS (a failed attempt is not retried
         * in a loop, and peers dying one after another share a rotation) */
        uint64_t gap = b->cur->rx_doubt ? CX_UCX_DOUBT_GAP_MS * 1000000ull : b->grace_ns;
        uint64_t at = b->last_rotate_ns + gap;
        if (b->last_rotate_ns && now < at) {
            cx_ucx_arm_timer(b, (long)((at - now) / 1000000ull) + 1);
            return;
        }
        (void)cx_ucx_rotate(b, now);
    }
}
