/* The UCX backend's own wire formats: everything it frames itself around what UCX packs (the
 * worker address and rkey blobs advertised in HELLO, the active-message headers of messages and
 * their acks). Pure: no UCX types or calls, so tests/fuzz/fuzz_ucx.c compiles it without ucp.h.
 *
 * Decoders take (bytes, len) from a peer, never read past len, and return CX_OK or CX_EINVAL;
 * a blob decoded into a (pointer, length) points into the input. Encoders append to a cx_wr_t
 * (check w.ok). What UCX itself packs inside the blobs is opaque here: UCX parses it
 * (ucp_ep_create, ucp_ep_rkey_unpack) and trusts it (docs/security.md).
 */
#ifndef CX_UCX_WIRE_H
#define CX_UCX_WIRE_H

#include "connex/wire.h"

#include <stddef.h>
#include <stdint.h>

#define CX_UCX_ADDR_MAGIC 0x31585543u  /* "CUX1": a worker address blob */
#define CX_UCX_KEY_MAGIC 0x314b5543u   /* "CUK1": a packed rkey blob */
#define CX_UCX_AM_MAGIC 0x31415543u    /* "CUA1": an active-message header */
#define CX_UCX_UPD_MAGIC 0x31555543u   /* "CUU1": an address update */
#define CX_UCX_RREQ_MAGIC 0x31525543u  /* "CUR1": a read request */
#define CX_UCX_RDATA_MAGIC 0x31445543u /* "CUD1": a part of a read's answer */
#define CX_UCX_WREQ_MAGIC 0x31575543u  /* "CUW1": a write applied by the target */
#define CX_UCX_CMA_MAGIC 0x31435543u   /* "CUC1": after a worker address, same-host copies */
#define CX_UCX_HOST_MAGIC 0x31485543u  /* "CUH1": after an rkey, a host region's base and length */
#define CX_UCX_HOST_LEN 16u

/* UCP active-message ids */
enum {
    CX_UCX_AM_MSG = 11,
    CX_UCX_AM_ACK = 12,
    CX_UCX_AM_UPD = 13,
    CX_UCX_AM_RREQ = 14,
    CX_UCX_AM_RDATA = 15,
    CX_UCX_AM_WREQ = 16
};
#define CX_UCX_MSG_HDR_LEN 21   /* magic u32, kind u8, sender incarnation u64, request id u64 */
#define CX_UCX_ACK_HDR_LEN 16   /* magic u32, request id u64, status i32 */
#define CX_UCX_RREQ_HDR_LEN 36  /* magic u32, reader incarnation u64, request id u64, addr u64, len u64 */
#define CX_UCX_RDATA_HDR_LEN 24 /* magic u32, request id u64, status i32, offset u64 */
#define CX_UCX_WREQ_HDR_LEN 36  /* magic u32, writer incarnation u64, request id u64, addr u64, len u64 */

/* Header of a message (CX_XFER_MSG) or of put_signal's signal (CX_XFER_PUT_SIGNAL). */
typedef struct cx_ucx_msg_hdr {
    uint8_t kind;    /* CX_XFER_MSG or CX_XFER_PUT_SIGNAL */
    uint64_t inc;    /* the sender's incarnation */
    uint64_t req_id; /* echoed in the ack */
} cx_ucx_msg_hdr_t;

/* The target's answer to one message. */
typedef struct cx_ucx_ack_hdr {
    uint64_t req_id;
    int32_t status; /* decoded: a CX_* in [CX_EAGAIN, CX_OK]; anything else reads as CX_ERR */
} cx_ucx_ack_hdr_t;

/* A read served by the target's answer (AM id 14; endpoints without peer error handling, see
 * ucx_read.c): the reader asks for [addr, addr + len) of the target's registered memory. The
 * answer (AM id 15) comes in parts, each a header (request id, status, offset of its bytes in
 * the read) with the bytes as the AM's data; a refusal is one part, no bytes, status != CX_OK. */
typedef struct cx_ucx_rreq_hdr {
    uint64_t inc;    /* the reader's incarnation (logs) */
    uint64_t req_id; /* echoed in the answer */
    uint64_t addr;
    uint64_t len; /* 1 .. CX_UCX_RREQ_MAX */
} cx_ucx_rreq_hdr_t;
#define CX_UCX_RREQ_MAX (1ull << 40)

void cx_ucx_rreq_hdr_put(cx_wr_t *w, const cx_ucx_rreq_hdr_t *h);
int cx_ucx_rreq_hdr_get(const void *buf, size_t len, cx_ucx_rreq_hdr_t *h);

/* A write applied by the target (AM id 16; lanes where UCX would emulate the put, see
 * ucx_write.c): the same fields as a read request, inc being the writer's; the AM's data is
 * the len bytes for [addr, addr + len) of the target's registered memory. The target answers
 * with an ack (AM id 12) carrying req_id. */
typedef cx_ucx_rreq_hdr_t cx_ucx_wreq_hdr_t;
void cx_ucx_wreq_hdr_put(cx_wr_t *w, const cx_ucx_wreq_hdr_t *h);
int cx_ucx_wreq_hdr_get(const void *buf, size_t len, cx_ucx_wreq_hdr_t *h);

typedef struct cx_ucx_rdata_hdr {
    uint64_t req_id;
    int32_t status;  /* decoded: a CX_* in [CX_EAGAIN, CX_OK]; anything else reads as CX_ERR */
    uint64_t offset; /* < CX_UCX_RREQ_MAX */
} cx_ucx_rdata_hdr_t;

void cx_ucx_rdata_hdr_put(cx_wr_t *w, const cx_ucx_rdata_hdr_t *h);
int cx_ucx_rdata_hdr_get(const void *buf, size_t len, cx_ucx_rdata_hdr_t *h);

/* An address update (AM id 13, the AM's data; no AM header): the sender's worker changed
 * (rotation, ucx_rot.c) or it connected to us and says which worker it is on now.
 * magic u32, sender incarnation u64, worker generation u32, blob16 raw ucp worker address
 * (non-empty). The address points into the input. */
typedef struct cx_ucx_upd_hdr {
    uint64_t inc;
    uint32_t gen;
    const uint8_t *addr;
    size_t addr_len;
} cx_ucx_upd_hdr_t;

void cx_ucx_upd_put(cx_wr_t *w, const cx_ucx_upd_hdr_t *h);
int cx_ucx_upd_get(const void *buf, size_t len, cx_ucx_upd_hdr_t *h);

void cx_ucx_msg_hdr_put(cx_wr_t *w, const cx_ucx_msg_hdr_t *h);
int cx_ucx_msg_hdr_get(const void *buf, size_t len, cx_ucx_msg_hdr_t *h);
void cx_ucx_ack_hdr_put(cx_wr_t *w, const cx_ucx_ack_hdr_t *h);
int cx_ucx_ack_hdr_get(const void *buf, size_t len, cx_ucx_ack_hdr_t *h);

/* A UCX blob framed as magic u32 + blob16; the blob is never empty. magic is CX_UCX_ADDR_MAGIC
 * (the worker address in HELLO) or CX_UCX_KEY_MAGIC (a region's packed rkey). */
void cx_ucx_blob_put(cx_wr_t *w, uint32_t magic, const void *blob, size_t n);
int cx_ucx_blob_get(const void *buf, size_t len, uint32_t magic, const uint8_t **blob, size_t *n);

/* The same blob, optionally followed by one extension: u32 ext_magic and exactly ext_len bytes.
 * *ext points at those bytes, or is NULL when the blob ends without one; anything else after
 * the blob is refused. Addresses carry CX_UCX_CMA_MAGIC (a cma.h advertisement, CX_CMA_ADV_LEN
 * bytes), keys of host memory CX_UCX_HOST_MAGIC (CX_UCX_HOST_LEN bytes: u64 base, u64 length of
 * the registration). */
void cx_ucx_ext_put(cx_wr_t *w, uint32_t ext_magic, const void *ext, size_t ext_len);
int cx_ucx_blob_ext_get(const void *buf, size_t len, uint32_t magic, const uint8_t **blob, size_t *n,
                        uint32_t ext_magic, size_t ext_len, const uint8_t **ext);

#endif
