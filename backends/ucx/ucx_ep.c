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
    cx_ucx_ue_t *ue = arg;
    cx_bep_t *ep = ue->bep;
    if (!ep || ue->closed) return;
    if (ue != ep->ue) {
        /* A retiring ucp_ep (rotation) failed: the peer is reached on the current one. UCX fails
         * its own requests; ops of it still waiting for an ack would wait forever. */
        cx_warn("ucx: a retiring endpoint failed: %s", cx_ucx_lib.ucs_status_string(st));
        for (cx_ucx_op_t *op = ep->ops.next, *nx; op != &ep->ops; op = nx) {
            nx = op->next;
            if (op->ue == ue) cx_ucx_op_finish(ep->b, op, CX_EPEER);
        }
        cx_ucx_signal(ep->b);
        return;
    }
    if (ep->failed) return;
    ep->failed = 1;
    snprintf(ep->reason, sizeof ep->reason, "ucx: %s", cx_ucx_lib.ucs_status_string(st));
    /* A reset is the peer's kernel closing its connection: its process is gone. UCX 1.13's tcp
     * transport reports that as "Endpoint timeout" as often as "Connection reset", and an
     * unreachable peer the same way: all three mean the peer is gone. Anything else the core
     * probes. */
    ep->cause = st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_ENDPOINT_TIMEOUT || st == UCS_ERR_UNREACHABLE
        ? CX_CAUSE_PEER_GONE
        : CX_CAUSE_TRANSPORT;
    ep->err_queued = 1;
    ep->err_next = ep->b->errq;
    ep->b->errq = ep;
    /* UCX fails its own requests; ops waiting for an ack have none */
    while (ep->ops.next != &ep->ops) cx_ucx_op_finish(ep->b, ep->ops.next, CX_EPEER);
}

/* Which transports a ucp_ep really uses: UCX 1.13 has no query for it (ucp_ep_query gained
 * transports later), but ucp_ep_print_info lists its lanes. Reading them, not the configuration,
 * matters: with peer error handling UCX 1.13 leaves shared memory out, so a same-host pair
 * that the selection expected on shared memory runs over tcp. */
void cx_ucx_lanes_parse(const char *info, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (const char *l = info; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *q = strstr(l, "lane[");
        const char *eol = strchr(l, '\n');
        if (!q || (eol && q > eol)) continue;
        q = strchr(q, ':'); /* "lane[0]:  1:tcp/lo.0 md[0] ..." */
        if (!q || (eol && q > eol)) continue;
        q++;
        while (*q == ' ') q++;
        while (*q >= '0' && *q <= '9') q++;
        if (*q != ':') continue;
        q++;
        size_t t = 0;
        while (q[t] && q[t] != ' ' && q[t] != '\n' && q[t] != '\t') t++;
        if (!t || !memchr(q, '/', t)) continue;
        /* "tcp/lo.0": the ".0" is UCX's system device index, not part of the name */
        size_t cut = t;
        for (size_t k = t; k > 0 && q[k - 1] != '/'; k--) {
            if (q[k - 1] == '.') {
                int digits = k < t;
                for (size_t d = k; d < t; d++) digits &= q[d] >= '0' && q[d] <= '9';
                if (digits) cut = k - 1;
                break;
            }
        }
        char tok[64];
        if (cut >= sizeof tok) cut = sizeof tok - 1;
        memcpy(tok, q, cut);
        tok[cut] = 0;
        /* each transport once */
        int dup = 0;
        for (const char *s = buf; *s && !dup;) {
            size_t sl = strcspn(s, ",");
            dup = sl == cut && !memcmp(s, tok, cut);
            s += sl + (s[sl] == ',');
        }
        if (dup || len + cut + 2 > n) continue;
        len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? "," : "", tok);
    }
}

/* Whether UCX would emulate puts and gets on these lanes ("tcp/lo,posix/memory", as parsed
 * above) with active messages that it serves inside its own handlers at the target: none of them
 * reaches remote memory itself (tcp, the shared-memory FIFOs and ud cannot; rc, dc, cma, knem,
 * xpmem, gdr_copy and cuda_ipc can). Unknown lanes count as emulated: reads answered and writes
 * applied by the target (ucx_read.c, ucx_write.c) work on any lane. */
int cx_ucx_tl_sw_rma(const char *tl)
{
    static const char *const no_rma[] = { "tcp", "posix", "sysv", "ud", "ud_verbs", "ud_mlx5", NULL };
    if (!tl || !*tl) return 1;
    for (const char *s = tl; *s;) {
        size_t n = strcspn(s, ",");
        size_t name = strcspn(s, "/,");
        int emulated = 0;
        for (int i = 0; no_rma[i] && !emulated; i++)
            emulated = strlen(no_rma[i]) == name && !memcmp(s, no_rma[i], name);
        if (!emulated) return 0;
        s += n + (s[n] == ',');
    }
    return 1;
}

static void cx_ucx_ue_lanes(cx_ucx_ue_t *ue)
{
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    ue->tl[0] = 0;
    if (!f) return;
    cx_ucx_lib.ucp_ep_print_info(ue->ep, f);
    if (fclose(f) == 0 && text) {
        cx_ucx_lanes_parse(text, ue->tl, sizeof ue->tl);
        if (cx_log_level >= CX_LOG_DEBUG) fputs(text, stderr);
    }
    free(text);
    ue->sw_rma = cx_ucx_tl_sw_rma(ue->tl);
    cx_debug("ucx: endpoint lanes: %s (%s)", ue->tl[0] ? ue->tl : "unknown",
             ue->peer_mode ? "peer error handling" : "no peer error handling");
}

void cx_ucx_ep_transport(cx_backend_t *bb, cx_bep_t *ep, char *buf, size_t n)
{
    (void)bb;
    if (!n) return;
    buf[0] = 0;
    if (ep && ep->ue) snprintf(buf, n, "%s%s", ep->ue->tl, ep->cma.ok && !ep->ue->peer_mode ? " + connex cma" : "");
}

/* A ucp_ep on the current worker to the raw worker address `addr`, with peer error handling
 * where a transport can do it (else NONE, see below). *rc: why not. */
cx_ucx_ue_t *cx_ucx_ue_new(cx_ucx_t *b, cx_bep_t *ep, const void *addr, size_t len, int *rc)
{
    /* UCX reads the address in place and may read it unaligned-safe only from its own copy */
    void *copy = malloc(len);
    cx_ucx_ue_t *ue = calloc(1, sizeof *ue);
    if (!copy || !ue) {
        free(copy);
        free(ue);
        *rc = CX_ENOMEM;
        return NULL;
    }
    memcpy(copy, addr, len);
    ue->wk = b->cur;
    ue->bep = ep;
    ucp_ep_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = (const ucp_address_t *)copy;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = cx_ucx_err_cb;
    p.err_handler.arg = ue;
    ucs_status_t st = b->no_peer_mode ? UCS_ERR_UNREACHABLE : cx_ucx_lib.ucp_ep_create(ue->wk->w, &p, &ue->ep);
    if (st == UCS_ERR_UNREACHABLE) {
        /* UCX 1.13's sysv and posix transports cannot handle peer failure, so with UCX_TLS
         * limited to them (UCX_TLS=sm) no PEER endpoint exists. Without UCX's error handling
         * the core's control channel and heartbeat still detect a failed peer, and disconnect
         * still completes every xfer. */
        if (!b->no_peer_mode) /* the probe at open said it could */
            cx_info("ucx: no transport with peer error handling reaches this peer (UCX_TLS=%s); "
                    "using endpoints without it",
                    getenv("UCX_TLS") ? getenv("UCX_TLS") : "");
        p.field_mask &= ~(uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER;
        p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        st = cx_ucx_lib.ucp_ep_create(ue->wk->w, &p, &ue->ep);
        if (st == UCS_OK) b->no_peer_mode = 1; /* say it (and let UCX say it) once */
    } else if (st == UCS_OK) {
        ue->peer_mode = 1;
    }
    free(copy);
    if (st != UCS_OK) {
        cx_warn("ucx: ucp_ep_create failed: %s", cx_ucx_lib.ucs_status_string(st));
        free(ue);
        *rc = st == UCS_ERR_UNREACHABLE ? CX_EUNSUPPORTED : CX_EPEER;
        return NULL;
    }
    cx_ucx_ue_lanes(ue);
    ue->wk->open_ues++;
    *rc = CX_OK;
    return ue;
}

void cx_ucx_ue_unref(cx_ucx_ue_t *ue)
{
    if (ue->inflight > 0) ue->inflight--;
    if (ue->closed && !ue->inflight) free(ue);
}

int cx_ucx_connect(cx_backend_t *bb, void *peer, const void *addr, size_t addr_len, cx_bep_t **out)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    if (!b || !out) return CX_EINVAL;
    size_t n;
    const uint8_t *wa, *cma;
    if (cx_ucx_blob_ext_get(addr, addr_len, CX_UCX_ADDR_MAGIC, &wa, &n, CX_UCX_CMA_MAGIC, CX_CMA_ADV_LEN, &cma)) {
        cx_error("ucx: the peer's address blob (%zu bytes) is not a UCX worker address", addr_len);
        return CX_EINVAL;
    }
    cx_bep_t *ep = calloc(1, sizeof *ep);
    if (!ep || !(ep->paddr = malloc(n))) {
        free(ep);
        return CX_ENOMEM;
    }
    memcpy(ep->paddr, wa, n);
    ep->paddr_len = n;
    ep->b = b;
    ep->peer = peer;
    ep->ops.next = ep->ops.prev = &ep->ops;
    /* the peer may have rotated its worker since its HELLO: its update waits here (ucx_rot.c) */
    cx_ucx_upd_take(b, peer, ep);
    /* a peer that timed out and now has another address may have died mid-send (ucx_rot.c) */
    cx_ucx_hung_connect(b, peer, ep->paddr, ep->paddr_len);
    int rc;
    if (!(ep->ue = cx_ucx_ue_new(b, ep, ep->paddr, ep->paddr_len, &rc))) {
        free(ep->paddr);
        free(ep);
        return rc;
    }
    ep->peer_mode = ep->ue->peer_mode;
    cx_ucx_cma_connect(b, ep, cma);
    ep->next = &b->eps;
    ep->prev = b->eps.prev;
    b->eps.prev->next = ep;
    b->eps.prev = ep;
    /* Say which worker we are on now: the HELLO the peer connects with may be older than our
     * last rotation (the rule of ucx_rot.c: once the worker rotated, every connect sends one).
     * Before any rotation our address never changed: nothing to say. */
    if (b->rotations) (void)cx_ucx_send_update(b, ep->ue);
    *out = ep;
    return CX_OK;
}

cx_bep_t *cx_ucx_ep_of_peer(cx_ucx_t *b, void *peer)
{
    cx_bep_t *ce = cx_core_peer_ep(b->core, (cx_backend_t *)b, peer); /* every ack asks: O(1) */
    if (ce && !ce->failed) return ce;
    for (cx_bep_t *ep = b->eps.next; ep != &b->eps; ep = ep->next)
        if (ep->peer == peer && !ep->failed) return ep;
    return NULL;
}

/* Close a ucp_ep. force (disconnect): with peer error handling, a forced close, waited for
 * (bounded): once it completed, the transport endpoints are gone and no late DMA can land in an
 * xfer buffer. Otherwise (retiring endpoints after their xfers finished, or endpoints without
 * error handling) a flush close in the background. Either way an endpoint UCX keeps until the
 * worker is destroyed counts as a zombie of its worker (rotation, ucx_rot.c). */
void cx_ucx_ue_close(cx_ucx_t *b, cx_ucx_ue_t *ue, int force)
{
    cx_ucx_rkeys_drop(ue);
    ue->closed = 1;
    ue->bep = NULL;
    ue->wk->open_ues--;
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    /* UCX allows a forced close only with peer error handling (1.13 answers FORCE on a NONE
     * endpoint with UCS_ERR_INVALID_PARAM). Without it (shm-only UCX_TLS) the lanes are cma
     * (synchronous: nothing lands later) and mm (messages sent from copies we own), so the
     * flush close may finish in the background; UCX then keeps the endpoint until the worker
     * is destroyed (ucp_ep_disconnected: an endpoint with a remote connection is destroyed only
     * with the worker), so does a flush-closed PEER one. */
    int forced = force && ue->peer_mode;
    p.flags = forced ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = cx_ucx_lib.ucp_ep_close_nbx(ue->ep, &p);
    int zombie = !forced;
    if (UCS_PTR_IS_ERR(r)) {
        cx_warn("ucx: ucp_ep_close_nbx failed: %s", cx_ucx_lib.ucs_status_string(UCS_PTR_STATUS(r)));
        zombie = 1;
    } else if (r && !forced) {
        cx_ucx_lib.ucp_request_free(r);
    } else if (r) {
        uint64_t deadline = cx_ucx_now_ns() + (uint64_t)CX_UCX_CLOSE_MS * 1000000ull;
        while (cx_ucx_lib.ucp_request_check_status(r) == UCS_INPROGRESS) {
            if (cx_ucx_now_ns() > deadline) {
                cx_error("ucx: forced endpoint close still pending after %d ms", CX_UCX_CLOSE_MS);
                zombie = 1;
                break;
            }
            cx_ucx_lib.ucp_worker_progress(ue->wk->w);
        }
        cx_ucx_lib.ucp_request_free(r);
    }
    if (zombie) cx_ucx_zombie(b, ue->wk, !force);
    if (ue->wk != b->cur) cx_ucx_signal(b); /* its retired worker may go now (ucx_rot.c) */
    if (!ue->inflight) free(ue);
}

void cx_ucx_disconnect(cx_backend_t *bb, cx_bep_t *ep, int why)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    if (!b || !ep) return;
    /* messages that arrive meanwhile wait in the inbox: the core is inside this call */
    b->closing_ep++;
    cx_ucx_rx_doubt(b, ep, why);
    cx_ucx_ue_close(b, ep->ue, 1);
    ep->ue = NULL;
    while (ep->old) {
        cx_ucx_ue_t *ue = ep->old;
        ep->old = ue->next;
        cx_ucx_ue_close(b, ue, 1);
    }
    b->closing_ep--;
    free(ep->paddr);

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
