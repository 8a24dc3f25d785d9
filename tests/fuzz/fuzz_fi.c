/* libFuzzer target: the libfabric backend's wire decoders (backends/libfabric/fi_wire.c): every
 * received fi_send buffer (header, then an ack's status, a rendezvous header, a read request, a
 * read list, a warm-up's offer or a part of a read's answer, as cx_fi_on_recv, cx_fi_pull_start,
 * cx_fi_list_serve and cx_fi_wb_on_rdata decode it), a headerless part's CQ data word
 * (cx_fi_wb_on_raw), the address blob in HELLO (cx_fi_connect) and a region's key blob
 * (cx_fi_key_decode). Every input goes to every decoder. Whatever decodes must satisfy what the
 * backend relies on and encode back to the same bytes (reserved fields aside). */
#include "fi_wire.h"

#include "connex/connex.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void inside(const uint8_t *p, size_t n, const uint8_t *b, size_t bl)
{
    if (n && (!p || p < b || p + n > b + bl)) abort();
}

static void ack(const uint8_t *body, size_t n)
{
    int32_t st;
    if (cx_fi_ack_get(body, n, &st) != CX_OK) return;
    uint8_t b[CX_FM_ACK_LEN];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_fi_ack_put(&w, st);
    if (n != CX_FM_ACK_LEN || !w.ok || w.len != n || memcmp(b, body, n)) abort();
}

/* A warm-up with an offer of same-host copies: the status, then exactly the offer. */
static void warm(const uint8_t *body, size_t n)
{
    int32_t st;
    const uint8_t *adv;
    if (cx_fi_warm_get(body, n, 1, &st, &adv) != CX_OK) return;
    if (n != CX_FM_ACK_LEN + CX_FM_CMA_ADV || !adv) abort();
    inside(adv, CX_FM_CMA_ADV, body, n);
}

static void rts(const uint8_t *body, size_t n)
{
    cx_fi_rts_t r;
    if (cx_fi_rts_get(body, n, &r) != CX_OK) return;
    /* the target mallocs r.len bytes to pull into */
    if (n != CX_FM_RTS || !r.len || r.len > CX_MSG_MAX) abort();
    uint8_t b[CX_FM_RTS];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_fi_rts_put(&w, &r);
    if (!w.ok || w.len != n || memcmp(b, body, n)) abort();
}

static void wbreq(const uint8_t *body, size_t n)
{
    cx_fi_wbreq_t q;
    if (cx_fi_wbreq_get(body, n, &q) != CX_OK) return;
    if (n != CX_FM_WBREQ || !q.len) abort();
    uint8_t b[CX_FM_WBREQ];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_fi_wbreq_put(&w, &q);
    if (!w.ok || w.len != n || memcmp(b, body, n)) abort();
}

static void rdata(const uint8_t *body, size_t n)
{
    int32_t st;
    uint32_t off;
    const uint8_t *d;
    size_t dl;
    if (cx_fi_rdata_get(body, n, &st, &off, &d, &dl) != CX_OK) return;
    /* what cx_fi_wb_on_rdata relies on before its own checks against the op */
    if (n < CX_FM_RDATA_HDR || dl != n - CX_FM_RDATA_HDR || (st != 0 && dl) || (uint64_t)off + dl > CX_FM_RD_INLINE_MAX)
        abort();
    inside(d, dl, body, n);
    uint8_t *b = malloc(n ? n : 1);
    if (!b) return;
    cx_wr_t w;
    cx_wr_init(&w, b, n);
    cx_fi_rdata_put(&w, st, off, d, dl);
    if (!w.ok || w.len != n || memcmp(b, body, n)) abort();
    free(b);
}

/* A read list: the count bounds the body exactly; every entry re-encodes to its bytes (the
 * reserved words aside), and its length is what the server checks next (it fits 32 bits). */
static void rlist(const uint8_t *body, size_t n)
{
    uint32_t k;
    if (cx_fi_rlist_get(body, n, &k) != CX_OK) return;
    if (!k || k > CX_FM_RLIST_MAX || n != CX_FM_RLIST_HEAD + (size_t)k * CX_FM_RLIST_ENT) abort();
    uint8_t *b = malloc(n), *want = malloc(n);
    if (!b || !want) abort();
    memcpy(want, body, n);
    memset(want + 4, 0, 4);
    cx_wr_t w;
    cx_wr_init(&w, b, n);
    cx_fi_rlist_head_put(&w, k);
    for (uint32_t i = 0; i < k; i++) {
        uint64_t seq;
        cx_fi_wbreq_t q;
        cx_fi_rlist_ent(body, i, &seq, &q);
        if (q.len > UINT32_MAX || q.dst || q.key) abort();
        cx_fi_rlist_ent_put(&w, seq, q.what, (uint32_t)q.len);
        memset(want + CX_FM_RLIST_HEAD + (size_t)i * CX_FM_RLIST_ENT + 20, 0, 4);
    }
    if (!w.ok || w.len != n || memcmp(b, want, n)) abort();
    free(b);
    free(want);
}

/* The CQ data word of a headerless answer part (the input's first 8 bytes, little-endian): what
 * cx_fi_wb_on_raw relies on, and the encoder gives the same word back. */
static void cqd(const uint8_t *data, size_t size)
{
    if (size < 8) return;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | data[i];
    uint32_t off, lo;
    if (cx_fi_cqd_rdata_get(v, &off, &lo) != CX_OK) return;
    if (v >> 56 != CX_FI_CQD_RDATA || off >= CX_FM_RD_INLINE_MAX || cx_fi_cqd_rdata(off, lo) != v) abort();
}

/* A received message: what cx_fi_on_recv does with it. */
static void message(const uint8_t *data, size_t size)
{
    cx_fi_hdr_t h;
    if (cx_fi_hdr_get(data, size, &h) != CX_OK) return;
    if (size < CX_FM_HDR || data[1] != CX_FM_VERSION) abort();
    uint8_t b[CX_FM_HDR];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_fi_hdr_put(&w, &h);
    if (!w.ok || w.len != CX_FM_HDR || b[0] != data[0] || b[1] != data[1] || memcmp(b + 4, data + 4, CX_FM_HDR - 4))
        abort();
    const uint8_t *body = data + CX_FM_HDR;
    size_t n = size - CX_FM_HDR;
    if (h.type == CX_FM_ACK && !h.seq && (h.flags & CX_FM_F_CMA_ADV))
        warm(body, n);
    else if (h.type == CX_FM_ACK)
        ack(body, n);
    else if (h.type == CX_FM_MSG_RTS || h.type == CX_FM_SIG_RTS)
        rts(body, n);
    else if (h.type == CX_FM_RREQ || h.type == CX_FM_PREQ || h.type == CX_FM_RREQ_IN)
        wbreq(body, n);
    else if (h.type == CX_FM_RDATA)
        rdata(body, n);
    else if (h.type == CX_FM_RLIST)
        rlist(body, n);
    else if (h.type == CX_FM_MSG || h.type == CX_FM_SIG)
        inside(body, n, data, size);
}

static void addr(const uint8_t *data, size_t size)
{
    cx_fi_addr_t a;
    if (cx_fi_addr_get(data, size, &a) != CX_OK) return;
    const char *nul = memchr(a.prov, 0, sizeof a.prov);
    if (!nul || !a.name_len) abort();
    size_t pl = (size_t)(nul - a.prov);
    inside(a.name, a.name_len, data, size);
    if (size != 1 + 1 + pl + 4 + 2 + a.name_len + 4) abort();
    uint8_t *b = malloc(size);
    if (!b) return;
    cx_wr_t w;
    cx_wr_init(&w, b, size);
    cx_fi_addr_put(&w, &a);
    if (!w.ok || w.len != size || memcmp(b, data, size)) abort();
    free(b);
}

static void key(const uint8_t *data, size_t size)
{
    cx_fi_key_t k;
    if (cx_fi_key_get(data, size, &k) != CX_OK) return;
    if (size != CX_FI_KEY_LEN) abort();
    uint8_t b[CX_FI_KEY_LEN];
    cx_wr_t w;
    cx_wr_init(&w, b, sizeof b);
    cx_fi_key_put(&w, &k);
    if (!w.ok || w.len != size || memcmp(b, data, size)) abort();
    /* the initiator's address for a few remotes inside a region at that base (the core refuses
     * regions that wrap past 2^64, so offsets that would wrap are not remotes it can ask for) */
    const uint64_t offs[] = { 0, 1, 4096, UINT64_MAX - k.base };
    for (size_t i = 0; i < sizeof offs / sizeof *offs; i++) {
        if (offs[i] > UINT64_MAX - k.base) continue;
        uint64_t remote = k.base + offs[i], ra = 0;
        if (cx_fi_key_target(&k, remote, &ra) != CX_OK) abort();
        if (ra != ((k.flags & CX_FI_KEY_VIRT) ? remote : offs[i])) abort();
    }
    uint64_t ra = 0;
    if (k.base && cx_fi_key_target(&k, k.base - 1, &ra) != CX_EINVAL) abort();
}

/* Multi-rail blobs: every part lies inside the input, the count is the same for every rail, and
 * a rail past the count is refused; each part goes through the single-rail decoder. */
static void rails(const uint8_t *data, size_t size)
{
    for (int kind = 0; kind < 2; kind++) {
        const uint8_t *p;
        size_t pl;
        int n0 = 0;
        int (*get)(const void *, size_t, int, const uint8_t **, size_t *, int *) =
            kind ? cx_fi_key_rail : cx_fi_addr_rail;
        if (get(data, size, 0, &p, &pl, &n0) != CX_OK) continue;
        if (n0 < 1 || n0 > CX_FI_RAILS_MAX) abort();
        for (int i = 0; i < n0; i++) {
            int n = 0;
            if (get(data, size, i, &p, &pl, &n) != CX_OK || n != n0 || !pl) abort();
            inside(p, pl, data, size);
            if (kind) {
                cx_fi_key_t k;
                (void)cx_fi_key_get(p, pl, &k);
            } else {
                cx_fi_addr_t a;
                (void)cx_fi_addr_get(p, pl, &a);
            }
        }
        int n = 0;
        if (get(data, size, n0, &p, &pl, &n) != CX_EINVAL) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rails(data, size);
    message(data, size);
    ack(data, size);
    rts(data, size);
    wbreq(data, size);
    rdata(data, size);
    cqd(data, size);
    addr(data, size);
    key(data, size);
    return 0;
}
