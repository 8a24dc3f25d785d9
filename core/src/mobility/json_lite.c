/* See json_lite.h. A skipper that knows the shape of every JSON value is all the parsing needed:
 * members and elements are found by skipping their neighbours. */
#include "json_lite.h"

#include <string.h>

static const char *ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* Past the value starting at p (after whitespace), or NULL when malformed. Depth-bounded. */
static const char *skip(const char *p, const char *end, int depth)
{
    p = ws(p, end);
    if (p >= end || depth > 64) return NULL;
    if (*p == '"') {
        for (p++; p < end; p++) {
            if (*p == '\\') {
                p++;
                continue;
            }
            if (*p == '"') return p + 1;
        }
        return NULL;
    }
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = ws(p + 1, end);
        if (p < end && *p == close) return p + 1;
        for (;;) {
            if (close == '}') {
                p = skip(p, end, depth + 1); /* the key */
                if (!p) return NULL;
                p = ws(p, end);
                if (p >= end || *p != ':') return NULL;
                p++;
            }
            p = skip(p, end, depth + 1);
            if (!p) return NULL;
            p = ws(p, end);
            if (p >= end) return NULL;
            if (*p == close) return p + 1;
            if (*p != ',') return NULL;
            p++;
        }
    }
    const char *q = p;
    while (q < end && *q != ',' && *q != '}' && *q != ']' && *q != ' ' && *q != '\n' && *q != '\r' && *q != '\t') q++;
    return q > p ? q : NULL;
}

cx_js_t cx_js_get(cx_js_t v, const char *key)
{
    cx_js_t none = { 0, 0 };
    if (!v.s) return none;
    const char *p = ws(v.s, v.end), *end = v.end;
    if (p >= end || *p != '{') return none;
    p = ws(p + 1, end);
    size_t kl = strlen(key);
    while (p < end && *p == '"') {
        const char *ks = p + 1, *ke = skip(p, end, 0);
        if (!ke) return none;
        p = ws(ke, end);
        if (p >= end || *p != ':') return none;
        const char *vs = ws(p + 1, end), *ve = skip(vs, end, 0);
        if (!ve) return none;
        if ((size_t)(ke - 1 - ks) == kl && !memcmp(ks, key, kl)) return (cx_js_t){ vs, ve };
        p = ws(ve, end);
        if (p < end && *p == ',')
            p = ws(p + 1, end);
        else
            break;
    }
    return none;
}

int cx_js_next(cx_js_t arr, cx_js_t *it, cx_js_t *out)
{
    if (!arr.s) return 0;
    const char *p;
    if (!it->s) {
        p = ws(arr.s, arr.end);
        if (p >= arr.end || *p != '[') return 0;
        p++;
    } else {
        p = ws(it->end, arr.end);
        if (p >= arr.end || *p != ',') return 0;
        p++;
    }
    p = ws(p, arr.end);
    if (p >= arr.end || *p == ']') return 0;
    const char *e = skip(p, arr.end, 0);
    if (!e) return 0;
    *it = *out = (cx_js_t){ p, e };
    return 1;
}

int cx_js_str(cx_js_t v, char *buf, size_t n)
{
    if (!v.s || v.end - v.s < 2 || *v.s != '"' || v.end[-1] != '"') return -1;
    size_t l = (size_t)(v.end - v.s) - 2;
    if (l >= n || memchr(v.s + 1, '\\', l)) return -1;
    memcpy(buf, v.s + 1, l);
    buf[l] = 0;
    return 0;
}

int cx_js_u64(cx_js_t v, uint64_t *out)
{
    if (!v.s) return -1;
    const char *p = v.s, *e = v.end;
    if (*p == '"') {
        p++;
        e--;
    }
    if (p >= e) return -1;
    uint64_t x = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9' || x > (UINT64_MAX - 9) / 10) return -1;
        x = x * 10 + (uint64_t)(*p - '0');
    }
    *out = x;
    return 0;
}

int cx_js_bool(cx_js_t v)
{
    return v.s && v.end - v.s == 4 && !memcmp(v.s, "true", 4);
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t cx_b64_enc(const void *src, size_t n, char *buf)
{
    const uint8_t *s = src;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        buf[o++] = b64[v >> 18 & 63];
        buf[o++] = b64[v >> 12 & 63];
        buf[o++] = i + 1 < n ? b64[v >> 6 & 63] : '=';
        buf[o++] = i + 2 < n ? b64[v & 63] : '=';
    }
    buf[o] = 0;
    return o;
}

int cx_b64_dec(const char *src, size_t n, uint8_t *buf, size_t cap)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '=') break;
        const char *k = memchr(b64, c, 64);
        if (!k || !c) return -1;
        acc = acc << 6 | (uint32_t)(k - b64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o >= cap) return -1;
            buf[o++] = (uint8_t)(acc >> bits);
        }
    }
    return (int)o;
}
