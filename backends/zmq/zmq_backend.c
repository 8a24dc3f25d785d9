/* ZeroMQ over TCP: the backend every host can run. */
#include "zmq_int.h"

#include "connex/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

int cx_zmq_readable(void *sock)
{
    int ev = 0;
    size_t sz = sizeof ev;
    if (zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &sz)) return 0;
    return (ev & ZMQ_POLLIN) != 0;
}

int cx_zmq_recv_parts(void *sock, zmq_msg_t *parts, int max, int *truncated)
{
    int n = 0;
    *truncated = 0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, n ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            if (n == 0) return -1;
            break; /* cannot happen for a complete multipart message */
        }
        int more = zmq_msg_more(&m);
        if (n < max)
            parts[n++] = m;
        else {
            zmq_msg_close(&m);
            *truncated = 1;
        }
        if (!more) break;
    }
    return n;
}

void cx_zmq_close_parts(zmq_msg_t *parts, int n)
{
    for (int i = 0; i < n; i++) zmq_msg_close(&parts[i]);
}

static int sock_setup(void *s)
{
    int zero = 0, one = 1;
    /* No high-water mark: every op is bounded by its caller and its timeout, and a dropped or
     * blocked frame would turn into a hang. No linger: a closed endpoint must stop at once. */
    return zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero) | zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero) |
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) | zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof one);
}

static int watch(struct cx_backend *b, void *s, int *fd_out)
{
    int fd;
    size_t sz = sizeof fd;
    if (zmq_getsockopt(s, ZMQ_FD, &fd, &sz)) return CX_ERR;
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = s };
    if (epoll_ctl(b->epfd, EPOLL_CTL_ADD, fd, &ev)) return CX_ERR;
    *fd_out = fd;
    return CX_OK;
}

static void zmq_be_close(cx_backend_t *b);

static int zmq_be_open(const cx_backend_params_t *p, cx_backend_t **out)
{
    struct cx_backend *b = calloc(1, sizeof *b);
    if (!b) return CX_ENOMEM;
    b->core = p->core;
    b->incarnation = p->incarnation;
    b->next_id = 1;
    b->epfd = epoll_create1(EPOLL_CLOEXEC);
    b->ctx = zmq_ctx_new();
    b->fx = malloc(CX_ZMQ_FRAME_ENTRIES * sizeof *b->fx);
    b->tst = malloc(CX_ZMQ_FRAME_ENTRIES * sizeof *b->tst);
    b->tpin = malloc(CX_ZMQ_FRAME_ENTRIES * sizeof *b->tpin);
    if (b->epfd < 0 || !b->ctx || !b->fx || !b->tst || !b->tpin) {
        zmq_be_close(b);
        return CX_ERR;
    }
    zmq_ctx_set(b->ctx, ZMQ_BLOCKY, 0);
    b->router = zmq_socket(b->ctx, ZMQ_ROUTER);
    int one = 1;
    char ep[128];
    snprintf(ep, sizeof ep, strchr(p->listen_ip, ':') ? "tcp://[%s]:*" : "tcp://%s:*", p->listen_ip);
    if (!b->router || sock_setup(b->router) || zmq_setsockopt(b->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one) ||
        zmq_bind(b->router, ep)) {
        cx_error("zmq: cannot bind %s: %s", ep, zmq_strerror(zmq_errno()));
        zmq_be_close(b);
        return CX_ERR;
    }
    /* The endpoint peers connect to: the bound port at the advertised address (a router bound
     * to 0.0.0.0 reports tcp://0.0.0.0:port, which no peer can use). */
    char last[128];
    size_t sz = sizeof last;
    const char *adv = p->advertise_ip && *p->advertise_ip ? p->advertise_ip : p->listen_ip;
    const char *port = zmq_getsockopt(b->router, ZMQ_LAST_ENDPOINT, last, &sz) ? NULL : strrchr(last, ':');
    if (!port) {
        cx_error("zmq: no bound endpoint for %s: %s", ep, zmq_strerror(zmq_errno()));
        zmq_be_close(b);
        return CX_ERR;
    }
    char plain[160];
    int v6 = strchr(adv, ':') != NULL;
    snprintf(plain, sizeof plain, v6 ? "tcp://[%s]%s" : "tcp://%s%s", adv, port);
    if (cx_zmq_addr_put(b->endpoint, sizeof b->endpoint, plain, v6)) {
        cx_error("zmq: endpoint %s too long", plain);
        zmq_be_close(b);
        return CX_ERR;
    }
    if (watch(b, b->router, &b->router_fd)) {
        zmq_be_close(b);
        return CX_ERR;
    }
    *out = b;
    return CX_OK;
}

static void zmq_be_disconnect(cx_backend_t *b, cx_bep_t *ep, int why);

static void zmq_be_close(cx_backend_t *b)
{
    while (b->eps) zmq_be_disconnect(b, b->eps, CX_ECLOSED);
    if (b->router) zmq_close(b->router);
    /* zmq_ctx_term waits for the io thread; with linger 0 everywhere it returns at once. */
    if (b->ctx) zmq_ctx_term(b->ctx);
    if (b->epfd >= 0) close(b->epfd);
    free(b->fx);
    free(b->tst);
    free(b->tpin);
    free(b);
}

static int zmq_be_address(cx_backend_t *b, void *buf, size_t *len)
{
    size_t n = strlen(b->endpoint);
    if (n > *len) return CX_EINVAL;
    memcpy(buf, b->endpoint, n);
    *len = n;
    return CX_OK;
}

static int zmq_be_wait_fd(cx_backend_t *b)
{
    return b->epfd;
}

static int zmq_be_mem_reg(cx_backend_t *b, void *addr, size_t len, int mem_kind, void **mh, void *key, size_t *key_len)
{
    (void)b;
    (void)len;
    if (mem_kind != CX_MEM_HOST) {
        /* Device memory reaches this backend through the core's host staging. */
        cx_debug("zmq: region %p of memory kind %d is served through staging", addr, mem_kind);
    }
    *mh = addr; /* nothing to register: the target copies in software */
    *key_len = 0;
    (void)key;
    return CX_OK;
}

static void zmq_be_mem_dereg(cx_backend_t *b, void *mh)
{
    (void)b;
    (void)mh;
}

static int zmq_be_connect(cx_backend_t *b, void *peer, const void *addr, size_t addr_len, cx_bep_t **out)
{
    char ep[160];
    int version;
    if (cx_zmq_addr_get(addr, addr_len, ep, sizeof ep, &version)) {
        cx_warn("zmq: peer advertised a malformed endpoint");
        return CX_EINVAL;
    }
    struct cx_bep *e = calloc(1, sizeof *e);
    if (!e) return CX_ENOMEM;
    e->peer = peer;
    e->version = version;
    e->sock = zmq_socket(b->ctx, ZMQ_DEALER);
    if (!e->sock || sock_setup(e->sock) || zmq_connect(e->sock, ep) || watch(b, e->sock, &e->fd)) {
        cx_warn("zmq: cannot connect to %s: %s", ep, zmq_strerror(zmq_errno()));
        if (e->sock) zmq_close(e->sock);
        free(e);
        return CX_EPEER;
    }
    e->next = b->eps;
    if (b->eps) b->eps->prev = e;
    b->eps = e;
    *out = e;
    return CX_OK;
}

/* outstanding list, oldest first (zmq_int.h) */
void cx_zmq_out_add(struct cx_bep *e, cx_xfer_t *x)
{
    x->bp[0] = NULL;
    x->bp[1] = e->tail;
    if (e->tail)
        e->tail->bp[0] = x;
    else
        e->head = x;
    e->tail = x;
}

void cx_zmq_out_del(struct cx_bep *e, cx_xfer_t *x)
{
    cx_xfer_t *n = x->bp[0], *p = x->bp[1];
    if (p)
        p->bp[0] = n;
    else
        e->head = n;
    if (n)
        n->bp[1] = p;
    else
        e->tail = p;
}

static void zmq_be_disconnect(cx_backend_t *b, cx_bep_t *e, int why)
{
    (void)why;
    epoll_ctl(b->epfd, EPOLL_CTL_DEL, e->fd, NULL);
    zmq_close(e->sock); /* linger 0: queued requests are dropped, late replies go nowhere */
    if (e->prev)
        e->prev->next = e->next;
    else
        b->eps = e->next;
    if (e->next) e->next->prev = e->prev;
    cx_zmq_flow_close(b, e); /* in flight and waiting: CX_EPEER */
    free(e);
}

/* Every request is one frame: header, then a write's data, then a message (zmq_int.h). Never a
 * multipart message: libzmq 4.3.4 aborts its I/O thread ("Resource temporarily unavailable
 * (src/session_base.cpp:260)", zeromq/libzmq#3442) when a connection fails while its engine has
 * sent part of a multipart message and our close of the DEALER (the peer was reported dead,
 * often before the kernel reset its connection) already stopped the pipe: clean_pipes cannot
 * read the rest. A put_signal used to go as header, data, message, so the whole data transfer was
 * such a window (conformance_gpu_zmq aborted in 3 of 34 runs). zmq_send copied the data into a
 * message anyway: one frame costs no more. */
int cx_zmq_submit_one(cx_backend_t *b, cx_bep_t *e, cx_xfer_t *x)
{
    cx_zmq_req_t r = { .kind = (uint8_t)x->kind,
                       .id = b->next_id++,
                       .sender = b->incarnation,
                       .addr = x->remote,
                       .len = x->kind == CX_XFER_MSG ? 0 : x->len };
    size_t dlen = x->kind == CX_XFER_WRITE || x->kind == CX_XFER_PUT_SIGNAL ? x->len : 0;
    size_t mlen = x->kind == CX_XFER_PUT_SIGNAL || x->kind == CX_XFER_MSG ? x->msg_len : 0;
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, CX_ZMQ_REQ_HDR + dlen + mlen)) {
        cx_warn("zmq: no memory for a %zu-byte request", CX_ZMQ_REQ_HDR + dlen + mlen);
        return CX_ENOMEM;
    }
    uint8_t *p = zmq_msg_data(&m);
    cx_zmq_req_put(p, &r);
    if (dlen) memcpy(p + CX_ZMQ_REQ_HDR, x->local, dlen);
    if (mlen) memcpy(p + CX_ZMQ_REQ_HDR + dlen, x->msg, mlen);
    if (zmq_msg_send(&m, e->sock, 0) < 0) {
        /* Local: the DEALER queues (it does not block, and a dead peer's connection does not
         * fail a send): the op ends with the error, the peer is not blamed. */
        int err = zmq_errno();
        cx_warn("zmq: send failed: %s", zmq_strerror(err));
        zmq_msg_close(&m);
        cx_core_peer_error(b->core, e->peer, CX_CAUSE_LOCAL, "zmq: send failed");
        return err == EAGAIN ? CX_EAGAIN : err == ENOMEM ? CX_ENOMEM : CX_ERR;
    }
    x->bp[2] = (void *)(uintptr_t)r.id;
    x->bp[3] = NULL;
    x->bp[4] = NULL;
    cx_zmq_out_add(e, x);
    return CX_OK;
}

/* Replies to our requests on one DEALER. */
static int take_replies(struct cx_backend *b, struct cx_bep *e)
{
    for (int budget = 0;; budget++) {
        if (!cx_zmq_readable(e->sock)) return 0;
        if (budget == 256) return 1;
        zmq_msg_t parts[2];
        int trunc;
        int n = cx_zmq_recv_parts(e->sock, parts, 2, &trunc);
        if (n < 0) return 0;
        /* Both replies open with the request's id: which of ours it answers says how to read it. */
        uint64_t id = 0;
        const uint8_t *h = zmq_msg_data(&parts[0]);
        for (int k = 0; k < 8 && zmq_msg_size(&parts[0]) >= 8; k++) id |= (uint64_t)h[k] << (8 * k);
        cx_xfer_t *x = e->head;
        while (x && (uint64_t)(uintptr_t)x->bp[2] != id) x = x->bp[0];
        if (!trunc && x && x->bp[3]) {
            cx_zmq_batch_reply(b, e, x, parts, n);
            cx_zmq_close_parts(parts, n);
            continue;
        }
        cx_zmq_rep_t rep;
        if (trunc || n > 2 || cx_zmq_rep_get(zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0]), &rep)) {
            cx_warn("zmq: malformed reply (%d parts) dropped", n);
            cx_zmq_close_parts(parts, n);
            continue;
        }
        if (!x) {
            cx_debug("zmq: reply for unknown request %llu (completed or timed out) dropped",
                     (unsigned long long)rep.id);
            cx_zmq_close_parts(parts, n);
            continue;
        }
        int st = rep.status;
        if (st == CX_OK && x->kind == CX_XFER_READ) {
            if (n != 2 || zmq_msg_size(&parts[1]) != x->len) {
                cx_warn("zmq: read reply carries %zu bytes, expected %zu", n == 2 ? zmq_msg_size(&parts[1]) : 0,
                        x->len);
                st = CX_ERR;
            } else {
                memcpy(x->local, zmq_msg_data(&parts[1]), x->len);
            }
        }
        cx_zmq_close_parts(parts, n);
        cx_zmq_out_del(e, x);
        cx_zmq_flow_done(b, e, x, st);
    }
    return 0;
}

static int zmq_be_progress(cx_backend_t *b)
{
    struct epoll_event evs[16];
    /* Drain readiness of the inner epoll; the real test is ZMQ_EVENTS on each socket. */
    while (epoll_wait(b->epfd, evs, 16, 0) == 16) {}
    int more = cx_zmq_serve(b);
    for (struct cx_bep *e = b->eps, *n; e; e = n) {
        n = e->next;
        more |= take_replies(b, e);
    }
    return more;
}

/* ZeroMQ runs over TCP only here (a DEALER per peer). */
static void zmq_be_ep_transport(cx_backend_t *b, cx_bep_t *ep, char *buf, size_t n)
{
    (void)b;
    if (n) snprintf(buf, n, "%s", ep ? "tcp" : "");
}

const struct cx_backend_ops cx_zmq_ops = {
    .version = CX_BACKEND_API_VERSION,
    .name = "zmq",
    .open = zmq_be_open,
    .close = zmq_be_close,
    .address = zmq_be_address,
    .wait_fd = zmq_be_wait_fd,
    .progress = zmq_be_progress,
    .mem_reg = zmq_be_mem_reg,
    .mem_dereg = zmq_be_mem_dereg,
    .connect = zmq_be_connect,
    .disconnect = zmq_be_disconnect,
    .submit = cx_zmq_submit,
    .forget_region = NULL,
    .software_target = 1, /* the target copies every request itself (device memory included) */
    /* Callers sending on the DEALERs themselves (core/src/drive.h) made libzmq 4.3.4 abort in its
     * I/O thread ("Resource temporarily unavailable (src/session_base.cpp:260)", the assertion of
     * zeromq/libzmq#3442: a multipart message cut by a close as its connection fails) in 1 of 6
     * kill-mid-transfer runs, 0 of 8 without; and drove no faster: libzmq's I/O thread does the
     * socket work either way. */
    .thread_bound = 1,
    .ep_transport = zmq_be_ep_transport,
    .submit_batch = cx_zmq_submit_batch,
};
