/* Freed per-op records kept for reuse: one record per read or write, and malloc/free of each
 * showed in the profile of small shared-memory ops. A bounded free list; a freed record's first
 * bytes hold the link, so records must be at least a pointer in size. */
#ifndef CX_UTIL_OBJCACHE_H
#define CX_UTIL_OBJCACHE_H

#include <stddef.h>

typedef struct cx_objcache {
    void *head;
    unsigned n;   /* records kept */
    unsigned max; /* at most this many; above it a put frees */
    size_t size;  /* of one record */
} cx_objcache_t;

void cx_objcache_init(cx_objcache_t *c, size_t size, unsigned max);
void *cx_objcache_get(cx_objcache_t *c); /* zeroed; NULL when out of memory */
void cx_objcache_put(cx_objcache_t *c, void *obj);
void cx_objcache_drain(cx_objcache_t *c); /* frees every kept record */

#endif
