/* Target side of messages (plain and put_signal's) and the acks that complete them at the sender.
 *
 * A message names its sender by incarnation. The fast path delivers it inside the UCX callback.
 * Otherwise it goes to the inbox, in arrival order: rendezvous data still on its way, a sender the
 * core does not know yet (its HELLO can trail the first message by a moment), or a message that
 * arrives while the core is inside disconnect. The ack travels on this side's own endpoint to the
 * sender, or, when there is none yet, on UCX's reply endpoint (valid only inside the callback).
 */
#include "ucx_int.h"

#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>

/* wk: the worker ep is on (the ack's buffer goes with it if the request never completes) */
int cx_ucx_send_ack(cx_ucx_t *b, cx_ucx_wk_t *wk, ucp_ep_h ep, uint64_t req_id, int status)
{
    cx_ucx_ctl_t *c = cx_ucx_ctl_new(b, wk, CX_UCX_ACK_HDR_LEN); /* must outlive the send */
    if (!c) return CX_ENOMEM;
    cx_wr_t w;
    cx_wr_init(&w, c->buf, CX_UCX_ACK_HDR_LEN);
    cx_ucx_ack_hdr_put(&w, &(cx_ucx_ack_hdr_t){ .req_id = req_id, .status = (int32_t)status });
    ucp_request_param_t p;
    cx_ucx_param(&p, c, cx_ucx_ctl_send_cb, NULL);
    ucs_status_ptr_t r = cx_ucx_lib.ucp_am_send_nbx(ep, CX_UCX_AM_ACK, c->buf, w.len, NULL, 0, &p);
    if (UCS_PTR_IS_ERR(r)) {
        cx_warn("ucx: sending an ack failed: %s", cx_ucx_lib.ucs_status_string(UCS_PTR_STATUS(r)));
        cx_ucx_ctl_free(c);
        return CX_EPEER;
    }
    if (!r) cx_ucx_ctl_free(c);
    return CX_OK;
}

ucp_ep_h cx_ucx_reply_ep(cx_ucx_t *b, const ucp_am_recv_param_t *prm, int kind, uint64_t req_id, const char *what)
{
    if (prm->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) return prm->reply_ep;
    cx_error("ucx: %s %llu came without a reply endpoint: dropped", what, (unsigned long long)req_id);
    cx_core_count_served(b->core, kind, 0, 0);
    return NULL;
}

static void cx_ucx_count(cx_ucx_t *b, int kind, size_t len, int rc)
{
    if (rc == CX_EAGAIN) return; /* the core counts refusals itself */
    cx_core_count_served(b->core, kind, len, rc == CX_OK);
}

/* Deliver to the core and ack: on our endpoint to the peer, else on reply_ep (may be NULL) of
 * the worker wk that received it. */
static void cx_ucx_deliver(cx_ucx_t *b, void *peer, int kind, uint64_t req_id, const void *data, size_t len,
                           cx_ucx_wk_t *wk, ucp_ep_h reply_ep)
{
    int rc = cx_core_deliver_msg(b->core, peer, data, len);
    cx_ucx_count(b, kind, len, rc);
    cx_bep_t *ep = cx_ucx_ep_of_peer(b, peer);
    if (ep && ep->ue) {
        (void)cx_ucx_send_ack(b, ep->ue->wk, ep->ue->ep, req_id, rc);
    } else if (reply_ep) {
        (void)cx_ucx_send_ack(b, wk, reply_ep, req_id, rc);
    } else {
        cx_warn("ucx: no endpoint to ack message %llu on", (unsigned long long)req_id);
    }
}

static void cx_ucx_in_recv_cb(void *req, ucs_status_t st, size_t length, void *user)
{
    (void)length;
    cx_ucx_in_t *in = user;
    cx_ucx_lib.ucp_request_free(req);
    in->pending = 0;
    if (st == UCS_OK) {
        in->ready = 1;
    } else {
        cx_warn("ucx: receiving a message's data failed: %s", cx_ucx_lib.ucs_status_string(st));
        in->failed = 1;
    }
}

static ucs_status_t cx_ucx_am_msg(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                                  const ucp_am_recv_param_t *prm)
{
    cx_ucx_wk_t *wk = arg;
    cx_ucx_t *b = wk->b;
    cx_ucx_msg_hdr_t h;
    int bad = cx_ucx_msg_hdr_get(hdr, hlen, &h);
    int kind = h.kind;
    uint64_t inc = h.inc;
    uint64_t req_id = h.req_id;
    ucp_ep_h reply_ep = (prm->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? prm->reply_ep : NULL;
    int rndv = (prm->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (bad) {
        cx_error("ucx: dropped a malformed message header (%zu bytes)", hlen);
        cx_core_count_served(b->core, CX_XFER_MSG, len, 0);
        return UCS_OK;
    }
    if (len > CX_MSG_MAX) {
        cx_error("ucx: refused a %zu-byte message (max %u)", len, CX_MSG_MAX);
        cx_core_count_served(b->core, kind, len, 0);
        if (reply_ep) (void)cx_ucx_send_ack(b, wk, reply_ep, req_id, CX_EINVAL);
        return UCS_OK;
    }
    cx_debug("ucx: message %llu from %016llx on worker generation %u%s%s%s", (unsigned long long)req_id,
             (unsigned long long)inc, wk->gen, rndv ? " (rndv)" : "", b->in_head ? " (behind the inbox)" : "",
             b->closing_ep ? " (closing)" : "");
    if (!rndv && !b->in_head && !b->closing_ep) {
        void *peer = cx_core_peer_by_incarnation(b->core, inc);
        if (peer) {
            cx_ucx_deliver(b, peer, kind, req_id, data, len, wk, reply_ep);
            return UCS_OK;
        }
    }
    if (b->in_n >= CX_UCX_INBOX_MAX || b->in_bytes + len > CX_UCX_INBOX_BYTES) {
        cx_warn("ucx: inbox full (%zu messages, %zu bytes): refusing a message", b->in_n, b->in_bytes);
        if (reply_ep) (void)cx_ucx_send_ack(b, wk, reply_ep, req_id, CX_EAGAIN);
        return UCS_OK;
    }
    cx_ucx_in_t *in = calloc(1, sizeof *in);
    uint8_t *buf = malloc(len ? len : 1);
    if (!in || !buf) {
        free(in);
        free(buf);
        cx_error("ucx: out of memory holding a %zu-byte message", len);
        if (reply_ep) (void)cx_ucx_send_ack(b, wk, reply_ep, req_id, CX_EAGAIN);
        return UCS_OK;
    }
    in->kind = kind;
    in->inc = inc;
    in->req_id = req_id;
    in->data = buf;
    in->len = len;
    in->deadline_ns = cx_ucx_now_ns() + (uint64_t)CX_UCX_PARK_MS * 1000000ull;
    if (!rndv) {
        if (len) memcpy(buf, data, len);
        in->ready = 1;
    } else {
        ucp_request_param_t p;
        memset(&p, 0, sizeof p);
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.recv_am = cx_ucx_in_recv_cb;
        p.user_data = in;
        in->wk = wk;
        ucs_status_ptr_t r = cx_ucx_lib.ucp_am_recv_data_nbx(wk->w, data, buf, len, &p);
        if (UCS_PTR_IS_ERR(r)) {
            cx_warn("ucx: ucp_am_recv_data_nbx failed: %s", cx_ucx_lib.ucs_status_string(UCS_PTR_STATUS(r)));
            in->failed = 1;
        } else if (!r) {
            in->ready = 1;
        } else {
            in->pending = 1;
        }
    }
    if (b->in_tail)
        b->in_tail->next = in;
    else
        b->in_head = in;
    b->in_tail = in;
    b->in_n++;
    b->in_bytes += len;
    return UCS_OK;
}

static ucs_status_t cx_ucx_am_ack(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                                  const ucp_am_recv_param_t *prm)
{
    (void)data;
    (void)len;
    (void)prm;
    cx_ucx_t *b = ((cx_ucx_wk_t *)arg)->b;
    cx_ucx_ack_hdr_t h;
    if (cx_ucx_ack_hdr_get(hdr, hlen, &h)) {
        cx_error("ucx: dropped a malformed ack (%zu bytes)", hlen);
        return UCS_OK;
    }
    cx_debug("ucx: ack %llu status %d on worker generation %u", (unsigned long long)h.req_id, (int)h.status,
             ((cx_ucx_wk_t *)arg)->gen);
    cx_ucx_op_t *op = cx_ucx_ack_take(b, h.req_id);
    if (!op) { /* its endpoint was closed meanwhile */
        cx_debug("ucx: ack for unknown request %llu", (unsigned long long)h.req_id);
        return UCS_OK;
    }
    int status = h.status; /* the decoder maps codes a target cannot answer to CX_ERR */
    op->acked = 1;
    op->ack_status = status;
    if (op->sent) cx_ucx_acked(b, op);
    return UCS_OK;
}

int cx_ucx_am_init(cx_ucx_wk_t *wk)
{
    ucp_am_handler_param_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS | UCP_AM_HANDLER_PARAM_FIELD_CB |
        UCP_AM_HANDLER_PARAM_FIELD_ARG;
    p.flags = UCP_AM_FLAG_WHOLE_MSG;
    p.arg = wk;
    p.id = CX_UCX_AM_MSG;
    p.cb = cx_ucx_am_msg;
    ucs_status_t st = cx_ucx_lib.ucp_worker_set_am_recv_handler(wk->w, &p);
    if (st == UCS_OK) {
        p.id = CX_UCX_AM_ACK;
        p.cb = cx_ucx_am_ack;
        st = cx_ucx_lib.ucp_worker_set_am_recv_handler(wk->w, &p);
    }
    if (st == UCS_OK) {
        p.id = CX_UCX_AM_UPD;
        p.cb = cx_ucx_am_upd;
        st = cx_ucx_lib.ucp_worker_set_am_recv_handler(wk->w, &p);
    }
    if (st == UCS_OK) return cx_ucx_read_am_init(wk, &p) == CX_OK ? cx_ucx_write_am_init(wk, &p) : CX_ERR;
    if (st != UCS_OK) {
        cx_error("ucx: ucp_worker_set_am_recv_handler failed: %s", cx_ucx_lib.ucs_status_string(st));
        return CX_ERR;
    }
    return CX_OK;
}

static void cx_ucx_in_pop(cx_ucx_t *b)
{
    cx_ucx_in_t *in = b->in_head;
    b->in_head = in->next;
    if (!b->in_head) b->in_tail = NULL;
    b->in_n--;
    b->in_bytes -= in->len;
    free(in->data);
    free(in);
}

void cx_ucx_arm_timer(cx_ucx_t *b, long ms)
{
    /* one timer for every deadline (inbox retries, rotation grace): keep the earliest */
    uint64_t at = cx_ucx_now_ns() + (uint64_t)ms * 1000000ull;
    if (b->timer_armed && b->timer_ns <= at) return;
    b->timer_ns = at;
    struct itimerspec its;
    memset(&its, 0, sizeof its);
    its.it_value.tv_sec = ms / 1000;
    its.it_value.tv_nsec = (ms % 1000) * 1000000L;
    if (timerfd_settime(b->tfd, 0, &its, NULL) == 0) b->timer_armed = 1;
}

void cx_ucx_inbox_drain(cx_ucx_t *b)
{
    while (b->in_head) {
        cx_ucx_in_t *in = b->in_head;
        if (in->failed) {
            cx_ucx_in_pop(b);
            continue;
        }
        if (!in->ready) return; /* rendezvous data still coming: keep the order */
        void *peer = cx_core_peer_by_incarnation(b->core, in->inc);
        if (!peer) {
            if (cx_ucx_now_ns() < in->deadline_ns) {
                cx_ucx_arm_timer(b, 1); /* look again shortly */
                return;
            }
            cx_warn("ucx: dropped a message from unknown incarnation %016llx after %d ms", (unsigned long long)in->inc,
                    CX_UCX_PARK_MS);
            cx_core_count_served(b->core, in->kind, in->len, 0);
            cx_ucx_in_pop(b);
            continue;
        }
        /* unlink first: the core may call back into the backend while delivering */
        b->in_head = in->next;
        if (!b->in_head) b->in_tail = NULL;
        b->in_n--;
        b->in_bytes -= in->len;
        cx_ucx_deliver(b, peer, in->kind, in->req_id, in->data, in->len, NULL, NULL);
        free(in->data);
        free(in);
    }
}

/* At close, after the worker is gone (no callback can name an entry any more). */
void cx_ucx_inbox_free(cx_ucx_t *b)
{
    while (b->in_head) cx_ucx_in_pop(b);
}
