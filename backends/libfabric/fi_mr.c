/* Memory registration, driven by the mr_mode bits fi_info returned (never by provider name). */
#include "fi_int.h"

#include "connex/log.h"
#include "connex/wire.h"

#include <stdlib.h>
#include <string.h>

int cx_fi_mr_reg(struct cx_backend *b, void *addr, size_t len, uint64_t access, int mem_kind, struct fid_mr **mr)
{
    struct iovec iov = { .iov_base = addr, .iov_len = len };
    struct fi_mr_attr a;
    memset(&a, 0, sizeof a);
    a.mr_iov = &iov;
    a.iov_count = 1;
    a.access = access;
    /* Without FI_MR_PROV_KEY (tcp;ofi_rxm reports mode 0) the requested key must be unique in
     * the domain or fi_mr_reg fails with -FI_ENOKEY (-266). */
    a.requested_key = b->next_key++;
    a.iface = FI_HMEM_SYSTEM;
    if (mem_kind == CX_MEM_CUDA) {
        if (!b->hmem) {
            cx_warn("libfabric: %s: GPU memory needs FI_HMEM, which this provider lacks "
                    "(or the engine did not ask for GPUDirect)",
                    b->prov);
            return -FI_EOPNOTSUPP;
        }
        /* The device holding the pages: the provider registers them through that GPU. */
        int dev = cx_core_mem_device(b->core, addr, len);
        a.iface = FI_HMEM_CUDA;
        a.device.cuda = dev >= 0 ? dev : 0;
    }
    int r = fi_mr_regattr(b->domain, &a, 0, mr);
    if (r) {
        cx_warn("libfabric: %s: fi_mr_reg(%p, %zu): %s", b->prov, addr, len, cx_fi_strerror(-r));
        return r;
    }
    if (b->mr_mode & FI_MR_ENDPOINT) {
        if ((r = fi_mr_bind(*mr, &b->ep->fid, 0)) || (r = fi_mr_enable(*mr))) {
            cx_warn("libfabric: %s: fi_mr_bind/enable: %s", b->prov, cx_fi_strerror(-r));
            fi_close(&(*mr)->fid);
            *mr = NULL;
            return r;
        }
    }
    return 0;
}

int cx_fi_mem_reg(cx_backend_t *b, void *addr, size_t len, int mem_kind, void **mh, void *key, size_t *key_len)
{
    if (!addr || !len || !mh || !key || !key_len) {
        cx_warn("libfabric: mem_reg: bad arguments");
        return CX_EINVAL;
    }
    if (mem_kind == CX_MEM_CUDA && !b->hmem) return CX_EUNSUPPORTED;
    cx_fi_mh_t *h = calloc(1, sizeof *h);
    if (!h) return CX_ENOMEM;
    uint64_t acc = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
    int r = cx_fi_mr_reg(b, addr, len, acc, mem_kind, &h->mr);
    if (r) {
        free(h);
        return r == -FI_EOPNOTSUPP ? CX_EUNSUPPORTED : CX_ERR;
    }
    h->desc = fi_mr_desc(h->mr);
    h->base = (uint64_t)(uintptr_t)addr;
    cx_wr_t w;
    cx_wr_init(&w, key, *key_len);
    cx_fi_key_put(&w,
                  &(cx_fi_key_t){ .flags = (uint8_t)(((b->mr_mode & FI_MR_VIRT_ADDR) ? CX_FI_KEY_VIRT : 0) |
                                                     (mem_kind == CX_MEM_HOST ? CX_FI_KEY_HOST : 0)),
                                  .base = h->base,
                                  .key = fi_mr_key(h->mr) });
    if (!w.ok) {
        cx_warn("libfabric: mem_reg: key buffer of %zu bytes too small", *key_len);
        fi_close(&h->mr->fid);
        free(h);
        return CX_EINVAL;
    }
    *key_len = w.len;
    *mh = h;
    return CX_OK;
}

void cx_fi_mem_dereg(cx_backend_t *b, void *mh)
{
    (void)b;
    cx_fi_mh_t *h = mh;
    if (!h) return;
    fi_close(&h->mr->fid);
    free(h);
}

int cx_fi_key_parse(const void *key, size_t key_len, cx_fi_key_t *k)
{
    const uint8_t *part;
    size_t part_len;
    int nr;
    if (cx_fi_key_rail(key, key_len, 0, &part, &part_len, &nr) == CX_OK) {
        key = part; /* a multi-rail peer's region: its first rail's key */
        key_len = part_len;
    }
    return cx_fi_key_get(key, key_len, k);
}

int cx_fi_key_decode(const void *key, size_t key_len, uint64_t remote, uint64_t *raddr, uint64_t *rkey)
{
    cx_fi_key_t k;
    if (cx_fi_key_parse(key, key_len, &k) || cx_fi_key_target(&k, remote, raddr)) {
        cx_warn("libfabric: malformed or foreign remote key (%zu bytes)", key_len);
        return CX_EINVAL;
    }
    *rkey = k.key;
    return CX_OK;
}

/* GPUDirect: EFA and verbs register GPU virtual addresses through FI_HMEM (nvidia_peermem under
 * the provider), when the plan asked for FI_HMEM and the provider granted it; tcp and shm reach
 * no NIC. dma-buf registration (FI_MR_DMABUF) is not used. */
void cx_fi_gpu_caps(cx_backend_t *b, cx_backend_gpu_caps_t *caps)
{
    memset(caps, 0, sizeof *caps);
    caps->rdma = !strcmp(b->prov, "efa") || !strncmp(b->prov, "verbs", 5);
    caps->peermem = caps->rdma && b->hmem;
}
