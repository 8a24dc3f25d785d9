/* The identity directory, engine side: which implementation (cfg.directory, else env
 * CONNEX_DIRECTORY, else "static"), the shared table of entries, and what a change means for the
 * peers this engine knows (MOVED, LEFT, a dial to the new address). docs/mobility.md. */
#include "dir_impl.h"
#include "connex/options.h"

#include "../engine.h"
#include "connex/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the table (any thread) */

static cx_dir_row_t *row_find(cx_dir_t *d, const cx_lid_t *lid)
{
    for (size_t i = 0; i < d->n; i++)
        if (!cx_lid_cmp(&d->rows[i].ent.lid, lid)) return &d->rows[i];
    return NULL;
}

static int queue_push(cx_dir_t *d, const cx_dir_entry_t *ent, int kind)
{
    if (d->qn == d->qcap) {
        size_t nc = d->qcap ? d->qcap * 2 : 16;
        cx_dir_chg_t *nq = realloc(d->q, nc * sizeof *nq);
        if (!nq) return CX_ENOMEM;
        d->q = nq;
        d->qcap = nc;
    }
    d->q[d->qn].ent = *ent;
    d->q[d->qn].kind = kind;
    d->qn++;
    return CX_OK;
}

int cx_dir_table_apply(cx_dir_t *d, const cx_dir_entry_t *ent, int kind)
{
    int rc = 0;
    pthread_mutex_lock(&d->mu);
    cx_dir_row_t *r = row_find(d, &ent->lid);
    if (kind == CX_DIR_PUT) {
        /* Same or older version: a replay or a stale route, nothing new. */
        if (r && ent->version <= r->ent.version) goto out;
        if (!r) {
            if (d->n == d->cap) {
                size_t nc = d->cap ? d->cap * 2 : 16;
                cx_dir_row_t *nr = realloc(d->rows, nc * sizeof *nr);
                if (!nr) {
                    rc = CX_ENOMEM;
                    goto out;
                }
                d->rows = nr;
                d->cap = nc;
            }
            r = &d->rows[d->n++];
        }
        r->ent = *ent;
        r->deleted = 0;
    } else {
        if (!r || r->deleted || ent->version < r->ent.version) goto out;
        r->deleted = 1;
        r->ent.version = ent->version;
    }
    rc = queue_push(d, &r->ent, kind);
    if (rc == CX_OK) rc = 1;
out:
    pthread_mutex_unlock(&d->mu);
    return rc;
}

int cx_dir_table_snapshot(cx_dir_t *d, cx_dir_entry_t **out, size_t *n)
{
    pthread_mutex_lock(&d->mu);
    *n = 0;
    *out = malloc((d->n ? d->n : 1) * sizeof **out);
    if (!*out) {
        pthread_mutex_unlock(&d->mu);
        return CX_ENOMEM;
    }
    for (size_t i = 0; i < d->n; i++)
        if (!d->rows[i].deleted) (*out)[(*n)++] = d->rows[i].ent;
    pthread_mutex_unlock(&d->mu);
    return CX_OK;
}

/* ---------------------------------------------------------------- engine hooks */

static void dir_free(cx_dir_t *d)
{
    pthread_mutex_destroy(&d->mu);
    free(d->rows);
    free(d->q);
    free(d);
}

int cx_dir_start(cx_engine_t *e)
{
    const char *spec = e->cfg.directory;
    const char *from = "config.directory";
    if (!spec || !*spec) {
        spec = cx_opts_str(&e->opts, "CONNEX_DIRECTORY");
        from = "CONNEX_DIRECTORY";
    }
    if (!spec || !*spec) {
        spec = "static";
        from = "default";
    }
    const cx_dir_ops_t *ops;
    const char *arg = NULL;
    if (!strcmp(spec, "static"))
        ops = &cx_dir_static_ops;
    else if (!strncmp(spec, "etcd://", 7)) {
        ops = &cx_dir_etcd_ops;
        arg = spec + 7;
    } else {
        cx_error("directory: %s='%.100s' is neither \"static\" nor \"etcd://host:port\"", from, spec);
        return CX_EINVAL;
    }
    cx_dir_t *d = calloc(1, sizeof *d);
    if (!d) return CX_ENOMEM;
    pthread_mutex_init(&d->mu, NULL);
    d->ops = ops;
    d->lid = e->lid;
    snprintf(d->url, sizeof d->url, "%s", e->url);
    d->incarnation = e->incarnation;
    d->lease_ms = e->cfg.lease_ms;
    if (!d->lease_ms) {
        /* For processes whose config the launcher does not write (tests, scripts). */
        d->lease_ms = (uint32_t)cx_opts_num(&e->opts, "CONNEX_LEASE_MS", NULL);
    }
    if (!d->lease_ms) d->lease_ms = 3000;
    d->peers = e->cfg.peers;
    if (!d->peers) d->peers = cx_opts_str(&e->opts, "CONNEX_PEERS");
    int rc = ops->open(d, arg);
    if (rc) {
        dir_free(d);
        return rc;
    }
    e->dir = d;
    cx_info("directory: %s%s%s, this engine registered as %s", ops->name, arg ? " at " : "", arg ? arg : "", e->url);
    return CX_OK;
}

void cx_dir_stop(cx_engine_t *e)
{
    cx_dir_t *d = e->dir;
    if (!d) return;
    e->dir = NULL;
    d->ops->close(d);
    dir_free(d);
}

int cx_dir_lookup(cx_engine_t *e, const cx_lid_t *lid, cx_dir_entry_t *out)
{
    cx_dir_t *d = e->dir;
    if (!d) return CX_EINVAL;
    pthread_mutex_lock(&d->mu);
    cx_dir_row_t *r = row_find(d, lid);
    int rc = r && !r->deleted ? CX_OK : CX_EINVAL;
    if (rc == CX_OK && out) *out = r->ent;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

int cx_dir_each(cx_engine_t *e, const cx_lid_pat_t *pat, void (*fn)(void *ctx, const cx_dir_entry_t *ent), void *ctx)
{
    cx_dir_t *d = e->dir;
    if (!d) return 0;
    cx_dir_entry_t *v;
    size_t n;
    /* fn runs outside the lock: it may call back into the directory. */
    if (cx_dir_table_snapshot(d, &v, &n)) return 0;
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        if (pat && !cx_lid_pat_match(pat, &v[i].lid)) continue;
        m++;
        if (fn) fn(ctx, &v[i]);
    }
    free(v);
    return m;
}

void cx_dir_seen_at(cx_engine_t *e, const cx_lid_t *lid, const char *url)
{
    cx_dir_t *d = e->dir;
    if (!d || d->ops != &cx_dir_static_ops) return; /* etcd is the authority where it runs */
    pthread_mutex_lock(&d->mu);
    cx_dir_row_t *r = row_find(d, lid);
    cx_dir_entry_t ent = { .lid = *lid, .version = r ? r->ent.version + 1 : 1 };
    pthread_mutex_unlock(&d->mu);
    snprintf(ent.url, sizeof ent.url, "%s", url);
    /* The queued change finds the peer already at this URL: no second MOVED. */
    cx_dir_table_apply(d, &ent, CX_DIR_PUT);
}

/* ---------------------------------------------------------------- changes -> peers (progress thread) */

static void on_put(cx_engine_t *e, cx_peer_t *p, const cx_dir_entry_t *ent)
{
    cx_url_t u;
    char err[200];
    if (cx_url_parse(ent->url, &u, err, sizeof err) || cx_lid_cmp(&u.lid, &p->lid)) {
        cx_warn("directory: entry for %s has a bad URL '%.100s': ignored", p->lid_str, ent->url);
        return;
    }
    int live = p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT;
    int moved = strcmp(u.host, p->u.host) || u.port != p->u.port || u.is_ipv6 != p->u.is_ipv6;
    if (moved) {
        p->u = u;
        cx_url_format(&u, p->url, sizeof p->url);
        char why[CX_URL_MAX + 32];
        snprintf(why, sizeof why, "directory: now at %s", p->url);
        cx_event_emit(e, p, CX_EVENT_MOVED, why);
    }
    if (live) return; /* the transport still hears the old process: its failure redials */
    if (p->ever_up && (moved || p->state == CX_PEER_FAILED || p->state == CX_PEER_LEFT)) {
        /* Gone from the old address: knock at the new one now (and keep knocking, as after a
         * failure), so ops waiting on the peer run as soon as it answers. */
        if (moved && p->pending) cx_conn_close(e, p->pending);
        p->state = CX_PEER_FAILED;
        p->reconnect = 1;
        p->backoff_ms = 20;
        p->next_reconnect_ns = cx_now_ns() + 20000000ull;
        cx_peer_dial(e, p);
    } else if (moved && p->state == CX_PEER_CONNECTING) {
        if (p->pending) cx_conn_close(e, p->pending);
        cx_peer_dial(e, p);
    }
}

static void on_del(cx_engine_t *e, cx_peer_t *p)
{
    if (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT || p->state == CX_PEER_LEFT) return;
    if (!p->ever_up && p->state != CX_PEER_CONNECTING) return;
    /* etcd does not say whether a lease ran out or someone deleted the key; a peer we saw fail
     * (and that sent no BYE) lost its lease. */
    const char *why = p->state == CX_PEER_FAILED ? "directory: lease expired" : "directory: deleted";
    if (p->pending) cx_conn_close(e, p->pending);
    p->state = CX_PEER_LEFT;
    p->reconnect = 0;
    cx_event_emit(e, p, CX_EVENT_LEFT, why);
}

/* 1 when the directory held an entry for lid and it was deleted since (a tombstone). */
static int dir_deleted(cx_dir_t *d, const cx_lid_t *lid)
{
    pthread_mutex_lock(&d->mu);
    cx_dir_row_t *r = row_find(d, lid);
    int del = r && r->deleted;
    pthread_mutex_unlock(&d->mu);
    return del;
}

void cx_dir_tick(cx_engine_t *e, uint64_t now)
{
    (void)now;
    cx_dir_t *d = e->dir;
    if (!d) return;
    /* A lease can run out before the heartbeat timeout fails the peer (they are both about a
     * second in tests): the DELETE then found it still UP. Once the transport fails it, its
     * deleted entry says it is gone. */
    for (cx_peer_t *p = e->peers; p; p = p->next)
        if (p->state == CX_PEER_FAILED && dir_deleted(d, &p->lid)) on_del(e, p);
    pthread_mutex_lock(&d->mu);
    cx_dir_chg_t *q = d->q;
    size_t qn = d->qn;
    d->q = NULL;
    d->qn = d->qcap = 0;
    pthread_mutex_unlock(&d->mu);
    for (size_t i = 0; i < qn; i++) {
        const cx_dir_entry_t *ent = &q[i].ent;
        e->st.directory_changes++;
        char l[96];
        cx_lid_format(&ent->lid, l, sizeof l);
        cx_debug("directory: %s %s%s%s (version %llu)", q[i].kind == CX_DIR_PUT ? "put" : "delete", l,
                 q[i].kind == CX_DIR_PUT ? " -> " : "", q[i].kind == CX_DIR_PUT ? ent->url : "",
                 (unsigned long long)ent->version);
        if (cx_lid_cmp(&ent->lid, &e->lid)) {
            cx_peer_t *p = cx_peer_find(e, &ent->lid);
            if (p && q[i].kind == CX_DIR_PUT)
                on_put(e, p, ent);
            else if (p)
                on_del(e, p);
        }
        cx_groups_on_dir(e, ent, q[i].kind);
    }
    free(q);
}

/* ---------------------------------------------------------------- public */

struct list_ctx {
    cx_dir_entry_t *out;
    int max, n;
};
static void list_fn(void *ctx, const cx_dir_entry_t *ent)
{
    struct list_ctx *c = ctx;
    if (c->n < c->max) c->out[c->n] = *ent;
    c->n++;
}

int cx_directory_list(cx_engine_t *e, const char *pattern, cx_dir_entry_t *out, int max)
{
    if (!e) return CX_EINVAL;
    if (max < 0 || (max > 0 && !out)) {
        cx_warn("directory_list: bad output buffer (max %d)", max);
        return CX_EINVAL;
    }
    cx_lid_pat_t pat;
    char err[256];
    if (pattern && cx_lid_pat_parse(pattern, &pat, err, sizeof err)) {
        cx_warn("directory_list: %s", err);
        return CX_EINVAL;
    }
    struct list_ctx c = { out, max, 0 };
    cx_dir_each(e, pattern ? &pat : NULL, list_fn, &c);
    return c.n;
}

const char *cx_directory_kind(cx_engine_t *e)
{
    return e && e->dir ? e->dir->ops->name : NULL;
}
