/* Encoders and decoders of the libfabric backend's wire formats (fi_wire.h). No libfabric calls:
 * fuzzed as is by tests/fuzz/fuzz_fi.c. */
#include "fi_wire.h"

#include "connex/connex.h"

#include <string.h>

void cx_fi_hdr_put(cx_wr_t *w, const cx_fi_hdr_t *h)
{
    cx_wr_u8(w, h->type);
    cx_wr_u8(w, CX_FM_VERSION);
    cx_wr_u16(w, h->flags);
    cx_wr_u64(w, h->inc);
    cx_wr_u64(w, h->seq);
}

void cx_fi_hdr_flags_set(void *buf, uint16_t flags)
{
    cx_wr_t w;
    cx_wr_init(&w, (uint8_t *)buf + 2, 2);
    cx_wr_u16(&w, flags);
}

int cx_fi_hdr_get(const void *buf, size_t len, cx_fi_hdr_t *h)
{
    cx_rd_t r;
    cx_rd_init(&r, buf, buf ? len : 0);
    h->type = cx_rd_u8(&r);
    uint8_t ver = cx_rd_u8(&r);
    h->flags = cx_rd_u16(&r);
    h->inc = cx_rd_u64(&r);
    h->seq = cx_rd_u64(&r);
    return r.ok && ver == CX_FM_VERSION ? CX_OK : CX_EINVAL;
}

void cx_fi_ack_put(cx_wr_t *w, int32_t status)
{
    cx_wr_u32(w, (uint32_t)status);
}

int cx_fi_ack_get(const void *body, size_t len, int32_t *status)
{
    cx_rd_t r;
    cx_rd_init(&r, body, body ? len : 0);
    *status = (int32_t)cx_rd_u32(&r);
    return cx_rd_done(&r) ? CX_OK : CX_EINVAL;
}

int cx_fi_warm_get(const void *body, size_t len, int has_adv, int32_t *status, const uint8_t **adv)
{
    cx_rd_t r;
    cx_rd_init(&r, body, body ? len : 0);
    *status = (int32_t)cx_rd_u32(&r);
    *adv = has_adv ? cx_rd_bytes(&r, CX_FM_CMA_ADV) : NULL;
    return cx_rd_done(&r) && (!has_adv || *adv) ? CX_OK : CX_EINVAL;
}

void cx_fi_rts_put(cx_wr_t *w, const cx_fi_rts_t *rt)
{
    cx_wr_u64(w, rt->len);
    cx_wr_u64(w, rt->addr);
    cx_wr_u64(w, rt->key);
}

int cx_fi_rts_get(const void *body, size_t len, cx_fi_rts_t *rt)
{
    cx_rd_t r;
    cx_rd_init(&r, body, body ? len : 0);
    rt->len = cx_rd_u64(&r);
    rt->addr = cx_rd_u64(&r);
    rt->key = cx_rd_u64(&r);
    /* the target allocates len bytes to pull into: bounded like every message */
    return cx_rd_done(&r) && rt->len && rt->len <= CX_MSG_MAX ? CX_OK : CX_EINVAL;
}

void cx_fi_wbreq_put(cx_wr_t *w, const cx_fi_wbreq_t *q)
{
    cx_wr_u64(w, q->what);
    cx_wr_u64(w, q->len);
    cx_wr_u64(w, q->dst);
    cx_wr_u64(w, q->key);
}

int cx_fi_wbreq_get(const void *body, size_t len, cx_fi_wbreq_t *q)
{
    cx_rd_t r;
    cx_rd_init(&r, body, body ? len : 0);
    q->what = cx_rd_u64(&r);
    q->len = cx_rd_u64(&r);
    q->dst = cx_rd_u64(&r);
    q->key = cx_rd_u64(&r);
    return cx_rd_done(&r) && q->len ? CX_OK : CX_EINVAL;
}

void cx_fi_rlist_head_put(cx_wr_t *w, uint32_t n)
{
    cx_wr_u32(w, n);
    cx_wr_u32(w, 0);
}

void cx_fi_rlist_ent_put(cx_wr_t *w, uint64_t seq, uint64_t what, uint32_t len)
{
    cx_wr_u64(w, seq);
    cx_wr_u64(w, what);
    cx_wr_u32(w, len);
    cx_wr_u32(w, 0);
}

int cx_fi_rlist_get(const void *body, size_t len, uint32_t *n)
{
    cx_rd_t r;
    cx_rd_init(&r, body, body ? len : 0);
    *n = cx_rd_u32(&r);
    (void)cx_rd_u32(&r);
    if (!r.ok || !*n || *n > CX_FM_RLIST_MAX || len != CX_FM_RLIST_HEAD + (size_t)*n * CX_FM_RLIST_ENT) {
        *n = 0;
        return CX_EINVAL;
    }
    return CX_OK;
}

void cx_fi_rlist_ent(const void *body, uint32_t i, uint64_t *seq, cx_fi_wbreq_t *q)
{
    cx_rd_t r;
    cx_rd_init(&r, (const uint8_t *)body + CX_FM_RLIST_HEAD + (size_t)i * CX_FM_RLIST_ENT, CX_FM_RLIST_ENT);
    *seq = cx_rd_u64(&r);
    *q = (cx_fi_wbreq_t){ .what = cx_rd_u64(&r) };
    q->len = cx_rd_u32(&r);
}

void cx_fi_rdata_put(cx_wr_t *w, int32_t status, uint32_t off, const void *data, size_t len)
{
    cx_wr_u32(w, (uint32_t)status);
    cx_wr_u32(w, off);
    if (status == 0) cx_wr_bytes(w, data, len);
}

uint64_t cx_fi_cqd_rdata(uint32_t off, uint64_t seq)
{
    return (uint64_t)CX_FI_CQD_RDATA << 56 | (uint64_t)(off & 0xFFFFFFu) << 32 | (seq & 0xFFFFFFFFu);
}

int cx_fi_cqd_rdata_get(uint64_t data, uint32_t *off, uint32_t *seq_lo)
{
    *off = (uint32_t)(data >> 32) & 0xFFFFFFu;
    *seq_lo = (uint32_t)data;
    return data >> 56 == CX_FI_CQD_RDATA && *off < CX_FM_RD_INLINE_MAX ? CX_OK : CX_EINVAL;
}

int cx_fi_rdata_get(const void *body, size_t len, int32_t *status, uint32_t *off, const uint8_t **data, size_t *dlen)
{
    cx_rd_t r;
    cx_rd_init(&r, body, body ? len : 0);
    *status = (int32_t)cx_rd_u32(&r);
    *off = cx_rd_u32(&r);
    *data = NULL;
    *dlen = 0;
    if (!r.ok) return CX_EINVAL;
    if (len > CX_FM_RDATA_HDR) {
        *data = (const uint8_t *)body + CX_FM_RDATA_HDR;
        *dlen = len - CX_FM_RDATA_HDR;
    }
    if (*status != 0 && *dlen) return CX_EINVAL;
    return (uint64_t)*off + *dlen <= CX_FM_RD_INLINE_MAX ? CX_OK : CX_EINVAL;
}

void cx_fi_addr_put(cx_wr_t *w, const cx_fi_addr_t *a)
{
    cx_wr_u8(w, CX_FI_ADDR_VERSION);
    cx_wr_str8(w, a->prov);
    cx_wr_u32(w, a->fmt);
    if (!a->name_len) w->ok = 0; /* the decoder refuses it: never send it */
    cx_wr_blob16(w, a->name, a->name_len);
    cx_wr_u32(w, a->pid);
}

int cx_fi_addr_get(const void *buf, size_t len, cx_fi_addr_t *a)
{
    cx_rd_t r;
    cx_rd_init(&r, buf, buf ? len : 0);
    uint8_t ver = cx_rd_u8(&r);
    size_t pn = cx_rd_u8(&r);
    const uint8_t *p = cx_rd_bytes(&r, pn);
    a->prov[0] = 0;
    /* a NUL inside would make the name compare equal to a shorter one (strcmp at connect) */
    if (!p || pn >= sizeof a->prov || memchr(p, 0, pn)) return CX_EINVAL;
    memcpy(a->prov, p, pn);
    a->prov[pn] = 0;
    a->fmt = cx_rd_u32(&r);
    a->name = cx_rd_blob16(&r, &a->name_len);
    a->pid = cx_rd_u32(&r);
    if (!cx_rd_done(&r) || ver != CX_FI_ADDR_VERSION || !a->name_len) return CX_EINVAL;
    return CX_OK;
}

void cx_fi_key_put(cx_wr_t *w, const cx_fi_key_t *k)
{
    cx_wr_u8(w, CX_FI_KEY_VERSION);
    cx_wr_u8(w, k->flags);
    cx_wr_u64(w, k->base);
    cx_wr_u64(w, k->key);
}

int cx_fi_key_get(const void *buf, size_t len, cx_fi_key_t *k)
{
    cx_rd_t r;
    cx_rd_init(&r, buf, buf ? len : 0);
    uint8_t ver = cx_rd_u8(&r);
    k->flags = cx_rd_u8(&r);
    k->base = cx_rd_u64(&r);
    k->key = cx_rd_u64(&r);
    return cx_rd_done(&r) && ver == CX_FI_KEY_VERSION ? CX_OK : CX_EINVAL;
}

/* Walks a multi-rail blob of `ver`, lengths u16 (addresses) or u8 (keys); a blob of `single`
 * is rail 0 alone. */
static int cx_fi_rail_part(const void *buf, size_t len, int i, int ver, int single, int wide, const uint8_t **part,
                           size_t *part_len, int *n)
{
    cx_rd_t r;
    cx_rd_init(&r, buf, buf ? len : 0);
    uint8_t v = cx_rd_u8(&r);
    *part = NULL;
    *part_len = 0;
    *n = 0;
    if (!r.ok) return CX_EINVAL;
    if (v == single) {
        *n = 1;
        if (i != 0) return CX_EINVAL;
        *part = buf;
        *part_len = len;
        return CX_OK;
    }
    if (v != ver) return CX_EINVAL;
    int cnt = cx_rd_u8(&r);
    if (!r.ok || cnt < 1 || cnt > CX_FI_RAILS_MAX) return CX_EINVAL;
    for (int k = 0; k < cnt; k++) {
        size_t pl = wide ? cx_rd_u16(&r) : cx_rd_u8(&r);
        const uint8_t *p = cx_rd_bytes(&r, pl);
        if (!p || !pl) return CX_EINVAL;
        if (k == i) {
            *part = p;
            *part_len = pl;
        }
    }
    if (!cx_rd_done(&r) || i < 0 || i >= cnt) return CX_EINVAL;
    *n = cnt;
    return CX_OK;
}

int cx_fi_addr_rail(const void *buf, size_t len, int i, const uint8_t **part, size_t *part_len, int *n)
{
    return cx_fi_rail_part(buf, len, i, CX_FI_ADDRS_VERSION, CX_FI_ADDR_VERSION, 1, part, part_len, n);
}

int cx_fi_key_rail(const void *buf, size_t len, int i, const uint8_t **part, size_t *part_len, int *n)
{
    return cx_fi_rail_part(buf, len, i, CX_FI_KEYS_VERSION, CX_FI_KEY_VERSION, 0, part, part_len, n);
}
