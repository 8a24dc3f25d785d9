/* Just enough JSON and base64 for etcd's JSON gateway (dir_etcd.c): find a member of an object,
 * walk an array, read a string or an integer that etcd writes as a string. No allocation; input
 * is a span [s, end). Anything malformed yields "not found", never a read past end. */
#ifndef CX_JSON_LITE_H
#define CX_JSON_LITE_H

#include <stddef.h>
#include <stdint.h>

typedef struct cx_js {
    const char *s, *end;
} cx_js_t; /* one JSON value; s == NULL: none */

/* The value of member `key` of the object v (top level only). */
cx_js_t cx_js_get(cx_js_t v, const char *key);
/* Array elements: *it starts as {0}; returns 1 and the next element in *out, 0 at the end. */
int cx_js_next(cx_js_t arr, cx_js_t *it, cx_js_t *out);
/* A string value without escapes (etcd's are base64 or numbers) copied into buf. 0 or -1. */
int cx_js_str(cx_js_t v, char *buf, size_t n);
/* An integer written as a number or as a string of digits. 0 or -1. */
int cx_js_u64(cx_js_t v, uint64_t *out);
int cx_js_bool(cx_js_t v); /* 1 for true, else 0 */

/* base64 (standard alphabet, padded). Encode: returns the length written (buf holds
 * 4 * ceil(n / 3) + 1). Decode: returns the length or -1. */
size_t cx_b64_enc(const void *src, size_t n, char *buf);
int cx_b64_dec(const char *src, size_t n, uint8_t *buf, size_t cap);

#endif
