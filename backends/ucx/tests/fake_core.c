/* The cx_core_* functions and logging, as the backend sees them, without an engine. */
#include "fake_core.h"

#include "connex/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

fake_core_t fx;
int cx_log_level = CX_LOG_WARN;
char fx_last_log[512];

__attribute__((constructor)) static void fx_log_init(void)
{
    const char *l = getenv("CONNEX_LOG");
    if (l && strcmp(l, "debug") == 0)
        cx_log_level = CX_LOG_DEBUG;
    else if (l && strcmp(l, "info") == 0)
        cx_log_level = CX_LOG_INFO;
}

void cx_log_write(int level, const char *file, int line, const char *fmt, ...)
{
    static const char *const names[] = { "ERROR", "WARN", "INFO", "DEBUG" };
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fx_last_log, sizeof fx_last_log, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[%s %s:%d] %s\n", names[level & 3], file, line, fx_last_log);
}

void cx_core_xfer_done(cx_core_t *c, cx_xfer_t *x, int status)
{
    (void)c;
    fx_xfer_t *f = (fx_xfer_t *)(void *)x;
    f->calls++;
    f->done = 1;
    f->status = status;
}

void cx_core_peer_error(cx_core_t *c, void *peer, cx_cause_t cause, const char *reason)
{
    (void)c;
    if (peer == &fx.peer_cookie) fx.peer_errors++;
    fx.last_cause = (int)cause;
    snprintf(fx.last_error, sizeof fx.last_error, "%s", reason);
}

/* This fake core holds no endpoints: the backend looks in its own list. */
cx_bep_t *cx_core_peer_ep(cx_core_t *c, cx_backend_t *b, void *peer)
{
    (void)c;
    (void)b;
    (void)peer;
    return NULL;
}

/* The UCX backend follows no peer process: nothing to tell. */
int cx_core_peer_process(cx_core_t *c, void *peer)
{
    (void)c;
    (void)peer;
    return CX_PROC_UNKNOWN;
}

int cx_core_peer_exit_fd(cx_core_t *c, void *peer)
{
    (void)c;
    (void)peer;
    return -1;
}

void *cx_core_peer_by_incarnation(cx_core_t *c, uint64_t inc)
{
    (void)c;
    return inc && inc == fx.peer_inc ? &fx.peer_cookie : NULL;
}

int cx_core_region_check(cx_core_t *c, uint64_t addr, size_t len, void **pin)
{
    (void)c;
    if (pin) *pin = NULL;
    if (fx.reg_hi && (addr < fx.reg_lo || addr + len > fx.reg_hi || addr + len < addr)) {
        cx_log_write(CX_LOG_WARN, __FILE__, __LINE__, "refused [0x%llx, +%zu)", (unsigned long long)addr, len);
        return CX_EINVAL;
    }
    if (pin) {
        fx.pins++;
        *pin = &fx.pins;
    }
    return CX_OK;
}

void cx_core_region_unpin(void *pin)
{
    if (pin) fx.pins--;
}

int cx_core_region_kind(cx_core_t *c, uint64_t addr, size_t len)
{
    (void)c;
    (void)addr;
    (void)len;
    return CX_MEM_HOST;
}

void cx_core_peer_want_ep(cx_core_t *c, void *peer)
{
    (void)c;
    (void)peer;
}

int cx_core_mem_copy(cx_core_t *c, void *dst, const void *src, size_t len)
{
    (void)c;
    memcpy(dst, src, len);
    return CX_OK;
}

int cx_core_deliver_msg(cx_core_t *c, void *peer, const void *data, size_t len)
{
    (void)c;
    if (peer != &fx.peer_cookie) return CX_EINVAL;
    return fx.on_msg ? fx.on_msg(data, len) : CX_OK;
}

void cx_core_count_served(cx_core_t *c, int kind, size_t bytes, int ok)
{
    (void)c;
    (void)kind;
    (void)bytes;
    if (ok)
        fx.served_ok++;
    else
        fx.served_bad++;
}
