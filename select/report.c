/* What connex-probe prints and the engine logs: the findings, the decision, the reasons. */
#include "cx_select.h"
#include "backends.h"
#include "probe_int.h"
#include "connex/connex.h"
#include "connex/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char *buf;
    size_t cap, need;
} cx_out_t;

static void outf(cx_out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(cx_out_t *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t off = o->need < o->cap ? o->need : (o->cap ? o->cap - 1 : 0);
    int w = vsnprintf(o->buf ? o->buf + off : NULL, o->cap > off ? o->cap - off : 0, fmt, ap);
    va_end(ap);
    if (w > 0) o->need += (size_t)w;
}

size_t cx_select_caps_str(unsigned caps, char *buf, size_t len)
{
    static const char *names[] = { "tcp", "shm", "ib", "roce", "efa", "gdr" };
    cx_out_t o = { buf, len, 0 };
    if (len) buf[0] = 0;
    for (int i = 0; i < 6; i++)
        if (caps & (1u << i)) outf(&o, "%s%s", o.need ? "," : "", names[i]);
    return o.need;
}

static const char *link_name(int l)
{
    return l == CX_LINK_IB ? "InfiniBand" : l == CX_LINK_ETH ? "Ethernet (RoCE)" : l == CX_LINK_EFA ? "EFA" : "unknown";
}

static void lib_text(cx_out_t *o, const char *name, const cx_probe_lib_t *l)
{
    outf(o, "  %-10s %s%s%s%s%s\n", name,
         !l->probed      ? "not probed"
             : l->loaded ? "loaded"
                         : "absent",
         l->version[0] ? " " : "", l->version, l->note[0] ? ": " : "", l->note);
}

/* Indent each line of a multi-line text. */
static void lines_text(cx_out_t *o, const char *s, const char *indent)
{
    while (s && *s) {
        const char *e = strchr(s, '\n');
        int n = e ? (int)(e - s) : (int)strlen(s);
        if (n) outf(o, "%s%.*s\n", indent, n, s);
        s = e ? e + 1 : NULL;
    }
}

/* What each backend's open is given (cx_backend_params_t) and what it does with each kind of
 * memory: the plan, as the engine hands it over. */
static void plan_text(cx_out_t *o, const cx_probe_t *p, const cx_decision_t *d)
{
    outf(o, "plan:\n");
    for (int i = 0; i < d->n; i++) {
        const cx_plan_be_t *pl = &d->plan[i];
        outf(o, "  %s:", d->be[i].backend);
        if (pl->provider[0]) outf(o, " provider %s,", pl->provider);
        const cx_sel_backend_t *be = cx_sel_backend(d->be[i].backend);
        if (be && be->shows_domain) outf(o, " domain %s,", pl->domain[0] ? pl->domain : "(the provider's)");
        if (pl->domains[0]) outf(o, " rails %s,", pl->domains);
        if (be && be->shows_devices)
            outf(o, " devices %s%s,",
                 pl->devices[0] ? pl->devices
                                : "none (tcp on the engine's "
                                  "interface)",
                 pl->devices_exact ? " (as given)" : "");
        outf(o, " over %s\n", pl->transports[0] ? pl->transports : "-");
        outf(o, "    host memory: registered; cuda memory: %s (%s)\n",
             pl->gpudirect ? "GPUDirect" : "staged through pinned host memory", pl->gpudirect_via);
    }
    for (int g = 0; g < d->n_gpu; g++)
        if (d->nic_of_gpu[g] >= 0)
            outf(o, "  gpu%d -> %s\n", p->gpu[g].ordinal >= 0 ? p->gpu[g].ordinal : g, p->rdma[d->nic_of_gpu[g]].name);
}

size_t cx_select_report_text(const cx_probe_t *p, const cx_decision_t *d, int rc, char *buf, size_t len)
{
    cx_out_t o = { buf, len, 0 };
    char tmp[64];
    if (len) buf[0] = 0;
    outf(&o, "host: %s\n", p->host_id);
    outf(&o, "backends built:");
    for (int i = 0; i < p->n_built; i++) outf(&o, " %s", p->built[i]);
    outf(&o, "%s\nlibraries:\n", p->n_built ? "" : " none");
    lib_text(&o, "ibverbs", &p->verbs);
    lib_text(&o, "libfabric", &p->fabric);
    lib_text(&o, "ucx", &p->ucx);
    lib_text(&o, "cuda", &p->cuda);
    outf(&o, "rdma devices (%s/class/infiniband): %d\n", p->sysfs_root, p->n_rdma);
    for (int i = 0; i < p->n_rdma; i++) {
        const cx_probe_rdma_t *r = &p->rdma[i];
        outf(&o, "  %-12s %-10s pci %-12s numa %2d  ", r->name, r->driver[0] ? r->driver : "?",
             r->pci.bdf[0] ? r->pci.bdf : "-", r->pci.numa);
        for (int k = 0; k < r->nports; k++)
            outf(&o, "port %d %s %s  ", r->ports[k].num, r->ports[k].active ? "ACTIVE" : "down",
                 link_name(r->ports[k].link));
        outf(&o, "%s\n", r->verbs_ok == 0 ? "[no verbs provider]" : "");
    }
    outf(&o, "libfabric providers: %s%s%s\n", p->fi_providers[0] ? p->fi_providers : "none",
         p->fi_efa ? (p->fi_efa_hmem ? " (efa with FI_HMEM)" : " (efa without FI_HMEM)") : "",
         p->fi_verbs_hmem ? " (verbs with FI_HMEM)" : "");
    cx_select_caps_str(p->ucx_caps, tmp, sizeof tmp);
    outf(&o, "ucx transports: %s\n  ucx reaches: %s%s%s\n", p->ucx_resources[0] ? p->ucx_resources : "none",
         tmp[0] ? tmp : "nothing", p->ucx_cuda ? ", cuda memory" : "", p->ucx_gdr_copy ? ", gdr_copy" : "");
    outf(&o, "gpus: %d  (nvidia_peermem %s)\n", p->n_gpu, p->peermem ? "loaded" : "not loaded");
    for (int i = 0; i < p->n_gpu; i++) {
        const cx_probe_gpu_t *g = &p->gpu[i];
        outf(&o, "  gpu%-2d %-24s pci %-12s numa %2d  gdr-attr %d  dma-buf %d\n", g->ordinal >= 0 ? g->ordinal : i,
             g->name[0] ? g->name : "(sysfs only)", g->pci.bdf, g->pci.numa, g->gdr_attr, g->dmabuf_attr);
    }
    if (p->notes[0]) {
        outf(&o, "notes:\n");
        lines_text(&o, p->notes, "  ");
    }

    outf(&o, "\ndecision: %s\n", rc == CX_OK ? "ok" : cx_strerror(rc));
    if (rc != CX_OK) outf(&o, "  error: %s\n", d->error);
    for (int i = 0; i < d->n; i++) {
        cx_select_caps_str(d->be[i].caps, tmp, sizeof tmp);
        outf(&o, "  %d. %-10s %-14s reaches: %s\n", i + 1, d->be[i].backend,
             d->be[i].variant[0] ? d->be[i].variant : "-", tmp);
    }
    if (rc == CX_OK) {
        outf(&o, "  same-host peers: %s\n", d->same_host[0] ? d->same_host : "normal order");
        outf(&o, "  gpudirect: %s\n", d->gpudirect ? "on" : "off");
        if (d->net_devices[0]) outf(&o, "  net devices: %s\n", d->net_devices);
        for (int g = 0; g < d->n_gpu; g++)
            if (d->nic_of_gpu[g] >= 0)
                outf(&o, "  gpu%d -> %s\n", p->gpu[g].ordinal >= 0 ? p->gpu[g].ordinal : g,
                     p->rdma[d->nic_of_gpu[g]].name);
    }
    if (rc == CX_OK) plan_text(&o, p, d);
    outf(&o, "reasons:\n");
    lines_text(&o, d->reasons, "  - ");
    return o.need;
}

size_t cx_select_report_plan(const cx_probe_t *p, const cx_decision_t *d, int rc, char *buf, size_t len)
{
    cx_out_t o = { buf, len, 0 };
    if (buf && len) buf[0] = 0;
    if (rc != CX_OK)
        outf(&o, "no plan: %s\n", d->error);
    else
        plan_text(&o, p, d);
    return o.need;
}

static void jstr(cx_out_t *o, const char *s)
{
    outf(o, "\"");
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            outf(o, "\\%c", c);
        else if (c == '\n')
            outf(o, "\\n");
        else if (c < 0x20)
            outf(o, "\\u%04x", c);
        else
            outf(o, "%c", c);
    }
    outf(o, "\"");
}

static void jlib(cx_out_t *o, const char *name, const cx_probe_lib_t *l, int last)
{
    outf(o, "\"%s\":{\"probed\":%s,\"loaded\":%s,\"version\":", name, l->probed ? "true" : "false",
         l->loaded ? "true" : "false");
    jstr(o, l->version);
    outf(o, ",\"note\":");
    jstr(o, l->note);
    outf(o, "}%s", last ? "" : ",");
}

/* A newline-separated text as a JSON array of strings. */
static void jlines(cx_out_t *o, const char *s)
{
    outf(o, "[");
    int first = 1;
    while (s && *s) {
        const char *e = strchr(s, '\n');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n) {
            char line[512];
            snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), s);
            outf(o, "%s", first ? "" : ",");
            jstr(o, line);
            first = 0;
        }
        s = e ? e + 1 : NULL;
    }
    outf(o, "]");
}

size_t cx_select_report_json(const cx_probe_t *p, const cx_decision_t *d, int rc, char *buf, size_t len)
{
    cx_out_t o = { buf, len, 0 };
    char tmp[64];
    if (len) buf[0] = 0;
    outf(&o, "{\"probe\":{\"host\":");
    jstr(&o, p->host_id);
    outf(&o, ",\"sysfs_root\":");
    jstr(&o, p->sysfs_root);
    outf(&o, ",\"built\":[");
    for (int i = 0; i < p->n_built; i++) {
        outf(&o, "%s", i ? "," : "");
        jstr(&o, p->built[i]);
    }
    outf(&o, "],\"libraries\":{");
    jlib(&o, "ibverbs", &p->verbs, 0);
    jlib(&o, "libfabric", &p->fabric, 0);
    jlib(&o, "ucx", &p->ucx, 0);
    jlib(&o, "cuda", &p->cuda, 1);
    outf(&o, "},\"rdma\":[");
    for (int i = 0; i < p->n_rdma; i++) {
        const cx_probe_rdma_t *r = &p->rdma[i];
        outf(&o, "%s{\"name\":", i ? "," : "");
        jstr(&o, r->name);
        outf(&o, ",\"driver\":");
        jstr(&o, r->driver);
        outf(&o, ",\"pci\":");
        jstr(&o, r->pci.bdf);
        outf(&o, ",\"numa\":%d,\"link\":", r->pci.numa);
        jstr(&o, link_name(r->link));
        outf(&o, ",\"active_port\":%d,\"verbs_ok\":%d,\"ports\":[", r->active_port, r->verbs_ok);
        for (int k = 0; k < r->nports; k++) {
            outf(&o, "%s{\"port\":%d,\"active\":%s,\"link\":", k ? "," : "", r->ports[k].num,
                 r->ports[k].active ? "true" : "false");
            jstr(&o, link_name(r->ports[k].link));
            outf(&o, "}");
        }
        outf(&o, "]}");
    }
    outf(&o, "],\"libfabric_providers\":");
    jstr(&o, p->fi_providers);
    outf(&o, ",\"efa\":%s,\"efa_hmem\":%s,\"ucx_transports\":", p->fi_efa ? "true" : "false",
         p->fi_efa_hmem ? "true" : "false");
    jstr(&o, p->ucx_resources);
    cx_select_caps_str(p->ucx_caps, tmp, sizeof tmp);
    outf(&o, ",\"ucx_reaches\":");
    jstr(&o, tmp);
    outf(&o, ",\"ucx_cuda\":%s,\"peermem\":%s,\"gpus\":[", p->ucx_cuda ? "true" : "false",
         p->peermem ? "true" : "false");
    for (int i = 0; i < p->n_gpu; i++) {
        const cx_probe_gpu_t *g = &p->gpu[i];
        outf(&o, "%s{\"ordinal\":%d,\"name\":", i ? "," : "", g->ordinal);
        jstr(&o, g->name);
        outf(&o, ",\"pci\":");
        jstr(&o, g->pci.bdf);
        outf(&o, ",\"numa\":%d,\"gdr_attr\":%d,\"dmabuf_attr\":%d}", g->pci.numa, g->gdr_attr, g->dmabuf_attr);
    }
    outf(&o, "],\"notes\":");
    jlines(&o, p->notes);
    outf(&o, "},\"decision\":{\"ok\":%s,\"status\":", rc == CX_OK ? "true" : "false");
    jstr(&o, cx_strerror(rc));
    outf(&o, ",\"error\":");
    jstr(&o, d->error);
    outf(&o, ",\"backends\":[");
    for (int i = 0; i < d->n; i++) {
        cx_select_caps_str(d->be[i].caps, tmp, sizeof tmp);
        outf(&o, "%s{\"backend\":", i ? "," : "");
        jstr(&o, d->be[i].backend);
        outf(&o, ",\"variant\":");
        jstr(&o, d->be[i].variant);
        outf(&o, ",\"reaches\":");
        jstr(&o, tmp);
        outf(&o, "}");
    }
    outf(&o, "],\"same_host\":");
    jstr(&o, d->same_host);
    outf(&o, ",\"gpudirect\":%s,\"net_devices\":", d->gpudirect ? "true" : "false");
    jstr(&o, d->net_devices);
    outf(&o, ",\"nic_of_gpu\":[");
    for (int g = 0; g < d->n_gpu; g++) {
        outf(&o, "%s", g ? "," : "");
        if (d->nic_of_gpu[g] >= 0)
            jstr(&o, p->rdma[d->nic_of_gpu[g]].name);
        else
            outf(&o, "null");
    }
    outf(&o, "],\"plan\":[");
    for (int i = 0; i < d->n; i++) {
        const cx_plan_be_t *pl = &d->plan[i];
        outf(&o, "%s{\"backend\":", i ? "," : "");
        jstr(&o, d->be[i].backend);
        outf(&o, ",\"provider\":");
        jstr(&o, pl->provider);
        outf(&o, ",\"domain\":");
        jstr(&o, pl->domain);
        outf(&o, ",\"rails\":");
        jstr(&o, pl->domains);
        outf(&o, ",\"gpu_rails\":");
        jstr(&o, pl->gpu_domains);
        outf(&o, ",\"devices\":");
        jstr(&o, pl->devices);
        outf(&o, ",\"devices_exact\":%s,\"transports\":", pl->devices_exact ? "true" : "false");
        jstr(&o, pl->transports);
        outf(&o, ",\"memory\":{\"host\":\"registered\",\"cuda\":{\"gpudirect\":%s,\"via\":",
             pl->gpudirect ? "true" : "false");
        jstr(&o, pl->gpudirect_via);
        outf(&o, "}}}");
    }
    outf(&o, "],\"reasons\":");
    jlines(&o, d->reasons);
    outf(&o, "}}\n");
    return o.need;
}

void cx_select_log(const cx_probe_t *p, const cx_decision_t *d, int rc)
{
    char order[128] = "";
    for (int i = 0; i < d->n; i++)
        cx_sel_appendf(order, sizeof order, "%s%s%s%s", i ? "," : "", d->be[i].backend, d->be[i].variant[0] ? "/" : "",
                       d->be[i].variant);
    if (rc != CX_OK)
        cx_error("select: %s", d->error);
    else
        cx_info("select: backends %s; same-host %s; gpudirect %s; %d GPU(s), %d RDMA device(s)%s%s", order,
                d->same_host[0] ? d->same_host : "-", d->gpudirect ? "on" : "off", p->n_gpu, p->n_rdma,
                d->net_devices[0] ? "; nics " : "", d->net_devices);
    const char *s = d->reasons;
    while (s && *s) {
        const char *e = strchr(s, '\n');
        int n = e ? (int)(e - s) : (int)strlen(s);
        if (n) cx_info("select: %.*s", n, s);
        s = e ? e + 1 : NULL;
    }
}
