/* The send window of an endpoint: large requests (a read or write of CX_ZMQ_ZEROCOPY_MIN bytes
 * or more) go CX_ZMQ_WINDOW at a time, the rest wait in order; a transfer larger than
 * CX_ZMQ_PIECE goes as pieces (single requests of at most that many bytes) through the same
 * window, completed together (zmq_int.h).
 *
 * Why a window. A libzmq message is one malloc on each side (zmq_msg_init_size for our request,
 * the decoder's buffer at the receiver). glibc serves a block above its mmap threshold (32 MiB at
 * most) with a fresh mmap, every page faulted in before the bytes land; below it, once a block of
 * that size was freed, the heap serves it, but glibc trims the heap's top back to the OS past
 * twice that size. More large messages in flight than two, and every free trimmed and every next
 * message faulted its pages in again:
 *   - one message per transfer: 64 MiB host reads 266 ms, writes 482 ms (0.25 / 0.14 GB/s; a raw
 *     libzmq loop the same), 24 MiB 9 ms;
 *   - pieces of 8 MiB four at a time, 2 MiB four or 1 MiB eight: 64 MiB in 85-184 ms; of 4 MiB
 *     two at a time: reads 18-23 ms, writes 22-24 ms;
 *   - 128 x 1 MiB batch entries, all in flight: reads 114 ms and writes 263 ms a batch, against
 *     37 and 33 ms with glibc's thresholds raised for the test (raw TCP 33 / 29 ms); through a
 *     window of 2: 27-36 and 39-68 ms; of 1 the same; of 3 or 4: 94-217 and 244-375 ms.
 * A library may not retune the process's malloc (mallopt, or a large block freed on purpose), so
 * the messages in flight stay within what it serves from the heap. The window also keeps a 1 GiB
 * write from copying 1 GiB into libzmq's queues at once.
 *
 * Order. Small reads and writes, and batch frames, pass the waiting ones (one-sided ops have no
 * order among themselves, as on RDMA); messages and put_signals wait behind them, so that
 * messages, a put_signal's included, reach the target in the order they were sent.
 *
 * Pieces are ordinary requests on the wire, so any target serves them. A put_signal's pieces go
 * as writes and its last piece, with the message, only once every other piece completed: the
 * target delivers the message after the last piece is in place, and the others are then in
 * place too. A failed piece stops the rest; the transfer ends with the first failure once no
 * piece is in flight. Disconnect completes what is in flight like any request, and what waits,
 * with CX_EPEER. */
#include "zmq_int.h"

#include "connex/log.h"

#include <stdlib.h>
#include <string.h>

struct cx_zmq_big {
    cx_xfer_t *x; /* the core's */
    size_t next;  /* where the next piece starts */
    unsigned out; /* pieces in flight */
    int status;   /* the first failure */
    cx_xfer_t piece[CX_ZMQ_WINDOW];
    uint8_t busy[CX_ZMQ_WINDOW];
};

static int is_large(const cx_xfer_t *x)
{
    return x->kind != CX_XFER_MSG && x->len >= CX_ZMQ_ZEROCOPY_MIN;
}

static int keeps_order(const cx_xfer_t *x)
{
    return x->kind == CX_XFER_MSG || x->kind == CX_XFER_PUT_SIGNAL;
}

static void wq_push(struct cx_bep *e, cx_xfer_t *x)
{
    x->bp[0] = NULL;
    if (e->wq_tail)
        e->wq_tail->bp[0] = x;
    else
        e->wq_head = x;
    e->wq_tail = x;
}

static cx_xfer_t *wq_pop(struct cx_bep *e)
{
    cx_xfer_t *x = e->wq_head;
    if (x && !(e->wq_head = x->bp[0])) e->wq_tail = NULL;
    return x;
}

/* The current large transfer's pieces, while the window has room. A put_signal's last one waits
 * for the others. It stops being current once its last piece went or it failed. */
static void pump(cx_backend_t *b, struct cx_bep *e)
{
    struct cx_zmq_big *g = e->cur;
    cx_xfer_t *x = g->x;
    while (g->status == CX_OK && g->next < x->len && e->large_out < CX_ZMQ_WINDOW) {
        size_t len = x->len - g->next < CX_ZMQ_PIECE ? x->len - g->next : CX_ZMQ_PIECE;
        int last = g->next + len == x->len;
        if (last && x->kind == CX_XFER_PUT_SIGNAL && g->out) return;
        unsigned k = 0;
        while (g->busy[k]) k++; /* out < large_out's bound: one is free */
        cx_xfer_t *p = &g->piece[k];
        memset(p, 0, sizeof *p);
        p->kind = x->kind == CX_XFER_READ           ? CX_XFER_READ
            : last && x->kind == CX_XFER_PUT_SIGNAL ? CX_XFER_PUT_SIGNAL
                                                    : CX_XFER_WRITE;
        p->local = (uint8_t *)x->local + g->next;
        p->len = len;
        p->local_mh = x->local_mh;
        p->local_mem = x->local_mem;
        p->remote = x->remote + g->next;
        p->remote_region = x->remote_region;
        p->remote_base = x->remote_base;
        if (p->kind == CX_XFER_PUT_SIGNAL) {
            p->msg = x->msg;
            p->msg_len = x->msg_len;
        }
        int rc = cx_zmq_submit_one(b, e, p);
        if (rc != CX_OK) {
            g->status = rc;
            break;
        }
        p->bp[4] = g;
        p->bp[5] = (void *)1;
        g->busy[k] = 1;
        g->out++;
        e->large_out++;
        g->next += len;
    }
    if (g->status != CX_OK || g->next == x->len) e->cur = NULL;
}

/* Ends a large transfer with nothing in flight that will not send more; returns its xfer to
 * complete (the caller completes it once it is done with the endpoint), else NULL. */
static cx_xfer_t *big_end(struct cx_bep *e, struct cx_zmq_big *g, int *status)
{
    if (g->out || (g->status == CX_OK && g->next < g->x->len)) return NULL;
    if (e->cur == g) e->cur = NULL;
    cx_xfer_t *x = g->x;
    *status = g->status;
    free(g);
    return x;
}

/* Starts x now: a large transfer as the current one, anything else as one request. */
static int send_now(cx_backend_t *b, struct cx_bep *e, cx_xfer_t *x)
{
    if (x->kind != CX_XFER_MSG && x->len > CX_ZMQ_PIECE) {
        struct cx_zmq_big *g = calloc(1, sizeof *g);
        if (!g) {
            cx_warn("zmq: no memory for a %zu-byte transfer's pieces", x->len);
            return CX_ENOMEM;
        }
        g->x = x;
        e->cur = g;
        pump(b, e);
        if (!g->out && g->status != CX_OK) { /* nothing went: not started, never completed */
            int rc = g->status;
            if (e->cur == g) e->cur = NULL;
            free(g);
            return rc;
        }
        return CX_OK; /* a later piece refused: it ends with it once the others are back */
    }
    int rc = cx_zmq_submit_one(b, e, x);
    if (rc == CX_OK && is_large(x)) {
        x->bp[5] = (void *)1;
        e->large_out++;
    }
    return rc;
}

int cx_zmq_submit(cx_backend_t *b, cx_bep_t *e, cx_xfer_t *x)
{
    x->bp[4] = x->bp[5] = NULL;
    int wait = (is_large(x) && (e->large_out >= CX_ZMQ_WINDOW || e->cur || e->wq_head)) ||
        (keeps_order(x) && (e->cur || e->wq_head));
    if (!wait) return send_now(b, e, x);
    wq_push(e, x);
    return CX_OK;
}

/* What waits, as far as the window lets it: the current large transfer first, then the queue in
 * order. A waiting xfer that cannot be sent is completed with the error (it was accepted). */
static void flow_run(cx_backend_t *b, struct cx_bep *e)
{
    if (e->cur) pump(b, e);
    while (e->wq_head && !e->cur) {
        cx_xfer_t *x = e->wq_head;
        if (is_large(x) && e->large_out >= CX_ZMQ_WINDOW) break;
        wq_pop(e);
        int rc = send_now(b, e, x);
        if (rc != CX_OK) cx_core_xfer_done(b->core, x, rc);
    }
}

void cx_zmq_flow_done(cx_backend_t *b, struct cx_bep *e, cx_xfer_t *x, int status)
{
    if (!x->bp[5]) {
        cx_core_xfer_done(b->core, x, status);
        return;
    }
    e->large_out--;
    cx_xfer_t *done = x;
    if (x->bp[4]) { /* a piece */
        struct cx_zmq_big *g = x->bp[4];
        g->busy[x - g->piece] = 0;
        g->out--;
        if (status != CX_OK && g->status == CX_OK) g->status = status;
        if (e->cur == g && g->status != CX_OK) e->cur = NULL; /* nothing more of it goes */
        done = NULL;
        flow_run(b, e);
        done = big_end(e, g, &status);
    } else {
        flow_run(b, e);
    }
    if (done) cx_core_xfer_done(b->core, done, status);
}

void cx_zmq_flow_close(cx_backend_t *b, struct cx_bep *e)
{
    struct cx_zmq_big *cur = e->cur;
    if (cur && cur->status == CX_OK) cur->status = CX_EPEER; /* no more of it goes */
    e->cur = NULL;
    while (e->head) {
        cx_xfer_t *x = e->head;
        cx_zmq_out_del(e, x);
        if (x->bp[4]) {
            struct cx_zmq_big *g = x->bp[4];
            g->busy[x - g->piece] = 0;
            g->out--;
            if (g->status == CX_OK) g->status = CX_EPEER;
            int st, was_cur = g == cur;
            cx_xfer_t *done = big_end(e, g, &st);
            if (done && was_cur) cur = NULL;
            if (done) cx_core_xfer_done(b->core, done, st);
        } else {
            cx_core_xfer_done(b->core, x, CX_EPEER);
        }
    }
    if (cur) { /* current, with no piece in flight (the window was full with others) */
        int st;
        cx_xfer_t *done = big_end(e, cur, &st);
        if (done) cx_core_xfer_done(b->core, done, st);
    }
    for (cx_xfer_t *x; (x = wq_pop(e));) cx_core_xfer_done(b->core, x, CX_EPEER);
}
