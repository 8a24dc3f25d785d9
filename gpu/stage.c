/* The staging pipeline (see cx_stage.h for the contract). All state is touched by the driving
 * thread only; the copy engine's threads talk back through its completion list and eventfd. */
#include "cx_stage.h"
#include "connex/options.h"
#include "connex/log.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    S_FREE = 0,
    S_COPY,    /* a copy engine copy in flight */
    S_READY,   /* OUT: bytes in the slot, chunk callback not yet given */
    S_HOLD,    /* OUT with LAST_AFTER_ALL: last chunk waiting for the others */
    S_NET,     /* the caller has the slot (chunk callback given, chunk_done not yet) */
    S_NETDONE, /* chunk_done recorded, to be handled by the pump */
};

struct slot {
    char *host;
    int state;
    int net_status;
    cx_stage_job_t *job;
    uint32_t chunk;
    size_t off, len;
    struct slot *next_free;
};

struct cx_stage_job {
    cx_stage_t *st;
    cx_stage_job_t *prev, *next; /* st->jobs, in round-robin order */
    int dir;
    char *dev;
    size_t len, chunk;
    unsigned flags;
    cx_stage_cbs_t cbs;
    uint32_t nchunks, next_chunk, done_chunks, held;
    int status; /* first error; CX_OK while healthy */
};

struct cx_stage {
    int kind, device;
    cx_ce_t *ce;
    cx_pinned_t ring;
    size_t chunk, stride, min_chunk;
    uint32_t nslots, per_job;
    struct slot *slots;
    struct slot *free_list;
    cx_stage_job_t *head, *tail;
    int njobs;
    int in_progress, again;
    atomic_uint_fast64_t h2d, d2h, jobs_ok, jobs_failed;
    atomic_uint slots_free;
};

/* ---- configuration ---- */

/* A CONNEX_STAGE_* variable (connex/options.h: range and default there); def where its default
 * is unset. CX_EINVAL (logged) for a bad value. */
static int env_size(const char *name, size_t def, size_t *out)
{
    unsigned long long v;
    int rc = cx_opt_get_num(name, &v);
    if (rc == CX_EINVAL) return CX_EINVAL;
    *out = rc == 1 || cx_opt_find(name)->dflt ? (size_t)v : def;
    return CX_OK;
}

#define CHUNK_MAX ((size_t)1 << 30)
#define SLOTS_MAX 1024

static int resolve_cfg(const cx_stage_cfg_t *in, size_t *chunk, uint32_t *slots, uint32_t *per_job, size_t *min_chunk)
{
    cx_stage_cfg_t c = in ? *in : (cx_stage_cfg_t){ 0 };
    size_t v;
    if (!c.chunk) {
        if (env_size("CONNEX_STAGE_CHUNK", (size_t)4 << 20, &v)) return CX_EINVAL;
        c.chunk = v;
    }
    if (!c.slots) {
        if (env_size("CONNEX_STAGE_SLOTS", 8, &v)) return CX_EINVAL;
        c.slots = (uint32_t)v;
    }
    if (!c.per_job) {
        size_t def = c.slots / 2 < 2 ? 2 : c.slots / 2;
        if (env_size("CONNEX_STAGE_PER_JOB", def, &v)) return CX_EINVAL;
        c.per_job = (uint32_t)v;
    }
    if (c.chunk > CHUNK_MAX || c.slots > SLOTS_MAX) {
        cx_error("staging: chunk %zu (max %zu) or slots %u (max %d) too large", c.chunk, CHUNK_MAX, c.slots, SLOTS_MAX);
        return CX_EINVAL;
    }
    if (!c.min_chunk) c.min_chunk = (size_t)256 << 10;
    if (c.per_job > c.slots) c.per_job = c.slots;
    *min_chunk = c.min_chunk;
    *chunk = c.chunk;
    *slots = c.slots;
    *per_job = c.per_job;
    return CX_OK;
}

/* ---- create / destroy ---- */

int cx_stage_create(int kind, int device, const cx_stage_cfg_t *cfg, cx_stage_t **out)
{
    *out = NULL;
    if (kind != CX_MEM_CUDA && kind != CX_MEM_SIM) {
        cx_error("staging: memory kind %s needs no staging", cx_mem_kind_name(kind));
        return CX_EINVAL;
    }
    cx_stage_t *st = calloc(1, sizeof *st);
    if (!st) return CX_ENOMEM;
    st->kind = kind;
    st->device = kind == CX_MEM_SIM ? 0 : device;
    int rc = resolve_cfg(cfg, &st->chunk, &st->nslots, &st->per_job, &st->min_chunk);
    if (rc) goto fail;
    /* Page-aligned slots keep each DMA on its own pages. */
    st->stride = (st->chunk + 4095) & ~(size_t)4095;
    st->slots = calloc(st->nslots, sizeof *st->slots);
    if (!st->slots) {
        rc = CX_ENOMEM;
        goto fail;
    }
    rc = cx_pinned_alloc(st->stride * st->nslots, &st->ring);
    if (rc) goto fail;
    rc = cx_ce_create(kind, st->device, &st->ce);
    if (rc) goto fail;
    for (uint32_t i = st->nslots; i-- > 0;) {
        st->slots[i].host = (char *)st->ring.p + (size_t)i * st->stride;
        st->slots[i].next_free = st->free_list;
        st->free_list = &st->slots[i];
    }
    atomic_init(&st->slots_free, st->nslots);
    cx_info("staging for %s device %d: %u slots of %zu bytes, at most %u per transfer", cx_mem_kind_name(kind),
            st->device, st->nslots, st->chunk, st->per_job);
    *out = st;
    return CX_OK;
fail:
    cx_pinned_free(&st->ring);
    free(st->slots);
    free(st);
    return rc;
}

static void job_unlink(cx_stage_t *st, cx_stage_job_t *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        st->head = j->next;
    if (j->next)
        j->next->prev = j->prev;
    else
        st->tail = j->prev;
    j->prev = j->next = NULL;
}

static void job_append(cx_stage_t *st, cx_stage_job_t *j)
{
    j->prev = st->tail;
    j->next = NULL;
    if (st->tail)
        st->tail->next = j;
    else
        st->head = j;
    st->tail = j;
}

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

void cx_stage_destroy(cx_stage_t *st)
{
    if (!st) return;
    for (cx_stage_job_t *j = st->head; j; j = j->next) cx_stage_cancel(j, CX_ECLOSED);
    /* Copies in flight cannot be recalled; wait for them (bounded) so no DMA hits freed memory. */
    uint64_t t0 = now_ms();
    while (cx_stage_progress(st) > 0 && cx_ce_inflight(st->ce) > 0 && now_ms() - t0 < 10000) {
        struct pollfd p = { cx_ce_fd(st->ce), POLLIN, 0 };
        poll(&p, 1, 100);
    }
    int left = 0;
    while (st->head) {
        cx_stage_job_t *j = st->head;
        job_unlink(st, j);
        free(j);
        left++;
    }
    if (left) cx_warn("staging: %d transfer(s) still had chunks on the network at destroy; dropped", left);
    cx_ce_destroy(st->ce); /* waits for any copy still running */
    cx_pinned_free(&st->ring);
    free(st->slots);
    free(st);
}

int cx_stage_fd(const cx_stage_t *st)
{
    return cx_ce_fd(st->ce);
}

void cx_stage_ring(const cx_stage_t *st, void **base, size_t *len)
{
    *base = st->ring.p;
    *len = st->stride * st->nslots;
}

void cx_stage_get_stats(const cx_stage_t *st, cx_stage_stats_t *out)
{
    cx_stage_t *s = (cx_stage_t *)st;
    out->h2d_bytes = atomic_load(&s->h2d);
    out->d2h_bytes = atomic_load(&s->d2h);
    out->jobs_ok = atomic_load(&s->jobs_ok);
    out->jobs_failed = atomic_load(&s->jobs_failed);
    out->slots = s->nslots;
    out->slots_free = atomic_load(&s->slots_free);
    out->chunk = s->chunk;
}

/* ---- jobs ---- */

static void wake(cx_stage_t *st)
{
    if (st->in_progress)
        st->again = 1;
    else
        cx_ce_kick(st->ce);
}

int cx_stage_start(cx_stage_t *st, int dir, void *dev, size_t len, unsigned flags, const cx_stage_cbs_t *cbs,
                   cx_stage_job_t **out)
{
    if (out) *out = NULL;
    if (!st || !dev || len == 0 || !cbs || !cbs->chunk || (dir != CX_STAGE_OUT && dir != CX_STAGE_IN) ||
        (flags & ~(CX_STAGE_LAST_AFTER_ALL | CX_STAGE_WHOLE))) {
        cx_error("staging: bad transfer (dir %d, dev %p, len %zu, flags %#x)", dir, dev, len, flags);
        return CX_EINVAL;
    }
    cx_gpu_mem_t m;
    if (cx_gpu_mem_query(dev, len, &m)) return CX_EINVAL;
    if (m.kind != st->kind || (m.kind == CX_MEM_CUDA && m.device != st->device)) {
        cx_error("staging: %p+%zu is %s memory (device %d), this pipeline stages %s device %d", dev, len,
                 cx_mem_kind_name(m.kind), m.device, cx_mem_kind_name(st->kind), st->device);
        return CX_EINVAL;
    }
    /* Fewer than 8 chunks leave the pipeline mostly filling and draining (3 stages: D2H, net,
     * H2D); smaller pieces keep it busy, down to min_chunk where per-chunk costs would win. */
    size_t chunk = st->chunk;
    if (len / 8 < chunk && !(flags & CX_STAGE_WHOLE)) {
        size_t c = ((len / 8) + 65535) & ~(size_t)65535;
        if (c < st->min_chunk) c = st->min_chunk;
        if (c < chunk) chunk = c;
    }
    size_t n = (len - 1) / chunk + 1;
    if (n > UINT32_MAX) {
        cx_error("staging: %zu bytes is too many chunks of %zu", len, st->chunk);
        return CX_EINVAL;
    }
    cx_stage_job_t *j = calloc(1, sizeof *j);
    if (!j) return CX_ENOMEM;
    j->st = st;
    j->dir = dir;
    j->dev = dev;
    j->len = len;
    j->chunk = chunk;
    j->flags = flags;
    j->cbs = *cbs;
    j->nchunks = (uint32_t)n;
    job_append(st, j);
    st->njobs++;
    if (out) *out = j;
    wake(st);
    return CX_OK;
}

static void job_fail(cx_stage_job_t *j, int status)
{
    if (j->status == CX_OK) j->status = status ? status : CX_ERR;
}

void cx_stage_cancel(cx_stage_job_t *job, int status)
{
    if (!job) return;
    job_fail(job, status == CX_OK ? CX_ECLOSED : status);
    wake(job->st);
}

void cx_stage_chunk_done(cx_stage_job_t *job, uint32_t index, int status)
{
    if (!job) return;
    cx_stage_t *st = job->st;
    for (uint32_t i = 0; i < st->nslots; i++) {
        struct slot *s = &st->slots[i];
        if (s->job == job && s->chunk == index && s->state == S_NET) {
            s->state = S_NETDONE;
            s->net_status = status;
            wake(st);
            return;
        }
    }
    cx_error("staging: chunk_done for chunk %u that is not on the network (ignored)", index);
}

/* ---- the pump ---- */

static void slot_release(cx_stage_t *st, struct slot *s)
{
    s->job->held--;
    s->job = NULL;
    s->state = S_FREE;
    s->next_free = st->free_list;
    st->free_list = s;
    atomic_fetch_add(&st->slots_free, 1);
}

static void give_chunk(cx_stage_t *st, struct slot *s)
{
    cx_stage_job_t *j = s->job;
    cx_stage_chunk_t c = { j, j->cbs.arg, s->chunk, j->nchunks, s->off, s->len, s->host, s->chunk == j->nchunks - 1 };
    s->state = S_NET;
    st->again = 1; /* the callback may have changed anything */
    j->cbs.chunk(&c);
}

static void copy_failed(cx_stage_t *st, struct slot *s)
{
    (void)st;
    job_fail(s->job, CX_ERR);
}

static void handle_copies(cx_stage_t *st)
{
    cx_ce_done_t d[32];
    int n;
    while ((n = cx_ce_poll(st->ce, d, 32)) > 0) {
        for (int i = 0; i < n; i++) {
            struct slot *s = d[i].cookie;
            cx_stage_job_t *j = s->job;
            if (d[i].status != CX_OK)
                copy_failed(st, s);
            else if (j->dir == CX_STAGE_OUT)
                atomic_fetch_add(&st->d2h, s->len);
            else
                atomic_fetch_add(&st->h2d, s->len);
            if (j->dir == CX_STAGE_OUT && j->status == CX_OK) {
                s->state = S_READY;
            } else {
                if (j->dir == CX_STAGE_IN && d[i].status == CX_OK) j->done_chunks++;
                slot_release(st, s);
            }
        }
    }
}

static int start_copy(cx_stage_t *st, struct slot *s, int dir)
{
    char *dev = s->job->dev + s->off;
    s->state = S_COPY;
    int rc = cx_ce_copy(st->ce, dir, dev, s->host, s->len, s);
    if (rc) {
        job_fail(s->job, rc);
        slot_release(st, s);
    }
    return rc;
}

/* One pass over the slots that need the pump's attention. */
static void handle_slots(cx_stage_t *st)
{
    for (uint32_t i = 0; i < st->nslots; i++) {
        struct slot *s = &st->slots[i];
        cx_stage_job_t *j = s->job;
        switch (s->state) {
        case S_NETDONE:
            if (s->net_status != CX_OK) job_fail(j, s->net_status);
            if (j->dir == CX_STAGE_OUT) {
                if (s->net_status == CX_OK) j->done_chunks++;
                slot_release(st, s);
            } else if (j->status == CX_OK) {
                start_copy(st, s, CX_CE_H2D);
            } else {
                slot_release(st, s);
            }
            break;
        case S_READY:
        case S_HOLD:
            if (j->status != CX_OK)
                slot_release(st, s);
            else if ((j->flags & CX_STAGE_LAST_AFTER_ALL) && s->chunk == j->nchunks - 1 &&
                     j->done_chunks < j->nchunks - 1)
                s->state = S_HOLD;
            else
                give_chunk(st, s);
            break;
        default: break;
        }
    }
}

/* Hand free slots to jobs that want more, one per job per round, so no transfer starves. */
static void assign_slots(cx_stage_t *st)
{
    int progress = 1;
    while (st->free_list && progress) {
        progress = 0;
        int n = st->njobs;
        for (cx_stage_job_t *j = st->head; j && n-- > 0 && st->free_list;) {
            cx_stage_job_t *next = j->next;
            if (j->status == CX_OK && j->next_chunk < j->nchunks && j->held < st->per_job) {
                struct slot *s = st->free_list;
                st->free_list = s->next_free;
                atomic_fetch_sub(&st->slots_free, 1);
                s->job = j;
                s->chunk = j->next_chunk++;
                s->off = (size_t)s->chunk * j->chunk;
                s->len = j->len - s->off < j->chunk ? j->len - s->off : j->chunk;
                j->held++;
                job_unlink(st, j); /* round robin: to the back */
                job_append(st, j);
                progress = 1;
                if (j->dir == CX_STAGE_OUT)
                    start_copy(st, s, CX_CE_D2H);
                else
                    give_chunk(st, s);
            }
            j = next;
        }
    }
}

static int finish_one(cx_stage_t *st)
{
    for (cx_stage_job_t *j = st->head; j; j = j->next) {
        int ok = j->status == CX_OK && j->done_chunks == j->nchunks && j->held == 0;
        if (!ok && !(j->status != CX_OK && j->held == 0)) continue;
        job_unlink(st, j);
        st->njobs--;
        atomic_fetch_add(ok ? &st->jobs_ok : &st->jobs_failed, 1);
        if (j->cbs.done) j->cbs.done(j->cbs.arg, j, ok ? CX_OK : j->status);
        free(j);
        st->again = 1;
        return 1;
    }
    return 0;
}

int cx_stage_progress(cx_stage_t *st)
{
    if (st->in_progress) { /* called from inside a callback: the running pump loops again */
        st->again = 1;
        return st->njobs;
    }
    st->in_progress = 1;
    do {
        st->again = 0;
        handle_copies(st);
        handle_slots(st);
        assign_slots(st);
        while (finish_one(st)) {}
    } while (st->again);
    st->in_progress = 0;
    return st->njobs;
}
