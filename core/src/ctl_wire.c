#include "ctl_wire.h"

#include <stdio.h>
#include <string.h>

void cx_ctl_hdr(uint8_t *hdr, uint32_t blen, uint8_t type)
{
    cx_wr_t w;
    cx_wr_init(&w, hdr, CX_CTL_HDR);
    cx_wr_u32(&w, blen);
    cx_wr_u8(&w, type);
    cx_wr_u8(&w, CX_CTL_VERSION);
    cx_wr_u16(&w, 0);
}

int cx_ctl_hdr_parse(const uint8_t *hdr, uint32_t *blen, uint8_t *type)
{
    cx_rd_t r;
    cx_rd_init(&r, hdr, CX_CTL_HDR);
    *blen = cx_rd_u32(&r);
    *type = cx_rd_u8(&r);
    uint8_t ver = cx_rd_u8(&r);
    (void)cx_rd_u16(&r);
    if (ver != CX_CTL_VERSION || *blen > CX_CTL_MAX_BODY || *type < CX_CTL_HELLO || *type > CX_CTL_LAST)
        return CX_EINVAL;
    return CX_OK;
}

void cx_wire_put_region(cx_wr_t *w, const cx_region_t *r, const char *const *names, int nb)
{
    cx_wr_u64(w, r->id);
    cx_wr_u64(w, r->addr);
    cx_wr_u64(w, r->len);
    cx_wr_u8(w, (uint8_t)r->mem_kind);
    uint8_t nk = 0;
    for (int i = 0; i < nb; i++) nk += r->mh[i] != NULL;
    cx_wr_u8(w, nk);
    for (int i = 0; i < nb; i++) {
        if (!r->mh[i]) continue;
        cx_wr_str8(w, names[i]);
        cx_wr_blob16(w, r->key[i], r->key_len[i]);
    }
}

int cx_wire_get_region(cx_rd_t *r, cx_wire_region_t *out)
{
    memset(out, 0, sizeof *out);
    out->id = cx_rd_u64(r);
    out->addr = cx_rd_u64(r);
    out->len = cx_rd_u64(r);
    out->mem_kind = cx_rd_u8(r);
    out->nkeys = cx_rd_u8(r);
    if (out->nkeys > CX_MAX_BACKENDS) return CX_EINVAL;
    for (int i = 0; i < out->nkeys; i++) {
        size_t n;
        cx_rd_str8(r, out->keys[i].name, sizeof out->keys[i].name);
        out->keys[i].key = cx_rd_blob16(r, &n);
        out->keys[i].len = (uint16_t)n;
    }
    if (!r->ok || out->len == 0 || out->addr + out->len < out->addr || out->id == 0) return CX_EINVAL;
    return CX_OK;
}

static void put_lid(cx_wr_t *w, const cx_lid_t *lid)
{
    cx_wr_str8(w, lid->model);
    cx_wr_u32(w, lid->stage);
    cx_wr_u32(w, lid->shard);
    cx_wr_u32(w, lid->replica);
}

static void get_lid(cx_rd_t *r, cx_lid_t *lid)
{
    cx_rd_str8(r, lid->model, sizeof lid->model);
    lid->stage = cx_rd_u32(r);
    lid->shard = cx_rd_u32(r);
    lid->replica = cx_rd_u32(r);
}

void cx_wire_put_death(cx_wr_t *w, const cx_lid_t *lid, uint64_t inc)
{
    put_lid(w, lid);
    cx_wr_u64(w, inc);
}

int cx_wire_get_death(const uint8_t *body, size_t len, cx_lid_t *lid, uint64_t *inc)
{
    cx_rd_t r;
    cx_rd_init(&r, body, len);
    memset(lid, 0, sizeof *lid);
    get_lid(&r, lid);
    *inc = cx_rd_u64(&r);
    return cx_rd_done(&r) && lid->model[0] && *inc ? CX_OK : CX_EINVAL;
}

void cx_wire_put_hello_head(cx_wr_t *w, uint64_t inc, const cx_lid_t *lid, const char *url, const cx_lid_t *target,
                            const char *host_id, uint32_t hb_ms, uint32_t hbt_ms, uint32_t live_pid, int32_t live_fd,
                            int nb, const char *const *names, const char *const *choices, const uint8_t *const *addrs,
                            const uint16_t *addr_lens, uint32_t nregions)
{
    cx_wr_u32(w, CX_CTL_MAGIC);
    cx_wr_u64(w, inc);
    put_lid(w, lid);
    cx_wr_str8(w, url);
    put_lid(w, target);
    cx_wr_str8(w, host_id);
    cx_wr_u32(w, hb_ms);
    cx_wr_u32(w, hbt_ms);
    cx_wr_u32(w, live_pid);
    cx_wr_u32(w, (uint32_t)live_fd);
    cx_wr_u8(w, (uint8_t)nb);
    for (int i = 0; i < nb; i++) {
        cx_wr_str8(w, names[i]);
        cx_wr_str8(w, choices[i]);
        cx_wr_blob16(w, addrs[i], addr_lens[i]);
    }
    cx_wr_u32(w, nregions);
}

int cx_wire_get_hello(const uint8_t *body, size_t len, cx_wire_hello_t *h, char *err, size_t errlen)
{
    cx_rd_t r;
    cx_rd_init(&r, body, len);
    memset(h, 0, sizeof *h);
    if (cx_rd_u32(&r) != CX_CTL_MAGIC) {
        snprintf(err, errlen, "bad magic (not a connex peer)");
        return CX_EINVAL;
    }
    h->incarnation = cx_rd_u64(&r);
    get_lid(&r, &h->lid);
    cx_rd_str8(&r, h->url, sizeof h->url);
    get_lid(&r, &h->target);
    cx_rd_str8(&r, h->host_id, sizeof h->host_id);
    h->hb_ms = cx_rd_u32(&r);
    h->hb_timeout_ms = cx_rd_u32(&r);
    h->live_pid = cx_rd_u32(&r);
    h->live_fd = (int32_t)cx_rd_u32(&r);
    if (h->live_fd < -1 || (h->live_fd >= 0 && !h->live_pid)) {
        snprintf(err, errlen, "malformed HELLO: liveness fd %d of pid %u", h->live_fd, h->live_pid);
        return CX_EINVAL;
    }
    h->nb = cx_rd_u8(&r);
    if (!r.ok || h->nb > CX_MAX_BACKENDS) {
        snprintf(err, errlen, "truncated or malformed HELLO");
        return CX_EINVAL;
    }
    for (int i = 0; i < h->nb; i++) {
        size_t n;
        cx_rd_str8(&r, h->b[i].name, sizeof h->b[i].name);
        cx_rd_str8(&r, h->b[i].choice, sizeof h->b[i].choice);
        h->b[i].addr = cx_rd_blob16(&r, &n);
        h->b[i].addr_len = (uint16_t)n;
    }
    h->nregions = cx_rd_u32(&r);
    if (!r.ok) {
        snprintf(err, errlen, "truncated HELLO");
        return CX_EINVAL;
    }
    cx_url_t u;
    char uerr[200];
    if (cx_url_parse(h->url, &u, uerr, sizeof uerr)) {
        snprintf(err, errlen, "HELLO carries a bad URL: %s", uerr);
        return CX_EINVAL;
    }
    if (cx_lid_cmp(&u.lid, &h->lid)) {
        snprintf(err, errlen, "HELLO URL %s does not match its LID", h->url);
        return CX_EINVAL;
    }
    if (h->incarnation == 0) {
        snprintf(err, errlen, "HELLO with incarnation 0");
        return CX_EINVAL;
    }
    h->regions = r;
    return CX_OK;
}

void cx_wire_put_status_head(cx_wr_t *w, uint64_t inc, const char *url, const char *lid, const char *backends,
                             uint64_t now_ms, uint32_t npeers)
{
    cx_wr_u64(w, inc);
    cx_wr_str8(w, url);
    cx_wr_str8(w, lid);
    cx_wr_str8(w, backends);
    cx_wr_u64(w, now_ms);
    cx_wr_u32(w, npeers);
}

void cx_wire_put_status_peer(cx_wr_t *w, const cx_wire_status_peer_t *p)
{
    cx_wr_str8(w, p->lid);
    cx_wr_str8(w, p->url);
    cx_wr_u8(w, (uint8_t)p->state);
    cx_wr_str8(w, p->backend);
    cx_wr_str8(w, p->transport);
    cx_wr_u64(w, p->incarnation);
    cx_wr_u64(w, p->since_ms);
    cx_wr_u64(w, p->failures);
    cx_wr_u64(w, p->joins);
    cx_wr_u64(w, p->in_flight);
    cx_wr_u64(w, p->errors);
    cx_wr_u64(w, p->timeouts);
}

void cx_wire_put_status_event(cx_wr_t *w, const cx_wire_status_event_t *ev)
{
    cx_wr_u8(w, (uint8_t)ev->type);
    cx_wr_str8(w, ev->lid);
    cx_wr_str8(w, ev->url);
    cx_wr_u64(w, ev->incarnation);
    cx_wr_u64(w, ev->time_ms);
    cx_wr_str8(w, ev->reason);
}

int cx_wire_get_status_head(const uint8_t *body, size_t len, cx_wire_status_t *s)
{
    cx_rd_t r;
    cx_rd_init(&r, body, len);
    memset(s, 0, sizeof *s);
    s->incarnation = cx_rd_u64(&r);
    cx_rd_str8(&r, s->url, sizeof s->url);
    cx_rd_str8(&r, s->lid, sizeof s->lid);
    cx_rd_str8(&r, s->backends, sizeof s->backends);
    s->now_ms = cx_rd_u64(&r);
    s->npeers = cx_rd_u32(&r);
    if (!r.ok || s->npeers > CX_STATUS_PEERS_MAX) return CX_EINVAL;
    s->peers = r;
    return CX_OK;
}

int cx_wire_get_status_peer(cx_rd_t *r, cx_wire_status_peer_t *p)
{
    memset(p, 0, sizeof *p);
    cx_rd_str8(r, p->lid, sizeof p->lid);
    cx_rd_str8(r, p->url, sizeof p->url);
    p->state = cx_rd_u8(r);
    cx_rd_str8(r, p->backend, sizeof p->backend);
    cx_rd_str8(r, p->transport, sizeof p->transport);
    p->incarnation = cx_rd_u64(r);
    p->since_ms = cx_rd_u64(r);
    p->failures = cx_rd_u64(r);
    p->joins = cx_rd_u64(r);
    p->in_flight = cx_rd_u64(r);
    p->errors = cx_rd_u64(r);
    p->timeouts = cx_rd_u64(r);
    return r->ok && p->state <= CX_PEER_LEFT ? CX_OK : CX_EINVAL;
}

int cx_wire_get_status_event(const uint8_t *body, size_t len, cx_wire_status_event_t *ev)
{
    cx_rd_t r;
    cx_rd_init(&r, body, len);
    memset(ev, 0, sizeof *ev);
    ev->type = cx_rd_u8(&r);
    cx_rd_str8(&r, ev->lid, sizeof ev->lid);
    cx_rd_str8(&r, ev->url, sizeof ev->url);
    ev->incarnation = cx_rd_u64(&r);
    ev->time_ms = cx_rd_u64(&r);
    cx_rd_str8(&r, ev->reason, sizeof ev->reason);
    return cx_rd_done(&r) && ev->type <= CX_EVENT_MOVED ? CX_OK : CX_EINVAL;
}
