/* Replica groups (docs/mobility.md "Groups"): the members of a LID pattern, learned from
 * cx_group_add, the directory and the transport events, and the steps sent to them.
 *
 * Everything here runs on the progress thread; the public calls go through cx_exec (queries) or
 * the command queue (steps, CX_OPK_GROUP). A step is a parent op owned by the caller: its
 * msg_copy holds the step's state (cx_gstep_t) followed by a copy of the payload, so that the
 * step can be sent again, and cx_op_wait frees both. It drives one child op at a time (a message
 * or a put_signal, with the step envelope of step.h in front of the payload) to the member it
 * picked. The child's completion does not wake anyone: cx_op_complete calls child_done, which
 * only queues it on its group; cx_groups_progress then decides (done, hand over, retry, fail),
 * outside the peer-failure paths that are still walking their op lists. */
#include "mobility/mobility.h"
#include "mobility/step.h"

#include "connex/log.h"
#include "engine.h"
#include "spin.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A member not yet reached is dialled again at most this often. */
#define CX_GROUP_REDIAL_NS CX_NS_PER_S

#define CX_GROUP_MAX_HANDOVERS 16

typedef struct cx_gmember {
    cx_lid_t lid;
    char lid_str[96];
    cx_url_t url;
    int has_url;
    int marked;            /* cx_group_mark_failed: skipped until it joins (or comes up) again */
    int gone;              /* its directory entry was deleted */
    unsigned inflight;     /* children of this group's steps at this member */
    uint64_t next_dial_ns; /* an unconnected member with a URL is dialled, this often at most */
    struct cx_gmember *next;
} cx_gmember_t;

typedef struct cx_gstep cx_gstep_t;

typedef struct cx_gchild {
    cx_op_t op; /* first: the completion hook gets the op */
    cx_group_t *g;
    cx_gstep_t *s; /* NULL: orphaned (its step moved on or ended); just freed */
    cx_gmember_t *m;
    int status;
    struct cx_gchild *dnext; /* the group's list of completed children */
} cx_gchild_t;

struct cx_gstep { /* lives at the start of the parent op's msg_copy */
    cx_group_t *g;
    cx_op_t *parent;
    uint64_t id;
    int is_put;
    const void *src; /* put_signal: local source (registered), length, offset */
    size_t len;
    uint64_t roff;
    const uint8_t *msg; /* the payload copy, right after this struct */
    size_t msg_len;
    cx_gchild_t *child;     /* in flight, or NULL while waiting for a member */
    cx_gmember_t *last;     /* the member that failed it last: others are tried first */
    int lost;               /* its member failed: the next send is a hand-over */
    int handovers;          /* bounded: a member that fails every send at once cannot spin us */
    uint64_t wait_deadline; /* no usable member since: CX_EPEER after this */
    uint64_t deadline;      /* CX_EAGAIN retries end here (the op timeout) */
    uint64_t retry_at;      /* not before (after CX_EAGAIN from every member) */
    cx_gstep_t *next, *prev;
};

struct cx_group {
    cx_engine_t *e;
    cx_lid_pat_t pat;
    char pattern[CX_MODEL_MAX + 48];
    cx_pick_t policy;
    cx_gmember_t *members; /* in the order they were learned; never removed before close */
    unsigned rr;           /* round robin: members picked so far */
    cx_gstep_t steps;      /* sentinel: steps not yet complete */
    cx_gchild_t *done, *done_tail;
    unsigned children; /* children not yet freed */
    int closed;        /* the caller closed it: freed once its children are back */
    int kick;          /* a member came up: steps waiting for one are tried now */
    struct cx_group *next;
};

/* ---------------------------------------------------------------- members */

static cx_gmember_t *member_find(cx_group_t *g, const cx_lid_t *lid)
{
    for (cx_gmember_t *m = g->members; m; m = m->next)
        if (!cx_lid_cmp(&m->lid, lid)) return m;
    return NULL;
}

static cx_gmember_t *member_get(cx_group_t *g, const cx_lid_t *lid)
{
    cx_gmember_t *m = member_find(g, lid);
    if (m) return m;
    m = calloc(1, sizeof *m);
    if (!m) {
        cx_error("group %s: out of memory adding a member", g->pattern);
        return NULL;
    }
    m->lid = *lid;
    cx_lid_format(lid, m->lid_str, sizeof m->lid_str);
    cx_gmember_t **pp = &g->members;
    while (*pp) pp = &(*pp)->next;
    *pp = m;
    cx_debug("group %s: member %s", g->pattern, m->lid_str);
    return m;
}

/* Connects to a member that has a URL and no connection yet (UNKNOWN, or LEFT and now listed
 * again): a member becomes usable only once it is up, since a step's envelope names the
 * receiver's incarnation. */
static void member_dial(cx_group_t *g, cx_gmember_t *m, uint64_t now, int left_too)
{
    cx_engine_t *e = g->e;
    if (!m->has_url || m->gone || now < m->next_dial_ns || !cx_lid_cmp(&m->lid, &e->lid)) return;
    cx_peer_t *p = cx_peer_get_url(e, &m->url);
    if (!p) return;
    if (p->state != CX_PEER_UNKNOWN && (p->state != CX_PEER_LEFT || !left_too)) return;
    m->next_dial_ns = now + CX_GROUP_REDIAL_NS;
    p->state = CX_PEER_CONNECTING;
    p->connect_deadline_ns = now + cx_ms_to_ns(e->cfg.connect_timeout_ms);
    cx_peer_dial(e, p);
}

static void member_set_url(cx_group_t *g, cx_gmember_t *m, const cx_url_t *u)
{
    int moved = m->has_url && (strcmp(m->url.host, u->host) || m->url.port != u->port);
    m->url = *u;
    m->has_url = 1;
    if (moved) {
        m->next_dial_ns = 0;
        cx_peer_t *p = cx_peer_find(g->e, &m->lid);
        /* Not connected: the peer table follows the new address (cx_peer_get_url does that only
         * for a peer that is not up), so reconnects go there. */
        if (p) cx_peer_get_url(g->e, u);
    }
}

static cx_peer_state_t member_state(cx_group_t *g, cx_gmember_t *m)
{
    if (m->gone) return CX_PEER_LEFT;
    cx_peer_t *p = cx_peer_find(g->e, &m->lid);
    if (!p) return CX_PEER_UNKNOWN;
    if (m->marked && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT)) return CX_PEER_FAILED;
    return p->state;
}

/* The member's first region (lowest id): put_signal's remote_offset counts from its start. */
static cx_rregion_t *first_region(cx_peer_t *p)
{
    cx_rregion_t *best = NULL;
    for (cx_rregion_t *r = p->rregions; r; r = r->next)
        if (!best || r->id < best->id) best = r;
    return best;
}

/* Usable for this step now: up, not marked, and for put_signal a first region that holds
 * [roff, roff+len). *why: 1 when some member was up but had no region that fits. */
static int member_usable(cx_group_t *g, cx_gmember_t *m, const cx_gstep_t *s, int *why)
{
    if (m->gone || m->marked) return 0;
    cx_peer_t *p = cx_peer_find(g->e, &m->lid);
    if (!p || p->state != CX_PEER_UP || !p->conn) return 0;
    if (s && s->is_put) {
        cx_rregion_t *r = first_region(p);
        if (!r || s->roff > r->len || s->len > r->len - s->roff) {
            if (why) *why = 1;
            return 0;
        }
    }
    return 1;
}

/* The policy's choice among usable members, avoiding `avoid` unless it is the only one. With
 * advance, round robin moves on (a step was sent); without, it only looks (cx_group_pick). */
static cx_gmember_t *pick(cx_group_t *g, const cx_gstep_t *s, const cx_gmember_t *avoid, int advance, int *why)
{
    int n = 0;
    for (cx_gmember_t *m = g->members; m; m = m->next) n++;
    if (n == 0) return NULL;
    /* Both policies walk the members from the round-robin cursor: round robin takes the first
     * usable one, least in-flight the one with the fewest steps outstanding (ties: the first,
     * so equal members take turns). */
    cx_gmember_t *best = NULL, *fallback = NULL;
    unsigned start = g->rr % (unsigned)n, best_k = 0;
    cx_gmember_t *m = g->members;
    for (unsigned j = start; j; j--) m = m->next;
    for (unsigned k = 0; k < (unsigned)n; k++, m = m->next ? m->next : g->members) {
        if (!member_usable(g, m, s, why)) continue;
        if (m == avoid) {
            if (!fallback) fallback = m;
            continue;
        }
        if (best && (g->policy != CX_PICK_LEAST_INFLIGHT || m->inflight >= best->inflight)) continue;
        best = m;
        best_k = k;
    }
    if (best && advance) g->rr = start + best_k + 1;
    return best ? best : fallback;
}

/* ---------------------------------------------------------------- steps */

static void child_done(cx_op_t *op, int status)
{
    cx_gchild_t *c = (cx_gchild_t *)op;
    cx_group_t *g = c->g;
    c->status = status;
    c->dnext = NULL;
    if (g->done_tail)
        g->done_tail->dnext = c;
    else
        g->done = c;
    g->done_tail = c;
}

static void child_free(cx_gchild_t *c)
{
    pthread_mutex_destroy(&c->op.mu);
    pthread_cond_destroy(&c->op.cv);
    free(c->op.msg_copy);
    free(c);
}

/* Ends a step: the caller's op completes; the step's memory is the caller's from here on. */
static void step_finish(cx_gstep_t *s, int status, const cx_gmember_t *m)
{
    if (s->child) s->child->s = NULL;
    s->prev->next = s->next;
    s->next->prev = s->prev;
    cx_op_t *op = s->parent;
    memset(&op->lid, 0, sizeof op->lid);
    if (m) op->lid = m->lid;
    op->query_id = s->id;
    cx_op_complete(op, status);
}

static int step_issue(cx_group_t *g, cx_gstep_t *s, cx_gmember_t *m, uint64_t now)
{
    cx_engine_t *e = g->e;
    cx_peer_t *p = cx_peer_find(e, &m->lid);
    cx_gchild_t *c = calloc(1, sizeof *c);
    uint8_t *env = c ? malloc(CX_STEP_HDR + s->msg_len) : NULL;
    if (!c || !env || !p) {
        free(c);
        free(env);
        return CX_ENOMEM;
    }
    cx_op_init(&c->op, e, s->is_put ? CX_OPK_PUT_SIGNAL : CX_OPK_MSG);
    c->op.on_done = child_done;
    c->g = g;
    c->s = s;
    c->m = m;
    /* The receiver's incarnation as of now: a restarted receiver does not take it as a step. */
    cx_step_hdr_put(env, p->incarnation, s->id);
    if (s->msg_len) memcpy(env + CX_STEP_HDR, s->msg, s->msg_len);
    c->op.msg_copy = env;
    c->op.x.msg = env;
    c->op.x.msg_len = CX_STEP_HDR + s->msg_len;
    c->op.lid = m->lid;
    c->op.deadline_ns = now + cx_ms_to_ns(e->cfg.op_timeout_ms);
    if (s->is_put) {
        cx_rregion_t *r = first_region(p);
        c->op.x.kind = CX_XFER_PUT_SIGNAL;
        c->op.x.local = (void *)s->src;
        c->op.x.len = s->len;
        c->op.x.remote = r->addr + s->roff;
        cx_registry_contains(&e->reg, (uint64_t)(uintptr_t)s->src, s->len, &c->op.x.local_mem);
    } else {
        c->op.x.kind = CX_XFER_MSG;
    }
    if (s->lost) {
        e->st.steps_handed_over++;
        cx_info("group %s: step %llu handed over to %s", g->pattern, (unsigned long long)s->id, m->lid_str);
        s->lost = 0;
    }
    cx_debug("group %s: step %llu -> %s (in flight there: %u)", g->pattern, (unsigned long long)s->id, m->lid_str,
             m->inflight + 1);
    s->child = c;
    m->inflight++;
    g->children++;
    cx_op_start(e, &c->op); /* may complete at once: child_done only queues it */
    return CX_OK;
}

/* Sends the step to a member, or leaves it waiting for one (bounded by the connect timeout). */
static void step_drive(cx_group_t *g, cx_gstep_t *s, uint64_t now)
{
    int no_region = 0;
    cx_gmember_t *m = pick(g, s, s->last, 1, &no_region);
    if (m && m == s->last && s->retry_at > now) return; /* only the member that said EAGAIN */
    if (m) {
        s->wait_deadline = 0;
        int rc = step_issue(g, s, m, now);
        if (rc) step_finish(s, rc, NULL);
        return;
    }
    if (no_region) {
        cx_warn("group %s: put_signal step %llu: no live member has a first region holding [+%llu, +%zu)", g->pattern,
                (unsigned long long)s->id, (unsigned long long)s->roff, s->len);
        step_finish(s, CX_EINVAL, NULL);
        return;
    }
    if (!s->wait_deadline) {
        s->wait_deadline = now + cx_ms_to_ns(g->e->cfg.connect_timeout_ms);
        for (cx_gmember_t *k = g->members; k; k = k->next) member_dial(g, k, now, 0);
    }
    if (now >= s->wait_deadline) {
        cx_warn("group %s: step %llu: no live member for %u ms", g->pattern, (unsigned long long)s->id,
                g->e->cfg.connect_timeout_ms);
        step_finish(s, CX_EPEER, NULL);
    }
}

/* A child came back: the step is done, handed over, retried, or failed. */
static void child_settle(cx_group_t *g, cx_gchild_t *c, uint64_t now)
{
    cx_gstep_t *s = c->s;
    cx_gmember_t *m = c->m;
    int st = c->status;
    cx_debug("group %s: step %llu at %s: %s", g->pattern, s ? (unsigned long long)s->id : 0ull, m->lid_str,
             cx_strerror(st));
    m->inflight--;
    g->children--;
    child_free(c);
    if (!s) return;
    s->child = NULL;
    switch (st) {
    case CX_OK: step_finish(s, CX_OK, m); return;
    case CX_EPEER:
        /* The member failed or left before it acknowledged the step: another member gets it. */
        s->last = m;
        s->lost = 1;
        if (++s->handovers > CX_GROUP_MAX_HANDOVERS) {
            cx_warn("group %s: step %llu failed on %d members in a row: giving up", g->pattern,
                    (unsigned long long)s->id, s->handovers);
            step_finish(s, CX_EPEER, NULL);
            return;
        }
        step_drive(g, s, now);
        return;
    case CX_EAGAIN:
        /* Its queue is full: another member, or this one again a little later, until the op
         * timeout. */
        if (now >= s->deadline) {
            step_finish(s, CX_EAGAIN, m);
            return;
        }
        s->last = m;
        s->retry_at = now + 5000000ull;
        step_drive(g, s, now);
        return;
    default: step_finish(s, st, m); return;
    }
}

static void group_free(cx_group_t *g)
{
    while (g->members) {
        cx_gmember_t *m = g->members;
        g->members = m->next;
        free(m);
    }
    free(g);
}

static void group_unlink(cx_engine_t *e, cx_group_t *g)
{
    for (cx_group_t **pp = &e->groups; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            return;
        }
}

int cx_groups_progress(cx_engine_t *e)
{
    if (!e->groups) return 0;
    uint64_t now = 0;
    for (cx_group_t *g = e->groups, *n; g; g = n) {
        n = g->next;
        if (!g->done && !g->kick) continue;
        if (!now) now = cx_now_ns();
        while (g->done) {
            cx_gchild_t *c = g->done;
            g->done = c->dnext;
            if (!g->done) g->done_tail = NULL;
            child_settle(g, c, now);
        }
        if (g->kick) {
            g->kick = 0;
            for (cx_gstep_t *s = g->steps.next, *sn; s != &g->steps; s = sn) {
                sn = s->next;
                if (!s->child) step_drive(g, s, now);
            }
        }
        if (g->closed && !g->children) {
            group_unlink(e, g);
            group_free(g);
        }
    }
    return now != 0;
}

void cx_groups_tick(cx_engine_t *e, uint64_t now)
{
    for (cx_group_t *g = e->groups; g; g = g->next) {
        if (g->closed) continue;
        for (cx_gstep_t *s = g->steps.next, *sn; s != &g->steps; s = sn) {
            sn = s->next;
            if (!s->child) step_drive(g, s, now);
        }
        for (cx_gmember_t *m = g->members; m; m = m->next)
            if (!m->marked) member_dial(g, m, now, 0);
    }
}

void cx_group_op_start(cx_engine_t *e, cx_op_t *op)
{
    cx_gstep_t *s = op->msg_copy;
    cx_group_t *g = s->g;
    uint64_t now = cx_now_ns();
    s->parent = op;
    s->id = ++e->last_step;
    s->deadline = now + cx_ms_to_ns(e->cfg.op_timeout_ms);
    s->prev = g->steps.prev;
    s->next = &g->steps;
    g->steps.prev->next = s;
    g->steps.prev = s;
    if (g->closed) {
        step_finish(s, CX_ECLOSED, NULL);
        return;
    }
    step_drive(g, s, now);
}

/* ---------------------------------------------------------------- what the core tells us */

void cx_groups_on_event(cx_engine_t *e, cx_peer_t *p, cx_event_type_t t)
{
    for (cx_group_t *g = e->groups; g; g = g->next) {
        if (g->closed || !cx_lid_pat_match(&g->pat, &p->lid)) continue;
        cx_gmember_t *m = member_get(g, &p->lid);
        if (!m) continue;
        if (t == CX_EVENT_UP || t == CX_EVENT_JOINED || t == CX_EVENT_MOVED) {
            member_set_url(g, m, &p->u);
            if (t != CX_EVENT_MOVED) {
                m->marked = 0;
                m->gone = 0;
                g->kick = 1; /* steps waiting for a member: cx_groups_progress tries them */
            }
        }
        /* FAILED, SUSPECT, LEFT: the peer's state says it; its children fail by themselves. */
    }
}

void cx_groups_on_dir(cx_engine_t *e, const cx_dir_entry_t *ent, int kind)
{
    cx_url_t u;
    int have_url = kind == CX_DIR_PUT && cx_url_parse(ent->url, &u, NULL, 0) == CX_OK;
    for (cx_group_t *g = e->groups; g; g = g->next) {
        if (g->closed || !cx_lid_pat_match(&g->pat, &ent->lid) || !cx_lid_cmp(&ent->lid, &e->lid)) continue;
        if (kind == CX_DIR_DEL) {
            cx_gmember_t *m = member_find(g, &ent->lid);
            if (m) m->gone = 1;
            continue;
        }
        if (!have_url) continue;
        cx_gmember_t *m = member_get(g, &ent->lid);
        if (!m) continue;
        m->gone = 0;
        member_set_url(g, m, &u);
        member_dial(g, m, cx_now_ns(), 1);
    }
}

void cx_groups_free_all(cx_engine_t *e)
{
    while (e->groups) {
        cx_group_t *g = e->groups;
        e->groups = g->next;
        /* The progress thread is gone: every child was completed by the shutdown (queued in
         * done); steps still open end with CX_ECLOSED. */
        while (g->done) {
            cx_gchild_t *c = g->done;
            g->done = c->dnext;
            if (c->s) c->s->child = NULL;
            c->m->inflight--;
            g->children--;
            child_free(c);
        }
        while (g->steps.next != &g->steps) step_finish(g->steps.next, CX_ECLOSED, NULL);
        if (g->children)
            cx_error("group %s: %u step messages still in flight at engine destroy: leaked", g->pattern, g->children);
        group_free(g);
    }
    cx_step_forget_peer(e, NULL);
}

/* ---------------------------------------------------------------- public API */

struct gq { /* a caller's question, answered on the progress thread */
    cx_group_t *g;
    const char *s;
    cx_url_t url;
    cx_lid_t lid;
    cx_lid_t *lids;
    cx_peer_state_t *states;
    int max, rc;
};

static void add_dir_entry(void *ctx, const cx_dir_entry_t *ent)
{
    cx_group_t *g = ctx;
    cx_groups_on_dir(g->e, ent, CX_DIR_PUT);
}

static void open_fn(cx_engine_t *e, void *arg)
{
    cx_group_t *g = ((struct gq *)arg)->g;
    g->next = e->groups;
    e->groups = g;
    /* Members already known: peers in the table, then the directory's entries. */
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        if (!cx_lid_pat_match(&g->pat, &p->lid)) continue;
        cx_gmember_t *m = member_get(g, &p->lid);
        if (m && p->state != CX_PEER_LEFT) member_set_url(g, m, &p->u);
    }
    cx_dir_each(e, &g->pat, add_dir_entry, g);
}

int cx_group_open(cx_engine_t *e, const char *pattern, cx_pick_t policy, cx_group_t **out)
{
    if (out) *out = NULL;
    if (!e || !out) {
        cx_warn("group_open: NULL engine or output");
        return CX_EINVAL;
    }
    if (policy != CX_PICK_ROUND_ROBIN && policy != CX_PICK_LEAST_INFLIGHT) {
        cx_warn("group_open: unknown pick policy %d", (int)policy);
        return CX_EINVAL;
    }
    cx_group_t *g = calloc(1, sizeof *g);
    if (!g) return CX_ENOMEM;
    char err[200];
    if (cx_lid_pat_parse(pattern, &g->pat, err, sizeof err)) {
        cx_warn("group_open: %s", err);
        free(g);
        return CX_EINVAL;
    }
    g->e = e;
    snprintf(g->pattern, sizeof g->pattern, "%s", pattern);
    g->policy = policy;
    g->steps.next = g->steps.prev = &g->steps;
    struct gq q = { .g = g };
    int rc = cx_exec(e, open_fn, &q);
    if (rc) {
        free(g);
        return rc;
    }
    *out = g;
    return CX_OK;
}

static void close_fn(cx_engine_t *e, void *arg)
{
    cx_group_t *g = ((struct gq *)arg)->g;
    g->closed = 1;
    while (g->steps.next != &g->steps) step_finish(g->steps.next, CX_ECLOSED, NULL);
    /* Children still in a backend come back later (orphans): the group waits for them. */
    if (!g->children && !g->done) {
        group_unlink(e, g);
        group_free(g);
    }
}

void cx_group_close(cx_group_t *g)
{
    if (!g) return;
    struct gq q = { .g = g };
    cx_exec(g->e, close_fn, &q);
}

static void add_fn(cx_engine_t *e, void *arg)
{
    struct gq *q = arg;
    cx_gmember_t *m = member_get(q->g, &q->url.lid);
    if (!m) {
        q->rc = CX_ENOMEM;
        return;
    }
    m->gone = 0;
    m->marked = 0; /* added again: the caller vouches for it */
    member_set_url(q->g, m, &q->url);
    m->next_dial_ns = 0;
    member_dial(q->g, m, cx_now_ns(), 1);
    q->g->kick = 1;
    (void)e;
}

int cx_group_add(cx_group_t *g, const char *url)
{
    if (!g) return CX_EINVAL;
    struct gq q = { .g = g };
    char err[200];
    if (!url || cx_url_parse(url, &q.url, err, sizeof err)) {
        cx_warn("group_add: %s", url ? err : "NULL URL");
        return CX_EINVAL;
    }
    if (!cx_lid_pat_match(&g->pat, &q.url.lid)) {
        cx_warn("group_add: %s does not match the group's pattern %s", url, g->pattern);
        return CX_EINVAL;
    }
    if (!cx_lid_cmp(&q.url.lid, &g->e->lid)) {
        cx_warn("group_add: %s is this engine's own identity", url);
        return CX_EINVAL;
    }
    int rc = cx_exec(g->e, add_fn, &q);
    return rc ? rc : q.rc;
}

static void members_fn(cx_engine_t *e, void *arg)
{
    struct gq *q = arg;
    (void)e;
    int n = 0;
    for (cx_gmember_t *m = q->g->members; m; m = m->next, n++) {
        if (n >= q->max) continue;
        if (q->lids) q->lids[n] = m->lid;
        if (q->states) q->states[n] = member_state(q->g, m);
    }
    q->rc = n;
}

int cx_group_members(cx_group_t *g, cx_lid_t *lids, cx_peer_state_t *states, int max)
{
    if (!g || max < 0) return CX_EINVAL;
    struct gq q = { .g = g, .lids = lids, .states = states, .max = max };
    int rc = cx_exec(g->e, members_fn, &q);
    return rc ? rc : q.rc;
}

static void pick_fn(cx_engine_t *e, void *arg)
{
    struct gq *q = arg;
    (void)e;
    cx_gmember_t *m = pick(q->g, NULL, NULL, 0, NULL);
    if (!m) {
        q->rc = CX_EPEER;
        return;
    }
    q->lid = m->lid;
    q->rc = CX_OK;
}

int cx_group_pick(cx_group_t *g, cx_lid_t *out)
{
    if (!g || !out) return CX_EINVAL;
    struct gq q = { .g = g };
    int rc = cx_exec(g->e, pick_fn, &q);
    if (rc) return rc;
    if (q.rc == CX_OK) *out = q.lid;
    return q.rc;
}

static void mark_fn(cx_engine_t *e, void *arg)
{
    struct gq *q = arg;
    cx_group_t *g = q->g;
    cx_gmember_t *m = member_find(g, &q->lid);
    if (!m) {
        q->rc = CX_EINVAL;
        return;
    }
    q->rc = CX_OK;
    m->marked = 1;
    /* Its steps go elsewhere now; the message already on its way there may still arrive (a
     * step is delivered at most once per receiver, not at most once in the group). */
    uint64_t now = cx_now_ns();
    for (cx_gstep_t *s = g->steps.next, *sn; s != &g->steps; s = sn) {
        sn = s->next;
        if (!s->child || s->child->m != m) continue;
        s->child->s = NULL;
        s->child = NULL;
        s->last = m;
        s->lost = 1;
        step_drive(g, s, now);
    }
    (void)e;
}

int cx_group_mark_failed(cx_group_t *g, const char *lid)
{
    if (!g) return CX_EINVAL;
    struct gq q = { .g = g };
    char err[200];
    if (!lid || cx_lid_parse(lid, &q.lid, err, sizeof err)) {
        cx_warn("group_mark_failed: %s", lid ? err : "NULL LID");
        return CX_EINVAL;
    }
    int rc = cx_exec(g->e, mark_fn, &q);
    if (!rc && q.rc) cx_warn("group_mark_failed: %s is not a member of %s", lid, g->pattern);
    return rc ? rc : q.rc;
}

/* The parent op: msg_copy = the step's state, then the payload. */
static int step_submit(cx_group_t *g, int is_put, const void *src, size_t len, uint64_t roff, const void *msg,
                       size_t msg_len, cx_op_t **out)
{
    cx_op_t *op = malloc(sizeof *op);
    cx_gstep_t *s = calloc(1, sizeof *s + msg_len);
    if (!op || !s) {
        free(op);
        free(s);
        return CX_ENOMEM;
    }
    cx_op_init(op, g->e, CX_OPK_GROUP);
    s->g = g;
    s->is_put = is_put;
    s->src = src;
    s->len = len;
    s->roff = roff;
    s->msg = (const uint8_t *)(s + 1);
    s->msg_len = msg_len;
    if (msg_len) memcpy(s + 1, msg, msg_len);
    op->msg_copy = s;
    op->async = 1;
    int rc = cx_submit(g->e, op);
    if (rc) {
        cx_op_complete(op, rc);
        cx_op_wait(op, 0); /* frees it */
        return rc;
    }
    *out = op;
    return CX_OK;
}

int cx_group_send(cx_group_t *g, const void *msg, size_t len, cx_op_t **op)
{
    if (op) *op = NULL;
    if (!g || !op) {
        cx_warn("group_send: NULL group or op pointer");
        return CX_EINVAL;
    }
    if (len > CX_MSG_MAX - CX_STEP_HDR || (len && !msg)) {
        cx_warn("group_send: bad message (%zu bytes; at most CX_MSG_MAX - %d)", len, CX_STEP_HDR);
        return CX_EINVAL;
    }
    return step_submit(g, 0, NULL, 0, 0, msg, len, op);
}

int cx_group_put_signal(cx_group_t *g, const void *src, size_t len, uint64_t remote_offset, const void *msg,
                        size_t msg_len, cx_op_t **op)
{
    if (op) *op = NULL;
    if (!g || !op) {
        cx_warn("group_put_signal: NULL group or op pointer");
        return CX_EINVAL;
    }
    if (msg_len > CX_MSG_MAX - CX_STEP_HDR || (msg_len && !msg)) {
        cx_warn("group_put_signal: bad message (%zu bytes)", msg_len);
        return CX_EINVAL;
    }
    if (!src || !len) {
        cx_warn("group_put_signal: NULL or empty local buffer");
        return CX_EINVAL;
    }
    if (remote_offset + len < remote_offset) {
        cx_warn("group_put_signal: remote range wraps around");
        return CX_EINVAL;
    }
    int kind;
    if (!cx_registry_contains(&g->e->reg, (uint64_t)(uintptr_t)src, len, &kind)) {
        cx_warn("group_put_signal: local buffer [%p, +%zu) is not inside one registered region", src, len);
        return CX_EINVAL;
    }
    return step_submit(g, 1, src, len, remote_offset, msg, msg_len, op);
}

int cx_group_wait(cx_op_t *op, int timeout_ms, cx_lid_t *taken_by, uint64_t *step)
{
    if (!op) return CX_EINVAL;
    struct timespec dl;
    if (timeout_ms >= 0) cx_deadline_ms(&dl, timeout_ms);
    if (timeout_ms) cx_op_spin(op, op->w.spin_ns);
    pthread_mutex_lock(&op->mu);
    while (!cx_op_is_done(op))
        if (cx_cond_wait_ms(&op->cv, &op->mu, timeout_ms >= 0 ? &dl : NULL) == ETIMEDOUT) break;
    int done = cx_op_is_done(op);
    if (done && op->kind == CX_OPK_GROUP) {
        if (taken_by) *taken_by = op->lid;
        if (step) *step = op->query_id;
    }
    pthread_mutex_unlock(&op->mu);
    if (!done) return CX_EINPROGRESS;
    return cx_op_wait(op, 0);
}
