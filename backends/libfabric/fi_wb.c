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
 * landing buffer instead of pulling it with fi_read.
 *
 * Small reads (up to rd_inline: CONNEX_FI_READ_INLINE, default 32 KiB, at most 64 KiB; measured
 * here, write-back catches up at about 40 KiB) skip the write: the
 * target answers with the bytes in messages (RREQ_IN, answered by RDATA parts of at most rxm's
 * eager limit each: a larger message goes by rxm's segmentation, measured 2x slower), and the
 * reader copies them into the caller's buffer only while the op is still waiting for that
 * answer. One round trip and no per-op registration, where write-back takes the request, the
 * write, its delivery ack and the answer plus an fi_mr_reg / fi_close pair. Nothing can
 * land late: the reader's copy is the only write into the caller's buffer. */
#include "fi_int.h"
#include "connex/options.h"

#include "connex/log.h"

#include <stdlib.h>
#include <string.h>

/* Whether this tcp provider completes a read's receive entry once when its connection is torn
 * down (README.md, "Reads on tcp"). Built-in providers report FI_VERSION(major * 100 + minor,
 * revision * 10). The fix (ofiwg/libfabric PR 8660 on main, 8656 on v1.17.x, both merged on
 * 2023-03-15) came after 1.17.1 (2023-03-03) and is in 1.18.0: anything below 118 counts as
 * affected, a 1.17.x released later included (safe: it only costs the faster path). */
int cx_fi_tcp_read_fixed(uint32_t prov_version)
{
    return FI_MAJOR(prov_version) >= 118;
}

/* Write-back needs no local descriptor on the target side (no FI_MR_LOCAL): tcp;ofi_rxm
 * reports mr_mode 0. CONNEX_FI_TCP_READ: auto (the default) uses write-back only on a tcp
 * provider with the teardown bug, rma always fi_read, writeback always write-back; anything else
 * is refused with a warning and taken as auto. Also sets rd_inline. */
int cx_fi_wb_choose(cx_backend_t *b)
{
    /* RDATA parts fit rxm's eager limit (the user's FI_OFI_RXM_EAGER_LIMIT, else 16 KiB): a
     * target serves small reads whatever its own setting. */
    size_t eager = 16384;
    const char *el = getenv("FI_OFI_RXM_EAGER_LIMIT");
    if (el && *el >= '0' && *el <= '9') eager = (size_t)strtoull(el, NULL, 10);
    if (eager > CX_FI_BUF) eager = CX_FI_BUF;
    b->rd_part = eager > 1024 ? eager - CX_FM_HDR - CX_FM_RDATA_HDR : 1024 - CX_FM_HDR - CX_FM_RDATA_HDR;
    b->rd_inline = 0;
    if (strncmp(b->prov, "tcp", 3) || (b->mr_mode & FI_MR_LOCAL)) return 0;
    /* The options table holds CX_FM_RD_INLINE_DEFAULT as the default, CX_FM_RD_INLINE_MAX as the
     * largest value (unit_options does not see backend headers: keep them in step). */
    unsigned long long v = cx_opts_num(b->opts, "CONNEX_FI_READ_INLINE", NULL);
    b->rd_inline = v > CX_FM_RD_INLINE_MAX ? CX_FM_RD_INLINE_MAX : (size_t)v;
    v = cx_opts_num(b->opts, "CONNEX_FI_TCP_READ", NULL); /* auto|rma|writeback */
    if (v == 2) return 1;
    if (v == 1) return 0;
    int fixed = cx_fi_tcp_read_fixed(b->prov_version);
    cx_debug("libfabric: %s provider version %u.%u: reads by %s", b->prov, (unsigned)FI_MAJOR(b->prov_version),
             (unsigned)FI_MINOR(b->prov_version),
             fixed ? "fi_read" : "write-back (the tcp teardown bug of libfabric < 1.18)");
    return !fixed;
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
    if (op->rreq == CX_FI_RREQ_IN) { /* answered with the bytes: nothing to register */
        op->rr = (cx_rread_t){ .win_end = x->len };
        cx_fi_wbreq_put(w, &(cx_fi_wbreq_t){ .what = x->remote, .len = x->len });
        return w->ok ? 0 : -FI_EINVAL;
    }
    if (!op->tmp_mr) {
        int r = cx_fi_mr_reg(b, x->local, x->len, FI_REMOTE_WRITE, CX_MEM_HOST, &op->tmp_mr);
        if (r) return r;
    }
    uint64_t dst = (b->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)x->local : 0;
    cx_fi_wbreq_put(w, &(cx_fi_wbreq_t){ .what = x->remote, .len = x->len, .dst = dst, .key = fi_mr_key(op->tmp_mr) });
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
        cx_warn("libfabric: %s: read answer: %s", b->prov, cx_fi_strerror(-r));
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
    if (st == CX_OK && cx_fi_start(b, op) == 0) return;
    cx_fi_op_free(b, op); /* unpins */
    cx_fi_wb_answer(b, ep, peer, seq, st == CX_OK ? CX_EPEER : st);
}

/* Target of a small read: the bytes go back in RDATA parts, each copied into its send buffer as
 * that is filled (cx_fi_post_send), its range of the region pinned until then. Parts leave in
 * order (cx_fi_start keeps an endpoint's order through the backlog); the reader takes them only
 * in order. A part that cannot start ends the answer with an error ack instead. */
void cx_fi_wb_on_rreq_in(cx_backend_t *b, void *peer, uint64_t seq, const cx_fi_wbreq_t *q, int raw)
{
    uint64_t src = q->what, len = q->len;
    cx_bep_t *ep = cx_fi_ep_by_peer(b, peer);
    if (!ep) {
        cx_warn("libfabric: read request from a peer without endpoint; dropped");
        return;
    }
    if (!len || len > CX_FM_RD_INLINE_MAX) {
        cx_warn("libfabric: malformed small-read request (%llu bytes, at most %u)", (unsigned long long)len,
                (unsigned)CX_FM_RD_INLINE_MAX);
        cx_fi_wb_answer(b, ep, peer, seq, CX_EINVAL);
        return;
    }
    raw = raw && b->rd_raw;
    size_t part = raw ? b->rd_raw : b->rd_part;
    for (size_t i = 0, np = cx_rread_parts((size_t)len, part); i < np; i++) {
        size_t off, n = cx_rread_part((size_t)len, part, i, &off);
        const void *at = (const void *)(uintptr_t)(src + off);
        int st = CX_ENOMEM;
        void *pin = NULL;
        cx_fi_op_t *a = NULL;
        /* Pinned per part: each holds its range until its bytes are in its send buffer. */
        if (cx_core_region_check(b->core, src + off, n, &pin) != CX_OK)
            st = CX_EINVAL;
        else if ((a = cx_fi_op_new(b, CX_FOP_ACK, NULL, ep))) {
            a->peer = peer;
            a->ack_seq = seq;
            a->ack_val = CX_OK;
            a->mtype = CX_FM_RDATA;
            a->raw = (uint8_t)raw;
            a->wb_pin = pin;
            pin = NULL;
            a->r_addr = off;
            a->r_len = n;
            a->wb_src = at;
            st = CX_OK;
            if (cx_core_region_kind(b->core, src + off, n) != CX_MEM_HOST) {
                /* Device memory is never handed to the network library: copy. */
                a->tmp_buf = malloc(n);
                st = a->tmp_buf ? cx_core_mem_copy(b->core, a->tmp_buf, at, n) : CX_ENOMEM;
                a->wb_src = a->tmp_buf;
            }
            int r = st == CX_OK ? cx_fi_start(b, a) : 0;
            if (st == CX_OK && !r) {
                b->rd_sent[raw]++;
                continue;
            }
            if (r) {
                cx_warn("libfabric: %s: read answer: %s", b->prov, cx_fi_strerror(-r));
                st = CX_EPEER;
            }
            cx_fi_op_free(b, a); /* unpins */
        }
        cx_core_region_unpin(pin);
        cx_fi_wb_answer(b, ep, peer, seq, st);
        return;
    }
}

static void cx_fi_wb_part(cx_backend_t *b, uint64_t seq, int bad, int32_t st, uint32_t off, const uint8_t *d,
                          size_t dl);

void cx_fi_wb_on_rdata(cx_backend_t *b, uint64_t seq, const uint8_t *body, size_t len)
{
    int32_t st;
    uint32_t off;
    const uint8_t *d;
    size_t dl;
    int bad = cx_fi_rdata_get(body, len, &st, &off, &d, &dl);
    cx_fi_wb_part(b, seq, bad, st, off, d, dl);
}

/* The whole sequence from its low half: ours, and every op in the ack table is far less than
 * 2^32 sequences old. */
void cx_fi_wb_on_raw(cx_backend_t *b, uint64_t data, const uint8_t *buf, size_t len)
{
    uint32_t off, lo;
    if (cx_fi_cqd_rdata_get(data, &off, &lo) || (uint64_t)off + len > CX_FM_RD_INLINE_MAX) {
        cx_warn("libfabric: message with unknown CQ data %016llx (%zu bytes) dropped", (unsigned long long)data, len);
        return;
    }
    uint64_t seq = b->next_seq - (uint32_t)((uint32_t)b->next_seq - lo);
    cx_fi_wb_part(b, seq, 0, CX_OK, off, buf, len);
}

static void cx_fi_wb_part(cx_backend_t *b, uint64_t seq, int bad, int32_t st, uint32_t off, const uint8_t *d, size_t dl)
{
    cx_fi_op_t *op = cx_fi_ack_find(b, seq);
    if (!op) {
        cx_debug("libfabric: read answer for unknown op %llu (completed already)", (unsigned long long)seq);
        return;
    }
    if (op->rreq != CX_FI_RREQ_IN || !op->x) {
        cx_warn("libfabric: read answer for op %llu, which is no small read: dropped", (unsigned long long)seq);
        return;
    }
    cx_xfer_t *x = op->x;
    /* Still waiting for this answer (it is in the ack table): the caller's buffer is ours. */
    int r = bad || st != CX_OK ? 0 : cx_rread_take(&op->rr, x->local, x->len, off, d, dl);
    if (bad || r == CX_RREAD_BAD) {
        cx_warn("libfabric: malformed read answer (%zu bytes at %u, %zu of %zu in): the read fails", dl, (unsigned)off,
                op->rr.got, x->len);
        st = CX_EPEER;
    } else if (r == CX_RREAD_MORE) {
        return;
    }
    cx_fi_on_ack(b, seq, st);
}

/* Large messages (RTS) the same way: the target, instead of pulling with fi_read, asks the
 * sender to write the message into its landing buffer, then delivers on the sender's answer. */
int cx_fi_wb_preq_write(cx_backend_t *b, cx_fi_op_t *op, cx_wr_t *w)
{
    uint64_t dst = (b->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)op->tmp_buf : 0;
    /* what: the sender's sequence of the message */
    cx_fi_wbreq_put(
        w, &(cx_fi_wbreq_t){ .what = op->ack_seq, .len = op->r_len, .dst = dst, .key = fi_mr_key(op->tmp_mr) });
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
        cx_warn("libfabric: pull request for no message of ours (seq %llu, %llu bytes)", (unsigned long long)sseq,
                (unsigned long long)len);
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
    if (cx_fi_start(b, op) == 0) return;
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
    if (ep) cx_fi_wb_answer(b, ep, peer, seq, status);
}
