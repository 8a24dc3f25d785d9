#include "region.h"

#include "connex/connex.h"
#include "connex/log.h"

#include <stdlib.h>
#include <string.h>

int cx_registry_init(cx_registry_t *r)
{
    memset(r, 0, sizeof *r);
    r->next_id = 1;
    return pthread_rwlock_init(&r->lock, NULL) ? CX_ERR : CX_OK;
}

void cx_region_free(cx_region_t *reg)
{
    if (!reg) return;
    for (int i = 0; i < CX_MAX_BACKENDS; i++) free(reg->key[i]);
    free(reg);
}

void cx_registry_fini(cx_registry_t *r)
{
    for (size_t i = 0; i < r->n; i++) cx_region_free(r->v[i]);
    free(r->v);
    pthread_rwlock_destroy(&r->lock);
    memset(r, 0, sizeof *r);
}

/* Index of the first region whose addr is > a. */
static size_t upper(const cx_registry_t *r, uint64_t a)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->v[mid]->addr <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int cx_registry_add(cx_registry_t *r, void *addr, size_t len, int mem_kind, cx_region_t **out)
{
    uint64_t a = (uint64_t)(uintptr_t)addr;
    if (!addr) {
        cx_warn("register: NULL address");
        return CX_EINVAL;
    }
    if (len == 0) {
        cx_warn("register: zero length at %p", addr);
        return CX_EINVAL;
    }
    if (a + len < a) {
        cx_warn("register: %p + %zu wraps around", addr, len);
        return CX_EINVAL;
    }
    cx_region_t *reg = calloc(1, sizeof *reg);
    if (!reg) return CX_ENOMEM;
    pthread_rwlock_wrlock(&r->lock);
    size_t i = upper(r, a);
    /* The region before i starts at or below a: it must end at or before a; the one at i starts
     * above a: it must start at or after a+len. */
    if ((i > 0 && r->v[i - 1]->addr + r->v[i - 1]->len > a) || (i < r->n && r->v[i]->addr < a + len)) {
        const cx_region_t *o = (i > 0 && r->v[i - 1]->addr + r->v[i - 1]->len > a) ? r->v[i - 1] : r->v[i];
        pthread_rwlock_unlock(&r->lock);
        free(reg);
        cx_warn("register: [%p, +%zu) %s registered region [0x%llx, +%llu)", addr, len,
                o->addr == a && o->len == len ? "duplicates the" : "overlaps the", (unsigned long long)o->addr,
                (unsigned long long)o->len);
        return CX_EINVAL;
    }
    if (r->n == r->cap) {
        size_t nc = r->cap ? r->cap * 2 : 16;
        cx_region_t **nv = realloc(r->v, nc * sizeof *nv);
        if (!nv) {
            pthread_rwlock_unlock(&r->lock);
            free(reg);
            return CX_ENOMEM;
        }
        r->v = nv;
        r->cap = nc;
    }
    memmove(&r->v[i + 1], &r->v[i], (r->n - i) * sizeof *r->v);
    reg->id = r->next_id++;
    reg->addr = a;
    reg->len = len;
    reg->mem_kind = mem_kind;
    r->v[i] = reg;
    r->n++;
    r->bytes += len;
    pthread_rwlock_unlock(&r->lock);
    if (out) *out = reg;
    return CX_OK;
}

int cx_registry_remove(cx_registry_t *r, void *addr, cx_region_t **out)
{
    uint64_t a = (uint64_t)(uintptr_t)addr;
    pthread_rwlock_wrlock(&r->lock);
    size_t i = upper(r, a);
    if (i == 0 || r->v[i - 1]->addr != a) {
        pthread_rwlock_unlock(&r->lock);
        cx_warn("unregister: %p is not the start of a registered region", addr);
        return CX_EINVAL;
    }
    cx_region_t *reg = r->v[i - 1];
    memmove(&r->v[i - 1], &r->v[i], (r->n - i) * sizeof *r->v);
    r->n--;
    r->bytes -= reg->len;
    pthread_rwlock_unlock(&r->lock);
    if (out)
        *out = reg;
    else
        cx_region_free(reg);
    return CX_OK;
}

cx_region_t *cx_registry_find_locked(cx_registry_t *r, uint64_t addr, uint64_t len)
{
    if (len == 0 || addr + len < addr) return NULL;
    size_t i = upper(r, addr);
    if (i == 0) return NULL;
    cx_region_t *reg = r->v[i - 1];
    return addr - reg->addr <= reg->len && len <= reg->len - (addr - reg->addr) ? reg : NULL;
}

int cx_registry_contains(cx_registry_t *r, uint64_t addr, uint64_t len, int *mem_kind)
{
    pthread_rwlock_rdlock(&r->lock);
    cx_region_t *reg = cx_registry_find_locked(r, addr, len);
    if (reg && mem_kind) *mem_kind = reg->mem_kind;
    pthread_rwlock_unlock(&r->lock);
    return reg != NULL;
}

int cx_registry_span(cx_registry_t *r, uint64_t addr, uint64_t len, cx_region_span_t *span)
{
    pthread_rwlock_rdlock(&r->lock);
    cx_region_t *reg = cx_registry_find_locked(r, addr, len);
    if (reg) *span = (cx_region_span_t){ .addr = reg->addr, .len = reg->len, .mem_kind = reg->mem_kind };
    pthread_rwlock_unlock(&r->lock);
    return reg != NULL;
}

size_t cx_registry_count(cx_registry_t *r)
{
    pthread_rwlock_rdlock(&r->lock);
    size_t n = r->n;
    pthread_rwlock_unlock(&r->lock);
    return n;
}
