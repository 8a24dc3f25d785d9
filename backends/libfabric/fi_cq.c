/* Progress: drain the CQ, serve incoming messages, re-arm the wait object (fi_trywait).
 *
 * tcp;ofi_rxm and shm progress manually: a one-sided read stalls until the target's CQ is
 * driven, so the target must wake on the CQ's fd, never sleep-and-poll. */
#include "fi_int.h"

#include "connex/log.h"
#include "connex/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define CX_FI_CQ_BATCH 32
#define CX_FI_CQ_MAX 512 /* entries per progress call, so the control channel is served */

int cx_fi_tx_get(cx_backend_t *b)
{
    return b->ntxfree ? b->txfree[--b->ntxfree] : -1;
}

void cx_fi_tx_put(cx_backend_t *b, int i)
{
    b->txfree[b->ntxfree++] = i;
}

int cx_fi_rx_post(cx_backend_t *b, cx_fi_rx_t *rx)
{
    ssize_t r;
    /* Receive buffers are reposted from the progress loop: -FI_EAGAIN only means the provider
     * is momentarily full; it drains as we read the CQ. */
    for (int i = 0; i < 1000; i++) {
        r = fi_recv(b->ep, rx->buf, CX_FI_BUF, fi_mr_desc(b->rxmr), FI_ADDR_UNSPEC, &rx->c.fc);
        if (r != -FI_EAGAIN) break;
        fi_cq_read(b->cq, NULL, 0);
    }
    if (r) cx_warn("libfabric: %s: fi_recv: %s", b->prov, cx_fi_strerror((int)-r));
    rx->posted = r == 0;
    rx->gen = b->rot_gen;
    return (int)r;
}

static void cx_fi_send_ack(cx_backend_t *b, cx_bep_t *ep, void *peer, uint64_t seq, int status)
{
    if (!ep) {
        cx_warn("libfabric: no endpoint to answer a message from a known peer; dropped");
        return;
    }
    cx_fi_op_t *op = cx_fi_op_new(b, CX_FOP_ACK, NULL, ep);
    if (!op) {
        cx_error("libfabric: out of memory for an ack; the sender will time out");
        return;
    }
    op->peer = peer;
    op->ack_seq = seq;
    op->ack_val = status;
    int r = cx_fi_start(b, op);
    if (r) {
        cx_warn("libfabric: %s: ack: %s", b->prov, cx_fi_strerror(-r));
        cx_fi_op_free(b, op);
    }
}

static void cx_fi_deliver(cx_backend_t *b, void *peer, int sig, uint64_t seq, const void *data, size_t len)
{
    int st = cx_core_deliver_msg(b->core, peer, data, len);
    cx_core_count_served(b->core, sig ? CX_XFER_PUT_SIGNAL : CX_XFER_MSG, len, st == CX_OK);
    cx_fi_send_ack(b, cx_fi_ep_by_peer(b, peer), peer, seq, st);
}

static void cx_fi_pull_start(cx_backend_t *b, void *peer, int sig, uint64_t seq, const uint8_t *body, size_t blen)
{
    cx_fi_rts_t rts;
    int bad = cx_fi_rts_get(body, blen, &rts);
    uint64_t len = rts.len, addr = rts.addr, key = rts.key;
    cx_bep_t *ep = cx_fi_ep_by_peer(b, peer);
    if (bad) {
        cx_warn("libfabric: malformed large-message header (len %llu)", (unsigned long long)len);
        cx_core_count_served(b->core, sig ? CX_XFER_PUT_SIGNAL : CX_XFER_MSG, 0, 0);
        cx_fi_send_ack(b, ep, peer, seq, CX_EINVAL);
        return;
    }
    if (!ep) {
        cx_warn("libfabric: large message from a peer without endpoint; dropped");
        return;
    }
    cx_fi_op_t *op = cx_fi_op_new(b, CX_FOP_PULL, NULL, ep);
    int rc = CX_ENOMEM;
    if (op) {
        op->peer = peer;
        op->mtype = sig ? CX_FM_SIG : CX_FM_MSG;
        op->ack_seq = seq;
        op->r_addr = addr;
        op->r_key = key;
        op->r_len = len;
        op->tmp_buf = malloc(len);
        if (op->tmp_buf && !cx_fi_mr_reg(b, op->tmp_buf, len, FI_READ | FI_REMOTE_WRITE, CX_MEM_HOST, &op->tmp_mr)) {
            if (b->wb) cx_fi_ack_add(b, op); /* the sender answers the write-back under this seq */
            if (!cx_fi_start(b, op)) return;
            rc = CX_ERR;
        }
        cx_fi_op_free(b, op);
    }
    cx_warn("libfabric: cannot pull a %llu-byte message", (unsigned long long)len);
    cx_core_count_served(b->core, sig ? CX_XFER_PUT_SIGNAL : CX_XFER_MSG, 0, 0);
    cx_fi_send_ack(b, ep, peer, seq, rc);
}

static void cx_fi_pull_end(cx_backend_t *b, cx_fi_op_t *op, int status);

void cx_fi_on_ack(cx_backend_t *b, uint64_t seq, int32_t status)
{
    cx_fi_op_t *op = cx_fi_ack_take(b, seq);
    if (!op) {
        cx_debug("libfabric: ack for unknown op %llu (completed already)", (unsigned long long)seq);
        return;
    }
    op->ack_got = 1;
    op->ack_status = status;
    if (op->kind == CX_FOP_PULL) { /* write-back pull: the sender wrote (or failed) */
        if (op->send_done) cx_fi_pull_end(b, op, status);
        return;
    }
    if (op->send_done) {
        cx_fi_op_finish(b, op, status);
        cx_fi_op_free(b, op);
    }
}

/* A request that needs an answer, from a peer we hold no endpoint for: the core dropped it after
 * a transport error and makes a new one for an op of its own only. Answering needs it (the
 * peer's address-vector entry), so the request waits here, a copy, while the core makes one
 * (cx_core_peer_want_ep), and is served then; dropped after CX_FI_PARKED_NS (its requester
 * times out, as it did when every such request was dropped: conformance_cause_libfabric_tcp,
 * a read right after the probe's answer). Returns 1 when held. */
static void cx_fi_retry_tick(cx_backend_t *b);

static int cx_fi_park(cx_backend_t *b, void *peer, const uint8_t *buf, size_t len)
{
    if (b->n_parked == CX_FI_PARKED) return 0;
    uint8_t *copy = malloc(len);
    if (!copy) return 0;
    memcpy(copy, buf, len);
    b->parked[b->n_parked++] =
        (cx_fi_parked_t){ .peer = peer, .until_ns = cx_fi_now_ns() + CX_FI_PARKED_NS, .len = len, .buf = copy };
    cx_info("libfabric: %s: a request from a peer without endpoint waits for one", b->prov);
    cx_core_peer_want_ep(b->core, peer);
    cx_fi_retry_tick(b);
    return 1;
}

static void cx_fi_on_recv(cx_backend_t *b, const uint8_t *buf, size_t len);

/* From progress: serve held requests whose peer has an endpoint now, in the order they came;
 * drop those whose time is up. */
void cx_fi_parked_run(cx_backend_t *b, int closing)
{
    uint64_t now = cx_fi_now_ns();
    int k = 0;
    for (int i = 0; i < b->n_parked; i++) {
        cx_fi_parked_t p = b->parked[i];
        if (closing || cx_fi_ep_by_peer(b, p.peer)) {
            if (!closing) cx_fi_on_recv(b, p.buf, p.len); /* resolves its sender again */
            free(p.buf);
        } else if (now >= p.until_ns) {
            cx_warn("libfabric: %s: no endpoint for a peer's request after %llu ms; dropped", b->prov,
                    (unsigned long long)(CX_FI_PARKED_NS / 1000000ull));
            free(p.buf);
        } else {
            b->parked[k++] = p;
        }
    }
    b->n_parked = k;
    if (k) cx_fi_retry_tick(b);
}

static void cx_fi_on_recv(cx_backend_t *b, const uint8_t *buf, size_t len)
{
    cx_fi_hdr_t h;
    int bad = cx_fi_hdr_get(buf, len, &h);
    uint8_t type = h.type;
    uint64_t inc = h.inc;
    uint64_t seq = h.seq;
    cx_debug("libfabric: %s: received type %u seq %llu (%zu bytes)", b->prov, type, (unsigned long long)seq, len);
    if (bad) {
        cx_warn("libfabric: malformed message (%zu bytes, version %u) dropped", len, len > 1 ? buf[1] : 0);
        cx_core_count_served(b->core, CX_XFER_MSG, 0, 0);
        return;
    }
    if (!(h.flags & CX_FM_F_RUNG)) b->unrung = 1;
    if (type == CX_FM_ACK) {
        int32_t st;
        const uint8_t *adv = NULL;
        int has_adv = !seq && (h.flags & CX_FM_F_CMA_ADV);
        if (has_adv ? cx_fi_warm_get(buf + CX_FM_HDR, len - CX_FM_HDR, 1, &st, &adv)
                    : cx_fi_ack_get(buf + CX_FM_HDR, len - CX_FM_HDR, &st)) {
            cx_warn("libfabric: malformed ack dropped");
            return;
        }
        /* A bare ack of sequence 0: a peer's warm-up (fi_caps.c). On tcp it is sent as the peer
         * connects to us (fi_xfer.c), over
         * a connection our rxm has just accepted, with a socket opened without close-on-exec
         * that no connect of ours opened a sweep window for: sweep after this drain. */
        if (!seq) {
            b->sweep_now = 1;
            cx_fi_on_warm(b, inc, h.flags, adv); /* what the peer can do (fi_caps.c) */
        }
        cx_fi_on_ack(b, seq, st);
        return;
    }
    if (type == CX_FM_RDATA) {
        cx_fi_wb_on_rdata(b, seq, buf + CX_FM_HDR, len - CX_FM_HDR);
        return;
    }
    if (type == CX_FM_ADDR) {
        cx_fi_rot_on_addr(b, inc, seq, buf + CX_FM_HDR, len - CX_FM_HDR);
        return;
    }
    if (type == CX_FM_RLIST) {
        void *rp = cx_core_peer_by_incarnation(b->core, inc);
        if (!rp) {
            cx_warn("libfabric: read list from unknown incarnation %016llx refused", (unsigned long long)inc);
            return;
        }
        if (!cx_fi_ep_by_peer(b, rp) && cx_fi_park(b, rp, buf, len)) return;
        cx_fi_list_serve(b, rp, h.flags, buf + CX_FM_HDR, len - CX_FM_HDR);
        return;
    }
    if (type == CX_FM_RREQ || type == CX_FM_PREQ || type == CX_FM_RREQ_IN) {
        void *rp = cx_core_peer_by_incarnation(b->core, inc);
        if (!rp) {
            cx_warn("libfabric: read request from unknown incarnation %016llx refused", (unsigned long long)inc);
            return;
        }
        cx_fi_wbreq_t q;
        if (cx_fi_wbreq_get(buf + CX_FM_HDR, len - CX_FM_HDR, &q)) {
            cx_warn("libfabric: malformed %s request dropped", type == CX_FM_PREQ ? "pull" : "read");
            cx_core_count_served(b->core, CX_XFER_READ, 0, 0);
            return;
        }
        if (!cx_fi_ep_by_peer(b, rp) && cx_fi_park(b, rp, buf, len)) return;
        if (type == CX_FM_RREQ)
            cx_fi_wb_on_rreq(b, rp, seq, &q);
        else if (type == CX_FM_RREQ_IN)
            cx_fi_wb_on_rreq_in(b, rp, seq, &q, (h.flags & CX_FM_F_RAW) != 0);
        else
            cx_fi_wb_on_preq(b, rp, seq, &q);
        return;
    }
    int sig = type == CX_FM_SIG || type == CX_FM_SIG_RTS;
    if (type < CX_FM_MSG || type > CX_FM_SIG_RTS) {
        cx_warn("libfabric: unknown message type %u dropped", type);
        cx_core_count_served(b->core, CX_XFER_MSG, 0, 0);
        return;
    }
    void *peer = cx_core_peer_by_incarnation(b->core, inc);
    if (!peer) {
        /* No endpoint either, hence no way to answer: the sender's op timeout covers it. */
        cx_warn("libfabric: message from unknown incarnation %016llx refused", (unsigned long long)inc);
        cx_core_count_served(b->core, sig ? CX_XFER_PUT_SIGNAL : CX_XFER_MSG, 0, 0);
        return;
    }
    if (!cx_fi_ep_by_peer(b, peer) && cx_fi_park(b, peer, buf, len)) return; /* delivered with its ack */
    if (type == CX_FM_MSG || type == CX_FM_SIG)
        cx_fi_deliver(b, peer, sig, seq, buf + CX_FM_HDR, len - CX_FM_HDR);
    else
        cx_fi_pull_start(b, peer, sig, seq, buf + CX_FM_HDR, len - CX_FM_HDR);
}

void cx_fi_op_done(cx_backend_t *b, cx_fi_op_t *op, int status)
{
    if (op->kind == CX_FOP_VEC) {
        cx_fi_vec_abort(b, op, status); /* every entry still posted (fi_rot.c) */
        return;
    }
    if (!op->posted) cx_error("libfabric: %s: completion for an op not posted (kind %d)", b->prov, op->kind);
    op->posted = 0;
    if (op->kind == CX_FOP_RLIST) {
        cx_fi_list_sent(b, op, status);
        return;
    }
    if (op->kind == CX_FOP_ACK) {
        cx_fi_op_free(b, op);
        return;
    }
    if (op->kind == CX_FOP_WBACK) {
        cx_fi_wb_done(b, op, status);
        return;
    }
    if (op->kind == CX_FOP_PULL) {
        if (b->wb && status == CX_OK) {
            /* Our pull request left; the message is in tmp_buf once its sender's answer came. */
            op->send_done = 1;
            if (op->txi >= 0) {
                cx_fi_tx_put(b, op->txi);
                op->txi = -1;
            }
            if (op->ack_got) cx_fi_pull_end(b, op, op->ack_status);
            return;
        }
        cx_fi_pull_end(b, op, status);
        return;
    }
    if (!op->x) { /* completed to the core already (disconnect): just forget it */
        cx_fi_op_free(b, op);
        return;
    }
    if (status != CX_OK) {
        cx_fi_op_finish(b, op, status);
        cx_fi_op_free(b, op);
        return;
    }
    switch (op->kind) {
    case CX_FOP_READ:
    case CX_FOP_WRITE:
        cx_fi_op_finish(b, op, CX_OK);
        cx_fi_op_free(b, op);
        break;
    case CX_FOP_PSWRITE: {
        op->kind = CX_FOP_SEND; /* the data is in place: now the message */
        int r = cx_fi_start(b, op);
        if (r) {
            cx_warn("libfabric: %s: put_signal message: %s", b->prov, cx_fi_strerror(-r));
            cx_fi_post_failed(b, op, r);
        }
        break;
    }
    case CX_FOP_SEND:
        op->send_done = 1;
        if (op->txi >= 0) {
            cx_fi_tx_put(b, op->txi);
            op->txi = -1;
        }
        if (op->ack_got) {
            cx_fi_op_finish(b, op, op->ack_status);
            cx_fi_op_free(b, op);
        }
        break;
    default: cx_fi_op_free(b, op);
    }
}

/* A large message's pull ended: deliver it, or tell its sender why not. */
static void cx_fi_pull_end(cx_backend_t *b, cx_fi_op_t *op, int status)
{
    cx_debug("libfabric: %s: pulled %zu bytes: %d", b->prov, op->r_len, status);
    if (op->ep && status == CX_OK) {
        void *peer = op->peer;
        cx_fi_deliver(b, peer, op->mtype == CX_FM_SIG, op->ack_seq, op->tmp_buf, op->r_len);
    } else if (op->ep) {
        cx_core_count_served(b->core, op->mtype == CX_FM_SIG ? CX_XFER_PUT_SIGNAL : CX_XFER_MSG, 0, 0);
        cx_fi_send_ack(b, op->ep, op->peer, op->ack_seq, status);
    }
    cx_fi_op_free(b, op);
}

/* What a CQ error entry says about the peer (backend.h, cx_cause_t). */
static cx_cause_t cx_fi_err_cause(int err)
{
    switch (err) {
    case FI_ECANCELED:
        /* The provider canceled the op: its connection was closed under it, by this side (an op
         * timeout, a disconnect, a rotation) or by a peer that closed its end of it. rxm reports
         * a peer's answer to our timed-out read this way once the link is back: never the
         * peer's failure on its own. */
        return CX_CAUSE_LOCAL;
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
        /* The peer's end closed or reset the connection: a killed process does, but so does a
         * live peer whose core closed its data endpoint on a verdict of its own (a probe, an op
         * timeout). Read as the peer's death, that failed a live pair (conformance_cause). A
         * death is also seen by the control connection's reset and the same-host watch, at the
         * same moment: the probe costs it nothing. */
        return CX_CAUSE_TRANSPORT;
    default: return CX_CAUSE_TRANSPORT;
    }
}

static int cx_fi_err_status(int err)
{
    switch (err) {
    case FI_EINVAL:
    case FI_EACCES:
    case FI_EKEYREJECTED:
    case FI_EMSGSIZE: return CX_EINVAL;
    case FI_ECANCELED: return CX_ERR;
    default: return CX_EPEER;
    }
}

static void cx_fi_on_error(cx_backend_t *b, struct fi_cq_err_entry *ee)
{
    cx_fi_ctx_t *c = ee->op_context;
    char buf[128];
    const char *why = fi_cq_strerror(b->cq, ee->prov_errno, ee->err_data, buf, sizeof buf);
    if (!c) {
        cx_warn("libfabric: %s: CQ error without context: %s", b->prov, cx_fi_strerror(ee->err));
        return;
    }
    if (c->type == CX_FI_CTX_WARM) {
        cx_fi_warm_done(b);
        return;
    }
    if (c->type == CX_FI_CTX_RX) {
        cx_fi_rx_t *rx = (cx_fi_rx_t *)c;
        rx->posted = 0;
        if (b->closing) return;
        if (ee->err == FI_ECANCELED) {
            if (rx->gen != b->rot_gen) cx_fi_rx_post(b, rx); /* its endpoint was closed by a rotation (fi_rot.c) */
            return;
        }
        cx_warn("libfabric: %s: receive failed: %s (%s)", b->prov, cx_fi_strerror(ee->err), why ? why : "");
        cx_fi_rx_post(b, rx);
        return;
    }
    int st = cx_fi_err_status(ee->err);
    cx_cause_t cause = cx_fi_err_cause(ee->err);
    if (c->type == CX_FI_CTX_VENT) {
        /* A batch entry (fi_vec.c): reported before it completes, as an op of its own is below. */
        cx_fi_vent_t *v = (cx_fi_vent_t *)c;
        cx_bep_t *vep = v->op->ep;
        cx_info("libfabric: %s: batch entry failed: %s (%s)", b->prov, cx_fi_strerror(ee->err), why ? why : "");
        if (vep && v->x && (st == CX_EPEER || cause == CX_CAUSE_LOCAL)) {
            char vreason[128];
            snprintf(vreason, sizeof vreason, "libfabric %s: %s", b->prov, cx_fi_strerror(ee->err));
            cx_core_peer_error(b->core, vep->peer, cause, vreason);
        }
        cx_fi_vent_done(b, v, st);
        return;
    }
    cx_fi_op_t *op = (cx_fi_op_t *)c;
    void *peer = NULL;
    if (op->ep && (st == CX_EPEER || cause == CX_CAUSE_LOCAL) && op->kind != CX_FOP_ACK) peer = op->ep->peer;
    cx_info("libfabric: %s: op kind %d failed: %s (%s)", b->prov, op->kind, cx_fi_strerror(ee->err), why ? why : "");
    char reason[128];
    snprintf(reason, sizeof reason, "libfabric %s: %s", b->prov, cx_fi_strerror(ee->err));
    /* An op of the core's (it still holds an xfer) is reported before it completes, so that it
     * ends under the core's verdict (backend.h): the core may disconnect its endpoint from
     * inside the call, which completes the xfer and leaves the posted op for the line below. */
    if (peer && (op->x || op->kind == CX_FOP_RLIST)) { /* a list: its reads are the core's */
        cx_core_peer_error(b->core, peer, cause, reason);
        peer = NULL;
    }
    cx_fi_op_done(b, op, st);
    /* Other ops (acks, answers, pulls): after the op is gone. */
    if (peer && cx_fi_ep_by_peer(b, peer)) cx_core_peer_error(b->core, peer, cause, reason);
}

/* Our region's lock stays held (fi_int.h, cx_fi_lock_held): the CQ read that would spin on it
 * is put off, and said so once it lasts. */
#define CX_FI_WEDGE_LOG_NS 1000000000ull
/* Returns 1 when the endpoint was replaced (fi_rot.c): the CQ can be read now. */
static int cx_fi_wedged(cx_backend_t *b)
{
    uint64_t now = cx_fi_now_ns();
    if (!b->wedged_ns) {
        b->wedged_ns = now;
        return 0;
    }
    if (b->rot_ns && cx_fi_rot_due(b, now) && !cx_fi_rotate(b)) return 1;
    if (!b->wedge_logged && now - b->wedged_ns >= CX_FI_WEDGE_LOG_NS) {
        b->wedge_logged = 1;
        cx_warn("libfabric: shm: our region's spinlock has been held for %llu ms by another "
                "process (one stopped inside the provider?): completions wait for it, ops time "
                "out meanwhile; see backends/libfabric/README.md, \"Spinlocks of stopped "
                "processes\"",
                (unsigned long long)((now - b->wedged_ns) / 1000000u));
    }
    return 0;
}

static void cx_fi_unwedged(cx_backend_t *b)
{
    if (b->wedge_logged)
        cx_warn("libfabric: shm: our region's spinlock is free again after %llu ms",
                (unsigned long long)((cx_fi_now_ns() - b->wedged_ns) / 1000000u));
    b->wedged_ns = 0;
    b->wedge_logged = 0;
}

/* Returns the number of entries handled, or -1 when it stopped at the per-call bound. */
static int cx_fi_drain(cx_backend_t *b)
{
    struct fi_cq_data_entry e[CX_FI_CQ_BATCH];
    int total = 0;
    if (cx_fi_lock_held(b, b->self_lockw) && !cx_fi_wedged(b)) return 0;
    if (b->wedged_ns) cx_fi_unwedged(b);
    while (total < CX_FI_CQ_MAX) {
        ssize_t n = fi_cq_read(b->cq, e, CX_FI_CQ_BATCH);
        if (n == -FI_EAGAIN) {
            if (b->rot_sweep) cx_fi_rot_leftovers(b);
            return total;
        }
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry ee;
            memset(&ee, 0, sizeof ee);
            if (fi_cq_readerr(b->cq, &ee, 0) == 1) cx_fi_on_error(b, &ee);
            total++;
            continue;
        }
        if (n < 0) {
            cx_warn("libfabric: %s: fi_cq_read: %s", b->prov, cx_fi_strerror((int)-n));
            return total;
        }
        for (ssize_t i = 0; i < n; i++) {
            cx_fi_ctx_t *c = e[i].op_context;
            if (!c) continue;
            if (c->type == CX_FI_CTX_WARM) {
                cx_fi_warm_done(b);
            } else if (c->type == CX_FI_CTX_RX) {
                cx_fi_rx_t *rx = (cx_fi_rx_t *)c;
                rx->posted = 0;
                if (e[i].flags & FI_REMOTE_CQ_DATA)
                    cx_fi_wb_on_raw(b, e[i].data, rx->buf, e[i].len);
                else
                    cx_fi_on_recv(b, rx->buf, e[i].len);
                cx_fi_rx_post(b, rx);
            } else if (c->type == CX_FI_CTX_VENT) {
                cx_fi_vent_done(b, (cx_fi_vent_t *)c, CX_OK);
            } else {
                cx_fi_op_done(b, (cx_fi_op_t *)c, CX_OK);
            }
        }
        total += (int)n;
        /* Fewer than asked for: the CQ was empty behind them. Another fi_cq_read now would find
         * nothing but run the provider's progress once more (on shm about as long as the
         * read of a 4 KiB op itself); the next poll or progress call reads what comes later,
         * and fi_trywait checks the CQ before the progress thread sleeps. */
        if (n < CX_FI_CQ_BATCH && !b->rot_sweep)
            return total; /* after a rotation: on to the empty read, then its leftovers */
    }
    return -1;
}

uint64_t cx_fi_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The next sweep of the window after a connect: a gap after the last, at most its end. */
static uint64_t cx_fi_sweep_due(const cx_backend_t *b)
{
    uint64_t due = b->last_sweep_ns + b->sweep_gap_ns;
    return due < b->sweep_hot_until_ns ? due : b->sweep_hot_until_ns;
}

/* Connections accepted from peers appear inside fi_cq_read: sweep now and then, after a drain
 * (the one that may have accepted them). */
static void cx_fi_maybe_sweep(cx_backend_t *b)
{
    if (b->cq_fd < 0) return;
    uint64_t now = cx_fi_now_ns();
    /* After a connect the gap doubles from 1 ms: a walk is 20-40 system calls (100-300 us on
     * this VM), and one per ms on both sides for 2 s made every read of those 2 s slower (4 KiB
     * tcp reads 35 us p50 in the first 1000 against 21 us over 100,000). The peer's dial is
     * usually accepted within a few ms of the connect, and still found within twice its age;
     * the window's last sweep falls at its end. */
    int hot = b->last_sweep_ns < b->sweep_hot_until_ns && now >= cx_fi_sweep_due(b);
    if (!b->sweep_now && now < b->next_sweep_ns && !hot) return;
    if (hot && b->sweep_gap_ns < 200000000ull) b->sweep_gap_ns *= 2;
    b->sweep_now = 0;
    b->last_sweep_ns = now;
    b->next_sweep_ns = now + 200000000ull;
    cx_fi_fd_sweep(b);
}

/* Within the window after a connect, progress must come back at each sweep even when nothing
 * else wakes it: libfabric accepts the peer's dial in its own thread, and the socket reaches
 * the sweep only once rxm takes the connection request inside a fi_cq_read. The backlog's
 * retry timer serves (a retry due earlier wins; progress re-arms after it). */
static void cx_fi_sweep_tick(cx_backend_t *b)
{
    if (b->q_armed || b->last_sweep_ns >= b->sweep_hot_until_ns) return;
    uint64_t now = cx_fi_now_ns(), due = cx_fi_sweep_due(b);
    uint64_t ns = due > now + 50000u ? due - now : 50000u;
    struct itimerspec it = { .it_value = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) } };
    if (!timerfd_settime(b->qfd, 0, &it, NULL)) {
        b->q_armed = 1;
        b->q_due_ns = now + ns;
    }
}

/* One-shot: the backlog is retried CX_FI_RETRY_US from now (or earlier, on a CQ event). A
 * queued op waits there only while the provider refuses it (-FI_EAGAIN): rxm connecting to the
 * peer, or its send queue full, which completions (the CQ fd) resolve anyway. */
#define CX_FI_RETRY_US 1000
/* A peer's region lock is held for microseconds (a drain of its queue, a post of another
 * peer's): the ops that found it held were retried 1 ms later, every 64th read of a run (the
 * target drains when its bell rings, fi_bell.c). */
#define CX_FI_RETRY_LOCK_US 20
static void cx_fi_retry_tick(cx_backend_t *b)
{
    long us = b->q_lockwait ? CX_FI_RETRY_LOCK_US : CX_FI_RETRY_US;
    b->q_lockwait = 0;
    struct itimerspec it = { .it_value = { 0, us * 1000 } };
    uint64_t now = cx_fi_now_ns();
    if (timerfd_settime(b->qfd, 0, &it, NULL)) {
        cx_fi_kick(b);
    } else {
        b->q_armed = 1;
        b->q_due_ns = now + (uint64_t)us * 1000u;
    }
}

/* One pass without arming (backend.h: a caller driving the transports, or the progress thread
 * between their ops): the CQ, which also drives a manual-progress provider, and the backlog it
 * frees. The eventfd and timer reads, dead-peer reports, sweeps and fi_trywait stay with
 * progress(), which the core still runs on its own schedule (core/src/drive.h). */
int cx_fi_poll(cx_backend_t *b)
{
    int n = cx_fi_drain(b);
    if (b->qhead && !b->q_stuck) cx_fi_backlog_run(b);
    return n > 0;
}

int cx_fi_progress(cx_backend_t *b)
{
    uint64_t v;
    cx_fi_bell_drain(b);
    cx_fi_report_dead(b);
    cx_fi_shm_progress(b, 0);
    if (b->n_av_later) cx_fi_av_later_run(b, 0);
    if (b->n_parked) cx_fi_parked_run(b, 0);
    if (b->kicked) {
        b->kicked = 0;
        if (read(b->evfd, &v, sizeof v) < 0) {
            /* EAGAIN: read already */
        }
    }
    if (b->tfd >= 0 && read(b->tfd, &v, sizeof v) < 0) {
        /* EAGAIN: woken by something else */
    }
    if (b->q_armed && cx_fi_now_ns() >= b->q_due_ns && read(b->qfd, &v, sizeof v) == (ssize_t)sizeof v)
        b->q_armed = 0; /* else not due yet */
    for (int round = 0; round < 16; round++) {
        int n = cx_fi_drain(b);
        cx_fi_backlog_run(b);
        if (b->wedged_ns) {
            /* Our region's lock is held: no fi_trywait (it may read the CQ). Back at once for
             * the first millisecond (a holder that was merely preempted), then every tick. */
            if (cx_fi_now_ns() - b->wedged_ns < 1000000ull)
                cx_fi_kick(b);
            else
                cx_fi_retry_tick(b);
            return CX_OK;
        }
        cx_fi_maybe_sweep(b);
        if (n < 0 || (b->qhead && !b->q_stuck)) {
            cx_fi_kick(b); /* more to do: come back after the core served the rest */
            return CX_OK;
        }
        if (b->qhead) cx_fi_retry_tick(b); /* nothing could be posted: retry in a while, CQ fd armed */
        if (b->cq_fd < 0) {
            /* No wait object: poll while anything of ours is in flight, or traffic is recent.
             * With doorbells in direct mode, only after traffic that came unrung (fi_bell.c):
             * nothing else waits on us. */
            uint64_t now = cx_fi_now_ns();
            int hot = b->bell_fd >= 0 && b->shm_direct ? b->unrung : n > 0 || b->all;
            b->unrung = 0;
            if (hot) b->hot_until_ns = now + 100000000ull;
            if (b->busy_poll || now < b->hot_until_ns) cx_fi_kick(b);
            return CX_OK;
        }
        struct fid *f = &b->cq->fid;
        int r = fi_trywait(b->fabric, &f, 1);
        if (r == FI_SUCCESS) {
            cx_fi_sweep_tick(b);
            return CX_OK;
        }
        if (r != -FI_EAGAIN) {
            cx_debug("libfabric: %s: fi_trywait: %s", b->prov, cx_fi_strerror(-r));
            cx_fi_kick(b);
            return CX_OK;
        }
    }
    cx_fi_kick(b);
    return CX_OK;
}
