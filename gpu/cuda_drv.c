/* Loading the CUDA driver with dlopen, once, and saying plainly why it is unusable. */
#include "cuda_drv.h"
#include "connex/options.h"
#include "cx_gpu.h"
#include "connex/log.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CX_CUDA_MAXDEV 64

static struct cx_cuda g_cu;
static const struct cx_cuda *g_cu_ok; /* &g_cu once usable */
static int g_init_rc = CX_EUNSUPPORTED;
static char g_cuda_line[256] = "cuda: not probed";
static char g_status[2][320]; /* [sim on] */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext g_ctx[CX_CUDA_MAXDEV];

const char *cx_cuda_errname(CUresult r)
{
    const char *s = NULL;
    if (g_cu.cuGetErrorName && g_cu.cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
    switch (r) { /* the ones that matter before cuGetErrorName is known to work */
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_INSUFFICIENT_DRIVER: return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    default: return "CUDA error";
    }
}

static int sym(void **dst, const char *name, const char *name_v2)
{
    *dst = NULL;
    if (name_v2) *dst = dlsym(g_cu.lib, name_v2);
    if (!*dst) *dst = dlsym(g_cu.lib, name);
    if (!*dst) {
        snprintf(g_cuda_line, sizeof g_cuda_line, "cuda: unavailable: the driver library lacks %s",
                 name_v2 ? name_v2 : name);
        return -1;
    }
    return 0;
}

#define SYM(f) sym((void **)&g_cu.f, #f, NULL)
#define SYM2(f) sym((void **)&g_cu.f, #f, #f "_v2")

static int resolve(void)
{
    return SYM(cuInit) | SYM(cuDriverGetVersion) | SYM(cuGetErrorName) | SYM(cuGetErrorString) | SYM(cuDeviceGetCount) |
        SYM(cuDeviceGet) | SYM(cuDeviceGetName) | SYM(cuDeviceGetAttribute) | SYM(cuDevicePrimaryCtxRetain) |
        SYM2(cuDevicePrimaryCtxRelease) | SYM(cuCtxSetCurrent) | SYM(cuPointerGetAttribute) | SYM2(cuMemAlloc) |
        SYM2(cuMemFree) | SYM(cuMemHostAlloc) | SYM(cuMemFreeHost) | SYM(cuMemcpy) | SYM2(cuMemsetD8) |
        SYM2(cuMemcpyHtoDAsync) | SYM2(cuMemcpyDtoHAsync) | SYM(cuStreamCreate) | SYM2(cuStreamDestroy) |
        SYM(cuStreamSynchronize) | SYM(cuLaunchHostFunc);
}

static void load(void)
{
    const char *path;
    (void)cx_opt_get_str("CONNEX_LIBCUDA", &path);
    if (!path || !*path) path = "libcuda.so.1";
    g_cu.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g_cu.lib) {
        const char *err = dlerror();
        snprintf(g_cuda_line, sizeof g_cuda_line,
                 "cuda: unavailable: no %s (%s); the NVIDIA driver is not installed (a CUDA "
                 "toolkit's libcudart alone is not enough)",
                 path, err ? err : "dlopen failed");
        return;
    }
    if (resolve()) return;
    CUresult r = g_cu.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *hint = r == CUDA_ERROR_STUB_LIBRARY ? ": this is the toolkit's stub library, not a driver"
            : r == CUDA_ERROR_NO_DEVICE                 ? ": the driver sees no GPU"
            : r == CUDA_ERROR_INSUFFICIENT_DRIVER       ? ": the driver is too old"
                                                        : "";
        snprintf(g_cuda_line, sizeof g_cuda_line, "cuda: unavailable: %s: cuInit failed: %s (%d)%s", path,
                 cx_cuda_errname(r), r, hint);
        return;
    }
    g_cu.cuDriverGetVersion(&g_cu.driver_version);
    int n = 0;
    r = g_cu.cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n <= 0) {
        snprintf(g_cuda_line, sizeof g_cuda_line, "cuda: unavailable: driver %d, %s", g_cu.driver_version,
                 r ? cx_cuda_errname(r) : "no device");
        return;
    }
    g_cu.ndev = n > CX_CUDA_MAXDEV ? CX_CUDA_MAXDEV : n;
    char name[128] = "?";
    CUdevice d;
    if (g_cu.cuDeviceGet(&d, 0) == CUDA_SUCCESS) g_cu.cuDeviceGetName(name, (int)sizeof name, d);
    snprintf(g_cuda_line, sizeof g_cuda_line, "cuda: driver %d, %d device(s) [%s]", g_cu.driver_version, g_cu.ndev,
             name);
    g_cu_ok = &g_cu;
    g_init_rc = CX_OK;
}

static void init_once(void)
{
    load();
    for (int on = 0; on < 2; on++)
        snprintf(g_status[on], sizeof g_status[on], "%s; sim: %s", g_cuda_line, on ? "on" : "off");
    if (g_init_rc == CX_OK)
        cx_info("%s", g_cuda_line);
    else
        cx_info("%s (host memory and the sim still work)", g_cuda_line);
}

int cx_gpu_init(void)
{
    pthread_once(&g_once, init_once);
    return g_init_rc;
}

const char *cx_gpu_status(void)
{
    cx_gpu_init();
    return g_status[cx_gpu_sim_enabled() ? 1 : 0];
}

int cx_gpu_cuda_devices(void)
{
    cx_gpu_init();
    return g_cu_ok ? g_cu.ndev : 0;
}

const struct cx_cuda *cx_cuda(void)
{
    cx_gpu_init();
    return g_cu_ok;
}

int cx_cuda_ctx(int device)
{
    const struct cx_cuda *cu = cx_cuda();
    if (!cu || device < 0 || device >= cu->ndev) {
        cx_error("cuda device %d: not usable (%s)", device, g_cuda_line);
        return CX_EINVAL;
    }
    pthread_mutex_lock(&g_ctx_mu);
    CUcontext ctx = g_ctx[device];
    CUresult r = CUDA_SUCCESS;
    if (!ctx) {
        CUdevice d;
        r = cu->cuDeviceGet(&d, device);
        if (r == CUDA_SUCCESS) r = cu->cuDevicePrimaryCtxRetain(&ctx, d);
        if (r == CUDA_SUCCESS) g_ctx[device] = ctx;
    }
    pthread_mutex_unlock(&g_ctx_mu);
    if (r == CUDA_SUCCESS) r = cu->cuCtxSetCurrent(ctx);
    if (r != CUDA_SUCCESS) {
        cx_error("cuda device %d: primary context: %s", device, cx_cuda_errname(r));
        return CX_ERR;
    }
    return CX_OK;
}
