/* Endpoints: created from the peer's worker address (never by sockaddr: UCX 1.13 client/server
 * endpoints only pick TCP lanes, worker-address ones reach shm, cma and RDMA), always with peer
 * error handling, closed by force. */
#include "ucx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cx_ucx_err_cb(void *arg, ucp_ep_h uep, ucs_status_t st)
{
    (void)uep;
    cx_bep_t *ep = arg;
    if (ep->failed) return;
    ep->failed = 1;
    snprintf(ep->reason, sizeof ep->reason, "ucx: %s", ucs_status_string(st));
    ep->err_queued = 1;
    ep->err_next = ep->b->errq;
    ep->b->errq = ep;
    /* UCX fails its own requests; ops waiting for an ack have none */
    while (ep->ops.next != &ep->ops) cx_ucx_op_finish(ep->b, ep->ops.next, CX_EPEER);
}

int cx_ucx_connect(cx_backend_t *bb, void *peer, const void *addr, size_t addr_len,
                   cx_bep_t **out)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    if (!b || !out) return CX_EINVAL;
    size_t n;
    const uint8_t *wa;
    if (cx_ucx_blob_get(addr, addr_len, CX_UCX_ADDR_MAGIC, &wa, &n)) {
        cx_error("ucx: the peer's address blob (%zu bytes) is not a UCX worker address",
                 addr_len);
        return CX_EINVAL;
    }
    /* UCX reads the address in place and may read it unaligned-safe only from its own copy */
    void *copy = malloc(n);
    cx_bep_t *ep = calloc(1, sizeof *ep);
    if (!copy || !ep) {
        free(copy);
        free(ep);
        return CX_ENOMEM;
    }
    memcpy(copy, wa, n);
    ep->b = b;
    ep->peer = peer;
    ep->ops.next = ep->ops.prev = &ep->ops;

    ucp_ep_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = (const ucp_address_t *)copy;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = cx_ucx_err_cb;
    p.err_handler.arg = ep;
    ucs_status_t st = b->no_peer_mode ? UCS_ERR_UNREACHABLE : ucp_ep_create(b->w, &p, &ep->ep);
    if (st == UCS_ERR_UNREACHABLE) {
        /* UCX 1.13's sysv and posix transports cannot handle peer failure, so with UCX_TLS
         * limited to them (UCX_TLS=sm) no PEER endpoint exists. Without UCX's error handling
         * the core's control channel and heartbeat still detect a failed peer, and disconnect
         * still completes every xfer. */
        if (!b->no_peer_mode)
            cx_info("ucx: no transport with peer error handling reaches this peer (UCX_TLS=%s); "
                    "using endpoints without it", getenv("UCX_TLS") ? getenv("UCX_TLS") : "");
        p.field_mask &= ~(uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER;
        p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        st = ucp_ep_create(b->w, &p, &ep->ep);
        if (st == UCS_OK) b->no_peer_mode = 1;   /* say it (and let UCX say it) once */
    } else if (st == UCS_OK) {
        ep->peer_mode = 1;
    }
    free(copy);
    if (st != UCS_OK) {
        cx_warn("ucx: ucp_ep_create failed: %s", ucs_status_string(st));
        free(ep);
        return st == UCS_ERR_UNREACHABLE ? CX_EUNSUPPORTED : CX_EPEER;
    }
    if (cx_log_level >= CX_LOG_DEBUG) ucp_ep_print_info(ep->ep, stderr);
    ep->next = &b->eps;
    ep->prev = b->eps.prev;
    b->eps.prev->next = ep;
    b->eps.prev = ep;
    *out = ep;
    return CX_OK;
}

cx_bep_t *cx_ucx_ep_of_peer(cx_ucx_t *b, void *peer)
{
    for (cx_bep_t *ep = b->eps.next; ep != &b->eps; ep = ep->next)
        if (ep->peer == peer && !ep->failed) return ep;
    return NULL;
}

/* Force-close and wait (bounded) for UCX to finish it: once the close request completed, the
 * transport endpoints are gone and no late DMA can land in an xfer buffer. */
static void cx_ucx_force_close(cx_ucx_t *b, cx_bep_t *ep)
{
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    /* UCX allows a forced close only with peer error handling (1.13 answers FORCE on a NONE
     * endpoint with UCS_ERR_INVALID_PARAM). Without it (shm-only UCX_TLS) the lanes are cma
     * (synchronous: nothing lands later) and mm (messages sent from copies we own), so the
     * flush close may finish in the background; UCX then keeps the endpoint until the worker
     * is destroyed (README: known limitation). */
    p.flags = ep->peer_mode ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep->ep, &p);
    if (r == NULL) return;
    if (UCS_PTR_IS_ERR(r)) {
        cx_warn("ucx: ucp_ep_close_nbx failed: %s", ucs_status_string(UCS_PTR_STATUS(r)));
        return;
    }
    if (!ep->peer_mode) {
        ucp_request_free(r);
        return;
    }
    uint64_t deadline = cx_ucx_now_ns() + (uint64_t)CX_UCX_CLOSE_MS * 1000000ull;
    while (ucp_request_check_status(r) == UCS_INPROGRESS) {
        if (cx_ucx_now_ns() > deadline) {
            cx_error("ucx: forced endpoint close still pending after %d ms", CX_UCX_CLOSE_MS);
            break;
        }
        ucp_worker_progress(b->w);
    }
    ucp_request_free(r);
}

void cx_ucx_disconnect(cx_backend_t *bb, cx_bep_t *ep)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    if (!b || !ep) return;
    /* messages that arrive meanwhile wait in the inbox: the core is inside this call */
    b->closing_ep++;
    cx_ucx_force_close(b, ep);
    b->closing_ep--;
    cx_ucx_rkeys_drop(ep);

    while (ep->ops.next != &ep->ops) cx_ucx_op_finish(b, ep->ops.next, CX_EPEER);
    /* hand back this endpoint's finished ops now (the contract); other endpoints' ops wait for
     * the next progress call */
    cx_ucx_op_t mine;
    mine.next = mine.prev = &mine;
    for (cx_ucx_op_t *op = b->done.next, *nx; op != &b->done; op = nx) {
        nx = op->next;
        if (op->ep == ep) {
            cx_ucx_list_del(op);
            cx_ucx_list_add(&mine, op);
        }
    }
    for (cx_bep_t **p = &b->errq; *p; p = &(*p)->err_next) {
        if (*p == ep) {
            *p = ep->err_next;
            break;
        }
    }
    ep->prev->next = ep->next;
    ep->next->prev = ep->prev;
    free(ep);
    /* the core may call back in (submit, disconnect) from xfer_done: the endpoint is gone by
     * now and the list is local */
    while (mine.next != &mine) cx_ucx_op_deliver(b, mine.next);
    if (b->done.next != &b->done || b->in_head || b->errq) cx_ucx_signal(b);
}
