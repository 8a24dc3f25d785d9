/* The control-protocol client of connex-ctl (ctl_client.h). */
#include "ctl_client.h"

#include "connex/connex.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int left_ms(uint64_t deadline)
{
    uint64_t n = now_ms();
    return n >= deadline ? 0 : (int)(deadline - n);
}

static int wait_fd(int fd, short ev, uint64_t deadline)
{
    for (;;) {
        struct pollfd pf = { fd, ev, 0 };
        int t = left_ms(deadline);
        if (!t) return CX_ETIMEDOUT;
        int n = poll(&pf, 1, t);
        if (n > 0) return CX_OK;
        if (n == 0) return CX_ETIMEDOUT;
        if (errno != EINTR) return CX_EPEER;
    }
}

static int send_all(int fd, const void *buf, size_t len, uint64_t deadline)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc) return rc;
            continue;
        }
        return CX_EPEER;
    }
    return CX_OK;
}

static int recv_all(int fd, void *buf, size_t len, uint64_t deadline)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) return CX_EPEER;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLIN, deadline);
            if (rc) return rc;
            continue;
        }
        return CX_EPEER;
    }
    return CX_OK;
}

static int send_frame(cx_ctlc_t *c, uint8_t type, const void *body, size_t len, uint64_t deadline)
{
    uint8_t hdr[CX_CTL_HDR];
    cx_ctl_hdr(hdr, (uint32_t)len, type);
    int rc = send_all(c->fd, hdr, sizeof hdr, deadline);
    return rc ? rc : send_all(c->fd, body, len, deadline);
}

static int read_frame(cx_ctlc_t *c, uint8_t *type, size_t *len, uint64_t deadline, char *why, size_t wn)
{
    uint8_t hdr[CX_CTL_HDR];
    int rc = recv_all(c->fd, hdr, sizeof hdr, deadline);
    if (rc) {
        snprintf(why, wn, "%s", rc == CX_ETIMEDOUT ? "no answer in time" : "the engine closed the connection");
        return rc;
    }
    uint32_t blen;
    if (cx_ctl_hdr_parse(hdr, &blen, type)) {
        snprintf(why, wn, "not a connex control port (or another protocol version)");
        return CX_EPEER;
    }
    if (blen + 1 > c->cap) {
        uint8_t *nb = realloc(c->body, blen + 1);
        if (!nb) {
            snprintf(why, wn, "out of memory");
            return CX_ENOMEM;
        }
        c->body = nb;
        c->cap = blen + 1;
    }
    rc = recv_all(c->fd, c->body, blen, deadline);
    if (rc) {
        snprintf(why, wn, "%s", rc == CX_ETIMEDOUT ? "no answer in time" : "the engine closed the connection");
        return rc;
    }
    *len = blen;
    if (*type == CX_CTL_REFUSE) {
        cx_rd_t r;
        cx_rd_init(&r, c->body, blen);
        int st = (int)cx_rd_u32(&r);
        char msg[256];
        cx_rd_str8(&r, msg, sizeof msg);
        snprintf(why, wn, "%s", r.ok ? msg : "refused, no reason given");
        return st == CX_EAUTH ? CX_EAUTH : CX_EPEER;
    }
    return CX_OK;
}

static int auth_exchange(cx_ctlc_t *c, const cx_auth_t *auth, uint64_t deadline, char *why, size_t wn)
{
    uint8_t nd[CX_AUTH_NONCE], na[CX_AUTH_NONCE], proof[CX_AUTH_MAC], body[CX_AUTH_BODY];
    if (getrandom(nd, sizeof nd, 0) != (ssize_t)sizeof nd) {
        snprintf(why, wn, "no random nonce");
        return CX_ERR;
    }
    cx_auth_frame_t f = { .step = 1 };
    memcpy(f.data, nd, sizeof nd);
    cx_auth_frame_put(body, &f);
    int rc = send_frame(c, CX_CTL_AUTH, body, sizeof body, deadline);
    uint8_t type;
    size_t len;
    if (!rc) rc = read_frame(c, &type, &len, deadline, why, wn);
    if (rc) return rc;
    if (type != CX_CTL_AUTH || cx_auth_frame_get(c->body, len, &f) || f.step != 2) {
        snprintf(why, wn, "the engine answered AUTH with frame %u", type);
        return CX_EAUTH;
    }
    memcpy(na, f.data, sizeof na);
    if (cx_auth_proof(auth, 'D', nd, na, proof)) {
        snprintf(why, wn, "HMAC failed here");
        return CX_ERR;
    }
    f.step = 3;
    memcpy(f.data, proof, sizeof proof);
    cx_auth_frame_put(body, &f);
    rc = send_frame(c, CX_CTL_AUTH, body, sizeof body, deadline);
    if (!rc) rc = read_frame(c, &type, &len, deadline, why, wn);
    if (rc) return rc;
    if (type != CX_CTL_AUTH || cx_auth_frame_get(c->body, len, &f) || f.step != 4 ||
        !cx_auth_proof_ok(auth, 'A', nd, na, f.data)) {
        snprintf(why, wn, "the engine did not prove the token");
        return CX_EAUTH;
    }
    return CX_OK;
}

int cx_ctlc_open(cx_ctlc_t *c, const char *url, const cx_auth_t *auth, int what, int timeout_ms, char *why, size_t wn)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    why[0] = 0;
    cx_url_t u;
    char err[160];
    if (cx_url_parse(url, &u, err, sizeof err)) {
        snprintf(why, wn, "bad URL: %s", err);
        return CX_EINVAL;
    }
    uint64_t deadline = now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
    struct sockaddr_storage ss;
    socklen_t sl;
    memset(&ss, 0, sizeof ss);
    if (u.is_ipv6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(u.port);
        inet_pton(AF_INET6, u.host, &s6->sin6_addr);
        sl = sizeof *s6;
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons(u.port);
        inet_pton(AF_INET, u.host, &s4->sin_addr);
        sl = sizeof *s4;
    }
    c->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        snprintf(why, wn, "socket: %s", strerror(errno));
        return CX_ERR;
    }
    int rc = CX_OK;
    if (connect(c->fd, (struct sockaddr *)&ss, sl) && errno != EINPROGRESS) {
        snprintf(why, wn, "connect: %s", strerror(errno));
        rc = CX_EPEER;
    } else {
        rc = wait_fd(c->fd, POLLOUT, deadline);
        int err2 = 0;
        socklen_t el = sizeof err2;
        if (!rc) getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err2, &el);
        if (rc || err2) {
            snprintf(why, wn, "connect: %s", rc == CX_ETIMEDOUT ? "timed out" : strerror(err2 ? err2 : errno));
            rc = rc ? rc : CX_EPEER;
        }
    }
    if (!rc && auth) rc = auth_exchange(c, auth, deadline, why, wn);
    uint8_t q = (uint8_t)what;
    if (!rc) rc = send_frame(c, CX_CTL_STATUS_QUERY, &q, 1, deadline);
    if (rc) {
        if (!why[0]) snprintf(why, wn, "%s", cx_strerror(rc));
        cx_ctlc_close(c);
    }
    return rc;
}

int cx_ctlc_read(cx_ctlc_t *c, int timeout_ms, uint8_t *type, size_t *len, char *why, size_t whylen)
{
    why[0] = 0;
    return read_frame(c, type, len, now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0), why, whylen);
}

void cx_ctlc_close(cx_ctlc_t *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->body);
    c->body = NULL;
    c->cap = 0;
}
