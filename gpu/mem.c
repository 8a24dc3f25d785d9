/* Memory kinds, device allocations for tests and benchmarks, synchronous copies, pinned memory. */
#include "cuda_drv.h"
#include "cx_gpu.h"
#include "sim.h"
#include "connex/log.h"

#include <stdlib.h>
#include <string.h>

enum { PIN_PLAIN = 1, PIN_CUDA = 2 };

const char *cx_mem_kind_name(int kind)
{
    switch (kind) {
    case CX_MEM_HOST: return "host";
    case CX_MEM_CUDA: return "cuda";
    case CX_MEM_SIM: return "sim";
    default: return "unknown";
    }
}

/* 1 when CUDA knows p as device (or managed) memory; fills the allocation. */
static int cuda_query(uintptr_t p, cx_gpu_mem_t *m)
{
    const struct cx_cuda *cu = cx_cuda();
    if (!cu) return 0;
    unsigned mtype = 0;
    if (cu->cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)p) != CUDA_SUCCESS)
        return 0; /* CUDA_ERROR_INVALID_VALUE: memory CUDA never saw, i.e. plain host memory */
    if (mtype != CU_MEMORYTYPE_DEVICE && mtype != CU_MEMORYTYPE_UNIFIED) return 0;
    int ord = 0;
    CUdeviceptr base = 0;
    size_t size = 0;
    cu->cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)p);
    if (cu->cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)p) ||
        cu->cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)p)) {
        base = (CUdeviceptr)p; /* older drivers: no range; trust the caller's length */
        size = SIZE_MAX - (size_t)p;
    }
    *m = (cx_gpu_mem_t){ CX_MEM_CUDA, ord, (uintptr_t)base, size };
    return 1;
}

int cx_gpu_mem_query(const void *ptr, size_t len, cx_gpu_mem_t *out)
{
    uintptr_t p = (uintptr_t)ptr;
    cx_gpu_mem_t m = { CX_MEM_HOST, -1, 0, 0 };
    if (!ptr) {
        cx_error("memory kind of NULL");
        return CX_EINVAL;
    }
    uintptr_t base;
    size_t size;
    if (cx_sim_lookup(p, &base, &size))
        m = (cx_gpu_mem_t){ CX_MEM_SIM, 0, base, size };
    else
        cuda_query(p, &m);
    if (m.kind != CX_MEM_HOST && len > m.size - (p - m.base)) {
        cx_error("%s memory %p+%zu runs past the end of its allocation %p+%zu", cx_mem_kind_name(m.kind), ptr, len,
                 (void *)m.base, m.size);
        return CX_EINVAL;
    }
    if (out) *out = m;
    return CX_OK;
}

int cx_gpu_mem_kind(const void *p, size_t len)
{
    cx_gpu_mem_t m;
    int rc = cx_gpu_mem_query(p, len, &m);
    return rc ? rc : m.kind;
}

int cx_gpu_dev_alloc(int kind, int device, size_t len, void **out)
{
    *out = NULL;
    if (len == 0) return CX_EINVAL;
    if (kind == CX_MEM_SIM) {
        *out = cx_gpu_sim_alloc(len);
        return *out ? CX_OK : CX_ENOMEM;
    }
    if (kind != CX_MEM_CUDA) return CX_EINVAL;
    int rc = cx_cuda_ctx(device);
    if (rc) return rc;
    CUdeviceptr d = 0;
    CUresult r = cx_cuda()->cuMemAlloc(&d, len);
    if (r != CUDA_SUCCESS) {
        cx_error("cuMemAlloc(%zu) on device %d: %s", len, device, cx_cuda_errname(r));
        return CX_ENOMEM;
    }
    *out = (void *)(uintptr_t)d;
    return CX_OK;
}

void cx_gpu_dev_free(void *p)
{
    if (!p) return;
    cx_gpu_mem_t m;
    if (cx_gpu_mem_query(p, 0, &m)) return;
    if (m.kind == CX_MEM_SIM)
        cx_gpu_sim_free(p);
    else if (m.kind == CX_MEM_CUDA && cx_cuda_ctx(m.device) == CX_OK)
        cx_cuda()->cuMemFree((CUdeviceptr)(uintptr_t)p);
    else
        cx_error("cx_gpu_dev_free(%p): not device memory (ignored)", p);
}

int cx_gpu_memcpy(void *dst, const void *src, size_t len)
{
    cx_gpu_mem_t md, ms;
    if (len == 0) return CX_OK;
    if (cx_gpu_mem_query(dst, len, &md) || cx_gpu_mem_query(src, len, &ms)) return CX_EINVAL;
    if (md.kind != CX_MEM_CUDA && ms.kind != CX_MEM_CUDA) {
        memmove(dst, src, len);
        return CX_OK;
    }
    int rc = cx_cuda_ctx(md.kind == CX_MEM_CUDA ? md.device : ms.device);
    if (rc) return rc;
    /* Unified addressing lets one call serve H2D, D2H and D2D. Into device memory cuMemcpy may
     * return before the bytes land (a pageable source is staged by the driver first, D2D is
     * asynchronous), and the copy engine's streams do not wait for the legacy stream: the sync
     * makes the bytes visible to every stream when this returns. */
    CUresult r = cx_cuda()->cuMemcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len);
    if (r == CUDA_SUCCESS && md.kind == CX_MEM_CUDA) r = cx_cuda()->cuStreamSynchronize(NULL);
    if (r != CUDA_SUCCESS) {
        cx_error("cuMemcpy(%p <- %p, %zu): %s", dst, src, len, cx_cuda_errname(r));
        return CX_ERR;
    }
    return CX_OK;
}

int cx_gpu_memset(void *dst, int c, size_t len)
{
    cx_gpu_mem_t m;
    if (cx_gpu_mem_query(dst, len, &m)) return CX_EINVAL;
    if (m.kind != CX_MEM_CUDA) {
        memset(dst, c, len);
        return CX_OK;
    }
    int rc = cx_cuda_ctx(m.device);
    if (rc) return rc;
    /* cuMemsetD8 on device memory is asynchronous to the host: done means done. */
    CUresult r = cx_cuda()->cuMemsetD8((CUdeviceptr)(uintptr_t)dst, (unsigned char)c, len);
    if (r == CUDA_SUCCESS) r = cx_cuda()->cuStreamSynchronize(NULL);
    if (r != CUDA_SUCCESS) {
        cx_error("cuMemsetD8(%p, %zu): %s", dst, len, cx_cuda_errname(r));
        return CX_ERR;
    }
    return CX_OK;
}

int cx_pinned_alloc(size_t len, cx_pinned_t *out)
{
    memset(out, 0, sizeof *out);
    if (len == 0) return CX_EINVAL;
    size_t rounded = (len + 4095) & ~(size_t)4095;
    const struct cx_cuda *cu = cx_cuda();
    if (cu && cx_cuda_ctx(0) == CX_OK) {
        void *p = NULL;
        CUresult r = cu->cuMemHostAlloc(&p, rounded, CU_MEMHOSTALLOC_PORTABLE);
        if (r == CUDA_SUCCESS) {
            *out = (cx_pinned_t){ p, len, PIN_CUDA };
            return CX_OK;
        }
        cx_warn("cuMemHostAlloc(%zu): %s; using pageable memory (copies will be slower)", rounded, cx_cuda_errname(r));
    }
    void *p = aligned_alloc(4096, rounded);
    if (!p) {
        cx_error("pinned alloc of %zu bytes: out of memory", len);
        return CX_ENOMEM;
    }
    /* Fault the pages in now, not during the first transfers (that costs ms per MiB). */
    memset(p, 0, rounded);
    *out = (cx_pinned_t){ p, len, PIN_PLAIN };
    return CX_OK;
}

void cx_pinned_free(cx_pinned_t *pm)
{
    if (!pm || !pm->p) return;
    if (pm->how == PIN_CUDA && cx_cuda())
        cx_cuda()->cuMemFreeHost(pm->p);
    else
        free(pm->p);
    memset(pm, 0, sizeof *pm);
}
