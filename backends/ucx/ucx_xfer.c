/* The initiator side of every xfer kind.
 *
 *   read        ucp_get_nbx; on endpoints without peer error handling, a request that the
 *               target answers with the bytes (ucx_read.c)
 *   write       ucp_put_nbx, then ucp_ep_flush_nbx: done when the data is in place at the peer
 *   put_signal  put, flush, then an active message with the signal; done when the target acked
 *               it (it delivers the message only after the flush, so after the data)
 *   msg         active message; done when the target acked it (delivered or refused: EAGAIN)
 *
 * Every xfer goes on the endpoint's current ucp_ep. After a rotation (ucx_rot.c) the endpoint
 * may still have messages in flight on a retiring ucp_ep, which reaches another worker of the
 * peer: a new message or put_signal waits here ("held") until those are acked, so that
 * messages from one sender still arrive in order.
 */
#include "ucx_int.h"

#include <stdlib.h>
#include <string.h>

/* Completing inline saves an epoll round trip (a few us, comparable to a 4 KiB shm get); the
 * guard keeps a chain of inline completions that each submit more from recursing deeply. Not
 * inside a batch's post: a completion hands its credit back, and the core would post the next
 * entry it admits alone, not with the rest of the batch. */
#define CX_UCX_INLINE_DEPTH 8

static void cx_ucx_complete_now(cx_ucx_t *b, cx_ucx_op_t *op, int status, int sync)
{
    cx_ucx_op_finish(b, op, status);
    if (sync && !b->in_batch && b->depth < CX_UCX_INLINE_DEPTH) {
        b->depth++;
        cx_ucx_op_deliver(b, op);
        b->depth--;
    } else {
        cx_ucx_signal(b);
    }
}

void cx_ucx_param(ucp_request_param_t *p, void *user, ucp_send_nbx_callback_t cb, const cx_xfer_t *x)
{
    memset(p, 0, sizeof *p);
    if (cb) {
        p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p->cb.send = cb;
        p->user_data = user;
    }
    if (x) {
        if (x->local_mh) {
            p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            p->memh = (ucp_mem_h)x->local_mh;
        }
        if (x->local_mem == CX_MEM_CUDA) {
            p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
            p->memory_type = UCS_MEMORY_TYPE_CUDA;
        }
    }
}

/* A get or a flush completed. */
static void cx_ucx_rma_cb(void *req, ucs_status_t st, void *user)
{
    cx_ucx_op_t *op = cx_ucx_req_done(req, user);
    if (!op) return;
    cx_ucx_t *b = op->b;
    if (st != UCS_OK) {
        cx_ucx_op_finish(b, op, cx_ucx_status(st));
    } else if (op->x->kind == CX_XFER_PUT_SIGNAL) {
        cx_ucx_send_am(b, op);
    } else {
        cx_ucx_op_finish(b, op, CX_OK);
    }
}

void cx_ucx_am_sent_cb(void *req, ucs_status_t st, void *user)
{
    cx_ucx_op_t *op = cx_ucx_req_done(req, user);
    if (!op) return;
    cx_ucx_t *b = op->b;
    if (st != UCS_OK) {
        cx_ucx_op_finish(b, op, cx_ucx_status(st));
        return;
    }
    op->sent = 1;
    if (op->acked) cx_ucx_acked(b, op);
}

void cx_ucx_acked(cx_ucx_t *b, cx_ucx_op_t *op)
{
    if (op->stage == CX_UCX_OPS_WRITE)
        cx_ucx_write_acked(b, op);
    else
        cx_ucx_op_finish(b, op, op->ack_status);
}

/* Failures finish the op (callers that may still refuse the xfer check op->finished). */
void cx_ucx_send_am(cx_ucx_t *b, cx_ucx_op_t *op)
{
    const cx_xfer_t *x = op->x;
    cx_wr_t w;
    cx_wr_init(&w, op->hdr, sizeof op->hdr);
    op->req_id = ++b->next_req_id;
    op->sent = op->acked = 0;
    cx_ucx_msg_hdr_put(&w, &(cx_ucx_msg_hdr_t){ .kind = (uint8_t)x->kind, .inc = b->inc, .req_id = op->req_id });
    op->stage = CX_UCX_OPS_AM;
    cx_ucx_ack_add(b, op);
    cx_debug("ucx: message %llu (kind %d) on worker generation %u", (unsigned long long)op->req_id, x->kind,
             op->ue->wk->gen);

    ucp_request_param_t p;
    cx_ucx_param(&p, op, cx_ucx_am_sent_cb, NULL);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t r = cx_ucx_lib.ucp_am_send_nbx(op->ue->ep, CX_UCX_AM_MSG, op->hdr, w.len,
                                                    op->msg_copy ? op->msg_copy : x->msg, x->msg_len, &p);
    if (UCS_PTR_IS_ERR(r)) {
        cx_warn("ucx: sending a message failed: %s", cx_ucx_lib.ucs_status_string(UCS_PTR_STATUS(r)));
        cx_ucx_op_finish(b, op, cx_ucx_status(UCS_PTR_STATUS(r)));
    } else if (r == NULL) {
        op->sent = 1;
    } else {
        op->pending++;
    }
}

/* put (its request released at once: the flush behind it completes after it), then flush. */
static ucs_status_ptr_t cx_ucx_put_flush(cx_ucx_ue_t *ue, cx_ucx_op_t *op, cx_xfer_t *x, ucp_rkey_h rk)
{
    ucp_request_param_t p;
    cx_ucx_param(&p, NULL, NULL, x);
    ucs_status_ptr_t r = cx_ucx_lib.ucp_put_nbx(ue->ep, x->local, x->len, x->remote, rk, &p);
    if (UCS_PTR_IS_ERR(r)) return r;
    if (r) cx_ucx_lib.ucp_request_free(r);
    op->stage = CX_UCX_OPS_FLUSH;
    cx_ucx_param(&p, op, cx_ucx_rma_cb, NULL);
    return cx_ucx_lib.ucp_ep_flush_nbx(ue->ep, &p);
}

/* The op could not start. sync (from submit): the xfer was not started, the op goes away and
 * submit returns the status. Otherwise (a held message started later) the op finishes with it. */
static int cx_ucx_not_started(cx_ucx_t *b, cx_ucx_op_t *op, int st, int sync)
{
    if (!sync) {
        cx_ucx_op_finish(b, op, st);
        cx_ucx_signal(b);
        return st;
    }
    if (op->counted_msg) {
        op->counted_msg = 0;
        op->ue->msgs--;
    }
    cx_ucx_op_drop(b, op);
    return st;
}

/* After sending a message or read request: one that finished at once was refused, and sync (from
 * submit) it was not started. */
static int cx_ucx_refused_at_once(cx_ucx_t *b, cx_ucx_op_t *op, int sync)
{
    if (!op->finished) return CX_OK;
    if (!sync) {
        cx_ucx_signal(b);
        return op->status;
    }
    int st = op->status;
    cx_ucx_op_drop(b, op);
    return st;
}

/* A same-host copy (ucx_cma.c), done here: a read or write ends now; a put_signal's message
 * follows, as after a flush that completed at once. */
static int cx_ucx_cma_start(cx_ucx_t *b, cx_ucx_op_t *op, const cx_ucx_rk_t *rec, int sync)
{
    int rc = op->copied ? op->copied_rc : cx_ucx_cma_copy(b, op->ep, op->x, rec);
    if (rc != CX_OK) return cx_ucx_not_started(b, op, rc, sync);
    if (op->x->kind == CX_XFER_PUT_SIGNAL) {
        cx_ucx_send_am(b, op);
        if (op->finished) cx_ucx_complete_now(b, op, op->status, sync);
        return CX_OK;
    }
    cx_ucx_complete_now(b, op, CX_OK, sync);
    return CX_OK;
}

static int cx_ucx_old_msgs(const cx_bep_t *ep)
{
    for (const cx_ucx_ue_t *ue = ep->old; ue; ue = ue->next)
        if (ue->msgs) return 1;
    return 0;
}

/* Post an op on its endpoint's current ucp_ep. */
static int cx_ucx_start(cx_ucx_t *b, cx_ucx_op_t *op, int sync)
{
    cx_bep_t *ep = op->ep;
    cx_xfer_t *x = op->x;
    cx_ucx_ue_t *ue = ep->ue;
    ucp_rkey_h rk = NULL;
    const cx_ucx_rk_t *rec = NULL;
    if (x->kind != CX_XFER_MSG) {
        int rc = cx_ucx_rkey_get(ue, x, &rk, &rec);
        if (rc != CX_OK) return cx_ucx_not_started(b, op, rc, sync);
    }
    op->ue = ue;
    ue->inflight++;
    int is_msg = x->kind == CX_XFER_MSG || x->kind == CX_XFER_PUT_SIGNAL;
    if (is_msg) {
        op->counted_msg = 1;
        ue->msgs++;
    }
    if (!ue->peer_mode && x->msg_len && is_msg) {
        if (!(op->msg_copy = malloc(x->msg_len))) return cx_ucx_not_started(b, op, CX_ENOMEM, sync);
        memcpy(op->msg_copy, x->msg, x->msg_len);
    }
    if (cx_ucx_cma_takes(b, ep, x, rec)) return cx_ucx_cma_start(b, op, rec, sync);
    ucs_status_ptr_t r = NULL;
    ucp_request_param_t p;
    switch (x->kind) {
    case CX_XFER_READ: {
        op->stage = CX_UCX_OPS_RMA;
        /* A timed-out read must never write the caller's buffer afterwards. With peer error
         * handling (tcp here; rc/dc on RDMA) the forced close that ends such an op (ucx_ep.c)
         * is waited for, and once it completed the transport endpoints are gone (rc: the QP;
         * tcp: the socket): the get lands in place (0 late landings in 48 timed-out reads of
         * conformance_failure_ucx_tcp and _poll, which check for it). Without it (shm-only
         * UCX_TLS) the endpoint cannot be force-closed and UCX emulates the get with active messages that could land
         * late: below CONNEX_UCX_READ_ANSWER_MIN (1 MiB) the get lands in a buffer of ours,
         * copied out only on success; from there on the target answers the read (ucx_read.c),
         * which saves that copy (16 MiB: 0.66 ms here) but costs more per read than UCX's own
         * emulation (4 KiB: 0.2-0.5 us). CONNEX_UCX_READ_BOUNCE=1: every host read bounces.
         * Where UCX would emulate the get with active messages with peer error handling (tcp
         * lanes), the target answers every read as well: UCX 1.13 serves an emulated get in its
         * own handler and aborts the target's process when the answer meets the reader's failed
         * endpoint (ucp_get_req_handler, "unexpected error"), as it does once a reader is
         * killed with requests still in the target's socket. */
        int none = !ue->peer_mode;
        if (x->len && x->local_mem == CX_MEM_HOST && (b->bounce_all || (none && x->len < b->answer_min))) {
            if (!cx_ucx_bounce_get(b, op, x->len)) return cx_ucx_not_started(b, op, CX_ENOMEM, sync);
            cx_ucx_param(&p, op, cx_ucx_rma_cb, NULL);
            r = cx_ucx_lib.ucp_get_nbx(ue->ep, op->bounce, x->len, x->remote, rk, &p);
            break;
        }
        if (x->len && x->local_mem == CX_MEM_HOST && (none || ue->sw_rma)) {
            cx_ucx_read_send(b, op);
            return cx_ucx_refused_at_once(b, op, sync);
        }
        cx_ucx_param(&p, op, cx_ucx_rma_cb, x);
        r = cx_ucx_lib.ucp_get_nbx(ue->ep, x->local, x->len, x->remote, rk, &p);
        break;
    }
    case CX_XFER_WRITE:
    case CX_XFER_PUT_SIGNAL:
        if (x->len && x->local_mem == CX_MEM_HOST && ue->sw_rma) { /* see ucx_write.c */
            cx_ucx_write_send(b, op);
            return cx_ucx_refused_at_once(b, op, sync);
        }
        r = cx_ucx_put_flush(ue, op, x, rk);
        break;
    case CX_XFER_MSG: cx_ucx_send_am(b, op); return cx_ucx_refused_at_once(b, op, sync);
    }
    if (UCS_PTR_IS_ERR(r)) {
        ucs_status_t st = UCS_PTR_STATUS(r);
        cx_warn("ucx: starting an xfer (kind %d, %zu bytes) failed: %s", x->kind, x->len,
                cx_ucx_lib.ucs_status_string(st));
        return cx_ucx_not_started(b, op, cx_ucx_status(st), sync);
    }
    if (r) {
        op->pending++;
        return CX_OK;
    }
    if (x->kind == CX_XFER_PUT_SIGNAL) {
        cx_ucx_send_am(b, op); /* the flush completed at once */
        if (op->finished) cx_ucx_complete_now(b, op, op->status, sync);
        return CX_OK;
    }
    cx_ucx_complete_now(b, op, CX_OK, sync);
    return CX_OK;
}

int cx_ucx_submit(cx_backend_t *bb, cx_bep_t *ep, cx_xfer_t *x)
{
    return cx_ucx_submit_copied(bb, ep, x, CX_UCX_NOT_COPIED);
}

int cx_ucx_submit_copied(cx_backend_t *bb, cx_bep_t *ep, cx_xfer_t *x, int copied)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    if (!b || !ep || !x) return CX_EINVAL;
    if (ep->failed) return CX_EPEER;
    switch (x->kind) {
    case CX_XFER_READ:
    case CX_XFER_WRITE:
    case CX_XFER_PUT_SIGNAL: {
        if (!x->local && x->len) {
            cx_error("ucx: xfer with a NULL local buffer");
            return CX_EINVAL;
        }
        ucp_rkey_h rk; /* checked now, so that a bad key fails the submit itself */
        int rc = cx_ucx_rkey_get(ep->ue, x, &rk, NULL);
        if (rc != CX_OK) return rc;
        break;
    }
    case CX_XFER_MSG: break;
    default: cx_error("ucx: unknown xfer kind %d", x->kind); return CX_EINVAL;
    }
    if ((x->kind == CX_XFER_MSG || x->kind == CX_XFER_PUT_SIGNAL) &&
        (x->msg_len > CX_MSG_MAX || (!x->msg && x->msg_len))) {
        cx_error("ucx: bad message (%zu bytes, max %u)", x->msg_len, CX_MSG_MAX);
        return CX_EINVAL;
    }

    cx_ucx_op_t *op = cx_ucx_op_new(b, ep, x);
    if (!op) return CX_ENOMEM;
    if (copied != CX_UCX_NOT_COPIED) {
        op->copied = 1;
        op->copied_rc = copied;
    }
    if ((x->kind == CX_XFER_MSG || x->kind == CX_XFER_PUT_SIGNAL) && (ep->held || cx_ucx_old_msgs(ep))) {
        op->stage = CX_UCX_OPS_HELD; /* cx_ucx_start_held posts it */
        ep->held++;
        b->retiring = 1;
        cx_ucx_signal(b); /* look again at the next progress, whatever wakes it */
        cx_debug("ucx: message held (%d held) behind a retiring endpoint's", ep->held);
        return CX_OK;
    }
    return cx_ucx_start(b, op, 1);
}

/* Post the held messages, in order, once no retiring ucp_ep of the endpoint has one in flight.
 * Completions are only recorded here (the caller's drain delivers them): the core could
 * disconnect this endpoint from inside a completion. */
void cx_ucx_start_held(cx_ucx_t *b, cx_bep_t *ep)
{
    while (ep->held && !ep->failed && !cx_ucx_old_msgs(ep)) {
        cx_ucx_op_t *op = ep->ops.next;
        while (op != &ep->ops && op->stage != CX_UCX_OPS_HELD) op = op->next;
        if (op == &ep->ops) { /* cannot happen: the count says one is there */
            ep->held = 0;
            break;
        }
        ep->held--;
        op->stage = CX_UCX_OPS_RMA;
        cx_debug("ucx: held message started (%d still held)", ep->held);
        (void)cx_ucx_start(b, op, 0);
    }
}

/* The ops a rescue took off a retired worker (ucx_rot.c, cx_ucx_rescue), posted again on the
 * current ucp_ep in the order they were submitted; completions only recorded, as above. */
void cx_ucx_start_moved(cx_ucx_t *b, cx_bep_t *ep)
{
    for (cx_ucx_op_t *op = ep->ops.next, *nx; op != &ep->ops; op = nx) {
        nx = op->next; /* a failed start takes op off the list, nothing else */
        if (op->stage != CX_UCX_OPS_MOVED) continue;
        op->stage = CX_UCX_OPS_RMA;
        if (ep->failed)
            cx_ucx_not_started(b, op, CX_EPEER, 0);
        else
            (void)cx_ucx_start(b, op, 0);
    }
}

/* A batch's xfers to one endpoint: same-host copies first, many per system call (ucx_cma.c),
 * each one copied completed at once, without an op of ours (the core's completion of a batch's
 * xfer only counts it: backend.h allows it inside the call); then every other xfer posted, then
 * one progress of the worker, which puts them on the wire together (a get's request, a put's
 * bytes) instead of each waiting for the core's next poll. Completions that progress finds are
 * delivered at the core's next turn (the signal wakes it), as every op's of ours is. */
void cx_ucx_submit_batch(cx_backend_t *bb, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    for (size_t i = 0; i < n; i++) rcs[i] = CX_UCX_NOT_COPIED;
    if (b && ep) cx_ucx_cma_batch(b, ep, xs, n, rcs);
    if (b) b->in_batch = 1;
    for (size_t i = 0; i < n; i++) {
        if (b && rcs[i] == CX_OK) {
            cx_core_xfer_done(b->core, xs[i], CX_OK);
            continue;
        }
        rcs[i] = cx_ucx_submit_copied(bb, ep, xs[i], rcs[i]);
    }
    if (b) b->in_batch = 0;
    if (b && b->cur && !b->cur->wedged && cx_ucx_lib.ucp_worker_progress(b->cur->w)) cx_ucx_signal(b);
}
