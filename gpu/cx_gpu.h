/* gpu/: what the core needs to know about GPU memory, and nothing about networks.
 *
 * - CUDA is reached through dlopen("libcuda.so.1") (driver API only), so the library builds and
 *   runs where no CUDA is installed; cx_gpu_status() says why CUDA is unusable.
 * - A simulated device ("sim"): host memory that cx_gpu_mem_kind reports as CX_MEM_SIM, with
 *   copies done asynchronously by worker threads, so CPU tests exercise every staging path.
 * - A copy engine (cx_ce_*): one stream per direction, completions through an eventfd.
 * - The staging pipeline (cx_stage.h) built on it.
 *
 * Every function here is thread-safe unless said otherwise.
 */
#ifndef CX_GPU_H
#define CX_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "connex/backend.h" /* CX_MEM_HOST / CX_MEM_CUDA / CX_MEM_SIM */
#include "connex/connex.h"  /* status codes */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- loading ---- */

/* Load libcuda.so.1 (or $CONNEX_LIBCUDA) once and cuInit it. CX_OK when at least one CUDA device
 * is usable; CX_EUNSUPPORTED otherwise, with the reason in cx_gpu_status(). Never fatal: host and
 * sim memory work either way. */
int cx_gpu_init(void);
/* One line for logs and connex-probe, e.g. "cuda: driver 12040, 2 device(s) [NVIDIA H200]; sim: off"
 * or "cuda: unavailable: no libcuda.so.1 (...); sim: on". Valid for the life of the process. */
const char *cx_gpu_status(void);
int cx_gpu_cuda_devices(void);          /* 0 when CUDA is unusable */
const char *cx_mem_kind_name(int kind); /* "host", "cuda", "sim" */

/* ---- the simulated device ---- */

/* On when CONNEX_GPU_SIM=1 at first use, or after cx_gpu_sim_enable(1). Copy speed of the
 * simulated copy engine: CONNEX_GPU_SIM_GBPS (GB/s per direction, default unlimited). */
void cx_gpu_sim_enable(int on);
int cx_gpu_sim_enabled(void);
/* "Device" memory of the sim. NULL (and a log line) when the sim is off or memory is short. */
void *cx_gpu_sim_alloc(size_t len);
void cx_gpu_sim_free(void *p); /* p must come from cx_gpu_sim_alloc; NULL is ignored */
size_t cx_gpu_sim_bytes(void); /* bytes currently allocated (leak checks) */

/* ---- memory kind ---- */

typedef struct cx_gpu_mem {
    int kind;       /* CX_MEM_* */
    int device;     /* CUDA ordinal (0 for sim, -1 for host) */
    uintptr_t base; /* the allocation holding the pointer (0 for host) */
    size_t size;
} cx_gpu_mem_t;

/* Which memory [p, p+len) is. CX_EINVAL (and a log line) when p is NULL or the range starts in
 * a device allocation and runs past its end. */
int cx_gpu_mem_query(const void *p, size_t len, cx_gpu_mem_t *out);
/* CX_MEM_* (>= 0), or CX_EINVAL as above. */
int cx_gpu_mem_kind(const void *p, size_t len);

/* Device memory for tests and benchmarks: kind CX_MEM_CUDA (cuMemAlloc on `device`) or
 * CX_MEM_SIM. */
int cx_gpu_dev_alloc(int kind, int device, size_t len, void **out);
void cx_gpu_dev_free(void *p);
/* A synchronous copy between any two kinds (tests, benchmarks, small control-path copies). */
int cx_gpu_memcpy(void *dst, const void *src, size_t len);
int cx_gpu_memset(void *dst, int c, size_t len);

/* ---- pinned host memory ---- */

typedef struct cx_pinned {
    void *p;
    size_t len;
    int how; /* internal: how it was allocated */
} cx_pinned_t;
/* Page-locked when CUDA is usable (cuMemHostAlloc, portable to every context), else ordinary
 * page-aligned memory (the sim and the network need nothing more). */
int cx_pinned_alloc(size_t len, cx_pinned_t *out);
void cx_pinned_free(cx_pinned_t *pm);

/* ---- GPUDirect ---- */

enum { CX_GDR_AUTO = 0, CX_GDR_OFF = 1, CX_GDR_ON = 2 };

/* What the backend can register (gpu/ knows nothing of networks: the caller says). */
typedef struct cx_gdr_caps {
    int rdma;    /* the backend drives an RDMA NIC at all (not TCP, not shm) */
    int peermem; /* it can register GPU virtual addresses (ibv_reg_mr; needs nvidia_peermem) */
    int dmabuf;  /* it can register a dma-buf fd (ibv_reg_dmabuf_mr, FI_MR_DMABUF, UCX) */
} cx_gdr_caps_t;

typedef struct cx_gdr_info {
    int mode;           /* CX_GDR_* from CONNEX_GDR */
    int peermem_loaded; /* /sys/module/nvidia_peermem (or nv_peer_mem) exists */
    int dmabuf_device;  /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED on the device */
    int use;            /* the decision: 1 = register GPU memory with the backend directly */
    char reason[192];   /* why, in words */
} cx_gdr_info_t;

/* CONNEX_GDR=auto|0|1 (unset = auto). CX_EINVAL (and a log line) for any other value. */
int cx_gdr_mode(int *mode);
/* Decide GPUDirect for memory of `kind` on `device` with a backend of capabilities `caps`.
 * CX_OK with info->use set; CX_EUNSUPPORTED when CONNEX_GDR=1 and it cannot work (reason says
 * why); CX_EINVAL for a bad CONNEX_GDR. For CX_MEM_SIM, "GPUDirect" means the backend registers
 * the sim memory as host memory; it is used only when CONNEX_GDR=1 (auto stages, so CPU tests
 * cover the staging path by default). Host memory never needs it (use=1, nothing to do). */
int cx_gdr_decide(int kind, int device, const cx_gdr_caps_t *caps, cx_gdr_info_t *info);

/* ---- copy engine: dedicated streams per direction, completions through an eventfd ---- */

enum { CX_CE_H2D = 0, CX_CE_D2H = 1 };

typedef struct cx_ce cx_ce_t;
typedef struct cx_ce_done {
    void *cookie;
    int status; /* CX_OK or CX_ERR (the copy failed; see the log) */
} cx_ce_done_t;

/* A copy engine for device memory of `kind` (CX_MEM_CUDA: primary context of `device`, one
 * non-blocking stream per direction; CX_MEM_SIM: one worker thread per direction). */
int cx_ce_create(int kind, int device, cx_ce_t **out);
/* Waits for the copies in flight (they cannot be recalled: the DMA may still be writing), then
 * frees. Completions not yet polled are dropped. */
void cx_ce_destroy(cx_ce_t *ce);
/* Readable when a completion is ready (level: stays readable until cx_ce_poll drained it). */
int cx_ce_fd(const cx_ce_t *ce);
/* Queue an asynchronous copy of len bytes between device memory dev and host memory host
 * (H2D: host -> dev; D2H: dev -> host). Copies of one direction complete in order. The
 * completion carries cookie. The host memory must stay valid until then. */
int cx_ce_copy(cx_ce_t *ce, int dir, void *dev, void *host, size_t len, void *cookie);
/* Non-blocking: up to max completions into out; returns how many. */
int cx_ce_poll(cx_ce_t *ce, cx_ce_done_t *out, int max);
/* Wake the fd without a completion (cx_ce_poll then returns 0 and clears it). */
void cx_ce_kick(cx_ce_t *ce);
int cx_ce_kind(const cx_ce_t *ce);
unsigned cx_ce_inflight(const cx_ce_t *ce); /* submitted, not yet polled */

#ifdef __cplusplus
}
#endif
#endif
