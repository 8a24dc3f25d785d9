/* The operator's view (connex-ctl): a connection that sends STATUS_QUERY instead of HELLO (after
 * the AUTH exchange when a token is set) gets this engine and its peers in one STATUS_REPLY, and
 * with CX_STATUS_WATCH each later event as a STATUS_EVENT. It never becomes a peer. A watching
 * connection is exempt from the HELLO timeout; at most CX_STATUS_WATCHERS of them, and one that
 * does not read its events is closed once CX_STATUS_BACKLOG bytes wait for it. */
#include "peer_int.h"

#include "connex/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define CX_STATUS_WATCHERS 8
#define CX_STATUS_BACKLOG (1u << 20)

static uint64_t unix_ms_of(uint64_t mono_ns)
{
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t real_ms = (uint64_t)rt.tv_sec * 1000u + (uint64_t)rt.tv_nsec / 1000000u;
    uint64_t ago = (cx_now_ns() - mono_ns) / 1000000u;
    return real_ms > ago ? real_ms - ago : 0;
}

static int reply(cx_engine_t *e, cx_conn_t *c)
{
    uint32_t n = 0;
    for (cx_peer_t *p = e->peers; p && n < CX_STATUS_PEERS_MAX; p = p->next) n++;
    size_t cap = 512 + (size_t)n * 512;
    uint8_t *buf = malloc(cap);
    if (!buf) return CX_ENOMEM;
    cx_wr_t w;
    cx_wr_init(&w, buf, cap);
    char lid[96];
    cx_lid_format(&e->lid, lid, sizeof lid);
    cx_wire_put_status_head(&w, e->incarnation, e->url, lid, e->backends_str, unix_ms_of(cx_now_ns()), n);
    uint32_t k = 0;
    for (cx_peer_t *p = e->peers; p && k < n; p = p->next, k++) {
        cx_wire_status_peer_t s;
        memset(&s, 0, sizeof s);
        snprintf(s.lid, sizeof s.lid, "%s", p->lid_str);
        snprintf(s.url, sizeof s.url, "%s", p->url);
        s.state = p->state;
        if (p->bidx >= 0 && p->bidx < e->nb && p->ep && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT)) {
            snprintf(s.backend, sizeof s.backend, "%s", e->bnames[p->bidx]);
            cx_peer_transport(e, p, s.transport, sizeof s.transport);
        }
        s.incarnation = p->incarnation;
        s.since_ms = p->m.since_ns ? unix_ms_of(p->m.since_ns) : 0;
        s.failures = p->m.failures;
        s.joins = p->m.joins;
        for (cx_op_t *op = p->ops.next; op != &p->ops; op = op->next)
            s.in_flight += op->kind != CX_OPK_SUB && op->kind != CX_OPK_CHUNK; /* as cx_stats */
        s.errors = p->m.errors;
        s.timeouts = p->m.timeouts;
        cx_wire_put_status_peer(&w, &s);
    }
    if (!w.ok) {
        cx_error("control: the status reply outgrew its %zu bytes", cap);
        free(buf);
        return CX_ERR;
    }
    cx_conn_send(e, c, CX_CTL_STATUS_REPLY, buf, w.len);
    free(buf);
    return CX_OK;
}

int cx_status_on_query(cx_engine_t *e, cx_conn_t *c, const uint8_t *body, size_t len)
{
    char who[80];
    cx_auth_peer_name(c->fd, who, sizeof who);
    if (e->auth && !c->au.ok) return cx_hello_auth_failed(e, c, "status query without authentication (token required)");
    if (len != 1 || body[0] > CX_STATUS_WATCH) {
        cx_warn("control: malformed STATUS_QUERY from %s: closing", who);
        e->st.rejected_requests++;
        cx_conn_close(e, c);
        return 1;
    }
    if (body[0] == CX_STATUS_WATCH && !c->watch) {
        int n = 0;
        for (cx_conn_t *k = e->conns; k; k = k->next) n += k->watch;
        if (n >= CX_STATUS_WATCHERS) {
            cx_warn("control: %s asks to watch events: %d watchers already, closing", who, n);
            cx_conn_close(e, c);
            return 1;
        }
        c->watch = 1;
    }
    cx_info("control: status query from %s%s", who, c->watch ? " (watching events)" : "");
    if (reply(e, c) || cx_conn_flush(e, c)) {
        cx_conn_close(e, c);
        return 1;
    }
    return 0;
}

void cx_status_event(cx_engine_t *e, const cx_event_t *ev)
{
    cx_wire_status_event_t s;
    int any = 0;
    for (cx_conn_t *c = e->conns; c && !any; c = c->next) any = c->watch;
    if (!any) return;
    memset(&s, 0, sizeof s);
    s.type = ev->type;
    cx_lid_format(&ev->peer, s.lid, sizeof s.lid);
    snprintf(s.url, sizeof s.url, "%s", ev->url);
    snprintf(s.reason, sizeof s.reason, "%s", ev->reason);
    s.incarnation = ev->incarnation;
    s.time_ms = unix_ms_of(ev->time_ns);
    uint8_t buf[512];
    cx_wr_t w;
    cx_wr_init(&w, buf, sizeof buf);
    cx_wire_put_status_event(&w, &s);
    if (!w.ok) return;
    for (cx_conn_t *c = e->conns, *n; c; c = n) {
        n = c->next;
        if (!c->watch) continue;
        if (c->tx_len - c->tx_off > CX_STATUS_BACKLOG) {
            char who[80];
            cx_auth_peer_name(c->fd, who, sizeof who);
            cx_warn("control: %s does not read its events (%u bytes wait): closing", who, CX_STATUS_BACKLOG);
            /* Closed by the progress loop when it sees the hang-up: this may run inside a walk
             * of the connections. */
            c->watch = 0;
            shutdown(c->fd, SHUT_RDWR);
            continue;
        }
        cx_conn_send(e, c, CX_CTL_STATUS_EVENT, buf, w.len);
    }
}
