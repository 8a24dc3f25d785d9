/* The policy: probe -> backends to open (best first), GPUDirect, NIC per GPU, with reasons.
 * Pure: reads nothing but its arguments (the options come in parsed, cx_select_opts_from). */
#include "cx_select.h"
#include "connex/options.h"
#include "probe_int.h"
#include "backends.h"
#include "rates.h"
#include "connex/connex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

void cx_select_opts_from(cx_select_opts_t *o, const cx_opts_t *opts, const char *cfg_backend)
{
    memset(o, 0, sizeof *o);
    const char *e = cx_opts_str(opts, "CONNEX_BACKEND");
    o->backend = (e && *e) ? e : cfg_backend;
    o->net_devices = cx_opts_str(opts, "CONNEX_NET_DEVICES");
    /* auto|0|1 (aliases off|on, no|yes); a bad value (logged by the parser) stays as it is, for
     * decide_gdr to refuse with its reason. */
    static const char *const gdr_words[] = { "auto", "0", "1" };
    unsigned long long gdr = cx_opts_num(opts, "CONNEX_GDR", NULL);
    o->gdr = cx_opts_bad(opts, "CONNEX_GDR") ? cx_opts_str(opts, "CONNEX_GDR") : gdr_words[gdr < 3 ? gdr : 0];
    o->fi_provider = cx_opts_str(opts, "CONNEX_FI_PROVIDER");
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

/* Active NICs of a kind, "mlx5_0:1 (InfiniBand), ..." into buf; returns the count. */
static int nics_of(const cx_probe_t *p, int efa, char *buf, size_t len)
{
    int n = 0;
    buf[0] = 0;
    for (int i = 0; i < p->n_rdma; i++) {
        const cx_probe_rdma_t *r = &p->rdma[i];
        if (!cx_sel_nic_usable(r) || (r->link == CX_LINK_EFA) != efa) continue;
        cx_sel_appendf(buf, len, "%s%s:%d (%s)", n ? ", " : "", r->name, r->active_port,
                       r->link == CX_LINK_EFA       ? "EFA"
                           : r->link == CX_LINK_IB  ? "InfiniBand"
                           : r->link == CX_LINK_ETH ? "RoCE"
                                                    : "unknown link");
        n++;
    }
    return n;
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
    const int nb = cx_sel_n_backends;
    const cx_sel_backend_t *B = cx_sel_backends;
    cx_choice_t inst[CX_SEL_MAX_BE];
    int ok[CX_SEL_MAX_BE] = { 0 }, is_built[CX_SEL_MAX_BE] = { 0 };
    /* Each built backend's instance, in the table's order: one takes the RDMA ports only where
     * no backend before it reaches them (libfabric verbs only where UCX cannot: otherwise it is
     * more use as the TCP path). */
    int rdma_taken = 0;
    for (int k = 0; k < nb; k++) {
        memset(&inst[k], 0, sizeof inst[k]);
        if (!(is_built[k] = built(p, B[k].name))) continue;
        int rc = B[k].instance(p, o, n_ib > 0 && !rdma_taken, &inst[k], d, 0);
        if (rc < 0) return rc; /* an explicit option (CONNEX_FI_PROVIDER) that cannot work */
        ok[k] = rc > 0;
        if (ok[k] && (inst[k].caps & (CX_CAP_IB | CX_CAP_ROCE))) rdma_taken = 1;
    }
    built_list(p, bl, sizeof bl);

    for (int i = 0; i < p->n_rdma; i++)
        if (p->rdma[i].active_port && p->rdma[i].verbs_ok == 0)
            REASON(d, "rdma: %s has an active port but no ibverbs provider: not used", p->rdma[i].name);

    /* rule 1: EFA -> the backend whose instance runs on it (libfabric/efa) */
    if (n_efa) {
        int k = 0;
        while (k < nb && !(ok[k] && (inst[k].caps & CX_CAP_EFA))) k++;
        int any = 0; /* the first backend that can reach EFA at all */
        while (any < nb && !(B[any].reach & CX_CAP_EFA)) any++;
        if (k < nb) {
            add(d, &inst[k]);
            REASON(d,
                   "rule efa: active EFA device(s) %s and %s's efa provider -> "
                   "%s/efa first",
                   efa_nics, B[k].name, B[k].name);
        } else if (any == nb || !is_built[any]) {
            REASON(d,
                   "rule efa: EFA device(s) %s present, but the %s backend is not built "
                   "(built: %s)",
                   efa_nics, any < nb ? B[any].name : "EFA", bl);
        } else {
            REASON(d,
                   "rule efa: EFA device(s) %s present, but %s lists no efa provider "
                   "(has: %s)",
                   efa_nics, B[any].name, B[any].inventory ? B[any].inventory(p) : "none");
        }
    }
    /* rule 2: active IB/RoCE port -> the first backend in the table that reaches it (UCX, else
     * libfabric verbs) */
    if (n_ib) {
        int first = 0; /* the table's first choice for RDMA ports */
        while (first < nb && !(B[first].reach & (CX_CAP_IB | CX_CAP_ROCE))) first++;
        int k = 0;
        while (k < nb && !(ok[k] && (inst[k].caps & (CX_CAP_IB | CX_CAP_ROCE)))) k++;
        if (k < nb && k == first) {
            add(d, &inst[k]);
            REASON(d, "rule rdma: active port(s) %s -> %s (%s%s)", rdma_nics, B[k].name, B[k].rdma_words,
                   (inst[k].caps & CX_CAP_ROCE) ? ", RoCE" : "");
        } else if (k < nb) {
            add(d, &inst[k]);
            REASON(d, "rule rdma: active port(s) %s; %s %s -> %s/%s", rdma_nics, B[first].label,
                   is_built[first] ? "has no RDMA transport" : "not built", B[k].name, inst[k].variant);
        } else {
            REASON(d,
                   "rule rdma: active port(s) %s, but no built backend reaches them "
                   "(built: %s; %s: %s)",
                   rdma_nics, bl, first < nb ? B[first].label : "none",
                   first < nb && B[first].inventory ? B[first].inventory(p) : "");
        }
    }
    if (!n_efa && !n_ib)
        REASON(d, "no usable RDMA port (%d RDMA device(s) in sysfs): TCP and shared memory only", p->n_rdma);

    /* rule 3: TCP, fastest measured first. Every usable backend is opened: peers pick per pair */
    int tcp[CX_SEL_MAX_BE];
    for (int k = 0; k < nb; k++) tcp[k] = k;
    /* sort by rate, stable on the table order (the build's preference) */
    for (int i = 1; i < nb; i++) {
        int x = tcp[i], j = i - 1;
        while (j >= 0 && B[x].rate_tcp > B[tcp[j]].rate_tcp) {
            tcp[j + 1] = tcp[j];
            j--;
        }
        tcp[j + 1] = x;
    }
    char rates[256] = "";
    for (int i = 0; i < nb; i++)
        cx_sel_appendf(rates, sizeof rates, "%s%s %.1f", i ? ", " : "", B[tcp[i]].tcp_words, B[tcp[i]].rate_tcp);
    int first_tcp = 1;
    for (int i = 0; i < nb; i++) {
        int k = tcp[i];
        if (!ok[k] || !(inst[k].caps & CX_CAP_TCP)) continue;
        if (first_tcp)
            REASON(d, "rule tcp: %s is the fastest TCP path measured (%.1f GB/s; %s)", B[k].name, B[k].rate_tcp, rates);
        first_tcp = 0;
        if (!has(d, B[k].name)) add(d, &inst[k]);
    }
    for (int k = 0; k < nb; k++) {
        if (!B[k].one_variant || !ok[k]) continue;
        /* a forced shm provider only serves same-host peers: open it last for them */
        if (!has(d, B[k].name) && (inst[k].caps & CX_CAP_SHM)) {
            add(d, &inst[k]);
            REASON(d, "%s/%s opened for same-host peers only", B[k].name, inst[k].variant);
        }
        /* one provider per instance: libfabric with efa cannot also do tcp */
        if (has(d, B[k].name) && !(inst[k].caps & CX_CAP_TCP)) {
            const char *other = "nothing";
            for (int m = nb - 1; m >= 0; m--)
                if (m != k && has(d, B[m].name)) other = B[m].name;
            REASON(d, "%s runs %s only (one provider per instance): TCP peers use %s", B[k].name, inst[k].variant,
                   other);
        }
    }
    if (!d->n) return fail(d, CX_EUNSUPPORTED, "no usable backend (built: %s)", bl);

    /* rule 4: same-host peers -> the opened backend that was measured fastest between two
     * processes of one host (cx_select_pair orders same-host pairs the same way) */
    double best = 0;
    const cx_choice_t *sh = NULL;
    for (int i = 0; i < d->n; i++)
        if (d->be[i].caps & CX_CAP_RDMA) {
            cx_sel_copy(d->same_host, sizeof d->same_host, d->be[i].backend);
            REASON(d,
                   "rule same-host: %s, RDMA looped back through the NIC (not measured here) "
                   "before the local paths",
                   d->be[i].backend);
            return CX_OK;
        }
    for (int i = 0; i < d->n; i++) {
        double r = cx_sel_samehost_rate(&d->be[i]);
        if (r > best) {
            best = r;
            sh = &d->be[i];
        }
    }
    if (sh) {
        cx_sel_copy(d->same_host, sizeof d->same_host, sh->backend);
        REASON(d,
               "rule same-host: %s%s%s, the fastest opened path measured between two processes "
               "of one host (connex-bench, 16 MiB read: libfabric shm %.1f GB/s, libfabric "
               "tcp;ofi_rxm over loopback %.1f, UCX %.1f: with peer error handling UCX 1.13 gives "
               "an endpoint one tcp/lo lane, no shared memory)",
               sh->backend, sh->variant[0] ? "/" : "", sh->variant, CX_RATE_SAMEHOST_LIBFABRIC_SHM,
               CX_RATE_SAMEHOST_LIBFABRIC_TCP, CX_RATE_SAMEHOST_UCX);
    } else {
        REASON(d,
               "rule same-host: no opened backend was measured on one host: same-host peers "
               "use the normal order");
    }
    return CX_OK;
}

static int decide_forced(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d)
{
    char bl[64];
    built_list(p, bl, sizeof bl);
    const char *b = o->backend;
    const cx_sel_backend_t *be = cx_sel_backend(b);
    if (!built(p, b))
        return fail(d, CX_EUNSUPPORTED,
                    "CONNEX_BACKEND=%s: the %s backend is not built into this "
                    "libconnex (built: %s); install %s and rebuild",
                    b, b, bl, be->package);
    cx_choice_t c;
    int n_ib = 0;
    for (int i = 0; i < p->n_rdma; i++) n_ib += cx_sel_nic_usable(&p->rdma[i]) && p->rdma[i].link != CX_LINK_EFA;
    int rc = be->instance(p, o, n_ib > 0, &c, d, 1);
    if (rc <= 0) return rc < 0 ? rc : CX_EUNSUPPORTED;
    add(d, &c);
    if (c.caps & CX_CAP_SHM) cx_sel_copy(d->same_host, sizeof d->same_host, b);
    REASON(d, "forced: CONNEX_BACKEND=%s (only this backend; no fallback)", b);
    return CX_OK;
}

static int decide_gdr(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d)
{
    int want = -1; /* auto */
    if (o->gdr && *o->gdr && strcasecmp(o->gdr, "auto")) {
        if (!strcmp(o->gdr, "0"))
            want = 0;
        else if (!strcmp(o->gdr, "1"))
            want = 1;
        else
            return fail(d, CX_EINVAL, "CONNEX_GDR=%s not understood (auto|0|1)", o->gdr);
    }
    char why[200] = "";
    const cx_choice_t *c = &d->be[0];
    int driver = p->peermem, attr_no = 0;
    for (int i = 0; i < p->n_gpu; i++) {
        if (p->gpu[i].dmabuf_attr == 1) driver = 1;
        if (p->gpu[i].gdr_attr == 0) attr_no = 1;
    }
    if (!p->n_gpu)
        snprintf(why, sizeof why, "no GPU");
    else if (!(c->caps & CX_CAP_RDMA))
        snprintf(why, sizeof why, "the first backend (%s) has no RDMA path", c->backend);
    else if (!driver)
        snprintf(why, sizeof why, "neither nvidia_peermem loaded nor dma-buf supported by the GPU");
    else if (attr_no)
        snprintf(why, sizeof why, "a GPU reports no GPUDirect RDMA support");
    else {
        const cx_sel_backend_t *be = cx_sel_backend(c->backend);
        if (be && be->gdr_why) be->gdr_why(p, c, why, sizeof why);
    }

    if (want == 0) {
        REASON(d, "gpudirect: off (CONNEX_GDR=0)%s", p->n_gpu ? ": GPU memory is staged" : "");
        return CX_OK;
    }
    if (why[0]) {
        if (want == 1) return fail(d, CX_EUNSUPPORTED, "CONNEX_GDR=1 but GPUDirect cannot work: %s", why);
        REASON(d, "gpudirect: off: %s%s", why,
               p->n_gpu ? "; GPU memory is staged through "
                          "pinned host memory"
                        : "");
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
    } else if (cx_sel_backend(b)) {
        rc = decide_forced(p, o, d);
    } else {
        char names[128];
        cx_sel_backend_names(names, sizeof names);
        return fail(d, CX_EINVAL, "CONNEX_BACKEND=%s not understood (auto|%s)", b, names);
    }
    if (rc) return rc;
    for (int i = 0; i < d->n; i++) d->backends[i] = d->be[i].backend;
    if ((rc = decide_gdr(p, o, d))) return rc;
    d->n_gpu = p->n_gpu;
    unsigned rd = d->be[0].caps & CX_CAP_RDMA;
    if (rd) {
        if ((rc = cx_select_nics(p, rd & CX_CAP_EFA ? CX_CAP_EFA : CX_CAP_IB | CX_CAP_ROCE, o->net_devices, d)))
            return rc; /* d->error says which entry */
    } else if (o->net_devices && *o->net_devices) {
        REASON(d,
               "CONNEX_NET_DEVICES=%s: no RDMA NIC to check or pin (the first backend has no RDMA "
               "path); UCX still gets it as UCX_NET_DEVICES (its TCP interfaces)",
               o->net_devices);
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
