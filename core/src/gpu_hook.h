/* Where the core meets gpu/ and select/: memory kinds, GPUDirect, staging counters, and the
 * order in which backends are opened. Kept in one place so the rest of the core stays unaware
 * of CUDA and of probing. */
#ifndef CX_GPU_HOOK_H
#define CX_GPU_HOOK_H

#include "connex/backend.h"
#include "connex/connex.h"

int cx_gpu_hook_mem_kind(const void *addr, size_t len);   /* CX_MEM_* */
int cx_gpu_hook_gdr(void);                                /* 1: GPUDirect in use */
void cx_gpu_hook_stats(cx_stats_t *st);
/* The compiled-in backends to try, best first, for CONNEX_BACKEND/config value `want`. */
int cx_select_order(const char *want, const struct cx_backend_ops **out, int max);

#endif
