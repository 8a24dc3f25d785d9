/* Local region registry: what this engine registered, with each backend's handle and key.
 * Written only by the progress thread; read by caller threads (local-buffer checks) and by
 * backends (target-side bounds checks), hence the rwlock. */
#ifndef CX_REGION_H
#define CX_REGION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define CX_MAX_BACKENDS 4
#define CX_KEY_MAX 1024 /* largest key blob one backend may produce for a region */

typedef struct cx_region {
    uint64_t id; /* unique within this engine incarnation, never reused */
    uint64_t addr;
    uint64_t len;
    int mem_kind;              /* CX_MEM_* */
    void *mh[CX_MAX_BACKENDS]; /* each open backend's handle (NULL: not registered there) */
    uint16_t key_len[CX_MAX_BACKENDS];
    uint8_t *key[CX_MAX_BACKENDS];
    atomic_int pins; /* zero-copy sends in flight from this region */
} cx_region_t;

typedef struct cx_registry {
    pthread_rwlock_t lock;
    cx_region_t **v; /* sorted by addr, non-overlapping */
    size_t n, cap;
    uint64_t next_id;
    uint64_t bytes;
} cx_registry_t;

int cx_registry_init(cx_registry_t *r);
void cx_registry_fini(cx_registry_t *r); /* frees every region still in it */
/* CX_EINVAL (logged) for NULL addr, zero length, wrap-around, overlap or duplicate. The region
 * is allocated here and owned by the registry until removed. */
int cx_registry_add(cx_registry_t *r, void *addr, size_t len, int mem_kind, cx_region_t **out);
/* Takes the region whose start is addr out of the registry; CX_EINVAL if none. The caller frees
 * it with cx_region_free once nothing pins it. */
int cx_registry_remove(cx_registry_t *r, void *addr, cx_region_t **out);
void cx_region_free(cx_region_t *reg);
/* The region wholly containing [addr, addr+len), or NULL. Call with the lock held (read). */
cx_region_t *cx_registry_find_locked(cx_registry_t *r, uint64_t addr, uint64_t len);
/* Same, taking the lock: returns 1 when inside one region (copying it to *copy if not NULL). */
int cx_registry_contains(cx_registry_t *r, uint64_t addr, uint64_t len, int *mem_kind);
size_t cx_registry_count(cx_registry_t *r);
/* A region's extent and kind, copied out of the registry. */
typedef struct cx_region_span {
    uint64_t addr, len;
    int mem_kind;
} cx_region_span_t;
/* Same as cx_registry_contains, copying the region's extent to *span: a caller checking many
 * ranges looks up only those outside the last one. */
int cx_registry_span(cx_registry_t *r, uint64_t addr, uint64_t len, cx_region_span_t *span);

#endif
