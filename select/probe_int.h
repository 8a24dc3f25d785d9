/* Internal to select/: helpers shared by the probe, policy and report files. */
#ifndef CX_SELECT_PROBE_INT_H
#define CX_SELECT_PROBE_INT_H

#include <stdarg.h>
#include <stddef.h>
#include "cx_select.h"

#include <string.h>

/* Bounded copy that always terminates; truncation of names from sysfs is harmless. */
static inline void cx_sel_copy(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = 0;
}

int cx_sel_read_line(const char *path, char *buf, size_t len);
int cx_sel_pci_from_link(const char *link, cx_probe_pci_t *pci);

/* Append printf-style to a NUL-terminated buffer; truncation ends the text with "...". */
void cx_sel_appendf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void cx_sel_vappendf(char *buf, size_t cap, const char *fmt, va_list ap);
/* A finding, one line in p->notes. */
void cx_sel_note(cx_probe_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One reason line in d->reasons. */
#define REASON(d, ...)                                                 \
    do {                                                               \
        cx_sel_appendf((d)->reasons, sizeof(d)->reasons, __VA_ARGS__); \
        cx_sel_appendf((d)->reasons, sizeof(d)->reasons, "\n");        \
    } while (0)

/* An RDMA device the policy may use: an active port and a user-space provider (or unknown). */
static inline int cx_sel_nic_usable(const cx_probe_rdma_t *r)
{
    return r->active_port > 0 && r->verbs_ok != 0;
}

/* Record a failed decision: d->error, an "error:" reason, no backends. Returns rc. */
int cx_sel_fail(cx_decision_t *d, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The dlopen probes (probe_libs.c); each records absence in the probe, never fails. */
void cx_sel_probe_verbs(cx_probe_t *p);
void cx_sel_probe_fabric(cx_probe_t *p);
void cx_sel_probe_ucx(cx_probe_t *p);
enum { CX_SEL_CUDA_AUTO = 0, CX_SEL_CUDA_OFF = 1, CX_SEL_CUDA_ON = 2 }; /* CONNEX_PROBE_CUDA auto|0|1 */
void cx_sel_probe_cuda(cx_probe_t *p, int mode);

/* cx_probe_host_base / _libs with the CONNEX_* values given, not read: host_id (CONNEX_HOST_ID,
 * NULL or "": hostname/boot id) and cuda (CX_SEL_CUDA_*, CONNEX_PROBE_CUDA). */
int cx_sel_probe_base(cx_probe_t *p, const char *sysfs_root, const char *host_id);
int cx_sel_probe_libs(cx_probe_t *p, const char *sysfs_root, unsigned libs, int cuda);

#endif
