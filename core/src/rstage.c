/* Target-side staging over the control connection (rstage.h). */
#include "rstage.h"
#include "ctl_wire.h"
#include "staging.h"

#include "connex/log.h"

#include <string.h>

static int is_device(int kind)
{
    return kind == CX_MEM_CUDA || kind == CX_MEM_SIM;
}

int cx_rstage_register_with(cx_engine_t *e, int b, int mem_kind)
{
    if (!is_device(mem_kind) || e->be[b].ops->software_target) return 1;
    return !cx_staging_needed(e, b, mem_kind);
}

int cx_rstage_wanted(cx_engine_t *e, const cx_peer_t *p, const cx_rregion_t *rr)
{
    return rr && p->bidx >= 0 && is_device(rr->mem_kind) && !rr->key_len[p->bidx] &&
        !e->be[p->bidx].ops->software_target;
}

static size_t chunk_len(const cx_op_t *op, size_t off)
{
    size_t n = op->x.len - off;
    return n < CX_RSTAGE_CHUNK ? n : CX_RSTAGE_CHUNK;
}

/* Ask for more chunks, up to the window; finish the op once everything is answered. */
static void pump(cx_engine_t *e, cx_op_t *op)
{
    cx_peer_t *p = op->peer;
    cx_core_t *core = cx_core_of(e);
    int kind = op->x.kind == CX_XFER_READ ? CX_RMA_READ : CX_RMA_WRITE;
    while (op->rs.status == CX_OK && op->rs.out < CX_RSTAGE_WINDOW && op->rs.off < op->x.len) {
        if (!p->conn) {
            op->rs.status = CX_EPEER;
            break;
        }
        size_t off = op->rs.off, n = chunk_len(op, off);
        size_t body = CX_RMA_REQ_HDR + (kind == CX_RMA_WRITE ? n : 0);
        uint8_t *b = cx_conn_reserve(p->conn, CX_CTL_RMA_REQ, body);
        if (!b) {
            op->rs.status = CX_ENOMEM;
            break;
        }
        cx_wire_put_rma_req(b, op->query_id + off / CX_RSTAGE_CHUNK, kind, op->x.remote + off, n);
        if (kind == CX_RMA_WRITE) {
            int rc = cx_core_mem_copy(core, b + CX_RMA_REQ_HDR, (const uint8_t *)op->x.local + off, n);
            if (rc) {
                op->rs.status = rc;
                break;
            } /* not committed: nothing was queued */
        }
        cx_conn_commit(e, p->conn, body);
        op->rs.off += n;
        op->rs.out++;
    }
    if (op->rs.out) return;
    if (op->rs.status == CX_OK && op->x.kind == CX_XFER_PUT_SIGNAL && !op->rs.signalled) {
        /* Every chunk is in place at the target: now the message. */
        size_t body = CX_RMA_REQ_HDR + op->x.msg_len;
        uint8_t *b = p->conn ? cx_conn_reserve(p->conn, CX_CTL_RMA_REQ, body) : NULL;
        if (!b) {
            cx_op_finish(e, op, p->conn ? CX_ENOMEM : CX_EPEER);
            return;
        }
        cx_wire_put_rma_req(b, op->query_id + op->rs.nids - 1, CX_RMA_SIGNAL, 0, 0);
        if (op->x.msg_len) memcpy(b + CX_RMA_REQ_HDR, op->x.msg, op->x.msg_len);
        cx_conn_commit(e, p->conn, body);
        op->rs.signalled = 1;
        op->rs.out = 1;
        return;
    }
    cx_op_finish(e, op, op->rs.status);
}

void cx_rstage_start(cx_engine_t *e, cx_op_t *op)
{
    cx_peer_t *p = op->peer;
    if (!p->rs_logged) {
        p->rs_logged = 1;
        cx_info("peer %s: its device memory is not reachable over %s here: ops on it are served by "
                "its core over the control connection",
                p->url, e->bnames[p->bidx]);
    }
    op->stage = OPS_RSTAGE;
    op->rs.off = 0;
    op->rs.out = 0;
    op->rs.status = CX_OK;
    op->rs.signalled = 0;
    op->rs.nids = (uint32_t)((op->x.len + CX_RSTAGE_CHUNK - 1) / CX_RSTAGE_CHUNK) + (op->x.kind == CX_XFER_PUT_SIGNAL);
    op->query_id = e->next_query_id;
    e->next_query_id += op->rs.nids;
    pump(e, op);
}

void cx_rstage_on_resp(cx_engine_t *e, cx_peer_t *p, const uint8_t *body, size_t len)
{
    cx_wire_rma_t m;
    if (cx_wire_get_rma_resp(body, len, &m)) {
        cx_warn("peer %s: malformed RMA_RESP ignored", p->url);
        return;
    }
    for (cx_op_t *op = p->ops.next; op != &p->ops; op = op->next) {
        if (op->stage != OPS_RSTAGE || m.id < op->query_id || m.id - op->query_id >= op->rs.nids) continue;
        uint64_t idx = m.id - op->query_id;
        if (!op->rs.out) break; /* nothing of this op is outstanding: a duplicate */
        op->rs.out--;
        int st = m.status;
        int is_signal = op->x.kind == CX_XFER_PUT_SIGNAL && idx == op->rs.nids - 1;
        if (st == CX_OK && op->x.kind == CX_XFER_READ) {
            size_t off = (size_t)idx * CX_RSTAGE_CHUNK;
            if (m.data_len != chunk_len(op, off)) {
                cx_warn("peer %s: RMA_RESP carries %zu bytes for a %zu-byte chunk", p->url, m.data_len,
                        chunk_len(op, off));
                st = CX_ERR;
            } else {
                st = cx_core_mem_copy(cx_core_of(e), (uint8_t *)op->x.local + off, m.data, m.data_len);
            }
        } else if (st == CX_OK && m.data_len) {
            st = CX_ERR; /* a write or signal answered with bytes */
        }
        if (op->rs.status == CX_OK) op->rs.status = st;
        if (is_signal) {
            cx_op_finish(e, op, op->rs.status);
            return;
        }
        pump(e, op);
        return;
    }
    cx_debug("peer %s: RMA_RESP for no waiting op (it ended: timeout or failure)", p->url);
}

static void answer(cx_engine_t *e, cx_peer_t *p, uint64_t id, int status)
{
    uint8_t hdr[CX_RMA_RESP_HDR];
    cx_wire_put_rma_resp(hdr, id, status);
    cx_conn_send(e, p->conn, CX_CTL_RMA_RESP, hdr, sizeof hdr);
}

void cx_rstage_on_req(cx_engine_t *e, cx_peer_t *p, const uint8_t *body, size_t len)
{
    cx_core_t *core = cx_core_of(e);
    cx_wire_rma_t m;
    if (cx_wire_get_rma_req(body, len, &m)) {
        cx_warn("peer %s: malformed RMA_REQ refused", p->url);
        e->st.rejected_requests++;
        if (len >= 8) answer(e, p, m.id, CX_EINVAL);
        return;
    }
    if (m.kind == CX_RMA_SIGNAL) {
        int rc = cx_core_deliver_msg(core, p, m.data, m.data_len);
        answer(e, p, m.id, rc);
        return;
    }
    if (m.len > CX_RSTAGE_CHUNK || m.addr + m.len < m.addr) {
        cx_warn("peer %s: RMA_REQ of %llu bytes at 0x%llx refused (chunks are at most %u bytes)", p->url,
                (unsigned long long)m.len, (unsigned long long)m.addr, CX_RSTAGE_CHUNK);
        cx_core_count_served(core, 0, 0, 0);
        answer(e, p, m.id, CX_EINVAL);
        return;
    }
    void *pin = NULL;
    if (cx_core_region_check(core, m.addr, (size_t)m.len, &pin)) {
        cx_core_count_served(core, 0, 0, 0);
        answer(e, p, m.id, CX_EINVAL);
        return;
    }
    void *at = (void *)(uintptr_t)m.addr;
    if (m.kind == CX_RMA_WRITE) {
        int rc = cx_core_mem_copy(core, at, m.data, (size_t)m.len);
        cx_core_region_unpin(pin);
        cx_core_count_served(core, CX_XFER_WRITE, (size_t)m.len, rc == CX_OK);
        answer(e, p, m.id, rc);
        return;
    }
    size_t body_len = CX_RMA_RESP_HDR + (size_t)m.len;
    uint8_t *b = cx_conn_reserve(p->conn, CX_CTL_RMA_RESP, body_len);
    int rc = b ? cx_core_mem_copy(core, b + CX_RMA_RESP_HDR, at, (size_t)m.len) : CX_ENOMEM;
    cx_core_region_unpin(pin);
    cx_core_count_served(core, CX_XFER_READ, (size_t)m.len, rc == CX_OK);
    if (rc) {
        answer(e, p, m.id, rc);
        return;
    }
    cx_wire_put_rma_resp(b, m.id, CX_OK);
    cx_conn_commit(e, p->conn, body_len);
}
