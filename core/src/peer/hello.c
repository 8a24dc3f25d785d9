/* The control protocol's handshake: HELLO (identity, incarnation, backends and their
 * addresses, our regions) and HELLO_ACK, authentication, the simultaneous-connect rule, and what
 * a peer's HELLO changes here (its incarnation, address, regions, the data backend of the pair). */
#include "peer_int.h"

#include "connex/log.h"
#include "../auth.h"
#include "../gpu_hook.h"
#include "../live.h"
#include "../mobility/dir_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

void cx_hello_send(cx_engine_t *e, cx_conn_t *c, uint8_t type, const cx_lid_t *target)
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
    if (w.ok)
        cx_conn_send(e, c, type, buf, w.len);
    else
        cx_error("HELLO does not fit its buffer (bug)");
    free(buf);
}

/* The first backend, in the order select/ gives this pair (the same on both ends), that
 * connects. */
static int choose_backend(cx_engine_t *e, cx_peer_t *p)
{
    int order[CX_MAX_BACKENDS];
    char why[160];
    int n = cx_select_pair_order((const char(*)[CX_CHOICE_MAX])e->bchoice, e->nb,
                                 (const char(*)[CX_CHOICE_MAX])p->their_choice, p->n_their, p->same_host, order, why,
                                 sizeof why);
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
int cx_peer_ensure_ep(cx_engine_t *e, cx_peer_t *p)
{
    if (p->ep) return CX_OK;
    if (p->bidx >= 0 && p->adv[p->bidx] &&
        e->be[p->bidx].ops->connect(e->be[p->bidx].b, p, p->adv[p->bidx], p->adv_len[p->bidx], &p->ep) == CX_OK)
        return CX_OK;
    return choose_backend(e, p);
}

/* After the backends' turn: a peer that sent a request needing an answer while we held no data
 * endpoint for it (a transport error dropped it: cx_peer_probe) gets one now, if it is still up,
 * so that the backend can answer instead of letting the requester time out. Not from inside the
 * backend's call, which is where the request was seen. */
void cx_peers_want_ep(cx_engine_t *e)
{
    e->want_ep = 0;
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        if (!p->want_ep) continue;
        p->want_ep = 0;
        if (p->ep || (p->state != CX_PEER_UP && p->state != CX_PEER_SUSPECT)) continue;
        int rc = cx_peer_ensure_ep(e, p);
        if (rc == CX_OK)
            cx_info("peer %s: data endpoint made again for a request of the peer", p->url);
        else
            cx_warn("peer %s: no data endpoint for a request of the peer: %s", p->url, cx_strerror(rc));
    }
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
    if (!p->ever_up)
        ev = CX_EVENT_UP;
    else if (new_inc) {
        ev = CX_EVENT_JOINED;
        why = "new incarnation";
    } else if (!was_up) {
        ev = CX_EVENT_JOINED;
        why = "reconnected";
    } else if (p->state == CX_PEER_SUSPECT) {
        ev = CX_EVENT_UP;
        why = "recovered";
    } else
        ev = (cx_event_type_t)-1;

    if (new_inc || !was_up) {
        cx_peer_drop_ep(e, p, CX_EPEER);
        cx_rregions_free(p);
        cx_peer_adv_free(p);
    }
    cx_peer_set_incarnation(e, p, h->incarnation);
    cx_url_t u;
    if (cx_url_parse(h->url, &u, NULL, 0) == CX_OK) cx_peer_set_url(p, &u);
    p->n_their = h->nb;
    for (int j = 0; j < h->nb; j++) snprintf(p->their_choice[j], sizeof p->their_choice[j], "%s", h->b[j].choice);
    p->same_host = h->host_id[0] && !strcmp(h->host_id, e->host_id);
    /* The pidfd first: where the watch then maps the page, the page proves that pid was this
     * incarnation's when the pidfd was opened. */
    cx_proc_follow(&p->proc, p->same_host ? h->live_pid : 0);
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
        cx_rregion_add(e, p, &wr);
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
int cx_hello_auth_failed(cx_engine_t *e, cx_conn_t *c, const char *why)
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
    cx_peer_dial_failed(e, p, why, CX_EAUTH);
    return 1;
}

/* An inbound HELLO: accept it (and answer HELLO_ACK) or refuse it. Returns 1 if c was closed. */
static int on_hello(cx_engine_t *e, cx_conn_t *c, const uint8_t *body, size_t len)
{
    cx_wire_hello_t h;
    char err[200];
    /* Not even parsed: nothing a stranger sends reaches the peer table or the region cache. */
    if (e->auth && !c->au.ok) return cx_hello_auth_failed(e, c, "HELLO without authentication (token required)");
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
    if (!p) {
        cx_conn_close(e, c);
        return 1;
    }
    /* The process behind our connection restarted: the old incarnation failed. */
    if (p->conn && p->incarnation != h.incarnation) cx_peer_fail(e, p, "restarted (new incarnation)");
    if (moved) {
        /* A known LID dialled us from a new address (restarted elsewhere): follow it. */
        char why[CX_URL_MAX + 48];
        snprintf(why, sizeof why, "dialled us from a new address (was %s)", p->url);
        cx_peer_set_url(p, &u);
        if (p->pending) cx_conn_close(e, p->pending); /* a dial to the old address */
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
    cx_hello_send(e, c, CX_CTL_HELLO_ACK, &h.lid);
    peer_up(e, p, &h);
    return 0;
}

static int on_hello_ack(cx_engine_t *e, cx_conn_t *c, const uint8_t *body, size_t len)
{
    cx_peer_t *p = c->peer;
    cx_wire_hello_t h;
    char err[200];
    if (e->auth && !c->au.ok) return cx_hello_auth_failed(e, c, "HELLO_ACK from an acceptor that did not authenticate");
    if (cx_wire_get_hello(body, len, &h, err, sizeof err)) {
        cx_warn("peer %s: bad HELLO_ACK: %s", p->url, err);
        cx_conn_close(e, c);
        cx_peer_dial_failed(e, p, err, CX_EPEER);
        return 1;
    }
    if (cx_lid_cmp(&h.lid, &p->lid)) {
        cx_error("dialled %s but the process there is %s: identity mismatch", p->url, h.url);
        cx_conn_close(e, c);
        /* Not the peer the caller named: an error in the name, not a failure to retry. */
        cx_peer_dial_failed(e, p, "identity mismatch", CX_EINVAL);
        return 1;
    }
    p->pending = NULL;
    if (p->conn) cx_conn_close(e, p->conn);
    c->bound = 1;
    p->conn = c;
    peer_up(e, p, &h);
    return 0;
}

int cx_hello_on_frame(cx_engine_t *e, cx_conn_t *c, uint8_t type, const uint8_t *body, size_t len)
{
    if (!c->outgoing && type == CX_CTL_STATUS_QUERY) return cx_status_on_query(e, c, body, len);
    if (c->watch) {
        /* A tool's connection never becomes a peer's: it would get STATUS_EVENT frames. */
        cx_warn("control: a watching tool sent frame %u: closing its connection", type);
        cx_conn_close(e, c);
        return 1;
    }
    if (!c->outgoing && type == CX_CTL_HELLO) return on_hello(e, c, body, len);
    if (c->outgoing && type == CX_CTL_HELLO_ACK) return on_hello_ack(e, c, body, len);
    if (type == CX_CTL_AUTH) {
        char why[160];
        int rc = cx_auth_on_frame(e, c, body, len, why, sizeof why);
        if (rc == CX_AUTH_SEND_HELLO) cx_hello_send(e, c, CX_CTL_HELLO, &c->peer->lid);
        return rc < 0 ? cx_hello_auth_failed(e, c, why) : 0;
    }
    if (c->outgoing && type == CX_CTL_REFUSE) {
        cx_rd_t r;
        cx_rd_init(&r, body, len);
        int st = (int)cx_rd_u32(&r);
        char why[256];
        cx_rd_str8(&r, why, sizeof why);
        if (!r.ok || st >= 0 || st < -64) {
            st = CX_EPEER;
            snprintf(why, sizeof why, "refused");
        }
        if (st == CX_EAUTH) e->st.auth_refused++;
        cx_peer_t *p = c->peer;
        cx_error("peer %s refused the connection: %s", p->url, why);
        cx_conn_close(e, c);
        cx_peer_dial_failed(e, p, why, st);
        return 1;
    }
    cx_warn("control: frame type %u before the handshake: closing the connection", type);
    cx_conn_lost(e, c, "protocol error");
    return 1;
}
