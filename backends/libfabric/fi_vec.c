/* Vector ops: the reads and writes of one submit_batch call to one endpoint as one op of ours.
 * Each xfer is still one post (one remote range: shm's fast path takes no more, and makes a post
 * of several a command the target must serve), but with a context in the op's array instead of
 * an op of its own: one op allocated, linked to its endpoint and freed per run of a batch, not
 * per entry. What does not qualify (a message, a read served by write-back on tcp, a bad key, a
 * post the provider refuses, a peer's region locked) goes alone through cx_fi_submit, which
 * logs, queues and fails as for any xfer; so does everything after it in the call, which keeps
 * the endpoint's order. */
#include "fi_int.h"

#include "connex/log.h"

#include <stdlib.h>
#include <string.h>

/* The provider's address and key for x, when x may go in a vector op. */
static int takes(cx_backend_t *b, const cx_xfer_t *x, uint64_t *raddr, uint64_t *rkey)
{
    if (x->kind == CX_XFER_READ) {
        if (b->wb) return 0; /* tcp: a request the target answers (fi_wb.c) */
    } else if (x->kind != CX_XFER_WRITE) {
        return 0;
    }
    if (!x->len || !x->local || !x->local_mh || x->len > b->max_msg) return 0;
    if (!cx_fi_key_hit(b, x)) return cx_fi_key_cached(b, x, raddr, rkey) == CX_OK;
    *rkey = b->kc.key; /* the run's key, parsed for the xfer before */
    return cx_fi_key_target(&b->kc, x->remote, raddr) == CX_OK;
}

size_t cx_fi_vec_submit(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs)
{
    uint64_t raddr, rkey;
    if (n < 2 || b->owner || b->closing || !ep || ep->nq || !takes(b, xs[0], &raddr, &rkey) || cx_fi_peer_dead(ep))
        return 0;
    size_t cap = n < CX_FI_VEC_MAX ? n : CX_FI_VEC_MAX;
    cx_fi_op_t *op = cx_fi_op_new(b, CX_FOP_VEC, NULL, ep);
    if (!op) return 0;
    if (!(op->vent = malloc(cap * sizeof *op->vent))) {
        cx_fi_op_free(b, op);
        return 0;
    }
    size_t i = 0;
    for (; i < cap; i++) {
        cx_xfer_t *x = xs[i];
        if ((i && (!takes(b, x, &raddr, &rkey) || cx_fi_cma_wants(b, ep, x))) || cx_fi_lock_held(b, ep->lockw)) break;
        cx_fi_vent_t *v = &op->vent[i];
        v->c.type = CX_FI_CTX_VENT;
        v->op = op;
        v->x = x;
        void *desc = ((cx_fi_mh_t *)x->local_mh)->desc;
        struct iovec iov = { .iov_base = x->local, .iov_len = x->len };
        struct fi_rma_iov riov = { .addr = raddr, .len = x->len, .key = rkey };
        struct fi_msg_rma m = { .msg_iov = &iov,
                                .desc = &desc,
                                .iov_count = 1,
                                .addr = ep->fa,
                                .rma_iov = &riov,
                                .rma_iov_count = 1,
                                .context = &v->c.fc };
        uint64_t more = i + 1 < n && !b->shm_direct ? FI_MORE : 0;
        ep->tried = 1;
        /* A write completes when the data is at the target (cx_fi_write_dc). */
        ssize_t r = x->kind == CX_XFER_READ
            ? fi_readmsg(b->ep, &m, FI_COMPLETION | more)
            : fi_writemsg(b->ep, &m, FI_COMPLETION | more | (b->shm_direct ? 0 : FI_DELIVERY_COMPLETE));
        if (r) break; /* this one and the rest alone: queued on -FI_EAGAIN, failed otherwise */
        v->posted = 1;
        op->posted++;
        b->more_owed = more != 0;
        rcs[i] = CX_OK;
    }
    op->nvent = op->vleft = (uint32_t)i;
    if (i && !b->shm_direct)
        cx_fi_bell_ring(b, ep); /* commands the target serves (fi_bell.c) */
    else if (i)
        cx_fi_bell_posted(b, ep, (unsigned)i);
    if (!i) {
        cx_fi_op_free(b, op);
        return 0;
    }
    op->gen = b->rot_gen;
    if (!ep->used) {
        ep->used = 1;
        b->sweep_now = 1; /* rxm connects on the first op to a peer */
    }
    return i;
}

int cx_fi_vent_done(cx_backend_t *b, cx_fi_vent_t *v, int status)
{
    cx_fi_op_t *op = v->op;
    if (!v->posted) {
        cx_error("libfabric: %s: completion for a batch entry not posted", b->prov);
        return 0;
    }
    v->posted = 0;
    op->posted--;
    cx_xfer_t *x = v->x;
    if (x) {
        v->x = NULL;
        if (!--op->vleft) cx_fi_ep_unlink(op);
        cx_core_xfer_done(b->core, x, status);
    }
    if (op->posted || op->vleft) return 0;
    cx_fi_op_free(b, op);
    return 1;
}

void cx_fi_vec_finish(cx_backend_t *b, cx_fi_op_t *op, int status)
{
    cx_fi_ep_unlink(op);
    for (uint32_t i = 0; i < op->nvent; i++) {
        cx_xfer_t *x = op->vent[i].x;
        if (!x) continue;
        op->vent[i].x = NULL;
        op->vleft--;
        cx_core_xfer_done(b->core, x, status);
    }
}

void cx_fi_vec_abort(cx_backend_t *b, cx_fi_op_t *op, int status)
{
    for (uint32_t i = 0, n = op->nvent; i < n; i++)
        if (op->vent[i].posted && cx_fi_vent_done(b, &op->vent[i], status)) return;
}
