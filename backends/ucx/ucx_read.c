/* Reads answered by the target, on endpoints without peer error handling (UCX 1.13's shared
 * memory: posix / sysv FIFOs and cma).
 *
 * Such an endpoint cannot be force-closed, and UCX 1.13 emulates ucp_get_nbx there with active
 * messages that our own worker copies into the destination as they arrive: a get that timed out
 * could still land in the caller's buffer later. Before, those reads landed in a bounce buffer
 * copied out on success: one more copy of every byte (16 MiB: 0.66 ms, most of why ucx_shm reads
 * of 1-16 MiB took 1.6-2.5x the raw ucp_get loop).
 *
 * Here the reader asks (AM 14: request id, address, length) and the target answers (AM 15: an ack
 * header with the bytes as the AM's data) from its registered memory, after checking the range
 * against its registry (pinned until UCX is done with the send):
 *   - up to CX_UCX_READ_EAGER bytes the answer goes eager, through the FIFO, and the reader's
 *     handler copies it into the destination;
 *   - above, it goes by rendezvous: the reader's handler hands the destination to
 *     ucp_am_recv_data_nbx, and UCX fetches the bytes with one cma read (process_vm_readv) from
 *     the target's memory straight into it, run by the reader's own progress call.
 * Either way bytes reach the caller's buffer only from inside our handler, or from a receive
 * started there while the read was still waiting for them (it is then out of the ack table, and
 * a disconnect waits for that receive before it fails the read: cx_ucx_read_landed). An answer
 * that comes later finds no read, and is dropped: nothing can land after a timeout. Measured on
 * this VM in a bare UCX loop (tcp-less, UCX_TLS=posix,cma,self): 16 MiB 2.3-2.8 ms against 2.2
 * for ucp_get, 256 KiB 21-27 us against 30-37, 4-32 KiB eager within 0.1-0.5 us of it; rendezvous
 * below 64 KiB cost 2-4 us more than eager (docs/results.md, "Session 12").
 */
#include "ucx_int.h"

#include <stdlib.h>
#include <string.h>

#define CX_UCX_READ_EAGER (32u << 10)

/* ---- reader ---- */

/* The answer is in (or failed): the op finishes once its request has left as well. */
static void cx_ucx_read_answered(cx_ucx_t *b, cx_ucx_op_t *op, int status)
{
    op->acked = 1;
    op->ack_status = status;
    if (op->sent) cx_ucx_op_finish(b, op, status);
}

void cx_ucx_read_send(cx_ucx_t *b, cx_ucx_op_t *op)
{
    const cx_xfer_t *x = op->x;
    cx_wr_t w;
    cx_wr_init(&w, op->hdr, sizeof op->hdr);
    op->req_id = ++b->next_req_id;
    cx_ucx_rreq_hdr_put(&w, &(cx_ucx_rreq_hdr_t){ .inc = b->inc, .req_id = op->req_id,
                                                   .addr = x->remote, .len = x->len });
    op->stage = CX_UCX_OPS_AM;
    cx_ucx_ack_add(b, op);

    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = cx_ucx_am_sent_cb;
    p.user_data = op;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t r = ucp_am_send_nbx(op->ue->ep, CX_UCX_AM_RREQ, op->hdr, w.len, NULL, 0, &p);
    if (UCS_PTR_IS_ERR(r)) {
        cx_warn("ucx: sending a read request failed: %s", ucs_status_string(UCS_PTR_STATUS(r)));
        cx_ucx_op_finish(b, op, cx_ucx_status(UCS_PTR_STATUS(r)));
    } else if (r == NULL) {
        op->sent = 1;
    } else {
        op->pending++;
    }
}

static void cx_ucx_rdata_recv_cb(void *req, ucs_status_t st, size_t length, void *user)
{
    (void)length;
    cx_ucx_op_t *op = user;
    cx_ucx_t *b = op->b;
    ucp_request_free(req);
    op->landing = 0;
    if (op->finished || !op->x) {
        cx_ucx_op_release(b, op);
        return;
    }
    op->pending--;
    if (st != UCS_OK) cx_warn("ucx: receiving a read's data failed: %s", ucs_status_string(st));
    cx_ucx_read_answered(b, op, st == UCS_OK ? CX_OK : cx_ucx_status(st));
}

static ucs_status_t cx_ucx_am_rdata(void *arg, const void *hdr, size_t hlen, void *data,
                                    size_t len, const ucp_am_recv_param_t *prm)
{
    cx_ucx_wk_t *wk = arg;
    cx_ucx_t *b = wk->b;
    cx_ucx_ack_hdr_t h;
    if (cx_ucx_ack_hdr_get(hdr, hlen, &h)) {
        cx_error("ucx: dropped a malformed read answer (%zu-byte header)", hlen);
        return UCS_OK;   /* rendezvous data not taken: UCX tells the target */
    }
    cx_ucx_op_t *op = cx_ucx_ack_take(b, h.req_id);
    if (!op) {   /* timed out, or its endpoint was closed: nothing may land any more */
        cx_debug("ucx: answer for unknown read %llu dropped", (unsigned long long)h.req_id);
        return UCS_OK;
    }
    if (!op->x || op->x->kind != CX_XFER_READ) {
        cx_error("ucx: a read answer names request %llu, which is no read: failing it",
                 (unsigned long long)h.req_id);
        cx_ucx_read_answered(b, op, CX_EPEER);
        return UCS_OK;
    }
    if (h.status != CX_OK) {   /* the target refused the range (logged there) */
        cx_ucx_read_answered(b, op, h.status);
        return UCS_OK;
    }
    if (len != op->x->len) {
        cx_error("ucx: a %zu-byte answer to a %zu-byte read: failing it", len, op->x->len);
        cx_ucx_read_answered(b, op, CX_EPEER);
        return UCS_OK;
    }
    if (!(prm->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy(op->x->local, data, len);
        cx_ucx_read_answered(b, op, CX_OK);
        return UCS_OK;
    }
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = cx_ucx_rdata_recv_cb;
    p.user_data = op;
    if (op->x->local_mh) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p.memh = (ucp_mem_h)op->x->local_mh;
    }
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(wk->w, data, op->x->local, len, &p);
    if (UCS_PTR_IS_ERR(r)) {
        cx_warn("ucx: receiving a read's data failed: %s", ucs_status_string(UCS_PTR_STATUS(r)));
        cx_ucx_read_answered(b, op, cx_ucx_status(UCS_PTR_STATUS(r)));
    } else if (!r) {
        cx_ucx_read_answered(b, op, CX_OK);
    } else {
        op->pending++;
        op->landing = 1;   /* writes the caller's buffer until its callback */
    }
    return UCS_OK;
}

/* Before a disconnect fails the endpoint's ops: a receive of read data started while the read
 * waited must end first, so that nothing lands after the caller was told the read failed. Over
 * cma the fetch is synchronous and this finds none; the wait is for a transport that queues it. */
void cx_ucx_read_landed(cx_bep_t *ep, cx_ucx_wk_t *wk)
{
    uint64_t deadline = cx_ucx_now_ns() + (uint64_t)CX_UCX_CLOSE_MS * 1000000ull;
    for (;;) {
        const cx_ucx_op_t *op = ep->ops.next;
        while (op != &ep->ops && !op->landing) op = op->next;
        if (op == &ep->ops) return;
        if (cx_ucx_now_ns() > deadline) {
            cx_error("ucx: a read's data still arriving %d ms into a disconnect", CX_UCX_CLOSE_MS);
            return;
        }
        ucp_worker_progress(op->ue ? op->ue->wk->w : wk->w);
    }
}

/* ---- target ---- */

static ucs_status_t cx_ucx_am_rreq(void *arg, const void *hdr, size_t hlen, void *data,
                                   size_t len, const ucp_am_recv_param_t *prm)
{
    (void)data;
    cx_ucx_wk_t *wk = arg;
    cx_ucx_t *b = wk->b;
    cx_ucx_rreq_hdr_t h;
    ucp_ep_h reply_ep = (prm->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? prm->reply_ep : NULL;
    if (cx_ucx_rreq_hdr_get(hdr, hlen, &h) || len) {
        cx_error("ucx: dropped a malformed read request (%zu-byte header, %zu bytes of data)",
                 hlen, len);
        cx_core_count_served(b->core, CX_XFER_READ, 0, 0);
        return UCS_OK;
    }
    if (!reply_ep) {
        cx_error("ucx: read request %llu came without a reply endpoint: dropped",
                 (unsigned long long)h.req_id);
        cx_core_count_served(b->core, CX_XFER_READ, 0, 0);
        return UCS_OK;
    }
    void *pin = NULL;
    int st = cx_core_region_check(b->core, h.addr, (size_t)h.len, &pin);   /* logs a refusal */
    cx_ucx_ctl_t *c = cx_ucx_ctl_new(b, wk, CX_UCX_ACK_HDR_LEN);   /* lives until UCX is done */
    if (!c) {
        cx_core_region_unpin(pin);
        cx_error("ucx: out of memory answering read request %llu", (unsigned long long)h.req_id);
        cx_core_count_served(b->core, CX_XFER_READ, 0, 0);
        return UCS_OK;
    }
    c->pin = pin;
    cx_wr_t w;
    cx_wr_init(&w, c->buf, CX_UCX_ACK_HDR_LEN);
    cx_ucx_ack_hdr_put(&w, &(cx_ucx_ack_hdr_t){ .req_id = h.req_id, .status = (int32_t)st });
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = cx_ucx_ctl_send_cb;
    p.user_data = c;
    const void *src = NULL;
    size_t n = 0;
    if (st == CX_OK) {
        src = (const void *)(uintptr_t)h.addr;
        n = (size_t)h.len;
        if (n <= CX_UCX_READ_EAGER) {
            p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
            p.flags = UCP_AM_SEND_FLAG_EAGER;
        }
        if (cx_core_region_kind(b->core, h.addr, n) == CX_MEM_CUDA) {
            p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
            p.memory_type = UCS_MEMORY_TYPE_CUDA;
        }
    }
    ucs_status_ptr_t r = ucp_am_send_nbx(reply_ep, CX_UCX_AM_RDATA, c->buf, w.len, src, n, &p);
    if (UCS_PTR_IS_ERR(r)) {
        cx_warn("ucx: answering read request %llu failed: %s", (unsigned long long)h.req_id,
                ucs_status_string(UCS_PTR_STATUS(r)));
        st = CX_EPEER;
        cx_ucx_ctl_free(c);
    } else if (!r) {
        cx_ucx_ctl_free(c);
    }
    cx_core_count_served(b->core, CX_XFER_READ, n, st == CX_OK);
    return UCS_OK;
}

int cx_ucx_read_am_init(cx_ucx_wk_t *wk, ucp_am_handler_param_t *p)
{
    p->id = CX_UCX_AM_RREQ;
    p->cb = cx_ucx_am_rreq;
    ucs_status_t st = ucp_worker_set_am_recv_handler(wk->w, p);
    if (st == UCS_OK) {
        p->id = CX_UCX_AM_RDATA;
        p->cb = cx_ucx_am_rdata;
        st = ucp_worker_set_am_recv_handler(wk->w, p);
    }
    if (st != UCS_OK) {
        cx_error("ucx: ucp_worker_set_am_recv_handler failed: %s", ucs_status_string(st));
        return CX_ERR;
    }
    return CX_OK;
}
