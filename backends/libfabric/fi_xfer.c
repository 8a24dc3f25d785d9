/* Endpoints and transfers: connect by the peer's fi_getname, post fi_read / fi_write / fi_send,
 * keep every op findable so that a late CQ entry never touches a completed xfer. */
#include "fi_int.h"

#include "connex/log.h"
#include "connex/wire.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void cx_fi_kick(cx_backend_t *b)
{
    uint64_t one = 1;
    if (b->kicked) return; /* still readable: progress() has not read it since */
    b->kicked = 1;
    if (write(b->evfd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is already non-zero, the core will call us anyway. */
    }
}

cx_bep_t *cx_fi_ep_by_peer(cx_backend_t *b, void *peer)
{
    if (b->owner) {
        /* A rail: the core knows its hub's endpoint, which holds this rail's. */
        cx_bep_t *he = cx_core_peer_ep(b->core, b->owner, peer);
        if (he && b->rail_idx < he->nrails && he->rail[b->rail_idx]) return he->rail[b->rail_idx];
    } else {
        cx_bep_t *ce = cx_core_peer_ep(b->core, b, peer); /* every message asks: O(1) */
        if (ce) return ce;
    }
    for (cx_bep_t *ep = b->eps; ep; ep = ep->next)
        if (ep->peer == peer) return ep;
    return NULL;
}

/* ---- ops ---- */

static void cx_fi_ep_link(cx_fi_op_t *op)
{
    cx_bep_t *ep = op->ep;
    op->eprev = NULL;
    op->enext = ep->ops;
    if (ep->ops) ep->ops->eprev = op;
    ep->ops = op;
    ep->nops++;
}

void cx_fi_ep_unlink(cx_fi_op_t *op)
{
    if (!op->ep) return;
    if (op->in_backlog) op->ep->nq--; /* it stays in the backlog as an orphan, dropped unposted */
    op->ep->nops--;
    if (op->eprev)
        op->eprev->enext = op->enext;
    else
        op->ep->ops = op->enext;
    if (op->enext) op->enext->eprev = op->eprev;
    op->enext = op->eprev = NULL;
    op->ep = NULL;
}

cx_fi_op_t *cx_fi_op_new(cx_backend_t *b, int kind, cx_xfer_t *x, cx_bep_t *ep)
{
    /* Ops are kept for reuse (CX_FI_OP_CACHE): one per read or write, calloc and free showed
     * in the profile of 4 KiB shm reads. */
    cx_fi_op_t *op = cx_objcache_get(&b->op_cache);
    if (!op) return NULL;
    op->c.type = CX_FI_CTX_OP;
    op->kind = kind;
    op->x = x;
    op->txi = -1;
    op->ep = ep;
    if (ep) cx_fi_ep_link(op);
    op->anext = b->all;
    if (b->all) b->all->aprev = op;
    b->all = op;
    return op;
}

void cx_fi_op_free(cx_backend_t *b, cx_fi_op_t *op)
{
    if (op->carrier || op->mem) cx_fi_list_detach(b, op);
    cx_fi_ack_del(b, op);
    cx_fi_ep_unlink(op);
    if (op->aprev)
        op->aprev->anext = op->anext;
    else
        b->all = op->anext;
    if (op->anext) op->anext->aprev = op->aprev;
    if (op->txi >= 0) cx_fi_tx_put(b, op->txi);
    if (op->tmp_mr) fi_close(&op->tmp_mr->fid);
    if (op->wb_pin) cx_core_region_unpin(op->wb_pin);
    free(op->tmp_buf);
    free(op->vent);
    if (b->closing)
        free(op);
    else
        cx_objcache_put(&b->op_cache, op);
}

/* Completes the core's xfer (once) and detaches the op from its endpoint. */
void cx_fi_op_finish(cx_backend_t *b, cx_fi_op_t *op, int status)
{
    if (op->kind == CX_FOP_VEC) {
        cx_fi_vec_finish(b, op, status);
        return;
    }
    if (op->kind == CX_FOP_RLIST) cx_fi_list_finish(b, op, status);
    cx_fi_ack_del(b, op);
    cx_fi_ep_unlink(op);
    if (op->rreq && op->tmp_mr) {
        /* Write-back read: its key dies before the caller hears the outcome (fi_wb.c). */
        fi_close(&op->tmp_mr->fid);
        op->tmp_mr = NULL;
    }
    cx_xfer_t *x = op->x;
    op->x = NULL;
    if (!x) return;
    if (b->owner)
        cx_fi_hub_sub_done(b, x, status); /* a stripe: its hub completes the core's xfer */
    else
        cx_core_xfer_done(b->core, x, status);
}

/* ---- acks: ops waiting for the target's answer, by sequence ---- */

void cx_fi_ack_add(cx_backend_t *b, cx_fi_op_t *op)
{
    op->seq = b->next_seq++;
    cx_acktab_add(&b->acks, &op->ack, op->seq);
}

cx_fi_op_t *cx_fi_ack_take(cx_backend_t *b, uint64_t seq)
{
    cx_ack_link_t *l = cx_acktab_take(&b->acks, seq);
    if (!l) return NULL;
    cx_fi_op_t *op = cx_container_of(l, cx_fi_op_t, ack);
    op->seq = 0;
    return op;
}

cx_fi_op_t *cx_fi_ack_find(cx_backend_t *b, uint64_t seq)
{
    cx_ack_link_t *l = cx_acktab_find(&b->acks, seq);
    return l ? cx_container_of(l, cx_fi_op_t, ack) : NULL;
}

void cx_fi_ack_del(cx_backend_t *b, cx_fi_op_t *op)
{
    cx_acktab_del(&b->acks, &op->ack);
    op->seq = 0;
}

/* ---- backlog: ops the provider or our buffer pool could not take yet ---- */

void cx_fi_backlog_add(cx_backend_t *b, cx_fi_op_t *op)
{
    op->in_backlog = 1;
    op->qnext = NULL;
    if (op->ep) op->ep->nq++;
    if (b->qtail)
        b->qtail->qnext = op;
    else
        b->qhead = op;
    b->qtail = op;
}

/* A post the provider refused is local (no memory, a bad key, a queue that would not take it):
 * the op ends with that error and the peer is not blamed. A post to a shm peer whose process
 * exited (cx_fi_peer_dead: -FI_ENOTCONN) is the peer gone. */
void cx_fi_post_failed(cx_backend_t *b, cx_fi_op_t *op, int r)
{
    cx_bep_t *ep = op->ep;
    void *peer = ep ? ep->peer : NULL;
    int gone = ep && ep->dead;
    cx_warn("libfabric: %s: posting op kind %d failed: %s", b->prov, op->kind, cx_fi_strerror(-r));
    if (gone) {
        /* Off its endpoint first: the core disconnects it from inside the report, and the op
         * then completes under the peer's failure (CX_EPEER). */
        cx_fi_ep_unlink(op);
        ep->dead = 2;
        cx_core_peer_error(b->core, peer, CX_CAUSE_PEER_GONE, "libfabric shm: peer process exited");
        cx_fi_op_finish(b, op, CX_EPEER);
        cx_fi_op_free(b, op);
        return;
    }
    int st = r == -FI_ENOMEM ? CX_ENOMEM : r == -FI_EINVAL ? CX_EINVAL : CX_ERR;
    cx_fi_op_finish(b, op, st);
    cx_fi_op_free(b, op);
    if (peer) cx_core_peer_error(b->core, peer, CX_CAUSE_LOCAL, "libfabric: post failed");
}

/* One pass over the backlog. Order is kept per endpoint, not across endpoints: an endpoint whose
 * oldest queued op gets -FI_EAGAIN keeps the rest of its ops queued, and the pass goes on with the
 * other endpoints. rxm answers -FI_EAGAIN for as long as its connection to a peer is not set up,
 * and to a SIGSTOPped peer it never is: with one queue in global order, every op to every other
 * peer waited behind that one until its op timeout (conformance_hol). */
void cx_fi_backlog_run(cx_backend_t *b)
{
    uint64_t pass = ++b->q_pass;
    int posted = 0;
    b->q_lockwait = 0;
    cx_fi_op_t **pp = &b->qhead, *prev = NULL;
    while (*pp) {
        cx_fi_op_t *op = *pp;
        int r = 0;
        /* Orphans (op->ep NULL: their endpoint was disconnected) are dropped unposted. */
        if (op->ep) {
            if (op->ep->q_blocked == pass) {
                prev = op;
                pp = &op->qnext;
                continue;
            }
            r = cx_fi_op_post(b, op);
            if (r == -FI_EAGAIN) {
                cx_fi_bell_ring(b, op->ep); /* shm: its queue may still be full (fi_bell.c) */
                op->ep->q_blocked = pass;
                prev = op;
                pp = &op->qnext;
                continue;
            }
            op->ep->nq--;
            posted++;
        }
        *pp = op->qnext;
        if (b->qtail == op) b->qtail = prev;
        op->in_backlog = 0;
        op->qnext = NULL;
        if (!op->ep)
            cx_fi_op_free(b, op);
        else if (r)
            cx_fi_post_failed(b, op, r);
        /* cx_fi_post_failed may have disconnected endpoints: their queued ops became orphans
         * (op->ep NULL, still linked here), which the walk drops as it meets them. */
    }
    b->q_stuck = b->qhead && !posted;
    /* Without a CQ wait fd nothing would call us for what these posts completed (shm ends an
     * op inside its post, after this pass's drain): come back for it. */
    if (posted && b->cq_fd < 0) cx_fi_kick(b);
}

/* ---- posting ---- */

static int cx_fi_post_send(cx_backend_t *b, cx_fi_op_t *op)
{
    if (op->txi < 0) {
        op->txi = cx_fi_tx_get(b);
        if (op->txi < 0) return -FI_EAGAIN;
        uint8_t *buf = cx_fi_tx_buf(b, op->txi);
        cx_wr_t w;
        cx_wr_init(&w, buf, CX_FI_BUF);
        if (op->kind == CX_FOP_RLIST) {
            /* A batch's small reads, one request (fi_list.c). */
            cx_fi_hdr_put(&w, &(cx_fi_hdr_t){ .type = CX_FM_RLIST, .inc = b->inc, .seq = op->seq });
            int r = cx_fi_list_write(b, op, &w);
            if (r) {
                cx_fi_tx_put(b, op->txi);
                op->txi = -1;
                return r;
            }
        } else if (op->rreq || op->kind == CX_FOP_PULL) {
            /* A read by write-back, or a large message pulled that way (fi_wb.c): ask the target
             * (or the message's sender) to write, then ack this sequence. */
            uint8_t t = op->rreq == CX_FI_RREQ_IN ? CX_FM_RREQ_IN : op->rreq ? CX_FM_RREQ : CX_FM_PREQ;
            cx_fi_hdr_put(&w, &(cx_fi_hdr_t){ .type = t, .inc = b->inc, .seq = op->seq });
            int r = op->rreq ? cx_fi_wb_rreq_write(b, op, &w) : cx_fi_wb_preq_write(b, op, &w);
            if (r) {
                cx_fi_tx_put(b, op->txi);
                op->txi = -1;
                return r;
            }
        } else if (op->kind == CX_FOP_ACK && op->mtype == CX_FM_RDATA) {
            /* A small read's answer (fi_wb.c): the bytes now, then the region may go. */
            if (op->raw) {
                cx_wr_bytes(&w, op->wb_src, op->r_len);
            } else {
                cx_fi_hdr_put(&w, &(cx_fi_hdr_t){ .type = CX_FM_RDATA, .inc = b->inc, .seq = op->ack_seq });
                cx_fi_rdata_put(&w, CX_OK, (uint32_t)op->r_addr, op->wb_src, op->r_len);
            }
            if (op->wb_pin) {
                cx_core_region_unpin(op->wb_pin);
                op->wb_pin = NULL;
            }
            free(op->tmp_buf);
            op->tmp_buf = NULL;
            op->wb_src = NULL;
        } else if (op->kind == CX_FOP_ACK && op->mtype == CX_FM_ADDR) {
            /* Our endpoint as it is when this leaves (fi_rot.c): seq is its generation. */
            cx_fi_hdr_put(&w, &(cx_fi_hdr_t){ .type = CX_FM_ADDR, .inc = b->inc, .seq = b->rot_gen });
            cx_wr_bytes(&w, b->addr, b->addr_len);
        } else if (op->kind == CX_FOP_ACK) {
            cx_fi_hdr_put(&w, &(cx_fi_hdr_t){ .type = CX_FM_ACK, .inc = b->inc, .seq = op->ack_seq });
            cx_fi_ack_put(&w, op->ack_val);
            if (op->hflags & CX_FM_F_CMA_ADV) cx_fi_cma_adv(b, &w); /* a warm-up's offer (fi_caps.c) */
        } else {
            cx_xfer_t *x = op->x;
            int sig = x->kind == CX_XFER_PUT_SIGNAL;
            int eager = x->msg_len <= b->eager_max - CX_FM_HDR;
            uint8_t t = eager ? (sig ? CX_FM_SIG : CX_FM_MSG) : (sig ? CX_FM_SIG_RTS : CX_FM_MSG_RTS);
            cx_fi_hdr_put(&w, &(cx_fi_hdr_t){ .type = t, .inc = b->inc, .seq = op->seq });
            if (eager) {
                cx_wr_bytes(&w, x->msg, x->msg_len);
            } else {
                /* Large message: the target pulls it with fi_read from this registration. */
                int r =
                    cx_fi_mr_reg(b, (void *)(uintptr_t)x->msg, x->msg_len, FI_REMOTE_READ, CX_MEM_HOST, &op->tmp_mr);
                if (r) {
                    cx_fi_tx_put(b, op->txi);
                    op->txi = -1;
                    return r;
                }
                uint64_t a = (b->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)x->msg : 0;
                cx_fi_rts_put(&w, &(cx_fi_rts_t){ .len = x->msg_len, .addr = a, .key = fi_mr_key(op->tmp_mr) });
            }
        }
        op->txlen = w.len;
        cx_debug("libfabric: %s: send type %u seq %llu (%zu bytes)", b->prov, buf[0],
                 (unsigned long long)(op->kind == CX_FOP_ACK ? op->ack_seq : op->seq), w.len);
    }
    if (op->raw) {
        /* Headerless: the header is the CQ data word (fi_wb.c). */
        uint64_t cqd = cx_fi_cqd_rdata((uint32_t)op->r_addr, op->ack_seq);
        struct iovec iov = { .iov_base = cx_fi_tx_buf(b, op->txi), .iov_len = op->txlen };
        void *desc = fi_mr_desc(b->txmr);
        struct fi_msg m = {
            .msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = op->ep->fa, .context = &op->c.fc, .data = cqd
        };
        return (int)fi_sendmsg(b->ep, &m, FI_COMPLETION | FI_REMOTE_CQ_DATA | b->post_more);
    }
    /* At each try: a ring that failed since the buffer was written no longer holds. A small read
     * asks for headerless answers where our CQ takes their data word. */
    uint16_t fl = (cx_fi_bell_rings(op->ep) ? CX_FM_F_RUNG : 0) | CX_FM_F_LISTS | op->hflags;
    if ((op->rreq == CX_FI_RREQ_IN || op->kind == CX_FOP_RLIST) && b->rd_raw) fl |= CX_FM_F_RAW;
    cx_fi_hdr_flags_set(cx_fi_tx_buf(b, op->txi), fl);
    if (b->post_more) {
        struct iovec iov = { .iov_base = cx_fi_tx_buf(b, op->txi), .iov_len = op->txlen };
        void *desc = fi_mr_desc(b->txmr);
        struct fi_msg m = { .msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = op->ep->fa, .context = &op->c.fc };
        return (int)fi_sendmsg(b->ep, &m, FI_COMPLETION | FI_MORE);
    }
    return (int)fi_send(b->ep, cx_fi_tx_buf(b, op->txi), op->txlen, fi_mr_desc(b->txmr), op->ep->fa, &op->c.fc);
}

static int cx_fi_rma_target(cx_backend_t *b, cx_xfer_t *x, uint64_t *raddr, uint64_t *rkey)
{
    if (cx_fi_key_hit(b, x)) {
        *rkey = b->kc.key; /* a batch's entry in the region of the one before */
        return cx_fi_key_target(&b->kc, x->remote, raddr);
    }
    return cx_fi_key_decode(x->rkey, x->rkey_len, x->remote, raddr, rkey);
}

/* submit_batch: the key of the entries sharing xs[i]'s blob, parsed once. */
static void cx_fi_key_remember(cx_backend_t *b, const cx_xfer_t *x)
{
    int ok = x->kind != CX_XFER_MSG && x->rkey && cx_fi_key_parse(x->rkey, x->rkey_len, &b->kc) == CX_OK;
    b->kc_blob = ok ? x->rkey : NULL;
    b->kc_len = x->rkey_len;
}

int cx_fi_key_cached(cx_backend_t *b, const cx_xfer_t *x, uint64_t *raddr, uint64_t *rkey)
{
    if (!cx_fi_key_hit(b, x)) {
        cx_fi_key_remember(b, x);
        if (!b->kc_blob) return CX_EINVAL;
    }
    *rkey = b->kc.key;
    return cx_fi_key_target(&b->kc, x->remote, raddr);
}

/* The core's exit fd for the peer (cx_core_peer_exit_fd) is looked at once every CX_FI_PID_POSTS
 * posts to the peer, the first included: a poll() per post was a syscall per op, about a third
 * of the 1.5-2 us that 4 KiB shm reads took above the raw fi_read loop, and a clock read to
 * space them out cost as much again on this VM. Posting to a peer that has just died is harmless
 * (its CMA fails, the op ends in error); a spinlock the peer left held is the guard's to release
 * (fi_guard.c). */
#define CX_FI_PID_POSTS 32u

int cx_fi_peer_dead(cx_bep_t *ep)
{
    if (ep->dead) return 1;
    if (ep->exit_fd < 0 || ep->pid_posts++ % CX_FI_PID_POSTS) return 0;
    struct pollfd p = { .fd = ep->exit_fd, .events = POLLIN };
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP))) {
        ep->dead = 1;
        cx_fi_kick(ep->b);
        return 1;
    }
    return 0;
}

/* Peers found dead at a post are reported from progress, never from inside submit. */
void cx_fi_report_dead(cx_backend_t *b)
{
    for (cx_bep_t *ep = b->eps; ep; ep = ep->next) {
        if (ep->dead == 1) {
            ep->dead = 2;
            cx_core_peer_error(b->core, ep->peer, CX_CAUSE_PEER_GONE, "libfabric shm: peer process exited");
            return; /* the core may have disconnected endpoints: the list changed */
        }
    }
}

/* Whether op must wait because its peer holds its share already (CX_FI_EP_*_MAX). */
static int cx_fi_ep_full(cx_backend_t *b, cx_fi_op_t *op)
{
    cx_bep_t *ep = op->ep;
    if (ep->nops <= CX_FI_EP_TX_MAX) return 0; /* fewer ops than either bound */
    int needs_tx = op->txi < 0 &&
        (op->kind == CX_FOP_SEND || op->kind == CX_FOP_ACK || op->kind == CX_FOP_RLIST ||
         (op->kind == CX_FOP_PULL && b->wb));
    /* Fewer ops than the posted bound, and no send buffer needed: not full, without counting.
     * Counting walks the endpoint's ops, so a batch's posts, every one of them, walked each
     * other: 230 of the 290 instructions per entry posted (4 KiB reads, 128 a batch, shm). */
    if (!needs_tx && ep->nops < CX_FI_EP_POSTED_MAX) return 0;
    int posted = 0, tx = 0;
    for (cx_fi_op_t *o = ep->ops; o; o = o->enext) {
        posted += o->posted;
        tx += o->txi >= 0;
    }
    return posted >= CX_FI_EP_POSTED_MAX || (needs_tx && tx >= CX_FI_EP_TX_MAX);
}

int cx_fi_op_post(cx_backend_t *b, cx_fi_op_t *op)
{
    cx_xfer_t *x = op->x;
    uint64_t raddr, rkey;
    ssize_t r;
    if (cx_fi_peer_dead(op->ep)) return -FI_ENOTCONN;
    if (cx_fi_lock_held(b, op->ep->lockw)) {
        b->q_lockwait = 1; /* the post would spin on the peer's region: the backlog retries soon */
        return -FI_EAGAIN;
    }
    if (cx_fi_ep_full(b, op)) return -FI_EAGAIN; /* waits in the backlog behind this peer's own ops only */
    op->ep->tried = 1;
    switch (op->kind) {
    case CX_FOP_READ:
    case CX_FOP_WRITE:
    case CX_FOP_PSWRITE: {
        if (cx_fi_rma_target(b, x, &raddr, &rkey)) return -FI_EINVAL;
        void *desc = ((cx_fi_mh_t *)x->local_mh)->desc;
        if (op->kind == CX_FOP_READ && b->post_more) {
            struct iovec iov = { .iov_base = x->local, .iov_len = x->len };
            struct fi_rma_iov riov = { .addr = raddr, .len = x->len, .key = rkey };
            struct fi_msg_rma m = { .msg_iov = &iov,
                                    .desc = &desc,
                                    .iov_count = 1,
                                    .addr = op->ep->fa,
                                    .rma_iov = &riov,
                                    .rma_iov_count = 1,
                                    .context = &op->c.fc };
            r = fi_readmsg(b->ep, &m, FI_COMPLETION | FI_MORE);
        } else if (op->kind == CX_FOP_READ) {
            r = fi_read(b->ep, x->local, x->len, desc, op->ep->fa, raddr, rkey, &op->c.fc);
        } else {
            /* A write completes when the data is at the target (a plain fi_write completes
             * when the source may be reused: on tcp that is before the peer has it). For
             * put_signal the message may only leave then (not fi_writedata: EFA emulates it
             * with send/recv and falls off a cliff at a few hundred in flight). */
            r = cx_fi_write_dc(b, op, x->local, desc, x->len, raddr, rkey);
        }
        break;
    }
    case CX_FOP_SEND:
    case CX_FOP_ACK:
    case CX_FOP_RLIST: r = cx_fi_post_send(b, op); break;
    case CX_FOP_WBACK: r = cx_fi_wb_post(b, op); break;
    case CX_FOP_PULL:
        if (b->wb) {
            r = cx_fi_post_send(b, op);
            break;
        }
        r = fi_read(b->ep, op->tmp_buf, op->r_len, fi_mr_desc(op->tmp_mr), op->ep->fa, op->r_addr, op->r_key,
                    &op->c.fc);
        break;
    default: return -FI_EINVAL;
    }
    if (r == 0) {
        b->more_owed = b->post_more != 0; /* a post without FI_MORE sends what waited */
        /* What the peer must serve: a message, or without direct mode any command (fi_bell.c). */
        if (op->kind == CX_FOP_SEND || op->kind == CX_FOP_ACK || op->kind == CX_FOP_RLIST ||
            (op->kind == CX_FOP_PULL && b->wb) || !b->shm_direct)
            cx_fi_bell_ring(b, op->ep);
        else
            cx_fi_bell_posted(b, op->ep, 1);
        op->posted = 1;
        op->gen = b->rot_gen;
        if (!op->ep->used) {
            op->ep->used = 1;
            b->sweep_now = 1; /* rxm connects on the first op to a peer */
        }
    }
    return (int)r;
}

/* Posts now, or queues when the provider or the buffer pool is full. */
/* One write from src to the peer's (raddr, key) whose completion means the bytes are in the
 * target's memory, not merely that src may be reused: delivery-complete, or on shm in direct
 * mode a plain write, which the provider copies into the target before the post returns. */
int cx_fi_write_dc(cx_backend_t *b, cx_fi_op_t *op, const void *src, void *desc, size_t len, uint64_t raddr,
                   uint64_t key)
{
    struct iovec iov = { .iov_base = (void *)(uintptr_t)src, .iov_len = len };
    struct fi_rma_iov riov = { .addr = raddr, .len = len, .key = key };
    struct fi_msg_rma m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.desc = &desc;
    m.iov_count = 1;
    m.addr = op->ep->fa;
    m.rma_iov = &riov;
    m.rma_iov_count = 1;
    m.context = &op->c.fc;
    return (int)fi_writemsg(b->ep, &m,
                            b->post_more | (b->shm_direct ? FI_COMPLETION : FI_DELIVERY_COMPLETE | FI_COMPLETION));
}

int cx_fi_start(cx_backend_t *b, cx_fi_op_t *op)
{
    /* Keep order behind this endpoint's queued ops (other endpoints' do not hold it up). */
    int r = op->ep && op->ep->nq ? -FI_EAGAIN : cx_fi_op_post(b, op);
    if (r == -FI_EAGAIN) {
        cx_debug("libfabric: %s: op kind %d waits in the backlog", b->prov, op->kind);
        if (op->ep) cx_fi_bell_ring(b, op->ep); /* shm: its queue may be full (fi_bell.c) */
        cx_fi_backlog_add(b, op);
        cx_fi_kick(b);
        return 0;
    }
    return r;
}

int cx_fi_submit(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *x)
{
    if (!ep || !x) {
        cx_warn("libfabric: submit without endpoint or xfer");
        return CX_EINVAL;
    }
    int kind;
    switch (x->kind) {
    case CX_XFER_READ: kind = CX_FOP_READ; break;
    case CX_XFER_WRITE: kind = CX_FOP_WRITE; break;
    case CX_XFER_PUT_SIGNAL: kind = CX_FOP_PSWRITE; break;
    case CX_XFER_MSG: kind = CX_FOP_SEND; break;
    default: cx_warn("libfabric: submit: unknown xfer kind %d", x->kind); return CX_EINVAL;
    }
    if (x->kind != CX_XFER_MSG) {
        uint64_t ra, rk;
        if (!x->len || !x->local || !x->local_mh) {
            cx_warn("libfabric: submit: RMA without a registered local buffer");
            return CX_EINVAL;
        }
        if (x->len > b->max_msg) {
            cx_warn("libfabric: %s: %zu bytes exceed the provider's max_msg_size %zu", b->prov, x->len, b->max_msg);
            return CX_EINVAL;
        }
        if (cx_fi_rma_target(b, x, &ra, &rk)) return CX_EINVAL;
    }
    if ((x->kind == CX_XFER_MSG || x->kind == CX_XFER_PUT_SIGNAL) &&
        (x->msg_len > CX_MSG_MAX || (x->msg_len && !x->msg))) {
        cx_warn("libfabric: submit: bad message (%zu bytes)", x->msg_len);
        return CX_EINVAL;
    }
    int rc;
    if (cx_fi_cma_submit(b, ep, x, &rc)) return rc; /* a same-host copy, done (fi_cma.c) */
    /* tcp (libfabric 1.17.0) cannot tear down a connection with a read half answered: reads
     * there go as a request the target answers with a write (fi_wb.c). */
    int rreq = kind != CX_FOP_READ || !b->wb                    ? 0
        : x->len <= b->rd_inline && x->local_mem == CX_MEM_HOST ? CX_FI_RREQ_IN
                                                                : CX_FI_RREQ_WB;
    if (rreq) kind = CX_FOP_SEND;
    cx_fi_op_t *op = cx_fi_op_new(b, kind, x, ep);
    if (!op) return CX_ENOMEM;
    op->rreq = rreq;
    if (kind == CX_FOP_SEND || kind == CX_FOP_PSWRITE) cx_fi_ack_add(b, op);
    x->bp[0] = op;
    int r = cx_fi_start(b, op);
    if (r == -FI_ENOTCONN) {
        /* Its peer exited (the core's exit fd): never reported from inside submit, so the op waits in the
         * backlog, whose next pass reports the peer gone and then completes it (CX_EPEER). */
        cx_fi_backlog_add(b, op);
        cx_fi_kick(b);
        return CX_OK;
    }
    if (r) {
        cx_warn("libfabric: %s: submit: %s", b->prov, cx_fi_strerror(-r));
        x->bp[0] = NULL;
        op->x = NULL;
        cx_fi_op_free(b, op);
        return r == -FI_EINVAL ? CX_EINVAL : CX_ERR;
    }
    return CX_OK;
}

/* A batch's xfers to one endpoint: each posted with FI_MORE but the last, so that the provider
 * (tcp) sends them in one go as the last one rings; runs of reads and writes as vector ops
 * (fi_vec.c), the rest alone. When the last did not post (the backlog took it, or it failed)
 * the earlier ones were still told more would follow: the kick makes the core call progress,
 * whose CQ read drives the provider's sends. */
void cx_fi_submit_batch(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs)
{
    b->more_owed = 0;
    b->kc_blob = NULL;
    for (size_t i = 0; i < n;) {
        size_t k = cx_fi_cma_batch(b, ep, xs + i, n - i, rcs + i);
        if (!k) k = cx_fi_vec_submit(b, ep, xs + i, n - i, rcs + i);
        if (k) {
            i += k;
            continue;
        }
        k = cx_fi_list_submit(b, ep, xs + i, n - i, rcs + i);
        if (k) {
            i += k;
            continue;
        }
        b->post_more = i + 1 < n && !b->shm_direct ? FI_MORE : 0;
        if (xs[i]->rkey != b->kc_blob) cx_fi_key_remember(b, xs[i]);
        rcs[i] = cx_fi_submit(b, ep, xs[i]);
        i++;
    }
    b->post_more = 0;
    b->kc_blob = NULL; /* the blob is the core's again: it may change after this call */
    if (b->more_owed) cx_fi_kick(b);
}

/* ---- endpoints ---- */

int cx_fi_connect(cx_backend_t *b, void *peer, const void *addr, size_t addr_len, cx_bep_t **out)
{
    cx_fi_addr_t a;
    /* A multi-rail peer's blob: this single-domain backend talks to its first rail. */
    const uint8_t *part;
    size_t part_len;
    int nr;
    if (cx_fi_addr_rail(addr, addr_len, 0, &part, &part_len, &nr) == CX_OK) {
        addr = part;
        addr_len = part_len;
    }
    if (cx_fi_addr_get(addr, addr_len, &a)) {
        cx_warn("libfabric: connect: malformed address blob (%zu bytes)", addr_len);
        return CX_EINVAL;
    }
    const char *prov = a.prov;
    uint32_t pid = a.pid;
    if (strcmp(prov, b->prov) || a.fmt != b->info->addr_format) {
        cx_info("libfabric: connect: peer uses %s, this engine %s: no common fabric", prov, b->prov);
        return CX_EUNSUPPORTED;
    }
    /* shm: a peer that moved to a new region since the HELLO we have (fi_rot.c) is posted to
     * there. */
    const void *name = a.name;
    size_t name_len = a.name_len;
    uint32_t gen = 0;
    int shm = !strcmp(b->prov, "shm");
    if (shm && memchr(a.name, 0, a.name_len) == (const void *)(a.name + a.name_len - 1)) {
        const char *nn = cx_fi_rot_newest(b, (const char *)a.name, &gen);
        name = nn;
        name_len = strlen(nn) + 1;
    }
    cx_bep_t *ep = calloc(1, sizeof *ep);
    if (!ep) return CX_ENOMEM;
    int n = fi_av_insert(b->av, name, 1, &ep->fa, 0, NULL);
    if (n != 1) {
        cx_warn("libfabric: %s: fi_av_insert failed (%d)", b->prov, n);
        free(ep);
        return CX_EPEER;
    }
    cx_fi_av_later_cancel(b, ep->fa); /* the same address back: it stays */
    ep->b = b;
    ep->peer = peer;
    ep->exit_fd = -1;
    ep->peer_gen = gen;
    /* shm takes a spinlock inside the peer's shared region to queue a command; a peer killed
     * while holding it makes every later post spin forever (libfabric 1.17). The core's exit fd
     * (its same-host watch follows the peer's process) tells us the peer is gone before we post,
     * long before the control channel's verdict arrives. */
    if (shm && pid) {
        ep->pid = pid;
        ep->exit_fd = cx_core_peer_exit_fd(b->core, peer);
        cx_fi_shm_remember(ep, name, name_len);
        if (ep->shm_name[0]) ep->lockw = cx_fi_guard_add(b, ep, cx_core_peer_exit_fd(b->core, peer), ep->shm_name);
        uint32_t npid, ngen;
        uint64_t ninc;
        if (ep->shm_name[0] && !cx_fi_shm_parse(ep->shm_name, &npid, &ninc, &ngen) && npid == pid)
            cx_fi_bell_peer(ep, npid, ninc);
    }
    ep->next = b->eps;
    if (b->eps) b->eps->prev = ep;
    b->eps = ep;
    *out = ep;
    cx_fi_bell_tick(b);
    if (b->rot_gen) cx_fi_rot_tell(b, ep); /* it may have our HELLO from before the rotation */
    if (b->wb) {
        /* A write-back read needs rxm's connection in the target's direction too, and rxm
         * dials only at a first op (and does not send over a connection it accepted: one
         * side warming up still left the first read waiting ~100 ms for a dial): both sides
         * send a bare ack of sequence 0 (ignored by the receiver) now; the first read after a
         * (re)join then took ~7 ms instead of 130-290 ms (conformance_failure, debug log). */
        cx_fi_warm_send(b, ep, 0);
        /* The peer dials us as well: its connection is accepted inside fi_cq_read, with a
         * socket libfabric opens without close-on-exec. Sweep closely for a while, at a gap
         * that doubles from 1 ms (fi_cq.c, cx_fi_maybe_sweep). */
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        b->sweep_gap_ns = 1000000ull;
        b->sweep_hot_until_ns = (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec + 2000000000ull;
    }
    return CX_OK;
}

void cx_fi_disconnect(cx_backend_t *b, cx_bep_t *ep, int why)
{
    (void)why;
    if (!ep) return;
    /* Removing the address tears down the provider's connection to it (rxm closes its tcp
     * connection), so posted transfers stop moving bytes. shm: after a grace, while progress
     * drains what the peer had queued at us (fi_shm.c, cx_fi_av_remove_later). */
    if (!strcmp(b->prov, "shm") && !b->closing) {
        if (ep->tried && !ep->used)
            cx_fi_av_hold(b, ep->fa); /* fi_shm.c: its slot would stall the next peer */
        else
            cx_fi_av_remove_later(b, ep->fa);
    } else {
        int r = fi_av_remove(b->av, &ep->fa, 1, 0);
        if (r) cx_info("libfabric: %s: fi_av_remove: %s", b->prov, cx_fi_strerror(-r));
    }
    while (ep->ops) {
        cx_fi_op_t *op = ep->ops;
        cx_fi_op_finish(b, op, CX_EPEER); /* unlinks op from ep */
        if (op->tmp_mr && op->kind == CX_FOP_SEND) {
            /* The target may be pulling this message: revoke its access now. */
            fi_close(&op->tmp_mr->fid);
            op->tmp_mr = NULL;
        }
        /* Posted ops wait for their CQ entry, backlogged ones for the backlog to drop them, a
         * list's reads for their list (fi_list.c). */
        if (!op->posted && !op->in_backlog && !op->carrier) cx_fi_op_free(b, op);
    }
    cx_fi_guard_del(b, ep);
    cx_fi_shm_reap(ep);
    if (ep->exit_fd >= 0) close(ep->exit_fd);
    if (ep->prev)
        ep->prev->next = ep->next;
    else
        b->eps = ep->next;
    if (ep->next) ep->next->prev = ep->prev;
    free(ep);
    cx_fi_bell_tick(b); /* the peer that kept the tick fast may be gone */
}
