/* The GET /metrics listener (CONNEX_METRICS=ip:port), served by the progress thread: no thread
 * of its own. One client at a time (the listening socket leaves the epoll set meanwhile, so
 * others wait in the kernel's backlog), a request of at most CX_HTTP_REQ_MAX bytes, and
 * CX_HTTP_TIMEOUT_MS from accept to the last byte sent: a client that is slow, silent or never
 * reads is closed at the next tick. Anything but GET /metrics gets 404 or 405. */
#include "engine.h"

#include "connex/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define CX_HTTP_REQ_MAX 4096
#define CX_HTTP_TIMEOUT_MS 2000

struct cx_metrics_srv {
    int lfd, cfd;
    cx_watch_t lw, cw;
    char req[CX_HTTP_REQ_MAX];
    size_t req_len;
    char *resp;
    size_t resp_len, resp_off;
    uint64_t deadline_ns;
    char where[64];
};

int cx_metrics_check(const char *spec, char *ip, size_t iplen, uint16_t *port)
{
    const char *colon = strrchr(spec, ':');
    const char *h = spec, *he = colon;
    if (colon && spec[0] == '[') {
        h = spec + 1;
        he = colon > spec && colon[-1] == ']' ? colon - 1 : NULL;
    }
    char *end = NULL;
    unsigned long p = colon ? strtoul(colon + 1, &end, 10) : 0;
    unsigned char a[16];
    size_t hl = he ? (size_t)(he - h) : 0;
    if (!colon || !he || !hl || hl >= iplen || !colon[1] || *end || p > 65535) goto bad;
    memcpy(ip, h, hl);
    ip[hl] = 0;
    if (inet_pton(spec[0] == '[' ? AF_INET6 : AF_INET, ip, a) != 1) goto bad;
    *port = (uint16_t)p;
    return CX_OK;
bad:
    cx_error("CONNEX_METRICS='%s': expected ip:port or [ipv6]:port with a numeric address and a port "
             "0..65535",
             spec);
    return CX_EINVAL;
}

void cx_metrics_open(cx_engine_t *e)
{
    const char *spec = cx_opts_str(&e->opts, "CONNEX_METRICS");
    char ip[48];
    uint16_t port, bound = 0;
    if (!spec || !*spec || cx_metrics_check(spec, ip, sizeof ip, &port)) return;
    struct cx_metrics_srv *m = calloc(1, sizeof *m);
    if (!m) return;
    m->cfd = -1;
    m->lfd = cx_sock_listen(ip, port, &bound);
    if (m->lfd < 0) {
        cx_error("CONNEX_METRICS=%s: cannot listen there; this engine serves no /metrics "
                 "(cx_stats_format still works)",
                 spec);
        free(m);
        return;
    }
    snprintf(m->where, sizeof m->where, strchr(ip, ':') ? "[%s]:%u" : "%s:%u", ip, bound);
    m->lw = (cx_watch_t){ CX_W_METRICS, m, 0 };
    m->cw = (cx_watch_t){ CX_W_METRICS, m, 1 };
    if (cx_watch_add(e, m->lfd, EPOLLIN, &m->lw)) {
        close(m->lfd);
        free(m);
        return;
    }
    e->msrv = m;
    cx_info("metrics: serving GET /metrics on %s", m->where);
}

static void client_close(cx_engine_t *e, struct cx_metrics_srv *m)
{
    if (m->cfd < 0) return;
    cx_watch_del(e, m->cfd);
    close(m->cfd);
    m->cfd = -1;
    free(m->resp);
    m->resp = NULL;
    m->req_len = m->resp_len = m->resp_off = 0;
    cx_watch_mod(e, m->lfd, EPOLLIN, &m->lw); /* the next client */
}

void cx_metrics_close(cx_engine_t *e)
{
    struct cx_metrics_srv *m = e->msrv;
    if (!m) return;
    if (m->cfd >= 0) {
        close(m->cfd);
        free(m->resp);
    }
    close(m->lfd);
    free(m);
    e->msrv = NULL;
}

int cx_metrics_is_watch(const cx_engine_t *e, const cx_watch_t *w)
{
    return e->msrv && (w == &e->msrv->lw || w == &e->msrv->cw);
}

static void send_some(cx_engine_t *e, struct cx_metrics_srv *m)
{
    while (m->resp_off < m->resp_len) {
        ssize_t n = send(m->cfd, m->resp + m->resp_off, m->resp_len - m->resp_off, MSG_NOSIGNAL);
        if (n > 0) {
            m->resp_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            cx_watch_mod(e, m->cfd, EPOLLOUT, &m->cw);
            return;
        }
        break; /* the client went away */
    }
    client_close(e, m);
}

static void respond(cx_engine_t *e, struct cx_metrics_srv *m, int code, const char *reason, const char *body,
                    size_t blen, const char *ctype)
{
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n", code,
                      reason, ctype, blen, code == 405 ? "Allow: GET\r\n" : "");
    m->resp = malloc((size_t)hl + blen);
    if (!m->resp) {
        client_close(e, m);
        return;
    }
    memcpy(m->resp, head, (size_t)hl);
    memcpy(m->resp + hl, body, blen);
    m->resp_len = (size_t)hl + blen;
    m->resp_off = 0;
    send_some(e, m);
}

static void refuse(cx_engine_t *e, struct cx_metrics_srv *m, int code, const char *reason)
{
    char body[64];
    int n = snprintf(body, sizeof body, "%d %s\n", code, reason);
    cx_info("metrics: %s: answered %d %s", m->where, code, reason);
    respond(e, m, code, reason, body, (size_t)n, "text/plain; charset=utf-8");
}

/* The request line of a complete header: GET /metrics (a query string is ignored). */
static void handle(cx_engine_t *e, struct cx_metrics_srv *m)
{
    char *sp1 = memchr(m->req, ' ', m->req_len);
    char *eol = memchr(m->req, '\n', m->req_len);
    char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(m->req + m->req_len - sp1 - 1)) : NULL;
    if (!sp1 || !sp2 || !eol || sp2 > eol || strncmp(sp2 + 1, "HTTP/1.", 7)) {
        refuse(e, m, 400, "Bad Request");
        return;
    }
    if (sp1 - m->req != 3 || memcmp(m->req, "GET", 3)) {
        refuse(e, m, 405, "Method Not Allowed");
        return;
    }
    size_t plen = (size_t)(sp2 - sp1 - 1);
    char *q = memchr(sp1 + 1, '?', plen);
    if (q) plen = (size_t)(q - sp1 - 1);
    if (plen != 8 || memcmp(sp1 + 1, "/metrics", 8)) {
        refuse(e, m, 404, "Not Found");
        return;
    }
    size_t len;
    char *text = cx_metrics_render(e, &len);
    if (!text) {
        refuse(e, m, 500, "Internal Server Error");
        return;
    }
    respond(e, m, 200, "OK", text, len, "text/plain; version=0.0.4; charset=utf-8");
    free(text);
}

static void readable(cx_engine_t *e, struct cx_metrics_srv *m)
{
    for (;;) {
        if (m->req_len == sizeof m->req) {
            refuse(e, m, 431, "Request Header Fields Too Large");
            return;
        }
        ssize_t n = recv(m->cfd, m->req + m->req_len, sizeof m->req - m->req_len, 0);
        if (n == 0) {
            client_close(e, m);
            return;
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) client_close(e, m);
            return;
        }
        size_t from = m->req_len >= 3 ? m->req_len - 3 : 0;
        m->req_len += (size_t)n;
        for (size_t i = from; i + 1 < m->req_len; i++) {
            if (m->req[i] == '\n' &&
                (m->req[i + 1] == '\n' || (m->req[i + 1] == '\r' && i + 2 < m->req_len && m->req[i + 2] == '\n'))) {
                cx_watch_mod(e, m->cfd, 0, &m->cw); /* the rest of what it sends is not read */
                handle(e, m);
                return;
            }
        }
    }
}

static void accept_one(cx_engine_t *e, struct cx_metrics_srv *m)
{
    int fd = accept4(m->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return; /* gone before we took it, or out of fds: the listener stays */
    m->cfd = fd;
    m->req_len = 0;
    m->deadline_ns = cx_now_ns() + cx_ms_to_ns(CX_HTTP_TIMEOUT_MS);
    if (cx_watch_add(e, fd, EPOLLIN | EPOLLRDHUP, &m->cw)) {
        close(fd);
        m->cfd = -1;
        return;
    }
    cx_watch_mod(e, m->lfd, 0, &m->lw); /* one client at a time */
}

void cx_metrics_event(cx_engine_t *e, cx_watch_t *w, uint32_t events)
{
    struct cx_metrics_srv *m = e->msrv;
    if (w == &m->lw) {
        if (m->cfd < 0) accept_one(e, m);
        return;
    }
    if (m->cfd < 0) return;
    if (m->resp) {
        if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) send_some(e, m);
    } else if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        readable(e, m);
    }
}

void cx_metrics_tick(cx_engine_t *e, uint64_t now)
{
    struct cx_metrics_srv *m = e->msrv;
    if (!m || m->cfd < 0 || now < m->deadline_ns) return;
    cx_info("metrics: %s: a client took longer than %d ms: closed", m->where, CX_HTTP_TIMEOUT_MS);
    client_close(e, m);
}
