/* TCP sockets of the control channel: listen, non-blocking connect, framed send buffering. */
#include "engine.h"

#include "connex/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static int to_sockaddr(const char *ip, uint16_t port, struct sockaddr_storage *ss, socklen_t *sl)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, ip, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons(port);
        *sl = sizeof *s4;
        return 0;
    }
    if (inet_pton(AF_INET6, ip, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(port);
        *sl = sizeof *s6;
        return 0;
    }
    return -1;
}

static void tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int cx_sock_listen(const char *ip, uint16_t port, uint16_t *bound_port)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (to_sockaddr(ip, port, &ss, &sl)) {
        cx_error("listen address '%s' is not a numeric IPv4/IPv6 address", ip);
        return CX_EINVAL;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        cx_error("socket: %s", strerror(errno));
        return CX_ERR;
    }
    int one = 1;
    /* SO_REUSEADDR lets a restarted process take its port back from TIME_WAIT: that is how a
     * peer rejoins under the same identity. */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) || listen(fd, 128)) {
        cx_error("cannot listen on %s:%u: %s", ip, port, strerror(errno));
        close(fd);
        return CX_ERR;
    }
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *bound_port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                                : ((struct sockaddr_in6 *)&ss)->sin6_port);
    return fd;
}

int cx_sock_connect(const cx_url_t *u, int *in_progress)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    *in_progress = 0;
    if (to_sockaddr(u->host, u->port, &ss, &sl)) return -1;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    tune(fd);
    if (connect(fd, (struct sockaddr *)&ss, sl) == 0) return fd;
    if (errno == EINPROGRESS) {
        *in_progress = 1;
        return fd;
    }
    int err = errno;
    close(fd);
    errno = err;
    return -1;
}

cx_conn_t *cx_conn_new(cx_engine_t *e, int fd, int outgoing, int tcp_up)
{
    cx_conn_t *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return NULL;
    }
    c->w.kind = CX_W_CONN;
    c->w.obj = c;
    c->fd = fd;
    c->outgoing = outgoing;
    c->tcp_up = tcp_up;
    c->t_start_ns = cx_now_ns();
    if (!outgoing) tune(fd);
    uint32_t ev = EPOLLIN | EPOLLRDHUP;
    if (!tcp_up) {
        ev |= EPOLLOUT;
        c->want_out = 1;
    }
    if (cx_watch_add(e, fd, ev, &c->w)) {
        close(fd);
        free(c);
        return NULL;
    }
    c->next = e->conns;
    e->conns = c;
    return c;
}

void cx_conn_close(cx_engine_t *e, cx_conn_t *c)
{
    for (cx_conn_t **pp = &e->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    if (c->peer) {
        if (c->peer->conn == c) c->peer->conn = NULL;
        if (c->peer->pending == c) c->peer->pending = NULL;
    }
    cx_watch_del(e, c->fd);
    close(c->fd);
    free(c->rx);
    free(c->tx);
    free(c);
}

static int reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 4096;
    while (nc < need) nc *= 2;
    uint8_t *nb = realloc(*buf, nc);
    if (!nb) return -1;
    *buf = nb;
    *cap = nc;
    return 0;
}

void cx_conn_send(cx_engine_t *e, cx_conn_t *c, uint8_t type, const void *body, size_t len)
{
    if (c->tx_off == c->tx_len) c->tx_off = c->tx_len = 0;
    if (reserve(&c->tx, &c->tx_cap, c->tx_len + CX_CTL_HDR + len)) {
        cx_error("out of memory queueing a control frame");
        return;
    }
    cx_ctl_hdr(c->tx + c->tx_len, (uint32_t)len, type);
    if (len) memcpy(c->tx + c->tx_len + CX_CTL_HDR, body, len);
    c->tx_len += CX_CTL_HDR + len;
    if (c->peer && c->bound) c->peer->last_tx_ns = cx_now_ns();
    if (c->tcp_up) cx_conn_flush(e, c);
}

uint8_t *cx_conn_reserve(cx_conn_t *c, uint8_t type, size_t len)
{
    if (c->tx_off == c->tx_len) c->tx_off = c->tx_len = 0;
    if (reserve(&c->tx, &c->tx_cap, c->tx_len + CX_CTL_HDR + len)) {
        cx_error("out of memory queueing a control frame");
        return NULL;
    }
    cx_ctl_hdr(c->tx + c->tx_len, (uint32_t)len, type);
    return c->tx + c->tx_len + CX_CTL_HDR;
}

void cx_conn_commit(cx_engine_t *e, cx_conn_t *c, size_t len)
{
    c->tx_len += CX_CTL_HDR + len;
    if (c->peer && c->bound) c->peer->last_tx_ns = cx_now_ns();
    if (c->tcp_up) cx_conn_flush(e, c);
}

int cx_conn_flush(cx_engine_t *e, cx_conn_t *c)
{
    while (c->tx_off < c->tx_len) {
        ssize_t n = send(c->fd, c->tx + c->tx_off, c->tx_len - c->tx_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->tx_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!c->want_out) {
                c->want_out = 1;
                cx_watch_mod(e, c->fd, EPOLLIN | EPOLLRDHUP | EPOLLOUT, &c->w);
            }
            return CX_OK;
        }
        return CX_EPEER;
    }
    c->tx_off = c->tx_len = 0;
    if (c->want_out) {
        c->want_out = 0;
        cx_watch_mod(e, c->fd, EPOLLIN | EPOLLRDHUP, &c->w);
    }
    return CX_OK;
}
