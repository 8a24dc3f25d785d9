/* The peer table: every peer this engine knows, indexed by LID (every op resolves its peer) and
 * by incarnation (every request a backend receives names its sender's). */
#include "peer_int.h"

#include "connex/log.h"

#include <stdlib.h>
#include <string.h>

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
void cx_peer_set_incarnation(cx_engine_t *e, cx_peer_t *p, uint64_t inc)
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

void cx_peer_set_url(cx_peer_t *p, const cx_url_t *u)
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
        cx_peer_set_url(p, u);
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
    cx_peer_set_url(p, u);
    p->state = CX_PEER_UNKNOWN;
    p->bidx = -1;
    cx_proc_init(&p->proc);
    p->ops.next = p->ops.prev = &p->ops;
    p->next = e->peers;
    e->peers = p;
    unsigned b = lid_bucket(&p->lid);
    p->lid_hnext = e->peer_by_lid[b];
    e->peer_by_lid[b] = p;
    return p;
}

void cx_peer_adv_free(cx_peer_t *p)
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
            op->sc.credit = 0;
        }
        cx_rregions_free(p);
        cx_peer_adv_free(p);
        cx_proc_forget(&p->proc);
        free(p);
    }
    memset(e->peer_by_lid, 0, sizeof e->peer_by_lid);
    memset(e->peer_by_inc, 0, sizeof e->peer_by_inc);
    e->active_peers = e->sched_dirty_head = NULL;
}
