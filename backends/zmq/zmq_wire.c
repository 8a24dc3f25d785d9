#include "zmq_int.h"

#include "connex/wire.h"

#include <stdio.h>
#include <string.h>

#define REQ_MAGIC 0x315a5843u   /* "CXZ1" */
#define BATCH_MAGIC 0x325a5843u /* "CXZ2" */

/* What a single and a batch request start with: magic, kind, 3 bytes of padding, id, sender. */
static void head_put(cx_wr_t *w, uint32_t magic, uint8_t kind, uint64_t id, uint64_t sender)
{
    cx_wr_u32(w, magic);
    cx_wr_u8(w, kind);
    cx_wr_u8(w, 0);
    cx_wr_u16(w, 0);
    cx_wr_u64(w, id);
    cx_wr_u64(w, sender);
}

static uint32_t head_get(cx_rd_t *rd, uint8_t *kind, uint64_t *id, uint64_t *sender)
{
    uint32_t magic = cx_rd_u32(rd);
    *kind = cx_rd_u8(rd);
    (void)cx_rd_u8(rd);
    (void)cx_rd_u16(rd);
    *id = cx_rd_u64(rd);
    *sender = cx_rd_u64(rd);
    return magic;
}

void cx_zmq_req_put(uint8_t *buf, const cx_zmq_req_t *r)
{
    cx_wr_t w;
    cx_wr_init(&w, buf, CX_ZMQ_REQ_HDR);
    head_put(&w, REQ_MAGIC, r->kind, r->id, r->sender);
    cx_wr_u64(&w, r->addr);
    cx_wr_u64(&w, r->len);
}

int cx_zmq_req_get(const void *buf, size_t len, cx_zmq_req_t *r)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, len);
    uint32_t magic = head_get(&rd, &r->kind, &r->id, &r->sender);
    r->addr = cx_rd_u64(&rd);
    r->len = cx_rd_u64(&rd);
    if (!cx_rd_done(&rd) || magic != REQ_MAGIC || r->kind > CX_XFER_MSG) return CX_EINVAL;
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

void cx_zmq_breq_put(uint8_t *buf, const cx_zmq_breq_t *r)
{
    cx_wr_t w;
    cx_wr_init(&w, buf, CX_ZMQ_BREQ_HDR);
    head_put(&w, BATCH_MAGIC, r->kind, r->id, r->sender);
    cx_wr_u32(&w, r->n);
    cx_wr_u32(&w, 0);
}

void cx_zmq_bent_put(uint8_t *buf, uint32_t i, uint64_t addr, uint64_t len)
{
    cx_wr_t w;
    cx_wr_init(&w, buf + CX_ZMQ_BREQ_HDR + (size_t)i * CX_ZMQ_BENT, CX_ZMQ_BENT);
    cx_wr_u64(&w, addr);
    cx_wr_u64(&w, len);
}

int cx_zmq_breq_head(const void *buf, size_t len, cx_zmq_breq_t *r)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, len < CX_ZMQ_BREQ_HDR ? len : CX_ZMQ_BREQ_HDR);
    uint32_t magic = head_get(&rd, &r->kind, &r->id, &r->sender);
    r->n = cx_rd_u32(&rd);
    (void)cx_rd_u32(&rd);
    r->ents = NULL;
    r->data_len = 0;
    if (!cx_rd_done(&rd) || magic != BATCH_MAGIC) return CX_EINVAL;
    return CX_OK;
}

int cx_zmq_breq_check(const void *buf, size_t len, cx_zmq_breq_t *r)
{
    if (cx_zmq_breq_head(buf, len, r) || (r->kind != CX_XFER_READ && r->kind != CX_XFER_WRITE) || !r->n ||
        r->n > CX_ZMQ_FRAME_ENTRIES)
        return CX_EINVAL;
    size_t ents = CX_ZMQ_BREQ_HDR + (size_t)r->n * CX_ZMQ_BENT;
    if (len < ents) return CX_EINVAL;
    r->ents = (const uint8_t *)buf + CX_ZMQ_BREQ_HDR;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < r->n; i++) {
        uint64_t a, l;
        cx_zmq_bent_get(r, i, &a, &l);
        if (l > CX_ZMQ_FRAME_BYTES || sum + l > CX_ZMQ_FRAME_BYTES) return CX_EINVAL; /* no wrap either */
        sum += l;
    }
    r->data_len = r->kind == CX_XFER_WRITE ? sum : 0;
    if (len - ents != r->data_len) return CX_EINVAL; /* a read carries no data; a write exactly its own */
    return CX_OK;
}

void cx_zmq_bent_get(const cx_zmq_breq_t *r, uint32_t i, uint64_t *addr, uint64_t *len)
{
    cx_rd_t rd;
    cx_rd_init(&rd, r->ents + (size_t)i * CX_ZMQ_BENT, CX_ZMQ_BENT);
    *addr = cx_rd_u64(&rd);
    *len = cx_rd_u64(&rd);
}

size_t cx_zmq_brep_size(uint32_t n)
{
    return CX_ZMQ_BREP_HDR + (size_t)n * 4;
}

void cx_zmq_brep_put(uint8_t *buf, uint64_t id, int32_t status, const int32_t *st, uint32_t n)
{
    cx_wr_t w;
    cx_wr_init(&w, buf, cx_zmq_brep_size(n));
    cx_wr_u64(&w, id);
    cx_wr_u32(&w, (uint32_t)status);
    cx_wr_u32(&w, n);
    for (uint32_t i = 0; i < n; i++) cx_wr_u32(&w, (uint32_t)st[i]);
}

static int status_ok(int32_t s)
{
    return s <= 0 && s >= -64;
}

int cx_zmq_brep_get(const void *buf, size_t len, cx_zmq_brep_t *r)
{
    cx_rd_t rd;
    cx_rd_init(&rd, buf, len < CX_ZMQ_BREP_HDR ? len : CX_ZMQ_BREP_HDR);
    r->id = cx_rd_u64(&rd);
    r->status = (int32_t)cx_rd_u32(&rd);
    r->n = cx_rd_u32(&rd);
    r->st = (const uint8_t *)buf + CX_ZMQ_BREP_HDR;
    if (!cx_rd_done(&rd) || !status_ok(r->status) || r->n > CX_ZMQ_FRAME_ENTRIES || (r->status && r->n) ||
        (!r->status && !r->n) || len != cx_zmq_brep_size(r->n))
        return CX_EINVAL;
    for (uint32_t i = 0; i < r->n; i++)
        if (!status_ok(cx_zmq_brep_st(r, i))) return CX_EINVAL;
    return CX_OK;
}

int32_t cx_zmq_brep_st(const cx_zmq_brep_t *r, uint32_t i)
{
    cx_rd_t rd;
    cx_rd_init(&rd, r->st + (size_t)i * 4, 4);
    return (int32_t)cx_rd_u32(&rd);
}

/* The source part of a version 2 blob, by the family of the address that follows. */
static const char SRC4[] = "tcp://0.0.0.0:0;", SRC6[] = "tcp://[::]:0;";

int cx_zmq_addr_put(char *buf, size_t cap, const char *endpoint, int ipv6)
{
    if (strncmp(endpoint, "tcp://", 6)) return CX_EINVAL;
    int n = snprintf(buf, cap, "%s%s", ipv6 ? SRC6 : SRC4, endpoint + 6);
    return n < 0 || (size_t)n >= cap ? CX_EINVAL : CX_OK;
}

int cx_zmq_addr_get(const void *blob, size_t len, char *ep, size_t cap, int *version)
{
    const char *a = blob;
    if (len < 7 || len >= cap || memcmp(a, "tcp://", 6) || memchr(a, 0, len)) return CX_EINVAL;
    size_t skip = 0;
    if (len > sizeof SRC4 - 1 && !memcmp(a, SRC4, sizeof SRC4 - 1))
        skip = sizeof SRC4 - 1;
    else if (len > sizeof SRC6 - 1 && !memcmp(a, SRC6, sizeof SRC6 - 1))
        skip = sizeof SRC6 - 1;
    *version = skip ? 2 : 1;
    if (skip) {
        memcpy(ep, "tcp://", 6);
        memcpy(ep + 6, a + skip, len - skip);
        ep[6 + len - skip] = 0;
        if (memchr(ep + 6, ';', len - skip)) return CX_EINVAL; /* one source part, no more */
    } else {
        memcpy(ep, a, len);
        ep[len] = 0;
    }
    return CX_OK;
}
