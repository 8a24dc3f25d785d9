/* Target-side staging over the pair's data backend (tstage.h). */
#include "tstage.h"
#include "staging.h"

#include "connex/log.h"
#include "connex/wire.h"
#include "cx_gpu.h"
#include "cx_stage.h"
#include "proc.h"

#include <stdlib.h>
#include <string.h>

enum { TS_READ = 0, TS_WRITE = 1, TS_SIGNAL = 2 };
/* In TS_REQ's kind byte: the range is one chunk of the initiator's own staging, which overlaps
 * it with the others; the target stages it in chunks of its ring's full size (CX_STAGE_WHOLE),
 * not split further: a split only multiplies the TS_CHUNK / TS_ACK round trips. */
#define TS_F_PIECE 0x10u
/* A write whose bytes follow in TS_REQ (up to CONNEX_STAGE_INLINE_MAX): the target copies them
 * into its slots itself and answers TS_END after the H2D copies, one control round trip where a
 * write through slots lent to the initiator takes two (TS_REQ .. TS_CHUNK, TS_ACK .. TS_END).
 * With TS_F_SIGMSG a put_signal's message follows the bytes, delivered before that TS_END. */
#define TS_F_INLINE 0x20u
#define TS_F_SIGMSG 0x40u
#define TS_F_ALL (TS_F_PIECE | TS_F_INLINE | TS_F_SIGMSG)

/* ---- initiator side: a range, and one backend xfer per chunk ---- */
typedef struct ts_tx {
    cx_engine_t *e;
    cx_peer_t *p;
    uint64_t inc; /* the peer's incarnation when the range started */
    uint64_t id;
    int bidx; /* the backend TS_REQ named: the ring's key is for it */
    cx_tstage_range_t r;
    cx_op_t *op;    /* cx_tstage_start: the user's op, completed from done */
    int status;     /* first error */
    int ended;      /* TS_END of the data received */
    int signalling; /* the message went out: waiting for its TS_END */
    int inl;        /* the bytes (and a put_signal's message) went with TS_REQ */
    unsigned subs_out;
    uint64_t got;  /* a read: bytes its completed chunks brought in */
    uint8_t *rkey; /* the target's ring key, kept while chunks go */
    size_t rkey_len;
    uint64_t ring_id, ring_base;
    struct ts_tx *prev, *next;
} ts_tx_t;

typedef struct ts_sub {
    cx_op_t op; /* first: its x is what the backend sees */
    ts_tx_t *tx;
    uint32_t index;
    int in_submit, finished, status;
} ts_sub_t;

/* ---- target side: a range it stages for a peer ---- */
typedef struct ts_srv {
    cx_engine_t *e;
    cx_peer_t *p;
    uint64_t inc, id;
    int kind, bidx, mem_kind, device;
    unsigned flags; /* TS_F_* of its TS_REQ */
    uint64_t addr, len;
    uint8_t *inl; /* TS_F_INLINE: the bytes to write, copied from TS_REQ */
    uint8_t *msg; /* TS_F_SIGMSG: the message, delivered once the bytes are in device memory */
    size_t msg_len;
    void *pin;
    cx_staging_ring_t ring;
    cx_stage_job_t *sj; /* NULL while queued, and once the pipeline freed it */
    int started, failed, cancelled;
    /* Slots lent to a same-host peer that went silent or failed: its process may still move
     * bytes in or out of them without this CPU (cma). Held until it acks each one or its
     * process has exited; pid from its HELLO when the range came, proc followed from then. */
    int quarantined;
    uint64_t look_ns; /* quarantined: when its process is looked at next (a /proc read) */
    uint32_t pid;
    cx_proc_t proc;
    uint64_t last_ns; /* the peer's last word on it: silence past the op timeout ends it */
    uint32_t *out;    /* chunks handed to the peer, not yet acked */
    uint32_t nout, capout;
    struct ts_srv *prev, *next;
} ts_srv_t;

typedef struct cx_tstage {
    ts_tx_t *txs;
    ts_srv_t *srvs, *srvs_tail;
    int closing;
    unsigned peer_jobs;
    size_t inline_max;                   /* CONNEX_STAGE_INLINE_MAX */
    uint64_t inline_ranges, chunks_lent; /* target: served from TS_REQ's bytes; TS_CHUNKs sent */
} cx_tstage_t;

static cx_tstage_t *ts_state(cx_engine_t *e)
{
    if (!e->ts) {
        e->ts = calloc(1, sizeof *e->ts);
        if (!e->ts) {
            cx_error("tstage: out of memory");
            return NULL;
        }
        unsigned long long v = cx_opts_num(&e->opts, "CONNEX_STAGE_PEER_JOBS", NULL);
        e->ts->peer_jobs = v ? (unsigned)v : 4;
        e->ts->inline_max = (size_t)cx_opts_num(&e->opts, "CONNEX_STAGE_INLINE_MAX", NULL);
    }
    return e->ts;
}

static int is_device(int kind)
{
    return kind == CX_MEM_CUDA || kind == CX_MEM_SIM;
}

int cx_tstage_register_with(cx_engine_t *e, int b, int mem_kind)
{
    if (!is_device(mem_kind) || e->be[b].ops->software_target) return 1;
    return !cx_staging_needed(e, b, mem_kind);
}

int cx_tstage_wanted(cx_engine_t *e, const cx_peer_t *p, const cx_rregion_t *rr)
{
    return rr && p->bidx >= 0 && is_device(rr->mem_kind) && !rr->key_len[p->bidx] &&
        !e->be[p->bidx].ops->software_target;
}

static int peer_alive(const cx_peer_t *p, uint64_t inc)
{
    return p->conn && p->incarnation == inc && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT);
}

/* ---------------------------------------------------------------- frames */

static void send_ack(cx_engine_t *e, cx_peer_t *p, uint64_t id, uint32_t index, int status)
{
    uint8_t b[16];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_wr_u64(&w, id);
    cx_wr_u32(&w, index);
    cx_wr_u32(&w, (uint32_t)status);
    if (p->conn) cx_conn_send(e, p->conn, CX_CTL_TS_ACK, b, w.len);
}

static void send_end(cx_engine_t *e, cx_peer_t *p, uint64_t id, int status)
{
    uint8_t b[12];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_wr_u64(&w, id);
    cx_wr_u32(&w, (uint32_t)status);
    if (p->conn) cx_conn_send(e, p->conn, CX_CTL_TS_END, b, w.len);
}

static int send_req(cx_engine_t *e, ts_tx_t *tx, int kind)
{
    cx_peer_t *p = tx->p;
    unsigned flags = kind != TS_SIGNAL && tx->r.piece ? TS_F_PIECE : 0;
    /* The local range is host memory (the op's, or a slot this side filled already). */
    if (kind == TS_WRITE && tx->r.len <= e->ts->inline_max) flags |= TS_F_INLINE | (tx->r.signal ? TS_F_SIGMSG : 0);
    size_t data = flags & TS_F_INLINE ? tx->r.len : 0;
    size_t msg = kind == TS_SIGNAL || (flags & TS_F_SIGMSG) ? tx->r.msg_len : 0;
    size_t n = 8 + 1 + 8 + 8 + 1 + strlen(e->bnames[p->bidx]) + data + msg;
    uint8_t *b = p->conn ? cx_conn_reserve(p->conn, CX_CTL_TS_REQ, n) : NULL;
    if (!b) return p->conn ? CX_ENOMEM : CX_EPEER;
    cx_wr_t w;
    cx_wr_init(&w, b, n);
    cx_wr_u64(&w, tx->id);
    cx_wr_u8(&w, (uint8_t)(kind | (int)flags));
    cx_wr_u64(&w, kind == TS_SIGNAL ? 0 : tx->r.remote);
    cx_wr_u64(&w, kind == TS_SIGNAL ? 0 : tx->r.len);
    cx_wr_str8(&w, e->bnames[p->bidx]);
    if (data) cx_wr_bytes(&w, tx->r.local, data);
    if (msg) cx_wr_bytes(&w, tx->r.msg, msg);
    if (!w.ok) return CX_ERR;
    cx_conn_commit(e, p->conn, n);
    tx->inl = (flags & TS_F_INLINE) != 0;
    return CX_OK;
}

/* ---------------------------------------------------------------- initiator */

static ts_tx_t *tx_find(cx_tstage_t *s, const cx_peer_t *p, uint64_t id)
{
    for (ts_tx_t *tx = s->txs; tx; tx = tx->next)
        if (tx->p == p && tx->id == id) return tx;
    return NULL;
}

/* Ends the range once nothing of it is in a backend any more. */
static void tx_try_end(ts_tx_t *tx)
{
    if (tx->subs_out) return;
    /* A read is complete here once every byte is in: the target's TS_END, which says its slots
     * are back, would only add a round trip (when it comes, it finds no range and is dropped). */
    int read_in = tx->r.kind == CX_XFER_READ && !tx->r.signal && tx->got == tx->r.len;
    int done = tx->status != CX_OK || read_in || (tx->ended && (!tx->r.signal || tx->signalling > 1));
    if (!done) return;
    cx_tstage_t *s = tx->e->ts;
    if (tx->prev)
        tx->prev->next = tx->next;
    else
        s->txs = tx->next;
    if (tx->next) tx->next->prev = tx->prev;
    tx->r.done(tx->r.arg, tx->r.index, tx->status);
    free(tx->rkey);
    free(tx);
}

static void tx_fail(ts_tx_t *tx, int status)
{
    if (tx->status == CX_OK) tx->status = status;
    tx_try_end(tx);
}

static void sub_complete(ts_sub_t *sub)
{
    ts_tx_t *tx = sub->tx;
    tx->subs_out--;
    /* The slot goes back (a read) or is full (a write): the target hears either way. */
    if (peer_alive(tx->p, tx->inc)) send_ack(tx->e, tx->p, tx->id, sub->index, sub->status);
    if (sub->status != CX_OK && tx->status == CX_OK) tx->status = sub->status;
    if (sub->status == CX_OK) tx->got += sub->op.x.len;
    free(sub);
    tx_try_end(tx);
}

static void on_chunk(cx_engine_t *e, cx_peer_t *p, cx_rd_t *rd)
{
    uint64_t id = cx_rd_u64(rd);
    uint32_t index = cx_rd_u32(rd);
    uint64_t off = cx_rd_u64(rd), len = cx_rd_u64(rd), slot = cx_rd_u64(rd);
    uint64_t ring_id = cx_rd_u64(rd), ring_base = cx_rd_u64(rd);
    size_t klen;
    const uint8_t *key = cx_rd_blob16(rd, &klen);
    if (!cx_rd_done(rd)) {
        cx_warn("peer %s: malformed TS_CHUNK ignored", p->url);
        return;
    }
    ts_tx_t *tx = e->ts ? tx_find(e->ts, p, id) : NULL;
    if (!tx || tx->status != CX_OK) {
        /* The range ended here (timeout, failure): the slot goes straight back. */
        send_ack(e, p, id, index, CX_ECLOSED);
        return;
    }
    int rc = CX_OK;
    if (off > tx->r.len || len > tx->r.len - off || !len) {
        cx_warn("peer %s: TS_CHUNK [%llu, +%llu) outside a %zu-byte range", p->url, (unsigned long long)off,
                (unsigned long long)len, tx->r.len);
        rc = CX_EINVAL;
    } else if (!tx->rkey) {
        tx->rkey = malloc(klen ? klen : 1);
        if (!tx->rkey)
            rc = CX_ENOMEM;
        else if (klen)
            memcpy(tx->rkey, key, klen);
        tx->rkey_len = klen;
        tx->ring_id = ring_id;
        tx->ring_base = ring_base;
    }
    /* Reconnected on another backend since TS_REQ: the key is for the old one. */
    if (!rc && p->bidx != tx->bidx) rc = CX_EPEER;
    if (!rc && !p->ep) rc = cx_peer_ensure_ep(e, p) ? CX_EPEER : CX_OK;
    ts_sub_t *sub = rc ? NULL : calloc(1, sizeof *sub);
    if (!sub) {
        send_ack(e, p, id, index, rc ? rc : CX_ENOMEM);
        tx_fail(tx, rc ? rc : CX_ENOMEM);
        return;
    }
    sub->tx = tx;
    sub->index = index;
    cx_op_t *so = &sub->op;
    so->e = e;
    so->kind = CX_OPK_TSUB;
    so->ts = sub;
    so->deadline_ns = tx->r.deadline_ns;
    so->stage = OPS_IN_BACKEND;
    cx_xfer_t *x = &so->x;
    x->kind = tx->r.kind;
    x->local = (uint8_t *)tx->r.local + off;
    x->len = (size_t)len;
    x->local_mh = tx->r.local_mh;
    x->local_mem = CX_MEM_HOST;
    x->remote = slot;
    x->remote_region = tx->ring_id;
    x->remote_base = tx->ring_base;
    x->rkey = tx->rkey;
    x->rkey_len = tx->rkey_len;
    cx_op_link(e, p, so);
    tx->subs_out++;
    sub->in_submit = 1;
    rc = e->be[p->bidx].ops->submit(e->be[p->bidx].b, p->ep, x);
    sub->in_submit = 0;
    /* sub_complete runs exactly once, whichever way the submit went. */
    if (sub->finished)
        sub_complete(sub);
    else if (rc != CX_OK)
        cx_op_finish(e, so, rc);
}

static void on_end(cx_engine_t *e, cx_peer_t *p, cx_rd_t *rd)
{
    uint64_t id = cx_rd_u64(rd);
    int status = (int)cx_rd_u32(rd);
    if (!cx_rd_done(rd)) {
        cx_warn("peer %s: malformed TS_END ignored", p->url);
        return;
    }
    ts_tx_t *tx = e->ts ? tx_find(e->ts, p, id) : NULL;
    if (!tx) return; /* it ended here first */
    if (status != CX_OK) {
        tx_fail(tx, status);
        return;
    }
    if (tx->signalling || (tx->inl && tx->r.signal)) {
        tx->ended = 1;
        tx->signalling = 2; /* the message went with the bytes, delivered after them */
    } else {
        tx->ended = 1;
        if (tx->r.signal && tx->status == CX_OK && !tx->subs_out) {
            /* Every chunk is in the target's device memory now: the message may go. */
            int rc = send_req(e, tx, TS_SIGNAL);
            if (rc) {
                tx_fail(tx, rc);
                return;
            }
            tx->signalling = 1;
        }
    }
    tx_try_end(tx);
}

int cx_tstage_range(cx_engine_t *e, cx_peer_t *p, const cx_tstage_range_t *r)
{
    cx_tstage_t *s = ts_state(e);
    if (!s) return CX_ENOMEM;
    if (s->closing) return CX_ECLOSED;
    if (!p->conn || p->bidx < 0) return CX_EPEER;
    ts_tx_t *tx = calloc(1, sizeof *tx);
    if (!tx) return CX_ENOMEM;
    tx->e = e;
    tx->p = p;
    tx->inc = p->incarnation;
    tx->bidx = p->bidx;
    tx->id = e->next_query_id++;
    tx->r = *r;
    int rc = send_req(e, tx, r->kind == CX_XFER_READ ? TS_READ : TS_WRITE);
    if (rc) {
        free(tx);
        return rc;
    }
    tx->next = s->txs;
    if (s->txs) s->txs->prev = tx;
    s->txs = tx;
    return CX_OK;
}

static void op_range_done(void *arg, uint32_t index, int status)
{
    (void)index;
    cx_op_t *op = arg;
    op->ts = NULL;
    cx_op_finish(op->e, op, status);
}

void cx_tstage_start(cx_engine_t *e, cx_op_t *op)
{
    cx_peer_t *p = op->peer;
    if (!p->ts_logged) {
        p->ts_logged = 1;
        cx_info("peer %s: its device memory is not reachable over %s here: it stages it through its "
                "pinned ring, and the bytes cross on %s",
                p->url, e->bnames[p->bidx], e->bnames[p->bidx]);
    }
    const cx_xfer_t *x = &op->x;
    int sig = x->kind == CX_XFER_PUT_SIGNAL;
    cx_tstage_range_t r = { x->kind == CX_XFER_READ ? CX_XFER_READ : CX_XFER_WRITE,
                            x->local,
                            x->local_mh,
                            x->remote,
                            x->len,
                            sig ? x->msg : NULL,
                            sig ? x->msg_len : 0,
                            sig,
                            op->deadline_ns,
                            op_range_done,
                            op,
                            0,
                            0 };
    op->stage = OPS_TSTAGE;
    int rc = cx_tstage_range(e, p, &r);
    if (rc) {
        cx_op_finish(e, op, rc);
        return;
    }
    op->ts = e->ts->txs; /* cx_tstage_range put it first */
    e->ts->txs->op = op;
}

int cx_tstage_op_finish(cx_engine_t *e, cx_op_t *op, int status)
{
    (void)e;
    if (op->kind == CX_OPK_TSUB) {
        ts_sub_t *sub = op->ts;
        if (sub->finished) {
            cx_error("tstage: chunk %u completed twice (ignored)", sub->index);
            return 1;
        }
        sub->finished = 1;
        sub->status = status;
        if (!sub->in_submit) sub_complete(sub);
        return 1;
    }
    /* The user's op failed from outside (peer failure, shutdown): its range ends as soon as no
     * chunk of it is in a backend; op_range_done then completes the op. */
    ts_tx_t *tx = op->ts;
    tx_fail(tx, status == CX_OK ? CX_ERR : status);
    return 1;
}

/* ---------------------------------------------------------------- target */

static void srv_unlink(cx_tstage_t *s, ts_srv_t *v)
{
    if (v->prev)
        v->prev->next = v->next;
    else
        s->srvs = v->next;
    if (v->next)
        v->next->prev = v->prev;
    else
        s->srvs_tail = v->prev;
}

static void srv_free(ts_srv_t *v)
{
    cx_proc_forget(&v->proc);
    if (v->pin) cx_core_region_unpin(v->pin);
    free(v->inl);
    free(v->msg);
    free(v->out);
    free(v);
}

static void srv_start_queued(cx_engine_t *e, cx_peer_t *p);

static void srv_chunk(const cx_stage_chunk_t *c)
{
    ts_srv_t *v = c->job_arg;
    cx_engine_t *e = v->e;
    cx_peer_t *p = v->p;
    if (v->inl) {
        /* The bytes came with the request: into the slot here, then its H2D copy. */
        memcpy(c->host, v->inl + c->off, c->len);
        cx_stage_chunk_done(c->job, c->index, CX_OK);
        return;
    }
    int rc = CX_OK;
    if (!peer_alive(p, v->inc) || v->failed) rc = CX_EPEER;
    if (!rc && v->nout == v->capout) {
        uint32_t cap = v->capout ? v->capout * 2 : 8;
        uint32_t *n = realloc(v->out, cap * sizeof *n);
        if (!n)
            rc = CX_ENOMEM;
        else {
            v->out = n;
            v->capout = cap;
        }
    }
    size_t klen = v->ring.key_len[v->bidx];
    size_t n = 8 + 4 + 8 * 5 + 2 + klen;
    uint8_t *b = rc ? NULL : cx_conn_reserve(p->conn, CX_CTL_TS_CHUNK, n);
    if (!b) {
        cx_stage_chunk_done(c->job, c->index, rc ? rc : CX_ENOMEM);
        return;
    }
    cx_wr_t w;
    cx_wr_init(&w, b, n);
    cx_wr_u64(&w, v->id);
    cx_wr_u32(&w, c->index);
    cx_wr_u64(&w, c->off);
    cx_wr_u64(&w, c->len);
    cx_wr_u64(&w, (uint64_t)(uintptr_t)c->host);
    cx_wr_u64(&w, v->ring.id);
    cx_wr_u64(&w, (uint64_t)(uintptr_t)v->ring.base);
    cx_wr_blob16(&w, v->ring.key[v->bidx], klen);
    cx_conn_commit(e, p->conn, n);
    v->out[v->nout++] = c->index;
    e->ts->chunks_lent++;
}

static void srv_done(void *arg, cx_stage_job_t *sj, int status)
{
    (void)sj;
    ts_srv_t *v = arg;
    cx_engine_t *e = v->e;
    cx_tstage_t *s = e->ts;
    v->sj = NULL;
    cx_core_count_served(cx_core_of(e), v->kind == TS_READ ? CX_XFER_READ : CX_XFER_WRITE,
                         status == CX_OK ? (size_t)v->len : 0, status == CX_OK);
    /* A put_signal's message, once every byte is in device memory (the H2D copies are done). */
    if (status == CX_OK && v->msg && !s->closing && peer_alive(v->p, v->inc))
        status = cx_core_deliver_msg(cx_core_of(e), v->p, v->msg, v->msg_len);
    if (!s->closing && peer_alive(v->p, v->inc)) send_end(e, v->p, v->id, status);
    cx_peer_t *p = v->p;
    srv_unlink(s, v);
    srv_free(v);
    if (!s->closing) srv_start_queued(e, p);
}

static int srv_begin(cx_engine_t *e, ts_srv_t *v)
{
    v->started = 1;
    int rc = cx_staging_ring(e, v->mem_kind, v->device, &v->ring);
    v->last_ns = cx_now_ns(); /* after the ring exists: creating it is not the peer's silence */
    if (rc) return rc;
    cx_stage_cbs_t cbs = { srv_chunk, srv_done, v };
    rc = cx_stage_start(v->ring.st, v->kind == TS_READ ? CX_STAGE_OUT : CX_STAGE_IN, (void *)(uintptr_t)v->addr,
                        (size_t)v->len, v->flags & (TS_F_PIECE | TS_F_INLINE) ? CX_STAGE_WHOLE : 0, &cbs, &v->sj);
    if (!rc && v->inl) v->e->ts->inline_ranges++;
    return rc;
}

/* A range that could not start ends here, answered. */
static void srv_refuse(cx_engine_t *e, ts_srv_t *v, int rc)
{
    cx_core_count_served(cx_core_of(e), 0, 0, 0);
    send_end(e, v->p, v->id, rc);
    srv_unlink(e->ts, v);
    srv_free(v);
}

static void srv_start_queued(cx_engine_t *e, cx_peer_t *p)
{
    cx_tstage_t *s = e->ts;
    unsigned running = 0;
    for (ts_srv_t *v = s->srvs; v; v = v->next)
        if (v->p == p && v->started && !v->failed) running++;
    for (ts_srv_t *v = s->srvs, *n; v && running < s->peer_jobs; v = n) {
        n = v->next;
        if (v->p != p || v->started) continue;
        int rc = srv_begin(e, v);
        if (rc) {
            srv_refuse(e, v, rc);
            continue;
        }
        running++;
    }
}

static void on_req(cx_engine_t *e, cx_peer_t *p, cx_rd_t *rd)
{
    cx_core_t *core = cx_core_of(e);
    uint64_t id = cx_rd_u64(rd);
    int kind = cx_rd_u8(rd);
    unsigned flags = (unsigned)kind & TS_F_ALL;
    kind &= ~(int)TS_F_ALL;
    uint64_t addr = cx_rd_u64(rd), len = cx_rd_u64(rd);
    char bname[CX_BNAME_MAX + 1];
    cx_rd_str8(rd, bname, sizeof bname);
    /* The bytes of an inline write, then (TS_F_SIGMSG) the message: whatever follows them. */
    size_t rest = rd->ok ? rd->len - rd->off : 0;
    int inl = (flags & TS_F_INLINE) != 0;
    int bad_flags = (inl && kind != TS_WRITE) || ((flags & TS_F_SIGMSG) && !inl);
    int bad_rest = kind != TS_SIGNAL && (inl ? len > rest || (!(flags & TS_F_SIGMSG) && len != rest) : rest != 0);
    if (!rd->ok || bad_flags || bad_rest || kind > TS_SIGNAL) {
        cx_warn("peer %s: malformed TS_REQ refused", p->url);
        e->st.rejected_requests++;
        if (rd->len >= 8) send_end(e, p, id, CX_EINVAL);
        return;
    }
    if (kind == TS_SIGNAL) {
        size_t n = rd->len - rd->off;
        send_end(e, p, id, cx_core_deliver_msg(core, p, rd->p + rd->off, n));
        return;
    }
    cx_tstage_t *s = ts_state(e);
    ts_srv_t *v = s ? calloc(1, sizeof *v) : NULL;
    if (!v) {
        send_end(e, p, id, CX_ENOMEM);
        return;
    }
    v->e = e;
    v->p = p;
    v->inc = p->incarnation;
    v->id = id;
    v->kind = kind;
    v->flags = flags;
    v->addr = addr;
    v->len = len;
    v->bidx = -1;
    if (inl && len) {
        const uint8_t *d = rd->p + rd->off;
        v->inl = malloc((size_t)len);
        v->msg_len = rest - (size_t)len;
        v->msg = flags & TS_F_SIGMSG ? malloc(v->msg_len ? v->msg_len : 1) : NULL;
        if (v->inl) memcpy(v->inl, d, (size_t)len);
        if (v->msg && v->msg_len) memcpy(v->msg, d + len, v->msg_len);
    }
    v->pid = p->same_host ? p->proc.pid : 0;
    cx_proc_init(&v->proc);
    v->last_ns = cx_now_ns();
    v->prev = s->srvs_tail;
    if (s->srvs_tail)
        s->srvs_tail->next = v;
    else
        s->srvs = v;
    s->srvs_tail = v;
    for (int b = 0; b < e->nb; b++)
        if (!strcmp(e->bnames[b], bname)) v->bidx = b;
    int rc = CX_OK;
    cx_gpu_mem_t m;
    if (inl && len && (!v->inl || ((flags & TS_F_SIGMSG) && !v->msg))) {
        rc = CX_ENOMEM;
    } else if (v->bidx < 0) {
        cx_warn("peer %s: TS_REQ names backend '%s', which is not open here", p->url, bname);
        rc = CX_EINVAL;
    } else if (!len || addr + len < addr || cx_core_region_check(core, addr, (size_t)len, &v->pin)) {
        rc = CX_EINVAL;
    } else if (cx_gpu_mem_query((void *)(uintptr_t)addr, (size_t)len, &m) || !is_device(m.kind)) {
        cx_warn("peer %s: TS_REQ for [0x%llx, +%llu), which is not device memory", p->url, (unsigned long long)addr,
                (unsigned long long)len);
        rc = CX_EINVAL;
    } else {
        v->mem_kind = m.kind;
        v->device = m.kind == CX_MEM_SIM ? 0 : m.device;
    }
    if (rc) {
        srv_refuse(e, v, rc);
        return;
    }
    srv_start_queued(e, p);
    if (v->started && v->sj) cx_stage_progress(v->ring.st); /* its first copies start now */
}

/* The slots the peer holds come back (their slots are free again once the cancel drained the
 * copies). srv_done may free v inside: it runs from cx_stage_progress only. */
static void srv_release(ts_srv_t *v, int status)
{
    cx_stage_job_t *sj = v->sj;
    uint32_t n = v->nout;
    v->nout = 0;
    v->quarantined = 0;
    for (uint32_t i = 0; i < n; i++) cx_stage_chunk_done(sj, v->out[i], status);
}

static void srv_fail(ts_srv_t *v, int status)
{
    v->failed = 1;
    if (!v->sj) return;
    if (!v->cancelled) {
        v->cancelled = 1;
        cx_stage_cancel(v->sj, status);
    }
    /* A same-host peer's process moves bytes with the kernel's help (cma), without this CPU and
     * past any connection we close: the slots it holds wait for its acks or its exit. Engine
     * teardown does not wait (the ring goes with it). */
    if (status != CX_ECLOSED && v->nout && v->pid) {
        if (!v->quarantined) {
            v->quarantined = 1;
            cx_proc_follow(&v->proc, v->pid);
            cx_warn("peer %s: %u staging slot(s) it holds stay out of use until it gives them back or "
                    "its process exits",
                    v->p->url, v->nout);
        }
        return;
    }
    srv_release(v, status);
}

static void on_ack(cx_engine_t *e, cx_peer_t *p, cx_rd_t *rd)
{
    uint64_t id = cx_rd_u64(rd);
    uint32_t index = cx_rd_u32(rd);
    int status = (int)cx_rd_u32(rd);
    if (!cx_rd_done(rd)) {
        cx_warn("peer %s: malformed TS_ACK ignored", p->url);
        return;
    }
    ts_srv_t *v = NULL;
    if (e->ts)
        for (v = e->ts->srvs; v; v = v->next)
            if (v->p == p && v->id == id && v->started) break;
    if (!v || !v->sj) return; /* ended here already (timeout, failure) */
    uint32_t i = 0;
    while (i < v->nout && v->out[i] != index) i++;
    if (i == v->nout) {
        cx_warn("peer %s: TS_ACK for chunk %u that it does not hold: ignored", p->url, index);
        return;
    }
    v->out[i] = v->out[--v->nout];
    v->last_ns = cx_now_ns();
    cx_stage_chunk_done(v->sj, index, status);
    cx_stage_progress(v->ring.st);
}

void cx_tstage_on_frame(cx_engine_t *e, cx_peer_t *p, uint8_t type, const uint8_t *body, size_t len)
{
    cx_rd_t rd;
    cx_rd_init(&rd, body, len);
    switch (type) {
    case CX_CTL_TS_REQ: on_req(e, p, &rd); break;
    case CX_CTL_TS_CHUNK: on_chunk(e, p, &rd); break;
    case CX_CTL_TS_ACK: on_ack(e, p, &rd); break;
    default: on_end(e, p, &rd); break;
    }
}

/* ---------------------------------------------------------------- both */

void cx_tstage_progress(cx_engine_t *e)
{
    cx_tstage_t *s = e->ts;
    if (!s || (!s->txs && !s->srvs)) return;
    uint64_t now = cx_now_ns();
    for (ts_tx_t *tx = s->txs, *n; tx; tx = n) {
        n = tx->next;
        if (tx->status != CX_OK) continue;
        /* Chunks in a backend end through the op timeout and the peer's failure (linked ops);
         * these catch a range waiting for the target's next word. */
        if (!peer_alive(tx->p, tx->inc))
            tx_fail(tx, CX_EPEER);
        else if (now >= tx->r.deadline_ns) {
            cx_warn("peer %s: staged range of %zu bytes timed out", tx->p->url, tx->r.len);
            tx_fail(tx, CX_ETIMEDOUT);
        }
    }
    uint64_t quiet = cx_ms_to_ns(e->cfg.op_timeout_ms);
    for (ts_srv_t *v = s->srvs, *n; v; v = n) {
        n = v->next;
        if (v->quarantined) {
            /* Its process gone (or never followed: no pidfd, no /proc): nothing can land. */
            if (now < v->look_ns) continue;
            v->look_ns = now + cx_ms_to_ns(10);
            int ps = cx_proc_state(&v->proc);
            if (ps == CX_PROC_EXITED || ps == CX_PROC_UNKNOWN) srv_release(v, CX_EPEER);
            continue;
        }
        if (v->failed) continue;
        /* A queued range waits for its peer's credits as long as the peer lives. */
        int st = !peer_alive(v->p, v->inc) ? CX_EPEER : v->started && now - v->last_ns >= quiet ? CX_ETIMEDOUT : CX_OK;
        if (st == CX_OK) continue;
        if (!v->started) {
            srv_unlink(s, v);
            srv_free(v);
            continue;
        }
        if (st == CX_ETIMEDOUT) {
            cx_warn("peer %s: silent for %u ms on the %llu bytes staged for it: its range ends", v->p->url,
                    e->cfg.op_timeout_ms, (unsigned long long)v->len);
            /* No late byte of its may land in a slot that is handed out again. */
            cx_peer_drop_ep(e, v->p, CX_ETIMEDOUT);
        }
        srv_fail(v, st); /* srv_done runs from the pipeline's next progress */
    }
}

void cx_tstage_fini(cx_engine_t *e)
{
    cx_tstage_t *s = e->ts;
    if (!s) return;
    s->closing = 1;
    while (s->txs) {
        ts_tx_t *tx = s->txs;
        if (tx->subs_out) {
            cx_error("tstage: %u chunk(s) never completed by the backend: leaking the range", tx->subs_out);
            s->txs = tx->next;
            continue;
        }
        tx_fail(tx, CX_ECLOSED);
    }
    for (ts_srv_t *v = s->srvs, *n; v; v = n) {
        n = v->next;
        if (!v->sj) {
            srv_unlink(s, v);
            srv_free(v);
        } else {
            srv_fail(v, CX_ECLOSED);
        }
    }
    /* Ranges with copies in flight end in cx_staging_fini (the pipeline's destroy runs their
     * done callbacks): s stays until then. */
}

void cx_tstage_free(cx_engine_t *e)
{
    cx_tstage_t *s = e->ts;
    if (!s) return;
    while (s->srvs) {
        ts_srv_t *v = s->srvs;
        srv_unlink(s, v);
        srv_free(v);
    }
    free(s);
    e->ts = NULL;
}

void cx_tstage_debug(cx_engine_t *e, cx_tstage_debug_t *out)
{
    memset(out, 0, sizeof *out);
    cx_tstage_t *s = e->ts;
    if (!s) return;
    out->inline_ranges = s->inline_ranges;
    out->chunks_lent = s->chunks_lent;
    for (ts_srv_t *v = s->srvs; v; v = v->next) {
        if (v->quarantined)
            out->quarantined += v->nout;
        else if (v->started)
            out->served++;
        else
            out->queued++;
    }
    for (ts_tx_t *tx = s->txs; tx; tx = tx->next) {
        out->ranges++;
        out->subs += tx->subs_out;
    }
}
