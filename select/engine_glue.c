/* The one call cx_engine_create needs: probe, decide, log, and the compiled-in backend ops in the
 * decided order. Kept here so the core does not learn about probes or policies. */
#include "cx_select.h"
#include "connex/options.h"
#include "probe_int.h"
#include "backends.h"
#include "connex/backend.h"
#include "connex/connex.h"
#include "connex/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The host does not change under a running process: probe it once and let every engine of the
 * process share the result. The library probes (dlopen of the RDMA and CUDA libraries, and
 * libfabric's first fi_getinfo, which reads /proc/kallsyms: about 100 ms here) run only when an
 * engine's backend needs them: with CONNEX_BACKEND=zmq the first engine of a process opened in
 * 1.3 ms instead of 104 here, with ucx in 23 ms instead of 126 (no libfabric probe). A later
 * engine that needs more probes the rest. */
static cx_probe_t *probe_cached;
static pthread_mutex_t probe_mu = PTHREAD_MUTEX_INITIALIZER;

/* Under probe_mu. The probe's own variables come from the engine's table: CONNEX_SYSFS_ROOT
 * (tests: a synthetic tree), CONNEX_HOST_ID, CONNEX_PROBE_CUDA. */
static cx_probe_t *probe_get(const cx_opts_t *opts, unsigned libs)
{
    const char *root = cx_opts_str(opts, "CONNEX_SYSFS_ROOT");
    if (root && !*root) root = NULL;
    if (!probe_cached) {
        cx_probe_t *p = calloc(1, sizeof *p);
        if (!p) return NULL;
        cx_sel_probe_base(p, root, cx_opts_str(opts, "CONNEX_HOST_ID"));
        probe_cached = p;
    }
    if (libs & ~probe_cached->libs_done)
        cx_sel_probe_libs(probe_cached, root, libs, (int)cx_opts_num(opts, "CONNEX_PROBE_CUDA", NULL));
    return probe_cached;
}

/* What the policy reads for a backend (its table entry: RDMA devices and GPUs for the network
 * libraries, the library itself; nothing for ZeroMQ). Anything else (auto, or a name the policy
 * will refuse): all of it. */
static unsigned libs_for(const char *backend)
{
    const cx_sel_backend_t *be = backend ? cx_sel_backend(backend) : NULL;
    return be ? be->probes : CX_PROBE_LIBS;
}

const char *cx_select_host_id_opts(const cx_opts_t *opts)
{
    pthread_mutex_lock(&probe_mu);
    cx_probe_t *p = probe_get(opts, 0);
    pthread_mutex_unlock(&probe_mu);
    return p ? p->host_id : ""; /* set once, before probe_cached is published */
}

int cx_select_for_engine_opts(const cx_opts_t *opts, const char *cfg_backend, const struct cx_backend_ops **out,
                              int max, cx_decision_t *dec)
{
    if (!opts || !out || max <= 0) return CX_EINVAL;
    cx_select_opts_t o;
    cx_select_opts_from(&o, opts, cfg_backend);
    cx_decision_t *d = dec ? dec : calloc(1, sizeof *d);
    if (!d) return CX_ENOMEM;
    /* The decision reads the shared probe, which another engine's open may be adding to. */
    pthread_mutex_lock(&probe_mu);
    cx_probe_t *p =
        probe_get(opts, libs_for(o.backend && *o.backend && strcasecmp(o.backend, "auto") ? o.backend : NULL));
    int rc = p ? cx_select_decide_opts(p, &o, d) : CX_ENOMEM;
    if (p) cx_select_log(p, d, rc);
    pthread_mutex_unlock(&probe_mu);
    if (!p) {
        if (!dec) free(d);
        return CX_ENOMEM;
    }
    int n = 0;
    for (int i = 0; rc == CX_OK && i < d->n && n < max; i++) {
        const struct cx_backend_ops *ops = NULL;
        for (int k = 0; cx_backends_builtin[k]; k++)
            if (!strcmp(cx_backends_builtin[k]->name, d->be[i].backend)) ops = cx_backends_builtin[k];
        if (ops)
            out[n++] = ops;
        else
            cx_error("select: decided backend %s is not in cx_backends_builtin", d->be[i].backend);
    }
    if (!dec) free(d);
    if (rc != CX_OK) return rc;
    return n ? n : CX_EUNSUPPORTED;
}
