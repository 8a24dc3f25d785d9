/* cx_probe_host: everything the policy needs, gathered once at engine start. */
#include "cx_select.h"
#include "probe_int.h"
#include "connex/backend.h"
#include "connex/connex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cx_sel_vappendf(char *buf, size_t cap, const char *fmt, va_list ap)
{
    if (!cap) return;
    size_t n = strnlen(buf, cap);
    if (n >= cap - 1) return;
    int w = vsnprintf(buf + n, cap - n, fmt, ap);
    if (w >= 0 && (size_t)w >= cap - n && cap >= 4) memcpy(buf + cap - 4, "...", 4); /* make truncation visible */
}

void cx_sel_appendf(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cx_sel_vappendf(buf, cap, fmt, ap);
    va_end(ap);
}

void cx_sel_note(cx_probe_t *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cx_sel_vappendf(p->notes, sizeof p->notes, fmt, ap);
    va_end(ap);
    cx_sel_appendf(p->notes, sizeof p->notes, "\n");
}

static void probe_built(cx_probe_t *p)
{
    for (int i = 0; cx_backends_builtin[i] && p->n_built < CX_SEL_MAX_BE; i++)
        cx_sel_copy(p->built[p->n_built++], sizeof p->built[0], cx_backends_builtin[i]->name);
}

/* Peers with the same host id may use shared memory. CONNEX_HOST_ID overrides the default
 * (hostname/boot id): containers sharing a kernel but not a hostname, or tests that stand in for
 * two hosts on one machine. */
static void probe_host_id(cx_probe_t *p, const char *id)
{
    if (id && *id) {
        snprintf(p->host_id, sizeof p->host_id, "%s", id);
        return;
    }
    char host[64] = "", boot[48] = "";
    if (gethostname(host, sizeof host)) host[0] = 0;
    host[sizeof host - 1] = 0;
    cx_sel_read_line("/proc/sys/kernel/random/boot_id", boot, sizeof boot);
    snprintf(p->host_id, sizeof p->host_id, "%s/%s", host, boot);
}

int cx_sel_probe_base(cx_probe_t *p, const char *sysfs_root, const char *host_id)
{
    if (!p) return CX_EINVAL;
    memset(p, 0, sizeof *p);
    probe_built(p);
    probe_host_id(p, host_id);
    cx_probe_sysfs(p, sysfs_root);
    static const char *const skipped = "not probed: the engine's backend does not use it";
    cx_sel_copy(p->verbs.note, sizeof p->verbs.note, skipped);
    cx_sel_copy(p->fabric.note, sizeof p->fabric.note, skipped);
    cx_sel_copy(p->ucx.note, sizeof p->ucx.note, skipped);
    cx_sel_copy(p->cuda.note, sizeof p->cuda.note, skipped);
    return CX_OK;
}

int cx_sel_probe_libs(cx_probe_t *p, const char *sysfs_root, unsigned libs, int cuda)
{
    if (!p) return CX_EINVAL;
    libs &= CX_PROBE_LIBS & ~p->libs_done;
    p->libs_done |= libs;
    /* verbs after sysfs: it marks which sysfs devices have a user-space provider; ucx after
     * sysfs: the port's link layer tells IB from RoCE for its rc/dc/ud transports */
    /* libibverbs reads the real /sys: cross-checking a synthetic tree against it means nothing */
    if (libs & CX_PROBE_VERBS) {
        p->verbs.note[0] = 0;
        if (!sysfs_root || !strcmp(sysfs_root, "/sys"))
            cx_sel_probe_verbs(p);
        else
            snprintf(p->verbs.note, sizeof p->verbs.note, "not cross-checked: synthetic sysfs root");
    }
    if (libs & CX_PROBE_FABRIC) {
        p->fabric.note[0] = 0;
        cx_sel_probe_fabric(p);
    }
    if (libs & CX_PROBE_UCX) {
        p->ucx.note[0] = 0;
        cx_sel_probe_ucx(p);
    }
    if (libs & CX_PROBE_CUDA) {
        p->cuda.note[0] = 0;
        cx_sel_probe_cuda(p, cuda);
    }
    return CX_OK;
}
