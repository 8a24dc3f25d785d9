/* libFuzzer target: the control channel's decoders, driven the way cx_conn_readable drives
 * them. The input is a byte stream from a peer: frames (8-byte header, body) one after another;
 * each body goes to the decoder its type selects (HELLO / HELLO_ACK with every region, REG_ADD,
 * REG_DEL, REG_DEL_ACK, REG_QUERY, REG_REPLY, REFUSE, AUTH, and what connex-ctl reads: STATUS_REPLY
 * with every peer, STATUS_EVENT). Decoded values are checked for the promises the
 * peer code relies on (pointers inside the frame, counts within their bounds). */
#include "auth.h"
#include "ctl_wire.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void inside(const uint8_t *p, size_t n, const uint8_t *b, size_t bl)
{
    if (n && (!p || p < b || p + n > b + bl)) abort();
}

static int region(cx_rd_t *r, const uint8_t *b, size_t bl)
{
    cx_wire_region_t w;
    if (cx_wire_get_region(r, &w) != CX_OK) return -1;
    if (w.nkeys > CX_MAX_BACKENDS || !w.len || w.addr + w.len < w.addr || !w.id) abort();
    for (int i = 0; i < w.nkeys; i++) {
        inside(w.keys[i].key, w.keys[i].len, b, bl);
        if (!memchr(w.keys[i].name, 0, sizeof w.keys[i].name)) abort();
    }
    return 0;
}

static void body(uint8_t type, const uint8_t *b, size_t n)
{
    cx_rd_t r;
    cx_rd_init(&r, b, n);
    switch (type) {
    case CX_CTL_HELLO:
    case CX_CTL_HELLO_ACK: {
        cx_wire_hello_t h;
        char err[200];
        if (cx_wire_get_hello(b, n, &h, err, sizeof err) != CX_OK) {
            if (!memchr(err, 0, sizeof err)) abort();
            return;
        }
        if (h.nb > CX_MAX_BACKENDS || !h.incarnation) abort();
        cx_url_t u;
        if (cx_url_parse(h.url, &u, NULL, 0) || cx_lid_cmp(&u.lid, &h.lid)) abort();
        for (int i = 0; i < h.nb; i++) inside(h.b[i].addr, h.b[i].addr_len, b, n);
        /* As peer_up does: every region, stopping at the first malformed one. */
        for (uint32_t k = 0; k < h.nregions; k++)
            if (region(&h.regions, b, n)) break;
        return;
    }
    case CX_CTL_REG_ADD: (void)region(&r, b, n); return;
    case CX_CTL_REG_DEL:
    case CX_CTL_REG_DEL_ACK:
        (void)cx_rd_u64(&r);
        (void)cx_rd_done(&r);
        return;
    case CX_CTL_REG_QUERY:
        (void)cx_rd_u64(&r);
        (void)cx_rd_u64(&r);
        (void)cx_rd_u64(&r);
        (void)cx_rd_done(&r);
        return;
    case CX_CTL_REG_REPLY:
        (void)cx_rd_u64(&r);
        if (cx_rd_u8(&r) && r.ok) (void)region(&r, b, n);
        return;
    case CX_CTL_REFUSE: {
        char why[256];
        (void)cx_rd_u32(&r);
        cx_rd_str8(&r, why, sizeof why);
        if (!memchr(why, 0, sizeof why)) abort();
        return;
    }
    case CX_CTL_DEATH: {
        cx_lid_t lid;
        uint64_t inc;
        if (cx_wire_get_death(b, n, &lid, &inc) == CX_OK && (!inc || !memchr(lid.model, 0, sizeof lid.model))) abort();
        return;
    }
    case CX_CTL_AUTH: {
        cx_auth_frame_t f;
        if (cx_auth_frame_get(b, n, &f) == CX_OK && (f.step < 1 || f.step > 4 || n != CX_AUTH_BODY)) abort();
        return;
    }
    case CX_CTL_STATUS_REPLY: {
        /* As connex-ctl reads it: the head, then every peer until the first malformed one. */
        cx_wire_status_t s;
        if (cx_wire_get_status_head(b, n, &s) != CX_OK) return;
        if (s.npeers > CX_STATUS_PEERS_MAX || !memchr(s.url, 0, sizeof s.url) ||
            !memchr(s.backends, 0, sizeof s.backends))
            abort();
        for (uint32_t k = 0; k < s.npeers; k++) {
            cx_wire_status_peer_t p;
            if (cx_wire_get_status_peer(&s.peers, &p) != CX_OK) break;
            if (p.state < 0 || p.state > CX_PEER_LEFT || !memchr(p.lid, 0, sizeof p.lid) ||
                !memchr(p.backend, 0, sizeof p.backend) || !memchr(p.transport, 0, sizeof p.transport))
                abort();
        }
        return;
    }
    case CX_CTL_STATUS_EVENT: {
        cx_wire_status_event_t ev;
        if (cx_wire_get_status_event(b, n, &ev) == CX_OK &&
            (ev.type < 0 || ev.type > CX_EVENT_MOVED || !memchr(ev.reason, 0, sizeof ev.reason)))
            abort();
        return;
    }
    default: return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    while (size - off >= CX_CTL_HDR) {
        uint32_t blen;
        uint8_t type;
        if (cx_ctl_hdr_parse(data + off, &blen, &type) != CX_OK) return 0; /* garbage: closed */
        if (blen > CX_CTL_MAX_BODY || type < CX_CTL_HELLO || type > CX_CTL_LAST) abort();
        if (size - off - CX_CTL_HDR < blen) return 0; /* waits for more */
        body(type, data + off + CX_CTL_HDR, blen);
        off += CX_CTL_HDR + blen;
    }
    /* The same bytes as one body of each kind (the header-less path a corpus mutates best). */
    for (uint8_t t = CX_CTL_HELLO; t <= CX_CTL_AUTH; t++) body(t, data, size);
    body(CX_CTL_STATUS_REPLY, data, size);
    body(CX_CTL_STATUS_EVENT, data, size);
    return 0;
}
