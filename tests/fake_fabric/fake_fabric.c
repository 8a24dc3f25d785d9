/* A stand-in for libfabric.so.1 that a test puts first on LD_LIBRARY_PATH: the library loader
 * seam of the selection probe (select/probe_libs.c) and of the libfabric backend
 * (backends/libfabric/fi_dl.c), which both dlopen "libfabric.so.1".
 *
 * It lists the providers named in CX_FAKE_FI_PROVIDERS ("efa+hmem,tcp;ofi_rxm,shm": "+hmem"
 * marks one that grants FI_HMEM) to the probe, and appends every fi_getinfo call the backend's
 * open makes (its hints ask FI_REMOTE_READ, the probe's do not) to the file CX_FAKE_FI_LOG, one
 * line each: "open prov=P domain=D hmem=0|1 mr_hmem=0|1". It opens nothing: such a call fails
 * with -FI_ENODATA, so the backend reports itself unusable and the engine goes on without it. */
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct fi_info *info_new(void)
{
    struct fi_info *i = calloc(1, sizeof *i);
    if (!i) return NULL;
    i->tx_attr = calloc(1, sizeof *i->tx_attr);
    i->rx_attr = calloc(1, sizeof *i->rx_attr);
    i->ep_attr = calloc(1, sizeof *i->ep_attr);
    i->domain_attr = calloc(1, sizeof *i->domain_attr);
    i->fabric_attr = calloc(1, sizeof *i->fabric_attr);
    if (!i->tx_attr || !i->rx_attr || !i->ep_attr || !i->domain_attr || !i->fabric_attr) {
        fi_freeinfo(i);
        return NULL;
    }
    return i;
}

void fi_freeinfo(struct fi_info *info)
{
    while (info) {
        struct fi_info *next = info->next;
        if (info->fabric_attr) {
            free(info->fabric_attr->prov_name);
            free(info->fabric_attr->name);
        }
        if (info->domain_attr) free(info->domain_attr->name);
        free(info->tx_attr);
        free(info->rx_attr);
        free(info->ep_attr);
        free(info->domain_attr);
        free(info->fabric_attr);
        free(info);
        info = next;
    }
}

struct fi_info *fi_dupinfo(const struct fi_info *info)
{
    struct fi_info *i = info_new();
    if (!i || !info) return i;
    i->caps = info->caps;
    i->mode = info->mode;
    i->ep_attr->type = info->ep_attr ? info->ep_attr->type : 0;
    if (info->fabric_attr && info->fabric_attr->prov_name)
        i->fabric_attr->prov_name = strdup(info->fabric_attr->prov_name);
    if (info->domain_attr && info->domain_attr->name) i->domain_attr->name = strdup(info->domain_attr->name);
    return i;
}

int fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags, const struct fi_info *hints,
               struct fi_info **info)
{
    (void)version;
    (void)node;
    (void)service;
    (void)flags;
    *info = NULL;
    const char *want = hints && hints->fabric_attr ? hints->fabric_attr->prov_name : NULL;
    uint64_t caps = hints ? hints->caps : 0;
    if (caps & FI_REMOTE_READ) {
        const char *path = getenv("CX_FAKE_FI_LOG");
        FILE *f = path ? fopen(path, "a") : NULL;
        if (f) {
            const char *dom = hints->domain_attr && hints->domain_attr->name ? hints->domain_attr->name : "";
            fprintf(f, "open prov=%s domain=%s hmem=%d mr_hmem=%d\n", want ? want : "", dom, (caps & FI_HMEM) != 0,
                    hints->domain_attr && (hints->domain_attr->mr_mode & FI_MR_HMEM) != 0);
            fclose(f);
        }
        return -FI_ENODATA;
    }
    const char *list = getenv("CX_FAKE_FI_PROVIDERS");
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list ? list : "");
    struct fi_info **tail = info;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *plus = strstr(t, "+hmem");
        int hmem = plus != NULL;
        if (plus) *plus = 0;
        if ((want && strcmp(want, t)) || ((caps & FI_HMEM) && !hmem)) continue;
        struct fi_info *i = info_new();
        if (!i || !(i->fabric_attr->prov_name = strdup(t))) {
            fi_freeinfo(i);
            break;
        }
        i->caps = caps;
        i->ep_attr->type = FI_EP_RDM;
        *tail = i;
        tail = &i->next;
    }
    return *info ? 0 : -FI_ENODATA;
}

int fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context)
{
    (void)attr;
    (void)fabric;
    (void)context;
    return -FI_ENOSYS;
}

const char *fi_strerror(int errnum)
{
    return errnum == FI_ENODATA ? "No data available (fake libfabric)" : "error (fake libfabric)";
}

uint32_t fi_version(void)
{
    return FI_VERSION(1, 17);
}
