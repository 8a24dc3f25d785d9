#include "zmq_int.h"

#include "connex/wire.h"

void cx_zmq_req_put(uint8_t *buf, const cx_zmq_req_t *r)
{
    cx_wr_t w;
    cx_wr_init(&w, buf, CX_ZMQ_REQ_HDR);
    cx_wr_u32(&w, 0x315a5843u); /* "CXZ1" */
    cx_wr_u8(&w, r->kind);
    cx_wr_u8(&w, 0);
    cx_wr_u16(&w, 0);
    cx_wr_u64(&w, r->id);
    cx_wr_u64(&w, r->sender);
    cx_wr_u64(&w, r->addr);
    cx_wr_u64(&w, r->len);
}

int cx_zmq_req_get(const void *buf, size_t len, cx_zmq_req_t *r)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, len);
    uint32_t magic = cx_rd_u32(&rd);
    r->kind = cx_rd_u8(&rd);
    (void)cx_rd_u8(&rd);
    (void)cx_rd_u16(&rd);
    r->id = cx_rd_u64(&rd);
    r->sender = cx_rd_u64(&rd);
    r->addr = cx_rd_u64(&rd);
    r->len = cx_rd_u64(&rd);
    if (!cx_rd_done(&rd) || magic != 0x315a5843u || r->kind > CX_XFER_MSG) return CX_EINVAL;
    return CX_OK;
}

void cx_zmq_rep_put(uint8_t *buf, const cx_zmq_rep_t *r)
{
    cx_wr_t w;
    cx_wr_init(&w, buf, CX_ZMQ_REP_HDR);
    cx_wr_u64(&w, r->id);
    cx_wr_u32(&w, (uint32_t)r->status);
}

int cx_zmq_rep_get(const void *buf, size_t len, cx_zmq_rep_t *r)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, len);
    r->id = cx_rd_u64(&rd);
    r->status = (int32_t)cx_rd_u32(&rd);
    if (!cx_rd_done(&rd) || r->status > 0 || r->status < -64) return CX_EINVAL;
    return CX_OK;
}
