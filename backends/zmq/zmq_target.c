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

/* A batch frame's reply: the head, then parts[0..np) (a read's bytes). */
static void breply(struct cx_backend *b, zmq_msg_t *ident, uint64_t id, int status, uint32_t n, zmq_msg_t *parts,
                   int np)
{
    zmq_msg_t idc, head;
    zmq_msg_init(&idc);
    zmq_msg_copy(&idc, ident);
    int k = 0, have_head = zmq_msg_init_size(&head, cx_zmq_brep_size(n)) == 0;
    int ok = have_head;
    if (ok) {
        cx_zmq_brep_put(zmq_msg_data(&head), id, status, b->tst, n);
        ok = zmq_msg_send(&idc, b->router, ZMQ_SNDMORE) >= 0 &&
            zmq_msg_send(&head, b->router, np ? ZMQ_SNDMORE : 0) >= 0;
    }
    while (ok && k < np) {
        if (zmq_msg_send(&parts[k], b->router, k + 1 < np ? ZMQ_SNDMORE : 0) < 0)
            ok = 0;
        else
            k++;
    }
    if (!ok) {
        /* The requester's socket is gone (it timed out or died): nobody to tell. A message that
         * was sent is empty now, so closing every one is safe. */
        cx_debug("zmq: batch reply undeliverable: %s", zmq_strerror(zmq_errno()));
        zmq_msg_close(&idc);
        if (have_head) zmq_msg_close(&head);
        cx_zmq_close_parts(parts + k, np - k);
    }
}

/* A read's entries that succeeded, copied back to back into one part (at most
 * CX_ZMQ_FRAME_BYTES, cx_zmq_breq_check); the pins taken by the check are dropped. An entry
 * whose copy fails gets its status and no bytes. Returns the part count (0 or 1). */
static int read_part(struct cx_backend *b, const cx_zmq_breq_t *r, zmq_msg_t *m)
{
    size_t sum = 0, off = 0;
    for (uint32_t i = 0; i < r->n; i++) {
        uint64_t a, l;
        cx_zmq_bent_get(r, i, &a, &l);
        if (b->tst[i] == CX_OK) sum += l;
    }
    int have = sum && zmq_msg_init_size(m, sum) == 0;
    for (uint32_t i = 0; i < r->n; i++) {
        uint64_t a, l;
        cx_zmq_bent_get(r, i, &a, &l);
        if (b->tst[i] != CX_OK) continue;
        if (!have)
            b->tst[i] = CX_ENOMEM;
        else if ((b->tst[i] = cx_core_mem_copy(b->core, (uint8_t *)zmq_msg_data(m) + off, (void *)(uintptr_t)a, l)) ==
                 CX_OK)
            off += l;
        cx_core_region_unpin(b->tpin[i]);
    }
    if (have && off < sum) { /* a copy failed: the part holds only the entries that made it */
        zmq_msg_t t;
        if (off && zmq_msg_init_size(&t, off) == 0) {
            memcpy(zmq_msg_data(&t), zmq_msg_data(m), off);
            zmq_msg_close(m);
            *m = t;
            return 1;
        }
        for (uint32_t i = 0; i < r->n; i++)
            if (b->tst[i] == CX_OK) b->tst[i] = CX_ENOMEM;
        zmq_msg_close(m);
        return 0;
    }
    return have;
}

/* A batch frame (zmq_int.h) whose head parsed: every entry checked against the registry and
 * served as the single request would be, its status in the reply. */
static void serve_batch(struct cx_backend *b, zmq_msg_t *parts, int n)
{
    cx_zmq_breq_t r;
    const void *f = zmq_msg_data(&parts[1]);
    size_t fsz = zmq_msg_size(&parts[1]);
    if (n != 2 || cx_zmq_breq_check(f, fsz, &r)) {
        cx_warn("zmq: batch frame of %d parts, %zu bytes, kind %u, %u entries does not add up: refused", n - 1, fsz,
                r.kind, r.n);
        cx_core_count_served(b->core, r.kind <= CX_XFER_MSG ? r.kind : -1, 0, 0);
        breply(b, &parts[0], r.id, CX_EINVAL, 0, NULL, 0);
        return;
    }
    void *peer = cx_core_peer_by_incarnation(b->core, r.sender);
    if (!peer) {
        cx_warn("zmq: batch frame from an unknown sender %016llx refused", (unsigned long long)r.sender);
        for (uint32_t i = 0; i < r.n; i++) cx_core_count_served(b->core, r.kind, 0, 0);
        breply(b, &parts[0], r.id, CX_EPEER, 0, NULL, 0);
        return;
    }
    const uint8_t *data = r.ents + (size_t)r.n * CX_ZMQ_BENT;
    for (uint32_t i = 0; i < r.n; i++) {
        uint64_t addr, len;
        cx_zmq_bent_get(&r, i, &addr, &len);
        b->tpin[i] = NULL;
        if (!len) {
            cx_warn("zmq: batch entry %u of zero length refused", i);
            b->tst[i] = CX_EINVAL;
        } else {
            b->tst[i] = cx_core_region_check(b->core, addr, len, r.kind == CX_XFER_READ ? &b->tpin[i] : NULL);
        }
        if (r.kind == CX_XFER_WRITE) {
            if (b->tst[i] == CX_OK) b->tst[i] = cx_core_mem_copy(b->core, (void *)(uintptr_t)addr, data, len);
            data += len;
            cx_core_count_served(b->core, r.kind, len, b->tst[i] == CX_OK);
        }
    }
    int np = 0;
    zmq_msg_t rd;
    if (r.kind == CX_XFER_READ) {
        np = read_part(b, &r, &rd);
        for (uint32_t i = 0; i < r.n; i++) {
            uint64_t addr, len;
            cx_zmq_bent_get(&r, i, &addr, &len);
            cx_core_count_served(b->core, r.kind, len, b->tst[i] == CX_OK);
        }
    }
    breply(b, &parts[0], r.id, CX_OK, r.n, &rd, np);
}

static void serve_one(struct cx_backend *b, zmq_msg_t *parts, int n)
{
    cx_zmq_breq_t br; /* a head too short or of another magic: a single request, or nothing */
    if (n >= 2 && cx_zmq_breq_head(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), &br) == CX_OK) {
        serve_batch(b, parts, n);
        return;
    }
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
    /* One frame (cx_zmq_submit): header, a write's r.len data bytes, then a message (the rest). */
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
