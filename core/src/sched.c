/* Traffic classes: credits per peer and class, chunked background transfers (see cx_sched.h for
 * the contract with ops.c, docs/semantics.md for what callers are promised). */
#include "cx_sched.h"
#include "batch.h"
#include "connex/options.h"

#include "connex/log.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { CRIT = CX_CLASS_CRITICAL, BG = CX_CLASS_BACKGROUND };

#define CHUNK_MIN 4096u
/* Critical ops that follow each other (a decode loop's reads) leave gaps of microseconds between
 * them; for this long after one completed, background keeps to one chunk in flight as if it were
 * still running, so the next critical op finds one chunk ahead of it, not credits_background. */
#define CRIT_RECENT_NS (2 * CX_NS_PER_MS)
/* While critical ops are active, background waits: one chunk of it in flight delays every
 * critical op that finds it there (by the chunk's time on the wire and on both CPUs, several
 * times a small read's latency). It is not starved, though: one chunk starts at least every
 * BG_FLOOR_NS, this much smaller than background_chunk (at least CHUNK_MIN), so that under a
 * steady stream of critical ops (16 KiB reads, 5000 a second) fewer than one in two hundred
 * meets a chunk: p99 stays within 2x of idle (50 ms was one in a hundred: 2.0x). */
#define CHUNK_SHRINK 16u
#define BG_FLOOR_NS (100 * CX_NS_PER_MS)

void cx_sched_config(cx_config_t *cfg, const cx_opts_t *o)
{
    if (!cfg->credits_critical) cfg->credits_critical = 64;
    if (!cfg->credits_background) cfg->credits_background = 2;
    if (!cfg->background_chunk) cfg->background_chunk = 1u << 20;
    /* Whole pages, at least one: smaller chunks only add per-op overhead. */
    uint64_t c = ((uint64_t)cfg->background_chunk + CHUNK_MIN - 1) / CHUNK_MIN * CHUNK_MIN;
    if (c > 0xFFFFF000u) c = 0xFFFFF000u;
    if (c != cfg->background_chunk)
        cx_info("background_chunk %u rounded to %llu bytes (whole 4 KiB pages)", cfg->background_chunk,
                (unsigned long long)c);
    cfg->background_chunk = (uint32_t)c;
    int set = 0;
    unsigned long long on = cx_opts_num(o, "CONNEX_CLASSES", &set);
    if (set) cfg->classes_off = !on;
}

static int peer_live(const cx_peer_t *p)
{
    return p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT;
}

/* A list, not a flag per peer: every op's completion marks its peer, and a pump that walked
 * every peer to find the marked one cost as much as the op with a few hundred peers known. */
static void mark(cx_engine_t *e, cx_peer_t *p)
{
    if (p->sched_dirty) return;
    p->sched_dirty = 1;
    p->dirty_next = e->sched_dirty_head;
    e->sched_dirty_head = p;
}

/* ---------------------------------------------------------------- lists */

/* The peer's op list (ops.c keeps the same shape; a background parent leaves it). */
static void peer_unlink(cx_op_t *op)
{
    if (!op->next) return;
    op->prev->next = op->next;
    op->next->prev = op->prev;
    op->next = op->prev = NULL;
}

static void q_push(cx_op_t **head, cx_op_t **tail, cx_op_t *op)
{
    op->sc.cnext = NULL;
    op->sc.cprev = *tail;
    if (*tail)
        (*tail)->sc.cnext = op;
    else
        *head = op;
    *tail = op;
}

static void q_remove(cx_op_t **head, cx_op_t **tail, cx_op_t *op)
{
    if (op->sc.cprev)
        op->sc.cprev->sc.cnext = op->sc.cnext;
    else if (*head == op)
        *head = op->sc.cnext;
    else
        return; /* not in this list */
    if (op->sc.cnext)
        op->sc.cnext->sc.cprev = op->sc.cprev;
    else
        *tail = op->sc.cprev;
    op->sc.cnext = op->sc.cprev = NULL;
}

static uint32_t weight(const cx_op_t *op)
{
    return op->sc.weight ? op->sc.weight : 1;
}

static void take_credit(cx_peer_t *p, cx_op_t *op, int cls)
{
    op->sc.credit = cls + 1;
    p->cls_inflight[cls] += weight(op);
}

/* Whether a critical op's credits are free: a run of several entries goes when all of its
 * entries fit, or alone when nothing else is out (a run is never larger than the credits). */
static int crit_fits(const cx_engine_t *e, const cx_peer_t *p, const cx_op_t *op)
{
    uint32_t in = p->cls_inflight[CRIT];
    return in < e->cfg.credits_critical && (in == 0 || in + weight(op) <= e->cfg.credits_critical);
}

/* ---------------------------------------------------------------- admission */

int cx_sched_admit(cx_engine_t *e, cx_op_t *op)
{
    cx_peer_t *p = op->peer;
    if (e->cfg.classes_off || op->sc.credit || op->kind == CX_OPK_CHUNK) return 0;
    int bg = op->sc.cls == BG && (op->kind == CX_OPK_READ || op->kind == CX_OPK_WRITE) &&
        op->x.local_mem == CX_MEM_HOST && op->x.len > 0;
    if (bg) {
        peer_unlink(op);
        op->stage = OPS_CHUNKED;
        op->sc.bg_off = 0;
        op->sc.bg_out = 0;
        op->sc.bg_status = CX_OK;
        op->sc.bg_deadline_ns = cx_now_ns() + cx_ms_to_ns(e->cfg.op_timeout_ms);
        q_push(&p->bg_head, &p->bg_tail, op);
        cx_peer_activate(e, p);
        mark(e, p);
        return 1;
    }
    /* Critical (and background device memory, which the staging path chunks on its own). */
    if (!p->cls_wait[CRIT] && crit_fits(e, p, op)) {
        take_credit(p, op, CRIT);
        return 0;
    }
    op->stage = OPS_WAIT_CREDIT;
    q_push(&p->cls_wait[CRIT], &p->cls_wait_tail[CRIT], op);
    return 1;
}

/* ---------------------------------------------------------------- completion */

void cx_sched_entries_done(cx_engine_t *e, cx_op_t *op, uint32_t n)
{
    if (!op->sc.credit || op->sc.weight <= 1 || !op->peer) return;
    if (n > op->sc.weight - 1) n = op->sc.weight - 1; /* the last goes at finish */
    op->peer->cls_inflight[op->sc.credit - 1] -= n;
    op->sc.weight -= n;
    mark(e, op->peer);
}

/* A parent with nothing out and nothing more to start completes (through cx_op_finish, which
 * counts it and wakes its caller: it must not be touched afterwards). */
static void parent_maybe_done(cx_engine_t *e, cx_op_t *par)
{
    if (par->sc.bg_out) return;
    if (par->sc.bg_status == CX_OK && par->sc.bg_off < par->x.len) return;
    cx_peer_t *p = par->peer;
    q_remove(&p->bg_head, &p->bg_tail, par);
    if (p->bg_head == NULL) p->bg_deferred = 0;
    par->stage = OPS_DONE;
    cx_op_finish(e, par, par->sc.bg_status);
}

int cx_sched_op_finish(cx_engine_t *e, cx_op_t *op, int status)
{
    cx_peer_t *p = op->peer;
    if (!p) return 0;
    if (op->stage == OPS_WAIT_CREDIT) {
        int c = op->sc.cls == BG && op->kind == CX_OPK_CHUNK ? BG : CRIT;
        q_remove(&p->cls_wait[c], &p->cls_wait_tail[c], op);
    }
    if (op->sc.credit) {
        /* Only a peer's background transfers read this. Without any, a later bound from the
         * coarse clock will do (the next one starts throttled a tick longer at most): a clock
         * read is a tenth of a small shared-memory op's own cost. */
        if (op->sc.credit - 1 == CRIT) p->crit_last_ns = p->bg_head ? cx_now_ns() : cx_deadline_ns(0);
        p->cls_inflight[op->sc.credit - 1] -= weight(op);
        op->sc.credit = 0;
        mark(e, p);
    }
    if (op->kind != CX_OPK_CHUNK) return 0;
    cx_op_t *par = op->sc.parent;
    free(op);
    par->sc.bg_out--;
    if (status != CX_OK && par->sc.bg_status == CX_OK) {
        par->sc.bg_status = status; /* first error wins; no new chunk starts */
        cx_debug("peer %s: background transfer of %zu bytes failed at a chunk (%s)", p->url, par->x.len,
                 cx_strerror(status));
    } else if (status == CX_OK) {
        par->sc.bg_deadline_ns = cx_now_ns() + cx_ms_to_ns(e->cfg.op_timeout_ms);
    }
    parent_maybe_done(e, par);
    return 1;
}

/* ---------------------------------------------------------------- issuing */

static void chunk_start(cx_engine_t *e, cx_peer_t *p, cx_op_t *par, int crit_active)
{
    size_t left = par->x.len - par->sc.bg_off;
    size_t max = e->cfg.background_chunk;
    if (crit_active) max = max / CHUNK_SHRINK > CHUNK_MIN ? max / CHUNK_SHRINK : CHUNK_MIN;
    size_t n = left < max ? left : max;
    cx_op_t *c = calloc(1, sizeof *c);
    if (!c) {
        cx_error("peer %s: out of memory for a background chunk", p->url);
        if (par->sc.bg_status == CX_OK) par->sc.bg_status = CX_ENOMEM;
        parent_maybe_done(e, par);
        return;
    }
    c->e = e;
    c->kind = CX_OPK_CHUNK;
    c->sc.cls = BG;
    c->sc.parent = par;
    c->status = CX_ERR;
    c->x.kind = par->x.kind;
    c->x.local = (uint8_t *)par->x.local + par->sc.bg_off;
    c->x.len = n;
    c->x.remote = par->x.remote + par->sc.bg_off;
    c->x.local_mem = par->x.local_mem;
    c->deadline_ns = cx_now_ns() + cx_ms_to_ns(e->cfg.op_timeout_ms);
    par->sc.bg_off += n;
    par->sc.bg_out++;
    par->sc.bg_deadline_ns = c->deadline_ns;
    cx_op_link(e, p, c);
    take_credit(p, c, BG);
    e->st.background_chunks++;
    /* May complete c (and, with it, par) before it returns: touch neither afterwards. */
    cx_op_go(e, c);
}

/* The oldest background transfer with bytes still to start. */
static cx_op_t *next_parent(cx_peer_t *p)
{
    for (cx_op_t *par = p->bg_head; par; par = par->sc.cnext)
        if (par->sc.bg_status == CX_OK && par->sc.bg_off < par->x.len) return par;
    return NULL;
}

static int pump_peer(cx_engine_t *e, cx_peer_t *p)
{
    int n = 0;
    /* Critical first. Each op taken off the FIFO before it is issued: issuing may complete it,
     * or fail the peer (which empties the FIFO). */
    /* A batch's entries admitted together reach its backend together (batch.h), as its first
     * ones did: credits coming back from one bulk completion let the next ones go in bulk. */
    cx_batch_t *bulk = NULL;
    for (cx_op_t *op; peer_live(p) && (op = p->cls_wait[CRIT]) && crit_fits(e, p, op);) {
        q_remove(&p->cls_wait[CRIT], &p->cls_wait_tail[CRIT], op);
        take_credit(p, op, CRIT);
        op->stage = OPS_QUEUED;
        cx_batch_t *ob = cx_batch_of(op);
        if (ob != bulk) {
            if (bulk) cx_bpost_close(e, bulk);
            bulk = ob && cx_bpost_open(e, ob) ? ob : NULL;
        }
        cx_op_go(e, op);
        n++;
    }
    if (bulk) cx_bpost_close(e, bulk);
    uint64_t now = p->bg_head ? cx_now_ns() : 0;
    for (cx_op_t *par; peer_live(p) && (par = next_parent(p));) {
        uint32_t lim = e->cfg.credits_background;
        /* Critical ops waiting for credit: no new chunk. Critical ops in flight (or just done):
         * none, but for one small chunk per BG_FLOOR_NS. */
        int crit_active = p->cls_inflight[CRIT] || now < p->crit_last_ns + CRIT_RECENT_NS;
        if (p->cls_wait[CRIT])
            lim = 0;
        else if (crit_active)
            lim = now >= p->bg_last_ns + BG_FLOOR_NS ? 1 : 0;
        if (crit_active && lim == 0) {
            /* Nothing of ours completes to bring us back here: wake when the floor comes due or
             * the critical ops have gone quiet, whichever is first. */
            uint64_t wake = p->bg_last_ns + BG_FLOOR_NS;
            if (!p->cls_inflight[CRIT] && p->crit_last_ns + CRIT_RECENT_NS < wake)
                wake = p->crit_last_ns + CRIT_RECENT_NS;
            if (!e->sched_wake_ns || wake < e->sched_wake_ns) e->sched_wake_ns = wake;
        }
        if (p->cls_inflight[BG] >= lim) {
            if (p->cls_inflight[BG] < e->cfg.credits_background && !p->bg_deferred) {
                p->bg_deferred = 1;
                e->st.background_deferred++;
            }
            break;
        }
        p->bg_deferred = 0;
        p->bg_last_ns = now;
        chunk_start(e, p, par, crit_active);
        n++;
    }
    return n;
}

int cx_sched_timeout_ms(cx_engine_t *e, int max_ms)
{
    if (!e->sched_wake_ns) return max_ms;
    uint64_t now = cx_now_ns();
    if (now >= e->sched_wake_ns) return 0;
    uint64_t ms = cx_ns_to_ms_ceil(e->sched_wake_ns - now);
    return ms < (uint64_t)max_ms ? (int)ms : max_ms;
}

int cx_sched_pump(cx_engine_t *e)
{
    if (e->sched_wake_ns && cx_now_ns() >= e->sched_wake_ns) {
        e->sched_wake_ns = 0;
        for (cx_peer_t *p = e->peers; p; p = p->next)
            if (p->bg_head) mark(e, p);
    }
    cx_peer_t *p = e->sched_dirty_head;
    e->sched_dirty_head = NULL; /* pumping may mark peers again: the next call takes them */
    int n = 0;
    for (cx_peer_t *nx; p; p = nx) {
        nx = p->dirty_next;
        p->dirty_next = NULL;
        p->sched_dirty = 0;
        n += pump_peer(e, p);
    }
    return n;
}

/* ---------------------------------------------------------------- timeouts, failures */

void cx_sched_tick(cx_engine_t *e, cx_peer_t *p, uint64_t now)
{
    for (cx_op_t *par = p->bg_head, *nx; par; par = nx) {
        nx = par->sc.cnext;
        if (par->sc.bg_out || par->sc.bg_status != CX_OK || now < par->sc.bg_deadline_ns) continue;
        cx_warn("peer %s: background transfer of %zu bytes: no chunk could start within %u ms", p->url, par->x.len,
                e->cfg.op_timeout_ms);
        par->sc.bg_status = CX_ETIMEDOUT;
        parent_maybe_done(e, par);
    }
    /* Credits may have come free without a completion marking the peer (defensive, cheap). */
    if (p->bg_head || p->cls_wait[CRIT]) mark(e, p);
}

void cx_sched_peer_fail(cx_engine_t *e, cx_peer_t *p, int status)
{
    for (cx_op_t *par = p->bg_head, *nx; par; par = nx) {
        nx = par->sc.cnext;
        if (par->sc.bg_status == CX_OK) par->sc.bg_status = status;
        parent_maybe_done(e, par); /* waits for chunks still out, if any */
    }
    p->bg_deferred = 0;
}

void cx_sched_stats(cx_engine_t *e, cx_stats_t *st)
{
    for (cx_peer_t *p = e->peers; p; p = p->next)
        for (cx_op_t *par = p->bg_head; par; par = par->sc.cnext) st->ops_in_flight++;
}
