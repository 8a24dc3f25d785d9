/* The selection's table of backends (backends.h): for each, how its instance on this host is
 * decided, what its open is given, what it was measured at and what GPUDirect needs from it. */
#include "backends.h"
#include "probe_int.h"
#include "rates.h"
#include "connex/connex.h"

#include <stdio.h>
#include <string.h>

/* ---------------- UCX ---------------- */

/* Its caps from the transports uct listed (RDMA only on active ports). */
static int ucx_instance(const cx_probe_t *p, const cx_select_opts_t *o, int take_rdma, cx_choice_t *c, cx_decision_t *d,
                        int forced)
{
    (void)o;
    (void)take_rdma; /* UCX is the first choice for RDMA ports */
    memset(c, 0, sizeof *c);
    snprintf(c->backend, sizeof c->backend, "ucx");
    if (p->ucx.probed && !p->ucx.loaded) {
        if (forced) return cx_sel_fail(d, CX_EUNSUPPORTED, "CONNEX_BACKEND=ucx: %s", p->ucx.note);
        REASON(d, "ucx: not usable: %s", p->ucx.note);
        return 0;
    }
    unsigned nic_caps = 0;
    for (int i = 0; i < p->n_rdma; i++) {
        const cx_probe_rdma_t *r = &p->rdma[i];
        if (!cx_sel_nic_usable(r)) continue;
        if (r->link == CX_LINK_IB)
            nic_caps |= CX_CAP_IB;
        else if (r->link == CX_LINK_ETH)
            nic_caps |= CX_CAP_ROCE;
    }
    if (p->ucx.probed) {
        c->caps = p->ucx_caps & (CX_CAP_TCP | CX_CAP_SHM | nic_caps);
        if (nic_caps & ~p->ucx_caps & (CX_CAP_IB | CX_CAP_ROCE))
            REASON(d,
                   "ucx: active RDMA ports, but UCX lists no rc/dc/ud transport on them "
                   "(UCX built without verbs support, or rdma-core provider missing)");
    } else {
        c->caps = CX_CAP_TCP | CX_CAP_SHM | nic_caps;
    }
    if (!c->caps) {
        if (forced)
            return cx_sel_fail(d, CX_EUNSUPPORTED,
                               "CONNEX_BACKEND=ucx: UCX lists no transport "
                               "(UCX_TLS too narrow?): %s",
                               p->ucx.note);
        return 0;
    }
    return 1;
}

/* Its RDMA devices: the user's CONNEX_NET_DEVICES list as given, else the NICs of the GPUs
 * (first backend only), else none. */
static void ucx_plan(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d, int i, cx_plan_be_t *pl)
{
    (void)p;
    const char *ov = o && o->net_devices && *o->net_devices ? o->net_devices : NULL;
    if (ov && !strchr(ov, '=')) {
        cx_sel_copy(pl->devices, sizeof pl->devices, ov);
        pl->devices_exact = 1;
    } else if ((d->be[i].caps & CX_CAP_RDMA) && i == 0) {
        cx_sel_copy(pl->devices, sizeof pl->devices, d->net_devices);
    }
    REASON(d, "plan: ucx devices %s%s",
           pl->devices[0] ? pl->devices
                          : "none (no RDMA: "
                            "tcp over the engine's interface, shared memory)",
           pl->devices_exact ? " (CONNEX_NET_DEVICES, as given)" : "");
}

static void ucx_gdr_why(const cx_probe_t *p, const cx_choice_t *c, char *why, size_t len)
{
    (void)c;
    if (p->ucx.probed && !p->ucx_cuda) snprintf(why, len, "UCX has no cuda_copy transport (UCX built without CUDA)");
}

static const char *ucx_inventory(const cx_probe_t *p)
{
    return p->ucx_resources[0] ? p->ucx_resources : p->ucx.note;
}

/* ---------------- libfabric ---------------- */

static unsigned fi_provider_caps(const char *prov)
{
    if (!strncmp(prov, "efa", 3)) return CX_CAP_EFA;
    if (!strncmp(prov, "verbs", 5)) return CX_CAP_IB | CX_CAP_ROCE;
    if (!strncmp(prov, "shm", 3)) return CX_CAP_SHM;
    return CX_CAP_TCP; /* tcp, sockets, udp;ofi_rxd */
}

static int list_has(const char *csv, const char *item)
{
    size_t n = strlen(item);
    for (const char *s = csv; s && *s;) {
        const char *e = strchr(s, ',');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (l == n && !strncmp(s, item, n)) return 1;
        s = e ? e + 1 : NULL;
    }
    return 0;
}

/* Provider and caps; verbs only where it is to take the RDMA ports. */
static int fab_instance(const cx_probe_t *p, const cx_select_opts_t *o, int want_verbs, cx_choice_t *c,
                        cx_decision_t *d, int forced)
{
    memset(c, 0, sizeof *c);
    snprintf(c->backend, sizeof c->backend, "libfabric");
    if (o->fi_provider && *o->fi_provider) {
        if (strlen(o->fi_provider) >= sizeof c->variant)
            return cx_sel_fail(d, CX_EINVAL, "CONNEX_FI_PROVIDER is longer than %zu characters", sizeof c->variant - 1);
        if (p->fabric.probed && p->fabric.loaded && !list_has(p->fi_providers, o->fi_provider))
            return cx_sel_fail(d, CX_EUNSUPPORTED,
                               "CONNEX_FI_PROVIDER=%s: libfabric lists no such RDM "
                               "provider with FI_RMA (it has: %s)",
                               o->fi_provider, p->fi_providers[0] ? p->fi_providers : "none");
        cx_sel_copy(c->variant, sizeof c->variant, o->fi_provider);
        c->caps = fi_provider_caps(o->fi_provider);
        REASON(d, "libfabric: provider %s forced by CONNEX_FI_PROVIDER", o->fi_provider);
        return 1;
    }
    if (p->fabric.probed && !p->fabric.loaded) {
        if (forced) return cx_sel_fail(d, CX_EUNSUPPORTED, "CONNEX_BACKEND=libfabric: %s", p->fabric.note);
        REASON(d, "libfabric: not usable: %s", p->fabric.note);
        return 0;
    }
    const char *prov = NULL;
    if (p->fi_efa)
        prov = "efa";
    else if (p->fi_verbs && want_verbs)
        prov = "verbs;ofi_rxm";
    else if (p->fi_tcp)
        prov = "tcp;ofi_rxm";
    else if (!p->fabric.probed)
        prov = "tcp;ofi_rxm"; /* built without headers: the default */
    else if (forced && p->fi_verbs)
        prov = "verbs;ofi_rxm";
    if (!prov) {
        if (forced)
            return cx_sel_fail(d, CX_EUNSUPPORTED,
                               "CONNEX_BACKEND=libfabric: libfabric %s lists no "
                               "usable RDM provider (need efa, verbs;ofi_rxm or tcp;ofi_rxm; it has: %s)",
                               p->fabric.version, p->fi_providers[0] ? p->fi_providers : "none");
        REASON(d, "libfabric: no efa, verbs or tcp provider (has: %s)", p->fi_providers[0] ? p->fi_providers : "none");
        return 0;
    }
    cx_sel_copy(c->variant, sizeof c->variant, prov);
    c->caps = fi_provider_caps(prov);
    return 1;
}

static double fab_samehost_rate(const cx_choice_t *c)
{
    return !strncmp(c->variant, "shm", 3) ? CX_RATE_SAMEHOST_LIBFABRIC_SHM
        : (c->caps & CX_CAP_TCP)          ? CX_RATE_SAMEHOST_LIBFABRIC_TCP
                                          : 0.0;
}

/* Endpoints of different providers cannot address each other: "tcp;ofi_rxm" and "tcp" share the
 * core provider, "efa" and "tcp;ofi_rxm" do not. */
static int fab_pairs(const cx_choice_t *a, const cx_choice_t *b)
{
    size_t la = strcspn(a->variant, ";"), lb = strcspn(b->variant, ";");
    return la == lb && !strncmp(a->variant, b->variant, la);
}

static int nic_ok(const cx_probe_rdma_t *r, int efa)
{
    return r->active_port > 0 && r->verbs_ok != 0 && (r->link == CX_LINK_EFA) == efa;
}

/* The NIC a single-domain instance opens: GPU 0's (the policy mapped the GPUs to the NICs of the
 * first backend's kind), else the first active one of the kind. -1: none. */
static int domain_nic(const cx_probe_t *p, const cx_decision_t *d, int first, int efa)
{
    if (first && d->n_gpu > 0 && d->nic_of_gpu[0] >= 0 && nic_ok(&p->rdma[d->nic_of_gpu[0]], efa))
        return d->nic_of_gpu[0];
    for (int i = 0; i < p->n_rdma; i++)
        if (nic_ok(&p->rdma[i], efa)) return i;
    return -1;
}

/* A NIC's libfabric domain name: EFA's RDM domains carry "-rdm". */
static void nic_domain(const cx_probe_t *p, int n, int efa, char *buf, size_t len)
{
    snprintf(buf, len, "%.*s%s", CX_SEL_NAME - 5, p->rdma[n].name, efa ? "-rdm" : "");
}

/* Multi-rail: the NICs serving the GPUs (nicmap.c: each GPU's nearest by PCIe distance), or on a
 * host without GPUs every usable NIC of the kind; the planned domain first. A region on GPU g
 * then moves over g's NIC, host memory over all of them. NICs no GPU is near (a DGX's storage
 * NICs) are left out where there are GPUs, as for UCX. */
static void plan_rails(const cx_probe_t *p, const cx_decision_t *d, int efa, cx_plan_be_t *pl)
{
    char nm[CX_SEL_NAME + 8];
    int use[CX_SEL_MAX_RDMA] = { 0 }, cnt = 0, by_gpu = 0;
    for (int g = 0; g < d->n_gpu; g++) {
        int n = d->nic_of_gpu[g];
        if (n >= 0 && n < CX_SEL_MAX_RDMA && nic_ok(&p->rdma[n], efa)) use[n] = by_gpu = 1;
    }
    for (int i = 0; i < p->n_rdma && i < CX_SEL_MAX_RDMA; i++) {
        if (!by_gpu) use[i] = nic_ok(&p->rdma[i], efa);
        cnt += use[i];
    }
    pl->domains[0] = pl->gpu_domains[0] = 0;
    if (cnt < 2) return; /* one NIC: no rails */
    cx_sel_appendf(pl->domains, sizeof pl->domains, "%s", pl->domain);
    for (int i = 0; i < p->n_rdma && i < CX_SEL_MAX_RDMA; i++) {
        if (!use[i]) continue;
        nic_domain(p, i, efa, nm, sizeof nm);
        if (strcmp(nm, pl->domain)) cx_sel_appendf(pl->domains, sizeof pl->domains, ",%s", nm);
    }
    for (int g = 0; g < d->n_gpu; g++) {
        int n = d->nic_of_gpu[g];
        if (n < 0 || !nic_ok(&p->rdma[n], efa)) continue;
        nic_domain(p, n, efa, nm, sizeof nm);
        cx_sel_appendf(pl->gpu_domains, sizeof pl->gpu_domains, "%s%d=%s", pl->gpu_domains[0] ? ";" : "",
                       p->gpu[g].ordinal >= 0 ? p->gpu[g].ordinal : g, nm);
    }
}

static void fab_plan(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d, int i, cx_plan_be_t *pl)
{
    (void)o;
    const cx_choice_t *c = &d->be[i];
    cx_sel_copy(pl->provider, sizeof pl->provider, c->variant);
    int efa = !strncmp(c->variant, "efa", 3), verbs = !strncmp(c->variant, "verbs", 5);
    int n = (efa || verbs) ? domain_nic(p, d, i == 0, efa) : -1;
    if (n >= 0) nic_domain(p, n, efa, pl->domain, sizeof pl->domain);
    if (n >= 0 && i == 0) plan_rails(p, d, efa, pl);
    REASON(d, "plan: libfabric opens provider %s%s%s%s", pl->provider, pl->domain[0] ? ", domain " : "", pl->domain,
           pl->domain[0] && p->n_gpu ? " (the NIC of GPU 0)" : "");
    if (pl->domains[0])
        REASON(d,
               "plan: libfabric rails %s: transfers from CONNEX_STRIPE_MIN on striped over them, "
               "a GPU's over its nearest NIC (%s)",
               pl->domains, pl->gpu_domains[0] ? pl->gpu_domains : "no GPU");
}

static void fab_gdr_why(const cx_probe_t *p, const cx_choice_t *c, char *why, size_t len)
{
    if ((c->caps & CX_CAP_EFA) && !p->fi_efa_hmem)
        snprintf(why, len,
                 "libfabric's efa provider lacks FI_HMEM (libfabric built "
                 "without CUDA support)");
    else if (!(c->caps & CX_CAP_EFA) && !p->fi_verbs_hmem)
        snprintf(why, len, "libfabric's %s provider lacks FI_HMEM", c->variant);
}

static const char *fab_inventory(const cx_probe_t *p)
{
    return p->fi_providers[0] ? p->fi_providers : "none";
}

/* ---------------- ZeroMQ ---------------- */

static int zmq_instance(const cx_probe_t *p, const cx_select_opts_t *o, int take_rdma, cx_choice_t *c, cx_decision_t *d,
                        int forced)
{
    (void)p, (void)o, (void)take_rdma, (void)d, (void)forced;
    memset(c, 0, sizeof *c);
    snprintf(c->backend, sizeof c->backend, "zmq");
    c->caps = CX_CAP_TCP;
    return 1;
}

/* ---------------- the table ---------------- */

const cx_sel_backend_t cx_sel_backends[] = {
    {
        .name = "ucx",
        .label = "UCX",
        .package = "libucx-dev",
        .probes = CX_PROBE_VERBS | CX_PROBE_UCX | CX_PROBE_CUDA,
        .reach = CX_CAP_TCP | CX_CAP_SHM | CX_CAP_IB | CX_CAP_ROCE,
        .rate_tcp = CX_RATE_TCP_UCX,
        .rate_rdma = CX_RATE_RDMA_UCX,
        .rate_shm = CX_RATE_SAMEHOST_UCX,
        .tcp_words = "UCX tcp",
        .shm_path = "same host (one tcp/lo lane)",
        .rdma_words = "rc/dc",
        .rdma_transports = "rc,dc,ud",
        .shm_transports = "cma,posix",
        .gdr_via = "UCX CUDA memory type",
        .unshared = "",
        .shows_devices = 1,
        .instance = ucx_instance,
        .plan = ucx_plan,
        .gdr_why = ucx_gdr_why,
        .inventory = ucx_inventory,
    },
    {
        .name = "libfabric",
        .label = "libfabric",
        .package = "libfabric-dev",
        .probes = CX_PROBE_VERBS | CX_PROBE_FABRIC | CX_PROBE_CUDA,
        .reach = CX_CAP_TCP | CX_CAP_SHM | CX_CAP_IB | CX_CAP_ROCE | CX_CAP_EFA,
        .rate_tcp = CX_RATE_TCP_LIBFABRIC,
        .rate_rdma = CX_RATE_RDMA_LIBFABRIC,
        .rate_shm = CX_RATE_SAMEHOST_LIBFABRIC_SHM,
        .tcp_words = "libfabric tcp;ofi_rxm",
        .shm_path = "shared memory",
        .rdma_words = "verbs",
        .rdma_transports = "verbs",
        .shm_transports = "shm",
        .gdr_via = "FI_HMEM (FI_HMEM_CUDA)",
        .unshared = " (or another provider)",
        .one_variant = 1,
        .shows_domain = 1,
        .instance = fab_instance,
        .samehost_rate = fab_samehost_rate,
        .pairs = fab_pairs,
        .plan = fab_plan,
        .gdr_why = fab_gdr_why,
        .inventory = fab_inventory,
    },
    {
        .name = "zmq",
        .label = "ZeroMQ",
        .package = "libzmq3-dev",
        .probes = 0,
        .reach = CX_CAP_TCP,
        .rate_tcp = CX_RATE_TCP_ZMQ,
        .rate_shm = CX_RATE_SAMEHOST_ZMQ,
        .tcp_words = "ZeroMQ",
        .shm_path = "shared memory",
        .rdma_transports = "",
        .shm_transports = "",
        .gdr_via = "",
        .unshared = "",
        .instance = zmq_instance,
    },
};
const int cx_sel_n_backends = (int)(sizeof cx_sel_backends / sizeof cx_sel_backends[0]);
/* the policy keeps one instance per entry in arrays of this size */
_Static_assert(sizeof cx_sel_backends / sizeof cx_sel_backends[0] <= CX_SEL_MAX_BE, "raise CX_SEL_MAX_BE");

int cx_sel_backend_rank(const char *name)
{
    for (int i = 0; name && i < cx_sel_n_backends; i++)
        if (!strcmp(cx_sel_backends[i].name, name)) return i;
    return cx_sel_n_backends;
}

const cx_sel_backend_t *cx_sel_backend(const char *name)
{
    int i = cx_sel_backend_rank(name);
    return i < cx_sel_n_backends ? &cx_sel_backends[i] : NULL;
}

void cx_sel_backend_names(char *buf, size_t len)
{
    if (len) buf[0] = 0;
    for (int i = 0; i < cx_sel_n_backends; i++) cx_sel_appendf(buf, len, "%s%s", i ? "|" : "", cx_sel_backends[i].name);
}

double cx_sel_samehost_rate(const cx_choice_t *c)
{
    const cx_sel_backend_t *b = cx_sel_backend(c->backend);
    return !b ? 0.0 : b->samehost_rate ? b->samehost_rate(c) : b->rate_shm;
}
