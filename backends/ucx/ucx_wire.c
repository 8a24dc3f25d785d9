/* Encoders and decoders of the UCX backend's wire formats (ucx_wire.h). No UCX calls: fuzzed as
 * is by tests/fuzz/fuzz_ucx.c. */
#include "ucx_wire.h"

#include "connex/backend.h"

void cx_ucx_msg_hdr_put(cx_wr_t *w, const cx_ucx_msg_hdr_t *h)
{
    cx_wr_u32(w, CX_UCX_AM_MAGIC);
    cx_wr_u8(w, h->kind);
    cx_wr_u64(w, h->inc);
    cx_wr_u64(w, h->req_id);
}

int cx_ucx_msg_hdr_get(const void *buf, size_t len, cx_ucx_msg_hdr_t *h)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, buf ? len : 0);
    uint32_t magic = cx_rd_u32(&rd);
    h->kind = cx_rd_u8(&rd);
    h->inc = cx_rd_u64(&rd);
    h->req_id = cx_rd_u64(&rd);
    if (!cx_rd_done(&rd) || magic != CX_UCX_AM_MAGIC || (h->kind != CX_XFER_MSG && h->kind != CX_XFER_PUT_SIGNAL))
        return CX_EINVAL;
    return CX_OK;
}

void cx_ucx_ack_hdr_put(cx_wr_t *w, const cx_ucx_ack_hdr_t *h)
{
    cx_wr_u32(w, CX_UCX_AM_MAGIC);
    cx_wr_u64(w, h->req_id);
    cx_wr_u32(w, (uint32_t)h->status);
}

int cx_ucx_ack_hdr_get(const void *buf, size_t len, cx_ucx_ack_hdr_t *h)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, buf ? len : 0);
    uint32_t magic = cx_rd_u32(&rd);
    h->req_id = cx_rd_u64(&rd);
    h->status = (int32_t)cx_rd_u32(&rd);
    if (!cx_rd_done(&rd) || magic != CX_UCX_AM_MAGIC) return CX_EINVAL;
    /* the sender hands this status to its caller: only codes a target can answer pass */
    if (h->status > CX_OK || h->status < CX_EAGAIN) h->status = CX_ERR;
    return CX_OK;
}

static void cx_ucx_req_hdr_put(cx_wr_t *w, uint32_t magic, const cx_ucx_rreq_hdr_t *h)
{
    cx_wr_u32(w, magic);
    cx_wr_u64(w, h->inc);
    cx_wr_u64(w, h->req_id);
    cx_wr_u64(w, h->addr);
    cx_wr_u64(w, h->len);
}

static int cx_ucx_req_hdr_get(const void *buf, size_t len, uint32_t want, cx_ucx_rreq_hdr_t *h)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, buf ? len : 0);
    uint32_t magic = cx_rd_u32(&rd);
    h->inc = cx_rd_u64(&rd);
    h->req_id = cx_rd_u64(&rd);
    h->addr = cx_rd_u64(&rd);
    h->len = cx_rd_u64(&rd);
    if (!cx_rd_done(&rd) || magic != want || !h->len || h->len > CX_UCX_RREQ_MAX || h->addr + h->len < h->addr)
        return CX_EINVAL;
    return CX_OK;
}

void cx_ucx_rreq_hdr_put(cx_wr_t *w, const cx_ucx_rreq_hdr_t *h)
{
    cx_ucx_req_hdr_put(w, CX_UCX_RREQ_MAGIC, h);
}

int cx_ucx_rreq_hdr_get(const void *buf, size_t len, cx_ucx_rreq_hdr_t *h)
{
    return cx_ucx_req_hdr_get(buf, len, CX_UCX_RREQ_MAGIC, h);
}

void cx_ucx_wreq_hdr_put(cx_wr_t *w, const cx_ucx_wreq_hdr_t *h)
{
    cx_ucx_req_hdr_put(w, CX_UCX_WREQ_MAGIC, h);
}

int cx_ucx_wreq_hdr_get(const void *buf, size_t len, cx_ucx_wreq_hdr_t *h)
{
    return cx_ucx_req_hdr_get(buf, len, CX_UCX_WREQ_MAGIC, h);
}

void cx_ucx_rdata_hdr_put(cx_wr_t *w, const cx_ucx_rdata_hdr_t *h)
{
    cx_wr_u32(w, CX_UCX_RDATA_MAGIC);
    cx_wr_u64(w, h->req_id);
    cx_wr_u32(w, (uint32_t)h->status);
    cx_wr_u64(w, h->offset);
}

int cx_ucx_rdata_hdr_get(const void *buf, size_t len, cx_ucx_rdata_hdr_t *h)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, buf ? len : 0);
    uint32_t magic = cx_rd_u32(&rd);
    h->req_id = cx_rd_u64(&rd);
    h->status = (int32_t)cx_rd_u32(&rd);
    h->offset = cx_rd_u64(&rd);
    if (!cx_rd_done(&rd) || magic != CX_UCX_RDATA_MAGIC || h->offset >= CX_UCX_RREQ_MAX) return CX_EINVAL;
    if (h->status > CX_OK || h->status < CX_EAGAIN) h->status = CX_ERR;
    return CX_OK;
}

void cx_ucx_blob_put(cx_wr_t *w, uint32_t magic, const void *blob, size_t n)
{
    cx_wr_u32(w, magic);
    cx_wr_blob16(w, blob, n);
}

int cx_ucx_blob_get(const void *buf, size_t len, uint32_t magic, const uint8_t **blob, size_t *n)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, buf ? len : 0);
    uint32_t m = cx_rd_u32(&rd);
    *blob = cx_rd_blob16(&rd, n);
    if (!cx_rd_done(&rd) || m != magic || *n == 0) {
        *blob = NULL;
        *n = 0;
        return CX_EINVAL;
    }
    return CX_OK;
}

void cx_ucx_upd_put(cx_wr_t *w, const cx_ucx_upd_hdr_t *h)
{
    cx_wr_u32(w, CX_UCX_UPD_MAGIC);
    cx_wr_u64(w, h->inc);
    cx_wr_u32(w, h->gen);
    cx_wr_blob16(w, h->addr, h->addr_len);
}

int cx_ucx_upd_get(const void *buf, size_t len, cx_ucx_upd_hdr_t *h)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, buf ? len : 0);
    uint32_t magic = cx_rd_u32(&rd);
    h->inc = cx_rd_u64(&rd);
    h->gen = cx_rd_u32(&rd);
    h->addr = cx_rd_blob16(&rd, &h->addr_len);
    if (!cx_rd_done(&rd) || magic != CX_UCX_UPD_MAGIC || !h->addr || h->addr_len == 0) {
        h->addr = NULL;
        h->addr_len = 0;
        return CX_EINVAL;
    }
    return CX_OK;
}

void cx_ucx_ext_put(cx_wr_t *w, uint32_t ext_magic, const void *ext, size_t ext_len)
{
    cx_wr_u32(w, ext_magic);
    if (ext_len) cx_wr_bytes(w, ext, ext_len);
}

int cx_ucx_blob_ext_get(const void *buf, size_t len, uint32_t magic, const uint8_t **blob, size_t *n,
                        uint32_t ext_magic, size_t ext_len, const uint8_t **ext)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, buf ? len : 0);
    uint32_t m = cx_rd_u32(&rd);
    *blob = cx_rd_blob16(&rd, n);
    *ext = NULL;
    if (rd.ok && rd.off < rd.len) {
        uint32_t em = cx_rd_u32(&rd);
        const uint8_t *e = cx_rd_bytes(&rd, ext_len);
        if (em == ext_magic && e)
            *ext = e;
        else
            rd.ok = 0;
    }
    if (!cx_rd_done(&rd) || m != magic || *n == 0) {
        *blob = *ext = NULL;
        *n = 0;
        return CX_EINVAL;
    }
    return CX_OK;
}
