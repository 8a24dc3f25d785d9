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

/* A request is one frame (never multipart, zmq_be_submit): this header, then a WRITE's or
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

struct cx_bep {
    void *sock; /* DEALER */
    int fd;
    void *peer; /* core's cookie */
    /* Outstanding xfers, oldest first (bp[0] next, bp[1] prev, bp[2] id): the target serves a
     * DEALER's requests in order, so a reply is for the oldest or close to it. */
    cx_xfer_t *head, *tail;
    struct cx_bep *next, *prev;
};

struct cx_backend {
    cx_core_t *core;
    uint64_t incarnation;
    void *ctx;
    void *router;
    int router_fd;
    int epfd; /* the ZMQ_FDs of every socket; the core polls this one fd */
    char endpoint[128];
    uint64_t next_id;
    struct cx_bep *eps;
};

/* Serves every request waiting on the ROUTER socket. */
int cx_zmq_serve(struct cx_backend *b); /* 1: more waiting */
/* Receives a multipart message into at most max parts; returns the number of parts, or -1 when
 * nothing is waiting; extra parts are drained and reported by *truncated. */
int cx_zmq_recv_parts(void *sock, zmq_msg_t *parts, int max, int *truncated);
void cx_zmq_close_parts(zmq_msg_t *parts, int n);
int cx_zmq_readable(void *sock);

#endif
