/* Peers: the LID table, the control-channel handshake, incarnations, heartbeats and events.
 * This is the shared mobility layer: every backend's failure reports end up here, and only
 * here is it decided what they mean. */
#include "engine.h"
#include "rstage.h"

#include "connex/log.h"
#include "gpu_hook.h"
#include "live.h"
#include "mobility/dir_impl.h"
#include "mobility/mobility.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* Reconnecting to a failed peer: a restart takes milliseconds, so the first try comes soon; the
 * wait doubles after each miss, up to one try a second. */
#define CX_RECONNECT_FIRST_MS 20
#define CX_RECONNECT_MAX_MS 1000
/* At engine close, how long a BYE may take to leave: tries of a flush, a pause between them
 * (about 100 ms in all, so a peer that does not read cannot hold the close up). */
#define CX_BYE_FLUSH_TRIES 100
#define CX_BYE_FLUSH_WAIT_NS CX_NS_PER_MS
/* Connections accepted per wake-up of the listening socket: the rest wait for the next turn, so
 * that a burst of dials does not hold up the ops in flight. */
#define CX_ACCEPT_BUDGET 64
/* Reads per wake-up of one control connection, so that one chatty peer cannot starve the others. */
#define CX_CONN_READ_ROUNDS 16

static uint32_t next_backoff_ms(uint32_t ms)
{
    return ms < CX_RECONNECT_MAX_MS / 2 ? ms * 2 : CX_RECONNECT_MAX_MS;
}

/* ---------------------------------------------------------------- table */

/* FNV-1a over the LID's fields: peers of one deployment share the model name and differ in
 * stage, shard and replica, which therefore go through the hash too. */
static unsigned lid_bucket(const cx_lid_t *l)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < CX_MODEL_MAX && l->model[i]; i++) h = (h ^ (uint8_t)l->model[i]) * 16777619u;
    const uint32_t f[3] = { l->stage, l->shard, l->replica };
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) h = (h ^ ((f[i] >> (8 * k)) & 0xffu)) * 16777619u;
    return (h ^ (h >> 16)) & (CX_PEER_BUCKETS - 1);
}

static unsigned inc_bucket(uint64_t inc)
{
    return (unsigned)((inc * 0x9e3779b97f4a7c15ull) >> 56) & (CX_PEER_BUCKETS - 1);
}

cx_peer_t *cx_peer_find(cx_engine_t *e, const cx_lid_t *lid)
{
    for (cx_peer_t *p = e->peer_by_lid[lid_bucket(lid)]; p; p = p->lid_hnext)
        if (!cx_lid_cmp(&p->lid, lid)) return p;
    return NULL;
}

cx_peer_t *cx_peer_by_inc(cx_engine_t *e, uint64_t inc)
{
    for (cx_peer_t *p = e->peer_by_inc[inc_bucket(inc)]; p; p = p->inc_hnext)
        if (p->incarnation == inc && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT)) return p;
    return NULL;
}

/* A HELLO names the peer's incarnation: index it under the new one. */
static void set_incarnation(cx_engine_t *e, cx_peer_t *p, uint64_t inc)
{
    if (p->inc_hashed && p->incarnation == inc) return;
    if (p->inc_hashed)
        for (cx_peer_t **pp = &e->peer_by_inc[inc_bucket(p->incarnation)]; *pp; pp = &(*pp)->inc_hnext)
            if (*pp == p) {
                *pp = p->inc_hnext;
                break;
            }
    p->incarnation = inc;
    unsigned b = inc_bucket(inc);
    p->inc_hnext = e->peer_by_inc[b];
    e->peer_by_inc[b] = p;
    p->inc_hashed = 1;
}

static void set_url(cx_peer_t *p, const cx_url_t *u)
{
    p->u = *u;
    cx_url_format(u, p->url, sizeof p->url);
}

void cx_peer_follow_url(cx_peer_t *p, const cx_url_t *u)
{
    if (p->u.port == u->port && !strcmp(p->u.host, u->host)) return;
    char nu[CX_URL_MAX];
    cx_url_format(u, nu, sizeof nu);
    /* A peer reached at a new address: follow it when the old one is not in use. */
    if (p->state != CX_PEER_UP && p->state != CX_PEER_SUSPECT) {
        cx_info("peer %s: address changes to %s", p->url, nu);
        set_url(p, u);
    }
}

cx_peer_t *cx_peer_get_url(cx_engine_t *e, const cx_url_t *u)
{
    cx_peer_t *p = cx_peer_find(e, &u->lid);
    if (p) {
        cx_peer_follow_url(p, u);
        return p;
    }
    p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->lid = u->lid;
    cx_lid_format(&p->lid, p->lid_str, sizeof p->lid_str);
    set_url(p, u);
    p->state = CX_PEER_UNKNOWN;
    p->bidx = -1;
    p->ops.next = p->ops.prev = &p->ops;
    p->next = e->peers;
    e->peers = p;
    unsigned b = lid_bucket(&p->lid);
    p->lid_hnext = e->peer_by_lid[b];
    e->peer_by_lid[b] = p;
    return p;
}

/* The peer's view of our regions is gone with its connection: it owes no REG_DEL_ACK. */
static void owed_release(cx_peer_t *p)
{
    for (size_t i = 0; i < p->n_owed; i++) atomic_fetch_sub(&p->owed[i]->pins, 1);
    free(p->owed);
    p->owed = NULL;
    p->n_owed = p->cap_owed = 0;
}

static void on_reg_del_ack(cx_peer_t *p, uint64_t id)
{
    for (size_t i = 0; i < p->n_owed; i++) {
        if (p->owed[i]->id != id) continue;
        atomic_fetch_sub(&p->owed[i]->pins, 1);
        p->owed[i] = p->owed[--p->n_owed];
        return;
    }
}

void cx_peer_region_gone(cx_engine_t *e, cx_region_t *r)
{
    uint8_t body[8];
    cx_wr_t w;
    cx_wr_init(&w, body, sizeof body);
    cx_wr_u64(&w, r->id);
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        if (!p->conn) continue;
        cx_conn_send(e, p->conn, CX_CTL_REG_DEL, body, w.len);
        if (p->state != CX_PEER_UP && p->state != CX_PEER_SUSPECT) continue;   /* HELLO will tell it */
        if (p->n_owed == p->cap_owed) {
            size_t cap = p->cap_owed ? 2 * p->cap_owed : 4;
            cx_region_t **v = realloc(p->owed, cap * sizeof *v);
            if (!v) {
                cx_warn("peer %s: out of memory: unregister does not wait for its REG_DEL_ACK", p->url);
                continue;
            }
            p->owed = v;
            p->cap_owed = cap;
        }
        p->owed[p->n_owed++] = r;
        atomic_fetch_add(&r->pins, 1);
    }
}

/* Any op of ours to p still moving bytes in its region `id`? */
static int region_busy(const cx_peer_t *p, uint64_t id)
{
    for (const cx_op_t *op = p->ops.next; op != &p->ops; op = op->next)
        if (op->x.kind != CX_XFER_MSG && op->x.len && op->x.remote_region == id &&
            (op->stage == OPS_IN_BACKEND || op->stage == OPS_STAGING))
            return 1;
    return 0;
}

static void delack_send(cx_engine_t *e, cx_peer_t *p, uint64_t id)
{
    if (!p->conn) return;
    uint8_t body[8];
    cx_wr_t w;
    cx_wr_init(&w, body, sizeof body);
    cx_wr_u64(&w, id);
    cx_conn_send(e, p->conn, CX_CTL_REG_DEL_ACK, body, w.len);
}

void cx_peer_delack_check(cx_engine_t *e, cx_peer_t *p)
{
    for (size_t i = 0; i < p->n_delack;) {
        if (region_busy(p, p->delack[i])) {
            i++;
            continue;
        }
        delack_send(e, p, p->delack[i]);
        p->delack[i] = p->delack[--p->n_delack];
    }
}

/* REG_DEL from p: ops started from now on find the region gone; the ack waits for ours in it. */
static void on_reg_del(cx_engine_t *e, cx_peer_t *p, uint64_t id)
{
    if (region_busy(p, id)) {
        if (p->n_delack == p->cap_delack) {
            size_t cap = p->cap_delack ? 2 * p->cap_delack : 4;
            uint64_t *v = realloc(p->delack, cap * sizeof *v);
            if (v) {
                p->delack = v;
                p->cap_delack = cap;
            }
        }
        if (p->n_delack < p->cap_delack) {
            cx_debug("peer %s: region %llu unregistered there while ops of ours are in it: acked when they end",
                     p->url, (unsigned long long)id);
            p->delack[p->n_delack++] = id;
            return;
        }
        cx_warn("peer %s: out of memory: region %llu acked while ops of ours are in it", p->url,
                (unsigned long long)id);
    }
    delack_send(e, p, id);
}

static void rregions_free(cx_peer_t *p)
{
    owed_release(p);
    free(p->delack);   /* its view of our ops is gone with the connection */
    p->delack = NULL;
    p->n_delack = p->cap_delack = 0;
    free(p->rr_by_addr);
    p->rr_by_addr = NULL;
    p->rr_n = p->rr_cap = 0;
    while (p->rregions) {
        cx_rregion_t *r = p->rregions;
        p->rregions = r->next;
        for (int i = 0; i < CX_MAX_BACKENDS; i++) free(r->key[i]);
        free(r);
    }
}

static void adv_free(cx_peer_t *p)
{
    for (int i = 0; i < CX_MAX_BACKENDS; i++) {
        free(p->adv[i]);
        p->adv[i] = NULL;
        p->adv_len[i] = 0;
    }
}

void cx_peer_free_all(cx_engine_t *e)
{
    while (e->peers) {
        cx_peer_t *p = e->peers;
        e->peers = p->next;
        /* Ops the staging ring still holds complete after this (cx_staging_fini): they must not
         * reach back into the freed peer (its op list, its credits). */
        while (p->ops.next && p->ops.next != &p->ops) {
            cx_op_t *op = p->ops.next;
            p->ops.next = op->next;
            op->next = op->prev = NULL;
            op->peer = NULL;
            op->credit = 0;
        }
        rregions_free(p);
        adv_free(p);
        free(p);
    }
    memset(e->peer_by_lid, 0, sizeof e->peer_by_lid);
    memset(e->peer_by_inc, 0, sizeof e->peer_by_inc);
    e->active_peers = e->sched_dirty_head = NULL;
}

static int rr_holds(const cx_rregion_t *r, uint64_t addr, uint64_t len)
{
    return addr >= r->addr && addr - r->addr <= r->len && len <= r->len - (addr - r->addr);
}

/* The first index whose region starts above addr. */
static size_t rr_upper(const cx_peer_t *p, uint64_t addr)
{
    size_t lo = 0, hi = p->rr_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->rr_by_addr[mid]->addr <= addr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

cx_rregion_t *cx_rregion_find(cx_peer_t *p, uint64_t addr, uint64_t len)
{
    /* The region starting last at or below addr holds the range when regions do not overlap
     * (a peer's registry refuses overlaps). A peer is not trusted to say so, and the index may
     * have missed a region (no memory to grow it): anything else is looked for in the list. */
    size_t i = rr_upper(p, addr);
    if (i && rr_holds(p->rr_by_addr[i - 1], addr, len)) return p->rr_by_addr[i - 1];
    for (cx_rregion_t *r = p->rregions; r; r = r->next)
        if (rr_holds(r, addr, len)) return r;
    return NULL;
}

static void rr_index_add(cx_peer_t *p, cx_rregion_t *r)
{
    if (p->rr_n == p->rr_cap) {
        size_t cap = p->rr_cap ? 2 * p->rr_cap : 8;
        cx_rregion_t **v = realloc(p->rr_by_addr, cap * sizeof *v);
        if (!v) return;   /* found through the list */
        p->rr_by_addr = v;
        p->rr_cap = cap;
    }
    size_t i = rr_upper(p, r->addr);
    memmove(&p->rr_by_addr[i + 1], &p->rr_by_addr[i], (p->rr_n - i) * sizeof *p->rr_by_addr);
    p->rr_by_addr[i] = r;
    p->rr_n++;
}

static void rr_index_del(cx_peer_t *p, const cx_rregion_t *r)
{
    for (size_t i = 0; i < p->rr_n; i++)
        if (p->rr_by_addr[i] == r) {
            memmove(&p->rr_by_addr[i], &p->rr_by_addr[i + 1], (p->rr_n - i - 1) * sizeof *p->rr_by_addr);
            p->rr_n--;
            return;
        }
}

static void rregion_del(cx_engine_t *e, cx_peer_t *p, uint64_t id)
{
    for (cx_rregion_t **pp = &p->rregions; *pp; pp = &(*pp)->next) {
        cx_rregion_t *r = *pp;
        if (r->id != id) continue;
        *pp = r->next;
        rr_index_del(p, r);
        if (p->ep && p->bidx >= 0 && e->be[p->bidx].ops->forget_region)
            e->be[p->bidx].ops->forget_region(e->be[p->bidx].b, p->ep, id);
        for (int i = 0; i < CX_MAX_BACKENDS; i++) free(r->key[i]);
        free(r);
        return;
    }
}

static int rregion_add(cx_engine_t *e, cx_peer_t *p, const cx_wire_region_t *w)
{
    rregion_del(e, p, w->id);
    cx_rregion_t *r = calloc(1, sizeof *r);
    if (!r) return CX_ENOMEM;
    r->id = w->id;
    r->addr = w->addr;
    r->len = w->len;
    r->mem_kind = w->mem_kind;
    for (int k = 0; k < w->nkeys; k++)
        for (int i = 0; i < e->nb; i++) {
            if (strcmp(w->keys[k].name, e->bnames[i])) continue;
            if (r->key[i]) {   /* a second key for one backend: the first stands */
                cx_warn("peer %s: region %llu carries two keys for %s; the second is ignored", p->url,
                        (unsigned long long)w->id, e->bnames[i]);
                continue;
            }
            r->key[i] = malloc(w->keys[k].len ? w->keys[k].len : 1);
            if (!r->key[i]) continue;
            memcpy(r->key[i], w->keys[k].key, w->keys[k].len);
            r->key_len[i] = w->keys[k].len;
        }
    r->next = p->rregions;
    p->rregions = r;
    rr_index_add(p, r);
    return CX_OK;
}

/* ---------------------------------------------------------------- events */

void cx_event_fill(cx_event_t *ev, const cx_lid_t *lid, const char *url, uint64_t inc, cx_event_type_t t,
                   const char *reason)
{
    memset(ev, 0, sizeof *ev);
    ev->type = t;
    ev->peer = *lid;
    snprintf(ev->url, sizeof ev->url, "%s", url);
    snprintf(ev->reason, sizeof ev->reason, "%s", reason ? reason : "");
    ev->incarnation = inc;
    ev->time_ns = cx_now_ns();
}

/* The same-host watcher reports a death from its own thread, at once: handing it to the progress
 * thread first cost a second wake-up, 2-5 ms of the SIGKILL -> FAILED tail on a busy 2-CPU host
 * (docs/results.md). The progress thread learns of it later, so the order is kept here: one
 * FAILED per incarnation, and nothing about a dead incarnation after its FAILED. */
int cx_event_gate(cx_peer_t *p, cx_event_type_t t, uint64_t inc, int watcher)
{
    uint64_t tag = inc + 1;
    if (watcher) {
        if (p->ev_dead == tag || p->ev_inc != tag || p->ev_ended) return 0;   /* told already, or a newer one */
        p->ev_dead = tag;
        p->ev_ended = 1;
        return 1;
    }
    /* A dead process neither recovers nor fails twice. LEFT (its directory entry went) and MOVED
     * are about the LID, and still go out. */
    if (p->ev_dead == tag && (t == CX_EVENT_UP || t == CX_EVENT_FAILED || t == CX_EVENT_SUSPECT)) return 0;
    if (t == CX_EVENT_UP || t == CX_EVENT_JOINED) {
        p->ev_inc = tag;
        p->ev_ended = 0;
    } else if ((t == CX_EVENT_FAILED || t == CX_EVENT_LEFT) && p->ev_inc == tag) {
        p->ev_ended = 1;
    }
    return 1;
}

int cx_peer_reported_dead(cx_engine_t *e, cx_peer_t *p)
{
    pthread_mutex_lock(&e->evq.mu);
    int dead = p->ev_dead == p->incarnation + 1;
    pthread_mutex_unlock(&e->evq.mu);
    return dead;
}

void cx_event_emit(cx_engine_t *e, cx_peer_t *p, cx_event_type_t t, const char *reason)
{
    cx_event_t ev;
    cx_event_fill(&ev, &p->lid, p->url, p->incarnation, t, reason);
    if (t == CX_EVENT_FAILED) e->st.peer_failures++, p->m.failures++;
    if (t == CX_EVENT_JOINED) e->st.peer_joins++, p->m.joins++;
    p->m.since_ns = cx_now_ns();
    pthread_mutex_lock(&e->evq.mu);
    int out = cx_event_gate(p, t, p->incarnation, 0);
    if (out) cx_evq_push_locked(&e->evq, &ev);
    pthread_mutex_unlock(&e->evq.mu);
    if (out)
        cx_log(t == CX_EVENT_FAILED ? CX_LOG_WARN : CX_LOG_INFO, "peer %s: %s%s%s", p->url, cx_event_name(t),
               reason && *reason ? ": " : "", reason ? reason : "");
    else
        cx_debug("peer %s: %s (%s) not reported: the same-host watch reported it dead", p->url,
                 cx_event_name(t), reason ? reason : "");
    cx_groups_on_event(e, p, t);
}

/* ---------------------------------------------------------------- sending */

static void send_hello(cx_engine_t *e, cx_conn_t *c, uint8_t type, const cx_lid_t *target)
{
    const uint8_t *addrs[CX_MAX_BACKENDS];
    uint16_t lens[CX_MAX_BACKENDS];
    size_t cap = 512 + CX_URL_MAX;
    for (int i = 0; i < e->nb; i++) {
        /* asked again at every HELLO: a backend's address may change (UCX worker rotation) */
        size_t al = sizeof e->be[i].addr;
        if (e->be[i].ops->address(e->be[i].b, e->be[i].addr, &al) == CX_OK) e->be[i].addr_len = al;
        addrs[i] = e->be[i].addr;
        lens[i] = (uint16_t)e->be[i].addr_len;
        cap += 32 + e->be[i].addr_len;
    }
    pthread_rwlock_rdlock(&e->reg.lock);
    for (size_t i = 0; i < e->reg.n; i++) {
        cap += 64;
        for (int b = 0; b < e->nb; b++) cap += 24 + e->reg.v[i]->key_len[b];
    }
    uint8_t *buf = malloc(cap);
    if (!buf) {
        pthread_rwlock_unlock(&e->reg.lock);
        cx_error("out of memory building HELLO");
        return;
    }
    cx_wr_t w;
    cx_wr_init(&w, buf, cap);
    uint32_t live_pid;
    int32_t live_fd;
    cx_live_advert(e, &live_pid, &live_fd);
    cx_wire_put_hello_head(&w, e->incarnation, &e->lid, e->url, target, e->host_id, e->cfg.heartbeat_ms,
                           e->cfg.heartbeat_timeout_ms, live_pid, live_fd, e->nb, e->bnames, e->bchoice_p, addrs, lens,
                           (uint32_t)e->reg.n);
    for (size_t i = 0; i < e->reg.n; i++) cx_wire_put_region(&w, e->reg.v[i], e->bnames, e->nb);
    pthread_rwlock_unlock(&e->reg.lock);
    if (w.ok) cx_conn_send(e, c, type, buf, w.len);
    else cx_error("HELLO does not fit its buffer (bug)");
    free(buf);
}

void cx_peer_broadcast(cx_engine_t *e, uint8_t type, const void *body, size_t len)
{
    for (cx_peer_t *p = e->peers; p; p = p->next)
        if (p->conn) cx_conn_send(e, p->conn, type, body, len);
}

void cx_peer_report_death(cx_engine_t *e, cx_peer_t *dead)
{
    uint8_t buf[128];
    cx_wr_t w;
    cx_wr_init(&w, buf, sizeof buf);
    cx_wire_put_death(&w, &dead->lid, dead->incarnation);
    if (!w.ok) return;
    for (cx_peer_t *p = e->peers; p; p = p->next)
        if (p != dead && p->conn && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT))
            cx_conn_send(e, p->conn, CX_CTL_DEATH, buf, w.len);
}

void cx_peer_send_bye_all(cx_engine_t *e)
{
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        if (!p->conn) continue;
        cx_conn_send(e, p->conn, CX_CTL_BYE, NULL, 0);
        /* BYE must reach the peer before our sockets close, or it would see a failure. */
        for (int i = 0; i < CX_BYE_FLUSH_TRIES && p->conn->tx_len > p->conn->tx_off; i++) {
            if (cx_conn_flush(e, p->conn)) break;
            usleep((useconds_t)(CX_BYE_FLUSH_WAIT_NS / CX_NS_PER_US));
        }
        shutdown(p->conn->fd, SHUT_WR);
    }
}

/* ---------------------------------------------------------------- state changes */

void cx_peer_drop_ep(cx_engine_t *e, cx_peer_t *p, int status)
{
    if (!p->ep) return;
    for (cx_op_t *op = p->ops.next; op != &p->ops; op = op->next)
        if (op->stage == OPS_IN_BACKEND && !op->forced_status) op->forced_status = status;
    cx_bep_t *ep = p->ep;
    p->ep = NULL;
    e->be[p->bidx].ops->disconnect(e->be[p->bidx].b, ep, status);
}

/* A probe is a heartbeat with a body: u8 CX_HB_PROBE and a u64 id; the peer answers at once with
 * u8 CX_HB_ANSWER and the same id. A peer that predates probes ignores the body of a heartbeat:
 * its probe ends at the deadline, answered by whatever was heard from it since. */
enum { CX_HB_PROBE = 1, CX_HB_ANSWER = 2 };

static void send_probe(cx_engine_t *e, cx_conn_t *c, uint8_t kind, uint64_t id)
{
    uint8_t body[9];
    cx_wr_t w;
    cx_wr_init(&w, body, sizeof body);
    cx_wr_u8(&w, kind);
    cx_wr_u64(&w, id);
    cx_conn_send(e, c, CX_CTL_HB, body, w.len);
}

/* The probe ended and the peer is alive: SUSPECT no more, and the ops that waited for the
 * verdict end with a local error. */
static void probe_answered(cx_engine_t *e, cx_peer_t *p, const char *how)
{
    p->probing = 0;
    cx_info("peer %s: probe answered (%s): the peer is alive", p->url, how);
    if (p->state == CX_PEER_SUSPECT) {
        p->state = CX_PEER_UP;
        p->suspect_reported = 0;
        cx_event_emit(e, p, CX_EVENT_UP, "recovered (probe answered)");
    }
    cx_ops_verdict_alive(e, p);
}

void cx_peer_probe(cx_engine_t *e, cx_peer_t *p, const char *reason)
{
    if (p->state != CX_PEER_UP && p->state != CX_PEER_SUSPECT) return;
    cx_warn("peer %s: %s: suspect, probing it over the control connection", p->url, reason);
    if (p->state == CX_PEER_UP) {
        p->state = CX_PEER_SUSPECT;
        cx_event_emit(e, p, CX_EVENT_SUSPECT, reason);
    }
    int first = !p->probing;
    if (first) {
        p->probing = 1;
        p->probe_id++;
        p->probe_sent_ns = cx_now_ns();
    }
    /* The connection the error came from is closed; the next op opens a new one. Its ops end
     * with what the backend says (CX_EPEER: they wait for the verdict, cx_core_xfer_done). */
    if (p->ep) {
        cx_bep_t *ep = p->ep;
        p->ep = NULL;
        e->be[p->bidx].ops->disconnect(e->be[p->bidx].b, ep, CX_EPEER);
    }
    if (first && p->conn) send_probe(e, p->conn, CX_HB_PROBE, p->probe_id);
}

static void close_conns(cx_engine_t *e, cx_peer_t *p)
{
    if (p->conn) cx_conn_close(e, p->conn);
    if (p->pending) cx_conn_close(e, p->pending);
}

void cx_peer_fail(cx_engine_t *e, cx_peer_t *p, const char *reason)
{
    int was_up = p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT;
    p->probing = 0;
    /* A pending outgoing connection survives: it is how the peer gets back. */
    if (p->conn) cx_conn_close(e, p->conn);
    cx_peer_drop_ep(e, p, CX_EPEER);
    cx_peer_ops_fail(e, p, CX_EPEER);
    rregions_free(p);
    if (was_up) {
        p->state = CX_PEER_FAILED;
        cx_event_emit(e, p, CX_EVENT_FAILED, reason);
    } else if (p->state == CX_PEER_CONNECTING && !p->ever_up) {
        p->state = CX_PEER_UNKNOWN;
    } else if (p->state == CX_PEER_CONNECTING) {
        p->state = CX_PEER_FAILED;
    }
    if (p->ever_up && p->state == CX_PEER_FAILED) {
        /* Keep knocking: a process restarted on the same port rejoins even if it does not know
         * us. Start fast (a restart takes milliseconds), back off to one attempt a second. */
        p->reconnect = 1;
        p->backoff_ms = CX_RECONNECT_FIRST_MS;
        p->next_reconnect_ns = cx_now_ns() + cx_ms_to_ns(CX_RECONNECT_FIRST_MS);
    }
}

static void peer_left(cx_engine_t *e, cx_peer_t *p)
{
    p->probing = 0;
    close_conns(e, p);
    cx_peer_drop_ep(e, p, CX_EPEER);
    cx_peer_ops_fail(e, p, CX_EPEER);
    rregions_free(p);
    p->state = CX_PEER_LEFT;
    p->reconnect = 0;
    cx_event_emit(e, p, CX_EVENT_LEFT, "clean close (BYE)");
}

/* The first backend, in the order select/ gives this pair (the same on both ends), that
 * connects. */
static int choose_backend(cx_engine_t *e, cx_peer_t *p)
{
    int order[CX_MAX_BACKENDS];
    char why[160];
    int n = cx_select_pair_order((const char (*)[CX_CHOICE_MAX])e->bchoice, e->nb,
                                 (const char (*)[CX_CHOICE_MAX])p->their_choice, p->n_their, p->same_host,
                                 order, why, sizeof why);
    for (int k = 0; k < n; k++) {
        int i = order[k];
        if (!p->adv[i]) continue;
        int rc = e->be[i].ops->connect(e->be[i].b, p, p->adv[i], p->adv_len[i], &p->ep);
        if (rc == CX_OK) {
            p->bidx = i;
            snprintf(p->why, sizeof p->why, "%s", why);
            char tr[64];
            cx_peer_transport(e, p, tr, sizeof tr);
            cx_info("peer %s: data over %s%s%s%s (selection: %s)", p->url, e->bnames[i], tr[0] ? " (" : "", tr,
                    tr[0] ? ")" : "", why);
            return CX_OK;
        }
        cx_warn("peer %s: backend %s does not connect (%s), trying the next", p->url, e->bnames[i], cx_strerror(rc));
    }
    p->ep = NULL;
    cx_error("peer %s: no backend in common that connects (ours: %s)", p->url, e->backends_str);
    return CX_EUNSUPPORTED;
}

/* What the pair's data endpoint really runs over, as its backend reports it ("" when unknown). */
void cx_peer_transport(cx_engine_t *e, const cx_peer_t *p, char *buf, size_t n)
{
    buf[0] = 0;
    if (!p->ep || p->bidx < 0 || !e->be[p->bidx].ops->ep_transport) return;
    e->be[p->bidx].ops->ep_transport(e->be[p->bidx].b, p->ep, buf, n);
}

/* (Re)creates the data endpoint after a timeout closed it. */
int cx_peer_ensure_ep(cx_engine_t *e, cx_peer_t *p);
int cx_peer_ensure_ep(cx_engine_t *e, cx_peer_t *p)
{
    if (p->ep) return CX_OK;
    if (p->bidx >= 0 && p->adv[p->bidx] &&
        e->be[p->bidx].ops->connect(e->be[p->bidx].b, p, p->adv[p->bidx], p->adv_len[p->bidx], &p->ep) == CX_OK)
        return CX_OK;
    return choose_backend(e, p);
}

static void peer_up(cx_engine_t *e, cx_peer_t *p, cx_wire_hello_t *h)
{
    int new_inc = p->incarnation && p->incarnation != h->incarnation;
    int was_up = p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT;
    cx_event_type_t ev = CX_EVENT_UP;
    const char *why = "connected";
    if (new_inc && was_up) {
        /* It restarted before we saw it die: everything for the old incarnation fails first. */
        cx_peer_drop_ep(e, p, CX_EPEER);
        cx_peer_ops_fail(e, p, CX_EPEER);
        cx_event_emit(e, p, CX_EVENT_FAILED, "restarted (new incarnation)");
    }
    if (!p->ever_up) ev = CX_EVENT_UP;
    else if (new_inc) { ev = CX_EVENT_JOINED; why = "new incarnation"; }
    else if (!was_up) { ev = CX_EVENT_JOINED; why = "reconnected"; }
    else if (p->state == CX_PEER_SUSPECT) { ev = CX_EVENT_UP; why = "recovered"; }
    else ev = (cx_event_type_t)-1;

    if (new_inc || !was_up) {
        cx_peer_drop_ep(e, p, CX_EPEER);
        rregions_free(p);
        adv_free(p);
    }
    set_incarnation(e, p, h->incarnation);
    cx_url_t u;
    if (cx_url_parse(h->url, &u, NULL, 0) == CX_OK) set_url(p, &u);
    p->n_their = h->nb;
    for (int j = 0; j < h->nb; j++) snprintf(p->their_choice[j], sizeof p->their_choice[j], "%s", h->b[j].choice);
    p->same_host = h->host_id[0] && !strcmp(h->host_id, e->host_id);
    if (p->same_host) cx_live_watch(e, p, h->live_pid, h->live_fd, h->incarnation);
    for (int j = 0; j < h->nb; j++)
        for (int i = 0; i < e->nb; i++) {
            if (strcmp(h->b[j].name, e->bnames[i]) || p->adv[i]) continue;
            p->adv[i] = malloc(h->b[j].addr_len ? h->b[j].addr_len : 1);
            if (!p->adv[i]) continue;
            memcpy(p->adv[i], h->b[j].addr, h->b[j].addr_len);
            p->adv_len[i] = h->b[j].addr_len;
        }
    for (uint32_t k = 0; k < h->nregions; k++) {
        cx_wire_region_t wr;
        if (cx_wire_get_region(&h->regions, &wr)) {
            cx_warn("peer %s: malformed region #%u in HELLO; ignored from there on", p->url, k);
            break;
        }
        rregion_add(e, p, &wr);
    }
    p->ever_up = 1;
    p->state = CX_PEER_UP;
    p->bye = 0;
    p->reconnect = 0;
    p->suspect_reported = 0;
    p->last_rx_ns = cx_now_ns();
    if (p->probing) {
        p->probing = 0;
        cx_ops_verdict_alive(e, p);
    }
    if (!p->ep) choose_backend(e, p);
    if ((int)ev >= 0) {
        char reason[128], tr[64];
        cx_peer_transport(e, p, tr, sizeof tr);
        snprintf(reason, sizeof reason, "%s, data over %s%s%s%s", why,
                 p->ep ? e->bnames[p->bidx] : "nothing (no common backend)", tr[0] ? " (" : "", tr, tr[0] ? ")" : "");
        cx_event_emit(e, p, ev, reason);
    }
    cx_peer_ops_ready(e, p);
}

/* ---------------------------------------------------------------- connections */

void cx_peer_dial(cx_engine_t *e, cx_peer_t *p)
{
    if (p->pending || p->conn) return;
    int inprog;
    int fd = cx_sock_connect(&p->u, &inprog);
    if (fd < 0) {
        char why[CX_URL_MAX + 96];
        snprintf(why, sizeof why, "connect to %s: %s", p->url, strerror(errno));
        cx_debug("%s", why);
        if (!p->ever_up || p->state == CX_PEER_CONNECTING) cx_peer_ops_fail(e, p, CX_EPEER);
        if (p->state == CX_PEER_CONNECTING) p->state = p->ever_up ? CX_PEER_LEFT : CX_PEER_UNKNOWN;
        return;
    }
    cx_conn_t *c = cx_conn_new(e, fd, 1, !inprog);
    if (!c) return;
    c->peer = p;
    p->pending = c;
    /* With a token, HELLO (our regions and keys) waits until the acceptor proved it (auth.h). */
    if (e->auth) cx_auth_dial_start(e, c);
    else send_hello(e, c, CX_CTL_HELLO, &p->lid);
}

/* The pending outgoing connection failed before the handshake finished. */
static void dial_failed(cx_engine_t *e, cx_peer_t *p, const char *reason, int fail_status)
{
    cx_debug("peer %s: %s", p->url, reason);
    if (p->conn) return;   /* an inbound connection took over: nothing lost */
    if (p->state == CX_PEER_CONNECTING || p->state == CX_PEER_UNKNOWN) {
        /* Nobody listening: the ops fail now. A connection closed during the handshake (say, a
         * simultaneous connect resolved the other way) is retried by the tick instead. */
        if (fail_status) {
            cx_peer_ops_fail(e, p, fail_status);
            p->state = p->ever_up ? CX_PEER_LEFT : CX_PEER_UNKNOWN;
        }
    }
    if (p->reconnect) {
        p->backoff_ms = next_backoff_ms(p->backoff_ms);
        p->next_reconnect_ns = cx_now_ns() + cx_ms_to_ns(p->backoff_ms);
    }
}

void cx_conn_lost(cx_engine_t *e, cx_conn_t *c, const char *reason)
{
    cx_peer_t *p = c->peer;
    if (p && p->conn == c) {
        cx_peer_fail(e, p, reason);   /* closes c */
        return;
    }
    int refused = c->outgoing && !c->tcp_up;
    cx_conn_close(e, c);
    if (p && !p->conn) dial_failed(e, p, reason, refused ? CX_EPEER : 0);
}

void cx_conn_writable(cx_engine_t *e, cx_conn_t *c)
{
    if (!c->tcp_up) {
        int err = 0;
        socklen_t sl = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &sl);
        if (err) {
            char why[160];
            snprintf(why, sizeof why, "connect: %s", strerror(err));
            cx_conn_lost(e, c, why);
            return;
        }
        c->tcp_up = 1;
    }
    if (cx_conn_flush(e, c)) cx_conn_lost(e, c, "send failed");
}

void cx_accept_all(cx_engine_t *e)
{
    for (int i = 0; i < CX_ACCEPT_BUDGET; i++) {
        int fd = accept4(e->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                cx_warn("accept: %s", strerror(errno));
            return;
        }
        cx_conn_new(e, fd, 0, 1);
    }
}

/* Says why, then closes once the words are out (the peer reads REFUSE before the EOF). */
static void refuse(cx_engine_t *e, cx_conn_t *c, int status, const char *why)
{
    uint8_t body[300];
    cx_wr_t w;
    cx_wr_init(&w, body, sizeof body);
    cx_wr_u32(&w, (uint32_t)status);
    cx_wr_str8(&w, why);
    cx_conn_send(e, c, CX_CTL_REFUSE, body, w.len);
    cx_conn_flush(e, c);
    shutdown(c->fd, SHUT_WR);
    cx_conn_close(e, c);
}

/* An authentication failure: counted, logged, and the handshake ends with CX_EAUTH on both
 * sides (the acceptor says so in a REFUSE). Returns 1: c is closed. */
static int auth_failed(cx_engine_t *e, cx_conn_t *c, const char *why)
{
    e->st.auth_refused++;
    if (!c->outgoing) {
        char who[80];
        cx_auth_peer_name(c->fd, who, sizeof who);
        cx_warn("control: refusing %s: authentication failed: %s", who, why);
        refuse(e, c, CX_EAUTH, why);
        return 1;
    }
    cx_peer_t *p = c->peer;
    cx_error("peer %s: authentication failed: %s", p->url, why);
    cx_conn_close(e, c);
    dial_failed(e, p, why, CX_EAUTH);
    return 1;
}

/* An inbound HELLO: accept it (and answer HELLO_ACK) or refuse it. Returns 1 if c was closed. */
static int on_hello(cx_engine_t *e, cx_conn_t *c, const uint8_t *body, size_t len)
{
    cx_wire_hello_t h;
    char err[200];
    /* Not even parsed: nothing a stranger sends reaches the peer table or the region cache. */
    if (e->auth && !c->au.ok) return auth_failed(e, c, "HELLO without authentication (token required)");
    if (cx_wire_get_hello(body, len, &h, err, sizeof err)) {
        cx_warn("control: refusing a connection: %s", err);
        cx_conn_close(e, c);
        return 1;
    }
    if (cx_lid_cmp(&h.target, &e->lid)) {
        /* The dialler named another identity at our address: tell it, and touch nothing here
         * (we may well have a live connection with that same dialler). */
        char want[96];
        cx_lid_format(&h.target, want, sizeof want);
        cx_info("control: %s dialled %s at our address, but we are %s: refused", h.url, want, e->url);
        refuse(e, c, CX_EINVAL, "identity mismatch");
        return 1;
    }
    if (!cx_lid_cmp(&h.lid, &e->lid)) {
        cx_warn("control: refusing a HELLO that carries our own LID %s (%s)",
                h.incarnation == e->incarnation ? "(we dialled ourselves)" : "(identity conflict)", h.url);
        refuse(e, c, CX_EINVAL, "the dialler carries the LID of the process it dialled");
        return 1;
    }
    cx_url_t u;
    cx_url_parse(h.url, &u, NULL, 0);
    cx_peer_t *known = cx_peer_find(e, &u.lid);
    int moved = known && (strcmp(known->u.host, u.host) || known->u.port != u.port);
    cx_peer_t *p = cx_peer_get_url(e, &u);
    if (!p) { cx_conn_close(e, c); return 1; }
    /* The process behind our connection restarted: the old incarnation failed. */
    if (p->conn && p->incarnation != h.incarnation) cx_peer_fail(e, p, "restarted (new incarnation)");
    if (moved) {
        /* A known LID dialled us from a new address (restarted elsewhere): follow it. */
        char why[CX_URL_MAX + 48];
        snprintf(why, sizeof why, "dialled us from a new address (was %s)", p->url);
        set_url(p, &u);
        if (p->pending) cx_conn_close(e, p->pending);   /* a dial to the old address */
        cx_event_emit(e, p, CX_EVENT_MOVED, why);
        cx_dir_seen_at(e, &u.lid, p->url);
    }
    /* Simultaneous connects: both sides keep the connection that the smaller LID initiated, so
     * the one both keep is the same and no live connection is torn down by accident. */
    int ours = p->pending || (p->conn && p->conn->outgoing);
    if (ours && cx_lid_cmp(&e->lid, &h.lid) < 0) {
        cx_debug("peer %s: simultaneous connect, keeping the one we initiated", p->url);
        cx_conn_close(e, c);
        return 1;
    }
    if (p->pending) cx_conn_close(e, p->pending);
    if (p->conn) cx_conn_close(e, p->conn);
    c->peer = p;
    c->bound = 1;
    p->conn = c;
    send_hello(e, c, CX_CTL_HELLO_ACK, &h.lid);
    peer_up(e, p, &h);
    return 0;
}

static int on_hello_ack(cx_engine_t *e, cx_conn_t *c, const uint8_t *body, size_t len)
{
    cx_peer_t *p = c->peer;
    cx_wire_hello_t h;
    char err[200];
    if (e->auth && !c->au.ok) return auth_failed(e, c, "HELLO_ACK from an acceptor that did not authenticate");
    if (cx_wire_get_hello(body, len, &h, err, sizeof err)) {
        cx_warn("peer %s: bad HELLO_ACK: %s", p->url, err);
        cx_conn_close(e, c);
        dial_failed(e, p, err, CX_EPEER);
        return 1;
    }
    if (cx_lid_cmp(&h.lid, &p->lid)) {
        cx_error("dialled %s but the process there is %s: identity mismatch", p->url, h.url);
        cx_conn_close(e, c);
        /* Not the peer the caller named: an error in the name, not a failure to retry. */
        dial_failed(e, p, "identity mismatch", CX_EINVAL);
        return 1;
    }
    p->pending = NULL;
    if (p->conn) cx_conn_close(e, p->conn);
    c->bound = 1;
    p->conn = c;
    peer_up(e, p, &h);
    return 0;
}

static void on_reg_query(cx_engine_t *e, cx_peer_t *p, cx_rd_t *r)
{
    uint64_t qid = cx_rd_u64(r), addr = cx_rd_u64(r), len = cx_rd_u64(r);
    if (!cx_rd_done(r)) { cx_warn("peer %s: malformed REG_QUERY", p->url); return; }
    size_t cap = 64 + (size_t)e->nb * (CX_KEY_MAX + 24);
    uint8_t *buf = malloc(cap);
    if (!buf) return;
    cx_wr_t w;
    cx_wr_init(&w, buf, cap);
    cx_wr_u64(&w, qid);
    pthread_rwlock_rdlock(&e->reg.lock);
    cx_region_t *reg = cx_registry_find_locked(&e->reg, addr, len);
    cx_wr_u8(&w, reg != NULL);
    if (reg) cx_wire_put_region(&w, reg, e->bnames, e->nb);
    pthread_rwlock_unlock(&e->reg.lock);
    if (!reg) {
        cx_info("peer %s asked for [0x%llx, +%llu): not inside any region registered here", p->url,
                (unsigned long long)addr, (unsigned long long)len);
        e->st.rejected_requests++;
    }
    cx_conn_send(e, p->conn, CX_CTL_REG_REPLY, buf, w.len);
    free(buf);
}

void cx_peer_heard(cx_engine_t *e, cx_peer_t *p)
{
    p->last_rx_ns = cx_now_ns();
    /* While probed it stays SUSPECT until its answer (a frame sent before could be in flight). */
    if (p->state == CX_PEER_SUSPECT && !p->probing) {
        p->state = CX_PEER_UP;
        p->suspect_reported = 0;
        cx_event_emit(e, p, CX_EVENT_UP, "recovered");
    }
}

/* Handles one frame; returns 1 if the connection was closed. */
static int on_frame(cx_engine_t *e, cx_conn_t *c, uint8_t type, const uint8_t *body, size_t len)
{
    if (!c->bound) {
        if (!c->outgoing && type == CX_CTL_HELLO) return on_hello(e, c, body, len);
        if (c->outgoing && type == CX_CTL_HELLO_ACK) return on_hello_ack(e, c, body, len);
        if (type == CX_CTL_AUTH) {
            char why[160];
            int rc = cx_auth_on_frame(e, c, body, len, why, sizeof why);
            if (rc == CX_AUTH_SEND_HELLO) send_hello(e, c, CX_CTL_HELLO, &c->peer->lid);
            return rc < 0 ? auth_failed(e, c, why) : 0;
        }
        if (c->outgoing && type == CX_CTL_REFUSE) {
            cx_rd_t r;
            cx_rd_init(&r, body, len);
            int st = (int)cx_rd_u32(&r);
            char why[256];
            cx_rd_str8(&r, why, sizeof why);
            if (!r.ok || st >= 0 || st < -64) { st = CX_EPEER; snprintf(why, sizeof why, "refused"); }
            if (st == CX_EAUTH) e->st.auth_refused++;
            cx_peer_t *p = c->peer;
            cx_error("peer %s refused the connection: %s", p->url, why);
            cx_conn_close(e, c);
            dial_failed(e, p, why, st);
            return 1;
        }
        cx_warn("control: frame type %u before the handshake: closing the connection", type);
        cx_conn_lost(e, c, "protocol error");
        return 1;
    }
    cx_peer_t *p = c->peer;
    cx_peer_heard(e, p);
    cx_rd_t r;
    cx_rd_init(&r, body, len);
    switch (type) {
    case CX_CTL_HB: {
        if (!len) return 0;
        uint8_t kind = cx_rd_u8(&r);
        uint64_t id = cx_rd_u64(&r);
        if (!r.ok) return 0;
        if (kind == CX_HB_PROBE && p->conn) send_probe(e, p->conn, CX_HB_ANSWER, id);
        else if (kind == CX_HB_ANSWER && p->probing && id == p->probe_id) probe_answered(e, p, "answer");
        return 0;
    }
    case CX_CTL_BYE: peer_left(e, p); return 1;
    case CX_CTL_REG_ADD: {
        cx_wire_region_t wr;
        if (cx_wire_get_region(&r, &wr) == CX_OK) rregion_add(e, p, &wr);
        else cx_warn("peer %s: malformed REG_ADD ignored", p->url);
        return 0;
    }
    case CX_CTL_REG_DEL: {
        uint64_t id = cx_rd_u64(&r);
        if (!cx_rd_done(&r)) {
            cx_warn("peer %s: malformed REG_DEL ignored", p->url);
            return 0;
        }
        /* Ops started from now on find the region gone; once none of ours is in it, say so,
         * and its owner's unregister returns (cx_peer_region_gone). */
        (void)c;
        rregion_del(e, p, id);
        on_reg_del(e, p, id);
        return 0;
    }
    case CX_CTL_REG_DEL_ACK: {
        uint64_t id = cx_rd_u64(&r);
        if (cx_rd_done(&r)) on_reg_del_ack(p, id);
        else cx_warn("peer %s: malformed REG_DEL_ACK ignored", p->url);
        return 0;
    }
    case CX_CTL_REG_QUERY: on_reg_query(e, p, &r); return 0;
    case CX_CTL_RMA_REQ: cx_rstage_on_req(e, p, body, len); return 0;
    case CX_CTL_RMA_RESP: cx_rstage_on_resp(e, p, body, len); return 0;
    case CX_CTL_DEATH: {
        /* One hop, no forwarding: only a watcher reports what it saw itself. A report about
         * another incarnation (already restarted) or a peer not up is stale and dropped. */
        cx_lid_t lid;
        uint64_t inc;
        if (cx_wire_get_death(body, len, &lid, &inc)) {
            cx_warn("peer %s: malformed DEATH ignored", p->url);
            return 0;
        }
        cx_peer_t *q = cx_peer_find(e, &lid);
        if (q && q != p && q->incarnation == inc && (q->state == CX_PEER_UP || q->state == CX_PEER_SUSPECT)) {
            char why[160];
            snprintf(why, sizeof why, "process exited (seen by %s on its host)", p->lid_str);
            cx_peer_fail(e, q, why);
        }
        return 0;
    }
    case CX_CTL_REG_REPLY: {
        uint64_t qid = cx_rd_u64(&r);
        int found = cx_rd_u8(&r);
        cx_wire_region_t wr;
        if (!r.ok || (found && cx_wire_get_region(&r, &wr))) {
            cx_warn("peer %s: malformed REG_REPLY ignored", p->url);
            return 0;
        }
        if (found) rregion_add(e, p, &wr);
        cx_region_reply(e, p, qid, found);
        return 0;
    }
    default:
        cx_warn("peer %s: unexpected control frame %u after the handshake: closing", p->url, type);
        cx_conn_lost(e, c, "protocol error");
        return 1;
    }
}

/* Replies queued to a peer that does not read them: past this, we stop reading that peer until
 * they drain, so its requests wait in TCP (its sends block) instead of in our memory. */
#define CX_CONN_TX_BACKLOG (4u << 20)

void cx_conn_readable(cx_engine_t *e, cx_conn_t *c)
{
    for (int round = 0; round < CX_CONN_READ_ROUNDS; round++) {
        if (c->tx_len - c->tx_off > CX_CONN_TX_BACKLOG && c->want_out) {
            /* EPOLLIN comes back when cx_conn_flush empties the backlog. */
            cx_watch_mod(e, c->fd, EPOLLRDHUP | EPOLLOUT, &c->w);
            return;
        }
        if (c->rx_cap - c->rx_len < 65536) {
            size_t nc = c->rx_cap ? c->rx_cap * 2 : 65536;
            while (nc - c->rx_len < 65536) nc *= 2;
            uint8_t *nb = realloc(c->rx, nc);
            if (!nb) { cx_conn_lost(e, c, "out of memory"); return; }
            c->rx = nb;
            c->rx_cap = nc;
        }
        ssize_t n = recv(c->fd, c->rx + c->rx_len, c->rx_cap - c->rx_len, 0);
        if (n == 0) { cx_conn_lost(e, c, "connection closed by peer"); return; }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            char why[128];
            snprintf(why, sizeof why, "control connection: %s", strerror(errno));
            cx_conn_lost(e, c, why);
            return;
        }
        c->rx_len += (size_t)n;
        size_t off = 0;
        while (c->rx_len - off >= CX_CTL_HDR) {
            uint32_t blen;
            uint8_t type;
            if (cx_ctl_hdr_parse(c->rx + off, &blen, &type)) {
                cx_warn("control: garbage on a connection%s%s: closing it", c->peer ? " from " : "",
                        c->peer ? c->peer->url : "");
                e->st.rejected_requests++;
                cx_conn_lost(e, c, "garbage on the control connection");
                return;
            }
            /* Before the token is proven only small frames (AUTH, REFUSE) are buffered. */
            if (e->auth && !c->bound && !c->au.ok && blen > CX_AUTH_PRE_MAX) {
                auth_failed(e, c, type == CX_CTL_HELLO ? "HELLO without authentication (token required)"
                                                       : "oversized frame before authentication");
                return;
            }
            if (c->rx_len - off - CX_CTL_HDR < blen) break;
            if (on_frame(e, c, type, c->rx + off + CX_CTL_HDR, blen)) return;
            off += CX_CTL_HDR + blen;
        }
        memmove(c->rx, c->rx + off, c->rx_len - off);
        c->rx_len -= off;
        if (c->rx_cap > (1u << 20) && c->rx_len < 65536) {
            uint8_t *nb = realloc(c->rx, 131072);
            if (nb) { c->rx = nb; c->rx_cap = 131072; }
        }
    }
}

/* ---------------------------------------------------------------- timers */

void cx_peers_tick(cx_engine_t *e, uint64_t now)
{
    uint64_t hb = cx_ms_to_ns(e->cfg.heartbeat_ms);
    uint64_t hbt = cx_ms_to_ns(e->cfg.heartbeat_timeout_ms);
    /* SUSPECT one heartbeat interval before FAILED, but not before half the timeout. */
    uint64_t suspect = hbt - hb > hbt / 2 ? hbt - hb : hbt / 2;
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        if (p->conn && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT)) {
            uint64_t quiet = now - p->last_rx_ns;
            if (p->probing && now - p->probe_sent_ns >= hbt) {
                /* No answer: a peer that predates probes is alive if it was heard since. */
                if (p->last_rx_ns > p->probe_sent_ns) {
                    probe_answered(e, p, "heard from it, no answer");
                } else {
                    cx_peer_fail(e, p, "probe unanswered for the heartbeat timeout");
                    continue;
                }
            }
            if (quiet >= hbt) {
                char why[96];
                snprintf(why, sizeof why, "no heartbeat for %llu ms", (unsigned long long)cx_ns_to_ms(quiet));
                cx_peer_fail(e, p, why);
                continue;
            }
            if (quiet >= suspect && p->state == CX_PEER_UP) {
                char why[96];
                snprintf(why, sizeof why, "no heartbeat for %llu ms", (unsigned long long)cx_ns_to_ms(quiet));
                p->state = CX_PEER_SUSPECT;
                cx_event_emit(e, p, CX_EVENT_SUSPECT, why);
            }
            if (now - p->last_tx_ns >= hb) cx_conn_send(e, p->conn, CX_CTL_HB, NULL, 0);
        }
        if (p->pending && now - p->pending->t_start_ns >= hbt) {
            cx_conn_close(e, p->pending);
            dial_failed(e, p, "handshake not answered", 0);
        }
        if (!p->conn && !p->pending) {
            if (p->state == CX_PEER_FAILED && p->reconnect && now >= p->next_reconnect_ns) {
                p->backoff_ms = next_backoff_ms(p->backoff_ms);
                p->next_reconnect_ns = now + cx_ms_to_ns(p->backoff_ms);
                cx_peer_dial(e, p);
            } else if (p->state == CX_PEER_CONNECTING) {
                cx_peer_dial(e, p);   /* a handshake that was cut: try again */
            }
        }
    }
    /* Inbound connections that never said HELLO (scanners, garbage) do not stay forever. */
    for (cx_conn_t *c = e->conns, *n; c; c = n) {
        n = c->next;
        if (!c->bound && !c->outgoing && now - c->t_start_ns >= hbt) {
            cx_info("control: closing a connection that sent no HELLO in %u ms", e->cfg.heartbeat_timeout_ms);
            cx_conn_close(e, c);
        }
    }
}
