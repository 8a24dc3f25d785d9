/* Transfers larger than CX_ZMQ_PIECE go as several single requests (pieces) of at most that many
 * bytes, CX_ZMQ_PIECES_OUT in flight, completed together (zmq_int.h).
 *
 * A libzmq message is one malloc on each side (zmq_msg_init_size for our request, the decoder's
 * buffer at the receiver), and large transfers as one message collapsed: glibc serves a block
 * above its mmap threshold (at most 32 MiB) with a fresh mmap, every page of it faulted in before
 * the bytes land. Host reads of 24 MiB took 9 ms here (2.7 GB/s), of 32 MiB 127 ms and of 64 MiB
 * 266 ms (0.25 GB/s; a raw libzmq loop the same). Pieces come from the heap once the first one
 * was freed (the threshold rises to its size), but glibc then also trims the heap's top back to
 * the OS past twice that, so the pieces in flight must stay within two: 64 MiB reads / writes
 * took 18-21 / 24 ms in 4 MiB pieces two at a time, 20-24 / 27 ms in 8 MiB two at a time, and
 * 85-184 ms with 8 MiB four at a time, 2 MiB four at a time or 1 MiB eight at a time, where every
 * free trimmed and every piece faulted again. A library may not retune the process's malloc
 * (mallopt). Bounded pieces in flight also keep a 1 GiB write from copying 1 GiB into libzmq's
 * queues at once.
 *
 * Pieces are ordinary requests on the wire, so any target serves them. A put_signal's pieces go
 * as writes and its last piece, with the message, only once every other piece completed: the
 * target delivers the message after the last piece is in place, and the others are then in
 * place too, whatever became of them at the target in between. A failed piece stops the rest;
 * the transfer ends with the first failure once no piece is in flight. Disconnect completes the
 * pieces in flight like any request (CX_EPEER), and with them the transfer. */
#include "zmq_int.h"

#include "connex/log.h"

#include <stdlib.h>
#include <string.h>

struct cx_zmq_big {
    cx_xfer_t *x; /* the core's */
    size_t next;  /* where the next piece starts */
    unsigned out; /* pieces in flight */
    int status;   /* the first failure */
    cx_xfer_t piece[CX_ZMQ_PIECES_OUT];
    uint8_t busy[CX_ZMQ_PIECES_OUT];
};

/* Sends pieces while fewer than CX_ZMQ_PIECES_OUT are in flight. A put_signal's last one waits
 * for the others. Returns what sending the first refused piece said (CX_OK: none). */
static int pump(cx_backend_t *b, cx_bep_t *e, struct cx_zmq_big *g)
{
    cx_xfer_t *x = g->x;
    while (g->status == CX_OK && g->next < x->len && g->out < CX_ZMQ_PIECES_OUT) {
        size_t len = x->len - g->next < CX_ZMQ_PIECE ? x->len - g->next : CX_ZMQ_PIECE;
        int last = g->next + len == x->len;
        if (last && x->kind == CX_XFER_PUT_SIGNAL && g->out) return CX_OK;
        unsigned k = 0;
        while (g->busy[k]) k++; /* out < CX_ZMQ_PIECES_OUT: one is free */
        cx_xfer_t *p = &g->piece[k];
        memset(p, 0, sizeof *p);
        p->kind = last && x->kind == CX_XFER_PUT_SIGNAL ? CX_XFER_PUT_SIGNAL
            : x->kind == CX_XFER_READ                   ? CX_XFER_READ
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
            return rc;
        }
        p->bp[4] = g;
        g->busy[k] = 1;
        g->out++;
        g->next += len;
    }
    return CX_OK;
}

int cx_zmq_submit_big(cx_backend_t *b, cx_bep_t *e, cx_xfer_t *x)
{
    struct cx_zmq_big *g = calloc(1, sizeof *g);
    if (!g) {
        cx_warn("zmq: no memory for a %zu-byte transfer's pieces", x->len);
        return CX_ENOMEM;
    }
    g->x = x;
    int rc = pump(b, e, g);
    if (!g->out) { /* nothing went: not started, and never completed (backend.h) */
        free(g);
        return rc;
    }
    return CX_OK; /* a later piece refused: the transfer ends with it once the others are back */
}

void cx_zmq_piece_done(cx_backend_t *b, cx_bep_t *e, cx_xfer_t *p, int status)
{
    struct cx_zmq_big *g = p->bp[4];
    g->busy[p - g->piece] = 0;
    g->out--;
    if (status != CX_OK && g->status == CX_OK) g->status = status;
    if (e) pump(b, e, g); /* NULL: the endpoint is closing, nothing more goes */
    if (g->out || (g->status == CX_OK && g->next < g->x->len)) return;
    cx_xfer_t *x = g->x;
    int st = g->status;
    free(g);
    cx_core_xfer_done(b->core, x, st);
}
