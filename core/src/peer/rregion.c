/* A peer's regions as its HELLO and REG_* frames describe them (a sorted index for the lookup of
 * every op), and the two-way unregister: our REG_DEL waits for each peer's REG_DEL_ACK, and a
 * peer's REG_DEL is acked only once no op of ours moves bytes in that region. */
#include "peer_int.h"

#include "connex/log.h"

#include <stdlib.h>
#include <string.h>

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
        if (p->state != CX_PEER_UP && p->state != CX_PEER_SUSPECT) continue; /* HELLO will tell it */
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

static void rregion_free(cx_rregion_t *r)
{
    if (!r) return;
    for (int i = 0; i < CX_MAX_BACKENDS; i++) free(r->key[i]);
    free(r);
}

/* No op of ours is in the region any more: its backend may drop what it derived from the keys,
 * and the keys go. */
static void rregion_retire(cx_engine_t *e, cx_peer_t *p, cx_rregion_t *r)
{
    if (!r) return;
    if (p->ep && p->bidx >= 0 && e->be[p->bidx].ops->forget_region)
        e->be[p->bidx].ops->forget_region(e->be[p->bidx].b, p->ep, r->id);
    rregion_free(r);
}

void cx_peer_delack_check(cx_engine_t *e, cx_peer_t *p)
{
    for (size_t i = 0; i < p->n_gone;) {
        cx_rgone_t g = p->gone[i];
        if (region_busy(p, g.id)) {
            i++;
            continue;
        }
        p->gone[i] = p->gone[--p->n_gone];
        rregion_retire(e, p, g.rr);
        if (g.ack) delack_send(e, p, g.id);
    }
}

/* A region out of p's table: retired now, or once no op of ours is in it (ack: then say so). */
static void rregion_gone(cx_engine_t *e, cx_peer_t *p, uint64_t id, cx_rregion_t *r, int ack)
{
    if (region_busy(p, id)) {
        if (p->n_gone == p->cap_gone) {
            size_t cap = p->cap_gone ? 2 * p->cap_gone : 4;
            cx_rgone_t *v = realloc(p->gone, cap * sizeof *v);
            if (v) {
                p->gone = v;
                p->cap_gone = cap;
            }
        }
        if (p->n_gone < p->cap_gone) {
            cx_debug("peer %s: region %llu left its table while ops of ours are in it: %s when they end", p->url,
                     (unsigned long long)id, ack ? "acked and forgotten" : "forgotten");
            p->gone[p->n_gone++] = (cx_rgone_t){ .id = id, .rr = r, .ack = ack };
            return;
        }
        /* Its keys stay for the ops still in it (a leak, in a process out of memory). */
        cx_warn("peer %s: out of memory: region %llu %s while ops of ours are in it", p->url, (unsigned long long)id,
                ack ? "acked" : "replaced");
    } else {
        rregion_retire(e, p, r);
    }
    if (ack) delack_send(e, p, id);
}

void cx_rregions_free(cx_peer_t *p)
{
    owed_release(p);
    /* Its view of our ops is gone with the connection, and the backend's endpoint with the ops
     * in it went first (cx_peer_drop_ep): the keys are nobody's now. */
    for (size_t i = 0; i < p->n_gone; i++) rregion_free(p->gone[i].rr);
    free(p->gone);
    p->gone = NULL;
    p->n_gone = p->cap_gone = 0;
    free(p->rr_by_addr);
    p->rr_by_addr = NULL;
    p->rr_n = p->rr_cap = 0;
    while (p->rregions) {
        cx_rregion_t *r = p->rregions;
        p->rregions = r->next;
        rregion_free(r);
    }
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
        if (p->rr_by_addr[mid]->addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
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
        if (!v) return; /* found through the list */
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

/* Takes region id out of p's table (lookups and index); NULL when it was not there. */
static cx_rregion_t *rregion_unlink(cx_peer_t *p, uint64_t id)
{
    for (cx_rregion_t **pp = &p->rregions; *pp; pp = &(*pp)->next) {
        cx_rregion_t *r = *pp;
        if (r->id != id) continue;
        *pp = r->next;
        rr_index_del(p, r);
        r->next = NULL;
        return r;
    }
    return NULL;
}

static cx_rregion_t *rregion_by_id(cx_peer_t *p, uint64_t id)
{
    for (cx_rregion_t *r = p->rregions; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

/* The wire's description of a region we hold: the same registration, said again (a HELLO after
 * a recovery, a REG_REPLY racing a REG_ADD)? */
static int rregion_same(const cx_engine_t *e, const cx_rregion_t *r, const cx_wire_region_t *w)
{
    if (r->addr != w->addr || r->len != w->len || r->mem_kind != w->mem_kind) return 0;
    for (int i = 0; i < e->nb; i++) {
        int k = -1;
        for (int j = 0; j < w->nkeys && k < 0; j++)
            if (!strcmp(w->keys[j].name, e->bnames[i])) k = j;
        if ((k < 0) != !r->key[i]) return 0;
        if (k >= 0 && (w->keys[k].len != r->key_len[i] || memcmp(w->keys[k].key, r->key[i], w->keys[k].len))) return 0;
    }
    return 1;
}

int cx_rregion_add(cx_engine_t *e, cx_peer_t *p, const cx_wire_region_t *w)
{
    /* Said again, it stays as it is: ops in the backends point at its keys. Changed (a peer
     * that reuses an id), the old one goes once no op of ours is in it. */
    cx_rregion_t *old = rregion_by_id(p, w->id);
    if (old && rregion_same(e, old, w)) return CX_OK;
    if (old) rregion_gone(e, p, w->id, rregion_unlink(p, w->id), 0);
    cx_rregion_t *r = calloc(1, sizeof *r);
    if (!r) return CX_ENOMEM;
    r->id = w->id;
    r->addr = w->addr;
    r->len = w->len;
    r->mem_kind = w->mem_kind;
    for (int k = 0; k < w->nkeys; k++)
        for (int i = 0; i < e->nb; i++) {
            if (strcmp(w->keys[k].name, e->bnames[i])) continue;
            if (r->key[i]) { /* a second key for one backend: the first stands */
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

static void on_reg_query(cx_engine_t *e, cx_peer_t *p, cx_rd_t *r)
{
    uint64_t qid = cx_rd_u64(r), addr = cx_rd_u64(r), len = cx_rd_u64(r);
    if (!cx_rd_done(r)) {
        cx_warn("peer %s: malformed REG_QUERY", p->url);
        return;
    }
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

int cx_rregion_on_frame(cx_engine_t *e, cx_peer_t *p, uint8_t type, const uint8_t *body, size_t len)
{
    cx_rd_t r;
    cx_rd_init(&r, body, len);
    switch (type) {
    case CX_CTL_REG_ADD: {
        cx_wire_region_t wr;
        if (cx_wire_get_region(&r, &wr) == CX_OK)
            cx_rregion_add(e, p, &wr);
        else
            cx_warn("peer %s: malformed REG_ADD ignored", p->url);
        return 1;
    }
    case CX_CTL_REG_DEL: {
        uint64_t id = cx_rd_u64(&r);
        if (!cx_rd_done(&r)) {
            cx_warn("peer %s: malformed REG_DEL ignored", p->url);
            return 1;
        }
        /* Ops started from now on find the region gone; once none of ours is in it, say so,
         * and its owner's unregister returns (cx_peer_region_gone). */
        rregion_gone(e, p, id, rregion_unlink(p, id), 1);
        return 1;
    }
    case CX_CTL_REG_DEL_ACK: {
        uint64_t id = cx_rd_u64(&r);
        if (cx_rd_done(&r))
            on_reg_del_ack(p, id);
        else
            cx_warn("peer %s: malformed REG_DEL_ACK ignored", p->url);
        return 1;
    }
    case CX_CTL_REG_QUERY: on_reg_query(e, p, &r); return 1;
    case CX_CTL_REG_REPLY: {
        uint64_t qid = cx_rd_u64(&r);
        int found = cx_rd_u8(&r);
        cx_wire_region_t wr;
        if (!r.ok || (found && cx_wire_get_region(&r, &wr))) {
            cx_warn("peer %s: malformed REG_REPLY ignored", p->url);
            return 1;
        }
        if (found) cx_rregion_add(e, p, &wr);
        cx_region_reply(e, p, qid, found);
        return 1;
    }
    default: return 0;
    }
}
