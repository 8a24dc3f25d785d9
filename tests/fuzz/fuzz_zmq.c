/* libFuzzer target: the ZeroMQ backend's wire (zmq_wire.c): the single request and reply heads,
 * the batch frame (head, entries, the size check) and its reply head, and the address blob.
 * Whatever decodes must encode back to the same bytes, and what the target then walks (entries,
 * a write's data) must lie inside the input. */
#include "zmq_int.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void batch_request(const uint8_t *data, size_t size)
{
    cx_zmq_breq_t r;
    if (cx_zmq_breq_head(data, size, &r)) return;
    if (size < CX_ZMQ_BREQ_HDR) abort();
    uint8_t h[CX_ZMQ_BREQ_HDR];
    cx_zmq_breq_put(h, &r);
    /* the two reserved fields are not kept: compare what is */
    if (memcmp(h, data, 5) || memcmp(h + 8, data + 8, 20)) abort();
    if (cx_zmq_breq_check(data, size, &r)) return;
    if (!r.n || r.n > CX_ZMQ_FRAME_ENTRIES || (r.kind != CX_XFER_READ && r.kind != CX_XFER_WRITE)) abort();
    size_t ents = CX_ZMQ_BREQ_HDR + (size_t)r.n * CX_ZMQ_BENT;
    if (r.ents != data + CX_ZMQ_BREQ_HDR || ents + r.data_len != size) abort();
    uint64_t sum = 0; /* what the target will move: at most CX_ZMQ_FRAME_BYTES */
    for (uint32_t i = 0; i < r.n; i++) {
        uint64_t a, l;
        cx_zmq_bent_get(&r, i, &a, &l);
        if (l > CX_ZMQ_FRAME_BYTES) abort();
        sum += l;
    }
    if (sum > CX_ZMQ_FRAME_BYTES || r.data_len != (r.kind == CX_XFER_WRITE ? sum : 0)) abort();
}

static void batch_reply(const uint8_t *data, size_t size)
{
    cx_zmq_brep_t p;
    if (cx_zmq_brep_get(data, size, &p)) return;
    if (size != cx_zmq_brep_size(p.n) || p.n > CX_ZMQ_FRAME_ENTRIES || (p.status && p.n) || (!p.status && !p.n))
        abort();
    static int32_t st[CX_ZMQ_FRAME_ENTRIES];
    for (uint32_t i = 0; i < p.n; i++) {
        st[i] = cx_zmq_brep_st(&p, i);
        if (st[i] > 0 || st[i] < -64) abort();
    }
    static uint8_t b[CX_ZMQ_BREP_HDR + 4 * CX_ZMQ_FRAME_ENTRIES];
    cx_zmq_brep_put(b, p.id, p.status, st, p.n);
    if (memcmp(b, data, size)) abort();
}

static void address(const uint8_t *data, size_t size)
{
    char ep[160];
    int v = 0;
    if (cx_zmq_addr_get(data, size, ep, sizeof ep, &v)) return;
    size_t n = strlen(ep);
    if (n >= sizeof ep || n > size || strncmp(ep, "tcp://", 6) || (v != 1 && v != 2)) abort();
    if (v == 1 && (n != size || memcmp(ep, data, size))) abort();
    if (v == 2) {
        if (strchr(ep, ';')) abort();
        char blob[192];
        if (cx_zmq_addr_put(blob, sizeof blob, ep, data[6] == '[') || strlen(blob) != size || memcmp(blob, data, size))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cx_zmq_req_t q;
    if (cx_zmq_req_get(data, size, &q) == CX_OK) {
        if (size != CX_ZMQ_REQ_HDR || q.kind > CX_XFER_MSG) abort();
        uint8_t b[CX_ZMQ_REQ_HDR];
        cx_zmq_req_put(b, &q);
        cx_zmq_req_t q2;
        if (cx_zmq_req_get(b, sizeof b, &q2) || q.kind != q2.kind || q.id != q2.id || q.sender != q2.sender ||
            q.addr != q2.addr || q.len != q2.len)
            abort();
    }
    cx_zmq_rep_t p;
    if (cx_zmq_rep_get(data, size, &p) == CX_OK) {
        if (size != CX_ZMQ_REP_HDR || p.status > 0 || p.status < -64) abort();
        uint8_t b[CX_ZMQ_REP_HDR];
        cx_zmq_rep_put(b, &p);
        if (memcmp(b, data, sizeof b)) abort();
    }
    batch_request(data, size);
    batch_reply(data, size);
    address(data, size);
    return 0;
}
