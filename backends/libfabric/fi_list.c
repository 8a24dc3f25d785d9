/* A batch's small reads to one endpoint as one request (tcp, where reads are answered by the
 * target: fi_wb.c).
 *
 * Why: a small read on tcp is a request message that the target answers with the bytes
 * (RREQ_IN). A batch of 128 x 16 KiB reads sent 128 requests: on the reader 128 sends, each
 * with its own completion and CQ signal; on the target 128 receives, most of them a wake-up of
 * its progress thread to answer one read. One RLIST message asks for a run of them (at most
 * CX_FM_RLIST_MAX, within one eager message); the target serves each entry as the RREQ_IN it
 * stands for, under the reader's sequence for that read, so answers, refusals and failures stay
 * per read, exactly as for single requests.
 *
 * Who gets one: a peer that said it serves them. Every message of ours carries CX_FM_F_LISTS; a
 * peer's warm-up (the bare ack of sequence 0 each side sends as it connects) without
 * CX_FM_F_ECHO is answered by one with it (fi_caps.c), so each side learns of the other
 * whichever endpoint was made first. A peer of an older version never sets the flag (and ignores ours): it gets
 * single requests. Until the flag came, reads go as single requests too.
 *
 * Life: the list (CX_FOP_RLIST, no xfer of its own) owns the one send. Each read is an op of its
 * own (CX_FOP_SEND, rreq CX_FI_RREQ_IN) in the ack table, whose send is the list's: it ends when
 * both the list's send completed and its answer came, as a single request does with its own
 * send. A read ended meanwhile (its endpoint was disconnected) stays allocated until the list
 * lets go of it. */
#include "fi_int.h"

#include "connex/log.h"

#include <stdlib.h>

/* Whether x can be one of a list's reads: what cx_fi_submit would send as RREQ_IN, its key
 * valid. */
static int takes(cx_backend_t *b, const cx_xfer_t *x)
{
    uint64_t raddr, rkey;
    if (x->kind != CX_XFER_READ || !x->len || x->len > b->rd_inline || !x->local || !x->local_mh ||
        x->local_mem != CX_MEM_HOST)
        return 0;
    if (!cx_fi_key_hit(b, x)) return cx_fi_key_cached(b, x, &raddr, &rkey) == CX_OK;
    return cx_fi_key_target(&b->kc, x->remote, &raddr) == CX_OK;
}

/* Entries per list: one eager message of rxm (a larger one goes by rendezvous), at most
 * CX_FM_RLIST_MAX. rd_part is that limit less two headers (fi_wb.c). */
static size_t list_cap(const cx_backend_t *b)
{
    size_t eager = b->rd_part + CX_FM_HDR + CX_FM_RDATA_HDR;
    if (eager > CX_FI_BUF) eager = CX_FI_BUF;
    size_t cap = (eager - CX_FM_HDR - CX_FM_RLIST_HEAD) / CX_FM_RLIST_ENT;
    return cap < CX_FM_RLIST_MAX ? cap : CX_FM_RLIST_MAX;
}

size_t cx_fi_list_submit(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs)
{
    if (n < 2 || !b->wb || !b->rd_inline || !ep || !ep->lists || b->closing || !takes(b, xs[0]) || !takes(b, xs[1]))
        return 0;
    size_t cap = list_cap(b), m = 2;
    if (cap < 2) return 0;
    while (m < n && m < cap && takes(b, xs[m])) m++;
    cx_fi_op_t *l = cx_fi_op_new(b, CX_FOP_RLIST, NULL, ep);
    if (!l) return 0;
    if (!(l->mem = malloc(m * sizeof *l->mem))) {
        cx_fi_op_free(b, l);
        return 0;
    }
    for (size_t i = 0; i < m; i++) {
        cx_fi_op_t *op = cx_fi_op_new(b, CX_FOP_SEND, xs[i], ep);
        if (!op) break; /* the rest go alone (cx_fi_submit), where this is reported */
        op->rreq = CX_FI_RREQ_IN;
        op->rr = (cx_rread_t){ .win_end = xs[i]->len };
        cx_fi_ack_add(b, op);
        op->carrier = l;
        xs[i]->bp[0] = op;
        l->mem[l->nmem++] = op;
        rcs[i] = CX_OK;
    }
    size_t k = l->nmem;
    if (!k) {
        cx_fi_op_free(b, l);
        return 0;
    }
    l->seq = l->mem[0]->seq; /* informative: the header's sequence */
    int r = cx_fi_start(b, l);
    if (r == -FI_ENOTCONN) {
        /* Its peer exited: the backlog's next pass reports it, then the reads end (CX_EPEER). */
        cx_fi_backlog_add(b, l);
        cx_fi_kick(b);
    } else if (r) {
        cx_warn("libfabric: %s: read list: %s", b->prov, cx_fi_strerror(-r));
        for (size_t i = 0; i < k; i++) {
            xs[i]->bp[0] = NULL;
            l->mem[i]->x = NULL; /* not started: the caller learns it from rcs */
            rcs[i] = r == -FI_EINVAL ? CX_EINVAL : CX_ERR;
        }
        cx_fi_op_free(b, l); /* and its reads */
    }
    return k;
}

int cx_fi_list_write(cx_backend_t *b, cx_fi_op_t *l, cx_wr_t *w)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < l->nmem; i++) n += l->mem[i] && l->mem[i]->x;
    if (!n) return -FI_ECANCELED; /* every read ended before the list could leave */
    cx_fi_rlist_head_put(w, n);
    for (uint32_t i = 0; i < l->nmem; i++) {
        cx_fi_op_t *op = l->mem[i];
        if (op && op->x) cx_fi_rlist_ent_put(w, op->seq, op->x->remote, (uint32_t)op->x->len);
    }
    if (!w->ok) return -FI_EINVAL;
    b->rl_sent[0]++;
    b->rl_sent[1] += n;
    return 0;
}

/* Takes op (one of l's reads) back from its list. */
static cx_fi_op_t *let_go(cx_fi_op_t *l, uint32_t i)
{
    cx_fi_op_t *op = l->mem[i];
    l->mem[i] = NULL;
    if (op) op->carrier = NULL;
    return op;
}

void cx_fi_list_sent(cx_backend_t *b, cx_fi_op_t *l, int status)
{
    if (l->txi >= 0) {
        cx_fi_tx_put(b, l->txi);
        l->txi = -1;
    }
    for (uint32_t i = 0; i < l->nmem; i++) {
        cx_fi_op_t *op = let_go(l, i);
        if (!op) continue;
        if (!op->x) { /* ended already: only the list held it */
            cx_fi_op_free(b, op);
        } else if (status != CX_OK) {
            cx_fi_op_finish(b, op, status);
            cx_fi_op_free(b, op);
        } else {
            op->send_done = 1;
            if (op->ack_got) {
                cx_fi_op_finish(b, op, op->ack_status);
                cx_fi_op_free(b, op);
            }
        }
    }
    cx_fi_op_free(b, l);
}

void cx_fi_list_finish(cx_backend_t *b, cx_fi_op_t *l, int status)
{
    /* The reads stay the list's (it may still be posted): they end, they are not freed. */
    for (uint32_t i = 0; i < l->nmem; i++)
        if (l->mem[i] && l->mem[i]->x) cx_fi_op_finish(b, l->mem[i], status);
}

void cx_fi_list_detach(cx_backend_t *b, cx_fi_op_t *op)
{
    if (op->carrier) {
        cx_fi_op_t *l = op->carrier;
        for (uint32_t i = 0; i < l->nmem; i++)
            if (l->mem[i] == op) l->mem[i] = NULL;
        op->carrier = NULL;
    }
    if (!op->mem) return;
    /* The list goes (dropped from the backlog, or the backend closes): its reads that ended go
     * with it; one still waiting stays with its endpoint, which ends it. */
    for (uint32_t i = 0; i < op->nmem; i++) {
        cx_fi_op_t *m = let_go(op, i);
        if (m && !m->x) cx_fi_op_free(b, m);
    }
    free(op->mem);
    op->mem = NULL;
    op->nmem = 0;
}

void cx_fi_list_serve(cx_backend_t *b, void *peer, uint16_t flags, const uint8_t *body, size_t len)
{
    uint32_t n;
    if (cx_fi_rlist_get(body, len, &n)) {
        cx_warn("libfabric: malformed read list (%zu bytes) dropped", len);
        cx_core_count_served(b->core, CX_XFER_READ, 0, 0);
        return;
    }
    b->rl_served++;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t seq;
        cx_fi_wbreq_t q;
        cx_fi_rlist_ent(body, i, &seq, &q);
        cx_fi_wb_on_rreq_in(b, peer, seq, &q, (flags & CX_FM_F_RAW) != 0);
    }
}
