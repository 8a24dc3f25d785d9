/* GPUDirect RDMA: can the NIC reach GPU memory directly, and does CONNEX_GDR allow or demand it. */
#include "cuda_drv.h"
#include "connex/options.h"
#include "cx_gpu.h"
#include "connex/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int cx_gdr_mode(int *mode)
{
    unsigned long long v; /* auto|0|1 (also off|on, no|yes) */
    *mode = CX_GDR_AUTO;
    if (cx_opt_get_num("CONNEX_GDR", &v) == CX_EINVAL) return CX_EINVAL; /* logged */
    if (v == 1)
        *mode = CX_GDR_OFF;
    else if (v == 2)
        *mode = CX_GDR_ON;
    return CX_OK;
}

static int peermem_loaded(void)
{
    /* nv_peer_mem is the out-of-tree predecessor of nvidia_peermem; both serve ibv_reg_mr. */
    const char *root; /* tests point this elsewhere; default /sys/module */
    (void)cx_opt_get_str("CONNEX_SYSFS_MODULE", &root);
    char path[512];
    static const char *mods[] = { "nvidia_peermem", "nv_peer_mem" };
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", root, mods[i]);
        if (access(path, F_OK) == 0) return 1;
    }
    return 0;
}

static int dmabuf_device(int device)
{
    const struct cx_cuda *cu = cx_cuda();
    CUdevice d;
    int v = 0;
    if (!cu || cu->cuDeviceGet(&d, device) != CUDA_SUCCESS) return 0;
    if (cu->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d) != CUDA_SUCCESS) return 0;
    return v != 0;
}

int cx_gdr_decide(int kind, int device, const cx_gdr_caps_t *caps, cx_gdr_info_t *info)
{
    static const cx_gdr_caps_t none;
    if (!caps) caps = &none;
    memset(info, 0, sizeof *info);
    int rc = cx_gdr_mode(&info->mode);
    if (rc) {
        snprintf(info->reason, sizeof info->reason, "CONNEX_GDR must be auto, 0 or 1");
        return rc;
    }
    if (kind == CX_MEM_HOST) {
        info->use = 1;
        snprintf(info->reason, sizeof info->reason, "host memory: registered directly");
        return CX_OK;
    }
    if (info->mode == CX_GDR_OFF) {
        snprintf(info->reason, sizeof info->reason, "CONNEX_GDR=0: staging through pinned host memory");
        return CX_OK;
    }
    const char *why = NULL;
    if (kind == CX_MEM_SIM) {
        /* The sim's memory is host memory: a backend can register it, which is how CPU tests
         * run the "GPUDirect" path. auto stages so that the staging path is the default test. */
        if (info->mode == CX_GDR_ON)
            info->use = 1;
        else
            why = "sim memory stages unless CONNEX_GDR=1";
    } else if (kind == CX_MEM_CUDA) {
        if (!cx_cuda())
            why = cx_gpu_status();
        else {
            info->peermem_loaded = peermem_loaded();
            info->dmabuf_device = dmabuf_device(device);
            if (!caps->rdma)
                why = "the backend has no RDMA NIC (TCP or shared memory)";
            else if (info->peermem_loaded && caps->peermem)
                info->use = 1;
            else if (info->dmabuf_device && caps->dmabuf)
                info->use = 1;
            else if (!info->peermem_loaded && !info->dmabuf_device)
                why = "neither nvidia_peermem is loaded nor does the GPU support dma-buf";
            else
                why = "the backend can register neither through nvidia_peermem nor dma-buf here";
        }
    } else {
        why = "unknown memory kind";
    }
    if (info->use) {
        snprintf(info->reason, sizeof info->reason, "GPUDirect: %s",
                 kind == CX_MEM_SIM                          ? "sim memory registered as host memory (CONNEX_GDR=1)"
                     : info->peermem_loaded && caps->peermem ? "nvidia_peermem"
                                                             : "dma-buf");
        return CX_OK;
    }
    snprintf(info->reason, sizeof info->reason, "no GPUDirect: %.170s", why);
    if (info->mode == CX_GDR_ON) {
        cx_error("CONNEX_GDR=1 but GPUDirect cannot work: %s", info->reason);
        return CX_EUNSUPPORTED;
    }
    return CX_OK;
}
