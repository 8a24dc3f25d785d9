/* Reads by write-back, for the tcp provider of libfabric 1.17.0.
 *
 * Why: tcp (1.17.0) keeps a posted fi_read both at the head of the connection's rma_read_queue
 * and, while its response is being received, as the connection's current receive. A connection
 * torn down in that state (the link was cut mid-response: fi_av_remove with
 * FI_AV_REMOVE_CLEANUP, a socket error, or rxm replacing the connection of a restarted peer)
 * completes and frees that entry twice: the second completion carries a freed entry (context
 * NULL, flags 0), ofi_rxm dereferences it and the process dies with SIGSEGV at address 0x20
 * (upstream fix: libfabric PR 8656/8660, in 1.17.1 and 1.18). No teardown of such a connection
 * is safe, so this backend never posts fi_read on tcp: the reader sends a request message, the
 * target writes the bytes into the reader's registered buffer (delivery-complete) and then
 * acks; the read completes on the ack. A write has no such double entry on either side.
 *
 * The guarantee of docs/semantics.md holds as with fi_read: disconnect closes rxm's connection
 * (FI_AV_REMOVE_CLEANUP=1) before the op completes with an error, so a late write cannot land.
 * Large messages (RTS) likewise: the target asks the sender to write the message into its
 * landing buffer instead of pulling it with fi_read. */
#include "fi_int.h"

#include "connex/log.h"

#include <stdlib.h>
#include <string.h>

/* Write-back needs no local descriptor on the target side (no FI_MR_LOCAL): tcp;ofi_rxm
 * reports mr_mode 0. CONNEX_FI_TCP_READ=rma keeps fi_read (for measurements, or a fixed
 * libfabric); anything else but "writeback" is refused with a warning. */
int cx_fi_wb_choose(cx_backend_t *b)
{
    if (strncmp(b->prov, "tcp", 3) || (b->mr_mode & FI_MR_LOCAL))
        return 0;
    const char *s = getenv("CONNEX_FI_TCP_READ");
    if (!s || !*s || !strcmp(s, "writeback"))
        return 1;
    if (!strcmp(s, "rma"))
        return 0;
    cx_warn("libfabric: CONNEX_FI_TCP_READ=%s not understood (writeback|rma), using writeback", s);
    return 1;
}

/* Initiator: the request, after the common header. Where the target must write: a
 * registration of exactly the caller's range, made for this op (a fresh key) and closed before
 * the op completes (cx_fi_op_finish), whatever the outcome. The target initiates this write, and
 * its rxm reconnects by itself after our disconnect: only a dead key keeps a late write (the
 * target was stopped, resumed after our op timed out) out of the caller's buffer. A write
 * already under way when the op ends dies with its connection, which disconnect closes first. */
int cx_fi_wb_rreq_write(cx_backend_t *b, cx_fi_op_t *op, cx_wr_t *w)
{
    cx_xfer_t *x = op->x;
    if (!op->tmp_mr) {
        int r = cx_fi_mr_reg(b, x->local, x->len, FI_REMOTE_WRITE, CX_MEM_HOST, &op->tmp_mr);
        if (r)
            return r;
    }
    uint64_t dst = (b->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)x->local : 0;
    cx_fi_wbreq_put(w, &(cx_fi_wbreq_t){ .what = x->remote, .len = x->len, .dst = dst,
                                          .key = fi_mr_key(op->tmp_mr) });
    return w->ok ? 0 : -FI_EINVAL;
}

static void cx_fi_wb_answer(cx_backend_t *b, cx_bep_t *ep, void *peer, uint64_t seq, int status)
{
    cx_fi_op_t *a = cx_fi_op_new(b, CX_FOP_ACK, NULL, ep);
    if (!a) {
        cx_error("libfabric: out of memory for a read answer; the reader will time out");
        return;
    }
    a->peer = peer;
    a->ack_seq = seq;
    a->ack_val = status;
    int r = cx_fi_start(b, a);
    if (r) {
        cx_warn("libfabric: %s: read answer: %s", b->prov, fi_strerror(-r));
        cx_fi_op_free(b, a);
    }
}

/* Target: check the range against our registry (pinned while the write is out), then write. */
void cx_fi_wb_on_rreq(cx_backend_t *b, void *peer, uint64_t seq, const cx_fi_wbreq_t *q)
{
    uint64_t src = q->what, len = q->len, dst = q->dst, dkey = q->key;
    cx_bep_t *ep = cx_fi_ep_by_peer(b, peer);
    if (!ep) {
        cx_warn("libfabric: read request from a peer without endpoint; dropped");
        return;
    }
    if (!len || len > b->max_msg) {
        cx_warn("libfabric: malformed read request (%llu bytes)", (unsigned long long)len);
        cx_fi_wb_answer(b, ep, peer, seq, CX_EINVAL);
        return;
    }
    void *pin = NULL;
    if (cx_core_region_check(b->core, src, (size_t)len, &pin) != CX_OK) {
        cx_fi_wb_answer(b, ep, peer, seq, CX_EINVAL);
        return;
    }
    cx_fi_op_t *op = cx_fi_op_new(b, CX_FOP_WBACK, NULL, ep);
    if (!op) {
        cx_core_region_unpin(pin);
        cx_fi_wb_answer(b, ep, peer, seq, CX_ENOMEM);
        return;
    }
    op->peer = peer;
    op->ack_seq = seq;
    op->wb_pin = pin;
    op->r_addr = dst;
    op->r_key = dkey;
    op->r_len = (size_t)len;
    op->wb_src = (const void *)(uintptr_t)src;
    int st = CX_OK;
    if (cx_core_region_kind(b->core, src, (size_t)len) != CX_MEM_HOST) {
        /* Device (or simulated device) memory is never handed to the network library: copy. */
        op->tmp_buf = malloc((size_t)len);
        st = op->tmp_buf ? cx_core_mem_copy(b->core, op->tmp_buf, op->wb_src, (size_t)len) : CX_ENOMEM;
        op->wb_src = op->tmp_buf;
    }
    if (st == CX_OK && cx_fi_start(b, op) == 0)
        return;
    cx_fi_op_free(b, op);       /* unpins */
    cx_fi_wb_answer(b, ep, peer, seq, st == CX_OK ? CX_EPEER : st);
}

/* Large messages (RTS) the same way: the target, instead of pulling with fi_read, asks the
 * sender to write the message into its landing buffer, then delivers on the sender's answer. */
int cx_fi_wb_preq_write(cx_backend_t *b, cx_fi_op_t *op, cx_wr_t *w)
{
    uint64_t dst = (b->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)op->tmp_buf : 0;
    /* what: the sender's sequence of the message */
    cx_fi_wbreq_put(w, &(cx_fi_wbreq_t){ .what = op->ack_seq, .len = op->r_len, .dst = dst,
                                          .key = fi_mr_key(op->tmp_mr) });
    return w->ok ? 0 : -FI_EINVAL;
}

/* Sender: write the message the target asks for. It must be one of our messages still waiting
 * for its ack, to this peer, of this length: the target names it by our sequence. */
void cx_fi_wb_on_preq(cx_backend_t *b, void *peer, uint64_t seq, const cx_fi_wbreq_t *q)
{
    uint64_t sseq = q->what, len = q->len, dst = q->dst, dkey = q->key;
    cx_bep_t *ep = cx_fi_ep_by_peer(b, peer);
    if (!ep) {
        cx_warn("libfabric: pull request from a peer without endpoint; dropped");
        return;
    }
    cx_fi_op_t *m = cx_fi_ack_find(b, sseq);
    if (!m || m->kind != CX_FOP_SEND || m->rreq || !m->x || m->ep != ep || m->x->msg_len != len) {
        cx_warn("libfabric: pull request for no message of ours (seq %llu, %llu bytes)",
                (unsigned long long)sseq, (unsigned long long)len);
        cx_fi_wb_answer(b, ep, peer, seq, CX_EINVAL);
        return;
    }
    cx_fi_op_t *op = cx_fi_op_new(b, CX_FOP_WBACK, NULL, ep);
    if (!op) {
        cx_fi_wb_answer(b, ep, peer, seq, CX_ENOMEM);
        return;
    }
    /* The message's bytes stay the caller's until the target's ack (sent after our answer), and
     * a disconnect closes the connection (and with it this write) before the op completes. */
    op->peer = peer;
    op->ack_seq = seq;
    op->r_addr = dst;
    op->r_key = dkey;
    op->r_len = (size_t)len;
    op->wb_src = m->x->msg;
    if (cx_fi_start(b, op) == 0)
        return;
    cx_fi_op_free(b, op);
    cx_fi_wb_answer(b, ep, peer, seq, CX_EPEER);
}

int cx_fi_wb_post(cx_backend_t *b, cx_fi_op_t *op)
{
    /* Delivery-complete: the answer may leave only once the bytes are in the reader's buffer. */
    return cx_fi_write_dc(b, op, op->wb_src, NULL, op->r_len, op->r_addr, op->r_key);
}

/* The write's completion: release the source, then answer (the reader completes on it). */
void cx_fi_wb_done(cx_backend_t *b, cx_fi_op_t *op, int status)
{
    cx_bep_t *ep = op->ep;
    void *peer = op->peer;
    uint64_t seq = op->ack_seq;
    cx_fi_op_free(b, op);
    if (ep)
        cx_fi_wb_answer(b, ep, peer, seq, status);
}
