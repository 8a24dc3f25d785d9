/* The policy: probe -> backends to open (best first), GPUDirect, NIC per GPU, with reasons.
 * Pure: reads nothing but its arguments (cx_select_opts_from_env is the one env reader). */
#include "cx_select.h"
#include "connex/options.h"
#include "probe_int.h"
#include "rates.h"
#include "connex/connex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define REASON(d, ...) do { cx_sel_appendf((d)->reasons, sizeof (d)->reasons, __VA_ARGS__); \
                            cx_sel_appendf((d)->reasons, sizeof (d)->reasons, "\n"); } while (0)

int cx_sel_fail(cx_decision_t *d, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->error, sizeof d->error, fmt, ap);
    va_end(ap);
    REASON(d, "error: %s", d->error);
    d->n = 0;
    return rc;
}
#define fail cx_sel_fail

void cx_select_opts_from_env(cx_select_opts_t *o, const char *cfg_backend)
{
    memset(o, 0, sizeof *o);
    const char *e;
    (void)cx_opt_get_str("CONNEX_BACKEND", &e);
    o->backend = (e && *e) ? e : cfg_backend;
    (void)cx_opt_get_str("CONNEX_NET_DEVICES", &o->net_devices);
    /* auto|0|1 (aliases off|on, no|yes); a bad value (logged by the parser) stays as it is, for
     * decide_gdr to refuse with its reason. */
    unsigned long long gdr;
    static const char *const gdr_words[] = { "auto", "0", "1" };
    if (cx_opt_get_num("CONNEX_GDR", &gdr) == CX_EINVAL) o->gdr = getenv("CONNEX_GDR");
    else o->gdr = gdr_words[gdr < 3 ? gdr : 0];
    (void)cx_opt_get_str("CONNEX_FI_PROVIDER", &o->fi_provider);
}

static int built(const cx_probe_t *p, const char *name)
{
    for (int i = 0; i < p->n_built; i++)
        if (!strcmp(p->built[i], name)) return 1;
    return 0;
}

static void built_list(const cx_probe_t *p, char *buf, size_t len)
{
    buf[0] = 0;
    for (int i = 0; i < p->n_built; i++) cx_sel_appendf(buf, len, "%s%s", i ? "," : "", p->built[i]);
    if (!p->n_built) snprintf(buf, len, "none");
}

static int nic_usable(const cx_probe_rdma_t *r) { return r->active_port > 0 && r->verbs_ok != 0; }

/* Active NICs of a kind, "mlx5_0:1 (InfiniBand), ..." into buf; returns the count. */
static int nics_of(const cx_probe_t *p, int efa, char *buf, size_t len)
{
    int n = 0;
    buf[0] = 0;
    for (int i = 0; i < p->n_rdma; i++) {
        const cx_probe_rdma_t *r = &p->rdma[i];
        if (!nic_usable(r) || (r->link == CX_LINK_EFA) != efa) continue;
        cx_sel_appendf(buf, len, "%s%s:%d (%s)", n ? ", " : "", r->name, r->active_port,
                       r->link == CX_LINK_EFA ? "EFA" : r->link == CX_LINK_IB ? "InfiniBand"
                       : r->link == CX_LINK_ETH ? "RoCE" : "unknown link");
        n++;
    }
    return n;
}

static unsigned fi_provider_caps(const char *prov)
{
    if (!strncmp(prov, "efa", 3)) return CX_CAP_EFA;
    if (!strncmp(prov, "verbs", 5)) return CX_CAP_IB | CX_CAP_ROCE;
    if (!strncmp(prov, "shm", 3)) return CX_CAP_SHM;
    return CX_CAP_TCP;   /* tcp, sockets, udp;ofi_rxd */
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

/* The libfabric instance this host would open: provider and caps; 0 when none is usable. */
static int fab_variant(const cx_probe_t *p, const cx_select_opts_t *o, int want_verbs,
                       cx_choice_t *c, cx_decision_t *d, int forced)
{
    memset(c, 0, sizeof *c);
    snprintf(c->backend, sizeof c->backend, "libfabric");
    if (o->fi_provider && *o->fi_provider) {
        if (strlen(o->fi_provider) >= sizeof c->variant)
            return fail(d, CX_EINVAL, "CONNEX_FI_PROVIDER is longer than %zu characters",
                        sizeof c->variant - 1);
        if (p->fabric.probed && p->fabric.loaded && !list_has(p->fi_providers, o->fi_provider))
            return fail(d, CX_EUNSUPPORTED, "CONNEX_FI_PROVIDER=%s: libfabric lists no such RDM "
                        "provider with FI_RMA (it has: %s)", o->fi_provider,
                        p->fi_providers[0] ? p->fi_providers : "none");
        cx_sel_copy(c->variant, sizeof c->variant, o->fi_provider);
        c->caps = fi_provider_caps(o->fi_provider);
        REASON(d, "libfabric: provider %s forced by CONNEX_FI_PROVIDER", o->fi_provider);
        return 1;
    }
    if (p->fabric.probed && !p->fabric.loaded) {
        if (forced)
            return fail(d, CX_EUNSUPPORTED, "CONNEX_BACKEND=libfabric: %s", p->fabric.note);
        REASON(d, "libfabric: not usable: %s", p->fabric.note);
        return 0;
    }
    const char *prov = NULL;
    if (p->fi_efa) prov = "efa";
    else if (p->fi_verbs && want_verbs) prov = "verbs;ofi_rxm";
    else if (p->fi_tcp) prov = "tcp;ofi_rxm";
    else if (!p->fabric.probed) prov = "tcp;ofi_rxm";   /* built without headers: the default */
    else if (forced && p->fi_verbs) prov = "verbs;ofi_rxm";
    if (!prov) {
        if (forced)
            return fail(d, CX_EUNSUPPORTED, "CONNEX_BACKEND=libfabric: libfabric %s lists no "
                        "usable RDM provider (need efa, verbs;ofi_rxm or tcp;ofi_rxm; it has: %s)",
                        p->fabric.version, p->fi_providers[0] ? p->fi_providers : "none");
        REASON(d, "libfabric: no efa, verbs or tcp provider (has: %s)",
               p->fi_providers[0] ? p->fi_providers : "none");
        return 0;
    }
    cx_sel_copy(c->variant, sizeof c->variant, prov);
    c->caps = fi_provider_caps(prov);
    return 1;
}

/* The UCX instance: its caps from the transports uct listed (RDMA only on active ports). */
static int ucx_variant(const cx_probe_t *p, cx_choice_t *c, cx_decision_t *d, int forced)
{
    memset(c, 0, sizeof *c);
    snprintf(c->backend, sizeof c->backend, "ucx");
    if (p->ucx.probed && !p->ucx.loaded) {
        if (forced) return fail(d, CX_EUNSUPPORTED, "CONNEX_BACKEND=ucx: %s", p->ucx.note);
        REASON(d, "ucx: not usable: %s", p->ucx.note);
        return 0;
    }
    unsigned nic_caps = 0;
    for (int i = 0; i < p->n_rdma; i++) {
        const cx_probe_rdma_t *r = &p->rdma[i];
        if (!nic_usable(r)) continue;
        if (r->link == CX_LINK_IB) nic_caps |= CX_CAP_IB;
        else if (r->link == CX_LINK_ETH) nic_caps |= CX_CAP_ROCE;
    }
    if (p->ucx.probed) {
        c->caps = p->ucx_caps & (CX_CAP_TCP | CX_CAP_SHM | nic_caps);
        if (nic_caps & ~p->ucx_caps & (CX_CAP_IB | CX_CAP_ROCE))
            REASON(d, "ucx: active RDMA ports, but UCX lists no rc/dc/ud transport on them "
                   "(UCX built without verbs support, or rdma-core provider missing)");
    } else {
        c->caps = CX_CAP_TCP | CX_CAP_SHM | nic_caps;
    }
    if (!c->caps) {
        if (forced)
            return fail(d, CX_EUNSUPPORTED, "CONNEX_BACKEND=ucx: UCX lists no transport "
                        "(UCX_TLS too narrow?): %s", p->ucx.note);
        return 0;
    }
    return 1;
}

static void add(cx_decision_t *d, const cx_choice_t *c)
{
    for (int i = 0; i < d->n; i++)
        if (!strcmp(d->be[i].backend, c->backend)) return;
    if (d->n == CX_SEL_MAX_BE) return;
    d->be[d->n++] = *c;
}

static int has(const cx_decision_t *d, const char *name)
{
    for (int i = 0; i < d->n; i++)
        if (!strcmp(d->be[i].backend, name)) return 1;
    return 0;
}

static int decide_auto(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d)
{
    char efa_nics[512], rdma_nics[512], bl[64];
    int n_efa = nics_of(p, 1, efa_nics, sizeof efa_nics);
    int n_ib = nics_of(p, 0, rdma_nics, sizeof rdma_nics);
    int b_ucx = built(p, "ucx"), b_fab = built(p, "libfabric"), b_zmq = built(p, "zmq");
    cx_choice_t fab, ucx;
    int ucx_ok = b_ucx && ucx_variant(p, &ucx, d, 0) > 0;
    /* libfabric takes verbs only where UCX cannot: otherwise it is more use as the TCP path */
    int want_verbs = n_ib > 0 && !(ucx_ok && (ucx.caps & (CX_CAP_IB | CX_CAP_ROCE)));
    int frc = b_fab ? fab_variant(p, o, want_verbs, &fab, d, 0) : 0;
    if (frc < 0) return frc;   /* an explicit CONNEX_FI_PROVIDER that cannot work */
    int fab_ok = frc > 0;
    built_list(p, bl, sizeof bl);

    for (int i = 0; i < p->n_rdma; i++)
        if (p->rdma[i].active_port && p->rdma[i].verbs_ok == 0)
            REASON(d, "rdma: %s has an active port but no ibverbs provider: not used",
                   p->rdma[i].name);

    /* rule 1: EFA -> libfabric/efa */
    if (n_efa) {
        if (fab_ok && (fab.caps & CX_CAP_EFA)) {
            add(d, &fab);
            REASON(d, "rule efa: active EFA device(s) %s and libfabric's efa provider -> "
                   "libfabric/efa first", efa_nics);
        } else if (!b_fab) {
            REASON(d, "rule efa: EFA device(s) %s present, but the libfabric backend is not built "
                   "(built: %s)", efa_nics, bl);
        } else {
            REASON(d, "rule efa: EFA device(s) %s present, but libfabric lists no efa provider "
                   "(has: %s)", efa_nics, p->fi_providers[0] ? p->fi_providers : "none");
        }
    }
    /* rule 2: active IB/RoCE port -> UCX (libfabric verbs when UCX cannot) */
    if (n_ib) {
        if (ucx_ok && (ucx.caps & (CX_CAP_IB | CX_CAP_ROCE))) {
            add(d, &ucx);
            REASON(d, "rule rdma: active port(s) %s -> ucx (rc/dc%s)", rdma_nics,
                   (ucx.caps & CX_CAP_ROCE) ? ", RoCE" : "");
        } else if (fab_ok && (fab.caps & (CX_CAP_IB | CX_CAP_ROCE))) {
            add(d, &fab);
            REASON(d, "rule rdma: active port(s) %s; UCX %s -> libfabric/verbs;ofi_rxm",
                   rdma_nics, b_ucx ? "has no RDMA transport" : "not built");
        } else {
            REASON(d, "rule rdma: active port(s) %s, but no built backend reaches them "
                   "(built: %s; UCX: %s)", rdma_nics, bl, p->ucx_resources[0] ? p->ucx_resources
                   : p->ucx.note);
        }
    }
    if (!n_efa && !n_ib)
        REASON(d, "no usable RDMA port (%d RDMA device(s) in sysfs): TCP and shared memory only",
               p->n_rdma);

    /* rule 3: TCP, fastest measured first. Every usable backend is opened: peers pick per pair */
    struct cx_tcp_path { const char *name; double rate; int ok; const cx_choice_t *c; } tcp[3] = {
        { "libfabric", CX_RATE_TCP_LIBFABRIC, fab_ok && (fab.caps & CX_CAP_TCP), &fab },
        { "ucx", CX_RATE_TCP_UCX, ucx_ok && (ucx.caps & CX_CAP_TCP), &ucx },
        { "zmq", CX_RATE_TCP_ZMQ, b_zmq, NULL },
    };
    cx_choice_t zmq;
    memset(&zmq, 0, sizeof zmq);
    snprintf(zmq.backend, sizeof zmq.backend, "zmq");
    zmq.caps = CX_CAP_TCP;
    tcp[2].c = &zmq;
    /* sort by rate, stable on the table order (the build's preference) */
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (tcp[j].rate > tcp[i].rate) { struct cx_tcp_path t = tcp[i]; tcp[i] = tcp[j]; tcp[j] = t; }
    int first_tcp = 1;
    for (int i = 0; i < 3; i++) {
        if (!tcp[i].ok) continue;
        if (first_tcp)
            REASON(d, "rule tcp: %s is the fastest TCP path measured (%.1f GB/s; libfabric "
                   "tcp;ofi_rxm %.1f, UCX tcp %.1f, ZeroMQ %.1f)", tcp[i].name, tcp[i].rate,
                   CX_RATE_TCP_LIBFABRIC, CX_RATE_TCP_UCX, CX_RATE_TCP_ZMQ);
        first_tcp = 0;
        if (!has(d, tcp[i].name)) add(d, tcp[i].c);
    }
    /* a forced shm provider only serves same-host peers: open it last for them */
    if (fab_ok && !has(d, "libfabric") && (fab.caps & CX_CAP_SHM)) {
        add(d, &fab);
        REASON(d, "libfabric/%s opened for same-host peers only", fab.variant);
    }
    /* libfabric with efa cannot also do tcp: it is one provider per instance */
    if (has(d, "libfabric") && fab_ok && !(fab.caps & CX_CAP_TCP))
        REASON(d, "libfabric runs %s only (one provider per instance): TCP peers use %s",
               fab.variant, has(d, "ucx") ? "ucx" : has(d, "zmq") ? "zmq" : "nothing");
    if (!d->n)
        return fail(d, CX_EUNSUPPORTED, "no usable backend (built: %s)", bl);

    /* rule 4: same-host peers -> the opened backend that was measured fastest between two
     * processes of one host (cx_select_pair orders same-host pairs the same way) */
    double best = 0;
    const cx_choice_t *sh = NULL;
    for (int i = 0; i < d->n; i++)
        if (d->be[i].caps & CX_CAP_RDMA) {
            cx_sel_copy(d->same_host, sizeof d->same_host, d->be[i].backend);
            REASON(d, "rule same-host: %s, RDMA looped back through the NIC (not measured here) "
                   "before the local paths", d->be[i].backend);
            return CX_OK;
        }
    for (int i = 0; i < d->n; i++) {
        double r = cx_rate_samehost(d->be[i].backend, d->be[i].variant, d->be[i].caps);
        if (r > best) { best = r; sh = &d->be[i]; }
    }
    if (sh) {
        cx_sel_copy(d->same_host, sizeof d->same_host, sh->backend);
        REASON(d, "rule same-host: %s%s%s, the fastest opened path measured between two processes "
               "of one host (connex-bench, 16 MiB read: libfabric shm %.1f GB/s, libfabric "
               "tcp;ofi_rxm over loopback %.1f, UCX %.1f: with peer error handling UCX 1.13 gives "
               "an endpoint one tcp/lo lane, no shared memory)", sh->backend,
               sh->variant[0] ? "/" : "", sh->variant, CX_RATE_SAMEHOST_LIBFABRIC_SHM,
               CX_RATE_SAMEHOST_LIBFABRIC_TCP, CX_RATE_SAMEHOST_UCX);
    } else {
        REASON(d, "rule same-host: no opened backend was measured on one host: same-host peers "
               "use the normal order");
    }
    return CX_OK;
}

static int decide_forced(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d)
{
    char bl[64];
    built_list(p, bl, sizeof bl);
    const char *b = o->backend;
    if (!built(p, b)) {
        const char *dev = !strcmp(b, "ucx") ? "libucx-dev" : !strcmp(b, "libfabric")
                          ? "libfabric-dev" : "libzmq3-dev";
        return fail(d, CX_EUNSUPPORTED, "CONNEX_BACKEND=%s: the %s backend is not built into this "
                    "libconnex (built: %s); install %s and rebuild", b, b, bl, dev);
    }
    cx_choice_t c;
    int n_ib = 0;
    for (int i = 0; i < p->n_rdma; i++)
        n_ib += nic_usable(&p->rdma[i]) && p->rdma[i].link != CX_LINK_EFA;
    int rc;
    if (!strcmp(b, "ucx")) rc = ucx_variant(p, &c, d, 1);
    else if (!strcmp(b, "libfabric")) rc = fab_variant(p, o, n_ib > 0, &c, d, 1);
    else {
        memset(&c, 0, sizeof c);
        snprintf(c.backend, sizeof c.backend, "zmq");
        c.caps = CX_CAP_TCP;
        rc = 1;
    }
    if (rc <= 0) return rc < 0 ? rc : CX_EUNSUPPORTED;
    add(d, &c);
    if (c.caps & CX_CAP_SHM) cx_sel_copy(d->same_host, sizeof d->same_host, b);
    REASON(d, "forced: CONNEX_BACKEND=%s (only this backend; no fallback)", b);
    return CX_OK;
}

static int decide_gdr(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d)
{
    int want = -1;   /* auto */
    if (o->gdr && *o->gdr && strcasecmp(o->gdr, "auto")) {
        if (!strcmp(o->gdr, "0")) want = 0;
        else if (!strcmp(o->gdr, "1")) want = 1;
        else return fail(d, CX_EINVAL, "CONNEX_GDR=%s not understood (auto|0|1)", o->gdr);
    }
    char why[200] = "";
    const cx_choice_t *c = &d->be[0];
    int driver = p->peermem, attr_no = 0;
    for (int i = 0; i < p->n_gpu; i++) {
        if (p->gpu[i].dmabuf_attr == 1) driver = 1;
        if (p->gpu[i].gdr_attr == 0) attr_no = 1;
    }
    if (!p->n_gpu) snprintf(why, sizeof why, "no GPU");
    else if (!(c->caps & CX_CAP_RDMA))
        snprintf(why, sizeof why, "the first backend (%s) has no RDMA path", c->backend);
    else if (!driver)
        snprintf(why, sizeof why, "neither nvidia_peermem loaded nor dma-buf supported by the GPU");
    else if (attr_no)
        snprintf(why, sizeof why, "a GPU reports no GPUDirect RDMA support");
    else if (!strcmp(c->backend, "ucx") && p->ucx.probed && !p->ucx_cuda)
        snprintf(why, sizeof why, "UCX has no cuda_copy transport (UCX built without CUDA)");
    else if (!strcmp(c->backend, "libfabric") && (c->caps & CX_CAP_EFA) && !p->fi_efa_hmem)
        snprintf(why, sizeof why, "libfabric's efa provider lacks FI_HMEM (libfabric built "
                 "without CUDA support)");
    else if (!strcmp(c->backend, "libfabric") && !(c->caps & CX_CAP_EFA) && !p->fi_verbs_hmem)
        snprintf(why, sizeof why, "libfabric's %s provider lacks FI_HMEM", c->variant);

    if (want == 0) {
        REASON(d, "gpudirect: off (CONNEX_GDR=0)%s", p->n_gpu ? ": GPU memory is staged" : "");
        return CX_OK;
    }
    if (why[0]) {
        if (want == 1) return fail(d, CX_EUNSUPPORTED, "CONNEX_GDR=1 but GPUDirect cannot work: %s", why);
        REASON(d, "gpudirect: off: %s%s", why, p->n_gpu ? "; GPU memory is staged through "
               "pinned host memory" : "");
        return CX_OK;
    }
    d->gpudirect = 1;
    d->be[0].caps |= CX_CAP_GDR;
    REASON(d, "gpudirect: on: %s to %s (%s)", c->backend, p->n_gpu == 1 ? "the GPU" : "the GPUs",
           p->peermem ? "nvidia_peermem" : "dma-buf");
    return CX_OK;
}

int cx_select_decide_opts(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d)
{
    if (!d) return CX_EINVAL;
    memset(d, 0, sizeof *d);
    for (int i = 0; i < CX_SEL_MAX_GPU; i++) d->nic_of_gpu[i] = -1;
    if (!p) return fail(d, CX_EINVAL, "no probe");
    cx_select_opts_t none;
    memset(&none, 0, sizeof none);
    if (!o) o = &none;
    int rc;
    const char *b = o->backend;
    if (!b || !*b || !strcasecmp(b, "auto")) {
        rc = decide_auto(p, o, d);
    } else if (!strcmp(b, "ucx") || !strcmp(b, "libfabric") || !strcmp(b, "zmq")) {
        rc = decide_forced(p, o, d);
    } else {
        return fail(d, CX_EINVAL, "CONNEX_BACKEND=%s not understood (auto|ucx|libfabric|zmq)", b);
    }
    if (rc) return rc;
    for (int i = 0; i < d->n; i++) d->backends[i] = d->be[i].backend;
    if ((rc = decide_gdr(p, o, d))) return rc;
    d->n_gpu = p->n_gpu;
    unsigned rd = d->be[0].caps & CX_CAP_RDMA;
    if (rd) {
        if ((rc = cx_select_nics(p, rd & CX_CAP_EFA ? CX_CAP_EFA : CX_CAP_IB | CX_CAP_ROCE,
                                 o->net_devices, d)))
            return rc;   /* d->error says which entry */
    } else if (o->net_devices && *o->net_devices) {
        REASON(d, "CONNEX_NET_DEVICES=%s: no RDMA NIC to check or pin (the first backend has no RDMA "
               "path); UCX still gets it as UCX_NET_DEVICES (its TCP interfaces)", o->net_devices);
    }
    cx_select_plan(p, o, d);
    return CX_OK;
}

int cx_select_decide(const cx_probe_t *p, const char *forced, cx_decision_t *d)
{
    cx_select_opts_t o;
    memset(&o, 0, sizeof o);
    o.backend = forced;
    return cx_select_decide_opts(p, &o, d);
}
