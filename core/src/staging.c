/* Host staging of GPU memory (see staging.h for how it ties into the op lifecycle, gpu/cx_stage.h
 * for the pipeline's contract, docs/gpu.md for the design). */
#include "staging.h"
#include "tstage.h"

#include "connex/log.h"
#include "cx_gpu.h"
#include "cx_stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#define STG_MAX_PIPES 8 /* one per (kind, device): sim + up to 7 GPUs staged at once */

typedef struct stg_pipe {
    cx_watch_t w; /* only wakes epoll: the loop calls cx_staging_progress anyway */
    cx_stage_t *st;
    int kind, device;
    void *ring;
    size_t ring_len;
    void *mh[CX_MAX_BACKENDS];
    uint8_t *key[CX_MAX_BACKENDS];   /* the ring's key per backend: a target hands it to */
    size_t key_len[CX_MAX_BACKENDS]; /* the peer that reads or writes a slot (tstage.h) */
} stg_pipe_t;

typedef struct stg_job {
    cx_engine_t *e;
    cx_op_t *op; /* the user's op: completed once, from job_done */
    stg_pipe_t *pp;
    int bidx;           /* the backend the key is for */
    cx_stage_job_t *sj; /* NULL once the pipeline freed it (fini) */
    int cancelled;
    int remote_staged; /* the peer stages its side too: chunks go through tstage.h */
    unsigned subs_out; /* sub-xfers handed to a backend, not yet completed */
    /* The peer may drop the region (REG_DEL, failure) while chunks are still to go: keep the
     * key for the whole transfer. */
    uint8_t *rkey;
    size_t rkey_len;
    struct stg_job *prev, *next;
} stg_job_t;

typedef struct stg_sub {
    cx_op_t op; /* first: its x is what the backend sees */
    stg_job_t *job;
    uint32_t index;
    int in_submit, finished, status;
} stg_sub_t;

typedef struct cx_staging {
    stg_pipe_t pipes[STG_MAX_PIPES];
    int npipes;
    /* GPUDirect decision per (backend, memory kind): 0 not yet, 1 stage, 2 direct, < 0 the
     * error CONNEX_GDR=1 gets where it cannot work. */
    int decided[CX_MAX_BACKENDS][3];
    stg_job_t *jobs;      /* live jobs: deadlines, fini */
    int njobs, njobs_max; /* live jobs now, and the most at once (cx_staging_debug) */
} cx_staging_t;

static cx_staging_t *state(cx_engine_t *e)
{
    if (!e->stg) {
        e->stg = calloc(1, sizeof *e->stg);
        if (!e->stg) cx_error("staging: out of memory");
    }
    return e->stg;
}

/* ---------------------------------------------------------------- policy */

int cx_staging_needed(cx_engine_t *e, int bidx, int mem_kind)
{
    if (mem_kind != CX_MEM_CUDA && mem_kind != CX_MEM_SIM) return 0;
    cx_staging_t *s = state(e);
    if (!s || bidx < 0 || bidx >= CX_MAX_BACKENDS) return 1; /* submit reports it */
    int *d = &s->decided[bidx][mem_kind];
    if (*d) return *d != 2;
    /* An RDMA backend says what it can register (gpu_caps); zmq never can (a TCP socket reaches
     * no GPU). For the sim, CONNEX_GDR=1 registers it as host memory wherever it runs. */
    cx_gdr_info_t info;
    cx_gdr_caps_t caps = { 0 };
    if (e->be[bidx].ops->gpu_caps) {
        cx_backend_gpu_caps_t bc = { 0 };
        e->be[bidx].ops->gpu_caps(e->be[bidx].b, &bc);
        caps.rdma = bc.rdma;
        caps.peermem = bc.peermem;
        caps.dmabuf = bc.dmabuf;
    }
    int rc = cx_gdr_decide(mem_kind, 0, &caps, &info);
    *d = rc ? rc : info.use ? 2 : 1;
    cx_info("%s memory over %s: %s", cx_mem_kind_name(mem_kind), e->bnames[bidx], info.reason);
    return *d != 2;
}

/* ---------------------------------------------------------------- pipelines */

static stg_pipe_t *pipe_get(cx_engine_t *e, cx_staging_t *s, int kind, int device, int *rc)
{
    for (int i = 0; i < s->npipes; i++)
        if (s->pipes[i].kind == kind && s->pipes[i].device == device) return &s->pipes[i];
    if (s->npipes == STG_MAX_PIPES) {
        cx_error("staging: more than %d devices staged at once", STG_MAX_PIPES);
        *rc = CX_EUNSUPPORTED;
        return NULL;
    }
    stg_pipe_t *pp = &s->pipes[s->npipes];
    memset(pp, 0, sizeof *pp);
    pp->kind = kind;
    pp->device = device;
    *rc = cx_stage_create(kind, device, NULL, &pp->st);
    if (*rc) return NULL;
    cx_stage_ring(pp->st, &pp->ring, &pp->ring_len);
    /* The ring is internal: registered so sub-xfers have a local handle, never advertised. */
    for (int b = 0; b < e->nb && !*rc; b++) {
        uint8_t key[CX_KEY_MAX];
        size_t klen = sizeof key;
        *rc = e->be[b].ops->mem_reg(e->be[b].b, pp->ring, pp->ring_len, CX_MEM_HOST, &pp->mh[b], key, &klen);
        if (!*rc && klen) {
            pp->key[b] = malloc(klen);
            if (pp->key[b])
                memcpy(pp->key[b], key, klen);
            else
                *rc = CX_ENOMEM;
            pp->key_len[b] = klen;
        }
        if (*rc)
            cx_error("staging: backend %s cannot register the %zu-byte ring (%s)", e->bnames[b], pp->ring_len,
                     cx_strerror(*rc));
    }
    pp->w = (cx_watch_t){ CX_W_STAGE, pp, s->npipes };
    if (!*rc) *rc = cx_watch_add(e, cx_stage_fd(pp->st), EPOLLIN, &pp->w);
    if (*rc) {
        for (int b = 0; b < e->nb; b++) {
            if (pp->mh[b]) e->be[b].ops->mem_dereg(e->be[b].b, pp->mh[b]);
            free(pp->key[b]);
        }
        cx_stage_destroy(pp->st);
        memset(pp, 0, sizeof *pp);
        return NULL;
    }
    s->npipes++;
    return pp;
}

int cx_staging_ring(cx_engine_t *e, int kind, int device, cx_staging_ring_t *out)
{
    cx_staging_t *s = state(e);
    if (!s) return CX_ENOMEM;
    int rc = CX_OK;
    stg_pipe_t *pp = pipe_get(e, s, kind, device, &rc);
    if (!pp) return rc;
    out->st = pp->st;
    out->base = pp->ring;
    out->len = pp->ring_len;
    out->id = CX_STAGING_RING_ID0 + (uint64_t)(pp - s->pipes);
    out->mh = pp->mh;
    out->key = pp->key;
    out->key_len = pp->key_len;
    return CX_OK;
}

/* ---------------------------------------------------------------- sub-xfers */

/* A chunk of a job whose peer stages its side too (tstage.h) has gone both ways. */
static void ts_chunk_done(void *arg, uint32_t index, int status)
{
    stg_job_t *j = arg;
    j->subs_out--;
    if (j->sj) cx_stage_chunk_done(j->sj, index, status);
}

static void sub_complete(stg_sub_t *sub)
{
    stg_job_t *j = sub->job;
    j->subs_out--;
    if (j->sj) cx_stage_chunk_done(j->sj, sub->index, sub->status);
    free(sub);
}

static void chunk_cb(const cx_stage_chunk_t *c)
{
    stg_job_t *j = c->job_arg;
    cx_engine_t *e = j->e;
    cx_op_t *op = j->op;
    cx_peer_t *p = op->peer;
    int up = p && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT);
    int rc = !up ? CX_EPEER : j->cancelled ? CX_ECLOSED : cx_peer_ensure_ep(e, p);
    if (!rc && p->bidx != j->bidx) rc = CX_EPEER; /* reconnected on another backend: key is stale */
    if (!rc && j->remote_staged) {
        const cx_xfer_t *px = &op->x;
        int sig = px->kind == CX_XFER_PUT_SIGNAL && c->last;
        cx_tstage_range_t r = { px->kind == CX_XFER_READ ? CX_XFER_READ : CX_XFER_WRITE,
                                c->host,
                                j->pp->mh[p->bidx],
                                px->remote + c->off,
                                c->len,
                                sig ? px->msg : NULL,
                                sig ? px->msg_len : 0,
                                sig,
                                op->deadline_ns,
                                ts_chunk_done,
                                j,
                                c->index,
                                1 };
        j->subs_out++;
        rc = cx_tstage_range(e, p, &r);
        if (rc)
            j->subs_out--;
        else
            return;
    }
    stg_sub_t *sub = rc ? NULL : calloc(1, sizeof *sub);
    if (!sub) {
        cx_stage_chunk_done(c->job, c->index, rc ? rc : CX_ENOMEM);
        return;
    }
    sub->job = j;
    sub->index = c->index;
    cx_op_t *so = &sub->op;
    so->e = e;
    so->kind = CX_OPK_SUB;
    so->arg = sub;
    so->deadline_ns = op->deadline_ns;
    so->stage = OPS_IN_BACKEND;
    cx_xfer_t *x = &so->x;
    const cx_xfer_t *px = &op->x;
    if (px->kind == CX_XFER_READ)
        x->kind = CX_XFER_READ;
    else if (px->kind == CX_XFER_PUT_SIGNAL && c->last)
        x->kind = CX_XFER_PUT_SIGNAL;
    else
        x->kind = CX_XFER_WRITE;
    x->local = c->host;
    x->len = c->len;
    x->local_mh = j->pp->mh[p->bidx];
    x->local_mem = CX_MEM_HOST;
    x->remote = px->remote + c->off;
    x->remote_region = px->remote_region;
    x->remote_base = px->remote_base;
    x->rkey = j->rkey;
    x->rkey_len = j->rkey_len;
    if (x->kind == CX_XFER_PUT_SIGNAL) {
        x->msg = px->msg;
        x->msg_len = px->msg_len;
    }
    cx_op_link(e, p, so);
    j->subs_out++;
    /* A backend may complete the xfer inside submit: sub_complete must not free it under us. */
    sub->in_submit = 1;
    rc = e->be[p->bidx].ops->submit(e->be[p->bidx].b, p->ep, x);
    sub->in_submit = 0;
    /* Either way sub_complete runs exactly once and frees sub: touch it no more after. (A submit
     * that refused the chunk used to be finished here, which freed sub, and then sub->finished
     * was read from freed memory and the chunk completed twice: "chunk_done for chunk 35 that is
     * not on the network", then a double free, seen when a peer died mid-staging over UCX.) */
    if (sub->finished)
        sub_complete(sub); /* completed inside submit */
    else if (rc != CX_OK)
        cx_op_finish(e, so, rc); /* not started: unlink, count, complete */
}

/* ---------------------------------------------------------------- jobs */

static void job_unlink(cx_staging_t *s, stg_job_t *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        s->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    j->prev = j->next = NULL;
    s->njobs--;
}

static void job_free(stg_job_t *j)
{
    free(j->rkey);
    free(j);
}

/* Every slot is back: the user's op completes now, once. */
static void job_done(void *arg, cx_stage_job_t *sj, int status)
{
    (void)sj;
    stg_job_t *j = arg;
    cx_engine_t *e = j->e;
    cx_op_t *op = j->op;
    job_unlink(e->stg, j);
    job_free(j);
    op->arg = NULL;
    cx_op_finish(e, op, status);
}

void cx_staging_submit(cx_engine_t *e, cx_op_t *op, cx_rregion_t *rr)
{
    cx_xfer_t *x = &op->x;
    cx_staging_t *s = state(e);
    cx_peer_t *p = op->peer;
    if (!s) {
        cx_op_finish(e, op, CX_ENOMEM);
        return;
    }
    int d = s->decided[p->bidx][x->local_mem];
    if (d < 0) {
        cx_warn("%s of %zu bytes %s %s memory refused by the GPUDirect policy (CONNEX_GDR, see above): %s",
                x->kind == CX_XFER_READ ? "read" : "write", x->len, x->kind == CX_XFER_READ ? "into" : "from",
                cx_mem_kind_name(x->local_mem), cx_strerror(d));
        cx_op_finish(e, op, d);
        return;
    }
    cx_gpu_mem_t m;
    if (x->kind == CX_XFER_MSG || cx_gpu_mem_query(x->local, x->len, &m)) {
        cx_op_finish(e, op, CX_EINVAL);
        return;
    }
    int rc = CX_OK;
    stg_pipe_t *pp = pipe_get(e, s, m.kind, m.kind == CX_MEM_SIM ? 0 : m.device, &rc);
    stg_job_t *j = pp ? calloc(1, sizeof *j) : NULL;
    if (j && rr->key_len[p->bidx]) {
        j->rkey = malloc(rr->key_len[p->bidx]);
        if (j->rkey) {
            memcpy(j->rkey, rr->key[p->bidx], rr->key_len[p->bidx]);
            j->rkey_len = rr->key_len[p->bidx];
        } else {
            free(j);
            j = NULL;
        }
    }
    if (!j) {
        cx_op_finish(e, op, rc ? rc : CX_ENOMEM);
        return;
    }
    j->e = e;
    j->op = op;
    j->pp = pp;
    j->bidx = p->bidx;
    j->remote_staged = cx_tstage_wanted(e, p, rr);
    cx_stage_cbs_t cbs = { chunk_cb, job_done, j };
    op->stage = OPS_STAGING;
    op->arg = j;
    rc = cx_stage_start(pp->st, x->kind == CX_XFER_READ ? CX_STAGE_IN : CX_STAGE_OUT, x->local, x->len,
                        x->kind == CX_XFER_PUT_SIGNAL ? CX_STAGE_LAST_AFTER_ALL : 0, &cbs, &j->sj);
    if (rc) {
        op->arg = NULL;
        job_free(j);
        cx_op_finish(e, op, rc);
        return;
    }
    j->next = s->jobs;
    if (s->jobs) s->jobs->prev = j;
    s->jobs = j;
    if (++s->njobs > s->njobs_max) s->njobs_max = s->njobs;
    /* Start the first copies now rather than on the next loop turn. */
    cx_stage_progress(pp->st);
}

int cx_staging_op_finish(cx_engine_t *e, cx_op_t *op, int status)
{
    (void)e;
    if (op->kind == CX_OPK_SUB) {
        stg_sub_t *sub = op->arg;
        if (sub->finished) {
            cx_error("staging: chunk %u completed twice (ignored)", sub->index);
            return 1;
        }
        sub->finished = 1;
        sub->status = status;
        if (!sub->in_submit) sub_complete(sub);
        return 1;
    }
    if (op->kind >= CX_OPK_COUNT) return 0;
    /* The parent failed from outside (peer failure, engine shutdown): end the job; the op
     * completes from job_done once its copies and chunks are all back. */
    stg_job_t *j = op->arg;
    if (!j->cancelled) {
        j->cancelled = 1;
        if (j->sj) cx_stage_cancel(j->sj, status);
    }
    return 1;
}

void cx_staging_progress(cx_engine_t *e)
{
    cx_tstage_progress(e);
    cx_staging_t *s = e->stg;
    if (!s) return;
    for (int i = 0; i < s->npipes; i++) cx_stage_progress(s->pipes[i].st);
    if (!s->jobs) return;
    /* Sub-xfers in a backend time out through cx_ops_tick; this catches a job stuck before the
     * network (copies, waiting for slots) past its op's deadline. */
    uint64_t now = cx_now_ns();
    int any = 0;
    for (stg_job_t *j = s->jobs; j; j = j->next) {
        if (j->cancelled || now < j->op->deadline_ns) continue;
        cx_warn("staged %s of %zu bytes: op timed out after %u ms", j->op->x.kind == CX_XFER_READ ? "read" : "write",
                j->op->x.len, e->cfg.op_timeout_ms);
        j->cancelled = 1;
        cx_stage_cancel(j->sj, CX_ETIMEDOUT);
        any = 1;
    }
    if (any)
        for (int i = 0; i < s->npipes; i++) cx_stage_progress(s->pipes[i].st);
}

/* ---------------------------------------------------------------- stats, teardown */

void cx_staging_stats(cx_engine_t *e, cx_stats_t *st)
{
    cx_staging_t *s = e->stg;
    if (!s) return;
    for (int i = 0; i < s->npipes; i++) {
        cx_stage_stats_t ss;
        cx_stage_get_stats(s->pipes[i].st, &ss);
        st->staged_h2d_bytes += ss.h2d_bytes;
        st->staged_d2h_bytes += ss.d2h_bytes;
    }
    for (int b = 0; b < CX_MAX_BACKENDS; b++)
        if (s->decided[b][CX_MEM_CUDA] == 2 || s->decided[b][CX_MEM_SIM] == 2) st->gpudirect = 1;
}

void cx_staging_fini(cx_engine_t *e)
{
    cx_staging_t *s = e->stg;
    if (!s) return;
    for (int i = 0; i < s->npipes; i++) {
        stg_pipe_t *pp = &s->pipes[i];
        cx_watch_del(e, cx_stage_fd(pp->st));
        /* Every endpoint is closed by now (the backends' disconnect contract): no byte moves
         * into or out of the ring any more. */
        for (int b = 0; b < e->nb; b++) {
            if (pp->mh[b]) e->be[b].ops->mem_dereg(e->be[b].b, pp->mh[b]);
            free(pp->key[b]);
        }
        /* Cancels what is left; job_done completes the users' ops of jobs that drain. */
        cx_stage_destroy(pp->st);
    }
    /* Jobs the pipeline dropped with chunks still "on the network" (a backend that broke its
     * disconnect contract): their callers must not wait forever. */
    while (s->jobs) {
        stg_job_t *j = s->jobs;
        job_unlink(s, j);
        j->sj = NULL;
        cx_op_t *op = j->op;
        op->arg = NULL;
        cx_op_finish(e, op, CX_ECLOSED);
        if (j->subs_out)
            cx_error("staging: %u chunk(s) never completed by the backend: leaking their records", j->subs_out);
        else
            job_free(j);
    }
    free(s);
    e->stg = NULL;
}

struct dbg_arg {
    cx_staging_debug_t *out;
};

static void debug_fn(cx_engine_t *e, void *arg)
{
    cx_staging_debug_t *o = ((struct dbg_arg *)arg)->out;
    memset(o, 0, sizeof *o);
    cx_tstage_debug_t td;
    cx_tstage_debug(e, &td);
    o->served = td.served;
    o->queued = td.queued;
    o->ranges = td.ranges;
    o->quarantined = td.quarantined;
    o->subs = td.subs;
    o->inline_ranges = td.inline_ranges;
    o->chunks_lent = td.chunks_lent;
    cx_staging_t *s = e->stg;
    if (!s) return;
    o->pipes = s->npipes;
    for (int i = 0; i < s->npipes; i++) {
        cx_stage_stats_t ss;
        cx_stage_get_stats(s->pipes[i].st, &ss);
        o->slots += ss.slots;
        o->slots_free += ss.slots_free;
        o->jobs_ok += ss.jobs_ok;
        o->jobs_failed += ss.jobs_failed;
    }
    for (stg_job_t *j = s->jobs; j; j = j->next) {
        o->jobs++;
        o->subs += j->subs_out;
    }
    o->jobs_max = s->njobs_max;
    s->njobs_max = s->njobs; /* the next call reports from here on */
}

int cx_staging_debug(cx_engine_t *e, cx_staging_debug_t *out)
{
    struct dbg_arg a = { out };
    return cx_exec(e, debug_fn, &a);
}

/* ---------------------------------------------------------------- target side (backend.h) */

int cx_core_mem_copy(cx_core_t *c, void *dst, const void *src, size_t len)
{
    if (!len) return CX_OK;
    if (!dst || !src) return CX_EINVAL;
    cx_engine_t *e = cx_engine_of(c);
    int kd = CX_MEM_HOST, ks = CX_MEM_HOST;
    pthread_rwlock_rdlock(&e->reg.lock);
    cx_region_t *r = cx_registry_find_locked(&e->reg, (uint64_t)(uintptr_t)dst, len);
    if (r) kd = r->mem_kind;
    r = cx_registry_find_locked(&e->reg, (uint64_t)(uintptr_t)src, len);
    if (r) ks = r->mem_kind;
    pthread_rwlock_unlock(&e->reg.lock);
    if (kd == CX_MEM_HOST && ks == CX_MEM_HOST) {
        memcpy(dst, src, len);
        return CX_OK;
    }
    /* Synchronous: a TCP target serves device memory at copy-engine speed, which is far above
     * the socket's; the progress thread stalls for the copy only. */
    int rc = cx_gpu_memcpy(dst, src, len);
    if (rc)
        cx_error("target copy of %zu bytes between %s and %s memory failed (%s)", len, cx_mem_kind_name(kd),
                 cx_mem_kind_name(ks), cx_strerror(rc));
    return rc;
}

int cx_core_mem_device(cx_core_t *c, const void *addr, size_t len)
{
    (void)c;
    cx_gpu_mem_t m;
    if (cx_gpu_mem_query(addr, len, &m) || m.kind == CX_MEM_HOST) return -1;
    return m.device;
}

int cx_core_region_kind(cx_core_t *c, uint64_t addr, size_t len)
{
    cx_engine_t *e = cx_engine_of(c);
    pthread_rwlock_rdlock(&e->reg.lock);
    cx_region_t *r = cx_registry_find_locked(&e->reg, addr, len);
    int k = r ? r->mem_kind : CX_EINVAL;
    pthread_rwlock_unlock(&e->reg.lock);
    if (!r && cx_staging_ring_holds(e, addr, len)) k = CX_MEM_HOST;
    return k;
}

int cx_staging_ring_holds(cx_engine_t *e, uint64_t addr, size_t len)
{
    cx_staging_t *s = e->stg;
    if (!s) return 0;
    for (int i = 0; i < s->npipes; i++) {
        uint64_t b = (uint64_t)(uintptr_t)s->pipes[i].ring;
        if (addr >= b && len <= s->pipes[i].ring_len && addr - b <= s->pipes[i].ring_len - len) return 1;
    }
    return 0;
}
