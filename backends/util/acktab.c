#include "acktab.h"

static unsigned bucket(uint64_t id)
{
    return (unsigned)(id & (CX_ACKTAB_BUCKETS - 1));
}

void cx_acktab_add(cx_acktab_t *t, cx_ack_link_t *l, uint64_t id)
{
    cx_ack_link_t **h = &t->b[bucket(id)];
    l->id = id;
    l->next = *h;
    l->linked = 1;
    *h = l;
}

cx_ack_link_t *cx_acktab_find(const cx_acktab_t *t, uint64_t id)
{
    for (cx_ack_link_t *l = t->b[bucket(id)]; l; l = l->next)
        if (l->id == id) return l;
    return NULL;
}

static void unlink_at(cx_ack_link_t **pp)
{
    cx_ack_link_t *l = *pp;
    *pp = l->next;
    l->next = NULL;
    l->linked = 0;
}

cx_ack_link_t *cx_acktab_take(cx_acktab_t *t, uint64_t id)
{
    for (cx_ack_link_t **pp = &t->b[bucket(id)]; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            cx_ack_link_t *l = *pp;
            unlink_at(pp);
            return l;
        }
    return NULL;
}

void cx_acktab_del(cx_acktab_t *t, cx_ack_link_t *l)
{
    if (!l->linked) return;
    for (cx_ack_link_t **pp = &t->b[bucket(l->id)]; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            unlink_at(pp);
            return;
        }
}
