/* What this UCX can do with GPU memory (the core's GPUDirect decision, docs/gpu.md).
 *
 * GPUDirect over UCX needs a UCX built with CUDA support (its context lists the CUDA memory
 * type: Debian's 1.13 package does not), an RDMA transport the user's UCX_TLS allows, and an RDMA
 * device, and the selection's plan must have turned it on (cx_backend_params_t.gpu_direct).
 * dma-buf registration came with UCX 1.14. */
#include "ucx_int.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

static int rdma_tls_allowed(void)
{
    const char *tls = getenv("UCX_TLS");
    if (!tls || !*tls || tls[0] == '^') return 1; /* unset, or an exclusion list */
    static const char *const rdma[] = { "all",  "ib",      "rc", "rc_v", "rc_x", "rc_verbs", "rc_mlx5", "dc",
                                        "dc_x", "dc_mlx5", "ud", "ud_v", "ud_x", "ud_verbs", "ud_mlx5", NULL };
    char buf[256];
    snprintf(buf, sizeof buf, "%s", tls);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        for (int i = 0; rdma[i]; i++)
            if (!strcmp(t, rdma[i])) return 1;
    return 0;
}

static int rdma_device_present(void)
{
    DIR *d = opendir("/sys/class/infiniband");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) n += de->d_name[0] != '.';
    closedir(d);
    return n > 0;
}

void cx_ucx_gpu_caps(cx_backend_t *bb, cx_backend_gpu_caps_t *caps)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    memset(caps, 0, sizeof *caps);
    if (!b->gpu_direct) { /* the plan stages GPU memory (docs/selection.md says why) */
        cx_debug("ucx: GPU caps: GPUDirect off in the selection's plan");
        return;
    }
    ucp_context_attr_t a;
    memset(&a, 0, sizeof a);
    a.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (cx_ucx_lib.ucp_context_query(b->ctx, &a) != UCS_OK) return;
    int cuda = (a.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    int tls = rdma_tls_allowed(), dev = rdma_device_present();
    cx_debug("ucx: GPU caps: CUDA memory type %s, RDMA transports %s, RDMA device %s", cuda ? "yes" : "no",
             tls ? "allowed" : "excluded by UCX_TLS", dev ? "present" : "absent");
    if (!cuda || !tls || !dev) return;
    unsigned major, minor, release;
    cx_ucx_lib.ucp_get_version(&major, &minor, &release);
    caps->rdma = 1;
    caps->peermem = 1;
    caps->dmabuf = major > 1 || minor >= 14;
}
