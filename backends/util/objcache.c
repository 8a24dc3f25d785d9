#include "objcache.h"

#include <stdlib.h>
#include <string.h>

void cx_objcache_init(cx_objcache_t *c, size_t size, unsigned max)
{
    c->head = NULL;
    c->n = 0;
    c->max = max;
    c->size = size < sizeof(void *) ? sizeof(void *) : size;
}

void *cx_objcache_get(cx_objcache_t *c)
{
    void *obj = c->head;
    if (!obj) return calloc(1, c->size);
    memcpy(&c->head, obj, sizeof c->head);
    c->n--;
    memset(obj, 0, c->size);
    return obj;
}

void cx_objcache_put(cx_objcache_t *c, void *obj)
{
    if (!obj) return;
    if (c->n >= c->max) {
        free(obj);
        return;
    }
    memcpy(obj, &c->head, sizeof c->head);
    c->head = obj;
    c->n++;
}

void cx_objcache_drain(cx_objcache_t *c)
{
    while (c->head) {
        void *obj = c->head;
        memcpy(&c->head, obj, sizeof c->head);
        free(obj);
    }
    c->n = 0;
}
