/* ZeroMQ backend internals. One ROUTER socket serves requests from every peer; one DEALER per
 * peer endpoint sends ours. The target's progress thread serves reads and writes from its
 * registered regions (bounds-checked by the core), so this backend is one-sided in API only. */
#ifndef CX_ZMQ_INT_H
#define CX_ZMQ_INT_H

#include "connex/backend.h"

#include <stdint.h>
#include <zmq.h>

#define CX_ZMQ_REQ_HDR 40
#define CX_ZMQ_REP_HDR 12
#define CX_ZMQ_ZEROCOPY_MIN (64u << 10) /* below this a copy is cheaper than the bookkeeping */

/* Wire version 2 adds the batch frame (below); a target advertises it in its address blob
 * (cx_zmq_addr_get), and only a peer that did gets one. Single-op frames are those of version 1,
 * so that peers of either version serve each other's. */
#define CX_ZMQ_WIRE_VERSION 2
#define CX_ZMQ_BREQ_HDR 32
#define CX_ZMQ_BENT 16                /* an entry of a batch frame: u64 addr, u64 len */
#define CX_ZMQ_BREP_HDR 16            /* then a status (i32) per entry */
#define CX_ZMQ_FRAME_ENTRIES 1024     /* most entries in one batch frame */
#define CX_ZMQ_FRAME_BYTES (4u << 20) /* most bytes one batch frame moves (its entries' lengths) */

/* A request is one frame (never multipart, cx_zmq_submit): this header, then a WRITE's or
 * PUT_SIGNAL's len data bytes, then a PUT_SIGNAL's or MSG's message (the rest of the frame). */
typedef struct cx_zmq_req { /* the head of a request */
    uint8_t kind;           /* CX_XFER_* */
    uint64_t id;            /* echoed in the reply */
    uint64_t sender;        /* sender's incarnation */
    uint64_t addr;          /* remote address (READ/WRITE/PUT_SIGNAL) */
    uint64_t len;           /* READ/WRITE/PUT_SIGNAL: data length; MSG: 0 */
} cx_zmq_req_t;

typedef struct cx_zmq_rep { /* frame 1 of a reply; frame 2 is the data of a READ */
    uint64_t id;
    int32_t status;
} cx_zmq_rep_t;

void cx_zmq_req_put(uint8_t *buf, const cx_zmq_req_t *r);
int cx_zmq_req_get(const void *buf, size_t len, cx_zmq_req_t *r); /* CX_EINVAL if malformed */
void cx_zmq_rep_put(uint8_t *buf, const cx_zmq_rep_t *r);
int cx_zmq_rep_get(const void *buf, size_t len, cx_zmq_rep_t *r);

/* A batch frame: one frame (never multipart, as a single request) of CX_ZMQ_BREQ_HDR bytes, n
 * entries (CX_ZMQ_BENT each), then a WRITE's entries' data back to back; its entries' lengths add
 * up to CX_ZMQ_FRAME_BYTES at most. Its reply is multipart: the head (id, the frame's status, n, a
 * status per entry), then for a READ one part: the bytes of the entries that succeeded, back to
 * back in order (no part when none did). */
typedef struct cx_zmq_breq {
    uint8_t kind; /* CX_XFER_READ or CX_XFER_WRITE */
    uint64_t id;  /* echoed in the reply */
    uint64_t sender;
    uint32_t n;
    const uint8_t *ents; /* cx_zmq_breq_check: the first entry, inside the frame */
    uint64_t data_len;   /* cx_zmq_breq_check: a WRITE's data bytes */
} cx_zmq_breq_t;

typedef struct cx_zmq_brep {
    uint64_t id;
    int32_t status; /* CX_OK, or why the whole frame was refused (then n is 0) */
    uint32_t n;
    const uint8_t *st; /* n statuses, inside the head */
} cx_zmq_brep_t;

void cx_zmq_breq_put(uint8_t *buf, const cx_zmq_breq_t *r);
void cx_zmq_bent_put(uint8_t *buf, uint32_t i, uint64_t addr, uint64_t len); /* buf: the frame */
/* The head alone (CX_EINVAL: not a batch frame). Then cx_zmq_breq_check: CX_EINVAL when the
 * kind, the count or the frame's size does not add up. */
int cx_zmq_breq_head(const void *buf, size_t len, cx_zmq_breq_t *r);
int cx_zmq_breq_check(const void *buf, size_t len, cx_zmq_breq_t *r);
void cx_zmq_bent_get(const cx_zmq_breq_t *r, uint32_t i, uint64_t *addr, uint64_t *len);
size_t cx_zmq_brep_size(uint32_t n);
void cx_zmq_brep_put(uint8_t *buf, uint64_t id, int32_t status, const int32_t *st, uint32_t n);
int cx_zmq_brep_get(const void *buf, size_t len, cx_zmq_brep_t *r);
int32_t cx_zmq_brep_st(const cx_zmq_brep_t *r, uint32_t i);

/* The address blob. Version 2 advertises "tcp://0.0.0.0:0;host:port" ("tcp://[::]:0;[host]:port"
 * for IPv6): libzmq's source-address form, so that a version 1 peer, which hands the whole blob
 * to zmq_connect (and which refuses anything after the port), connects from any address and any
 * port, as it would without it. put: CX_EINVAL if it does not fit. get: the endpoint to connect
 * to (NUL-terminated, at most cap bytes with it) and the wire version the peer speaks; CX_EINVAL
 * for a malformed blob. */
int cx_zmq_addr_put(char *buf, size_t cap, const char *endpoint, int ipv6);
int cx_zmq_addr_get(const void *blob, size_t len, char *ep, size_t cap, int *version);

struct cx_bep {
    void *sock; /* DEALER */
    int fd;
    int version; /* the peer's wire version: 2 takes batch frames */
    void *peer;  /* core's cookie */
    /* Outstanding xfers, oldest first (bp[0] next, bp[1] prev, bp[2] id): the target serves a
     * DEALER's requests in order, so a reply is for the oldest or close to it. */
    cx_xfer_t *head, *tail;
    /* The send window (zmq_flow.c): large requests in flight, the xfers waiting (in order, bp[0]
     * next), the large transfer whose pieces are going out. */
    unsigned large_out;
    cx_xfer_t *wq_head, *wq_tail;
    struct cx_zmq_big *cur;
    struct cx_bep *next, *prev;
};

struct cx_backend {
    cx_core_t *core;
    uint64_t incarnation;
    void *ctx;
    void *router;
    int router_fd;
    int epfd;           /* the ZMQ_FDs of every socket; the core polls this one fd */
    char endpoint[192]; /* the address blob (cx_zmq_addr_put) */
    uint64_t next_id;
    struct cx_bep *eps;
    cx_xfer_t **fx; /* a batch reply's xfers, CX_ZMQ_FRAME_ENTRIES */
    int32_t *tst;   /* target: a batch frame's statuses, CX_ZMQ_FRAME_ENTRIES */
    void **tpin;    /* target: its read entries' pins */
};

/* Serves every request waiting on the ROUTER socket. */
int cx_zmq_serve(struct cx_backend *b); /* 1: more waiting */
/* Receives a multipart message into at most max parts; returns the number of parts, or -1 when
 * nothing is waiting; extra parts are drained and reported by *truncated. */
int cx_zmq_recv_parts(void *sock, zmq_msg_t *parts, int max, int *truncated);
void cx_zmq_close_parts(zmq_msg_t *parts, int n);
int cx_zmq_readable(void *sock);

/* Outstanding xfers of an endpoint (zmq_backend.c): bp[0] next, bp[1] prev, bp[2] the request
 * id, bp[3] 0 for a single request, else the xfer's place in its batch frame, from 1, bp[4] and
 * bp[5] the send window's (zmq_flow.c). */
void cx_zmq_out_add(struct cx_bep *e, cx_xfer_t *x);
void cx_zmq_out_del(struct cx_bep *e, cx_xfer_t *x);
int cx_zmq_submit(cx_backend_t *b, cx_bep_t *e, cx_xfer_t *x);
/* One request for x as it is, now, whatever its size (cx_zmq_submit applies the window). */
int cx_zmq_submit_one(cx_backend_t *b, cx_bep_t *e, cx_xfer_t *x);

/* zmq_flow.c: the send window. A read or write of CX_ZMQ_ZEROCOPY_MIN bytes or more is large:
 * CX_ZMQ_WINDOW of them are in flight per endpoint, the rest wait in order (messages and
 * put_signals behind them too); one of more than CX_ZMQ_PIECE bytes goes as pieces of at most
 * that many, each a single request through the window. cx_zmq_submit is the ops table's submit.
 * A request counted in the window has bp[5] set, a piece bp[4] pointing at its transfer (both
 * NULL on every other request). cx_zmq_flow_done takes every single request's completion in
 * place of cx_core_xfer_done; cx_zmq_flow_close completes what is in flight and what waits as
 * the endpoint closes (CX_EPEER). */
#define CX_ZMQ_PIECE (4u << 20)
#define CX_ZMQ_WINDOW 2u
void cx_zmq_flow_done(cx_backend_t *b, cx_bep_t *e, cx_xfer_t *x, int status);
void cx_zmq_flow_close(cx_backend_t *b, cx_bep_t *e);
/* zmq_batch.c: the ops table's submit_batch, and the reply to a batch frame whose first xfer is x
 * (parts[0] is its head). */
void cx_zmq_submit_batch(cx_backend_t *b, cx_bep_t *e, cx_xfer_t *const *xs, size_t n, int *rcs);
void cx_zmq_batch_reply(struct cx_backend *b, struct cx_bep *e, cx_xfer_t *x, zmq_msg_t *parts, int np);

#endif
