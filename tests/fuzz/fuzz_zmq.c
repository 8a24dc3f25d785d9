/* libFuzzer target: the ZeroMQ backend's request and reply headers (frame 1 of every message a
 * target or an initiator receives). Whatever decodes must encode back to the same bytes. */
#include "zmq_int.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
    return 0;
}
