/* Batches: the public entry points (checks on the caller's thread) and the parent op's phases on
 * the transports' owner (batch.h). */
#include "batch.h"

#include "connex/log.h"
#include "drive.h"
#include "cx_sched.h"
#include "tstage.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* At most this many faults are logged one by one when a batch is refused; the rest are counted. */
#define CX_BATCH_LOG_MAX 8
/* An entry's state before it ended (statuses are <= 0): not started, a run's entry in its
 * backend, a run's entry that failed (it ends with its run's status, the core's verdict). */
#define ST_PENDING 1
#define ST_INFLIGHT 2
#define ST_FAILED 3
/* Runs being filled at once while entries are grouped: an entry with yet another peer and region
 * pair goes as a child op of its own. */
#define CX_BATCH_RUNS_OPEN 16
/* At most this many entries a run (and half the critical credits): two runs to a peer overlap. */
#define CX_BATCH_RUN_MAX 256u

enum { PH_PEERS = 0, PH_CHECK, PH_XFER, PH_SIGNAL, PH_DONE };

typedef struct cx_bentry { /* an entry as the caller gave it, checked */
    void *local;
    uint64_t remote;
    size_t len;
    uint64_t lbase; /* the start of the local region holding it: a run stays inside one */
    int lkind;      /* CX_MEM_* of that region */
} cx_bentry_t;

typedef struct cx_brun { /* entries to one peer, one local and one remote region: one op */
    cx_op_t op;          /* first member: the run's op (engine.h, nent) */
    cx_batch_t *b;
    uint32_t first; /* its entries: b->ridx[first .. first + n) */
    uint32_t n;
    uint32_t left; /* entries in the backend, + 1 while they are posted */
    uint32_t back; /* entries back whose credits were not given back yet */
    int err;       /* the first error an entry was completed with */
} cx_brun_t;
/* A run gives its credits back this many entries at a time (and the rest as it ends). */
#define CX_BATCH_CREDITS_BACK 4u

typedef struct cx_bent { /* a child: an entry's transfer, or its region query */
    cx_op_t op;          /* first member: the op is the child */
    cx_batch_t *b;
    uint32_t idx; /* entry index */
} cx_bent_t;

typedef struct cx_bpeer { /* a distinct peer of the batch, and its connect child */
    cx_op_t op;
    cx_batch_t *b;
    cx_peer_t *p;
    uint32_t first;   /* the first entry naming it, for the log */
    const char *name; /* as the caller named it (while the batch is checked only) */
    int rc;           /* CX_OK: up; else its entries end with it */
} cx_bpeer_t;

struct cx_batch {
    cx_engine_t *e;
    cx_op_t *parent;
    int xkind; /* CX_XFER_READ or CX_XFER_WRITE */
    int cls;
    int psig; /* put_signal: the last entry carries msg */
    size_t n;
    int *st;         /* per entry: ST_*, then its status */
    int *out;        /* the caller's, or NULL */
    uint32_t *pidx;  /* per entry: its cx_bpeer */
    cx_bentry_t *en; /* the entries */
    cx_bent_t *ent;  /* the entries' child ops, for those that go alone (allocated then) */
    cx_brun_t *runs;
    uint32_t nruns;
    const cx_rregion_t **rr; /* per entry: its remote region as the checks found it */
    int rr_fresh;            /* ... and still so: no query since, the transfers start now */
    uint32_t *ridx;          /* entry indices, run by run */
    cx_xfer_t *xv;           /* per entry: the xfer a run hands its backend */
    cx_bpeer_t *peers;
    uint32_t np;
    cx_bent_t *q; /* region queries, allocated at the first miss */
    int phase;
    size_t out_n; /* children of the phase not back yet */
    int refused;  /* a check failed: the batch ends CX_EINVAL */
    void *msg;
    size_t msg_len;
    cx_op_t **post; /* bulk post: the collected ops and their endpoints */
    cx_bep_t **post_ep;
    cx_xfer_t **xs;
    int *rcs;
    size_t npost;
    cx_batch_t *rnext; /* the engine's ready list */
};

void cx_batch_free(cx_batch_t *b)
{
    if (!b) return;
    free(b->st);
    free(b->pidx);
    free(b->en);
    free(b->ent);
    free(b->runs);
    free(b->ridx);
    free(b->xv);
    free(b->rr);
    free(b->peers);
    free(b->q);
    free(b->msg);
    free(b->post);
    free(b->post_ep);
    free(b->xs);
    free(b->rcs);
    free(b);
}

/* Children carry no mutex or condition variable: their completion goes to on_done. */
static void child_init(cx_op_t *op, cx_engine_t *e, int kind, void (*done)(cx_op_t *, int))
{
    memset(op, 0, sizeof *op);
    op->e = e;
    op->kind = kind;
    op->status = CX_ERR;
    op->on_done = done;
}

/* An entry's transfer: named by its resolved peer (hint), never by `url` or `lid`, and without
 * a mutex or condition variable, so only what comes before them is set (engine.h). */
static void entry_init(cx_op_t *op, cx_engine_t *e, int kind, void (*done)(cx_op_t *, int))
{
    memset(op, 0, CX_OP_ENTRY_SIZE);
    op->e = e;
    op->kind = kind;
    op->status = CX_ERR;
    op->on_done = done;
}

/* [addr, +len) inside [base, +span)? */
static inline int within(uint64_t addr, uint64_t len, uint64_t base, uint64_t span)
{
    return addr >= base && addr - base <= span && len <= span - (addr - base);
}

static void phase_back(cx_batch_t *b)
{
    if (--b->out_n) return;
    b->rnext = b->e->batch_ready;
    b->e->batch_ready = b;
}

static void ent_done(cx_op_t *op, int status)
{
    cx_bent_t *c = (cx_bent_t *)op;
    c->b->st[c->idx] = status;
    phase_back(c->b);
}

static void query_done(cx_op_t *op, int status)
{
    cx_bent_t *c = (cx_bent_t *)op;
    cx_batch_t *b = c->b;
    if (status == CX_EINVAL) {
        const cx_bentry_t *en = &b->en[c->idx];
        cx_warn("batch entry %u: remote range [0x%llx, +%zu) is not inside a region %s registered: "
                "batch refused",
                c->idx, (unsigned long long)en->remote, en->len, b->peers[b->pidx[c->idx]].p->url);
        b->refused = 1;
    } else if (status != CX_OK) {
        b->st[c->idx] = status; /* its peer failed or did not answer: the entry ends so */
    }
    phase_back(b);
}

static void peer_done(cx_op_t *op, int status)
{
    cx_bpeer_t *bp = (cx_bpeer_t *)op;
    bp->rc = status;
    if (status != CX_OK)
        cx_warn("batch: peer %s (entry %u on): %s", bp->p ? bp->p->url : "?", bp->first, cx_strerror(status));
    phase_back(bp->b);
}

static void finish(cx_batch_t *b)
{
    int rc = CX_OK;
    for (size_t i = 0; i < b->n; i++) {
        if (b->refused || b->st[i] > 0) b->st[i] = b->refused ? CX_EINVAL : CX_ECLOSED;
        if (rc == CX_OK) rc = b->st[i];
    }
    if (b->out) memcpy(b->out, b->st, b->n * sizeof *b->out);
    b->phase = PH_DONE;
    cx_op_complete(b->parent, rc);
}

/* Phase 1: every distinct peer resolved; those not up yet connect. */
static void start_peers(cx_engine_t *e, cx_batch_t *b)
{
    b->out_n = 1; /* held until every child started: none may end the phase early */
    for (uint32_t k = 0; k < b->np; k++) {
        cx_bpeer_t *bp = &b->peers[k];
        int rc;
        bp->p = cx_op_resolve(e, &bp->op, &rc);
        if (!bp->p) {
            cx_warn("batch entry %u: %s: batch refused", bp->first, rc == CX_EINVAL ? "unknown peer" : cx_strerror(rc));
            b->refused = 1;
            continue;
        }
        switch (bp->p->state) {
        case CX_PEER_UP:
        case CX_PEER_SUSPECT: bp->rc = CX_OK; break;
        case CX_PEER_FAILED: bp->rc = CX_EPEER; break;
        case CX_PEER_LEFT:
            if (!bp->op.by_url) {
                bp->rc = CX_EPEER;
                break;
            }
            __attribute__((fallthrough));
        default:
            bp->op.hint = bp->p;
            bp->op.deadline_ns = cx_deadline_ns(e->cfg.op_timeout_ms);
            b->out_n++;
            cx_op_start(e, &bp->op);
            break;
        }
    }
    b->phase = PH_PEERS;
    phase_back(b);
}

/* Phase 2: remote ranges checked against what each peer registered; misses are asked for. */
static void start_checks(cx_engine_t *e, cx_batch_t *b)
{
    b->phase = PH_CHECK;
    b->out_n = 1;
    const cx_peer_t *lp = NULL;
    const cx_rregion_t *lr = NULL; /* the last region found: most entries share a few */
    if (!b->rr) b->rr = malloc(b->n * sizeof *b->rr);
    b->rr_fresh = b->rr != NULL;
    for (size_t i = 0; i < b->n; i++) {
        cx_bpeer_t *bp = &b->peers[b->pidx[i]];
        if (bp->rc != CX_OK) {
            b->st[i] = bp->rc;
            continue;
        }
        const cx_bentry_t *x = &b->en[i];
        const cx_rregion_t *rr = lr && lp == bp->p && within(x->remote, x->len, lr->addr, lr->len)
            ? lr
            : cx_rregion_find(bp->p, x->remote, x->len);
        if (rr) {
            lp = bp->p;
            lr = rr;
            if (b->rr) b->rr[i] = rr;
            continue;
        }
        /* A region asked for: phase 3 starts at a later turn, when a region found here may
         * be gone (the peer dropped it); runs then look their regions up again. */
        b->rr_fresh = 0;
        if (!b->q && !(b->q = calloc(b->n, sizeof *b->q))) {
            b->st[i] = CX_ENOMEM;
            continue;
        }
        cx_bent_t *q = &b->q[i];
        child_init(&q->op, e, CX_OPK_BQUERY, query_done);
        q->b = b;
        q->idx = (uint32_t)i;
        q->op.x.remote = x->remote;
        q->op.x.len = x->len;
        q->op.deadline_ns = cx_deadline_ns(e->cfg.op_timeout_ms);
        b->out_n++;
        cx_op_link(e, bp->p, &q->op);
        cx_op_query_region(e, &q->op);
    }
    phase_back(b);
}

/* Under plock: the collected xfers go to their backends, one call per run of one endpoint. */
static void bulk_post(cx_engine_t *e, cx_batch_t *b)
{
    for (size_t i = 0, j; i < b->npost; i = j) {
        cx_peer_t *p = b->post[i]->peer;
        cx_bep_t *ep = b->post_ep[i];
        size_t k = 0;
        for (j = i; j < b->npost && b->post[j]->peer == p && b->post_ep[j] == ep; j++) {
            cx_op_t *op = b->post[j];
            if (op->stage != OPS_IN_BACKEND) continue; /* ended meanwhile */
            if (p->ep != ep || p->bidx < 0) {
                cx_op_finish(e, op, CX_EPEER); /* its endpoint closed before the post */
                continue;
            }
            b->xs[k] = &op->x;
            b->post[i + k] = op; /* compacted in place: i + k <= j */
            k++;
        }
        if (!k) continue;
        const cx_bslot_t *s = &e->be[p->bidx];
        s->ops->submit_batch(s->b, ep, b->xs, k, b->rcs);
        for (size_t m = 0; m < k; m++) {
            cx_op_t *op = b->post[i + m];
            if (b->rcs[m] != CX_OK && op->stage == OPS_IN_BACKEND) cx_op_backend_status(e, op, b->rcs[m]);
        }
    }
    b->npost = 0;
}

int cx_bpost_take(cx_engine_t *e, cx_op_t *op)
{
    cx_batch_t *b = e->bpost;
    cx_peer_t *p = op->peer;
    if (!p || p->bidx < 0 || !e->be[p->bidx].ops->submit_batch || b->npost >= b->n) return 0;
    b->post[b->npost] = op;
    b->post_ep[b->npost] = p->ep;
    b->npost++;
    return 1;
}

cx_batch_t *cx_batch_of(cx_op_t *op)
{
    return op->on_done == ent_done ? ((cx_bent_t *)op)->b : NULL;
}

int cx_bpost_open(cx_engine_t *e, cx_batch_t *b)
{
    if (e->bpost || !b->post || !b->post_ep || !b->xs || !b->rcs) return 0;
    e->bpost = b;
    return 1;
}

void cx_bpost_close(cx_engine_t *e, cx_batch_t *b)
{
    e->bpost = NULL;
    bulk_post(e, b);
}

/* An entry that goes alone: its child op, set up now (most entries go in runs and need none). */
static void start_one(cx_engine_t *e, cx_batch_t *b, size_t i, uint64_t deadline)
{
    if (!b->ent && !(b->ent = malloc(b->n * sizeof *b->ent))) {
        b->st[i] = CX_ENOMEM;
        return;
    }
    const cx_bentry_t *en = &b->en[i];
    cx_bent_t *c = &b->ent[i];
    entry_init(&c->op, e, b->xkind == CX_XFER_READ ? CX_OPK_READ : CX_OPK_WRITE, ent_done);
    c->b = b;
    c->idx = (uint32_t)i;
    c->op.sc.cls = b->cls;
    c->op.x.kind = b->xkind;
    c->op.x.local = en->local;
    c->op.x.len = en->len;
    c->op.x.remote = en->remote;
    c->op.x.local_mem = en->lkind;
    if (b->psig && i == b->n - 1) {
        c->op.kind = CX_OPK_PUT_SIGNAL;
        c->op.x.kind = CX_XFER_PUT_SIGNAL;
        c->op.x.msg = b->msg;
        c->op.x.msg_len = b->msg_len;
    }
    c->op.hint = b->peers[b->pidx[i]].p;
    c->op.deadline_ns = deadline;
    b->out_n++;
    cx_op_start(e, &c->op);
}

/* ---------------------------------------------------------------- runs */

static void run_done(cx_op_t *op, int status)
{
    cx_brun_t *r = (cx_brun_t *)op;
    cx_batch_t *b = r->b;
    if (status != CX_OK || r->err != CX_OK) /* else every entry ended CX_OK */
        for (uint32_t k = 0; k < r->n; k++) {
            uint32_t i = b->ridx[r->first + k];
            if (b->st[i] > 0) b->st[i] = status == CX_OK ? CX_ERR : status;
        }
    phase_back(b);
}

static void run_back(cx_engine_t *e, cx_brun_t *r)
{
    if (--r->left) return;
    cx_op_xfer_done(e, &r->op, r->err);
}

void cx_brun_xfer_done(cx_engine_t *e, cx_xfer_t *x, int status)
{
    cx_brun_t *r = x->core;
    cx_batch_t *b = r->b;
    size_t i = (size_t)(x - b->xv);
    if (i >= b->n || b->st[i] != ST_INFLIGHT) {
        cx_error("backend completed a batch entry twice or one it did not own: ignored");
        return;
    }
    if (status == CX_OK) {
        b->st[i] = CX_OK;
    } else {
        b->st[i] = ST_FAILED;
        if (r->err == CX_OK) r->err = status;
    }
    if (++r->back == CX_BATCH_CREDITS_BACK) {
        cx_sched_entries_done(e, &r->op, r->back);
        r->back = 0;
    }
    run_back(e, r);
}

void cx_brun_post(cx_engine_t *e, cx_op_t *op)
{
    cx_brun_t *r = (cx_brun_t *)op;
    cx_batch_t *b = r->b;
    cx_peer_t *p = op->peer;
    const cx_bslot_t *s = &e->be[p->bidx];
    const cx_xfer_t *rx = &op->x;
    cx_xfer_t **xs = b->xs;
    r->left = r->n + 1; /* held until every entry is posted: completions may come inside */
    r->back = 0;
    r->err = CX_OK;
    for (uint32_t k = 0; k < r->n; k++) {
        uint32_t i = b->ridx[r->first + k];
        const cx_bentry_t *en = &b->en[i];
        cx_xfer_t *x = &b->xv[i];
        *x = (cx_xfer_t){ .kind = rx->kind,
                          .local = en->local,
                          .len = en->len,
                          .local_mh = rx->local_mh,
                          .local_mem = rx->local_mem,
                          .remote = en->remote,
                          .remote_region = rx->remote_region,
                          .remote_base = rx->remote_base,
                          .rkey = rx->rkey,
                          .rkey_len = rx->rkey_len,
                          .core = r };
        b->st[i] = ST_INFLIGHT;
        xs[k] = x;
    }
    if (s->ops->submit_batch) {
        s->ops->submit_batch(s->b, p->ep, xs, r->n, b->rcs);
    } else {
        for (uint32_t k = 0; k < r->n; k++) b->rcs[k] = s->ops->submit(s->b, p->ep, xs[k]);
    }
    for (uint32_t k = 0; k < r->n; k++) {
        if (b->rcs[k] == CX_OK) continue;
        uint32_t i = b->ridx[r->first + k];
        if (b->st[i] != ST_INFLIGHT) continue; /* completed inside the post after all (a bug) */
        b->st[i] = ST_FAILED;                  /* not started: it will not be completed */
        if (r->err == CX_OK) r->err = b->rcs[k];
        r->left--;
    }
    run_back(e, r);
}

/* An entry's run key: its peer and its two regions. */
typedef struct {
    uint32_t pidx;
    const cx_rregion_t *rr;
    uint64_t lbase;
    uint32_t run; /* the run being filled */
    uint32_t n;   /* its entries so far */
} run_key_t;

/* Whether entry i may go in a run: critical, host memory on both sides (no staging), its
 * remote region known. *rr: that region. */
static int run_fits(cx_engine_t *e, cx_batch_t *b, size_t i, const cx_rregion_t **rr, const cx_rregion_t **last_rr,
                    int *last_ok)
{
    const cx_bentry_t *en = &b->en[i];
    const cx_bpeer_t *bp = &b->peers[b->pidx[i]];
    if (en->lkind != CX_MEM_HOST || bp->p->bidx < 0) return 0;
    const cx_rregion_t *lr = *last_rr;
    if (b->rr_fresh) {
        *rr = b->rr[i]; /* the checks just found it (start_checks) */
        if (*rr == lr) return *last_ok;
    } else if (lr && within(en->remote, en->len, lr->addr, lr->len)) {
        *rr = lr;
        return *last_ok;
    } else if (!(*rr = cx_rregion_find(bp->p, en->remote, en->len))) {
        return 0;
    }
    *last_rr = *rr;
    *last_ok = !cx_tstage_wanted(e, bp->p, *rr);
    return *last_ok;
}

/* Groups the pending entries [0, end) into runs (b->runs, b->ridx); the entries that go alone
 * follow the runs' in ridx, at [*alone_at, *alone_end). Returns 0, or CX_ENOMEM (every entry then
 * goes alone). */
typedef struct { /* a run as its entries are grouped */
    uint32_t n;
    uint64_t llo, lhi, rlo, rhi; /* the local and remote ranges holding its entries */
    size_t bytes;
} run_acc_t;

static void acc_add(run_acc_t *a, const cx_bentry_t *en)
{
    uint64_t l = (uint64_t)(uintptr_t)en->local;
    if (!a->n++) {
        a->llo = l;
        a->lhi = l + en->len;
        a->rlo = en->remote;
        a->rhi = en->remote + en->len;
    } else {
        if (l < a->llo) a->llo = l;
        if (l + en->len > a->lhi) a->lhi = l + en->len;
        if (en->remote < a->rlo) a->rlo = en->remote;
        if (en->remote + en->len > a->rhi) a->rhi = en->remote + en->len;
    }
    a->bytes += en->len;
}

/* A run's op: x spans its entries' local range, x.remote and rspan their remote one. */
static void run_init(cx_engine_t *e, cx_batch_t *b, cx_brun_t *r, const run_acc_t *a)
{
    entry_init(&r->op, e, b->xkind == CX_XFER_READ ? CX_OPK_READ : CX_OPK_WRITE, run_done);
    r->b = b;
    r->op.sc.cls = CX_CLASS_CRITICAL;
    r->op.sc.weight = a->n;
    r->op.x.kind = b->xkind;
    r->op.x.local = (void *)(uintptr_t)a->llo;
    r->op.x.len = a->lhi - a->llo;
    r->op.x.local_mem = CX_MEM_HOST;
    r->op.x.remote = a->rlo;
    r->op.nent = a->n;
    r->op.vbytes = a->bytes;
    r->op.rspan = a->rhi - a->rlo;
}

/* Groups the pending entries [0, end) into runs (b->runs, b->ridx); the entries that go alone
 * follow the runs' in ridx, at [*alone_at, *alone_end). Returns 0, or CX_ENOMEM (every entry then
 * goes alone). */
static int form_runs(cx_engine_t *e, cx_batch_t *b, size_t end, uint32_t *alone_at, uint32_t *alone_end)
{
    uint32_t cap = CX_BATCH_RUN_MAX;
    if (!e->cfg.classes_off) {
        uint32_t half = e->cfg.credits_critical / 2;
        cap = half < 1 ? 1 : half < cap ? half : cap;
    }
    uint32_t *rid = malloc(b->n * sizeof *rid); /* per entry: its run, or UINT32_MAX */
    run_acc_t *acc = NULL;
    uint32_t nacc = 0;
    run_key_t open[CX_BATCH_RUNS_OPEN];
    uint32_t nopen = 0, last = 0, nruns = 0;
    if (!rid) return CX_ENOMEM;
    const cx_rregion_t *last_rr = NULL;
    const cx_peer_t *last_p = NULL;
    int last_ok = 0;
    int ordered = 1; /* every entry in a run, each run's in a row: ridx is 0, 1, 2, ... */
    for (size_t i = 0; i < end; i++) {
        rid[i] = UINT32_MAX;
        if (b->st[i] != ST_PENDING) {
            ordered = 0;
            continue;
        }
        const cx_rregion_t *rr;
        if (b->peers[b->pidx[i]].p != last_p) {
            last_p = b->peers[b->pidx[i]].p;
            last_rr = NULL;
        }
        if (b->cls != CX_CLASS_CRITICAL || !run_fits(e, b, i, &rr, &last_rr, &last_ok)) {
            ordered = 0;
            continue;
        }
        const cx_bentry_t *en = &b->en[i];
        uint32_t k = last;
        if (k >= nopen || open[k].pidx != b->pidx[i] || open[k].rr != rr || open[k].lbase != en->lbase) {
            for (k = 0; k < nopen; k++)
                if (open[k].pidx == b->pidx[i] && open[k].rr == rr && open[k].lbase == en->lbase) break;
            if (k == nopen && nopen == CX_BATCH_RUNS_OPEN) { /* goes alone */
                ordered = 0;
                continue;
            }
            if (k < nopen && open[k].run != nruns - 1) ordered = 0; /* back to an earlier run */
        }
        if (k == nopen || open[k].n == cap) {
            if (nruns == nacc) {
                uint32_t nc = nacc ? nacc * 2 : 4;
                run_acc_t *na = realloc(acc, nc * sizeof *na);
                if (!na) {
                    free(acc);
                    free(rid);
                    return CX_ENOMEM;
                }
                acc = na;
                nacc = nc;
            }
            acc[nruns] = (run_acc_t){ 0 };
            if (k == nopen) open[nopen++] = (run_key_t){ .pidx = b->pidx[i], .rr = rr, .lbase = en->lbase };
            open[k].run = nruns++; /* new, or the last one of its key was full */
            open[k].n = 0;
        }
        last = k;
        open[k].n++;
        rid[i] = open[k].run;
        acc_add(&acc[open[k].run], en);
    }
    if (nruns && !(b->runs = malloc(nruns * sizeof *b->runs))) {
        free(acc);
        free(rid);
        return CX_ENOMEM;
    }
    /* Counting sort: each run's entries in entry order, then the ones that go alone. */
    uint32_t off = 0;
    for (uint32_t r = 0; r < nruns; r++) {
        run_init(e, b, &b->runs[r], &acc[r]);
        b->runs[r].first = off;
        b->runs[r].n = ordered ? acc[r].n : 0;
        off += acc[r].n;
    }
    *alone_at = off;
    for (size_t i = 0; ordered && i < end; i++) b->ridx[i] = (uint32_t)i;
    for (size_t i = 0; !ordered && i < end; i++) {
        if (b->st[i] != ST_PENDING) continue;
        if (rid[i] == UINT32_MAX) {
            b->ridx[off++] = (uint32_t)i;
        } else {
            cx_brun_t *r = &b->runs[rid[i]];
            b->ridx[r->first + r->n++] = (uint32_t)i;
        }
    }
    *alone_end = off;
    b->nruns = nruns;
    free(acc);
    free(rid);
    return CX_OK;
}

static void start_run(cx_engine_t *e, cx_batch_t *b, cx_brun_t *r, uint64_t deadline)
{
    r->op.hint = b->peers[b->pidx[b->ridx[r->first]]].p;
    r->op.deadline_ns = deadline;
    b->out_n++;
    cx_op_start(e, &r->op);
}

/* Phase 3: every entry (but put_signal's last) started: runs as one op each, the others alone,
 * their posts collected and made in bulk. */
static void start_xfers(cx_engine_t *e, cx_batch_t *b)
{
    b->phase = PH_XFER;
    b->out_n = 1;
    uint64_t deadline = cx_deadline_ns(e->cfg.op_timeout_ms);
    size_t end = b->psig ? b->n - 1 : b->n;
    if (!b->post) {
        b->post = malloc(b->n * sizeof *b->post);
        b->post_ep = malloc(b->n * sizeof *b->post_ep);
        b->xs = malloc(b->n * sizeof *b->xs);
        b->rcs = malloc(b->n * sizeof *b->rcs);
        b->ridx = malloc(b->n * sizeof *b->ridx);
        b->xv = malloc(b->n * sizeof *b->xv);
    }
    int ok = b->post && b->post_ep && b->xs && b->rcs && b->ridx && b->xv;
    uint32_t alone_at = 0, alone_end = 0;
    if (!ok || form_runs(e, b, end, &alone_at, &alone_end)) {
        /* Out of memory: no runs, each entry alone (the bulk post needs the arrays too). */
        b->nruns = 0;
        for (size_t i = 0; i < end; i++)
            if (b->st[i] == ST_PENDING) start_one(e, b, i, deadline);
        phase_back(b);
        return;
    }
    for (uint32_t r = 0; r < b->nruns; r++) start_run(e, b, &b->runs[r], deadline);
    int bulk = !e->bpost;
    if (bulk) e->bpost = b;
    for (uint32_t j = alone_at; j < alone_end; j++) {
        size_t i = b->ridx[j];
        if (b->st[i] == ST_PENDING) start_one(e, b, i, deadline);
    }
    if (bulk) {
        e->bpost = NULL;
        bulk_post(e, b);
    }
    phase_back(b);
}

/* Phase 4 (put_signal): the last entry with the message, once every other one is in place. */
static void start_signal(cx_engine_t *e, cx_batch_t *b)
{
    b->phase = PH_SIGNAL;
    b->out_n = 1;
    size_t last = b->n - 1;
    int first_err = CX_OK;
    for (size_t i = 0; i < last && first_err == CX_OK; i++) first_err = b->st[i];
    if (first_err != CX_OK) {
        cx_warn("batch put_signal: entry failed (%s): the message is not sent", cx_strerror(first_err));
        b->st[last] = first_err;
    } else if (b->st[last] == ST_PENDING) {
        start_one(e, b, last, cx_deadline_ns(e->cfg.op_timeout_ms));
    }
    phase_back(b);
}

static void advance(cx_engine_t *e, cx_batch_t *b)
{
    int closing = atomic_load(&e->stop) != 0;
    if (b->refused || closing || b->phase == PH_SIGNAL || (b->phase == PH_XFER && !b->psig)) {
        finish(b);
        return;
    }
    switch (b->phase) {
    case PH_PEERS: start_checks(e, b); break;
    case PH_CHECK: start_xfers(e, b); break;
    case PH_XFER: start_signal(e, b); break;
    default: break;
    }
}

void cx_batches_progress(cx_engine_t *e)
{
    while (e->batch_ready) {
        cx_batch_t *b = e->batch_ready;
        e->batch_ready = b->rnext;
        b->rnext = NULL;
        advance(e, b);
    }
}

void cx_batches_close(cx_engine_t *e)
{
    atomic_store(&e->stop, 1);
    cx_batches_progress(e);
}

void cx_batch_start(cx_engine_t *e, cx_op_t *op)
{
    cx_batch_t *b = op->msg_copy;
    b->e = e;
    start_peers(e, b);
    /* As far as it goes now (peers up, regions known: to the posts); then from each turn. */
    cx_batches_progress(e);
}

/* ---------------------------------------------------------------- caller side */

static int refuse(size_t i, const char *fault, unsigned *nbad)
{
    if (++*nbad <= CX_BATCH_LOG_MAX) cx_warn("batch entry %zu: %s", i, fault);
    return CX_EINVAL;
}

/* The batch's state, every entry checked; CX_EINVAL (logged per entry) refuses it whole. */
static int batch_check(cx_engine_t *e, int xkind, const char *sig_peer, const cx_batch_entry_t *ents, size_t n, int cls,
                       int *status, const char *what, cx_batch_t **out)
{
    *out = NULL;
    if (!e) {
        cx_warn("%s: NULL engine", what);
        return CX_EINVAL;
    }
    if (!ents || !n || n > CX_BATCH_MAX) {
        cx_warn("%s: %s", what, !ents ? "NULL entries" : !n ? "no entries" : "more than CX_BATCH_MAX entries");
        return CX_EINVAL;
    }
    if ((unsigned)cls > CX_CLASS_BACKGROUND) {
        cx_warn("%s: class %d is neither critical (0) nor background (1)", what, cls);
        return CX_EINVAL;
    }
    cx_batch_t *b = calloc(1, sizeof *b);
    if (!b) return CX_ENOMEM;
    b->xkind = xkind;
    b->cls = cls;
    b->n = n;
    b->out = status;
    b->st = malloc(n * sizeof *b->st);
    b->pidx = malloc(n * sizeof *b->pidx);
    b->en = malloc(n * sizeof *b->en);
    if (!b->st || !b->pidx || !b->en) {
        cx_batch_free(b);
        return CX_ENOMEM;
    }
    unsigned nbad = 0;
    int rc = CX_OK;
    uint32_t cap = 0;
    const char *last_name = NULL;
    uint32_t last_k = 0;
    cx_region_span_t lspan = { 0 }; /* the last local region found: most entries share one */
    for (size_t i = 0; i < n; i++) {
        const cx_batch_entry_t *en = &ents[i];
        b->st[i] = ST_PENDING;
        const char *name = sig_peer ? sig_peer : en->peer;
        if (sig_peer && en->peer && strcmp(en->peer, sig_peer))
            rc = refuse(i, "names another peer than the put_signal's", &nbad);
        if (!name) {
            rc = refuse(i, "no peer", &nbad);
            continue;
        }
        if (!en->local) rc = refuse(i, "NULL local buffer", &nbad);
        if (!en->len) rc = refuse(i, "zero length", &nbad);
        if (en->remote + en->len < en->remote) rc = refuse(i, "remote range wraps around", &nbad);
        cx_bentry_t *be = &b->en[i];
        be->local = en->local;
        be->len = en->len;
        be->remote = en->remote;
        uint64_t la = (uint64_t)(uintptr_t)en->local;
        if (en->local && en->len) {
            if (!(lspan.len && within(la, en->len, lspan.addr, lspan.len)) &&
                !cx_registry_span(&e->reg, la, en->len, &lspan))
                rc = refuse(i, "local buffer is not inside one registered region", &nbad);
            be->lbase = lspan.addr;
            be->lkind = lspan.mem_kind;
        }
        /* Each distinct peer name is parsed once: most batches name one or a few. */
        uint32_t k = 0;
        if (last_name && (name == last_name || !strcmp(name, last_name))) {
            k = last_k;
        } else {
            for (k = 0; k < b->np && strcmp(name, b->peers[k].name); k++) {}
            if (k == b->np) {
                if (b->np == cap) {
                    uint32_t nc = cap ? cap * 2 : 4;
                    cx_bpeer_t *np = realloc(b->peers, nc * sizeof *np);
                    if (!np) {
                        cx_batch_free(b);
                        return CX_ENOMEM;
                    }
                    b->peers = np;
                    cap = nc;
                }
                cx_bpeer_t *bp = &b->peers[b->np];
                child_init(&bp->op, e, CX_OPK_CONNECT, peer_done);
                bp->first = (uint32_t)i;
                bp->name = name;
                bp->p = NULL;
                bp->rc = CX_OK;
                if (cx_op_name_peer(e, name, &bp->op)) {
                    rc = refuse(i, "bad peer name", &nbad);
                    continue;
                }
                b->np++;
            }
            last_name = name;
            last_k = k;
        }
        b->pidx[i] = k;
    }
    if (nbad > CX_BATCH_LOG_MAX) cx_warn("%s: %u more bad entries", what, nbad - CX_BATCH_LOG_MAX);
    if (rc) {
        cx_warn("%s: %zu entries refused whole, nothing moved", what, n);
        cx_batch_free(b);
        return rc;
    }
    for (uint32_t k = 0; k < b->np; k++) b->peers[k].b = b;
    for (size_t i = 0; status && i < n; i++) status[i] = CX_ECLOSED; /* a batch the engine never ran */
    *out = b;
    return CX_OK;
}

/* batch_check, and a refused batch's every status CX_EINVAL. */
static int batch_new(cx_engine_t *e, int xkind, const char *sig_peer, const cx_batch_entry_t *ents, size_t n, int cls,
                     int *status, const char *what, cx_batch_t **out)
{
    int rc = batch_check(e, xkind, sig_peer, ents, n, cls, status, what, out);
    if (rc && status && n && n <= CX_BATCH_MAX)
        for (size_t i = 0; i < n; i++) status[i] = CX_EINVAL;
    return rc;
}

static cx_op_t *parent_new(cx_engine_t *e, cx_op_t *op, cx_batch_t *b)
{
    cx_op_init(op, e, CX_OPK_BATCH);
    op->msg_copy = b;
    b->parent = op;
    return op;
}

static int run_sync(cx_engine_t *e, int xkind, const cx_batch_entry_t *ents, size_t n, int *status, const char *what)
{
    cx_batch_t *b;
    int rc = batch_new(e, xkind, NULL, ents, n, CX_CLASS_CRITICAL, status, what, &b);
    if (rc) return rc;
    cx_op_t op;
    return cx_op_run_sync(e, parent_new(e, &op, b)); /* frees b with the op */
}

static int run_async(cx_engine_t *e, cx_batch_t *b, cx_op_t **out)
{
    cx_op_t *op = malloc(sizeof *op);
    if (!op) {
        cx_batch_free(b);
        return CX_ENOMEM;
    }
    parent_new(e, op, b);
    op->async = 1;
    int rc = cx_drive(e, op, 0) ? CX_OK : cx_submit(e, op);
    if (rc) {
        cx_op_destroy(op);
        free(op);
        return rc;
    }
    *out = op;
    return CX_OK;
}

static int async_batch(cx_engine_t *e, int xkind, const cx_batch_entry_t *ents, size_t n, cx_class_t cls, int *status,
                       cx_op_t **out, const char *what)
{
    if (out) *out = NULL;
    if (!out) {
        cx_warn("%s: NULL op pointer", what);
        return CX_EINVAL;
    }
    cx_batch_t *b;
    int rc = batch_new(e, xkind, NULL, ents, n, (int)cls, status, what, &b);
    return rc ? rc : run_async(e, b, out);
}

int cx_batch_read(cx_engine_t *e, const cx_batch_entry_t *ents, size_t n, int *status)
{
    return run_sync(e, CX_XFER_READ, ents, n, status, "batch_read");
}

int cx_batch_write(cx_engine_t *e, const cx_batch_entry_t *ents, size_t n, int *status)
{
    return run_sync(e, CX_XFER_WRITE, ents, n, status, "batch_write");
}

int cx_batch_read_async(cx_engine_t *e, const cx_batch_entry_t *ents, size_t n, cx_class_t cls, int *status,
                        cx_op_t **op)
{
    return async_batch(e, CX_XFER_READ, ents, n, cls, status, op, "batch_read_async");
}

int cx_batch_write_async(cx_engine_t *e, const cx_batch_entry_t *ents, size_t n, cx_class_t cls, int *status,
                         cx_op_t **op)
{
    return async_batch(e, CX_XFER_WRITE, ents, n, cls, status, op, "batch_write_async");
}

int cx_batch_put_signal(cx_engine_t *e, const char *peer, const cx_batch_entry_t *ents, size_t n, const void *msg,
                        size_t msg_len, cx_class_t cls, int *status, cx_op_t **out)
{
    if (out) *out = NULL;
    if (!out || !peer) {
        cx_warn("batch_put_signal: NULL %s", !out ? "op pointer" : "peer");
        return CX_EINVAL;
    }
    if (msg_len > CX_MSG_MAX || (msg_len && !msg)) {
        cx_warn("batch_put_signal: bad message (%zu bytes)", msg_len);
        return CX_EINVAL;
    }
    cx_batch_t *b;
    int rc = batch_new(e, CX_XFER_WRITE, peer, ents, n, (int)cls, status, "batch_put_signal", &b);
    if (rc) return rc;
    if (msg_len && !(b->msg = malloc(msg_len))) {
        cx_batch_free(b);
        return CX_ENOMEM;
    }
    if (msg_len) memcpy(b->msg, msg, msg_len);
    b->msg_len = msg_len;
    b->psig = 1; /* the last entry carries the message (start_one) */
    return run_async(e, b, out);
}
