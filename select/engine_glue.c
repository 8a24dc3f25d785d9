/* The one call cx_engine_create needs: probe, decide, log, and the compiled-in backend ops in the
 * decided order. Kept here so the core does not learn about probes or policies. */
#include "cx_select.h"
#include "probe_int.h"
#include "connex/backend.h"
#include "connex/connex.h"
#include "connex/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The host does not change under a running process: probe it once (dlopen of the RDMA and CUDA
 * libraries costs a few hundred ms), and let every engine of the process share the result. */
static cx_probe_t *probe_cached;
static pthread_once_t probe_once_ctl = PTHREAD_ONCE_INIT;

static void probe_run(void)
{
    probe_cached = calloc(1, sizeof *probe_cached);
    if (!probe_cached) return;
    const char *root = getenv("CONNEX_SYSFS_ROOT");   /* tests: a synthetic tree */
    cx_probe_host(probe_cached, root && *root ? root : NULL);
}

static cx_probe_t *probe_once(void)
{
    pthread_once(&probe_once_ctl, probe_run);
    return probe_cached;
}

const char *cx_select_host_id(void)
{
    cx_probe_t *p = probe_once();
    return p ? p->host_id : "";
}

int cx_select_for_engine(const char *cfg_backend, const struct cx_backend_ops **out, int max,
                         cx_decision_t *dec)
{
    if (!out || max <= 0) return CX_EINVAL;
    cx_probe_t *p = probe_once();
    cx_decision_t *d = dec ? dec : calloc(1, sizeof *d);
    if (!p || !d) {
        if (!dec) free(d);
        return CX_ENOMEM;
    }
    cx_select_opts_t o;
    cx_select_opts_from_env(&o, cfg_backend);
    int rc = cx_select_decide_opts(p, &o, d);
    cx_select_log(p, d, rc);
    int n = 0;
    for (int i = 0; rc == CX_OK && i < d->n && n < max; i++) {
        const struct cx_backend_ops *ops = NULL;
        for (int k = 0; cx_backends_builtin[k]; k++)
            if (!strcmp(cx_backends_builtin[k]->name, d->be[i].backend)) ops = cx_backends_builtin[k];
        if (ops) out[n++] = ops;
        else cx_error("select: decided backend %s is not in cx_backends_builtin", d->be[i].backend);
    }
    if (!dec) free(d);
    if (rc != CX_OK) return rc;
    return n ? n : CX_EUNSUPPORTED;
}
