/* Ops that wait for their target's answer (an ack, a read's data), found by the 64-bit id their
 * request carried: an intrusive hash table. The op embeds a cx_ack_link_t; a lookup returns the
 * link, cx_container_of gives the op back. No allocation: adding cannot fail. */
#ifndef CX_UTIL_ACKTAB_H
#define CX_UTIL_ACKTAB_H

#include <stddef.h>
#include <stdint.h>

#define CX_ACKTAB_BUCKETS 256u /* a power of two; ids are sequential, so the low bits spread */

#define cx_container_of(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

typedef struct cx_ack_link {
    struct cx_ack_link *next;
    uint64_t id;
    int linked;
} cx_ack_link_t;

typedef struct cx_acktab {
    cx_ack_link_t *b[CX_ACKTAB_BUCKETS];
} cx_acktab_t;

void cx_acktab_add(cx_acktab_t *t, cx_ack_link_t *l, uint64_t id);
cx_ack_link_t *cx_acktab_find(const cx_acktab_t *t, uint64_t id); /* stays in the table */
cx_ack_link_t *cx_acktab_take(cx_acktab_t *t, uint64_t id);       /* unlinked; NULL if none */
void cx_acktab_del(cx_acktab_t *t, cx_ack_link_t *l);             /* no-op when not linked */

#endif
