/* Batches to a peer of wire version 2: a run of reads (or of writes) to one endpoint goes as one
 * batch frame, and comes back as one reply with a status per entry (zmq_int.h). A peer of
 * version 1, and any entry that does not fit a frame, gets the single requests it always did. */
#include "zmq_int.h"

#include "connex/log.h"

#include <errno.h>
#include <string.h>

/* Entries from CX_ZMQ_ZEROCOPY_MIN on go as single requests: their fixed cost is small beside
 * their bytes, and a single read's reply is sent from the registered region without a copy. In
 * frames, 32 x 1 MiB reads took several times as long as single requests (one 4 MiB reply is
 * copied whole at each end before the next step starts, where 1 MiB replies overlap). */
static int frameable(const cx_xfer_t *x)
{
    return (x->kind == CX_XFER_READ || x->kind == CX_XFER_WRITE) && x->len && x->len < CX_ZMQ_ZEROCOPY_MIN;
}

/* One frame for xs[0..n), all of one kind; CX_OK, or what a single submit would have returned. */
static int send_frame(struct cx_backend *b, struct cx_bep *e, cx_xfer_t *const *xs, uint32_t n, size_t bytes)
{
    int kind = xs[0]->kind;
    size_t head = CX_ZMQ_BREQ_HDR + (size_t)n * CX_ZMQ_BENT;
    size_t dlen = kind == CX_XFER_WRITE ? bytes : 0;
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, head + dlen)) {
        cx_warn("zmq: no memory for a %zu-byte batch frame", head + dlen);
        return CX_ENOMEM;
    }
    uint8_t *p = zmq_msg_data(&m);
    cx_zmq_breq_t r = { .kind = (uint8_t)kind, .id = b->next_id++, .sender = b->incarnation, .n = n };
    cx_zmq_breq_put(p, &r);
    uint8_t *d = p + head;
    for (uint32_t i = 0; i < n; i++) {
        cx_zmq_bent_put(p, i, xs[i]->remote, xs[i]->len);
        if (dlen) {
            memcpy(d, xs[i]->local, xs[i]->len);
            d += xs[i]->len;
        }
    }
    /* One frame, as a single request is (cx_zmq_submit says why never multipart). */
    if (zmq_msg_send(&m, e->sock, 0) < 0) {
        int err = zmq_errno();
        cx_warn("zmq: send of a %u-entry batch frame failed: %s", n, zmq_strerror(err));
        zmq_msg_close(&m);
        cx_core_peer_error(b->core, e->peer, CX_CAUSE_LOCAL, "zmq: send failed");
        return err == EAGAIN ? CX_EAGAIN : err == ENOMEM ? CX_ENOMEM : CX_ERR;
    }
    for (uint32_t i = 0; i < n; i++) {
        xs[i]->bp[2] = (void *)(uintptr_t)r.id;
        xs[i]->bp[3] = (void *)(uintptr_t)(i + 1);
        xs[i]->bp[4] = xs[i]->bp[5] = NULL;
        cx_zmq_out_add(e, xs[i]);
    }
    return CX_OK;
}

void cx_zmq_submit_batch(cx_backend_t *b, cx_bep_t *e, cx_xfer_t *const *xs, size_t n, int *rcs)
{
    for (size_t i = 0, j; i < n; i = j) {
        j = i + 1;
        if (e->version < 2 || !frameable(xs[i])) {
            rcs[i] = cx_zmq_submit(b, e, xs[i]);
            continue;
        }
        size_t bytes = xs[i]->len;
        while (j < n && j - i < CX_ZMQ_FRAME_ENTRIES && frameable(xs[j]) && xs[j]->kind == xs[i]->kind &&
               bytes + xs[j]->len <= CX_ZMQ_FRAME_BYTES)
            bytes += xs[j++]->len;
        if (j - i == 1) {
            rcs[i] = cx_zmq_submit(b, e, xs[i]); /* a lone entry is the single request it is */
            continue;
        }
        int rc = send_frame(b, e, xs + i, (uint32_t)(j - i), bytes);
        for (size_t k = i; k < j; k++) rcs[k] = rc;
    }
}

/* Checks that the data parts hold exactly the bytes of the entries that succeeded, each whole
 * inside one part; copies them only then. */
static int read_data(cx_xfer_t **fx, const int *st, uint32_t n, zmq_msg_t *parts, int np, int copy)
{
    int k = 1;
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (st[i] != CX_OK) continue;
        if (k < np && off == zmq_msg_size(&parts[k])) {
            k++;
            off = 0;
        }
        if (k >= np || zmq_msg_size(&parts[k]) - off < fx[i]->len) return CX_ERR;
        if (copy) memcpy(fx[i]->local, (const uint8_t *)zmq_msg_data(&parts[k]) + off, fx[i]->len);
        off += fx[i]->len;
    }
    if (np > 1 && (k != np - 1 || off != zmq_msg_size(&parts[k]))) return CX_ERR;
    return CX_OK;
}

void cx_zmq_batch_reply(struct cx_backend *b, struct cx_bep *e, cx_xfer_t *x, zmq_msg_t *parts, int np)
{
    /* The frame's xfers: x and those after it with its id (added together, ended together). */
    uint64_t id = (uint64_t)(uintptr_t)x->bp[2];
    cx_xfer_t **fx = b->fx;
    uint32_t n = 0;
    for (cx_xfer_t *y = x; y && (uint64_t)(uintptr_t)y->bp[2] == id && n < CX_ZMQ_FRAME_ENTRIES; y = y->bp[0])
        fx[n++] = y;
    for (uint32_t i = 0; i < n; i++) cx_zmq_out_del(e, fx[i]);
    int st[CX_ZMQ_FRAME_ENTRIES];
    cx_zmq_brep_t rep;
    int bad = cx_zmq_brep_get(zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0]), &rep);
    if (bad || (rep.status == CX_OK && rep.n != n) || (uintptr_t)x->bp[3] != 1) {
        cx_warn("zmq: malformed reply to a %u-entry batch frame: its entries fail", n);
        bad = 1;
    }
    for (uint32_t i = 0; i < n; i++) st[i] = bad ? CX_ERR : rep.status != CX_OK ? rep.status : cx_zmq_brep_st(&rep, i);
    if (!bad && x->kind == CX_XFER_READ) {
        if (read_data(fx, st, n, parts, np, 0)) {
            cx_warn("zmq: reply to a %u-entry batch read does not carry its bytes: its entries fail", n);
            for (uint32_t i = 0; i < n; i++) st[i] = CX_ERR;
        } else {
            read_data(fx, st, n, parts, np, 1);
        }
    } else if (!bad && np != 1) {
        cx_warn("zmq: reply to a %u-entry batch write carries data: its entries fail", n);
        for (uint32_t i = 0; i < n; i++) st[i] = CX_ERR;
    }
    for (uint32_t i = 0; i < n; i++) cx_core_xfer_done(b->core, fx[i], st[i]);
}
