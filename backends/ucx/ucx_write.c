/* Writes applied by the target, on lanes where UCX would emulate the put (tcp: cx_ucx_tl_sw_get).
 *
 * UCX 1.13 emulates ucp_put_nbx there with active messages that the target serves inside UCX:
 * it copies the bytes in and sends a completion back from its own handler. When that completion
 * meets the writer's failed endpoint (the writer was killed with puts still in the target's
 * socket), UCX aborts the target's process ("unexpected error" in ucp_put_handler). Reads have
 * the same fault (ucp_get_req_handler) and go answered by the target (ucx_read.c).
 *
 * Here the writer sends the bytes itself (AM 16: incarnation, request id, address, length; the
 * bytes as the AM's data, always eager), and the target's handler checks the range against its
 * registry, copies the bytes in (the core's copy for device memory) and acks (AM 12) with the
 * status. A write goes in windows of at most CX_UCX_WRITE_SEG bytes, the next once the last is
 * acked and UCX is done with its header, so that the target reassembles at most one window per
 * write. A put_signal's signal follows the last window's ack: the target delivers it after
 * every byte is in place.
 *
 * What a stopped target applies after the writer's op timed out is what UCX's own emulation
 * would apply: bytes already in its socket when the writer's forced close reset the connection
 * are dropped with it.
 */
#include "ucx_int.h"

#include <string.h>

#define CX_UCX_WRITE_SEG (4u << 20)

/* ---- writer ---- */

static void cx_ucx_write_seg(cx_ucx_t *b, cx_ucx_op_t *op)
{
    const cx_xfer_t *x = op->x;
    size_t at, n = cx_rread_window(&op->rr, x->len, CX_UCX_WRITE_SEG, &at);
    op->req_id = ++b->next_req_id;
    op->sent = op->acked = 0;
    cx_ucx_ack_add(b, op);
    cx_wr_t w;
    cx_wr_init(&w, op->hdr, sizeof op->hdr);
    cx_ucx_wreq_hdr_put(&w,
                        &(cx_ucx_wreq_hdr_t){ .inc = b->inc, .req_id = op->req_id, .addr = x->remote + at, .len = n });
    ucp_request_param_t p;
    cx_ucx_param(&p, op, cx_ucx_am_sent_cb, x);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t r =
        cx_ucx_lib.ucp_am_send_nbx(op->ue->ep, CX_UCX_AM_WREQ, op->hdr, w.len, (const uint8_t *)x->local + at, n, &p);
    if (UCS_PTR_IS_ERR(r)) {
        cx_warn("ucx: sending a write failed: %s", cx_ucx_lib.ucs_status_string(UCS_PTR_STATUS(r)));
        cx_ucx_op_finish(b, op, cx_ucx_status(UCS_PTR_STATUS(r)));
    } else if (!r) {
        op->sent = 1;
    } else {
        op->pending++;
    }
}

void cx_ucx_write_send(cx_ucx_t *b, cx_ucx_op_t *op)
{
    op->stage = CX_UCX_OPS_WRITE;
    op->rr = (cx_rread_t){ 0 };
    cx_ucx_write_seg(b, op);
}

void cx_ucx_write_acked(cx_ucx_t *b, cx_ucx_op_t *op)
{
    if (op->ack_status != CX_OK) {
        cx_ucx_op_finish(b, op, op->ack_status);
        return;
    }
    op->rr.got = op->rr.win_end;
    if (op->rr.got < op->x->len)
        cx_ucx_write_seg(b, op);
    else if (op->x->kind == CX_XFER_PUT_SIGNAL)
        cx_ucx_send_am(b, op);
    else
        cx_ucx_op_finish(b, op, CX_OK);
}

/* ---- target ---- */

static ucs_status_t cx_ucx_am_wreq(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                                   const ucp_am_recv_param_t *prm)
{
    cx_ucx_wk_t *wk = arg;
    cx_ucx_t *b = wk->b;
    cx_ucx_wreq_hdr_t h;
    int rndv = (prm->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (cx_ucx_wreq_hdr_get(hdr, hlen, &h)) {
        cx_error("ucx: dropped a malformed write (%zu-byte header, %zu bytes of data)", hlen, len);
        cx_core_count_served(b->core, CX_XFER_WRITE, 0, 0);
        return UCS_OK;
    }
    ucp_ep_h reply_ep = cx_ucx_reply_ep(b, prm, CX_XFER_WRITE, h.req_id, "write");
    if (!reply_ep) return UCS_OK;
    int st;
    if (rndv || h.len != len || h.len > CX_UCX_WRITE_SEG) {
        cx_error("ucx: write %llu: %zu bytes%s for a %llu-byte range (at most %u, eager): refused",
                 (unsigned long long)h.req_id, len, rndv ? " by rendezvous" : "", (unsigned long long)h.len,
                 CX_UCX_WRITE_SEG);
        st = CX_EINVAL;
    } else {
        void *pin = NULL;
        st = cx_core_region_check(b->core, h.addr, len, &pin); /* logs a refusal */
        if (st == CX_OK) {
            void *dst = (void *)(uintptr_t)h.addr;
            if (cx_core_region_kind(b->core, h.addr, len) == CX_MEM_HOST)
                memcpy(dst, data, len);
            else
                st = cx_core_mem_copy(b->core, dst, data, len);
            cx_core_region_unpin(pin);
        }
    }
    cx_core_count_served(b->core, CX_XFER_WRITE, st == CX_OK ? len : 0, st == CX_OK);
    (void)cx_ucx_send_ack(b, wk, reply_ep, h.req_id, st);
    return UCS_OK;
}

int cx_ucx_write_am_init(cx_ucx_wk_t *wk, ucp_am_handler_param_t *p)
{
    p->id = CX_UCX_AM_WREQ;
    p->cb = cx_ucx_am_wreq;
    ucs_status_t st = cx_ucx_lib.ucp_worker_set_am_recv_handler(wk->w, p);
    if (st != UCS_OK) {
        cx_error("ucx: ucp_worker_set_am_recv_handler failed: %s", cx_ucx_lib.ucs_status_string(st));
        return CX_ERR;
    }
    return CX_OK;
}
