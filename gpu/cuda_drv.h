/* The slice of the CUDA driver API that gpu/ uses, resolved with dlopen/dlsym. The types and
 * constants are restated here (values from cuda.h, stable across CUDA 11-13) so that no CUDA
 * header is needed to build. Internal to gpu/. */
#ifndef CX_CUDA_DRV_H
#define CX_CUDA_DRV_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
typedef void (*CUhostFn)(void *user);

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
    CUDA_ERROR_NO_DEVICE = 100,
};
enum {
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
};
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_ARRAY = 3, CU_MEMORYTYPE_UNIFIED = 4 };
enum {
    CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116,
    CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124
};
enum { CU_MEMHOSTALLOC_PORTABLE = 0x01 };
enum { CU_STREAM_NON_BLOCKING = 0x1 };

struct cx_cuda {
    void *lib;
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDriverGetVersion)(int *);
    CUresult (*cuGetErrorName)(CUresult, const char **);
    CUresult (*cuGetErrorString)(CUresult, const char **);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetName)(char *, int, CUdevice);
    CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice); /* _v2 */
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuPointerGetAttribute)(void *, int, CUdeviceptr);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t); /* _v2 */
    CUresult (*cuMemFree)(CUdeviceptr);            /* _v2 */
    CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
    CUresult (*cuMemFreeHost)(void *);
    CUresult (*cuMemcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);                 /* _v2 */
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream); /* _v2 */
    CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);       /* _v2 */
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamDestroy)(CUstream); /* _v2 */
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuLaunchHostFunc)(CUstream, CUhostFn, void *);
    int driver_version;
    int ndev;
};

/* NULL when CUDA is unusable (cx_gpu_init says why). */
const struct cx_cuda *cx_cuda(void);
/* "CUDA_ERROR_NO_DEVICE" etc. */
const char *cx_cuda_errname(CUresult r);
/* Make the primary context of `device` current on this thread (retained once, kept). */
int cx_cuda_ctx(int device);

#endif
