/* select/'s entry points for callers without an engine (connex-probe, the selection tests): each
 * reads the CONNEX_* variables through the options table when it is called. An engine never
 * comes here: it passes the table it parsed at create (cx_select_for_engine_opts). */
#include "cx_select.h"
#include "connex/connex.h"
#include "connex/options.h"
#include "probe_int.h"

#include <pthread.h>
#include <stdlib.h>

/* The table the last cx_select_opts_from_env filled its strings from. */
static cx_opts_t env_opts;
static pthread_mutex_t env_mu = PTHREAD_MUTEX_INITIALIZER;

void cx_select_opts_from_env(cx_select_opts_t *o, const char *cfg_backend)
{
    pthread_mutex_lock(&env_mu);
    (void)cx_opts_load(&env_opts); /* a bad value is logged; the policy refuses a bad CONNEX_GDR */
    cx_select_opts_from(o, &env_opts, cfg_backend);
    pthread_mutex_unlock(&env_mu);
}

/* The environment's table, parsed now; NULL when out of memory. Free it. */
static cx_opts_t *env_now(void)
{
    cx_opts_t *t = malloc(sizeof *t);
    if (t) (void)cx_opts_load(t);
    return t;
}

int cx_probe_host_base(cx_probe_t *p, const char *sysfs_root)
{
    if (!p) return CX_EINVAL;
    cx_opts_t *t = env_now();
    if (!t) return CX_ENOMEM;
    int rc = cx_sel_probe_base(p, sysfs_root, cx_opts_str(t, "CONNEX_HOST_ID"));
    free(t);
    return rc;
}

int cx_probe_host_libs(cx_probe_t *p, const char *sysfs_root, unsigned libs)
{
    if (!p) return CX_EINVAL;
    cx_opts_t *t = env_now();
    if (!t) return CX_ENOMEM;
    int rc = cx_sel_probe_libs(p, sysfs_root, libs, (int)cx_opts_num(t, "CONNEX_PROBE_CUDA", NULL));
    free(t);
    return rc;
}

int cx_probe_host(cx_probe_t *p, const char *sysfs_root)
{
    int rc = cx_probe_host_base(p, sysfs_root);
    return rc ? rc : cx_probe_host_libs(p, sysfs_root, CX_PROBE_LIBS);
}

const char *cx_select_host_id(void)
{
    cx_opts_t *t = env_now();
    const char *id = t ? cx_select_host_id_opts(t) : "";
    free(t);
    return id;
}

int cx_select_for_engine(const char *cfg_backend, const struct cx_backend_ops **out, int max, cx_decision_t *dec)
{
    cx_opts_t *t = env_now();
    if (!t) return CX_ENOMEM;
    int rc = cx_select_for_engine_opts(t, cfg_backend, out, max, dec);
    free(t);
    return rc;
}
