/* Backend ordering and GPU hooks (see gpu_hook.h). */
#include "gpu_hook.h"

#include "cx_gpu.h"
#include "staging.h"

int cx_gpu_hook_mem_kind(const void *addr, size_t len)
{
    return cx_gpu_mem_kind(addr, len);
}

int cx_gpu_hook_gdr(void) { return 0; }

void cx_gpu_hook_stats(cx_stats_t *st)
{
    (void)st;   /* staging counters are added by cx_staging_stats (staging.c) */
}

#ifdef CONNEX_HAVE_SELECT
#include "cx_select.h"
int cx_select_order(const char *want, const struct cx_backend_ops **out, int max)
{
    return cx_select_for_engine(want, out, max, NULL);
}
#else
int cx_select_order(const char *want, const struct cx_backend_ops **out, int max)
{
    (void)want;
    int n = 0;
    for (int i = 0; cx_backends_builtin[i] && n < max; i++) out[n++] = cx_backends_builtin[i];
    return n;
}
#endif
