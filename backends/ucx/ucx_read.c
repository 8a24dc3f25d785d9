/* Reads answered by the target: on endpoints without peer error handling (UCX 1.13's shared
 * memory: posix / sysv FIFOs and cma), and on lanes where UCX would emulate the get with active
 * messages (tcp: see cx_ucx_tl_sw_rma, and ucx_write.c for why UCX's own emulation is not used
 * there).
 *
 * Such an endpoint cannot be force-closed, and UCX 1.13 emulates ucp_get_nbx there with active
 * messages that our own worker copies into the destination as they arrive: a get that timed out
 * could still land in the caller's buffer later. A bounce buffer copied out on success would
 * avoid that at one more copy of every byte (16 MiB: 0.66 ms, most of why ucx_shm reads of
 * 1-16 MiB took 1.6-2.5x the raw ucp_get loop that way).
 *
 * Here the reader asks (AM 14: request id, address, length) and the target answers (AM 15) from
 * its registered memory, after checking the range against its registry (pinned until UCX is done
 * with the answer): parts of at most CX_UCX_READ_PART bytes, each one eager message through the
 * FIFO (header: request id, status, offset), which the reader's handler copies into the caller's
 * buffer. That is what UCX's own get emulation does (the target copies into the FIFO, the reader
 * out of it, both at once), so it runs at the raw loop's pace; bytes reach the caller's buffer
 * only from inside the handler, and only while the read is in the ack table: an answer that comes
 * after the read failed finds no read and is dropped. Nothing can land after a timeout.
 *
 * Not by rendezvous, although UCX fetches a rendezvous answer with one cma read straight into the
 * caller's buffer (16 MiB in 2.3-2.8 ms against 2.2 for ucp_get in a bare loop, and far less
 * hurt on a busy host): a cma read from a target that died fails the endpoint inside UCX, and
 * without peer error handling UCX 1.13 then aborted on the next put completion from that peer
 * (`Assertion worker->flush_ops_count > 0' in ucp_rma_cmpl_handler, conformance_failure_ucx_shm,
 * test_kill9_during_transfers).
 *
 * A read asks for CX_UCX_READ_SEG bytes at a time, the next once the last is in, so that the
 * target never holds more than that many parts' headers and UCX requests for one read.
 */
#include "ucx_int.h"

#include <stdlib.h>
#include <string.h>

/* One posix FIFO element is 8256 bytes in UCX 1.13 (UCX_POSIX_SEG_SIZE): a part with its headers
 * fits in one, so it goes as a single eager fragment (larger ones are reassembled by UCX and
 * copied once more). On tcp (endpoints with peer error handling) the handler call per part
 * costs more than that copy: a 16 MiB read in 8000-byte parts ran at 1.0 GB/s here, in 1 MiB
 * parts at 3.2 GB/s. */
#define CX_UCX_READ_PART 8000u
#define CX_UCX_READ_PART_TCP (1u << 20)
#define CX_UCX_READ_SEG (4u << 20)

/* ---- reader ---- */

static void cx_ucx_rreq_sent_cb(void *req, ucs_status_t st, void *user)
{
    cx_ucx_op_t *op = cx_ucx_req_done(req, user);
    if (op && st != UCS_OK) cx_ucx_op_finish(op->b, op, cx_ucx_status(st));
}

/* Ask for the next segment of the read, at most CX_UCX_READ_SEG. */
static void cx_ucx_read_ask(cx_ucx_t *b, cx_ucx_op_t *op)
{
    const cx_xfer_t *x = op->x;
    size_t at, n = cx_rread_window(&op->rr, x->len, CX_UCX_READ_SEG, &at);
    cx_wr_t w;
    cx_wr_init(&w, op->hdr, sizeof op->hdr); /* the last request was answered: UCX is done with it */
    cx_ucx_rreq_hdr_put(&w,
                        &(cx_ucx_rreq_hdr_t){ .inc = b->inc, .req_id = op->req_id, .addr = x->remote + at, .len = n });
    ucp_request_param_t p;
    cx_ucx_param(&p, op, cx_ucx_rreq_sent_cb, NULL);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t r = cx_ucx_lib.ucp_am_send_nbx(op->ue->ep, CX_UCX_AM_RREQ, op->hdr, w.len, NULL, 0, &p);
    if (UCS_PTR_IS_ERR(r)) {
        cx_warn("ucx: sending a read request failed: %s", cx_ucx_lib.ucs_status_string(UCS_PTR_STATUS(r)));
        cx_ucx_op_finish(b, op, cx_ucx_status(UCS_PTR_STATUS(r)));
    } else if (r) {
        op->pending++;
    }
}

void cx_ucx_read_send(cx_ucx_t *b, cx_ucx_op_t *op)
{
    op->stage = CX_UCX_OPS_AM;
    op->req_id = ++b->next_req_id;
    op->rr = (cx_rread_t){ 0 };
    cx_ucx_ack_add(b, op);
    cx_ucx_read_ask(b, op);
}

/* Out of the ack table: later parts of its answer are dropped. */
static void cx_ucx_read_end(cx_ucx_t *b, cx_ucx_op_t *op, int status)
{
    (void)cx_ucx_ack_take(b, op->req_id);
    cx_ucx_op_finish(b, op, status);
}

static ucs_status_t cx_ucx_am_rdata(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                                    const ucp_am_recv_param_t *prm)
{
    cx_ucx_t *b = ((cx_ucx_wk_t *)arg)->b;
    cx_ucx_rdata_hdr_t h;
    if (cx_ucx_rdata_hdr_get(hdr, hlen, &h)) {
        cx_error("ucx: dropped a malformed read answer (%zu-byte header)", hlen);
        return UCS_OK;
    }
    cx_ucx_op_t *op = cx_ucx_ack_find(b, h.req_id);
    if (!op) { /* timed out, or its endpoint was closed: nothing may land any more */
        cx_debug("ucx: answer for unknown read %llu dropped", (unsigned long long)h.req_id);
        return UCS_OK;
    }
    if (!op->x || op->x->kind != CX_XFER_READ) {
        cx_error("ucx: a read answer names request %llu, which is no read: failing it", (unsigned long long)h.req_id);
        cx_ucx_read_end(b, op, CX_EPEER);
        return UCS_OK;
    }
    if (h.status != CX_OK) { /* the target refused the range (logged there) */
        cx_ucx_read_end(b, op, h.status);
        return UCS_OK;
    }
    /* in order (one FIFO, one sender), never past what was asked for */
    /* in order (one FIFO, one sender), never past what was asked for; offsets are the segment's */
    size_t seg = op->rr.win;
    int rndv = (prm->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    int r = rndv || h.offset > op->x->len - seg
        ? CX_RREAD_BAD
        : cx_rread_take(&op->rr, op->x->local, op->x->len, seg + (size_t)h.offset, data, len);
    if (r == CX_RREAD_BAD) {
        cx_error("ucx: read %llu: a %zu-byte answer at offset %llu, expected one at %zu of %zu%s: "
                 "failing it",
                 (unsigned long long)h.req_id, len, (unsigned long long)h.offset, op->rr.got - seg,
                 op->rr.win_end - seg, rndv ? " (by rendezvous)" : "");
        cx_ucx_read_end(b, op, CX_EPEER);
    } else if (r == CX_RREAD_DONE) {
        cx_ucx_read_end(b, op, CX_OK);
    } else if (r == CX_RREAD_ASK) {
        cx_ucx_read_ask(b, op);
    }
    return UCS_OK;
}

/* ---- target ---- */

/* The answer to one read request, as parts from src (n bytes; none with a refusal), on ep. The
 * parts' headers live in one control buffer that carries the pin, freed once UCX completed every
 * part (or with the worker: a reader that died never takes them). */
static void cx_ucx_answer(cx_ucx_t *b, cx_ucx_wk_t *wk, ucp_ep_h ep, uint64_t req_id, int st, const uint8_t *src,
                          size_t n, int mem_kind, void *pin)
{
    size_t part = b->no_peer_mode ? CX_UCX_READ_PART : CX_UCX_READ_PART_TCP;
    size_t parts = cx_rread_parts(n, part);
    cx_ucx_ctl_t *c = cx_ucx_ctl_new(b, wk, parts * CX_UCX_RDATA_HDR_LEN);
    if (!c) {
        cx_core_region_unpin(pin);
        cx_error("ucx: out of memory answering read request %llu", (unsigned long long)req_id);
        return;
    }
    c->pin = pin;
    ucp_request_param_t p;
    cx_ucx_param(&p, c, cx_ucx_ctl_send_cb, NULL);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    if (mem_kind == CX_MEM_CUDA) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        p.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    for (size_t i = 0; i < parts; i++) {
        size_t off, len = cx_rread_part(n, part, i, &off);
        uint8_t *hb = c->buf + i * CX_UCX_RDATA_HDR_LEN;
        cx_wr_t w;
        cx_wr_init(&w, hb, CX_UCX_RDATA_HDR_LEN);
        cx_ucx_rdata_hdr_put(&w, &(cx_ucx_rdata_hdr_t){ .req_id = req_id, .status = st, .offset = off });
        ucs_status_ptr_t r =
            cx_ucx_lib.ucp_am_send_nbx(ep, CX_UCX_AM_RDATA, hb, w.len, len ? src + off : NULL, len, &p);
        if (UCS_PTR_IS_ERR(r)) { /* the reader's op times out */
            cx_warn("ucx: answering read request %llu failed: %s", (unsigned long long)req_id,
                    cx_ucx_lib.ucs_status_string(UCS_PTR_STATUS(r)));
            break;
        }
        if (r) c->refs++;
    }
    cx_ucx_ctl_unref(c); /* ours: what is left pending holds it */
}

static ucs_status_t cx_ucx_am_rreq(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                                   const ucp_am_recv_param_t *prm)
{
    (void)data;
    cx_ucx_wk_t *wk = arg;
    cx_ucx_t *b = wk->b;
    cx_ucx_rreq_hdr_t h;
    if (cx_ucx_rreq_hdr_get(hdr, hlen, &h) || len || h.len > CX_UCX_READ_SEG) {
        cx_error("ucx: dropped a malformed read request (%zu-byte header, %zu bytes of data)", hlen, len);
        cx_core_count_served(b->core, CX_XFER_READ, 0, 0);
        return UCS_OK;
    }
    ucp_ep_h reply_ep = cx_ucx_reply_ep(b, prm, CX_XFER_READ, h.req_id, "read request");
    if (!reply_ep) return UCS_OK;
    void *pin = NULL;
    int st = cx_core_region_check(b->core, h.addr, (size_t)h.len, &pin); /* logs a refusal */
    size_t n = st == CX_OK ? (size_t)h.len : 0;
    int kind = n ? cx_core_region_kind(b->core, h.addr, n) : CX_MEM_HOST;
    cx_ucx_answer(b, wk, reply_ep, h.req_id, st, (const uint8_t *)(uintptr_t)h.addr, n, kind, pin);
    cx_core_count_served(b->core, CX_XFER_READ, n, st == CX_OK);
    return UCS_OK;
}

int cx_ucx_read_am_init(cx_ucx_wk_t *wk, ucp_am_handler_param_t *p)
{
    p->id = CX_UCX_AM_RREQ;
    p->cb = cx_ucx_am_rreq;
    ucs_status_t st = cx_ucx_lib.ucp_worker_set_am_recv_handler(wk->w, p);
    if (st == UCS_OK) {
        p->id = CX_UCX_AM_RDATA;
        p->cb = cx_ucx_am_rdata;
        st = cx_ucx_lib.ucp_worker_set_am_recv_handler(wk->w, p);
    }
    if (st != UCS_OK) {
        cx_error("ucx: ucp_worker_set_am_recv_handler failed: %s", cx_ucx_lib.ucs_status_string(st));
        return CX_ERR;
    }
    return CX_OK;
}
