/* The plan: from the decision (backends, variants, GPUDirect, NIC per GPU) to exactly what each
 * backend's open is given (cx_backend_params_t), so that what runs is what was chosen and what
 * HELLO advertises. Pure, like the policy. */
#include "cx_select.h"
#include "probe_int.h"

#include <stdio.h>
#include <string.h>

#define REASON(d, ...) do { cx_sel_appendf((d)->reasons, sizeof (d)->reasons, __VA_ARGS__); \
                            cx_sel_appendf((d)->reasons, sizeof (d)->reasons, "\n"); } while (0)

static int nic_ok(const cx_probe_rdma_t *r, int efa)
{
    return r->active_port > 0 && r->verbs_ok != 0 && (r->link == CX_LINK_EFA) == efa;
}

/* The NIC a single-domain libfabric instance opens: GPU 0's (the policy mapped the GPUs to the
 * NICs of the first backend's kind), else the first active one of the kind. -1: none. */
static int domain_nic(const cx_probe_t *p, const cx_decision_t *d, int first, int efa)
{
    if (first && d->n_gpu > 0 && d->nic_of_gpu[0] >= 0 && nic_ok(&p->rdma[d->nic_of_gpu[0]], efa))
        return d->nic_of_gpu[0];
    for (int i = 0; i < p->n_rdma; i++)
        if (nic_ok(&p->rdma[i], efa)) return i;
    return -1;
}

static void transports_of(unsigned caps, const char *backend, char *buf, size_t len)
{
    buf[0] = 0;
    int ucx = !strcmp(backend, "ucx");
    if (caps & CX_CAP_EFA) cx_sel_appendf(buf, len, "efa");
    if (caps & (CX_CAP_IB | CX_CAP_ROCE))
        cx_sel_appendf(buf, len, "%s%s (%s)", buf[0] ? "," : "", ucx ? "rc,dc,ud" : "verbs",
                       (caps & CX_CAP_IB) && (caps & CX_CAP_ROCE) ? "ib,roce"
                       : (caps & CX_CAP_IB) ? "ib" : "roce");
    if (caps & CX_CAP_TCP) cx_sel_appendf(buf, len, "%stcp", buf[0] ? "," : "");
    if (caps & CX_CAP_SHM) cx_sel_appendf(buf, len, "%s%s", buf[0] ? "," : "", ucx ? "cma,posix" : "shm");
}

void cx_select_plan(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d)
{
    const char *ov = o && o->net_devices && *o->net_devices ? o->net_devices : NULL;
    const char *gdr_cap = p->peermem ? "nvidia_peermem" : "dma-buf";
    for (int i = 0; i < d->n; i++) {
        const cx_choice_t *c = &d->be[i];
        cx_plan_be_t *pl = &d->plan[i];
        memset(pl, 0, sizeof *pl);
        transports_of(c->caps & ~CX_CAP_GDR, c->backend, pl->transports, sizeof pl->transports);
        int rdma = (c->caps & CX_CAP_RDMA) != 0;
        if (!strcmp(c->backend, "libfabric")) {
            cx_sel_copy(pl->provider, sizeof pl->provider, c->variant);
            int efa = !strncmp(c->variant, "efa", 3), verbs = !strncmp(c->variant, "verbs", 5);
            int n = (efa || verbs) ? domain_nic(p, d, i == 0, efa) : -1;
            if (n >= 0)
                snprintf(pl->domain, sizeof pl->domain, "%.*s%s", CX_SEL_NAME - 5, p->rdma[n].name,
                         efa ? "-rdm" : "");
            REASON(d, "plan: libfabric opens provider %s%s%s%s", pl->provider,
                   pl->domain[0] ? ", domain " : "", pl->domain,
                   pl->domain[0] && p->n_gpu ? " (the NIC of GPU 0; one domain per instance)" : "");
        } else if (!strcmp(c->backend, "ucx")) {
            if (ov && !strchr(ov, '=')) {
                cx_sel_copy(pl->devices, sizeof pl->devices, ov);
                pl->devices_exact = 1;
            } else if (rdma && i == 0) {
                cx_sel_copy(pl->devices, sizeof pl->devices, d->net_devices);
            }
            REASON(d, "plan: ucx devices %s%s", pl->devices[0] ? pl->devices : "none (no RDMA: "
                   "tcp over the engine's interface, shared memory)",
                   pl->devices_exact ? " (CONNEX_NET_DEVICES, as given)" : "");
        }
        if (i == 0 && d->gpudirect) {
            pl->gpudirect = 1;
            snprintf(pl->gpudirect_via, sizeof pl->gpudirect_via, "%s, %s",
                     !strcmp(c->backend, "ucx") ? "UCX CUDA memory type" : "FI_HMEM (FI_HMEM_CUDA)",
                     gdr_cap);
        } else {
            snprintf(pl->gpudirect_via, sizeof pl->gpudirect_via, "%s",
                     !p->n_gpu ? "no GPU" : !rdma ? "no RDMA path"
                     : i ? "not the first backend" : "off in the decision, see gpudirect");
        }
    }
}
