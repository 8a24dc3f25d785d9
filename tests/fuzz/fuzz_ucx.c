/* libFuzzer target: the UCX backend's own framing (backends/ucx/ucx_wire.c), i.e. everything of
 * a peer's bytes the backend parses before UCX does: the active-message header of a message or
 * put_signal's signal (cx_ucx_am_msg), the ack header (cx_ucx_am_ack), and the "CUX1" worker
 * address / "CUK1" packed-rkey blobs advertised in HELLO (cx_ucx_connect, cx_ucx_rkey_get), and
 * the "CUU1" address update of worker rotation (ucx_rot.c), and the "CUR1" read request that a
 * target answers from its registered memory and the "CUD1" parts of that answer (ucx_read.c),
 * and the extensions after an address ("CUC1", same-host copies) or a key ("CUH1", a host
 * region's range) that ucx_cma.c relies on.
 * Every input goes to every decoder. Whatever decodes must satisfy what the backend relies on and
 * encode back to the same bytes; the encoders are also driven with the input as a blob. */
#include "ucx_wire.h"
#include "util/cma.h"

#include "connex/backend.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void inside(const uint8_t *p, size_t n, const uint8_t *b, size_t bl)
{
    if (n && (!p || p < b || p + n > b + bl)) abort();
}

static void msg_hdr(const uint8_t *data, size_t size)
{
    cx_ucx_msg_hdr_t h;
    if (cx_ucx_msg_hdr_get(data, size, &h) != CX_OK) return;
    if (size != CX_UCX_MSG_HDR_LEN || (h.kind != CX_XFER_MSG && h.kind != CX_XFER_PUT_SIGNAL)) abort();
    uint8_t b[CX_UCX_MSG_HDR_LEN];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_ucx_msg_hdr_put(&w, &h);
    if (!w.ok || w.len != size || memcmp(b, data, size)) abort();
}

static void ack_hdr(const uint8_t *data, size_t size)
{
    cx_ucx_ack_hdr_t h;
    if (cx_ucx_ack_hdr_get(data, size, &h) != CX_OK) return;
    /* the initiator hands the status to its caller as the op's result */
    if (size != CX_UCX_ACK_HDR_LEN || h.status > CX_OK || h.status < CX_EAGAIN) abort();
    uint8_t b[CX_UCX_ACK_HDR_LEN];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_ucx_ack_hdr_put(&w, &h);
    cx_ucx_ack_hdr_t h2;
    if (!w.ok || w.len != size || cx_ucx_ack_hdr_get(b, w.len, &h2) || h2.req_id != h.req_id || h2.status != h.status)
        abort();
    /* bytes equal unless the decoder mapped an out-of-range status to CX_ERR */
    int32_t raw =
        (int32_t)((uint32_t)data[12] | (uint32_t)data[13] << 8 | (uint32_t)data[14] << 16 | (uint32_t)data[15] << 24);
    if (raw == h.status && memcmp(b, data, size)) abort();
    if (raw != h.status && h.status != CX_ERR) abort();
}

static void blob(const uint8_t *data, size_t size, uint32_t magic)
{
    const uint8_t *p;
    size_t n;
    if (cx_ucx_blob_get(data, size, magic, &p, &n) != CX_OK) {
        if (p || n) abort(); /* a refused blob must not leave a pointer to use */
        return;
    }
    inside(p, n, data, size);
    if (!n || size != 6 + n) abort();
    uint8_t *b = malloc(size);
    if (!b) return;
    cx_wr_t w;
    cx_wr_init(&w, b, size);
    cx_ucx_blob_put(&w, magic, p, n);
    if (!w.ok || w.len != size || memcmp(b, data, size)) abort();
    free(b);
}

/* A blob with its optional extension: the extension is there whole or refused, and both parts
 * encode back to the input. */
static void blob_ext(const uint8_t *data, size_t size, uint32_t magic, uint32_t ext_magic, size_t ext_len)
{
    const uint8_t *p, *e;
    size_t n;
    if (cx_ucx_blob_ext_get(data, size, magic, &p, &n, ext_magic, ext_len, &e) != CX_OK) {
        if (p || n || e) abort();
        return;
    }
    inside(p, n, data, size);
    if (!n || size != 6 + n + (e ? 4 + ext_len : 0)) abort();
    if (e) inside(e, ext_len, data, size);
    uint8_t *b = malloc(size);
    if (!b) return;
    cx_wr_t w;
    cx_wr_init(&w, b, size);
    cx_ucx_blob_put(&w, magic, p, n);
    if (e) cx_ucx_ext_put(&w, ext_magic, e, ext_len);
    if (!w.ok || w.len != size || memcmp(b, data, size)) abort();
    free(b);
}

/* An address update (rotation): what decodes points inside the input and encodes back to it. */
static void upd(const uint8_t *data, size_t size)
{
    cx_ucx_upd_hdr_t h;
    if (cx_ucx_upd_get(data, size, &h) != CX_OK) {
        if (h.addr || h.addr_len) abort();
        return;
    }
    inside(h.addr, h.addr_len, data, size);
    if (!h.addr_len || size != 18 + h.addr_len) abort();
    uint8_t *b = malloc(size);
    if (!b) return;
    cx_wr_t w;
    cx_wr_init(&w, b, size);
    cx_ucx_upd_put(&w, &h);
    if (!w.ok || w.len != size || memcmp(b, data, size)) abort();
    free(b);
}

/* A read request: what decodes is a non-empty range that does not wrap, and encodes back. */
static void rreq(const uint8_t *data, size_t size)
{
    cx_ucx_rreq_hdr_t h;
    if (cx_ucx_rreq_hdr_get(data, size, &h) != CX_OK) return;
    if (size != CX_UCX_RREQ_HDR_LEN || !h.len || h.len > CX_UCX_RREQ_MAX || h.addr + h.len < h.addr) abort();
    uint8_t b[CX_UCX_RREQ_HDR_LEN];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_ucx_rreq_hdr_put(&w, &h);
    if (!w.ok || w.len != size || memcmp(b, data, size)) abort();
}

/* A write request: the same checks, and a read request's bytes never decode as one. */
static void wreq(const uint8_t *data, size_t size)
{
    cx_ucx_wreq_hdr_t h;
    if (cx_ucx_wreq_hdr_get(data, size, &h) != CX_OK) return;
    if (size != CX_UCX_WREQ_HDR_LEN || !h.len || h.len > CX_UCX_RREQ_MAX || h.addr + h.len < h.addr) abort();
    cx_ucx_rreq_hdr_t r;
    if (cx_ucx_rreq_hdr_get(data, size, &r) == CX_OK) abort();
    uint8_t b[CX_UCX_WREQ_HDR_LEN];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_ucx_wreq_hdr_put(&w, &h);
    if (!w.ok || w.len != size || memcmp(b, data, size)) abort();
}

/* A part of a read's answer: the offset stays below the largest read, the status is one a target
 * can answer (else CX_ERR), and it encodes back. */
static void rdata(const uint8_t *data, size_t size)
{
    cx_ucx_rdata_hdr_t h;
    if (cx_ucx_rdata_hdr_get(data, size, &h) != CX_OK) return;
    if (size != CX_UCX_RDATA_HDR_LEN || h.offset >= CX_UCX_RREQ_MAX || h.status > CX_OK || h.status < CX_EAGAIN)
        abort();
    uint8_t b[CX_UCX_RDATA_HDR_LEN];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_ucx_rdata_hdr_put(&w, &h);
    cx_ucx_rdata_hdr_t h2;
    if (!w.ok || w.len != size || cx_ucx_rdata_hdr_get(b, w.len, &h2) || h2.req_id != h.req_id ||
        h2.status != h.status || h2.offset != h.offset)
        abort();
}

/* The encoder on arbitrary content (a worker address or packed rkey is opaque to the backend). */
static void blob_roundtrip(const uint8_t *data, size_t size)
{
    uint8_t *b = malloc(size + 6);
    if (!b) return;
    cx_wr_t w;
    cx_wr_init(&w, b, size + 6);
    cx_ucx_blob_put(&w, CX_UCX_KEY_MAGIC, data, size);
    if (w.ok != (size <= 0xffff)) abort();
    if (w.ok) {
        const uint8_t *p;
        size_t n;
        int rc = cx_ucx_blob_get(b, w.len, CX_UCX_KEY_MAGIC, &p, &n);
        if (size ? (rc || n != size || memcmp(p, data, size)) : rc != CX_EINVAL) abort();
        if (size && cx_ucx_blob_get(b, w.len, CX_UCX_ADDR_MAGIC, &p, &n) != CX_EINVAL) abort();
        if (size && cx_ucx_blob_get(b, w.len - 1, CX_UCX_KEY_MAGIC, &p, &n) != CX_EINVAL) abort();
    }
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msg_hdr(data, size);
    ack_hdr(data, size);
    blob(data, size, CX_UCX_ADDR_MAGIC);
    blob(data, size, CX_UCX_KEY_MAGIC);
    blob_ext(data, size, CX_UCX_ADDR_MAGIC, CX_UCX_CMA_MAGIC, CX_CMA_ADV_LEN);
    blob_ext(data, size, CX_UCX_KEY_MAGIC, CX_UCX_HOST_MAGIC, CX_UCX_HOST_LEN);
    blob_roundtrip(data, size);
    upd(data, size);
    rreq(data, size);
    wreq(data, size);
    rdata(data, size);
    return 0;
}
