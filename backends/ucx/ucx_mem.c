/* Registration (ucp_mem_map + packed rkey) and the per-ucp_ep cache of unpacked peer rkeys
 * (a rotation gives an endpoint a new ucp_ep, which unpacks again, lazily). */
#include "ucx_int.h"

#include <stdlib.h>
#include <string.h>

int cx_ucx_mem_reg(cx_backend_t *bb, void *addr, size_t len, int mem_kind, void **mh, void *key, size_t *key_len)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    if (!b || !addr || !len || !mh || !key || !key_len) return CX_EINVAL;
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = addr;
    mp.length = len;
    if (mem_kind == CX_MEM_CUDA) {
        /* said explicitly so UCX registers it with the NIC (GPUDirect) without probing */
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.memory_type = UCS_MEMORY_TYPE_CUDA;
    } else if (mem_kind != CX_MEM_HOST && mem_kind != CX_MEM_SIM) {
        cx_error("ucx: unknown memory kind %d", mem_kind);
        return CX_EINVAL;
    }
    ucp_mem_h memh;
    ucs_status_t st = cx_ucx_lib.ucp_mem_map(b->ctx, &mp, &memh);
    if (st != UCS_OK) {
        cx_error("ucx: ucp_mem_map(%p, %zu, kind %d) failed: %s", addr, len, mem_kind,
                 cx_ucx_lib.ucs_status_string(st));
        return st == UCS_ERR_NO_MEMORY ? CX_ENOMEM : CX_ERR;
    }
    void *rk;
    size_t rk_len;
    st = cx_ucx_lib.ucp_rkey_pack(b->ctx, memh, &rk, &rk_len);
    if (st != UCS_OK) {
        cx_error("ucx: ucp_rkey_pack failed: %s", cx_ucx_lib.ucs_status_string(st));
        cx_ucx_lib.ucp_mem_unmap(b->ctx, memh);
        return CX_ERR;
    }
    cx_wr_t w;
    cx_wr_init(&w, key, *key_len);
    cx_ucx_blob_put(&w, CX_UCX_KEY_MAGIC, rk, rk_len);
    if (mem_kind == CX_MEM_HOST) { /* ucx_cma.c */
        uint8_t ext[CX_UCX_HOST_LEN];
        cx_wr_t e;
        cx_wr_init(&e, ext, sizeof ext);
        cx_wr_u64(&e, (uint64_t)(uintptr_t)addr);
        cx_wr_u64(&e, (uint64_t)len);
        cx_ucx_ext_put(&w, CX_UCX_HOST_MAGIC, ext, sizeof ext);
    }
    cx_ucx_lib.ucp_rkey_buffer_release(rk);
    if (!w.ok) {
        cx_error("ucx: packed rkey (%zu bytes) does not fit the key buffer (%zu)", rk_len, *key_len);
        cx_ucx_lib.ucp_mem_unmap(b->ctx, memh);
        return CX_EINVAL;
    }
    *key_len = w.len;
    *mh = memh;
    return CX_OK;
}

void cx_ucx_mem_dereg(cx_backend_t *bb, void *mh)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    if (!b || !mh) return;
    ucs_status_t st = cx_ucx_lib.ucp_mem_unmap(b->ctx, (ucp_mem_h)mh);
    if (st != UCS_OK) cx_warn("ucx: ucp_mem_unmap failed: %s", cx_ucx_lib.ucs_status_string(st));
}

int cx_ucx_rkey_get(cx_ucx_ue_t *ue, const cx_xfer_t *x, ucp_rkey_h *out, const cx_ucx_rk_t **rec)
{
    cx_ucx_rk_t **h = &ue->rk[x->remote_region % CX_UCX_RK_BUCKETS];
    for (cx_ucx_rk_t *r = *h; r; r = r->next) {
        if (r->region_id == x->remote_region) {
            *out = r->rk;
            if (rec) *rec = r;
            return CX_OK;
        }
    }
    /* the blob came off the network: check its framing before UCX parses it */
    size_t n;
    const uint8_t *blob, *ext;
    if (cx_ucx_blob_ext_get(x->rkey, x->rkey_len, CX_UCX_KEY_MAGIC, &blob, &n, CX_UCX_HOST_MAGIC, CX_UCX_HOST_LEN,
                            &ext)) {
        cx_error("ucx: the peer's key for region %llu is not a UCX rkey (%zu bytes)",
                 (unsigned long long)x->remote_region, x->rkey_len);
        return CX_EINVAL;
    }
    cx_ucx_rk_t *r = malloc(sizeof *r);
    if (!r) return CX_ENOMEM;
    ucs_status_t st = cx_ucx_lib.ucp_ep_rkey_unpack(ue->ep, blob, &r->rk);
    if (st != UCS_OK) {
        cx_error("ucx: ucp_ep_rkey_unpack (region %llu) failed: %s", (unsigned long long)x->remote_region,
                 cx_ucx_lib.ucs_status_string(st));
        free(r);
        return st == UCS_ERR_UNREACHABLE ? CX_EPEER : CX_EINVAL;
    }
    r->region_id = x->remote_region;
    r->host = ext != NULL;
    r->base = r->len = 0;
    if (ext) {
        cx_rd_t rd;
        cx_rd_init(&rd, ext, CX_UCX_HOST_LEN);
        r->base = cx_rd_u64(&rd);
        r->len = cx_rd_u64(&rd);
    }
    r->next = *h;
    *h = r;
    *out = r->rk;
    if (rec) *rec = r;
    return CX_OK;
}

static void cx_ucx_forget_ue(cx_ucx_ue_t *ue, uint64_t region_id)
{
    for (cx_ucx_rk_t **p = &ue->rk[region_id % CX_UCX_RK_BUCKETS]; *p; p = &(*p)->next) {
        if ((*p)->region_id == region_id) {
            cx_ucx_rk_t *r = *p;
            *p = r->next;
            cx_ucx_lib.ucp_rkey_destroy(r->rk);
            free(r);
            return;
        }
    }
}

/* every ucp_ep of the endpoint unpacked its own (the current one and retiring ones) */
void cx_ucx_forget_region(cx_backend_t *bb, cx_bep_t *ep, uint64_t region_id)
{
    (void)bb;
    if (!ep) return;
    if (ep->ue) cx_ucx_forget_ue(ep->ue, region_id);
    for (cx_ucx_ue_t *ue = ep->old; ue; ue = ue->next) cx_ucx_forget_ue(ue, region_id);
}

void cx_ucx_rkeys_drop(cx_ucx_ue_t *ue)
{
    for (int i = 0; i < CX_UCX_RK_BUCKETS; i++) {
        while (ue->rk[i]) {
            cx_ucx_rk_t *r = ue->rk[i];
            ue->rk[i] = r->next;
            cx_ucx_lib.ucp_rkey_destroy(r->rk);
            free(r);
        }
    }
}
