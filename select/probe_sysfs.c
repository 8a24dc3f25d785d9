/* The sysfs part of the probe: RDMA devices with port state and link layer, the PCI path of each
 * device and GPU (for NIC-per-GPU), and whether nvidia_peermem is loaded. sysfs is read rather
 * than ibverbs so that the probe works without rdma-core and is testable on synthetic trees. */
#include "cx_select.h"
#include "probe_int.h"
#include "connex/connex.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

int cx_sel_read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (len) buf[0] = 0;
        return -1;
    }
    if (!fgets(buf, (int)len, f)) {
        fclose(f);
        buf[0] = 0;
        return -1;
    }
    fclose(f);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) buf[--n] = 0;
    return 0;
}

static int is_bdf(const char *s)
{
    /* dddd:bb:dd.f, hex */
    static const char pat[] = "xxxx:xx:xx.x";
    if (strlen(s) != sizeof pat - 1) return 0;
    for (size_t i = 0; pat[i]; i++) {
        if (pat[i] == 'x') {
            if (!strchr("0123456789abcdefABCDEF", s[i])) return 0;
        } else if (s[i] != pat[i])
            return 0;
    }
    return 1;
}

static int is_pci_root(const char *s)
{
    return !strncmp(s, "pci", 3) && strlen(s) == 10 && s[7] == ':'; /* pci0000:00 */
}

/* The PCI chain of the device a sysfs link points at: root complex, bridges, device. */
int cx_sel_pci_from_link(const char *link, cx_probe_pci_t *pci)
{
    memset(pci, 0, sizeof *pci);
    pci->numa = -1;
    char real[PATH_MAX];
    if (!realpath(link, real)) return -1;
    char tmp[PATH_MAX];
    cx_sel_copy(tmp, sizeof tmp, real);
    int started = 0;
    char *save = NULL;
    for (char *tok = strtok_r(tmp, "/", &save); tok; tok = strtok_r(NULL, "/", &save)) {
        if (!started && is_pci_root(tok)) {
            started = 1;
            pci->depth = 0;
        }
        if (!started) continue;
        if (!is_pci_root(tok) && !is_bdf(tok)) break; /* e.g. virtfn, net/... below it */
        if (pci->depth == CX_SEL_PCI_DEPTH) return -1;
        cx_sel_copy(pci->chain[pci->depth++], sizeof pci->chain[0], tok);
    }
    if (pci->depth < 2 || !is_bdf(pci->chain[pci->depth - 1])) {
        pci->depth = 0;
        return -1;
    }
    cx_sel_copy(pci->bdf, sizeof pci->bdf, pci->chain[pci->depth - 1]);
    char path[PATH_MAX + 16], v[32];
    snprintf(path, sizeof path, "%s/numa_node", real);
    if (!cx_sel_read_line(path, v, sizeof v)) pci->numa = atoi(v);
    if (pci->numa < 0) pci->numa = -1;
    return 0;
}

static int link_of(const char *s)
{
    if (!strcasecmp(s, "InfiniBand")) return CX_LINK_IB;
    if (!strcasecmp(s, "Ethernet")) return CX_LINK_ETH;
    return CX_LINK_UNKNOWN;
}

static int name_cmp(const void *a, const void *b)
{
    return strverscmp(((const cx_probe_rdma_t *)a)->name, ((const cx_probe_rdma_t *)b)->name);
}

static void probe_one_rdma(const char *root, const char *name, cx_probe_rdma_t *r)
{
    char path[PATH_MAX], v[64], real[PATH_MAX];
    memset(r, 0, sizeof *r);
    r->verbs_ok = -1;
    cx_sel_copy(r->name, sizeof r->name, name);
    snprintf(path, sizeof path, "%s/class/infiniband/%s/device", root, name);
    cx_sel_pci_from_link(path, &r->pci);
    snprintf(path, sizeof path, "%s/class/infiniband/%s/device/driver", root, name);
    if (realpath(path, real)) {
        const char *b = strrchr(real, '/');
        cx_sel_copy(r->driver, sizeof r->driver, b ? b + 1 : real);
    }
    snprintf(path, sizeof path, "%s/class/infiniband/%s/device/vendor", root, name);
    int amazon = !cx_sel_read_line(path, v, sizeof v) && !strcasecmp(v, "0x1d0f");
    int efa = amazon || !strcmp(r->driver, "efa");

    snprintf(path, sizeof path, "%s/class/infiniband/%s/ports", root, name);
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d)) && r->nports < CX_SEL_MAX_PORTS) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        int num = atoi(de->d_name), lk = CX_LINK_UNKNOWN, active = 0;
        snprintf(path, sizeof path, "%s/class/infiniband/%s/ports/%s/state", root, name, de->d_name);
        /* "4: ACTIVE" */
        if (!cx_sel_read_line(path, v, sizeof v)) active = strstr(v, "ACTIVE") != NULL;
        snprintf(path, sizeof path, "%s/class/infiniband/%s/ports/%s/link_layer", root, name, de->d_name);
        if (!cx_sel_read_line(path, v, sizeof v)) lk = link_of(v);
        if (efa) lk = CX_LINK_EFA;
        r->ports[r->nports].num = num;
        r->ports[r->nports].active = active;
        r->ports[r->nports].link = lk;
        r->nports++;
    }
    if (d) closedir(d);
    /* readdir order is arbitrary; the first active port by number is the one UCX lists first */
    for (int i = 0; i < r->nports; i++) {
        if (r->ports[i].active && (!r->active_port || r->ports[i].num < r->active_port)) {
            r->active_port = r->ports[i].num;
            r->link = r->ports[i].link;
        }
    }
    if (!r->active_port && r->nports) r->link = r->ports[0].link;
    if (!r->nports && efa) r->link = CX_LINK_EFA;
}

static void probe_rdma(cx_probe_t *p, const char *root)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/class/infiniband", root);
    DIR *d = opendir(path);
    if (!d) {
        cx_sel_note(p, "sysfs: no %s (no RDMA driver loaded)", path);
        return;
    }
    struct dirent *de;
    int skipped = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        if (p->n_rdma == CX_SEL_MAX_RDMA) {
            skipped++;
            continue;
        }
        probe_one_rdma(root, de->d_name, &p->rdma[p->n_rdma++]);
    }
    closedir(d);
    if (skipped) cx_sel_note(p, "sysfs: %d RDMA devices beyond %d ignored", skipped, CX_SEL_MAX_RDMA);
    qsort(p->rdma, (size_t)p->n_rdma, sizeof p->rdma[0], name_cmp);
}

static int gpu_cmp(const void *a, const void *b)
{
    return strcmp(((const cx_probe_gpu_t *)a)->pci.bdf, ((const cx_probe_gpu_t *)b)->pci.bdf);
}

/* NVIDIA display/3D controllers by PCI id: enough for topology without loading CUDA. */
static void probe_gpus(cx_probe_t *p, const char *root)
{
    char path[PATH_MAX], v[32];
    snprintf(path, sizeof path, "%s/bus/pci/devices", root);
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) && p->n_gpu < CX_SEL_MAX_GPU) {
        if (!is_bdf(de->d_name)) continue;
        snprintf(path, sizeof path, "%s/bus/pci/devices/%s/vendor", root, de->d_name);
        if (cx_sel_read_line(path, v, sizeof v) || strcasecmp(v, "0x10de")) continue;
        snprintf(path, sizeof path, "%s/bus/pci/devices/%s/class", root, de->d_name);
        if (cx_sel_read_line(path, v, sizeof v)) continue;
        /* 0x0300xx VGA, 0x0302xx 3D controller (data-center GPUs) */
        if (strncasecmp(v, "0x0300", 6) && strncasecmp(v, "0x0302", 6)) continue;
        cx_probe_gpu_t *g = &p->gpu[p->n_gpu];
        memset(g, 0, sizeof *g);
        g->ordinal = -1;
        g->gdr_attr = g->dmabuf_attr = -1;
        snprintf(path, sizeof path, "%s/bus/pci/devices/%s", root, de->d_name);
        if (cx_sel_pci_from_link(path, &g->pci)) {
            cx_sel_copy(g->pci.bdf, sizeof g->pci.bdf, de->d_name);
            g->pci.numa = -1;
        }
        p->n_gpu++;
    }
    closedir(d);
    /* CUDA_DEVICE_ORDER=PCI_BUS_ID order; the CUDA probe re-maps to real ordinals */
    qsort(p->gpu, (size_t)p->n_gpu, sizeof p->gpu[0], gpu_cmp);
}

int cx_probe_sysfs(cx_probe_t *p, const char *root)
{
    if (!p) return CX_EINVAL;
    if (!root) root = "/sys";
    cx_sel_copy(p->sysfs_root, sizeof p->sysfs_root, root);
    probe_rdma(p, root);
    probe_gpus(p, root);
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/module/nvidia_peermem", root);
    p->peermem = !stat(path, &st);
    snprintf(path, sizeof path, "%s/module/nv_peer_mem", root);
    if (!stat(path, &st)) p->peermem = 1;
    return CX_OK;
}
