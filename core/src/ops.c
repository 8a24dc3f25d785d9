/* Op lifecycle on the progress thread: resolve the peer, wait for it or for its region, hand the
 * xfer to the peer's backend, complete it (ok, error, peer failure or timeout). */
#include "engine.h"

#include "connex/log.h"
#include "cx_sched.h"
#include "cause.h"
#include "staging.h"
#include "tstage.h"
#include "batch.h"
#include "drive.h"
#include "mobility/mobility.h"

#include <stdio.h>
#include <string.h>

void cx_op_link(cx_engine_t *e, cx_peer_t *p, cx_op_t *op)
{
    cx_peer_activate(e, p);
    op->peer = p;
    op->prev = p->ops.prev;
    op->next = &p->ops;
    p->ops.prev->next = op;
    p->ops.prev = op;
}

static void unlink_op(cx_op_t *op)
{
    if (!op->next) return;
    op->prev->next = op->next;
    op->next->prev = op->prev;
    op->next = op->prev = NULL;
}

void cx_op_finish(cx_engine_t *e, cx_op_t *op, int status)
{
    /* Whatever its stage says now: failing a peer's ops marks them done before finishing them. */
    if (e->handoff) cx_drive_handoff_drop(e, op);
    unlink_op(op);
    if (op->peer && op->peer->n_gone) cx_peer_delack_check(e, op->peer);
    if (op->ts && cx_tstage_op_finish(e, op, status)) return;
    if (op->arg && op->kind != CX_OPK_EXEC && cx_staging_op_finish(e, op, status)) return;
    if (op->lpin) { /* no backend or copy touches its local bytes any more */
        atomic_fetch_sub(&op->lpin->pins, 1);
        op->lpin = NULL;
    }
    if (cx_sched_op_finish(e, op, status)) return; /* credit back; a chunk goes to its parent */
    op->stage = OPS_DONE;
    if (op->kind < CX_OPK_COUNT) {
        cx_peer_t *p = op->peer;
        if (status == CX_OK) {
            uint64_t n = op->kind == CX_OPK_MSG ? op->x.msg_len : op->nent ? op->vbytes : op->x.len;
            uint64_t k = op->nent ? op->nent : 1; /* a batch's run counts its entries */
            e->st.ops[op->kind] += k;
            e->st.bytes[op->kind] += n;
            int b = p && p->bidx >= 0 && p->bidx < e->nb ? p->bidx : CX_MAX_BACKENDS;
            if (op->t0_ns) cx_hist_add(&e->hist[b][op->kind], cx_now_ns() - op->t0_ns);
            if (p) {
                p->m.ops[op->kind] += k;
                p->m.bytes[op->kind] += n;
            }
        } else {
            e->st.op_errors[op->kind]++;
            if (status == CX_ETIMEDOUT) e->st.op_timeouts++;
            if (p) {
                p->m.errors++;
                p->m.timeouts += status == CX_ETIMEDOUT;
            }
        }
    }
    cx_op_complete(op, status);
}

/* A completion proves the peer's process alive only when its CPU took part: a message or a
 * put_signal (the target's core acked it), or any op of a backend whose target serves every
 * request in software. One-sided reads and writes over RDMA or cma complete while the target
 * process is stopped or hung (its NIC, or its memory, still answers): counting them kept a
 * SIGSTOPped libfabric shm peer UP 170 ms past its heartbeat timeout, for as long as reads of its
 * memory went on completing (connex-bench failover). */
static int proves_alive(const cx_engine_t *e, const cx_op_t *op)
{
    if (op->x.kind == CX_XFER_MSG || op->x.kind == CX_XFER_PUT_SIGNAL) return 1;
    const cx_peer_t *p = op->peer;
    return p->bidx >= 0 && p->bidx < e->nb && e->be[p->bidx].ops->software_target;
}

/* How long an op a backend ended with a local error (CX_ERR) waits for the peer's verdict. A
 * killed peer's connections all close at once, but the backend's (its provider cancels the ops
 * posted on it: libfabric rxm, FI_ECANCELED) may be read before the control connection's or the
 * same-host watch's news of the death, in the same progress turn or the next. Told CX_ERR, a
 * caller would not hand the work to another replica (connex-bench soak, 1,000 kills on
 * libfabric tcp: 2 of 7.9 million ops). A local error that is one reaches the caller this much
 * later, give or take a tick. */
#define CX_SETTLE_NS (20 * CX_NS_PER_MS)

/* Ops linked to their peer (the ones cx_peer_ops_fail ends): a caller's, a background
 * transfer's chunk, and a staged op's chunk (its own ring's or one the target stages), whose
 * status their owner takes (a chunk ended CX_ERR by a killed peer's cancelled post ended the
 * transfer CX_ERR: connex-bench soak, libfabric tcp, 1 of 60,000 batch ops; a staged put_signal
 * to a peer killed mid-staging, conformance_gpu on CUDA). Not a staged op itself or a group step,
 * whose chunks or owners end them. */
static int may_wait_verdict(const cx_op_t *op)
{
    if (!op->next) return 0;
    if (op->kind == CX_OPK_SUB || op->kind == CX_OPK_TSUB) return 1;
    return !op->arg && (op->kind < CX_OPK_COUNT || op->kind == CX_OPK_CHUNK);
}

void cx_op_backend_status(cx_engine_t *e, cx_op_t *op, int status)
{
    cx_peer_t *p = op->peer;
    if (p && may_wait_verdict(op)) {
        /* The connection failed under it. While the peer is probed the op waits for the
         * verdict (CX_EPEER if the peer fails, CX_ERR if it answers). Otherwise it stays
         * CX_EPEER: a backend that saw its connection fail before the core judged the peer (a
         * process killed, its reset or the same-host watch not read yet) reports a dead peer
         * more often than not, and a caller told CX_ERR would not hand the work elsewhere
         * (connex-bench soak, 1000 kills: a few hundred ops ended CX_ERR that way). */
        if (status == CX_EPEER && p->probing) {
            op->stage = OPS_WAIT_VERDICT;
            op->settle_ns = 0;
            return;
        }
        /* A local error to a peer still up: the verdict may be on its way (CX_SETTLE_NS). */
        if (status == CX_ERR && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT)) {
            op->stage = OPS_WAIT_VERDICT;
            op->settle_ns = cx_now_ns() + CX_SETTLE_NS;
            return;
        }
    }
    cx_op_finish(e, op, status);
}

void cx_core_xfer_done(cx_core_t *c, cx_xfer_t *x, int status)
{
    cx_engine_t *e = cx_engine_of(c);
    if (x->core) {
        cx_brun_xfer_done(e, x, status); /* a batch run's entry (batch.h) */
        return;
    }
    cx_op_xfer_done(e, (cx_op_t *)x, status);
}

void cx_op_xfer_done(cx_engine_t *e, cx_op_t *op, int status)
{
    if (op->stage != OPS_IN_BACKEND) {
        cx_error("backend completed an xfer twice or one it did not own (stage %d): ignored", op->stage);
        return;
    }
    if (op->forced_status) {
        cx_op_finish(e, op, op->forced_status); /* the core's own verdict (failure, timeout, close) */
        return;
    }
    if (status == CX_OK && op->peer && proves_alive(e, op)) cx_peer_heard(e, op->peer);
    cx_op_backend_status(e, op, status);
}

static size_t remote_len(const cx_op_t *op);

/* An op's local error, its peer alive: the peer unregistered the region the op was in (its
 * REG_DEL came with, or before, the error: a provider may drop the connection on a write to a
 * closed key) is the caller's CX_EINVAL, as an op started after the unregister gets. */
static int local_error(cx_peer_t *p, const cx_op_t *op)
{
    if (op->x.kind == CX_XFER_MSG || !op->x.len || cx_rregion_find(p, op->x.remote, remote_len(op))) return CX_ERR;
    cx_warn("peer %s: remote range [0x%llx, +%zu) was unregistered there while the op was in it", p->url,
            (unsigned long long)op->x.remote, remote_len(op));
    return CX_EINVAL;
}

/* The probe of a peer ended with an answer: ops whose connection failed under them meanwhile
 * end with a local error, the peer being alive. */
void cx_ops_verdict_alive(cx_engine_t *e, cx_peer_t *p)
{
    for (cx_op_t *op = p->ops.next, *n; op != &p->ops; op = n) {
        n = op->next;
        if (op->stage == OPS_WAIT_VERDICT) cx_op_finish(e, op, local_error(p, op));
    }
}

static void go_backend(cx_engine_t *e, cx_op_t *op, cx_rregion_t *rr)
{
    cx_peer_t *p = op->peer;
    /* A caller drives (drive.h): connecting a data endpoint, a thread-bound backend and device
     * memory (staging) stay with the progress thread, and so does every op after one handed off
     * (ops reach the backend in the order they started). */
    if (e->driving && (e->handoff || !p->ep || e->be[p->bidx].ops->thread_bound)) {
        cx_drive_handoff(e, op);
        return;
    }
    if (cx_peer_ensure_ep(e, p)) {
        cx_op_finish(e, op, CX_EUNSUPPORTED);
        return;
    }
    cx_xfer_t *x = &op->x;
    if (x->kind != CX_XFER_MSG) {
        /* Look the local region up again: another thread may have unregistered it since the
         * caller checked. */
        pthread_rwlock_rdlock(&e->reg.lock);
        cx_region_t *lr = cx_registry_find_locked(&e->reg, (uint64_t)(uintptr_t)x->local, x->len);
        x->local_mh = lr ? lr->mh[p->bidx] : NULL;
        x->local_mem = lr ? lr->mem_kind : CX_MEM_HOST;
        /* A chunk of a staged op moves the ring's bytes, which its parent's pin does not cover
         * and the engine owns. */
        if (lr && !op->lpin && !op->arg && !op->ts) {
            atomic_fetch_add(&lr->pins, 1);
            op->lpin = lr;
        }
        pthread_rwlock_unlock(&e->reg.lock);
        if (!lr) {
            cx_warn("%s: local buffer %p was unregistered before the op started", p->url, x->local);
            cx_op_finish(e, op, CX_EINVAL);
            return;
        }
        int remote_staged = cx_tstage_wanted(e, p, rr);
        if (e->driving && (x->local_mem != CX_MEM_HOST || remote_staged)) {
            cx_drive_handoff(e, op);
            return;
        }
        x->remote_region = rr->id;
        x->remote_base = rr->addr;
        x->rkey = rr->key[p->bidx];
        x->rkey_len = rr->key_len[p->bidx];
        /* A batch's run is made of entries that need neither ring (batch.c): a region that
         * changed kind since is refused, as a vanished one is. */
        if (op->nent && (remote_staged || cx_staging_needed(e, p->bidx, x->local_mem))) {
            cx_warn("%s: a batch's regions changed memory kind before its entries started", p->url);
            cx_op_finish(e, op, CX_EINVAL);
            return;
        }
        /* Device memory on this side goes through this side's ring; on the peer's side (when
         * its backend has no key for it) through the peer's ring, both at once if need be. */
        if (cx_staging_needed(e, p->bidx, x->local_mem)) {
            cx_staging_submit(e, op, rr);
            return;
        }
        if (remote_staged) {
            cx_tstage_start(e, op);
            return;
        }
    }
    op->stage = OPS_IN_BACKEND;
    op->forced_status = 0;
    if (op->nent) {
        cx_brun_post(e, op); /* a batch's run: its entries go to the backend, not x */
        return;
    }
    if (e->bpost && cx_bpost_take(e, op)) return; /* a batch posts its entries in bulk (batch.h) */
    int rc = e->be[p->bidx].ops->submit(e->be[p->bidx].b, p->ep, x);
    /* A backend that refuses with CX_EPEER has seen the connection fail (its report may not be
     * read yet): the caller is told so, as for a completion (cx_core_xfer_done). */
    if (rc != CX_OK && op->stage == OPS_IN_BACKEND) cx_op_backend_status(e, op, rc);
}

void cx_op_issue(cx_engine_t *e, cx_op_t *op)
{
    if (cx_sched_admit(e, op)) return; /* waits for a credit, or goes in chunks (cx_sched.h) */
    cx_op_go(e, op);
}

/* The remote range an op checks: a batch's run spans its entries' (engine.h). */
static size_t remote_len(const cx_op_t *op)
{
    return op->nent ? op->rspan : op->x.len;
}

void cx_op_go(cx_engine_t *e, cx_op_t *op)
{
    cx_peer_t *p = op->peer;
    if (op->x.kind == CX_XFER_MSG) {
        go_backend(e, op, NULL);
        return;
    }
    cx_rregion_t *rr = cx_rregion_find(p, op->x.remote, remote_len(op));
    if (rr) {
        go_backend(e, op, rr);
        return;
    }
    /* Not in what the peer told us: it may have registered it just now (its REG_ADD can be
     * behind a message on the data path), so ask before calling it an error. */
    cx_op_query_region(e, op);
}

void cx_op_query_region(cx_engine_t *e, cx_op_t *op)
{
    cx_peer_t *p = op->peer;
    uint8_t body[24];
    cx_wr_t w;
    cx_wr_init(&w, body, sizeof body);
    op->query_id = e->next_query_id++;
    cx_wr_u64(&w, op->query_id);
    cx_wr_u64(&w, op->x.remote);
    cx_wr_u64(&w, remote_len(op));
    op->stage = OPS_WAIT_REGION;
    cx_conn_send(e, p->conn, CX_CTL_REG_QUERY, body, w.len);
}

void cx_region_reply(cx_engine_t *e, cx_peer_t *p, uint64_t qid, int found)
{
    for (cx_op_t *op = p->ops.next; op != &p->ops; op = op->next) {
        if (op->stage != OPS_WAIT_REGION || op->query_id != qid) continue;
        cx_rregion_t *rr = found ? cx_rregion_find(p, op->x.remote, remote_len(op)) : NULL;
        if (op->kind == CX_OPK_BQUERY) { /* a batch's check: the batch logs a miss */
            cx_op_finish(e, op, rr ? CX_OK : CX_EINVAL);
        } else if (!rr) {
            cx_warn("peer %s: remote range [0x%llx, +%zu) is not inside any region it registered", p->url,
                    (unsigned long long)op->x.remote, remote_len(op));
            cx_op_finish(e, op, CX_EINVAL);
        } else {
            go_backend(e, op, rr);
        }
        return;
    }
}

cx_peer_t *cx_op_resolve(cx_engine_t *e, cx_op_t *op, int *rc)
{
    cx_peer_t *p;
    if (op->hint) {
        /* This thread named the peer so before, and it resolved (so it is not this engine). */
        p = op->hint;
        if (op->by_url) cx_peer_follow_url(p, &op->url);
    } else if (op->by_url) {
        if (!cx_lid_cmp(&op->url.lid, &e->lid)) {
            cx_warn("op to %s: that is this engine's own identity", e->url);
            *rc = CX_EINVAL;
            return NULL;
        }
        p = cx_peer_get_url(e, &op->url);
        if (!p) {
            *rc = CX_ENOMEM;
            return NULL;
        }
    } else {
        p = cx_peer_find(e, &op->lid);
        cx_dir_entry_t de;
        cx_url_t du;
        /* Never seen, but the directory knows where it lives: go there. */
        if (!p && cx_lid_cmp(&op->lid, &e->lid) && cx_dir_lookup(e, &op->lid, &de) == CX_OK &&
            cx_url_parse(de.url, &du, NULL, 0) == CX_OK && !cx_lid_cmp(&du.lid, &op->lid)) {
            op->url = du;
            op->by_url = 1;
            p = cx_peer_get_url(e, &du);
            if (!p) {
                *rc = CX_ENOMEM;
                return NULL;
            }
        }
        if (!p) {
            char lid[96];
            cx_lid_format(&op->lid, lid, sizeof lid);
            cx_warn("unknown peer %s: name it by URL (ip:port#%s) the first time", lid, lid);
            *rc = CX_EINVAL;
            return NULL;
        }
    }
    return p;
}

void cx_op_start(cx_engine_t *e, cx_op_t *op)
{
    if (op->kind == CX_OPK_EXEC) {
        op->fn(e, op->arg);
        cx_op_complete(op, CX_OK);
        return;
    }
    if (op->kind == CX_OPK_GROUP) {
        cx_group_op_start(e, op);
        return;
    }
    if (op->kind == CX_OPK_BATCH) {
        cx_batch_start(e, op);
        return;
    }
    int rc;
    cx_peer_t *p = cx_op_resolve(e, op, &rc);
    if (!p) {
        cx_op_complete(op, rc);
        return;
    }
    op->resolved = p;
    cx_op_link(e, p, op);
    switch (p->state) {
    case CX_PEER_UP:
    case CX_PEER_SUSPECT:
        if (op->kind == CX_OPK_CONNECT)
            cx_op_finish(e, op, CX_OK);
        else
            cx_op_issue(e, op);
        return;
    case CX_PEER_FAILED:
        if (op->kind != CX_OPK_CONNECT) {
            cx_op_finish(e, op, CX_EPEER);
            return;
        }
        op->stage = OPS_WAIT_PEER; /* cx_connect waits for the rejoin */
        if (!p->conn && !p->pending) cx_peer_dial(e, p);
        return;
    case CX_PEER_LEFT:
        if (!op->by_url) {
            cx_op_finish(e, op, CX_EPEER);
            return;
        }
        /* named by URL: connect again */
        __attribute__((fallthrough));
    case CX_PEER_UNKNOWN:
    case CX_PEER_CONNECTING:
        if (p->state != CX_PEER_CONNECTING) {
            p->state = CX_PEER_CONNECTING;
            p->connect_deadline_ns = cx_now_ns() + cx_ms_to_ns(e->cfg.connect_timeout_ms);
        }
        op->stage = OPS_WAIT_PEER;
        cx_peer_dial(e, p);
        return;
    }
}

/* Ops not in a backend fail now; ops in a backend were failed by its disconnect. */
void cx_peer_ops_fail(cx_engine_t *e, cx_peer_t *p, int status)
{
    while (p->ops.next != &p->ops) {
        cx_op_t *op = p->ops.next;
        if (op->stage == OPS_IN_BACKEND && p->ep)
            cx_warn("peer %s: op still in the backend when failing ops (bug)", p->url);
        op->stage = OPS_DONE;
        cx_op_finish(e, op, status);
    }
    cx_sched_peer_fail(e, p, status); /* background transfers: their chunks are all back now */
}

void cx_peer_ops_ready(cx_engine_t *e, cx_peer_t *p)
{
    /* Move the waiting ops aside first: issuing may complete (and unlink) them. */
    cx_op_t waiting = { 0 };
    waiting.next = waiting.prev = &waiting;
    for (cx_op_t *op = p->ops.next, *n; op != &p->ops; op = n) {
        n = op->next;
        if (op->stage != OPS_WAIT_PEER) continue;
        unlink_op(op);
        op->prev = waiting.prev;
        op->next = &waiting;
        waiting.prev->next = op;
        waiting.prev = op;
    }
    while (waiting.next != &waiting) {
        cx_op_t *op = waiting.next;
        unlink_op(op);
        cx_op_link(e, p, op);
        op->stage = OPS_QUEUED;
        if (op->kind == CX_OPK_CONNECT)
            cx_op_finish(e, op, CX_OK);
        else
            cx_op_issue(e, op);
    }
}

void cx_ops_tick(cx_engine_t *e, uint64_t now)
{
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        int timed_out = 0;
        for (cx_op_t *op = p->ops.next, *n; op != &p->ops; op = n) {
            n = op->next;
            if (op->stage == OPS_WAIT_PEER) {
                int conn_expired =
                    op->kind != CX_OPK_CONNECT && p->state == CX_PEER_CONNECTING && now >= p->connect_deadline_ns;
                if (now >= op->deadline_ns || conn_expired) {
                    cx_warn("peer %s: not reachable within the %s timeout", p->url, conn_expired ? "connect" : "op");
                    cx_op_finish(e, op, op->kind == CX_OPK_CONNECT ? CX_ETIMEDOUT : CX_EPEER);
                }
            } else if (now >= op->deadline_ns && op->stage == OPS_WAIT_CREDIT) {
                cx_warn("peer %s: op waited for a credit past the op timeout", p->url);
                cx_op_finish(e, op, CX_ETIMEDOUT);
            } else if (now >= op->deadline_ns && op->stage == OPS_WAIT_VERDICT) {
                cx_warn("peer %s: op timed out while the peer was probed", p->url);
                cx_op_finish(e, op, CX_ETIMEDOUT);
            } else if (op->stage == OPS_WAIT_VERDICT && op->settle_ns && now >= op->settle_ns && !p->probing) {
                cx_info("peer %s: still up after an op's local error: the op ends with it", p->url);
                cx_op_finish(e, op, local_error(p, op));
            } else if (now >= op->deadline_ns && op->stage == OPS_WAIT_REGION) {
                cx_warn("peer %s: region query unanswered within the op timeout", p->url);
                cx_op_finish(e, op, CX_ETIMEDOUT);
            } else if (now >= op->deadline_ns && op->stage == OPS_IN_BACKEND) {
                op->forced_status = CX_ETIMEDOUT;
                timed_out = 1;
            }
        }
        if (timed_out) {
            /* Close the data connection first, so a late reply can never land in a caller's
             * buffer; every op on it completes (the expired ones with CX_ETIMEDOUT). */
            cx_warn("peer %s: op timed out after %u ms: closing the data connection", p->url, e->cfg.op_timeout_ms);
            cx_peer_drop_ep(e, p, CX_ETIMEDOUT);
        }
        cx_sched_tick(e, p, now);
        if (p->state == CX_PEER_CONNECTING && now >= p->connect_deadline_ns && p->ops.next == &p->ops) {
            if (p->pending) cx_conn_close(e, p->pending);
            p->state = p->ever_up ? CX_PEER_LEFT : CX_PEER_UNKNOWN;
        }
    }
}

/* ---------------------------------------------------------------- offered to backends */

void cx_core_peer_error(cx_core_t *c, void *peer, cx_cause_t cause, const char *reason)
{
    cx_engine_t *e = cx_engine_of(c);
    cx_peer_t *p = peer;
    if (!p) return;
    cx_verdict_t v = cx_cause_verdict((int)cause, p->state);
    char why[160];
    snprintf(why, sizeof why, "%s: %s", p->bidx >= 0 ? e->bnames[p->bidx] : "backend", reason ? reason : "error");
    switch (v) {
    case CX_VERDICT_IGNORE: return;
    case CX_VERDICT_LOCAL:
        cx_info("peer %s: %s (%s): the op ends with a local error, the peer stays %s", p->url, why,
                cx_cause_name((int)cause), p->state == CX_PEER_UP ? "UP" : "SUSPECT");
        return;
    case CX_VERDICT_PROBE: cx_peer_probe(e, p, why); return;
    case CX_VERDICT_FAIL: cx_peer_fail(e, p, why); return;
    }
}

cx_bep_t *cx_core_peer_ep(cx_core_t *c, cx_backend_t *b, void *peer)
{
    cx_engine_t *e = cx_engine_of(c);
    cx_peer_t *p = peer;
    if (!p || !p->ep || p->bidx < 0 || p->bidx >= e->nb || e->be[p->bidx].b != b) return NULL;
    return p->ep;
}

/* The same-host watch answers (proc.h); only a same-host peer's HELLO set a process to follow. */
int cx_core_peer_process(cx_core_t *c, void *peer)
{
    (void)c;
    cx_peer_t *p = peer;
    return p && p->same_host ? cx_proc_state(&p->proc) : CX_PROC_UNKNOWN;
}

int cx_core_peer_exit_fd(cx_core_t *c, void *peer)
{
    (void)c;
    cx_peer_t *p = peer;
    return p && p->same_host ? cx_proc_exit_fd(&p->proc) : -1;
}

void *cx_core_peer_by_incarnation(cx_core_t *c, uint64_t inc)
{
    cx_engine_t *e = cx_engine_of(c);
    cx_peer_t *p = cx_peer_by_inc(e, inc);
    if (p) cx_peer_heard(e, p); /* a request from it: it is alive */
    return p;
}

void cx_core_peer_want_ep(cx_core_t *c, void *peer)
{
    cx_engine_t *e = cx_engine_of(c);
    cx_peer_t *p = peer;
    if (!p || p->ep) return;
    p->want_ep = 1;
    e->want_ep = 1;
}

int cx_core_region_check(cx_core_t *c, uint64_t addr, size_t len, void **pin)
{
    cx_engine_t *e = cx_engine_of(c);
    pthread_rwlock_rdlock(&e->reg.lock);
    cx_region_t *r = cx_registry_find_locked(&e->reg, addr, len);
    if (r && pin) {
        atomic_fetch_add(&r->pins, 1);
        *pin = r;
    }
    pthread_rwlock_unlock(&e->reg.lock);
    if (!r && cx_staging_ring_holds(e, addr, len)) {
        if (pin) *pin = NULL; /* a staging slot lent to a peer (tstage.h): lives with the engine */
        return CX_OK;
    }
    if (!r) {
        cx_warn("refused a request for [0x%llx, +%zu): not inside one region registered here", (unsigned long long)addr,
                len);
        return CX_EINVAL;
    }
    return CX_OK;
}

void cx_core_region_unpin(void *pin)
{
    if (pin) atomic_fetch_sub(&((cx_region_t *)pin)->pins, 1);
}

int cx_core_deliver_msg(cx_core_t *c, void *peer, const void *data, size_t len)
{
    cx_engine_t *e = cx_engine_of(c);
    cx_peer_t *p = peer;
    if (!p) return CX_EINVAL;
    if (cx_peer_reported_dead(e, p)) {
        /* Its FAILED is out already: nothing of that incarnation is delivered after it. */
        cx_debug("peer %s: message (%zu bytes) from a process reported dead: dropped", p->url, len);
        return CX_EPEER;
    }
    const void *pl;
    size_t plen;
    uint64_t step;
    /* A group step: envelope stripped, a duplicate answered CX_OK and not queued (step.c). */
    if (cx_step_accept(e, p, data, len, &pl, &plen, &step) == 2) return CX_OK;
    int rc = cx_msgq_push_step(&e->msgq, &p->lid, p->url, p->incarnation, step, pl, plen);
    if (rc != CX_OK && step) cx_step_unaccept(e, p, step);
    if (rc == CX_EAGAIN) {
        if (e->st.msgs_refused++ % 1024 == 0)
            cx_warn("receive queue full (%u messages / %llu bytes): refusing messages from %s with CX_EAGAIN",
                    e->cfg.recv_queue_max, (unsigned long long)e->cfg.recv_queue_bytes, p->url);
    }
    return rc;
}

void cx_core_count_served(cx_core_t *c, int kind, size_t bytes, int ok)
{
    cx_engine_t *e = cx_engine_of(c);
    if (!ok) {
        e->st.rejected_requests++;
        return;
    }
    if (kind >= 0 && kind < CX_OPK_COUNT) {
        e->st.served_ops[kind]++;
        e->st.served_bytes[kind] += bytes;
    }
}
