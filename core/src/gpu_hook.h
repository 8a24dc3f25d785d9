/* Where the core meets gpu/, select/ and the backends: memory kinds, the order in which
 * backends are opened, and the check of a backend's interface version. Kept in one place so the rest of the core stays unaware of CUDA and of probing. */
#ifndef CX_GPU_HOOK_H
#define CX_GPU_HOOK_H

#include "connex/backend.h"
#include "connex/connex.h"

int cx_gpu_hook_mem_kind(const void *addr, size_t len); /* CX_MEM_* */
/* CX_OK when the backend implements this core's interface (CX_BACKEND_API_VERSION); otherwise
 * CX_EUNSUPPORTED, logged with the backend's name and both versions. */
int cx_backend_check(const struct cx_backend_ops *ops);
#define CX_CHOICE_MAX 64
/* The selection's plan for one backend: what its open is given (cx_backend_params_t). */
typedef struct cx_open_plan {
    int planned; /* 0: no selection layer, each backend's own defaults */
    int gpu_direct;
    char provider[48];
    char domain[64];
    char net_devices[256];
    int net_devices_exact;
    char domains[256];     /* libfabric: every rail's domain, comma-separated */
    char gpu_domains[512]; /* libfabric: the rails of each GPU, "0=a,b;1=c" */
} cx_open_plan_t;
/* The compiled-in backends to open, best first, for CONNEX_BACKEND/config value `want`; for each,
 * what to advertise about it (choice[i], "backend/variant/caps") and what to open (plan[i]), and
 * this host's id. The selection reads its CONNEX_* variables from opts, the engine's. */
int cx_select_order(const struct cx_opts *opts, const char *want, const struct cx_backend_ops **out,
                    char (*choice)[CX_CHOICE_MAX], cx_open_plan_t *plan, int max, char *host_id, size_t host_len);
/* plan into the open parameters p (pointing into plan). */
void cx_open_plan_params(const cx_open_plan_t *plan, cx_backend_params_t *p);
/* The order (indices into mine) in which a pair tries the backends both sides advertised; the
 * same on both ends. `why` says it in words. Returns the count. */
int cx_select_pair_order(const char (*mine)[CX_CHOICE_MAX], int n_mine, const char (*theirs)[CX_CHOICE_MAX],
                         int n_theirs, int same_host, int *order, char *why, size_t why_len);

#endif
