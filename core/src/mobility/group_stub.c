/* Placeholder for the groups (group.c, step.c), written on another branch: the directory calls
 * these. The lead deletes this file when the branches merge. */
#include "mobility.h"

void cx_groups_on_dir(cx_engine_t *e, const cx_dir_entry_t *ent, int kind) { (void)e; (void)ent; (void)kind; }
void cx_groups_on_event(cx_engine_t *e, cx_peer_t *p, cx_event_type_t t) { (void)e; (void)p; (void)t; }
void cx_groups_tick(cx_engine_t *e, uint64_t now) { (void)e; (void)now; }
void cx_groups_free_all(cx_engine_t *e) { (void)e; }
int cx_step_accept(cx_engine_t *e, cx_peer_t *from, const void *data, size_t len, const void **payload,
                   size_t *plen, uint64_t *step)
{
    (void)e; (void)from; (void)data; (void)len; (void)payload; (void)plen; (void)step;
    return 0;
}
void cx_step_forget_peer(cx_engine_t *e, cx_peer_t *p) { (void)e; (void)p; }
