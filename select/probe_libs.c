/* The library probes: libibverbs, libfabric, UCX (uct) and the CUDA driver, each through dlopen so
 * that connex-probe runs, and says what is missing, on hosts that lack any of them.
 *
 * Nothing is dlclose'd: UCX and CUDA do not support being unloaded (destructor state, driver
 * threads), libfabric and the ibverbs providers keep small allocations from their constructors
 * that leak checkers can only attribute (and suppress) while the library is still mapped, and a
 * libconnex with those backends has them loaded anyway. dlopen of a loaded library only counts. */
#include "cx_select.h"
#include "connex/backend.h"
#include "connex/options.h"
#include "probe_int.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<rdma/fabric.h>)
#include <rdma/fabric.h>
#define CX_SEL_HAVE_FABRIC_H 1
#endif
#if __has_include(<uct/api/uct.h>)
#include <uct/api/uct.h>
#define CX_SEL_HAVE_UCT_H 1
#endif
#endif

static void cx_sel_unload(void *h)
{
    (void)h;
}

/* dlsym into a function pointer without a pedantic object->function pointer cast warning */
#define CX_SYM(h, var, name) (*(void **)(&(var)) = dlsym((h), (name)))

/* Through the core's loader, which puts back the signal handlers a constructor installs (libucs's
 * take SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGHUP): probing leaves the process's own. */
static void *open_first(const char *const *names, cx_probe_lib_t *lib)
{
    char why[200] = "?";
    for (int i = 0; names[i]; i++) {
        void *h = cx_core_dlopen(names[i], i ? NULL : why, i ? 0 : sizeof why);
        if (h) {
            lib->loaded = 1;
            return h;
        }
    }
    snprintf(lib->note, sizeof lib->note, "%s not loadable: %s", names[0], why);
    return NULL;
}

/* ---------------- libibverbs ---------------- */

struct ibv_device;

void cx_sel_probe_verbs(cx_probe_t *p)
{
    static const char *const names[] = { "libibverbs.so.1", NULL };
    cx_probe_lib_t *lib = &p->verbs;
    lib->probed = 1;
    void *h = open_first(names, lib);
    if (!h) return;
    struct ibv_device **(*get_list)(int *) = NULL;
    const char *(*get_name)(struct ibv_device *) = NULL;
    void (*free_list)(struct ibv_device **) = NULL;
    CX_SYM(h, get_list, "ibv_get_device_list");
    CX_SYM(h, get_name, "ibv_get_device_name");
    CX_SYM(h, free_list, "ibv_free_device_list");
    if (!get_list || !get_name || !free_list) {
        snprintf(lib->note, sizeof lib->note, "libibverbs.so.1 lacks ibv_get_device_list");
        cx_sel_unload(h);
        return;
    }
    int n = 0;
    struct ibv_device **list = get_list(&n);
    if (!list) {
        snprintf(lib->note, sizeof lib->note, "ibv_get_device_list failed (no kernel RDMA support)");
        for (int i = 0; i < p->n_rdma; i++) p->rdma[i].verbs_ok = 0;
        cx_sel_unload(h);
        return;
    }
    snprintf(lib->note, sizeof lib->note, "%d verbs device(s)", n);
    for (int i = 0; i < p->n_rdma; i++) {
        p->rdma[i].verbs_ok = 0;
        for (int j = 0; j < n; j++) {
            const char *nm = get_name(list[j]);
            if (nm && !strcmp(nm, p->rdma[i].name)) p->rdma[i].verbs_ok = 1;
        }
        if (!p->rdma[i].verbs_ok)
            cx_sel_note(p,
                        "ibverbs: %s is in sysfs but has no user-space provider "
                        "(rdma-core driver package missing?)",
                        p->rdma[i].name);
    }
    free_list(list);
    cx_sel_unload(h);
}

/* ---------------- libfabric ---------------- */

#ifdef CX_SEL_HAVE_FABRIC_H
typedef struct {
    int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *, struct fi_info **);
    void (*freeinfo)(struct fi_info *);
    struct fi_info *(*dupinfo)(const struct fi_info *);
} cx_fab_fns_t;

/* FI_EP_RDM with RMA and messages: what the libfabric backend opens. */
static struct fi_info *fab_query(const cx_fab_fns_t *f, const char *prov, uint64_t extra_caps)
{
    struct fi_info *h = f->dupinfo(NULL), *info = NULL;
    if (!h) return NULL;
    h->caps = FI_RMA | FI_MSG | extra_caps;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT |
        ((extra_caps & FI_HMEM) ? FI_MR_HMEM : 0);
    if (prov) h->fabric_attr->prov_name = strdup(prov); /* fi_freeinfo frees it */
    int rc = f->getinfo(FI_VERSION(1, 14), NULL, NULL, 0, h, &info);
    f->freeinfo(h);
    return rc ? NULL : info;
}

static int fab_has(const cx_fab_fns_t *f, const char *prov, uint64_t extra_caps)
{
    struct fi_info *i = fab_query(f, prov, extra_caps);
    if (i) f->freeinfo(i);
    return i != NULL;
}
#endif

void cx_sel_probe_fabric(cx_probe_t *p)
{
    cx_probe_lib_t *lib = &p->fabric;
#ifndef CX_SEL_HAVE_FABRIC_H
    snprintf(lib->note, sizeof lib->note, "not probed: built without <rdma/fabric.h>");
    (void)p;
#else
    static const char *const names[] = { "libfabric.so.1", NULL };
    lib->probed = 1;
    void *h = open_first(names, lib);
    if (!h) return;
    cx_fab_fns_t f;
    uint32_t (*version)(void) = NULL;
    CX_SYM(h, f.getinfo, "fi_getinfo");
    CX_SYM(h, f.freeinfo, "fi_freeinfo");
    CX_SYM(h, f.dupinfo, "fi_dupinfo");
    CX_SYM(h, version, "fi_version");
    if (!f.getinfo || !f.freeinfo || !f.dupinfo) {
        snprintf(lib->note, sizeof lib->note, "libfabric.so.1 lacks fi_getinfo/fi_dupinfo");
        cx_sel_unload(h);
        return;
    }
    if (version) {
        uint32_t v = version();
        snprintf(lib->version, sizeof lib->version, "%u.%u", FI_MAJOR(v), FI_MINOR(v));
    }
    struct fi_info *all = fab_query(&f, NULL, 0);
    for (struct fi_info *i = all; i; i = i->next) {
        const char *pn = i->fabric_attr && i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "";
        char tok[64];
        snprintf(tok, sizeof tok, ",%s,", pn);
        char have[sizeof p->fi_providers + 2];
        snprintf(have, sizeof have, ",%s,", p->fi_providers);
        if (!*pn || strstr(have, tok)) continue;
        cx_sel_appendf(p->fi_providers, sizeof p->fi_providers, "%s%s", p->fi_providers[0] ? "," : "", pn);
        if (!strcmp(pn, "efa"))
            p->fi_efa = 1;
        else if (!strcmp(pn, "verbs;ofi_rxm"))
            p->fi_verbs = 1;
        else if (!strcmp(pn, "tcp;ofi_rxm") || !strcmp(pn, "tcp"))
            p->fi_tcp = 1;
        else if (!strcmp(pn, "shm"))
            p->fi_shm = 1;
    }
    if (all)
        f.freeinfo(all);
    else
        snprintf(lib->note, sizeof lib->note, "fi_getinfo: no RDM provider with FI_RMA|FI_MSG");
    /* FI_HMEM only matters where GPU memory could go to the NIC */
    if (p->fi_efa) p->fi_efa_hmem = fab_has(&f, "efa", FI_HMEM);
    if (p->fi_verbs) p->fi_verbs_hmem = fab_has(&f, "verbs;ofi_rxm", FI_HMEM);
    const char *env = getenv("FI_PROVIDER");
    if (env && *env) cx_sel_note(p, "libfabric: FI_PROVIDER=%s restricts the providers listed", env);
    cx_sel_unload(h);
#endif
}

/* ---------------- UCX (uct) ---------------- */

#ifdef CX_SEL_HAVE_UCT_H
static unsigned ucx_tl_caps(const cx_probe_t *p, const char *tl, const char *dev)
{
    if (!strcmp(tl, "tcp")) return CX_CAP_TCP;
    if (!strcmp(tl, "posix") || !strcmp(tl, "sysv") || !strcmp(tl, "cma") || !strcmp(tl, "xpmem") ||
        !strcmp(tl, "knem"))
        return CX_CAP_SHM;
    if (!strncmp(tl, "rc", 2) || !strncmp(tl, "dc", 2) || !strncmp(tl, "ud", 2)) {
        /* dev is "mlx5_0:1": the port's link layer says IB or RoCE */
        char name[CX_SEL_NAME];
        cx_sel_copy(name, sizeof name, dev);
        char *colon = strchr(name, ':');
        int port = colon ? atoi(colon + 1) : 0;
        if (colon) *colon = 0;
        for (int i = 0; i < p->n_rdma; i++) {
            if (strcmp(p->rdma[i].name, name)) continue;
            for (int k = 0; k < p->rdma[i].nports; k++)
                if (p->rdma[i].ports[k].num == port)
                    return p->rdma[i].ports[k].link == CX_LINK_ETH ? CX_CAP_ROCE : CX_CAP_IB;
            return p->rdma[i].link == CX_LINK_ETH ? CX_CAP_ROCE : CX_CAP_IB;
        }
        return CX_CAP_IB;
    }
    return 0;
}
#endif

void cx_sel_probe_ucx(cx_probe_t *p)
{
    cx_probe_lib_t *lib = &p->ucx;
#ifndef CX_SEL_HAVE_UCT_H
    snprintf(lib->note, sizeof lib->note, "not probed: built without <uct/api/uct.h>");
    (void)p;
#else
    static const char *const names[] = { "libuct.so.0", NULL };
    lib->probed = 1;
    void *h = open_first(names, lib);
    if (!h) return;
    ucs_status_t (*query_components)(uct_component_h **, unsigned *) = NULL;
    void (*release_components)(uct_component_h *) = NULL;
    ucs_status_t (*component_query)(uct_component_h, uct_component_attr_t *) = NULL;
    ucs_status_t (*md_config_read)(uct_component_h, const char *, const char *, uct_md_config_t **) = NULL;
    void (*config_release)(void *) = NULL;
    ucs_status_t (*md_open)(uct_component_h, const char *, const uct_md_config_t *, uct_md_h *) = NULL;
    void (*md_close)(uct_md_h) = NULL;
    ucs_status_t (*query_tl)(uct_md_h, uct_tl_resource_desc_t **, unsigned *) = NULL;
    void (*release_tl)(uct_tl_resource_desc_t *) = NULL;
    CX_SYM(h, query_components, "uct_query_components");
    CX_SYM(h, release_components, "uct_release_component_list");
    CX_SYM(h, component_query, "uct_component_query");
    CX_SYM(h, md_config_read, "uct_md_config_read");
    CX_SYM(h, config_release, "uct_config_release");
    CX_SYM(h, md_open, "uct_md_open");
    CX_SYM(h, md_close, "uct_md_close");
    CX_SYM(h, query_tl, "uct_md_query_tl_resources");
    CX_SYM(h, release_tl, "uct_release_tl_resource_list");
    if (!query_components || !release_components || !component_query || !md_config_read || !config_release ||
        !md_open || !md_close || !query_tl || !release_tl) {
        snprintf(lib->note, sizeof lib->note, "libuct.so.0 lacks the uct query API");
        return;
    }
    void *hp = cx_core_dlopen("libucp.so.0", NULL, 0);
    const char *(*ver)(void) = NULL;
    if (hp && CX_SYM(hp, ver, "ucp_get_version_string") && ver) cx_sel_copy(lib->version, sizeof lib->version, ver());

    uct_component_h *comps = NULL;
    unsigned ncomp = 0, nres_total = 0;
    if (query_components(&comps, &ncomp) != UCS_OK) {
        snprintf(lib->note, sizeof lib->note, "uct_query_components failed");
        return;
    }
    for (unsigned c = 0; c < ncomp; c++) {
        uct_component_attr_t ca;
        memset(&ca, 0, sizeof ca);
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
        if (component_query(comps[c], &ca) != UCS_OK || !ca.md_resource_count) continue;
        uct_md_resource_desc_t *mds = calloc(ca.md_resource_count, sizeof *mds);
        if (!mds) continue;
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        ca.md_resources = mds;
        unsigned nmd = ca.md_resource_count;
        if (component_query(comps[c], &ca) != UCS_OK) {
            free(mds);
            continue;
        }
        for (unsigned m = 0; m < nmd; m++) {
            uct_md_config_t *cfg = NULL;
            uct_md_h md = NULL;
            if (md_config_read(comps[c], NULL, NULL, &cfg) != UCS_OK) continue;
            ucs_status_t st = md_open(comps[c], mds[m].md_name, cfg, &md);
            config_release(cfg);
            if (st != UCS_OK) {
                cx_sel_note(p, "ucx: memory domain %s did not open", mds[m].md_name);
                continue;
            }
            uct_tl_resource_desc_t *res = NULL;
            unsigned nres = 0;
            if (query_tl(md, &res, &nres) == UCS_OK) {
                for (unsigned r = 0; r < nres; r++) {
                    nres_total++;
                    cx_sel_appendf(p->ucx_resources, sizeof p->ucx_resources, "%s%s/%s", p->ucx_resources[0] ? "," : "",
                                   res[r].tl_name, res[r].dev_name);
                    p->ucx_caps |= ucx_tl_caps(p, res[r].tl_name, res[r].dev_name);
                    if (!strcmp(res[r].tl_name, "cuda_copy")) p->ucx_cuda = 1;
                    if (!strcmp(res[r].tl_name, "gdr_copy")) p->ucx_gdr_copy = 1;
                }
                release_tl(res);
            }
            md_close(md);
        }
        free(mds);
    }
    release_components(comps);
    snprintf(lib->note, sizeof lib->note, "%u transport resource(s)", nres_total);
#endif
}

/* ---------------- CUDA driver ---------------- */

static void lower(char *s)
{
    for (; *s; s++) *s = (char)tolower((unsigned char)*s);
}

void cx_sel_probe_cuda(cx_probe_t *p, int mode)
{
    cx_probe_lib_t *lib = &p->cuda;
    if (mode == CX_SEL_CUDA_OFF) {
        snprintf(lib->note, sizeof lib->note, "skipped (CONNEX_PROBE_CUDA=0)");
        return;
    }
    /* cuInit costs hundreds of ms and a driver context's memory: only where a GPU can exist */
    FILE *ctl = fopen("/dev/nvidiactl", "r");
    if (ctl) fclose(ctl);
    if (!p->n_gpu && !ctl && mode != CX_SEL_CUDA_ON) {
        snprintf(lib->note, sizeof lib->note, "skipped: no NVIDIA GPU on PCI and no /dev/nvidiactl");
        return;
    }
    static const char *const names[] = { "libcuda.so.1", NULL };
    lib->probed = 1;
    void *h = open_first(names, lib);
    if (!h) return;
    int (*init)(unsigned) = NULL, (*drv_ver)(int *) = NULL, (*count)(int *) = NULL;
    int (*get)(int *, int) = NULL, (*get_name)(char *, int, int) = NULL;
    int (*bus_id)(char *, int, int) = NULL, (*attr)(int *, int, int) = NULL;
    CX_SYM(h, init, "cuInit");
    CX_SYM(h, drv_ver, "cuDriverGetVersion");
    CX_SYM(h, count, "cuDeviceGetCount");
    CX_SYM(h, get, "cuDeviceGet");
    CX_SYM(h, get_name, "cuDeviceGetName");
    CX_SYM(h, bus_id, "cuDeviceGetPCIBusId");
    CX_SYM(h, attr, "cuDeviceGetAttribute");
    if (!init || !count || !get || !get_name || !bus_id || !attr) {
        snprintf(lib->note, sizeof lib->note, "libcuda.so.1 lacks the driver API entry points");
        return;
    }
    int v = 0, n = 0, rc;
    if (drv_ver && !drv_ver(&v)) snprintf(lib->version, sizeof lib->version, "%d.%d", v / 1000, (v % 1000) / 10);
    if ((rc = init(0)) != 0) {
        /* 100 no device, 35 insufficient driver, 34 stub library */
        snprintf(lib->note, sizeof lib->note, "cuInit failed (CUresult %d)", rc);
        return;
    }
    if (count(&n) || n <= 0) {
        snprintf(lib->note, sizeof lib->note, "no CUDA device visible");
        return;
    }
    cx_probe_gpu_t seen[CX_SEL_MAX_GPU];
    int nseen = 0;
    for (int i = 0; i < n && nseen < CX_SEL_MAX_GPU; i++) {
        int dev = 0;
        if (get(&dev, i)) continue;
        cx_probe_gpu_t g;
        memset(&g, 0, sizeof g);
        g.ordinal = i;
        g.gdr_attr = g.dmabuf_attr = -1;
        g.pci.numa = -1;
        get_name(g.name, (int)sizeof g.name, dev);
        bus_id(g.pci.bdf, (int)sizeof g.pci.bdf, dev);
        lower(g.pci.bdf);
        int a;
        if (!attr(&a, 116 /* GPU_DIRECT_RDMA_SUPPORTED */, dev)) g.gdr_attr = a;
        if (!attr(&a, 124 /* DMA_BUF_SUPPORTED */, dev)) g.dmabuf_attr = a;
        /* keep the PCI chain that sysfs found for the same bus id */
        for (int k = 0; k < p->n_gpu; k++)
            if (!strcmp(p->gpu[k].pci.bdf, g.pci.bdf)) g.pci = p->gpu[k].pci;
        seen[nseen++] = g;
    }
    /* CUDA ordinals (after CUDA_VISIBLE_DEVICES) are what applications use: they replace the
     * PCI-order list; GPUs hidden from this process are not mapped */
    if (p->n_gpu > nseen)
        cx_sel_note(p, "cuda: %d of %d NVIDIA GPUs on PCI are visible to this process", nseen, p->n_gpu);
    memcpy(p->gpu, seen, sizeof seen[0] * (size_t)nseen);
    p->n_gpu = nseen;
    snprintf(lib->note, sizeof lib->note, "%d device(s)", nseen);
}
