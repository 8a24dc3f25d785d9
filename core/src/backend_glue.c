/* Backend ordering, the backend version check and GPU hooks (see gpu_hook.h). */
#include "gpu_hook.h"

#include "connex/log.h"
#include "cx_gpu.h"

int cx_gpu_hook_mem_kind(const void *addr, size_t len)
{
    return cx_gpu_mem_kind(addr, len);
}

int cx_backend_check(const struct cx_backend_ops *ops)
{
    if (!ops) return CX_EINVAL;
    if (ops->version == CX_BACKEND_API_VERSION) return CX_OK;
    cx_error("backend %s: built for backend interface version %u, this core implements version %u: refused",
             ops->name ? ops->name : "(unnamed)", (unsigned)ops->version, (unsigned)CX_BACKEND_API_VERSION);
    return CX_EUNSUPPORTED;
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CONNEX_HAVE_SELECT
#include "cx_select.h"
int cx_select_order(const struct cx_opts *opts, const char *want, const struct cx_backend_ops **out,
                    char (*choice)[CX_CHOICE_MAX], cx_open_plan_t *plan, int max, char *host_id, size_t host_len)
{
    cx_decision_t *d = calloc(1, sizeof *d);
    if (!d) return CX_ENOMEM;
    int n = cx_select_for_engine_opts(opts, want, out, max, d);
    /* out[] follows d->be[] but skips backends that are not compiled in: match by name. */
    for (int i = 0; i < n; i++) {
        choice[i][0] = 0;
        memset(&plan[i], 0, sizeof plan[i]);
        for (int j = 0; j < d->n; j++)
            if (!strcmp(d->be[j].backend, out[i]->name)) {
                cx_choice_format(&d->be[j], choice[i], CX_CHOICE_MAX);
                const cx_plan_be_t *pl = &d->plan[j];
                plan[i].planned = 1;
                plan[i].gpu_direct = pl->gpudirect;
                snprintf(plan[i].provider, sizeof plan[i].provider, "%s", pl->provider);
                snprintf(plan[i].domain, sizeof plan[i].domain, "%s", pl->domain);
                snprintf(plan[i].net_devices, sizeof plan[i].net_devices, "%s", pl->devices);
                plan[i].net_devices_exact = pl->devices_exact;
                snprintf(plan[i].domains, sizeof plan[i].domains, "%s", pl->domains);
                snprintf(plan[i].gpu_domains, sizeof plan[i].gpu_domains, "%s", pl->gpu_domains);
                break;
            }
        if (!choice[i][0]) snprintf(choice[i], CX_CHOICE_MAX, "%s//0x0", out[i]->name);
    }
    snprintf(host_id, host_len, "%s", cx_select_host_id_opts(opts));
    free(d);
    return n;
}

int cx_select_pair_order(const char (*mine)[CX_CHOICE_MAX], int n_mine, const char (*theirs)[CX_CHOICE_MAX],
                         int n_theirs, int same_host, int *order, char *why, size_t why_len)
{
    cx_choice_t m[CX_SEL_MAX_BE], t[CX_SEL_MAX_BE];
    int nm = 0, nt = 0;
    for (int i = 0; i < n_mine && nm < CX_SEL_MAX_BE; i++)
        if (cx_choice_parse(mine[i], &m[nm]) == CX_OK)
            nm++;
        else
            return 0; /* cannot happen: we formatted it */
    for (int i = 0; i < n_theirs && nt < CX_SEL_MAX_BE; i++)
        if (cx_choice_parse(theirs[i], &t[nt]) == CX_OK) nt++;
    return cx_select_pair(m, nm, t, nt, same_host, order, why, why_len);
}
#else
int cx_select_order(const struct cx_opts *opts, const char *want, const struct cx_backend_ops **out,
                    char (*choice)[CX_CHOICE_MAX], cx_open_plan_t *plan, int max, char *host_id, size_t host_len)
{
    (void)opts;
    (void)want;
    int n = 0;
    for (int i = 0; cx_backends_builtin[i] && n < max; i++) {
        out[n] = cx_backends_builtin[i];
        memset(&plan[n], 0, sizeof plan[n]); /* no plan: each backend's own defaults */
        snprintf(choice[n], CX_CHOICE_MAX, "%s//0x0", out[n]->name);
        n++;
    }
    host_id[0] = 0;
    (void)host_len;
    return n;
}

/* Without select/: our order, restricted to what the peer has (by backend name). */
int cx_select_pair_order(const char (*mine)[CX_CHOICE_MAX], int n_mine, const char (*theirs)[CX_CHOICE_MAX],
                         int n_theirs, int same_host, int *order, char *why, size_t why_len)
{
    (void)same_host;
    int n = 0;
    for (int i = 0; i < n_mine; i++) {
        size_t l = strcspn(mine[i], "/");
        for (int j = 0; j < n_theirs; j++)
            if (!strncmp(mine[i], theirs[j], l) && (theirs[j][l] == '/' || !theirs[j][l])) {
                order[n++] = i;
                break;
            }
    }
    if (why && why_len) snprintf(why, why_len, "%d backend(s) in common", n);
    return n;
}
#endif

void cx_open_plan_params(const cx_open_plan_t *plan, cx_backend_params_t *p)
{
    p->gpu_direct = plan->gpu_direct;
    p->provider = plan->provider[0] ? plan->provider : NULL;
    p->domain = plan->domain[0] ? plan->domain : NULL;
    /* "" is a plan too (no RDMA device); NULL only without one */
    p->net_devices = plan->planned ? plan->net_devices : NULL; /* "": the plan has no RDMA device */
    p->net_devices_exact = plan->net_devices_exact;
    p->domains = plan->domains[0] ? plan->domains : NULL;
    p->gpu_domains = plan->gpu_domains[0] ? plan->gpu_domains : NULL;
}

/* ---- the public memory calls (connex.h): thin over gpu/ ---- */

int cx_mem_kind(const void *addr, size_t len)
{
    return cx_gpu_mem_kind(addr, len);
}

int cx_mem_alloc(int kind, int device, size_t len, void **out)
{
    if (!out) {
        cx_error("cx_mem_alloc: out is NULL");
        return CX_EINVAL;
    }
    *out = NULL;
    if ((kind != CX_MEM_CUDA && kind != CX_MEM_SIM) || len == 0 || device < 0) {
        cx_error("cx_mem_alloc(kind %d, device %d, %zu bytes): want kind CX_MEM_CUDA or CX_MEM_SIM, "
                 "device >= 0 and a length > 0",
                 kind, device, len);
        return CX_EINVAL;
    }
    if (kind == CX_MEM_SIM && !cx_gpu_sim_enabled()) {
        cx_error("cx_mem_alloc: the simulated device is off (CONNEX_GPU_SIM=1)");
        return CX_EUNSUPPORTED;
    }
    if (kind == CX_MEM_CUDA && (cx_gpu_init() != CX_OK || device >= cx_gpu_cuda_devices())) {
        cx_error("cx_mem_alloc: no CUDA device %d (%s)", device, cx_gpu_status());
        return CX_EUNSUPPORTED;
    }
    return cx_gpu_dev_alloc(kind, device, len, out);
}

void cx_mem_free(void *p)
{
    cx_gpu_dev_free(p);
}

int cx_mem_copy(void *dst, const void *src, size_t len)
{
    if ((!dst || !src) && len) {
        cx_error("cx_mem_copy: NULL %s", !dst ? "destination" : "source");
        return CX_EINVAL;
    }
    return cx_gpu_memcpy(dst, src, len);
}
