/* The mobility layer's internal contract (docs/mobility.md): what the engine calls, and what the
 * directory (dir*.c) and the groups (group.c, step.c) offer each other. Everything here runs on
 * the progress thread unless it says otherwise. */
#ifndef CX_MOBILITY_H
#define CX_MOBILITY_H

#include "connex/connex.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cx_engine cx_engine_t;
typedef struct cx_peer cx_peer_t;

/* A LID pattern: any field may be a wildcard (bit 0 model, 1 stage, 2 shard, 3 replica). */
typedef struct cx_lid_pat {
    cx_lid_t lid;
    unsigned wild;
} cx_lid_pat_t;
int cx_lid_pat_parse(const char *s, cx_lid_pat_t *out, char *err, size_t errlen); /* url.c */
int cx_lid_pat_match(const cx_lid_pat_t *p, const cx_lid_t *lid);

/* ---- directory (dir.c, dir_static.c, dir_etcd.c) ---- */
enum { CX_DIR_PUT = 1, CX_DIR_DEL = 2 };

/* Engine create (after the control port is bound): open the directory named by the config and
 * register this engine's LID -> URL. Engine destroy: delete the entry (clean) and close. */
int cx_dir_start(cx_engine_t *e);
void cx_dir_stop(cx_engine_t *e);
/* Progress thread, every tick: lease keep-alive, apply changes the watch brought. */
void cx_dir_tick(cx_engine_t *e, uint64_t now);
/* The entry for one LID: 0 and *out, or CX_EINVAL when the directory has none. */
int cx_dir_lookup(cx_engine_t *e, const cx_lid_t *lid, cx_dir_entry_t *out);
/* Calls fn for every entry matching pat; returns the number of matches. */
int cx_dir_each(cx_engine_t *e, const cx_lid_pat_t *pat, void (*fn)(void *ctx, const cx_dir_entry_t *ent), void *ctx);

/* ---- groups (group.c), called by the core ---- */
/* A directory entry appeared, moved (CX_DIR_PUT) or went away (CX_DIR_DEL). */
void cx_groups_on_dir(cx_engine_t *e, const cx_dir_entry_t *ent, int kind);
/* A transport event about peer p was just emitted. */
void cx_groups_on_event(cx_engine_t *e, cx_peer_t *p, cx_event_type_t t);
void cx_groups_tick(cx_engine_t *e, uint64_t now);
void cx_groups_free_all(cx_engine_t *e); /* engine destroy: steps complete with CX_ECLOSED */
/* Every progress-loop iteration: children of group steps that completed are dealt with here
 * (hand-over, completion), outside the paths that fail ops. Cheap when nothing completed.
 * Returns 1 when it did something (new sends may need the backends' next turn at once). */
int cx_groups_progress(cx_engine_t *e);
/* cx_op_start of a CX_OPK_GROUP op (a group step submitted by cx_group_send/put_signal). */
void cx_group_op_start(cx_engine_t *e, cx_op_t *op);

/* ---- steps (step.c): the envelope of a group step and the receiver's duplicate filter ---- */
/* Receiver side, from cx_core_deliver_msg: if data is a step envelope addressed to this engine,
 * sets *payload, *plen and *step and returns 1 (or 2 when it is a duplicate: drop it, answer CX_OK);
 * 0 for a plain message. */
int cx_step_accept(cx_engine_t *e, cx_peer_t *from, const void *data, size_t len, const void **payload, size_t *plen,
                   uint64_t *step);
void cx_step_forget_peer(cx_engine_t *e, cx_peer_t *p); /* the sender's state is dropped; NULL: all */
/* The step cx_step_accept passed could not be queued (CX_EAGAIN): forget it, the sender retries. */
void cx_step_unaccept(cx_engine_t *e, cx_peer_t *from, uint64_t step);

#endif
