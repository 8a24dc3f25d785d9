#include "fake_core.h"

#include <stdlib.h>
#include <string.h>

void fc_reset(cx_core_t *c)
{
    for (int i = 0; i < c->nmsg; i++)
        free(c->msg[i]);
    c->nmsg = 0;
    c->refuse = 0;
    c->check_at = NULL;
    c->check_failed = 0;
    c->reg_lo = c->reg_hi = 0;
}

void cx_core_xfer_done(cx_core_t *c, cx_xfer_t *x, int status)
{
    (void)c;
    fc_xfer_t *f = (fc_xfer_t *)x;
    f->done++;
    f->status = status;
}

void cx_core_peer_error(cx_core_t *c, void *peer, const char *reason)
{
    (void)peer; (void)reason;
    c->peer_errors++;
}

void *cx_core_peer_by_incarnation(cx_core_t *c, uint64_t incarnation)
{
    return incarnation == c->peer_inc ? c->peer_cookie : NULL;
}

int cx_core_region_check(cx_core_t *c, uint64_t addr, size_t len, void **pin)
{
    if (pin)
        *pin = NULL;
    c->region_checks++;
    if (c->reg_hi && (addr < c->reg_lo || addr + len > c->reg_hi || addr + len < addr))
        return CX_EINVAL;
    return CX_OK;
}

void cx_core_region_unpin(void *pin) { (void)pin; }

int cx_core_region_kind(cx_core_t *c, uint64_t addr, size_t len)
{
    (void)c; (void)addr; (void)len;
    return CX_MEM_HOST;
}

int cx_core_mem_copy(cx_core_t *c, void *dst, const void *src, size_t len)
{
    (void)c;
    memcpy(dst, src, len);
    return CX_OK;
}

int cx_core_deliver_msg(cx_core_t *c, void *peer, const void *data, size_t len)
{
    if (peer != c->peer_cookie)
        return CX_EINVAL;
    if (c->refuse || c->nmsg == FC_MAXMSG)
        return CX_EAGAIN;
    if (c->check_at)
        for (size_t i = 0; i < c->check_len; i++)
            if (c->check_at[i] != c->check_val)
                c->check_failed = 1;
    c->msg[c->nmsg] = malloc(len ? len : 1);
    if (!c->msg[c->nmsg])
        return CX_EAGAIN;
    memcpy(c->msg[c->nmsg], data, len);
    c->msg_len[c->nmsg++] = len;
    return CX_OK;
}

void cx_core_count_served(cx_core_t *c, int kind, size_t bytes, int ok)
{
    (void)kind; (void)bytes;
    if (ok)
        c->served_ok++;
    else
        c->served_bad++;
}
