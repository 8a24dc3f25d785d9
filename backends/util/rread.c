#include "rread.h"

#include <string.h>

size_t cx_rread_window(cx_rread_t *r, size_t total, size_t max, size_t *off)
{
    size_t left = total - r->win_end;
    size_t n = left < max ? left : max;
    r->win = r->win_end;
    r->win_end += n;
    *off = r->win;
    return n;
}

int cx_rread_take(cx_rread_t *r, void *dst, size_t total, size_t off, const void *data, size_t len)
{
    if (!len || off != r->got || len > r->win_end - r->got) return CX_RREAD_BAD;
    memcpy((uint8_t *)dst + off, data, len);
    r->got += len;
    if (r->got == total) return CX_RREAD_DONE;
    return r->got == r->win_end ? CX_RREAD_ASK : CX_RREAD_MORE;
}

size_t cx_rread_parts(size_t n, size_t part)
{
    return n ? (n + part - 1) / part : 1;
}

size_t cx_rread_part(size_t n, size_t part, size_t i, size_t *off)
{
    *off = i * part;
    if (*off >= n) return 0;
    return n - *off < part ? n - *off : part;
}
