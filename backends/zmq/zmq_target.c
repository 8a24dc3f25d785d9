/* The target side: requests from peers, served from this engine's registered regions. Every
 * request gets a reply (or, when it cannot even be parsed, a log line and a count). */
#include "zmq_int.h"

#include "connex/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void unpin_cb(void *data, void *hint)
{
    (void)data;
    cx_core_region_unpin(hint);
}

static void reply(struct cx_backend *b, zmq_msg_t *ident, uint64_t id, int status, zmq_msg_t *data)
{
    uint8_t hdr[CX_ZMQ_REP_HDR];
    cx_zmq_rep_t rep = { .id = id, .status = status };
    cx_zmq_rep_put(hdr, &rep);
    zmq_msg_t idc;
    zmq_msg_init(&idc);
    zmq_msg_copy(&idc, ident);
    if (zmq_msg_send(&idc, b->router, ZMQ_SNDMORE) < 0 ||
        zmq_send(b->router, hdr, sizeof hdr, data ? ZMQ_SNDMORE : 0) < 0 ||
        (data && zmq_msg_send(data, b->router, 0) < 0)) {
        /* The requester's socket is gone (it timed out or died): nobody to tell. */
        cx_debug("zmq: reply undeliverable: %s", zmq_strerror(zmq_errno()));
        zmq_msg_close(&idc);
        if (data) zmq_msg_close(data);
    }
}

static void serve_one(struct cx_backend *b, zmq_msg_t *parts, int n)
{
    cx_zmq_req_t r;
    size_t fsz = n >= 2 ? zmq_msg_size(&parts[1]) : 0;
    if (n < 2 || fsz < CX_ZMQ_REQ_HDR || cx_zmq_req_get(zmq_msg_data(&parts[1]), CX_ZMQ_REQ_HDR, &r)) {
        cx_warn("zmq: malformed request (%d frames, the first %zu bytes) dropped", n - 1, fsz);
        cx_core_count_served(b->core, -1, 0, 0);
        return;
    }
    if (n != 2) {
        /* Older versions of connex sent header, data and message as separate frames. */
        cx_warn("zmq: request kind %u in %d frames (one expected; a peer of an older version?): refused", r.kind,
                n - 1);
        cx_core_count_served(b->core, r.kind, 0, 0);
        reply(b, &parts[0], r.id, CX_EINVAL, NULL);
        return;
    }
    void *peer = cx_core_peer_by_incarnation(b->core, r.sender);
    if (!peer) {
        cx_warn("zmq: request from an unknown sender %016llx refused", (unsigned long long)r.sender);
        cx_core_count_served(b->core, r.kind, 0, 0);
        reply(b, &parts[0], r.id, CX_EPEER, NULL);
        return;
    }
    /* One frame (zmq_be_submit): header, a write's r.len data bytes, then a message (the rest). */
    const uint8_t *body = (const uint8_t *)zmq_msg_data(&parts[1]) + CX_ZMQ_REQ_HDR;
    size_t blen = fsz - CX_ZMQ_REQ_HDR;
    int has_data = r.kind == CX_XFER_WRITE || r.kind == CX_XFER_PUT_SIGNAL;
    int has_msg = r.kind == CX_XFER_PUT_SIGNAL || r.kind == CX_XFER_MSG;
    const uint8_t *data = has_data ? body : NULL;
    const uint8_t *msg = NULL;
    size_t msg_len = 0;
    int bad =
        (has_data && blen < r.len) || (r.kind != CX_XFER_MSG && r.len == 0) || (r.kind == CX_XFER_MSG && r.len != 0);
    if (!bad) {
        size_t dlen = has_data ? (size_t)r.len : 0;
        msg = body + dlen;
        msg_len = blen - dlen;
        bad = !has_msg && msg_len;
    }
    if (bad) {
        cx_warn("zmq: request kind %u of %zu bytes for %llu data bytes does not add up: refused", r.kind, blen,
                (unsigned long long)r.len);
        cx_core_count_served(b->core, r.kind, 0, 0);
        reply(b, &parts[0], r.id, CX_EINVAL, NULL);
        return;
    }
    int st = CX_OK;
    void *pin = NULL;
    if (r.kind != CX_XFER_MSG) {
        st = cx_core_region_check(b->core, r.addr, r.len, r.kind == CX_XFER_READ ? &pin : NULL);
        if (st) {
            cx_core_count_served(b->core, r.kind, 0, 0);
            reply(b, &parts[0], r.id, st, NULL);
            return;
        }
    }
    void *where = (void *)(uintptr_t)r.addr;
    switch (r.kind) {
    case CX_XFER_READ: {
        zmq_msg_t out;
        /* Device memory is copied out by the core (libzmq would read it on its I/O thread). */
        if (r.len >= CX_ZMQ_ZEROCOPY_MIN && cx_core_region_kind(b->core, r.addr, r.len) == CX_MEM_HOST) {
            /* Zero copy: the region stays pinned (unregister waits) until libzmq has sent it. */
            if (zmq_msg_init_data(&out, where, r.len, unpin_cb, pin)) {
                cx_core_region_unpin(pin);
                st = CX_ENOMEM;
            }
        } else {
            if (zmq_msg_init_size(&out, r.len))
                st = CX_ENOMEM;
            else if ((st = cx_core_mem_copy(b->core, zmq_msg_data(&out), where, r.len)))
                zmq_msg_close(&out);
            cx_core_region_unpin(pin);
        }
        cx_core_count_served(b->core, r.kind, r.len, st == CX_OK);
        reply(b, &parts[0], r.id, st, st == CX_OK ? &out : NULL);
        return;
    }
    case CX_XFER_WRITE:
    case CX_XFER_PUT_SIGNAL:
        st = cx_core_mem_copy(b->core, where, data, r.len);
        /* put_signal: the data is in place (device copies included) before the message is queued. */
        if (st == CX_OK && r.kind == CX_XFER_PUT_SIGNAL) st = cx_core_deliver_msg(b->core, peer, msg, msg_len);
        break;
    case CX_XFER_MSG: st = cx_core_deliver_msg(b->core, peer, msg, msg_len); break;
    }
    /* Served only when the copy and the delivery succeeded; otherwise a rejection. */
    cx_core_count_served(b->core, r.kind, r.kind == CX_XFER_MSG ? msg_len : r.len, st == CX_OK);
    reply(b, &parts[0], r.id, st, NULL);
}

int cx_zmq_serve(struct cx_backend *b)
{
    for (int budget = 0;; budget++) {
        if (!cx_zmq_readable(b->router)) return 0;
        if (budget == 256) return 1;
        zmq_msg_t parts[5];
        int trunc;
        int n = cx_zmq_recv_parts(b->router, parts, 5, &trunc);
        if (n < 0) return 0;
        if (trunc) {
            cx_warn("zmq: request with too many parts dropped");
            cx_core_count_served(b->core, -1, 0, 0);
        } else {
            serve_one(b, parts, n);
        }
        cx_zmq_close_parts(parts, n);
    }
}
