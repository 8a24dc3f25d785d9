/* NIC per GPU: the RDMA NIC nearest each GPU by PCIe topology, balanced where several are equally
 * near, with CONNEX_NET_DEVICES to restrict the NICs ("mlx5_0,mlx5_1:1") or pin them per GPU
 * ("gpu0=mlx5_2,gpu1=mlx5_3"). GPU-to-NIC traffic that crosses the CPU's root complex or the
 * socket link loses a large share of the NIC's bandwidth, which is why nearness comes first. */
#include "cx_select.h"
#include "probe_int.h"
#include "connex/connex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Smaller is nearer. Same switch < same root complex < same NUMA node < unknown < other node. */
static int pci_dist(const cx_probe_pci_t *a, const cx_probe_pci_t *b, const char **level)
{
    if (a->depth && b->depth && !strcmp(a->chain[0], b->chain[0])) {
        int k = 0;
        while (k < a->depth && k < b->depth && !strcmp(a->chain[k], b->chain[k])) k++;
        int hops = (a->depth - k) + (b->depth - k);
        if (k >= 2) {
            *level = "same PCIe switch";
            return hops;
        }
        *level = "same root complex";
        return 50 + hops;
    }
    if (a->numa >= 0 && a->numa == b->numa) {
        *level = "same NUMA node";
        return 100;
    }
    if (a->numa < 0 || b->numa < 0) {
        *level = "topology unknown";
        return 150;
    }
    *level = "other NUMA node";
    return 200;
}

static int eligible(const cx_probe_rdma_t *r, unsigned cand_caps)
{
    if (r->active_port <= 0 || r->verbs_ok == 0) return 0;
    if (r->link == CX_LINK_EFA) return (cand_caps & CX_CAP_EFA) != 0;
    if (r->link == CX_LINK_IB) return (cand_caps & CX_CAP_IB) != 0;
    if (r->link == CX_LINK_ETH) return (cand_caps & CX_CAP_ROCE) != 0;
    return 0;
}

static int find_nic(const cx_probe_t *p, const char *name)
{
    for (int i = 0; i < p->n_rdma; i++)
        if (!strcmp(p->rdma[i].name, name)) return i;
    return -1;
}

/* Parse CONNEX_NET_DEVICES into allowed[] (restriction) and pin[] (per GPU). */
static int parse_override(const cx_probe_t *p, unsigned cand_caps, const char *ov, int *allowed, int *n_allowed,
                          int *pin, cx_decision_t *d)
{
    char buf[512];
    if (strlen(ov) >= sizeof buf)
        return cx_sel_fail(d, CX_EINVAL, "CONNEX_NET_DEVICES is longer than %zu bytes", sizeof buf - 1);
    cx_sel_copy(buf, sizeof buf, ov);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        int gpu = -1;
        char *eq = strchr(tok, '=');
        if (eq) {
            *eq = 0;
            const char *g = tok;
            if (!strncmp(g, "gpu", 3)) g += 3;
            char *end = NULL;
            long v = strtol(g, &end, 10);
            if (!*g || *end || v < 0 || v >= CX_SEL_MAX_GPU)
                return cx_sel_fail(d, CX_EINVAL,
                                   "CONNEX_NET_DEVICES: '%s' is not a GPU index "
                                   "(want gpuN=device)",
                                   tok);
            if (v >= p->n_gpu)
                return cx_sel_fail(d, CX_EINVAL, "CONNEX_NET_DEVICES: gpu%ld, but %d GPU(s) found", v, p->n_gpu);
            gpu = (int)v;
            tok = eq + 1;
        }
        char *colon = strchr(tok, ':');
        int port = 0;
        if (colon) {
            *colon = 0;
            char *end = NULL;
            long v = strtol(colon + 1, &end, 10);
            if (!colon[1] || *end || v <= 0 || v > 255)
                return cx_sel_fail(d, CX_EINVAL, "CONNEX_NET_DEVICES: bad port in '%s:%s'", tok, colon + 1);
            port = (int)v;
        }
        int nic = find_nic(p, tok);
        if (nic < 0) {
            char have[256] = "";
            for (int i = 0; i < p->n_rdma; i++)
                cx_sel_appendf(have, sizeof have, "%s%s", i ? "," : "", p->rdma[i].name);
            return cx_sel_fail(d, CX_EINVAL, "CONNEX_NET_DEVICES: no RDMA device '%s' (have: %s)", tok,
                               have[0] ? have : "none");
        }
        if (!eligible(&p->rdma[nic], cand_caps))
            return cx_sel_fail(d, CX_EINVAL,
                               "CONNEX_NET_DEVICES: %s has no active port usable by "
                               "the chosen backend",
                               tok);
        if (port && port != p->rdma[nic].active_port)
            return cx_sel_fail(d, CX_EINVAL,
                               "CONNEX_NET_DEVICES: %s port %d is not its active "
                               "port (%d)",
                               tok, port, p->rdma[nic].active_port);
        if (gpu >= 0)
            pin[gpu] = nic;
        else if (*n_allowed < CX_SEL_MAX_RDMA)
            allowed[(*n_allowed)++] = nic;
    }
    return CX_OK;
}

int cx_select_nics(const cx_probe_t *p, unsigned cand_caps, const char *override, cx_decision_t *d)
{
    int allowed[CX_SEL_MAX_RDMA], n_allowed = 0, pin[CX_SEL_MAX_GPU], load[CX_SEL_MAX_RDMA];
    int used[CX_SEL_MAX_RDMA];
    for (int i = 0; i < CX_SEL_MAX_GPU; i++) pin[i] = -1;
    memset(load, 0, sizeof load);
    memset(used, 0, sizeof used);
    d->n_gpu = p->n_gpu;
    d->net_devices[0] = 0;
    if (override && *override) {
        int rc = parse_override(p, cand_caps, override, allowed, &n_allowed, pin, d);
        if (rc) return rc;
        REASON(d, "nic: CONNEX_NET_DEVICES=%s", override);
    }
    if (!n_allowed)
        for (int i = 0; i < p->n_rdma; i++)
            if (eligible(&p->rdma[i], cand_caps)) allowed[n_allowed++] = i;
    if (!n_allowed) {
        REASON(d, "nic: no eligible RDMA NIC");
        return CX_OK;
    }
    for (int g = 0; g < p->n_gpu && g < CX_SEL_MAX_GPU; g++) {
        const char *level = "pinned by CONNEX_NET_DEVICES";
        int best = pin[g];
        if (best < 0) {
            int bd = 0;
            const char *lv = NULL;
            for (int k = 0; k < n_allowed; k++) {
                int n = allowed[k];
                int dist = pci_dist(&p->gpu[g].pci, &p->rdma[n].pci, &lv);
                /* nearest; among equals the least loaded, then the lowest name */
                if (best < 0 || dist < bd || (dist == bd && load[n] < load[best])) {
                    best = n;
                    bd = dist;
                    level = lv;
                }
            }
        }
        d->nic_of_gpu[g] = best;
        load[best]++;
        used[best] = 1;
        REASON(d, "nic: GPU%d %s -> %s (%s)", p->gpu[g].ordinal >= 0 ? p->gpu[g].ordinal : g,
               p->gpu[g].pci.bdf[0] ? p->gpu[g].pci.bdf : "?", p->rdma[best].name, level);
    }
    /* no GPU: every eligible NIC serves host memory */
    if (!p->n_gpu)
        for (int k = 0; k < n_allowed; k++) used[allowed[k]] = 1;
    for (int i = 0; i < p->n_rdma; i++)
        if (used[i])
            cx_sel_appendf(d->net_devices, sizeof d->net_devices, "%s%s:%d", d->net_devices[0] ? "," : "",
                           p->rdma[i].name, p->rdma[i].active_port);
    return CX_OK;
}
