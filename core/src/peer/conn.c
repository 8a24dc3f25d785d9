/* Control connections: dialling a peer, accepting, reading frames (bounded per wake-up) and
 * handing each to the unit whose concern it is, a connection's loss, BYE at close. */
#include "peer_int.h"

#include "connex/log.h"
#include "../auth.h"
#include "../tstage.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* At engine close, how long a BYE may take to leave: tries of a flush, a pause between them
 * (about 100 ms in all, so a peer that does not read cannot hold the close up). */
#define CX_BYE_FLUSH_TRIES 100
#define CX_BYE_FLUSH_WAIT_NS CX_NS_PER_MS
/* Connections accepted per wake-up of the listening socket: the rest wait for the next turn, so
 * that a burst of dials does not hold up the ops in flight. */
#define CX_ACCEPT_BUDGET 64
/* Reads per wake-up of one control connection, so that one chatty peer cannot starve the others. */
#define CX_CONN_READ_ROUNDS 16

void cx_peer_broadcast(cx_engine_t *e, uint8_t type, const void *body, size_t len)
{
    for (cx_peer_t *p = e->peers; p; p = p->next)
        if (p->conn) cx_conn_send(e, p->conn, type, body, len);
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
    if (e->auth)
        cx_auth_dial_start(e, c);
    else
        cx_hello_send(e, c, CX_CTL_HELLO, &p->lid);
}

/* The pending outgoing connection failed before the handshake finished. */
void cx_peer_dial_failed(cx_engine_t *e, cx_peer_t *p, const char *reason, int fail_status)
{
    cx_debug("peer %s: %s", p->url, reason);
    if (p->conn) return; /* an inbound connection took over: nothing lost */
    if (p->state == CX_PEER_CONNECTING || p->state == CX_PEER_UNKNOWN) {
        /* Nobody listening: the ops fail now. A connection closed during the handshake (say, a
         * simultaneous connect resolved the other way) is retried by the tick instead. */
        if (fail_status) {
            cx_peer_ops_fail(e, p, fail_status);
            p->state = p->ever_up ? CX_PEER_LEFT : CX_PEER_UNKNOWN;
        }
    }
    if (p->reconnect) {
        p->backoff_ms = cx_peer_next_backoff_ms(p->backoff_ms);
        p->next_reconnect_ns = cx_now_ns() + cx_ms_to_ns(p->backoff_ms);
    }
}

void cx_conn_lost(cx_engine_t *e, cx_conn_t *c, const char *reason)
{
    cx_peer_t *p = c->peer;
    if (p && p->conn == c) {
        cx_peer_fail(e, p, reason); /* closes c */
        return;
    }
    int refused = c->outgoing && !c->tcp_up;
    cx_conn_close(e, c);
    if (p && !p->conn) cx_peer_dial_failed(e, p, reason, refused ? CX_EPEER : 0);
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

/* Handles one frame; returns 1 if the connection was closed. Each concern parses its own
 * frames: the handshake (hello.c), liveness (heartbeats, probes, DEATH, BYE: liveness.c), the
 * peer's regions (rregion.c) and target-side staging (tstage.c). */
static int on_frame(cx_engine_t *e, cx_conn_t *c, uint8_t type, const uint8_t *body, size_t len)
{
    if (!c->bound) return cx_hello_on_frame(e, c, type, body, len);
    cx_peer_t *p = c->peer;
    cx_peer_heard(e, p);
    switch (type) {
    case CX_CTL_HB: cx_peer_on_hb(e, p, body, len); return 0;
    case CX_CTL_BYE: cx_peer_left(e, p); return 1;
    case CX_CTL_DEATH: cx_peer_on_death(e, p, body, len); return 0;
    case CX_CTL_TS_REQ:
    case CX_CTL_TS_CHUNK:
    case CX_CTL_TS_ACK:
    case CX_CTL_TS_END: cx_tstage_on_frame(e, p, type, body, len); return 0;
    default:
        if (cx_rregion_on_frame(e, p, type, body, len)) return 0;
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
            if (!nb) {
                cx_conn_lost(e, c, "out of memory");
                return;
            }
            c->rx = nb;
            c->rx_cap = nc;
        }
        ssize_t n = recv(c->fd, c->rx + c->rx_len, c->rx_cap - c->rx_len, 0);
        if (n == 0) {
            cx_conn_lost(e, c, "connection closed by peer");
            return;
        }
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
                cx_hello_auth_failed(e, c,
                                     type == CX_CTL_HELLO ? "HELLO without authentication (token required)"
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
            if (nb) {
                c->rx = nb;
                c->rx_cap = 131072;
            }
        }
    }
}
