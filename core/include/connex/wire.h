/* Bounded little-endian encoding for everything that crosses the network (control frames and
 * backend request headers alike). A reader never reads past its end: once a read fails, `ok`
 * stays 0 and every later read returns zeros, so a decoder checks `ok` once at the end. */
#ifndef CONNEX_WIRE_H
#define CONNEX_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct cx_wr {
    uint8_t *p;
    size_t len, cap;
    int ok;
} cx_wr_t;
typedef struct cx_rd {
    const uint8_t *p;
    size_t len, off;
    int ok;
} cx_rd_t;

static inline void cx_wr_init(cx_wr_t *w, void *buf, size_t cap)
{
    w->p = (uint8_t *)buf;
    w->len = 0;
    w->cap = cap;
    w->ok = 1;
}
static inline void cx_rd_init(cx_rd_t *r, const void *buf, size_t len)
{
    r->p = (const uint8_t *)buf;
    r->len = len;
    r->off = 0;
    r->ok = 1;
}

static inline void cx_wr_bytes(cx_wr_t *w, const void *b, size_t n)
{
    if (!w->ok || n > w->cap - w->len) {
        w->ok = 0;
        return;
    }
    if (n) memcpy(w->p + w->len, b, n);
    w->len += n;
}
static inline void cx_wr_u8(cx_wr_t *w, uint8_t v)
{
    cx_wr_bytes(w, &v, 1);
}
/* Little-endian loads and stores of whole words: a byte loop per field cost a 4 KiB libfabric
 * read about 230 instructions to decode its 18-byte remote key (callgrind). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define CX_LE16(v) __builtin_bswap16(v)
#define CX_LE32(v) __builtin_bswap32(v)
#define CX_LE64(v) __builtin_bswap64(v)
#else
#define CX_LE16(v) (v)
#define CX_LE32(v) (v)
#define CX_LE64(v) (v)
#endif
static inline void cx_wr_u16(cx_wr_t *w, uint16_t v)
{
    v = CX_LE16(v);
    cx_wr_bytes(w, &v, 2);
}
static inline void cx_wr_u32(cx_wr_t *w, uint32_t v)
{
    v = CX_LE32(v);
    cx_wr_bytes(w, &v, 4);
}
static inline void cx_wr_u64(cx_wr_t *w, uint64_t v)
{
    v = CX_LE64(v);
    cx_wr_bytes(w, &v, 8);
}
/* A blob with a 16-bit length. */
static inline void cx_wr_blob16(cx_wr_t *w, const void *b, size_t n)
{
    if (n > 0xffff) {
        w->ok = 0;
        return;
    }
    cx_wr_u16(w, (uint16_t)n);
    cx_wr_bytes(w, b, n);
}
static inline void cx_wr_str8(cx_wr_t *w, const char *s)
{
    size_t n = strlen(s);
    if (n > 0xff) {
        w->ok = 0;
        return;
    }
    cx_wr_u8(w, (uint8_t)n);
    cx_wr_bytes(w, s, n);
}

static inline const uint8_t *cx_rd_bytes(cx_rd_t *r, size_t n)
{
    if (!r->ok || n > r->len - r->off) {
        r->ok = 0;
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}
static inline uint8_t cx_rd_u8(cx_rd_t *r)
{
    const uint8_t *p = cx_rd_bytes(r, 1);
    return p ? p[0] : 0;
}
static inline uint16_t cx_rd_u16(cx_rd_t *r)
{
    const uint8_t *p = cx_rd_bytes(r, 2);
    uint16_t v = 0;
    if (p) memcpy(&v, p, 2);
    return CX_LE16(v);
}
static inline uint32_t cx_rd_u32(cx_rd_t *r)
{
    const uint8_t *p = cx_rd_bytes(r, 4);
    uint32_t v = 0;
    if (p) memcpy(&v, p, 4);
    return CX_LE32(v);
}
static inline uint64_t cx_rd_u64(cx_rd_t *r)
{
    const uint8_t *p = cx_rd_bytes(r, 8);
    uint64_t v = 0;
    if (p) memcpy(&v, p, 8);
    return CX_LE64(v);
}
/* A blob with a 16-bit length: returns a pointer into the buffer and sets *n. */
static inline const uint8_t *cx_rd_blob16(cx_rd_t *r, size_t *n)
{
    *n = cx_rd_u16(r);
    const uint8_t *p = cx_rd_bytes(r, *n);
    if (!p) *n = 0;
    return p;
}
/* A string with an 8-bit length, copied NUL-terminated into out (cap bytes); fails if longer. */
static inline void cx_rd_str8(cx_rd_t *r, char *out, size_t cap)
{
    size_t n = cx_rd_u8(r);
    const uint8_t *p = cx_rd_bytes(r, n);
    if (!p || n >= cap) {
        r->ok = 0;
        if (cap) out[0] = 0;
        return;
    }
    memcpy(out, p, n);
    out[n] = 0;
}
static inline int cx_rd_done(const cx_rd_t *r)
{
    return r->ok && r->off == r->len;
}

#endif
