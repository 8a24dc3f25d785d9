/* Synthetic probes of the host types the policy must handle. */
#ifndef CX_SEL_SYNTH_H
#define CX_SEL_SYNTH_H
#include <stdio.h>
#include <string.h>
#include "cx_select.h"

enum { H_TCP = 0, H_IB_GPU_PEERMEM, H_ROCE, H_EFA_HMEM, H_EFA_NOHMEM, H_NO_BACKENDS, H_COUNT };

static inline void synth_built(cx_probe_t *p, const char *csv)
{
    p->n_built = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", csv);
    for (char *s = strtok(buf, ","); s; s = strtok(NULL, ","))
        snprintf(p->built[p->n_built++], sizeof p->built[0], "%s", s);
}

static inline cx_probe_rdma_t *synth_nic(cx_probe_t *p, const char *name, int link, int active)
{
    cx_probe_rdma_t *r = &p->rdma[p->n_rdma++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->driver, sizeof r->driver, "%s", link == CX_LINK_EFA ? "efa" : "mlx5_core");
    r->link = link;
    r->nports = 1;
    r->ports[0].num = 1;
    r->ports[0].active = active;
    r->ports[0].link = link;
    r->active_port = active ? 1 : 0;
    r->verbs_ok = 1;
    r->pci.numa = -1;
    return r;
}

static inline cx_probe_gpu_t *synth_gpu(cx_probe_t *p, const char *bdf)
{
    cx_probe_gpu_t *g = &p->gpu[p->n_gpu];
    memset(g, 0, sizeof *g);
    g->ordinal = p->n_gpu++;
    snprintf(g->name, sizeof g->name, "Synthetic GPU");
    snprintf(g->pci.bdf, sizeof g->pci.bdf, "%s", bdf);
    g->pci.numa = -1;
    g->gdr_attr = 1;
    g->dmabuf_attr = 0;
    return g;
}

/* A host of the given type, every library probed and loaded, all three backends built. */
static inline void synth_host(cx_probe_t *p, int type)
{
    memset(p, 0, sizeof *p);
    snprintf(p->host_id, sizeof p->host_id, "synthetic-%d", type);
    snprintf(p->sysfs_root, sizeof p->sysfs_root, "/synthetic");
    synth_built(p, "ucx,libfabric,zmq");
    cx_probe_lib_t *libs[] = { &p->verbs, &p->fabric, &p->ucx, &p->cuda };
    for (int i = 0; i < 4; i++) {
        libs[i]->probed = 1;
        libs[i]->loaded = 1;
    }
    snprintf(p->fabric.version, sizeof p->fabric.version, "1.17");
    snprintf(p->fi_providers, sizeof p->fi_providers, "tcp;ofi_rxm,shm");
    p->fi_tcp = p->fi_shm = 1;
    snprintf(p->ucx_resources, sizeof p->ucx_resources, "tcp/lo,posix/memory,cma/memory");
    p->ucx_caps = CX_CAP_TCP | CX_CAP_SHM;
    switch (type) {
    case H_IB_GPU_PEERMEM:
        synth_nic(p, "mlx5_0", CX_LINK_IB, 1);
        synth_nic(p, "mlx5_1", CX_LINK_IB, 0);
        p->ucx_caps |= CX_CAP_IB;
        p->ucx_cuda = 1;
        synth_gpu(p, "0000:1b:00.0");
        p->peermem = 1;
        break;
    case H_ROCE:
        synth_nic(p, "mlx5_0", CX_LINK_ETH, 1);
        p->ucx_caps |= CX_CAP_ROCE;
        break;
    case H_EFA_HMEM:
    case H_EFA_NOHMEM:
        synth_nic(p, "rdmap16s27", CX_LINK_EFA, 1);
        snprintf(p->fi_providers, sizeof p->fi_providers, "efa,tcp;ofi_rxm,shm");
        p->fi_efa = 1;
        p->fi_efa_hmem = type == H_EFA_HMEM;
        synth_gpu(p, "0000:10:1c.0");
        p->peermem = 1;
        break;
    case H_NO_BACKENDS: p->n_built = 0; break;
    default: break;
    }
}
#endif
