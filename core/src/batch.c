/* Batches: the public entry points (checks on the caller's thread) and the parent op's phases on
 * the transports' owner (batch.h). */
#include "batch.h"

#include "connex/log.h"
#include "drive.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* At most this many faults are logged one by one when a batch is refused; the rest are counted. */
#define CX_BATCH_LOG_MAX 8
#define ST_PENDING 1 /* an entry's status before it ended (statuses are <= 0) */

enum { PH_PEERS = 0, PH_CHECK, PH_XFER, PH_SIGNAL, PH_DONE };

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
    int *st;        /* per entry: ST_PENDING, then its status */
    int *out;       /* the caller's, or NULL */
    uint32_t *pidx; /* per entry: its cx_bpeer */
    cx_bent_t *ent; /* n transfer children */
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
    free(b->ent);
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
        const cx_xfer_t *x = &b->ent[c->idx].op.x;
        cx_warn("batch entry %u: remote range [0x%llx, +%zu) is not inside a region %s registered: "
                "batch refused",
                c->idx, (unsigned long long)x->remote, x->len, b->peers[b->pidx[c->idx]].p->url);
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
        if (b->refused || b->st[i] == ST_PENDING) b->st[i] = b->refused ? CX_EINVAL : CX_ECLOSED;
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
    for (size_t i = 0; i < b->n; i++) {
        cx_bpeer_t *bp = &b->peers[b->pidx[i]];
        if (bp->rc != CX_OK) {
            b->st[i] = bp->rc;
            continue;
        }
        const cx_xfer_t *x = &b->ent[i].op.x;
        if (cx_rregion_find(bp->p, x->remote, x->len)) continue;
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

static void start_one(cx_engine_t *e, cx_batch_t *b, size_t i, uint64_t deadline)
{
    cx_bent_t *c = &b->ent[i];
    c->op.hint = b->peers[b->pidx[i]].p;
    c->op.deadline_ns = deadline;
    b->out_n++;
    cx_op_start(e, &c->op);
}

/* Phase 3: every entry (but put_signal's last) started, their posts collected and made in bulk. */
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
    }
    int bulk = b->post && b->post_ep && b->xs && b->rcs && !e->bpost;
    if (bulk) e->bpost = b;
    for (size_t i = 0; i < end; i++)
        if (b->st[i] == ST_PENDING) start_one(e, b, i, deadline);
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
static int batch_new(cx_engine_t *e, int xkind, const char *sig_peer, const cx_batch_entry_t *ents, size_t n, int cls,
                     int *status, const char *what, cx_batch_t **out)
{
    *out = NULL;
    if (status && n && n <= CX_BATCH_MAX)
        for (size_t i = 0; i < n; i++) status[i] = CX_EINVAL;
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
    b->ent = malloc(n * sizeof *b->ent); /* each set up by entry_init below */
    if (!b->st || !b->pidx || !b->ent) {
        cx_batch_free(b);
        return CX_ENOMEM;
    }
    unsigned nbad = 0;
    int rc = CX_OK;
    uint32_t cap = 0;
    const char *last_name = NULL;
    uint32_t last_k = 0;
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
        cx_bent_t *c = &b->ent[i];
        entry_init(&c->op, e, xkind == CX_XFER_READ ? CX_OPK_READ : CX_OPK_WRITE, ent_done);
        c->b = b;
        c->idx = (uint32_t)i;
        c->op.sc.cls = cls;
        c->op.x.kind = xkind;
        c->op.x.local = en->local;
        c->op.x.len = en->len;
        c->op.x.remote = en->remote;
        if (en->local && en->len &&
            !cx_registry_contains(&e->reg, (uint64_t)(uintptr_t)en->local, en->len, &c->op.x.local_mem))
            rc = refuse(i, "local buffer is not inside one registered region", &nbad);
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
    b->psig = 1;
    cx_op_t *last = &b->ent[n - 1].op;
    last->kind = CX_OPK_PUT_SIGNAL;
    last->x.kind = CX_XFER_PUT_SIGNAL;
    last->x.msg = b->msg;
    last->x.msg_len = msg_len;
    return run_async(e, b, out);
}
