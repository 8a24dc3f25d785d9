/* The plan: from the decision (backends, variants, GPUDirect, NIC per GPU) to exactly what each
 * backend's open is given (cx_backend_params_t), so that what runs is what was chosen and what
 * HELLO advertises. Pure, like the policy. */
#include "cx_select.h"
#include "backends.h"
#include "probe_int.h"

#include <stdio.h>
#include <string.h>

static void transports_of(unsigned caps, const cx_sel_backend_t *be, char *buf, size_t len)
{
    buf[0] = 0;
    if (caps & CX_CAP_EFA) cx_sel_appendf(buf, len, "efa");
    if (caps & (CX_CAP_IB | CX_CAP_ROCE))
        cx_sel_appendf(buf, len, "%s%s (%s)", buf[0] ? "," : "", be ? be->rdma_transports : "verbs",
                       (caps & CX_CAP_IB) && (caps & CX_CAP_ROCE) ? "ib,roce"
                           : (caps & CX_CAP_IB)                   ? "ib"
                                                                  : "roce");
    if (caps & CX_CAP_TCP) cx_sel_appendf(buf, len, "%stcp", buf[0] ? "," : "");
    if (caps & CX_CAP_SHM) cx_sel_appendf(buf, len, "%s%s", buf[0] ? "," : "", be ? be->shm_transports : "shm");
}

void cx_select_plan(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d)
{
    const char *gdr_cap = p->peermem ? "nvidia_peermem" : "dma-buf";
    for (int i = 0; i < d->n; i++) {
        const cx_choice_t *c = &d->be[i];
        const cx_sel_backend_t *be = cx_sel_backend(c->backend);
        cx_plan_be_t *pl = &d->plan[i];
        memset(pl, 0, sizeof *pl);
        transports_of(c->caps & ~CX_CAP_GDR, be, pl->transports, sizeof pl->transports);
        int rdma = (c->caps & CX_CAP_RDMA) != 0;
        if (be && be->plan) be->plan(p, o, d, i, pl);
        if (i == 0 && d->gpudirect) {
            pl->gpudirect = 1;
            snprintf(pl->gpudirect_via, sizeof pl->gpudirect_via, "%s, %s", be ? be->gdr_via : "", gdr_cap);
        } else {
            snprintf(pl->gpudirect_via, sizeof pl->gpudirect_via, "%s",
                     !p->n_gpu   ? "no GPU"
                         : !rdma ? "no RDMA path"
                         : i     ? "not the first backend"
                                 : "off in the decision, see gpudirect");
        }
    }
}
